"""Autocast: each op casts its inputs under ``torch.autocast`` as its torch counterpart does.

Inside ``torch.autocast(device_type, dtype)`` PyTorch casts the floating inputs of
``torch.matmul``, ``F.linear`` and ``F.scaled_dot_product_attention`` to ``dtype``
(float16 or bfloat16) before it runs them.  :func:`tilebook.matmul`,
:func:`tilebook.linear_act` and :func:`tilebook.flash_attention` do the same with
:func:`lower`, first thing: eager calls and calls traced by ``torch.compile`` (which
reads the autocast state while it traces) alike.

Some ops PyTorch runs in float32 under autocast instead, on some device types: on a
GPU, ``torch.softmax`` and ``F.layer_norm`` take a bfloat16 input to float32 and return
float32.  Which ones is PyTorch's table, not tilebook's, so :func:`upper` asks torch:
it runs the counterpart once on a tiny input under the same autocast state and casts
the floating inputs to float32 exactly where torch's result came back float32.
:func:`tilebook.softmax`, :func:`tilebook.rms_norm` and :func:`tilebook.layer_norm`
call it.  Dropout and vector addition keep their input's dtype, as torch's do.
Gradients flow back through the casts to the inputs in their own dtypes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["autocasting", "lower", "upper"]

_enabled = torch.is_autocast_enabled
_dtype = torch.get_autocast_dtype
_Tensor = torch.Tensor


def autocasting(t: object) -> bool:
    """Whether ``t`` is a tensor on a device type where autocast is on now."""
    if not isinstance(t, _Tensor):
        return False
    if t.is_cuda:  # (is_cuda and is_cpu: no torch.device made on every call)
        return _enabled("cuda")
    return t.is_cpu and _enabled("cpu")


def lower(first: object, *rest: object) -> tuple:
    """``(first, *rest)``, each floating tensor cast to the autocast dtype when autocast
    is on for ``first``'s device type (:func:`autocasting`); unchanged otherwise (and
    anything that is not a tensor, such as None, as it is)."""
    if not autocasting(first):
        return (first, *rest)
    dtype = _dtype(first.device.type)
    return tuple(
        t.to(dtype) if isinstance(t, _Tensor) and t.is_floating_point() else t
        for t in (first, *rest)
    )


#: The torch counterpart of each op that :func:`upper` serves, on a ``(1, 8)`` input.
_COUNTERPART = {
    "softmax": lambda t: torch.softmax(t, -1),
    "rms_norm": lambda t: F.rms_norm(t, (8,)),
    "layer_norm": lambda t: F.layer_norm(t, (8,)),
}
_UPCASTS: dict[tuple[str, str, torch.dtype], bool] = {}


def torch_upcasts(op: str, kind: str, dtype: torch.dtype) -> bool:
    """Whether torch runs ``op``'s counterpart in float32 under ``torch.autocast(kind,
    dtype)``: asked once (a call on a tiny input), then remembered."""
    key = (op, kind, dtype)
    got = _UPCASTS.get(key)
    if got is None:
        with torch.autocast(kind, dtype=dtype):
            probe = torch.ones(1, 8, device=kind, dtype=dtype)
            got = _UPCASTS[key] = _COUNTERPART[op](probe).dtype == torch.float32
    return got


def upper(op: str, first: object, *rest: object) -> tuple:
    """``(first, *rest)``, each floating tensor cast to float32 when autocast is on for
    ``first``'s device type and torch runs ``op`` in float32 there
    (:func:`torch_upcasts`); unchanged otherwise."""
    if not autocasting(first):
        return (first, *rest)
    kind = first.device.type
    if not torch_upcasts(op, kind, _dtype(kind)):
        return (first, *rest)
    return tuple(
        t.float() if isinstance(t, _Tensor) and t.is_floating_point() else t for t in (first, *rest)
    )
