"""The flash-attention forward on Hopper (sm_90), written in Gluon: FlashAttention-3's schedule.

Why a second forward.  ``flash_attention``'s Triton forward (lesson 12's kernel)
falls short of cuDNN at D=128 on Hopper (``benchmarks/flash_attention.py`` measures
by how much, in the record ``bench_flash_attention``).  What bounds it is the order
inside a warpgroup: a tile's softmax waits for its ``Q @ K^T`` product and its
``P @ V`` product waits for the softmax, so the tensor cores idle while the
exponentials run (``benchmarks/notes/flash_attention.md``: without any ``exp2`` at
all the kernel is no faster).  Triton 3.6-3.8 does not reorder that on Hopper, and
its automatic warp specialisation fails or is ignored there.  Gluon, Triton's
lower-level language (``triton.experimental.gluon``), states the schedule itself:

- one *producer* warp issues every TMA copy: the query tile once, then key and value
  tiles into a ring of ``STAGES`` shared-memory buffers, each guarded by a "ready"
  and an "empty" mbarrier;
- two *consumer* warpgroups, 64 query rows each, run the online softmax.  Each
  issues ``S_j = Q @ K_j^T`` and then ``O += P_{j-1} @ V_{j-1}`` as asynchronous
  wgmma, waits only for ``S_j``, and computes the softmax of tile ``j`` while the
  tensor cores still work on ``P_{j-1} @ V_{j-1}`` (FlashAttention-3's
  intra-warpgroup overlap).  The two warpgroups drift apart on their own, so one's
  softmax also runs beside the other's products;
- ``setmaxnreg`` moves registers from the producer (24 a thread) to the consumers
  (240), which hold ``S``, ``P`` and ``O`` at once.

The masks are the Triton forward's band (:mod:`tilebook.ops.attention_masks`: causal
and windows, bottom-right aligned): a program of 128 query rows visits only the key
tiles some row of it sees, and tiles every row sees skip the mask arithmetic.  Document masks, head dimensions
other than 64 and 128, and every GPU but sm_90 take the Triton forward
(:func:`usable`).  Gluon is experimental: if it is missing or this Triton's Gluon
cannot compile the kernel, :func:`forward` says so once and the Triton forward runs.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import re
import subprocess
import sys
import warnings
from dataclasses import dataclass

import torch

from .. import runtime

try:  # Gluon is experimental: checked with Triton 3.6 (GPU), 3.8 and 3.9 (compiled ahead)
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor
except ImportError:  # pragma: no cover - depends on the installed Triton
    gluon = None
    GluonDescriptor = None

__all__ = [
    "BLOCK_M",
    "BLOCK_N",
    "CONSUMER_REGISTERS",
    "HEAD_DIMS",
    "STAGES",
    "Compiled",
    "arguments",
    "available",
    "compile_ahead",
    "descriptor",
    "forward",
    "grid",
    "meta",
    "usable",
]

#: Query rows per consumer warpgroup (a program holds two such tiles).
BLOCK_M = 64
#: Key (and value) rows per tile.
BLOCK_N = 128
#: Key/value tiles in flight.  At D=128: 2 x 16 KB of queries, 2 x 2 x 32 KB of keys and
#: values, 2 x 16 KB of output staging: 192 KB of the 227 KB a block may use on sm_90.
STAGES = 2
#: Head dimensions the Gluon forward takes (others run the Triton forward).
HEAD_DIMS = (64, 128)
_DTYPES = (torch.float16, torch.bfloat16)
_MAXNREG = 168  # 12 warps' worth of the 64K registers; setmaxnreg moves them
#: Registers a consumer thread holds after ``setmaxnreg`` (the producer keeps 24).
CONSUMER_REGISTERS = 240
_LOG2E = 1.4426950408889634

if gluon is not None:
    # Triton 3.8 renamed the TMA copies (async_load, async_store) and 3.9 removed the
    # old names, which 3.6 has alone.
    _tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
    _tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global
    _CONSUMER_REGS = gl.constexpr(CONSUMER_REGISTERS)
    _PRODUCER_REGS = gl.constexpr(24)

    @gluon.jit
    def _producer(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bars, k_ready, v_ready,
                  k_empty, v_empty, b, h, hk, m0, start, n_tiles):  # fmt: skip
        """One warp: the two query tiles, then every key and value tile into the ring."""
        BM: gl.constexpr = q_smem.shape[3]
        BN: gl.constexpr = k_smem.shape[3]
        NS: gl.constexpr = k_smem.shape[0]
        for w in gl.static_range(2):
            mbarrier.expect(q_bars.index(w), q_desc.block_type.nbytes)
            _tma_load(q_desc, [b, h, m0 + w * BM, 0], q_bars.index(w),
                                            q_smem.index(w))  # fmt: skip
        for j in range(n_tiles):
            s = j % NS
            # An mbarrier starts with its phase-1 wait complete: the first pass through
            # the ring waits for nothing.
            ph = ((j // NS) & 1) ^ 1
            row = start + j * BN
            mbarrier.wait(k_empty.index(s), ph)
            mbarrier.expect(k_ready.index(s), k_desc.block_type.nbytes)
            _tma_load(k_desc, [b, hk, row, 0], k_ready.index(s),
                                            k_smem.index(s))  # fmt: skip
            mbarrier.wait(v_empty.index(s), ph)
            mbarrier.expect(v_ready.index(s), v_desc.block_type.nbytes)
            _tma_load(v_desc, [b, hk, row, 0], v_ready.index(s),
                                            v_smem.index(s))  # fmt: skip

    @gluon.jit
    def _softmax_step(s, m_i, rows, kstart, full_lo, full_hi, qk_scale, shift, left, right,
                      Nk, BAND: gl.constexpr, s_layout: gl.constexpr):  # fmt: skip
        """``(p, m_new, alpha)`` for one tile of scores: the mask only on a tile some row
        of the program does not fully see."""
        BN: gl.constexpr = s.shape[1]
        if (kstart < full_lo) | (kstart + BN > full_hi):
            cols = kstart + gl.arange(0, BN, layout=gl.SliceLayout(0, s_layout))
            c2 = gl.expand_dims(cols, 0)
            if BAND:
                diag = gl.expand_dims(rows + shift, 1)  # bottom-right alignment
                vis = (c2 < Nk) & (c2 >= diag - left) & (c2 <= diag + right)
            else:
                vis = (c2 < Nk) & gl.expand_dims(rows >= 0, 1)
            x = gl.where(vis, s * qk_scale, float("-inf"))
            m_new = gl.maximum(m_i, gl.max(x, 1))
            # A row that has seen no key yet: subtract 0, so exp2 gives 0, not NaN.
            m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
            p = gl.exp2(x - gl.expand_dims(m_use, 1))
        else:
            m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
            m_use = m_new
            p = gl.exp2(s * qk_scale - gl.expand_dims(m_use, 1))
        return p, m_new, gl.exp2(m_i - m_use)

    @gluon.jit
    def _consumer(shared, WG: gl.constexpr, BAND: gl.constexpr):
        """Warpgroup ``WG``: 64 query rows through every key tile, then O and the
        log-sum-exp.  ``shared`` holds what both consumers take."""
        (o_desc, q_smem, k_smem, v_smem, o_smem, q_bars, k_ready, v_ready, k_empty, v_empty,
         lse_ptr, qk_scale, b, h, bh, m0, start, n_tiles, full_lo, full_hi, Nq, Nk, shift,
         left, right) = shared  # fmt: skip
        BM: gl.constexpr = q_smem.shape[3]
        D: gl.constexpr = q_smem.shape[4]
        BN: gl.constexpr = k_smem.shape[3]
        NS: gl.constexpr = k_smem.shape[0]
        dtype: gl.constexpr = q_smem.dtype
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 16]
        )
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D, 16]
        )
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
        row_o: gl.constexpr = gl.SliceLayout(1, o_layout)

        rows = m0 + WG * BM + gl.arange(0, BM, layout=row_s)
        q = q_smem.index(WG).reshape([BM, D])
        zero_s = gl.zeros([BM, BN], gl.float32, s_layout)
        acc = gl.zeros([BM, D], gl.float32, o_layout)
        m_i = gl.full([BM], float("-inf"), gl.float32, row_s)
        l_i = gl.zeros([BM], gl.float32, row_s)
        mbarrier.wait(q_bars.index(WG), 0)
        if n_tiles > 0:
            mbarrier.wait(k_ready.index(0), 0)
            s_tok = warpgroup_mma(q, k_smem.index(0).reshape([BN, D]).permute((1, 0)), zero_s,
                                  use_acc=False, is_async=True)  # fmt: skip
            s = warpgroup_mma_wait(0, deps=[s_tok])
            mbarrier.arrive(k_empty.index(0), count=1)
            p, m_i, alpha = _softmax_step(s, m_i, rows, start, full_lo, full_hi, qk_scale,
                                          shift, left, right, Nk, BAND, s_layout)  # fmt: skip
            l_i = gl.sum(p, 1)
            p_op = gl.convert_layout(p.to(dtype), p_layout)
            for j in range(1, n_tiles):
                st = j % NS
                sp = (j - 1) % NS
                mbarrier.wait(k_ready.index(st), (j // NS) & 1)
                s_tok = warpgroup_mma(q, k_smem.index(st).reshape([BN, D]).permute((1, 0)),
                                      zero_s, use_acc=False, is_async=True)  # fmt: skip
                mbarrier.wait(v_ready.index(sp), ((j - 1) // NS) & 1)
                o_tok = warpgroup_mma(p_op, v_smem.index(sp).reshape([BN, D]), acc,
                                      is_async=True)  # fmt: skip
                # Wait for S_j only: P_{j-1} @ V_{j-1} keeps the tensor cores busy
                # while this warpgroup computes the softmax of tile j.
                s = warpgroup_mma_wait(1, deps=[s_tok])
                mbarrier.arrive(k_empty.index(st), count=1)
                p, m_i, alpha = _softmax_step(s, m_i, rows, start + j * BN, full_lo, full_hi,
                                              qk_scale, shift, left, right, Nk, BAND,
                                              s_layout)  # fmt: skip
                l_i = l_i * alpha + gl.sum(p, 1)
                acc, p_op = warpgroup_mma_wait(0, deps=[o_tok, p_op])
                mbarrier.arrive(v_empty.index(sp), count=1)
                acc = acc * gl.expand_dims(gl.convert_layout(alpha, row_o), 1)
                p_op = gl.convert_layout(p.to(dtype), p_layout)
            sl = (n_tiles - 1) % NS
            mbarrier.wait(v_ready.index(sl), ((n_tiles - 1) // NS) & 1)
            o_tok = warpgroup_mma(p_op, v_smem.index(sl).reshape([BN, D]), acc, is_async=True)
            acc, p_op = warpgroup_mma_wait(0, deps=[o_tok, p_op])
            mbarrier.arrive(v_empty.index(sl), count=1)

        # A row that saw no key: output 0, log-sum-exp +inf (so the backward's P is 0).
        empty = l_i == 0.0
        l_safe = gl.where(empty, 1.0, l_i)
        acc = acc * gl.expand_dims(gl.convert_layout(1.0 / l_safe, row_o), 1)
        out = o_smem.index(WG)
        out.reshape([BM, D]).store(acc.to(dtype))
        fence_async_shared()
        _tma_store(o_desc, [b, h, m0 + WG * BM, 0], out)
        lse = gl.where(empty, float("inf"), m_i + gl.log2(l_safe))
        gl.store(lse_ptr + bh.to(gl.int64) * Nq + rows, lse, mask=rows < Nq)
        tma.store_wait(0)

    @gluon.jit
    def _fwd_kernel(q_desc, k_desc, v_desc, o_desc, lse_ptr, qk_scale, H, G, Nq, Nk, left,
                    right, num_m, BAND: gl.constexpr, NS: gl.constexpr):  # fmt: skip
        """One program per (pair of query tiles, batch, head)."""
        BM: gl.constexpr = q_desc.block_type.shape[2]
        BN: gl.constexpr = k_desc.block_type.shape[2]
        pid = gl.program_id(0)
        bh = pid // num_m
        start_m = num_m - 1 - pid % num_m  # the longest rows first under a causal mask
        b = bh // H
        h = bh % H
        hk = h // G
        m0 = start_m * (2 * BM)
        m_last = gl.minimum(m0 + 2 * BM, Nq) - 1
        shift = Nk - Nq
        if BAND:  # keys some row of the program sees, and keys all of its rows see
            lo = gl.maximum(m0 + shift - left, 0)
            hi = gl.minimum(m_last + shift + right + 1, Nk)
            full_lo = m_last + shift - left
            full_hi = gl.minimum(m0 + shift + right + 1, Nk)
        else:
            lo = 0
            hi = Nk
            full_lo = 0
            full_hi = Nk
        start = (lo // BN) * BN
        n_tiles = gl.maximum(gl.cdiv(hi, BN) - lo // BN, 0)

        D: gl.constexpr = q_desc.block_type.shape[3]
        q_smem = gl.allocate_shared_memory(q_desc.dtype, [2, 1, 1, BM, D], q_desc.layout)
        k_smem = gl.allocate_shared_memory(k_desc.dtype, [NS, 1, 1, BN, D], k_desc.layout)
        v_smem = gl.allocate_shared_memory(v_desc.dtype, [NS, 1, 1, BN, D], v_desc.layout)
        o_smem = gl.allocate_shared_memory(o_desc.dtype, [2, 1, 1, BM, D], o_desc.layout)
        q_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        k_ready = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
        v_ready = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
        k_empty = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
        v_empty = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
        for w in gl.static_range(2):
            mbarrier.init(q_bars.index(w), count=1)
        for i in gl.static_range(NS):
            mbarrier.init(k_ready.index(i), count=1)
            mbarrier.init(v_ready.index(i), count=1)
            mbarrier.init(k_empty.index(i), count=2)  # both consumers release a buffer
            mbarrier.init(v_empty.index(i), count=2)
        shared = (o_desc, q_smem, k_smem, v_smem, o_smem, q_bars, k_ready, v_ready, k_empty,
                  v_empty, lse_ptr, qk_scale, b, h, bh, m0, start, n_tiles, full_lo, full_hi,
                  Nq, Nk, shift, left, right)  # fmt: skip
        producer = (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bars, k_ready, v_ready,
                    k_empty, v_empty, b, h, hk, m0, start, n_tiles)  # fmt: skip
        gl.warp_specialize(
            [
                (_consumer, (shared, 0, BAND)),
                (_consumer, (shared, 1, BAND)),
                (_producer, producer),
            ],
            [4, 1],
            [_CONSUMER_REGS, _PRODUCER_REGS],
        )


def available() -> bool:
    """Whether this Triton has the Gluon names the kernel uses."""
    return gluon is not None and not _BROKEN


def usable(q: torch.Tensor, k: torch.Tensor, documents: bool) -> bool:
    """Whether :func:`forward` takes this call: an sm_90 GPU, fp16 or bf16, a head
    dimension in :data:`HEAD_DIMS`, no document mask, and a Gluon that compiled."""
    return (
        available()
        and runtime.is_gpu()
        and q.is_cuda
        and not documents
        and q.dtype in _DTYPES
        and q.shape[3] in HEAD_DIMS
        and runtime.capability(q.device) == (9, 0)  # TILEBOOK_ARCH may lower it
    )


_BROKEN = False


@functools.cache
def _layout_for(rows: int, d: int, dtype: torch.dtype):
    # Cached: building a layout validates it, 10+ us of a small call's host time.
    gdt = gl.float16 if dtype == torch.float16 else gl.bfloat16
    return gl.NVMMASharedLayout.get_default_for([1, 1, rows, d], gdt)


def descriptor(t: torch.Tensor, shape, strides, rows: int):
    """A Gluon descriptor of the 4-D ``t`` read in ``[1, 1, rows, D]`` blocks."""
    block = [1, 1, rows, t.shape[3]]
    return GluonDescriptor(
        t, list(shape), list(strides), block, _layout_for(rows, t.shape[3], t.dtype)
    )


def grid(q: torch.Tensor) -> tuple[int]:
    """The launch grid for queries ``q`` (B, H, Nq, D): a program per 128 query rows of
    each (batch, head)."""
    B, H, Nq, _ = q.shape
    return (B * H * -(-Nq // (2 * BLOCK_M)),)


def arguments(q, k, v, o, lse, layouts, sm_scale: float, left: int, right: int) -> tuple:
    """The kernel's runtime arguments, in order; ``layouts`` as for :func:`forward`.
    A plan's repeat launch (``tilebook._launch.Step``) takes them as they are."""
    H, Nq = q.shape[1], q.shape[2]
    Hkv, Nk = k.shape[1], k.shape[2]
    (sq, tq), (sk, tk), (sv, tv), (so, to) = layouts
    return (
        descriptor(q, sq, tq, BLOCK_M), descriptor(k, sk, tk, BLOCK_N),
        descriptor(v, sv, tv, BLOCK_N), descriptor(o, so, to, BLOCK_M),
        lse, sm_scale * _LOG2E, H, H // Hkv, Nq, Nk, left, right, -(-Nq // (2 * BLOCK_M)),
    )  # fmt: skip


def meta(band: bool) -> dict:
    """The kernel's constexprs and launch options, by name, for a mask with (``band``) or
    without a band."""
    return {"BAND": band, "NS": STAGES, "num_warps": 4, "maxnreg": _MAXNREG}


def forward(launch, q, k, v, o, lse, layouts, sm_scale: float, left: int, right: int, band: bool):
    """Launch the Gluon forward through ``launch`` (:func:`tilebook._launch.launch`);
    returns what it returned, or raises :class:`RuntimeError` once Gluon failed here
    (the caller then runs the Triton forward, and :func:`usable` says no from then on).

    ``layouts`` gives each of q, k, v and o as ``(shape, strides)`` of a 4-D view.
    """
    global _BROKEN
    args = arguments(q, k, v, o, lse, layouts, sm_scale, left, right)
    try:
        return launch(_fwd_kernel, grid(q), *args, **meta(band))
    except Exception as exc:  # experimental Gluon: any failure falls back
        _BROKEN = True
        warnings.warn(
            f"tilebook: the Gluon flash-attention forward failed on this Triton ({exc!r}); "
            "using the Triton forward from now on",
            RuntimeWarning,
            stacklevel=3,
        )
        raise RuntimeError("Gluon forward unavailable") from exc


@dataclass(frozen=True)
class Compiled:
    """The Gluon forward compiled ahead of time, readable like
    :class:`tilebook.course.aot.CompiledKernel` (``stage``, ``registers``, ``shared_bytes``,
    ``spill_stores_bytes``), so :func:`tilebook.course.aot.instruction_table` can list it.

    ``registers`` is what a thread holds at launch (``maxnreg``); ``setmaxnreg`` then
    moves registers from the producer to the consumers (:data:`CONSUMER_REGISTERS`).
    ``num_warps`` counts every warp of the launch: 4 for each consumer warpgroup and a
    warpgroup's worth for the producer warp (registers go by warpgroup).
    """

    stages: dict
    shared_bytes: int
    ptxas_log: str
    num_warps: int = 12

    def stage(self, name: str) -> str:
        """The text of one stage: ``"ptx"`` or ``"sass"``."""
        if name not in self.stages:
            raise ValueError(f"stage {name!r}: this kernel has {sorted(self.stages)}")
        return self.stages[name]

    @property
    def ptx(self) -> str:
        """The PTX Triton generated."""
        return self.stages["ptx"]

    @property
    def registers(self) -> int:
        """Registers a thread at launch, from the ptxas report."""
        from ..course.aot.compiler import _REGISTERS

        found = _REGISTERS.search(self.ptxas_log)
        if found is None:
            raise ValueError(f"no register count in the ptxas report:\n{self.ptxas_log}")
        return int(found.group(1))

    @property
    def spill_stores_bytes(self) -> int:
        """Bytes of register spills (stores), from the ptxas report."""
        from ..course.aot.compiler import _SPILLS

        return sum(int(stores) for stores, _loads in _SPILLS.findall(self.ptxas_log))

    @property
    def overlapped_waits(self) -> int:
        """Waits for a wgmma that leave one product in flight (``wgmma.wait_group 1``)."""
        return len(re.findall(r"wgmma\.wait_group\.sync\.aligned\s+1;", self.ptx))


def compile_ahead(
    head_dim: int = 128, dtype: str = "bf16", band: bool = False, arch: int = 90
) -> Compiled:
    """Compile the Gluon forward for ``sm_<arch>`` without a GPU.

    Under Triton's interpreter (tilebook's CPU mode), which Gluon kernels cannot be
    compiled under, it runs in a child process without it.  Raises
    :class:`RuntimeError` where this Triton has no Gluon or the compilation fails.
    """
    if head_dim not in HEAD_DIMS or dtype not in ("bf16", "fp16"):
        raise ValueError(f"head_dim in {HEAD_DIMS} and dtype bf16 or fp16; got {head_dim}, {dtype}")
    if gluon is None:
        raise RuntimeError("this Triton has no Gluon (triton.experimental.gluon)")
    if os.environ.get("TRITON_INTERPRET", "0").lower() in ("", "0", "false", "off", "no"):
        return Compiled(**_compile_here(head_dim, dtype, bool(band), arch))
    from ..course.aot.jobs import _child_env

    job = json.dumps({"head_dim": head_dim, "dtype": dtype, "band": bool(band), "arch": arch})
    proc = subprocess.run(
        [sys.executable, "-m", __name__, job],
        capture_output=True, text=True, env=_child_env(), timeout=600, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"compiling the Gluon forward failed:\n{proc.stderr[-4000:]}")
    return Compiled(**json.loads(proc.stdout.splitlines()[-1]))


def _compile_here(head_dim: int, dtype: str, band: bool, arch: int) -> dict:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    from ..course.aot.compiler import _disassemble, _ptxas_log

    gdt = gl.bfloat16 if dtype == "bf16" else gl.float16
    descs = {}
    for name, rows in (("q_desc", BLOCK_M), ("k_desc", BLOCK_N), ("v_desc", BLOCK_N),
                       ("o_desc", BLOCK_M)):  # fmt: skip
        layout = gl.NVMMASharedLayout.get_default_for([1, 1, rows, head_dim], gdt)
        descs[name] = f"tensordesc<{dtype}[1, 1, {rows}, {head_dim}],{layout!r}>"
    ints = dict.fromkeys(("H", "G", "Nq", "Nk", "left", "right", "num_m"), "i32")
    signature = {**descs, "lse_ptr": "*fp32", "qk_scale": "fp32", **ints,
                 "BAND": "constexpr", "NS": "constexpr"}  # fmt: skip
    source = GluonASTSource(_fwd_kernel, signature, constexprs={"BAND": band, "NS": STAGES})
    options = {"num_warps": 4, "maxnreg": _MAXNREG}
    nvidia, log = triton.knobs.nvidia, io.StringIO()
    # ptxas's report comes with the compilation when it runs (a cold cache); from a
    # second ptxas run when the binary came from Triton's cache.
    with nvidia.scope(), contextlib.redirect_stdout(log):
        nvidia.dump_ptxas_log = True
        kernel = triton.compile(source, target=GPUTarget("cuda", arch, 32), options=options)
    ptx, report = kernel.asm["ptx"], log.getvalue()
    if "registers" not in report:
        report = _ptxas_log(ptx, arch, options)
    sass = _disassemble(kernel.asm["cubin"])[0]
    return {"stages": {"ptx": ptx, "sass": sass}, "shared_bytes": int(kernel.metadata.shared),
            "ptxas_log": report}  # fmt: skip


if __name__ == "__main__":
    print(json.dumps(_compile_here(**json.loads(sys.argv[1]))))
