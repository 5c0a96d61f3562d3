"""Autocast for the ops that torch runs in the lower precision under ``torch.autocast``.

Inside ``torch.autocast(device_type, dtype)`` PyTorch casts the floating inputs of
``torch.matmul``, ``F.linear`` and ``F.scaled_dot_product_attention`` to ``dtype``
(float16 or bfloat16) before it runs them.  :func:`tilebook.matmul`,
:func:`tilebook.linear_act` and :func:`tilebook.flash_attention` do the same with
:func:`lower`, first thing: eager calls and calls traced by ``torch.compile`` (which
reads the autocast state while it traces) alike.  Gradients flow back through the
casts to the inputs in their own dtypes, as torch's do.
"""

from __future__ import annotations

import torch

__all__ = ["autocasting", "lower"]

_enabled = torch.is_autocast_enabled
_dtype = torch.get_autocast_dtype
_Tensor = torch.Tensor
#: The device types tilebook runs on; autocast knows no others, such as "meta" (the
#: ops' checks refuse those with a clear error).
_KINDS = frozenset({"cuda", "cpu"})


def autocasting(t: object) -> bool:
    """Whether ``t`` is a tensor on a device type where autocast is on now."""
    if not isinstance(t, _Tensor):
        return False
    kind = t.device.type
    return kind in _KINDS and _enabled(kind)


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
