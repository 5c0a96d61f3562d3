"""A pre-norm transformer block built from tilebook's ops, and the same block from torch's.

The proof that the ops behave as a PyTorch user expects (issue 31): a block made only of
:func:`~tilebook.rms_norm`, :func:`~tilebook.matmul`, :func:`~tilebook.flash_attention`
(causal, grouped-query), :func:`~tilebook.dropout` and :func:`~tilebook.linear_act`, whose
parameters are float32 and whose activations run under ``torch.autocast``, trains as
the same block made of torch's ops does, step by step (``tests/test_block.py``; its step
time: ``benchmarks/block_step.py``).

The two differ in their ops only.  Dropout's mask is a function of its seed and the
element's position (:func:`tilebook.dropout`); the torch block multiplies by that same
mask, made once per step from the seed, so that both blocks drop the same elements
(``same_mask=False``: ``F.dropout``, for timing the torch block as a user writes it).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tilebook import dropout as tb_dropout
from tilebook import flash_attention, linear_act, matmul, rms_norm

__all__ = ["Block", "dropout_mask"]


def dropout_mask(like: torch.Tensor, p: float, seed: int) -> torch.Tensor:
    """The mask (0 or ``1 / (1 - p)``) that ``tilebook.dropout(t, p, seed=seed)`` applies
    to a tensor ``t`` of ``like``'s shape, in float32: the torch block's dropout."""
    with torch.no_grad():
        return tb_dropout(torch.ones_like(like, dtype=torch.float32), p, seed=seed)


class Block(nn.Module):
    """``x + drop(attn(norm(x)))``, then ``x + drop(mlp(norm(x)))``, over ``(B, N, dim)``.

    ``heads`` query heads share ``kv_heads`` key and value heads (grouped-query
    attention); the attention is causal.  ``ops="tilebook"`` runs tilebook's ops,
    ``ops="torch"`` torch's (``F.rms_norm``, ``torch.matmul``,
    ``F.scaled_dot_product_attention``, ``F.gelu(F.linear(...))`` and the same dropout
    mask).  :meth:`forward` takes the step's dropout ``seed``.
    """

    def __init__(self, dim: int, heads: int, kv_heads: int, hidden: int, *, p: float = 0.1,
                 ops: str = "tilebook", same_mask: bool = True) -> None:  # fmt: skip
        super().__init__()
        if ops not in ("tilebook", "torch"):
            raise ValueError(f"Block: ops must be 'tilebook' or 'torch', got {ops!r}")
        if dim % heads or heads % kv_heads:
            raise ValueError(
                f"Block: dim ({dim}) must be a multiple of heads ({heads}), and heads of "
                f"kv_heads ({kv_heads})"
            )
        self.ops, self.p, self.same_mask = ops, p, same_mask
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        kv = 2 * kv_heads * self.head_dim

        def param(*shape: int, scale: float) -> nn.Parameter:
            return nn.Parameter(torch.randn(*shape) * scale)

        self.norm1, self.norm2 = nn.Parameter(torch.ones(dim)), nn.Parameter(torch.ones(dim))
        self.wq = param(dim, dim, scale=dim**-0.5)  # (out, in), as nn.Linear stores it
        self.wkv = param(kv, dim, scale=dim**-0.5)
        self.wo = param(dim, dim, scale=dim**-0.5)
        self.w1, self.b1 = param(hidden, dim, scale=dim**-0.5), param(hidden, scale=0.0)
        self.w2 = param(dim, hidden, scale=hidden**-0.5)

    def forward(self, x: torch.Tensor, seed: int = 0) -> torch.Tensor:
        tb = self.ops == "tilebook"
        B, N, dim = x.shape
        Dh = self.head_dim
        norm = rms_norm if tb else (lambda t, w: F.rms_norm(t, (dim,), w, 1e-6))
        mm = matmul if tb else torch.matmul

        def drop(t: torch.Tensor, s: int) -> torch.Tensor:
            if tb:
                return tb_dropout(t, self.p, seed=s)
            if self.same_mask:
                return t * dropout_mask(t, self.p, s)
            return F.dropout(t, self.p, self.training)

        h = norm(x, self.norm1)
        q = mm(h, self.wq.t()).view(B, N, self.heads, Dh).transpose(1, 2)
        k, v = mm(h, self.wkv.t()).view(B, N, 2, self.kv_heads, Dh).permute(2, 0, 3, 1, 4)
        if tb:
            a = flash_attention(q, k, v, causal=True)
        else:
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + drop(mm(a.transpose(1, 2).reshape(B, N, dim), self.wo.t()), 2 * seed)
        h = norm(x, self.norm2)
        gelu = linear_act if tb else (lambda t, w, b, _: F.gelu(F.linear(t, w, b)))
        u = gelu(h, self.w1, self.b1, "gelu")
        return x + drop(mm(u, self.w2.t()), 2 * seed + 1)
