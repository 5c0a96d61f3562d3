"""The Hopper path of :func:`tilebook.matmul`: TMA loads, wgmma, a persistent grid.

:func:`matmul_tma_kernel` computes what :func:`tilebook.ops.matmul_kernels.matmul_kernel`
does.  Host-side tensor descriptors let the copy engine (TMA) fetch tiles, with
zero fill past the edges, and a persistent grid of one program per SM walks the
tiles, so that one tile's epilogue overlaps the next tile's loads.  It needs 16-bit
inputs whose rows are 16-byte aligned (:func:`tma_layout`).  Large products whose
rows are not (4095 x 4093, say) are staged: the operands are copied to rows padded
to 16 bytes, the kernel writes a padded output, and that is copied back, for
products large enough that this pays (:data:`STAGE_MIN_MACS`).

Here: the kernel, its configurations, which devices and layouts take it, and the
pieces of a launch (descriptors, grid, staged copies) that the plans of
:mod:`tilebook.ops.matmul` put together.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from .. import runtime
from .._launch import sm_count
from .epilogue import epilogue
from .matmul_kernels import _cfg, cdiv, device_budget, prune_configs, tile_coords

try:  # host-side descriptors arrived in Triton 3.4; older versions use the pointer kernel
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - depends on the installed Triton
    TensorDescriptor = None

__all__ = [
    "GPU_TMA_CONFIGS",
    "INTERPRETER_TMA_CONFIGS",
    "STAGE_MIN_MACS",
    "TMA_CONFIGS",
    "matmul_tma_kernel",
    "tma_layout",
    "tma_supported",
]

TMA_DTYPES = (torch.float16, torch.bfloat16)


@triton.jit
def matmul_tma_kernel(
    a_desc,  # descriptor of A (M, K), or of A^T (K, M) when A_T
    b_desc,  # descriptor of B (K, N), or of B^T (N, K) when B_T
    c_desc,  # descriptor of C (M, N); blocks of BLOCK_N // 2 columns when SPLIT_N
    bias_ptr,
    M,
    N,
    K,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    A_T: tl.constexpr,
    B_T: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ACTIVATION: tl.constexpr,
    CTAS_PER_SM: tl.constexpr,  # read by the launcher only: programs per SM in the grid
    SPLIT_N: tl.constexpr,  # store C in two halves: half the shared memory for the epilogue
    FLATTEN: tl.constexpr,  # let the compiler pipeline across tiles, not only along K
):
    tl.static_assert(BLOCK_K >= 16, "tl.dot needs K tiles of at least 16")
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    start = tl.program_id(axis=0)
    step = tl.num_programs(axis=0)  # the grid is persistent: each program strides over tiles
    # The epilogue recomputes its tile from a counter of its own: once the loops are
    # flattened, the loads of the next tile may already be in flight.
    out_tile = start - step
    for tile in tl.range(start, num_m * num_n, step, flatten=FLATTEN):
        pid_m, pid_n = tile_coords(tile, num_m, num_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kk in range(k_tiles):
            off_k = kk * BLOCK_K
            # The copy engine fills out-of-bounds elements with zeros: no masks.
            a = a_desc.load([off_k, off_m]).T if A_T else a_desc.load([off_m, off_k])
            b = b_desc.load([off_n, off_k]).T if B_T else b_desc.load([off_k, off_n])
            acc = tl.dot(a, b, acc)

        out_tile += step
        pid_m, pid_n = tile_coords(out_tile, num_m, num_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        if SPLIT_N:
            # Finish one half at a time: fewer registers live in the activation.
            half: tl.constexpr = BLOCK_N // 2
            left, right = tl.split(tl.permute(tl.reshape(acc, (BLOCK_M, 2, half)), (0, 2, 1)))
            offs_n = off_n + tl.arange(0, half)
            left = epilogue(left, bias_ptr, offs_n, N, HAS_BIAS, ACTIVATION)
            c_desc.store([off_m, off_n], left.to(c_desc.dtype))
            right = epilogue(right, bias_ptr, offs_n + half, N, HAS_BIAS, ACTIVATION)
            c_desc.store([off_m, off_n + half], right.to(c_desc.dtype))
        else:
            offs_n = off_n + tl.arange(0, BLOCK_N)
            acc = epilogue(acc, bias_ptr, offs_n, N, HAS_BIAS, ACTIVATION)
            c_desc.store([off_m, off_n], acc.to(c_desc.dtype))


# --------------------------------------------------------------------------- configs


def tma_blocks(meta) -> dict:
    """The descriptors' block shapes for the constexprs ``meta`` of a launch, by name;
    also the autotuner's pre-hook, which sets them on the descriptors of the config
    being run."""
    bm, bn, bk = meta["BLOCK_M"], meta["BLOCK_N"], meta["BLOCK_K"]
    blocks = {
        "a_desc": [bk, bm] if meta["A_T"] else [bm, bk],
        "b_desc": [bn, bk] if meta["B_T"] else [bk, bn],
        "c_desc": [bm, bn // 2 if meta["SPLIT_N"] else bn],
    }
    for name, shape in blocks.items():
        if name in meta:
            meta[name].block_shape = shape
    return blocks


def _tma_cfg(
    bm, bn, bk, warps, stages, split_n, flatten=True, ctas=1, maxnreg=None, group_m=8
) -> triton.Config:
    # Several programs share an SM only if they fit its 64K registers: maxnreg caps them.
    kw = {"SPLIT_N": split_n, "FLATTEN": flatten, "CTAS_PER_SM": ctas}
    cfg = _cfg(bm, bn, bk, warps, stages, group_m, maxnreg=maxnreg, **kw)
    cfg.pre_hook = tma_blocks
    return cfg


# Flattening the two loops pipelines across tiles and won with several tiles per SM
# (4096 and 8192 cubed); without it, one or two tiles per program ran faster (2048
# cubed: 595 against 424 TFLOP/s) and so did the GELU epilogue.  128x128 tiles with two
# programs per SM (maxnreg=128) were slower everywhere: 430 to 650 TFLOP/s.
# 256x128 tiles in plain row order (GROUP_M=1) won at 3000x5000x2000: 111.6 us against
# 120.3 grouped by 8 and 127.6 for the best 128x256 (cuBLAS 96.2); at 8192 cubed they
# ran 6% slower than the grouped 128x256, which the autotuner keeps there.
GPU_TMA_CONFIGS = [
    _tma_cfg(128, 256, 64, 8, 3, split_n=True),
    _tma_cfg(256, 128, 64, 8, 4, split_n=True, group_m=1),
    _tma_cfg(128, 256, 64, 8, 4, split_n=True),
    _tma_cfg(128, 256, 64, 8, 3, split_n=True, flatten=False),
    _tma_cfg(128, 256, 64, 8, 4, split_n=True, flatten=False),
]
INTERPRETER_TMA_CONFIGS = [_tma_cfg(32, 32, 32, 4, 1, split_n=True)]
TMA_CONFIGS = INTERPRETER_TMA_CONFIGS if runtime.is_interpreter() else GPU_TMA_CONFIGS


def _prune_tma(configs, named_args, **kwargs):
    M, N, K = named_args["M"], named_args["N"], named_args["K"]
    return prune_configs(configs, M, N, K, 2, budget=device_budget(named_args["bias_ptr"].device))


#: :func:`matmul_tma_kernel` as the autotuner runs it on a product's first call.
tma_autotuned = triton.autotune(
    configs=TMA_CONFIGS,
    key=["M", "N", "K", "A_T", "B_T", "HAS_BIAS", "ACTIVATION"],
    prune_configs_by={"early_config_prune": _prune_tma},
)(matmul_tma_kernel)


# --------------------------------------------------------------------------- where it runs


def tma_target(arch: int) -> bool:
    """Whether the package launches :func:`matmul_tma_kernel` on ``sm_<arch>``: Hopper
    (TMA and wgmma), with a Triton that has host-side descriptors."""
    return TensorDescriptor is not None and arch // 10 == 9


@functools.cache
def _supported_on(kind: str, index: int | None) -> bool:
    if TensorDescriptor is None:
        return False
    if kind != "cuda":
        return runtime.is_interpreter()
    major, minor = runtime.capability(index)
    return tma_target(major * 10 + minor)


def tma_supported(device: torch.device) -> bool:
    """Whether ``device`` runs :func:`matmul_tma_kernel`: a Hopper GPU, or the
    interpreter (which emulates the descriptors)."""
    return _supported_on(device.type, device.index)


def tma_layout(t: torch.Tensor) -> bool | None:
    """False if ``t`` is row-major enough for a descriptor, True if its transpose is, else None."""
    elem = t.element_size()
    if t.data_ptr() % 16:
        return None
    s0, s1 = t.stride()
    if s1 == 1 and (s0 * elem) % 16 == 0 and s0 >= t.shape[1]:
        return False
    if s0 == 1 and (s1 * elem) % 16 == 0 and s1 >= t.shape[0]:
        return True
    return None


def grid_sms(device: torch.device) -> int:
    """Programs per ``CTAS_PER_SM`` of the persistent grid: the GPU's SMs."""
    if device.type != "cuda":
        return 4  # the interpreter: a few programs, so each one walks several tiles
    return sm_count(device)


def tma_args(M, N, K, a_t, b_t, a_strides, b_strides, c_strides, blocks):
    """``args(a, b, c, bias)``: the kernel's runtime arguments for operands laid out like
    these, ``a`` and ``b`` being tensors that hold A and B (or A^T, B^T) in memory:
    any tensor with the same data pointer gives the same arguments."""
    a_blk, b_blk, c_blk = blocks
    (sa0, sa1), (sb0, sb1) = a_strides, b_strides
    a_shape, a_str = ([K, M], [sa1, sa0]) if a_t else ([M, K], [sa0, sa1])
    b_shape, b_str = ([N, K], [sb1, sb0]) if b_t else ([K, N], [sb0, sb1])
    c_shape, c_str = [M, N], list(c_strides)
    desc = TensorDescriptor

    def args(a, b, c, bias):
        return (desc(a, a_shape, a_str, a_blk), desc(b, b_shape, b_str, b_blk),
                desc(c, c_shape, c_str, c_blk), a if bias is None else bias, M, N, K)  # fmt: skip

    return args


_PLACEHOLDER = ([16, 16],) * 3  # the autotuner's pre-hook sets the real blocks


def tune(a, b, c, bias, flags: dict) -> tuple:
    """Launch the autotuned kernel on 2-D operands the descriptors can read (``flags``:
    ``A_T``, ``B_T``, ``HAS_BIAS``, ``ACTIVATION``); returns what it picked, as
    ``(kernel, grid, constexprs and options, args)`` with ``args(a, b, c, bias)``
    building the runtime arguments for tensors laid out like these."""
    M, K = a.shape
    N = b.shape[1]
    made = lambda blocks: tma_args(M, N, K, flags["A_T"], flags["B_T"], a.stride(), b.stride(),
                                   c.stride(), blocks)  # fmt: skip
    n_sm = grid_sms(a.device)

    def grid(meta):
        tiles = cdiv(M, meta["BLOCK_M"]) * cdiv(N, meta["BLOCK_N"])
        return (min(n_sm * meta["CTAS_PER_SM"], tiles),)

    tma_autotuned[grid](*made(_PLACEHOLDER)(a, b, c, bias), **flags)
    kw = {**tma_autotuned.best_config.all_kwargs(), **flags}
    return matmul_tma_kernel, grid(kw), kw, made(tuple(tma_blocks(kw).values()))


# --------------------------------------------------------------------------- staging

# Development measurements behind the threshold (H100, bf16): at 2047 x 2049 x 2045
# staging took 94 us against the pointer kernel's 200 (cuBLAS 163); at 1023 x 1025 x
# 1021, 41 to 62 us against 42; at 4095 x 4097 x 4093, 418 us in all where cuBLAS took
# 873 and the pointer kernel 1101.  benchmarks/matmul.py times the staged shapes again
# on the GPU it runs on.
#: From this many multiply-adds on (about 1625 cubed), a product whose rows are not
#: 16-byte aligned is staged through aligned copies for the TMA kernel; below it the
#: copies cost more than the TMA kernel saves (the ragged shapes of the record
#: ``bench_matmul``, written by ``benchmarks/matmul.py``).
STAGE_MIN_MACS = 2**32


def aligned_empty(t: torch.Tensor) -> torch.Tensor:
    """An uninitialised tensor of ``t``'s shape, dtype and device whose rows start 16-byte
    aligned."""
    rows, cols = t.shape
    pad = -cols % (16 // t.element_size())
    return t.new_empty((rows, cols + pad))[:, :cols]


def aligned_copy(t: torch.Tensor) -> torch.Tensor:
    """``t``'s values in a tensor from :func:`aligned_empty`."""
    out = aligned_empty(t)
    out.copy_(t)
    return out


def staging(a, b, c) -> tuple[bool, bool, bool]:
    """Which of ``a``, ``b`` and ``c`` go through aligned copies (see
    :func:`aligned_copy`) for the kernel to read or write them."""
    return tma_layout(a) is None, tma_layout(b) is None, tma_layout(c) is not False
