"""Tensors that are not dense (sparse, for one) are refused by every op with a clear
TypeError, before any fast path asks them for strides or a data pointer."""

from __future__ import annotations

import pytest
import torch

import tilebook

DEV = tilebook.device()
DT = torch.float16 if tilebook.is_gpu() else torch.float32


def _t(*shape):
    return torch.randn(*shape, device=DEV, dtype=DT)


# (op, its tensor arguments, keyword arguments): each tensor in turn is made sparse.
CALLS = {
    "vector_add": (tilebook.vector_add, (_t(4, 8), _t(4, 8)), {}),
    "softmax": (tilebook.softmax, (_t(4, 8),), {}),
    "rms_norm": (tilebook.rms_norm, (_t(4, 8), _t(8)), {}),
    "layer_norm": (tilebook.layer_norm, (_t(4, 8), _t(8), _t(8)), {}),
    "dropout": (tilebook.dropout, (_t(4, 8),), {"seed": 1}),
    "matmul": (tilebook.matmul, (_t(4, 8), _t(8, 16)), {}),
    "linear_act": (tilebook.linear_act, (_t(4, 8), _t(16, 8), _t(16)), {}),
    "flash_attention": (tilebook.flash_attention, (_t(1, 1, 16, 32),) * 3, {}),
}


@pytest.mark.parametrize("name", list(CALLS))
def test_sparse_tensors_are_refused_clearly(name):
    op, args, kw = CALLS[name]
    op(*args, **kw)  # dense: fine (and remembered where the op remembers calls)
    for i in range(len(args)):
        bad = list(args)
        bad[i] = args[i].to_sparse()
        with pytest.raises(TypeError, match=r"sparse_coo tensor.*to_dense\(\)"):
            op(*bad, **kw)
