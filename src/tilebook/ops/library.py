"""The ops as ``torch.library`` operators, so that ``torch.compile`` keeps one graph.

Called eagerly, each public op (:func:`tilebook.rms_norm` and the others) runs its
own Python: checks, a plan of the call (:data:`tilebook._launch.PLANS`) and an
``autograd.Function``.  Dynamo cannot trace the eager launches (they read data
pointers and keep plans), so inside ``torch.compile`` the op's Function takes another
branch (``torch.compiler.is_compiling()``): its forward and backward call operators of
the ``tilebook`` namespace (``torch.ops.tilebook.rms_norm``,
``torch.ops.tilebook.rms_norm_backward`` ...) that Dynamo puts in its graph as they
are.  The operators carry no gradient of their own: the Function is each op's one
autograd path, eager and compiled.  Dynamo traces it, AOTAutograd traces the backward
too, and ``fullgraph=True`` holds.

Two kinds of operator:

* **Traceable** (:func:`define`): ``torch.library.triton_op``, whose body allocates
  the outputs and launches the kernels through :func:`launch`, that is
  ``torch.library.wrap_triton(kernel)[grid](...)``.  AOTAutograd traces the body, so
  Inductor sees the Triton kernels themselves (and compiles and launches them from
  its own generated code).  The body picks the same kernels and configurations as
  the eager path, from the same planning functions.
* **Opaque** (:func:`define_opaque`): ``torch.library.custom_op`` around the eager
  path, for launches that ``wrap_triton`` cannot trace: host-side tensor
  descriptors (the Hopper matmul, flash attention; PyTorch's tracer records only
  descriptors made by ``TensorDescriptor.from_tensor``, and not at all without
  Dynamo) and a seed drawn at run time (dropout without ``seed=``).  Inductor calls
  them as external kernels: still one graph, no break.

Under Triton's interpreter (CPU mode) kernels are not ``JITFunction`` objects and
``wrap_triton`` cannot wrap them, so every operator is a ``custom_op`` whose body
launches the interpreted kernels directly; its fake (meta) implementation is the
same body, whose launches do nothing on fake tensors.  The CPU tests thus run the
bodies that the GPU traces, with ``backend="aot_eager"``.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterable
from typing import Any

import torch

from .. import runtime
from .._launch import device_guard

__all__ = [
    "NAMESPACE",
    "TRACEABLE",
    "define",
    "define_opaque",
    "launch",
    "recording",
    "registered",
    "wrap",
]

#: The ``torch.library`` namespace of tilebook's operators: ``torch.ops.tilebook``.
NAMESPACE = "tilebook"

#: True where kernels are real ``JITFunction`` objects that ``wrap_triton`` can trace
#: (GPU mode, and the compile-only ``aot`` mode); False under the interpreter.
TRACEABLE = not runtime.is_interpreter()

try:
    from torch._subclasses.fake_tensor import FakeTensor as _FakeTensor
except ImportError:  # pragma: no cover - every supported torch has it
    _FakeTensor = ()


class _Interpreted:
    """``kernel[grid](...)`` that launches nothing on fake tensors (shape propagation:
    the outputs are already allocated, and an interpreted kernel would read them)."""

    __slots__ = ("kernel",)

    def __init__(self, kernel):
        self.kernel = kernel

    def __getitem__(self, grid):
        kernel = self.kernel

        def run(*args: Any, **meta: Any) -> None:
            if any(isinstance(a, _FakeTensor) for a in args):
                return None
            return kernel[grid](*args, **meta)

        return run


def wrap(kernel):
    """``kernel`` ready for ``[grid](...)`` inside an operator's body: traced by
    ``torch.library.wrap_triton`` where kernels can be, else launched as it is."""
    if TRACEABLE:
        return torch.library.wrap_triton(kernel)
    return _Interpreted(kernel)


def _first_tensor(args: tuple) -> torch.Tensor | None:
    for a in args:
        if isinstance(a, torch.Tensor):
            return a
    return None


def _kernel_name(kernel) -> str:
    fn = getattr(kernel, "fn", None)
    return getattr(kernel, "__name__", None) or getattr(fn, "__name__", None) or "?"


def _check_devices(kernel, args: tuple) -> None:
    """The public ops check their inputs; ``torch.ops.tilebook.*`` called directly
    skips those checks, and Triton's own message for a CPU tensor ("cannot be
    accessed from Triton (cpu tensor?)") names neither the operator nor the cure."""
    devices = {a.device for a in args if isinstance(a, torch.Tensor)}
    where = f"tilebook kernel {_kernel_name(kernel)}"
    if any(d.type != "cuda" for d in devices):
        found = ", ".join(sorted(str(d) for d in devices))
        raise ValueError(f"{where} runs on CUDA tensors only; its inputs are on {found}")
    if len(devices) > 1:
        found = ", ".join(sorted(str(d) for d in devices))
        raise ValueError(f"{where}: all inputs must be on one GPU; they are on {found}")


_RECORDING = threading.local()


@contextlib.contextmanager
def recording():
    """Inside the block, :func:`launch` records ``(kernel, grid, args, meta)`` in the
    list it yields instead of launching: run an operator's body on ``"meta"`` tensors
    to learn what it would launch (:mod:`tilebook.ops.targets` turns that into
    compile jobs)."""
    previous = getattr(_RECORDING, "launches", None)
    _RECORDING.launches = launches = []
    try:
        yield launches
    finally:
        _RECORDING.launches = previous


_BODY = threading.local()


def _body(fn: Callable) -> Callable:
    """``fn`` (an operator's body) noting its tensor inputs for :func:`_check_aliases`."""

    @functools.wraps(fn)
    def body(*args: Any, **kwargs: Any) -> Any:
        previous = getattr(_BODY, "inputs", None)
        _BODY.inputs = {id(a) for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)}
        try:
            return fn(*args, **kwargs)
        finally:
            _BODY.inputs = previous

    return body


def _check_aliases(kernel, args: tuple) -> None:
    """Refuse a tensor the body made (an output, a scratch buffer) passed as two
    arguments of one launch.

    When PyTorch cannot read from a kernel's code which arguments it writes (a Triton
    it does not know, an operation its analysis does not follow), it assumes every
    tensor argument is written and clones each one separately: the kernel's stores
    land in one clone, and the tensor takes the other's contents.  An input of the
    operator passed twice is harmless (a body never writes its inputs), so a pointer
    the kernel never touches (a ``HAS_BIAS=False`` bias, say) takes an input.
    """
    inputs = getattr(_BODY, "inputs", None)
    if inputs is None:  # a body called directly (compile jobs), not as an operator
        return
    seen: set[int] = set()
    for a in args:
        if isinstance(a, torch.Tensor):
            if id(a) in seen and id(a) not in inputs:
                raise RuntimeError(
                    f"tilebook: {_kernel_name(kernel)} is given one tensor the operator made as two "
                    "arguments; pass an input of the operator for an unused pointer"
                )
            seen.add(id(a))


def launch(kernel, grid: tuple, *args: Any, **meta: Any) -> None:
    """Launch ``kernel`` from an operator's body: ``wrap(kernel)[grid](*args, **meta)``.

    Same arguments as :func:`tilebook._launch.launch` (runtime arguments in order,
    constexprs and ``num_warps``/``num_stages`` by name).  Run for real (the
    operator called outside a trace), it launches on the GPU of the first tensor.
    Raises ``RuntimeError`` when a tensor the operator made is given twice.
    """
    _check_aliases(kernel, args)
    launches = getattr(_RECORDING, "launches", None)
    if launches is not None:
        launches.append((kernel, grid, args, meta))
        return
    wrapped = wrap(kernel)
    if wrapped is kernel:  # a real launch (wrap_triton is off outside a trace)
        if TRACEABLE:
            _check_devices(kernel, args)
        with device_guard(_first_tensor(args)):
            kernel[grid](*args, **meta)
    else:
        wrapped[grid](*args, **meta)


_DEFINED: dict[str, Any] = {}


def _qualname(name: str) -> str:
    return f"{NAMESPACE}::{name}"


def _register_kernels(qualname: str, kernels: Iterable) -> None:
    # PyTorch finds a triton_op's kernels by reading its body's source (for the
    # AOTAutograd cache key); our bodies reach them through planning functions, so
    # name them outright.
    try:
        from torch._library import triton as _triton_lib
    except ImportError:  # pragma: no cover
        return
    table = getattr(_triton_lib, "triton_ops_to_kernels", None)
    if isinstance(table, dict):
        known = table.setdefault(qualname, [])
        known.extend(k for k in kernels if all(k is not j for j in known))


def define(name: str, body: Callable, *, kernels: Iterable = ()):
    """Register ``body`` as the traceable operator ``tilebook::<name>``.

    ``body`` takes and returns what the schema inferred from its annotations says,
    returns new tensors (never an input or a view of one), launches kernels only
    through :func:`launch`, and never gives one launch a tensor it made twice
    (:func:`launch` refuses that: when PyTorch cannot read which arguments a kernel
    writes, such a tensor comes back unwritten).  ``kernels`` lists every ``@triton.jit`` function it may
    launch.  Returns the ``CustomOpDef``, which the op's ``autograd.Function`` calls
    under ``torch.compile``.
    """
    qualname = _qualname(name)
    body = _body(body)
    if TRACEABLE:
        op = torch.library.triton_op(qualname, body, mutates_args=())
        _register_kernels(qualname, kernels)
    else:
        op = torch.library.custom_op(qualname, body, mutates_args=())
        op.register_fake(body)
    _DEFINED[qualname] = op
    return op


def define_opaque(name: str, impl: Callable, *, fake: Callable):
    """Register ``impl`` (eager code, run with real tensors) as ``tilebook::<name>``,
    with ``fake`` computing its outputs' shapes, dtypes and devices."""
    qualname = _qualname(name)
    op = torch.library.custom_op(qualname, impl, mutates_args=())
    op.register_fake(fake)
    _DEFINED[qualname] = op
    return op


def registered() -> dict[str, Any]:
    """Every operator defined so far, by name (``"tilebook::rms_norm"``, ...): its
    ``CustomOpDef`` (``torch.ops.tilebook.<name>`` calls it)."""
    return dict(_DEFINED)
