"""Launching kernels: on the right device, and again without Triton's per-call host work.

``kernel[grid](*args, **meta)`` spends tens of microseconds of host time on every
call (binding the arguments, computing the specialisation key, looking up the
cache) before it reaches the compiled kernel.  For a memory-bound kernel that
finishes in 20-100 us, that host time decides the speed.  Triton's own API has the
cheaper route: the launch returns the :class:`~triton.compiler.CompiledKernel`, and
``compiled[grid](*args)`` starts that binary again with new arguments, skipping the
binding and the key.  tilebook goes one step further and calls that runner's own
launcher with the current stream, as the runner does when no launch hook (a
profiler) is set (:func:`_direct`; while one is set, the runner runs).

The one entry is :func:`launch`: it launches once, under :func:`device_guard` of
its tensors' GPU, and returns a :class:`Launched` that starts the same binary again
for arguments *of the same specialisation* (same dtypes, same 16-byte alignment of
pointers, same integer values, same constexprs).  :func:`launch` itself remembers
what it compiled under a key of exactly those properties (:func:`launch_key`), so
repeated calls with plain tensors, tensor descriptors and numbers take the short route
with no help from the caller.

An op whose calls must cost less host time still (a memory-bound op on small inputs)
skips even that key, the same way in every op: it keys the call on what decides its
launches (:func:`call_key`: shapes, strides, dtypes, device, 16-byte alignment, the
module's knobs), plans the call once per key (which kernels, grids and constexprs, the
outputs' shapes) and keeps the plan in :data:`PLANS`.  A plan's launches are
:class:`Step` objects: the first call goes through :func:`launch`, later ones start
the kept :class:`Launched` directly (the call key guarantees the specialisation).

The launch key is deliberately finer than Triton's: integers by value (Triton only asks
whether one is 1, divisible by 16 and fits 32 bits) and pointers by their address
modulo 16 (Triton asks whether it is 0), tensor descriptors by their whole layout
(Triton asks for the dtype and the block shape).  Whatever Triton would compile apart,
the key keeps apart (``tests/test_launch.py`` asks Triton); the price is a slow
first call per distinct value.  Under the interpreter, or where the compiled
kernel has no ``[grid]`` launcher, every call is ``kernel[grid](...)``.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
import warnings
from typing import Any

import torch

from . import runtime

__all__ = [
    "PLAIN_TENSORS",
    "PLANS",
    "Launched",
    "Memo",
    "Step",
    "call_key",
    "device_guard",
    "ensure_cuda_context",
    "launch",
    "launch_key",
    "plain",
    "plain_grad",
    "sm_count",
]

try:  # host-side tensor descriptors arrived in Triton 3.4
    from triton.tools.tensor_descriptor import TensorDescriptor as _Descriptor
except ImportError:  # pragma: no cover - depends on the installed Triton
    _Descriptor = None
# The descriptor types a launch key takes.  Gluon's (tilebook.ops.attention_hopper; they
# carry a shared-memory layout) joins when first seen: importing Gluon here would cost
# every ``import tilebook`` about 0.1 s.
_DESCRIPTORS = {_Descriptor} if _Descriptor is not None else set()
_GLUON_HOPPER = "triton.experimental.gluon.nvidia.hopper"


def _gluon_descriptor(kind: type) -> bool:
    """Whether ``kind`` is Gluon's tensor descriptor (one exists only once something
    imported Gluon); remembered in ``_DESCRIPTORS`` when it is."""
    hopper = sys.modules.get(_GLUON_HOPPER)
    if hopper is None or kind is not getattr(hopper, "TensorDescriptor", None):
        return False
    _DESCRIPTORS.add(kind)
    return True


_GPU = runtime.is_gpu()
_current_device = torch.cuda.current_device
_Tensor = torch.Tensor
#: The tensor types a launch key and the ops' repeat-call keys take as they are: a
#: plain tensor and a module's parameter (the weights of a model) behave alike for a
#: kernel; other subclasses (fake, distributed, wrapped tensors) may not.
PLAIN_TENSORS = frozenset({_Tensor, torch.nn.Parameter})
_STRIDED = torch.strided


def plain(t: object) -> bool:
    """Whether an op's repeat-call key may take ``t`` as it is: one of
    :data:`PLAIN_TENSORS`, and dense (a sparse tensor has no strides or data pointer
    to key; the checks refuse it)."""
    return type(t) in PLAIN_TENSORS and t.layout is _STRIDED


def plain_grad(g: object, dtype: torch.dtype) -> bool:
    """Whether an incoming gradient may take a backward replay made for a plain,
    contiguous, 16-byte aligned gradient of ``dtype``."""
    return plain(g) and g.dtype == dtype and g.is_contiguous() and not g.data_ptr() & 15


# --------------------------------------------------------------------------- devices


def device_guard(t: torch.Tensor | torch.device | int | None):
    """Make ``t``'s GPU the current device (a no-op off the GPU).

    Triton launches on the current device and its stream: a tensor on ``cuda:1``
    launched while ``cuda:0`` is current fails with "Pointer argument cannot be
    accessed from Triton (cpu tensor?)".
    """
    if isinstance(t, _Tensor):
        t = t.device
    if isinstance(t, torch.device):
        t = t.index if t.type == "cuda" else None
    if t is None or t == _current_device():  # nothing to switch: skip the two device calls
        return _NO_SWITCH
    return torch.cuda.device(t)


_NO_SWITCH = contextlib.nullcontext()


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA ``device`` (no index: the current one)."""
    index = device.index if device.index is not None else _current_device()
    return _sm_count(index)


_THREAD = threading.local()


def ensure_cuda_context(device: torch.device) -> None:
    """Bind the device's primary CUDA context to the calling thread, once per thread.

    Building a TMA descriptor (``cuTensorMapEncodeTiled``) needs a current context,
    and a thread that has run no CUDA work yet has none: PyTorch runs backward
    passes in its own threads, where a matrix product can be the first CUDA call
    ("Failed to create tensor map descriptor: invalid device context").  Any CUDA
    runtime call binds the primary context; a stream query is the cheapest.
    """
    index = device.index if device.index is not None else _current_device()
    done = getattr(_THREAD, "devices", None)
    if done is None:
        done = _THREAD.devices = set()
    if index not in done:
        torch.cuda.current_stream(index).query()
        done.add(index)


# --------------------------------------------------------------------------- launching


class Launched:
    """A compiled kernel with its grid and constexprs, ready to start again.

    ``launched(*args)`` launches it with new runtime arguments (the same number and
    kinds as the first launch, of the same specialisation: the caller's key must
    guarantee that) on the GPU it was compiled for, and returns True; it returns
    False, launching nothing, when a pre-run hook was added to the kernel since, or
    when the launcher failed before (then the caller takes ``kernel[grid](...)``).
    """

    __slots__ = ("_kernel", "_run", "index", "tail")

    def __init__(self, kernel, run, index: int, tail: tuple):
        self._kernel, self._run, self.index, self.tail = kernel, run, index, tail

    def __call__(self, *args: Any) -> bool:
        run = self._run
        if run is None or self._kernel.pre_run_hooks:
            return False
        try:
            if _current_device() == self.index:
                run(*args, *self.tail)
            else:
                with torch.cuda.device(self.index):
                    run(*args, *self.tail)
        except (TypeError, ValueError, AttributeError, OverflowError) as exc:
            # Argument conversion in the launcher fails before anything starts.
            self._run = None
            warnings.warn(
                f"tilebook: relaunching {getattr(self._kernel, '__name__', '?')} failed "
                f"({exc!r}); using Triton's JIT launch from now on",
                RuntimeWarning,
                stacklevel=2,
            )
            return False
        return True


def _bound(kernel, args: tuple, meta: dict) -> tuple | None:
    """The constexprs that follow ``args`` in the kernel's signature, in order (the
    compiled launcher takes every parameter positionally), or None if one is missing."""
    names = kernel.arg_names
    if len(args) > len(names):
        return None
    tail = []
    for name in names[len(args) :]:
        if name not in meta:
            return None
        tail.append(meta[name])
    return tuple(tail)


try:  # Triton's launch hooks (for profilers) live in triton.knobs since Triton 3.4
    from triton import knobs as _knobs
except ImportError:  # pragma: no cover - depends on the installed Triton
    _knobs = None
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _quiet(hook) -> bool:
    """Whether a launch hook of ``triton.knobs.runtime`` calls nothing: None (up to
    Triton 3.6 or so) or an empty ``HookChain`` (later ones)."""
    return hook is None or getattr(hook, "calls", None) == []


def _direct(compiled, runner, grid: tuple, index: int):
    """``runner`` (``compiled[grid]``) without its own host work where it does none.

    Triton's runner asks torch for the current device and its stream, and builds
    launch metadata for hooks, on every call, then calls the compiled kernel's
    launcher.  :class:`Launched` has already made sure the current device is
    ``index``, so this asks only for the stream and calls the launcher with no
    metadata; while a launch hook is set (a profiler listens) it takes the runner.
    Where this Triton's compiled kernel lacks the pieces, the runner as it is."""
    hooks = getattr(_knobs, "runtime", None)
    parts = [getattr(compiled, name, None) for name in ("run", "function", "packed_metadata")]
    if hooks is None or _raw_stream is None or None in parts or not callable(parts[0]):
        return runner
    launcher, function, packed = parts
    g0, g1, g2 = grid
    stream = _raw_stream

    def run(*args):
        if _quiet(hooks.launch_enter_hook) and _quiet(hooks.launch_exit_hook):
            launcher(g0, g1, g2, stream(index), function, packed, None, None, None, *args)
        else:
            runner(*args)

    return run


def _relauncher(kernel, compiled, grid: tuple, args: tuple, meta: dict, index: int):
    """A :class:`Launched` for ``compiled`` (what ``kernel[grid](...)`` returned), or
    None where this Triton's compiled kernel cannot be started through ``[grid]``."""
    tail = _bound(kernel, args, meta)
    if tail is None or not isinstance(getattr(kernel, "pre_run_hooks", None), list):
        return None
    try:
        if hasattr(compiled, "result"):  # compilation may be asynchronous
            compiled = compiled.result()
        grid3 = tuple(grid) + (1,) * (3 - len(grid))
        run = compiled[grid3]
    except Exception:  # noqa: BLE001  (another Triton: keep to the JIT)
        return None
    if not callable(run):
        return None
    return Launched(kernel, _direct(compiled, run, grid3, index), index, tail)


def _arg_key(value: Any):
    """``value`` as part of a launch key: finer than Triton's specialisation (see the
    module docstring); a sentinel for arguments that cannot be keyed."""
    kind = type(value)
    if kind in PLAIN_TENSORS:
        return (value.dtype, value.get_device(), value.data_ptr() & 15)
    if kind is int or kind is bool or kind is float or value is None:
        return (kind, value) if kind is not float else kind
    if (kind in _DESCRIPTORS or _gluon_descriptor(kind)) and type(value.base) in PLAIN_TENSORS:
        # Triton asks for the dtype and the block shape (and a Gluon descriptor's
        # shared-memory layout); the rest pins the layout in memory.
        base = value.base
        return (kind, base.dtype, base.get_device(), base.data_ptr() & 15, tuple(value.shape),
                tuple(value.strides), tuple(value.block_shape), getattr(value, "padding", None),
                getattr(value, "layout", None))  # fmt: skip
    return _UNKEYED


def launch_key(kernel, grid: tuple[int, ...], args: tuple, meta: dict) -> tuple | None:
    """The key under which :func:`launch` remembers a launch of ``kernel`` with these
    runtime ``args`` and ``meta`` (constexprs and options), or None when an argument
    cannot be keyed: launches with one key compile alike."""
    key = (kernel, tuple(grid), *map(_arg_key, args), *sorted(meta.items()))
    if _UNKEYED in key:
        return None
    try:
        hash(key)
    except TypeError:  # an unhashable constexpr value
        return None
    return key


_UNKEYED = object()
_CACHE: dict[tuple, Launched | bool] = {}
_CACHE_LIMIT = 4096


def _index_of(args: tuple) -> int | None:
    for a in args:
        if isinstance(a, _Tensor):
            return a.get_device() if a.is_cuda else None
    return None


def launch(kernel, grid: tuple[int, ...], *args: Any, **meta: Any) -> Launched | None:
    """``kernel[grid](*args, **meta)`` on the GPU of the first tensor in ``args``.

    ``args`` are the runtime arguments in signature order; ``meta`` holds every
    constexpr by name plus launch options (``num_warps``, ``num_stages``).  The kernel
    runs once.  Returns a :class:`Launched` for repeating the launch with arguments of
    the same specialisation, or None (the interpreter; a Triton without the route).
    Repeat calls whose arguments are plain tensors and numbers take the short route
    by themselves.
    """
    if not _GPU:
        kernel[grid](*args, **meta)
        return None
    key = launch_key(kernel, grid, args, meta)
    hit = _CACHE.get(key) if key is not None else None
    if hit and hit(*args):
        return hit
    index = _index_of(args)
    with device_guard(index):
        compiled = kernel[grid](*args, **meta)
        launched = _relauncher(kernel, compiled, grid, args, meta, _current_device())
    if key is not None and hit is None:
        if len(_CACHE) >= _CACHE_LIMIT:
            _CACHE.clear()
        _CACHE[key] = launched or False
    return launched


class Memo(dict):
    """Remembered repeat calls: call key -> whatever replays the call (:data:`PLANS`).

    Bounded: past ``limit`` entries it starts over rather than grow without end (a
    model with many shapes pays a slow call per shape again, nothing worse).
    """

    def __init__(self, limit: int = 1024):
        super().__init__()
        self.limit = limit

    def remember(self, key, value):
        """``value``, kept under ``key``."""
        if len(self) >= self.limit:
            self.clear()
        self[key] = value
        return value


# --------------------------------------------------------------------------- plans

#: Every op's plans of its calls, by call key (:func:`call_key`, led by something of
#: the op's own, such as its planning function, so that ops never share a key).
PLANS = Memo(4096)


def call_key(a: torch.Tensor, b: torch.Tensor | None, c: torch.Tensor | None, *knobs) -> tuple:
    """A call key: the layout of up to three tensors (shape, strides, dtype, device,
    address modulo 16; None where absent), then ``knobs`` as they are (something of
    the op's own first, such as its planning function, then its settings).  Only for
    tensors :func:`plain` says yes to.  Written out rather than looped over its
    arguments: it runs on every repeat call, and the loop cost half as much again."""
    return (
        a.shape, a.stride(), a.dtype, a.device, a.data_ptr() & 15,
        None if b is None else (b.shape, b.stride(), b.dtype, b.device, b.data_ptr() & 15),
        None if c is None else (c.shape, c.stride(), c.dtype, c.device, c.data_ptr() & 15),
        *knobs,
    )  # fmt: skip


class Step(Launched):
    """One launch of a plan: the kernel, its grid and constexprs (fixed by the plan's
    call key) and, once a GPU has launched it, the compiled kernel to start again.

    ``step(*args)`` starts the kept compiled kernel with the runtime arguments
    ``args`` and returns True, as a :class:`Launched` does; the arguments must be of
    the specialisation of the first launch's (the call key sees to the inputs, and
    fresh outputs are aligned).  It returns False, launching nothing, before a GPU
    has launched it once (always, under the interpreter): then :meth:`anew` launches
    through :func:`launch` and keeps what it compiled.  Call sites read
    ``step(*args) or step.anew(*args)``: one Python call on the repeat path.
    :meth:`via` hands the launch to another launcher
    (:func:`tilebook.ops.library.launch`, which torch.compile traces).
    """

    __slots__ = ("grid", "meta")

    def __init__(self, kernel, grid: tuple, meta: dict):
        super().__init__(kernel, None, -1, ())
        self.grid, self.meta = tuple(grid), meta

    def anew(self, *args: Any) -> bool:
        launched = launch(self._kernel, self.grid, *args, **self.meta)
        if self.index < 0 and launched is not None:  # the first compiled launch: kept
            self._run, self.index, self.tail = launched._run, launched.index, launched.tail
        return True

    def via(self, launcher, *args: Any) -> None:
        launcher(self._kernel, self.grid, *args, **self.meta)
