"""A cheaper way to launch a kernel that was launched before with the same specialisation.

``kernel[grid](*args, **meta)`` spends tens of microseconds of host time on every
call (binding the arguments, computing the specialisation key, looking up the
cache) before it reaches the compiled kernel's C launcher.  For a memory-bound
kernel that finishes in 20-100 us, that host time decides the speed.

:func:`launch` keys each call on what Triton specialises on (dtypes, 16-byte
alignment of pointers, integers equal to 1 or divisible by 16 and their width,
the constexpr values and launch options); the first call of a key goes through
the JIT as usual, and later calls hand the arguments straight to the compiled
kernel's launcher, as the end of ``JITFunction.run`` does.

The launcher's calling convention is Triton-internal, so the direct path is only
taken on Triton versions it was verified on (:data:`DIRECT_VERSIONS`) and never
under the interpreter; everywhere else :func:`launch` is ``kernel[grid](...)``.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import warnings
from typing import Any

import torch
import triton

from . import runtime

__all__ = [
    "DIRECT_VERSIONS",
    "device_guard",
    "direct_launch_enabled",
    "direct_launcher",
    "ensure_cuda_context",
    "launch",
    "launcher_for",
    "sm_count",
]

#: Triton releases whose compiled-kernel launcher this module was checked against
#: on a GPU (H100, 2026-11-22).  Others take the ordinary JIT launch.
DIRECT_VERSIONS = ("3.6.",)

_CACHE: dict[tuple, Any] = {}
_CACHE_LIMIT = 4096


_THREAD = threading.local()


def ensure_cuda_context(device: torch.device) -> None:
    """Bind the device's primary CUDA context to the calling thread, once per thread.

    Building a TMA descriptor (``cuTensorMapEncodeTiled``) needs a current context,
    and a thread that has run no CUDA work yet has none: PyTorch runs backward
    passes in its own threads, where a matrix product can be the first CUDA call
    ("Failed to create tensor map descriptor: invalid device context").  Any CUDA
    runtime call binds the primary context; a stream query is the cheapest.
    """
    _ensure_index(device.index if device.index is not None else torch.cuda.current_device())


def _ensure_index(index: int) -> None:
    done = getattr(_THREAD, "devices", None)
    if done is None:
        done = _THREAD.devices = set()
    if index not in done:
        torch.cuda.current_stream(index).query()
        done.add(index)


def device_guard(t: torch.Tensor):
    """Make ``t``'s GPU the current device for a launch (a no-op off the GPU)."""
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA ``device`` (no index: the current one)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _sm_count(index)


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def direct_launch_enabled() -> bool:
    return runtime.is_gpu() and triton.__version__.startswith(DIRECT_VERSIONS)


def _spec(value: Any) -> tuple | None:
    """What Triton specialises on for one runtime argument; None: not cacheable."""
    if isinstance(value, torch.Tensor):
        return ("t", value.dtype, value.data_ptr() % 16 == 0)
    if isinstance(value, bool):
        return ("b", value)
    if isinstance(value, int):
        return ("i", value == 1, value % 16 == 0, -(2**31) <= value < 2**31)
    if isinstance(value, float):
        return ("f",)
    if value is None:
        return ("n",)
    return None


def _hooks_idle(hook) -> bool:
    # Triton >= 3.5 keeps launch hooks in a HookChain (empty: nothing to call).
    return hook is None or not getattr(hook, "calls", True)


def direct_launcher(jit_fn, compiled):
    """``go(grid, args) -> bool`` calling ``compiled``'s launcher, or None if this
    Triton's objects do not look as expected."""
    try:
        if hasattr(compiled, "result"):  # compilation may be asynchronous
            compiled = compiled.result()
        launcher = compiled.run
        function, packed = compiled.function, compiled.packed_metadata
        from triton import knobs as all_knobs
        from triton.runtime import driver

        active = driver.active
        get_device, get_stream = active.get_current_device, active.get_current_stream
        knobs = all_knobs.runtime
        pre_run_hooks = jit_fn.pre_run_hooks
        device = get_device()
    except Exception:  # noqa: BLE001  (another Triton: keep to the JIT)
        return None
    if function is None or not callable(launcher) or not isinstance(pre_run_hooks, list):
        return None

    def go(grid, args) -> bool:
        if pre_run_hooks or get_device() != device:
            return False
        g0, g1, g2 = (*grid, 1, 1)[:3]
        _ensure_index(device)  # a new thread (autograd's backward) may have no context yet
        stream = get_stream(device)
        enter, leave = knobs.launch_enter_hook, knobs.launch_exit_hook
        if _hooks_idle(enter) and _hooks_idle(leave):
            launcher(g0, g1, g2, stream, function, packed, None, None, None, *args)
        else:  # a profiler listens: give it what JITFunction.run gives it
            meta = compiled.launch_metadata((g0, g1, g2), stream, *args)
            launcher(g0, g1, g2, stream, function, packed, meta, enter, leave, *args)
        return True

    return go


def _bound(jit_fn, args: tuple, meta: dict) -> tuple | None:
    """Every kernel parameter in signature order (constexprs included, as the
    compiled launcher expects), or None when one is missing."""
    names = jit_fn.arg_names
    if len(args) > len(names):
        return None
    out = list(args)
    for name in names[len(args) :]:
        if name not in meta:
            return None
        out.append(meta[name])
    return tuple(out)


def launch(jit_fn, grid: tuple[int, ...], *args: Any, **meta: Any) -> None:
    """``jit_fn[grid](*args, **meta)``, with the host work skipped on repeat calls.

    ``args`` are the runtime arguments in order; ``meta`` holds every constexpr
    argument by name plus launch options (``num_warps``, ``num_stages``).
    """
    if not direct_launch_enabled():
        jit_fn[grid](*args, **meta)
        return
    specs = tuple(_spec(a) for a in args)
    if None in specs:
        jit_fn[grid](*args, **meta)
        return
    key = (id(jit_fn), specs, tuple(sorted(meta.items())))
    go = _CACHE.get(key)
    if go:
        bound = _bound(jit_fn, args, meta)
        try:
            if bound is not None and go(grid, bound):
                return
        except Exception as exc:  # noqa: BLE001  (the launcher refused: back to the JIT)
            _CACHE[key] = False
            warnings.warn(
                f"tilebook: direct launch of {jit_fn.__name__} failed ({exc!r}); "
                "using Triton's JIT launch from now on",
                RuntimeWarning,
                stacklevel=2,
            )
    elif go is None:
        compiled = jit_fn[grid](*args, **meta)
        if len(_CACHE) < _CACHE_LIMIT:
            direct = direct_launcher(jit_fn, compiled)
            _CACHE[key] = direct if direct is not None and _bound(jit_fn, args, meta) else False
        return
    jit_fn[grid](*args, **meta)


def launcher_for(jit_fn, args: tuple, meta: dict):
    """For a call that :func:`launch` has already made with arguments like these:
    ``(go, tail)``, where ``go(grid, (*args, *tail)) -> bool`` launches again with new
    arguments of the same specialisation (``tail`` holds the constexprs); else None.

    It lets a caller that has checked its own inputs skip even :func:`launch`'s key
    (``go`` returns False, launching nothing, when the current device changed or a
    pre-run hook was added: then take the ordinary path).
    """
    if not direct_launch_enabled():
        return None
    specs = tuple(_spec(a) for a in args)
    if None in specs:
        return None
    go = _CACHE.get((id(jit_fn), specs, tuple(sorted(meta.items()))))
    bound = _bound(jit_fn, args, meta)
    if not go or bound is None:
        return None
    return go, bound[len(args) :]
