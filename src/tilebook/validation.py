"""Input checks shared by every op, so that bad input fails with a clear message.

Triton kernels do no checking of their own: a wrong device can crash the process,
a wrong dtype silently reinterprets bytes, and (under the interpreter) an
out-of-bounds read can corrupt memory.  Every public op calls these first.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from . import runtime

__all__ = [
    "FLOAT_DTYPES",
    "check_same_device",
    "check_same_dtype_device",
    "check_same_shape",
    "check_tensor",
]

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _dtype_names(dtypes: Iterable[torch.dtype]) -> str:
    return ", ".join(str(d).removeprefix("torch.") for d in dtypes)


def check_tensor(
    x: object,
    name: str,
    op: str,
    *,
    dtypes: Iterable[torch.dtype] | None = FLOAT_DTYPES,
    ndim: int | None = None,
    min_ndim: int | None = None,
) -> torch.Tensor:
    """Check that ``x`` is a tensor on tilebook's device with an allowed dtype and rank.

    Raises :class:`TypeError` for a non-tensor or a wrong dtype and
    :class:`ValueError` for a wrong device or rank.  Returns ``x``.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(x).__name__}")
    if x.layout is not torch.strided:
        raise TypeError(
            f"{op}: {name} is a {str(x.layout).removeprefix('torch.')} tensor; the kernels "
            f"read dense (strided) tensors: convert it with {name}.to_dense()"
        )
    want = runtime.device()
    if x.device.type != want.type:
        hint = ".cuda()" if want.type == "cuda" else ".cpu()"
        mode = "GPU mode" if runtime.is_gpu() else "CPU mode (Triton interpreter)"
        raise ValueError(
            f"{op}: {name} is on {x.device}, but tilebook runs in {mode} and needs "
            f"{want.type} tensors; move it with {name}{hint}"
        )
    if dtypes is not None:
        allowed = tuple(dtypes)
        if x.dtype not in allowed:
            raise TypeError(
                f"{op}: {name} has dtype {str(x.dtype).removeprefix('torch.')}; "
                f"supported: {_dtype_names(allowed)}"
            )
    if ndim is not None and x.dim() != ndim:
        raise ValueError(f"{op}: {name} must have {ndim} dimensions, got shape {tuple(x.shape)}")
    if min_ndim is not None and x.dim() < min_ndim:
        raise ValueError(
            f"{op}: {name} must have at least {min_ndim} dimension(s), got shape {tuple(x.shape)}"
        )
    return x


def check_same_shape(a: torch.Tensor, b: torch.Tensor, names: tuple[str, str], op: str) -> None:
    """Check two tensors agree in shape, dtype and device (no implicit broadcasting)."""
    na, nb = names
    if a.shape != b.shape:
        raise ValueError(
            f"{op}: {na} and {nb} must have the same shape, got {tuple(a.shape)} and "
            f"{tuple(b.shape)} (tilebook does not broadcast)"
        )
    check_same_dtype_device(a, b, names, op)


def check_same_dtype_device(
    a: torch.Tensor, b: torch.Tensor, names: tuple[str, str], op: str
) -> None:
    """Check two tensors share a dtype (TypeError) and a device (ValueError)."""
    na, nb = names
    if a.dtype != b.dtype:
        raise TypeError(
            f"{op}: {na} and {nb} must have the same dtype, got "
            f"{str(a.dtype).removeprefix('torch.')} and {str(b.dtype).removeprefix('torch.')}"
        )
    check_same_device(op, **{na: a, nb: b})


def check_same_device(op: str, **tensors: torch.Tensor | None) -> torch.device:
    """Check that the named tensors (None: absent) sit on one device, the GPU index
    included; return it.  Raises :class:`ValueError` naming each tensor's device.

    Kernels launch on one GPU (:func:`tilebook._launch.device_guard` makes it the
    current one): a pointer into another GPU's memory is not one they can use.
    """
    present = {name: t for name, t in tensors.items() if t is not None}
    devices = {t.device for t in present.values()}
    if len(devices) > 1:
        where = ", ".join(f"{name} on {t.device}" for name, t in present.items())
        raise ValueError(
            f"{op}: tensors must be on one device, got {where}; move them with .to(device)"
        )
    return devices.pop() if devices else runtime.device()
