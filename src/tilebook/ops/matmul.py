"""Matrix multiplication with a fused epilogue: ``act(a @ b + bias)`` in one kernel.

Two kernels compute the same thing:

* :func:`matmul_kernel` loads tiles through pointers with arbitrary strides and
  masks, so it takes any shape, any layout and float32 (through TF32).  One
  program owns one ``BLOCK_M x BLOCK_N`` tile of the output.
* :func:`matmul_tma_kernel` is the Hopper path: host-side tensor descriptors let
  the copy engine (TMA) fetch tiles, with zero fill past the edges, and a
  persistent grid of one program per SM walks the tiles, so that one tile's
  epilogue overlaps the next tile's loads.  It needs 16-bit inputs whose rows are
  16-byte aligned.  Large products whose rows are not (4095 x 4093, say) are
  staged: the operands are copied to rows padded to 16 bytes, the kernel writes a
  padded output, and that is copied back, for products large enough that this
  pays (:data:`STAGE_MIN_MACS`).  Everything else takes the pointer kernel.

Both visit tiles in grouped order (``GROUP_M`` rows of tiles at a time), keep
the accumulator in float32, and apply the bias and the activation in registers
before the single store: that fusion is what :func:`tilebook.linear_act` sells.

How close this comes to cuBLAS is measured, never stated: ``benchmarks/matmul.py``
times it against ``a @ b`` on the GPU it runs on (the record ``bench_matmul``), and
lesson 09 plots its own sweep.  A small product takes about as long on the GPU as a
Python call through the autotuner and Triton's JIT takes on the host, so after the
second call of a kind the compiled kernel is launched directly (host time against
GPU time: ``benchmarks/host_overhead.py``).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from .. import runtime
from .._launch import Memo, device_guard, ensure_cuda_context, launch, sm_count
from ..validation import check_same_dtype_device, check_tensor
from . import library
from .epilogue import ACTIVATIONS, epilogue
from .precision import autocasting, lower

try:  # host-side descriptors arrived in Triton 3.4; older versions use the pointer kernel
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - depends on the installed Triton
    TensorDescriptor = None

__all__ = [
    "ACTIVATIONS",
    "MatmulFunction",
    "compile_ahead",
    "compile_jobs",
    "epilogue",
    "fused_matmul",
    "fused_matmul_eager_op",
    "fused_matmul_op",
    "matmul",
    "matmul_kernel",
    "matmul_tma_kernel",
    "picked_configs",
    "prune_configs",
    "set_autotune",
    "smem_budget_for",
    "tile_coords",
    "traced_product",
]

MM_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_TMA_DTYPES = (torch.float16, torch.bfloat16)
_INT32_LIMIT = 2**31


# --------------------------------------------------------------------------- kernels


@triton.jit
def tile_coords(tile, num_m, num_n, GROUP_M: tl.constexpr):
    # Consecutive tiles walk down GROUP_M rows of tiles before moving right, so the
    # programs in flight at once share rows of A and columns of B in L2.
    per_group = GROUP_M * num_n
    first_m = (tile // per_group) * GROUP_M
    rows = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (tile % per_group) % rows
    pid_n = (tile % per_group) // rows
    return pid_m, pid_n


@triton.jit
def matmul_kernel(
    a_ptr,  # (M, K), any strides
    b_ptr,  # (K, N), any strides
    c_ptr,  # (M, N) output, any strides
    bias_ptr,  # (N,) contiguous, or anything when HAS_BIAS is False
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ACTIVATION: tl.constexpr,  # one of ACTIVATIONS
    EVEN_K: tl.constexpr,  # K % BLOCK_K == 0: no mask along K
    INT64: tl.constexpr,  # element offsets may pass 2**31 - 1
    F32_DOT: tl.constexpr = "tf32",  # float32 operands: "tf32", or "ieee" (allow_tf32 off)
):
    tl.static_assert(BLOCK_K >= 16, "tl.dot needs K tiles of at least 16")
    pid = tl.program_id(axis=0)
    pid_m, pid_n = tile_coords(pid, tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    if INT64:
        offs_m = offs_m.to(tl.int64)
        offs_n = offs_n.to(tl.int64)
    # Masks rather than clamped indices: a clamped index breaks the contiguity that
    # vectorised loads need when M or N is the unit-stride dimension.
    mask_m = offs_m[:, None] < M
    mask_n = offs_n[None, :] < N
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=mask_m, other=0.0)
            b = tl.load(b_ptrs, mask=mask_n, other=0.0)
        else:
            k_left = K - k * BLOCK_K
            a = tl.load(a_ptrs, mask=mask_m & (offs_k[None, :] < k_left), other=0.0)
            b = tl.load(b_ptrs, mask=mask_n & (offs_k[:, None] < k_left), other=0.0)
        acc = tl.dot(a, b, acc, input_precision=F32_DOT)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    acc = epilogue(acc, bias_ptr, offs_n, N, HAS_BIAS, ACTIVATION)
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask_m & mask_n)


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


def _cfg(bm, bn, bk, warps, stages, group_m=8, maxnreg=None, **extra) -> triton.Config:
    kw = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group_m, **extra}
    return triton.Config(kw, num_warps=warps, num_stages=stages, maxnreg=maxnreg)


def _set_tma_blocks(nargs) -> dict:
    """Autotune pre-hook: give the descriptors the block shapes of the config being run."""
    bm, bn, bk = nargs["BLOCK_M"], nargs["BLOCK_N"], nargs["BLOCK_K"]
    blocks = {
        "a_desc": [bk, bm] if nargs["A_T"] else [bm, bk],
        "b_desc": [bn, bk] if nargs["B_T"] else [bk, bn],
        "c_desc": [bm, bn // 2 if nargs["SPLIT_N"] else bn],
    }
    for name, shape in blocks.items():
        if name in nargs:
            nargs[name].block_shape = shape
    return blocks


def _tma_cfg(
    bm, bn, bk, warps, stages, split_n, flatten=True, ctas=1, maxnreg=None, group_m=8
) -> triton.Config:
    # Several programs share an SM only if they fit its 64K registers: maxnreg caps them.
    kw = {"SPLIT_N": split_n, "FLATTEN": flatten, "CTAS_PER_SM": ctas}
    cfg = _cfg(bm, bn, bk, warps, stages, group_m, maxnreg=maxnreg, **kw)
    cfg.pre_hook = _set_tma_blocks
    return cfg


# GPU configs, pruned to a handful so that autotuning stays short (see the sweep in
# benchmarks/matmul.py).  BLOCK_K stays >= 16 everywhere: tl.dot needs it.
GPU_PTR_CONFIGS = [
    _cfg(128, 256, 64, 8, 4),
    _cfg(128, 256, 64, 8, 3),
    _cfg(128, 128, 64, 8, 4),
    _cfg(128, 128, 64, 4, 4),
    _cfg(64, 128, 64, 4, 4),
    _cfg(128, 128, 32, 8, 3),  # the float32 fall-back: 16 KB per operand per stage
]
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
# The interpreter runs one config (autotuning would time nothing); small tiles keep the
# emulated programs cheap.
INTERPRETER_PTR_CONFIGS = [_cfg(32, 32, 32, 4, 1, group_m=4)]
INTERPRETER_TMA_CONFIGS = [_tma_cfg(32, 32, 32, 4, 1, split_n=True)]
if runtime.is_interpreter():
    PTR_CONFIGS, TMA_CONFIGS = INTERPRETER_PTR_CONFIGS, INTERPRETER_TMA_CONFIGS
else:
    PTR_CONFIGS, TMA_CONFIGS = GPU_PTR_CONFIGS, GPU_TMA_CONFIGS

_SMEM_BUDGET = 220 * 1024  # H100: 227 KB per block, minus room for barriers and layouts
_SMEM_RESERVE = 7 * 1024  # what the budget leaves of a block's shared memory


def smem_budget_for(arch: int) -> int:
    """Bytes of operand tiles a configuration may pipeline on ``sm_<arch>``: the most
    shared memory a block may use there (:data:`tilebook.course.aot.TARGETS`) less a reserve
    for barriers and the epilogue (220 KB for sm_90)."""
    from ..arch import TARGETS, parse_arch

    return TARGETS[parse_arch(arch)][1] - _SMEM_RESERVE


def _device_budget(device: torch.device) -> int:
    """:func:`smem_budget_for` the GPU of ``device`` (the code paths' capability:
    ``TILEBOOK_ARCH`` lowers it); the interpreter keeps sm_90's."""
    if device.type != "cuda":
        return _SMEM_BUDGET
    return _budget_of(device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def _budget_of(index: int) -> int:
    from ..arch import TARGETS

    major, minor = runtime.capability(index)
    if major * 10 + minor in TARGETS:
        return smem_budget_for(major * 10 + minor)
    optin = torch.cuda.get_device_properties(index).shared_memory_per_block_optin
    return optin - _SMEM_RESERVE


def _fits(cfg: triton.Config, elem: int, budget: int = _SMEM_BUDGET) -> bool:
    kw = cfg.kwargs
    per_stage = (kw["BLOCK_M"] + kw["BLOCK_N"]) * kw["BLOCK_K"] * elem
    return per_stage * max(cfg.num_stages, 1) <= budget


# Below this many multiply-adds a product takes microseconds: timing every config
# would cost more than it could save, so small problems take one 128x128 config.
_SMALL_MNK = 1024**3


_AUTOTUNE = {"on": True}


def set_autotune(enabled: bool) -> bool:
    """Time every configuration that fits (``True``, the default) or take the first one.

    With autotuning off, the first call of each kind launches the first
    configuration of :data:`GPU_TMA_CONFIGS` or :data:`GPU_PTR_CONFIGS` that
    :func:`prune_configs` keeps, without compiling and timing the others: what a
    build with a time budget wants (the lessons), at the price of the autotuner's
    pick.  Calls already made keep what they picked.  Returns the previous setting.
    """
    if not isinstance(enabled, bool):
        raise TypeError(f"set_autotune takes True or False, got {enabled!r}")
    previous, _AUTOTUNE["on"] = _AUTOTUNE["on"], enabled
    return previous


def prune_configs(configs, M: int, N: int, K: int, elem: int, *, budget: int | None = None) -> list:
    """The configurations the autotuner tries for an ``M x N x K`` product of
    ``elem``-byte elements: those whose pipeline fits in ``budget`` bytes of shared
    memory (default: sm_90's; launches pass their GPU's, :func:`smem_budget_for`),
    and only the first of them for a small problem (or with :func:`set_autotune` off)."""
    # float32 doubles every tile: drop the configs that would not fit in shared memory.
    budget = _SMEM_BUDGET if budget is None else budget
    kept = [c for c in configs if _fits(c, elem, budget)] or configs[-1:]
    if M * N * K <= _SMALL_MNK:
        small = [c for c in kept if c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"] <= 128 * 128]
        kept = (small or kept)[:1]
    return kept if _AUTOTUNE["on"] else kept[:1]


def _prune_ptr(configs, named_args, **kwargs):
    a = named_args["a_ptr"]
    M, N, K = named_args["M"], named_args["N"], named_args["K"]
    return prune_configs(configs, M, N, K, a.element_size(), budget=_device_budget(a.device))


def _prune_tma(configs, named_args, **kwargs):
    M, N, K = named_args["M"], named_args["N"], named_args["K"]
    return prune_configs(configs, M, N, K, 2, budget=_device_budget(named_args["bias_ptr"].device))


def _even_k(args) -> bool:
    # bool(): under torch.compile with dynamic shapes K is symbolic, and a constexpr
    # must be a plain bool (this guards the graph on K's divisibility instead).
    return bool(args["K"] % args["BLOCK_K"] == 0)


_ptr_kernel = triton.autotune(
    configs=PTR_CONFIGS,
    key=["M", "N", "K", "HAS_BIAS", "ACTIVATION", "F32_DOT"],
    prune_configs_by={"early_config_prune": _prune_ptr},
)(triton.heuristics({"EVEN_K": _even_k})(matmul_kernel))

_tma_kernel = triton.autotune(
    configs=TMA_CONFIGS,
    key=["M", "N", "K", "A_T", "B_T", "HAS_BIAS", "ACTIVATION"],
    prune_configs_by={"early_config_prune": _prune_tma},
)(matmul_tma_kernel)


# --------------------------------------------------------------------------- launchers
#
# A 2048-cubed product takes about 29 us on an H100, about what Python spends on one
# call: every microsecond on the host shows in a call-by-call timing.  So the first
# call of a kind autotunes, the second launches the pick through Triton's JIT and
# keeps what it compiled, and every later call only allocates the output, builds the
# arguments and hands them to the compiled kernel's launcher (see _Runner).  On the
# H100's host: 35 us a launch through matmul_tma_kernel[grid](...), 18.5 directly.


def _grid_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 4  # the interpreter: a few programs, so each one walks several tiles
    return sm_count(device)


def _tma_layout(t: torch.Tensor) -> bool | None:
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


def _tma_target(arch: int) -> bool:
    """Whether the package launches :func:`matmul_tma_kernel` on ``sm_<arch>``: Hopper
    (TMA and wgmma), with a Triton that has host-side descriptors."""
    return TensorDescriptor is not None and arch // 10 == 9


@functools.cache
def _tma_supported_on(kind: str, index: int | None) -> bool:
    if TensorDescriptor is None:
        return False
    if kind != "cuda":
        return runtime.is_interpreter()
    major, minor = runtime.capability(index)
    return _tma_target(major * 10 + minor)


def _tma_supported(device: torch.device) -> bool:
    return _tma_supported_on(device.type, device.index)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)  # triton.cdiv is a constexpr function now: slower on the host


# The autotuner's pick for each problem, as (config's launch kwargs, grid[, blocks]).
_PICKED: dict[tuple, tuple] = {}


def picked_configs() -> list[dict]:
    """What the autotuner picked for each kind of call so far, one dict per pick.

    Keys: ``kernel`` (``"tma"`` or ``"pointer"``), ``M``, ``N``, ``K``, ``dtype``,
    ``activation``, ``has_bias``, ``config`` (``"128x256x64 w8 s3"``: tile, warps,
    stages) and ``kwargs`` (every constant and launch option of the pick).
    """
    out = []
    for key, (kw, *_) in _PICKED.items():
        kind, M, N, K, dtype, *_, has_bias, act = key
        tile = f"{kw['BLOCK_M']}x{kw['BLOCK_N']}x{kw['BLOCK_K']}"
        out.append(
            {
                "kernel": kind,
                "M": M,
                "N": N,
                "K": K,
                "dtype": str(dtype).removeprefix("torch."),
                "activation": act,
                "has_bias": has_bias,
                "config": f"{tile} w{kw['num_warps']} s{kw['num_stages']}",
                "kwargs": dict(kw),
            }
        )
    return out


_PLACEHOLDER = ([16, 16], [16, 16], [16, 16])  # the autotuner's pre-hook sets real blocks


def _first_launch(jit_fn, grid0, args, kw):
    """Launch once through :func:`tilebook._launch.launch` and return ``go(args) -> bool``
    that launches again for arguments like these (the compiled kernel's own launcher
    on a GPU; the JIT under the interpreter).  ``kw``: the constexprs and options."""
    launched = launch(jit_fn, (grid0,), *args, **kw)
    if launched is not None:
        return launched

    def jit_launch(*args) -> bool:
        jit_fn[(grid0,)](*args, **kw)
        return True

    return jit_launch


def _tma_args(M, N, K, a_t, b_t, a_strides, b_strides, c_strides, blocks):
    """``args(a, b, c, bias)``: the TMA kernel's arguments for operands laid out like
    these, ``a`` and ``b`` being the tensors that hold A and B (or A^T, B^T) in memory:
    views of them (the same data pointer) give the same arguments."""
    a_blk, b_blk, c_blk = blocks
    (sa0, sa1), (sb0, sb1) = a_strides, b_strides
    a_shape, a_str = ([K, M], [sa1, sa0]) if a_t else ([M, K], [sa0, sa1])
    b_shape, b_str = ([N, K], [sb1, sb0]) if b_t else ([K, N], [sb0, sb1])
    c_shape, c_str = [M, N], list(c_strides)
    desc = TensorDescriptor

    def args(a, b, c, bias):
        return (
            desc(a, a_shape, a_str, a_blk),
            desc(b, b_shape, b_str, b_blk),
            desc(c, c_shape, c_str, c_blk),
            a if bias is None else bias,
            M,
            N,
            K,
        )

    return args


def _ptr_args(M, N, K, a_strides, b_strides):
    """``args(a, b, c, bias)``: the pointer kernel's runtime arguments (c row-major (M, N))."""
    rest = (M, N, K, *a_strides, *b_strides, N, 1)

    def args(a, b, c, bias):
        return (a, b, c, a if bias is None else bias, *rest)

    return args


class _Runner:
    """One launch, repeatable for new tensors of the same shapes, strides, dtypes,
    devices and alignments: ``run(a, b, c, bias)`` launches and returns True, or
    returns False (nothing launched) when the caller must take the full path."""

    __slots__ = ("args", "launch")

    def __init__(self, launch, args):
        self.launch, self.args = launch, args

    def __call__(self, a, b, c, bias) -> bool:
        if c.data_ptr() & 15:  # the output's alignment is part of the specialisation
            return False
        if c.is_cuda:
            ensure_cuda_context(c.device)
        return self.launch(*self.args(a, b, c, bias))


def _launch_tma(a, b, c, bias, activation):
    """Run the Hopper kernel if the operands allow it.  Returns None (not launched: use
    the pointer kernel), True (launched by the autotuner) or a :class:`_Runner`."""
    if c.is_cuda:
        ensure_cuda_context(c.device)
    a_t, b_t = _tma_layout(a), _tma_layout(b)
    if a_t is None or b_t is None or _tma_layout(c) is not False:
        return None
    M, K = a.shape
    N = b.shape[1]
    has_bias = bias is not None
    key = ("tma", M, N, K, a.dtype, a_t, b_t, has_bias, activation)
    picked = _PICKED.get(key)
    if picked is not None:
        kw, grid, blocks = picked
        args = _tma_args(M, N, K, a_t, b_t, a.stride(), b.stride(), c.stride(), blocks)
        return _Runner(_first_launch(matmul_tma_kernel, grid[0], args(a, b, c, bias), kw), args)
    a_src = a.t() if a_t else a
    b_src = b.t() if b_t else b
    blk = _PLACEHOLDER[0]
    args = (
        TensorDescriptor(a_src, list(a_src.shape), list(a_src.stride()), blk),
        TensorDescriptor(b_src, list(b_src.shape), list(b_src.stride()), blk),
        TensorDescriptor(c, [M, N], list(c.stride()), blk),
        bias if has_bias else c,
        M,
        N,
        K,
    )
    n_sm = _grid_sms(a.device)

    def grid(meta):
        tiles = _cdiv(M, meta["BLOCK_M"]) * _cdiv(N, meta["BLOCK_N"])
        return (min(n_sm * meta["CTAS_PER_SM"], tiles),)

    flags = {"A_T": a_t, "B_T": b_t, "HAS_BIAS": has_bias, "ACTIVATION": activation}
    _tma_kernel[grid](*args, **flags)
    kw = {**_tma_kernel.best_config.all_kwargs(), **flags}
    _PICKED[key] = (kw, grid(kw), tuple(_set_tma_blocks(kw).values()))
    return True


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


def _aligned(t: torch.Tensor) -> bool:
    """Whether the TMA kernel can read ``t`` in place (as it is or transposed)."""
    return _tma_layout(t) is not None


def _aligned_empty(t: torch.Tensor) -> torch.Tensor:
    """An uninitialised tensor of ``t``'s shape, dtype and device whose rows start 16-byte
    aligned."""
    rows, cols = t.shape
    pad = -cols % (16 // t.element_size())
    return t.new_empty((rows, cols + pad))[:, :cols]


def _aligned_copy(t: torch.Tensor) -> torch.Tensor:
    out = _aligned_empty(t)
    out.copy_(t)
    return out


class _Staged(_Runner):
    """A launch of the TMA kernel on aligned copies: ``copy_a``/``copy_b`` say which
    operands are copied, ``pad_c`` whether the output goes through a padded buffer."""

    __slots__ = ("copy_a", "copy_b", "inner", "pad_c")

    def __init__(self, inner, copy_a: bool, copy_b: bool, pad_c: bool):
        self.inner, self.copy_a, self.copy_b, self.pad_c = inner, copy_a, copy_b, pad_c

    def __call__(self, a, b, c, bias) -> bool:
        return _staged_run(self.inner, a, b, c, bias, self.copy_a, self.copy_b, self.pad_c)


def _staged_run(launch, a, b, c, bias, copy_a, copy_b, pad_c):
    a_s = _aligned_copy(a) if copy_a else a
    b_s = _aligned_copy(b) if copy_b else b
    c_s = _aligned_empty(c) if pad_c else c
    launched = launch(a_s, b_s, c_s, bias)
    if launched is None or launched is False:
        return launched
    if pad_c:
        c.copy_(c_s)
    return launched


def _launch_staged(a, b, c, bias, activation):
    """Run the TMA kernel on aligned copies of whichever of ``a``, ``b`` and ``c`` it
    cannot use in place.  Returns True (autotuned) or a :class:`_Staged` runner."""
    copy_a, copy_b, pad_c = not _aligned(a), not _aligned(b), _tma_layout(c) is not False
    first = lambda a, b, c, bias: _launch_tma(a, b, c, bias, activation)
    launched = _staged_run(first, a, b, c, bias, copy_a, copy_b, pad_c)
    if isinstance(launched, _Runner):
        return _Staged(launched, copy_a, copy_b, pad_c)
    return launched


def _max_offset(t: torch.Tensor) -> int:
    return sum((size - 1) * abs(stride) for size, stride in zip(t.shape, t.stride(), strict=True))


def _needs_int64(*tensors: torch.Tensor) -> bool:
    # A tile may hang 256 rows or columns past the edge before the mask applies.
    reach = max(_max_offset(t) + 256 * max(t.stride(), default=1) for t in tensors)
    # bool(): traced with symbolic shapes, the comparison is a SymBool, and a
    # constexpr must be a plain bool (Triton hashes it into the cache key).
    return bool(reach >= _INT32_LIMIT)


def _launch_ptr(a, b, c, bias, activation):
    """Run the pointer kernel; returns True (launched by the autotuner) or a :class:`_Runner`."""
    M, K = a.shape
    N = b.shape[1]
    has_bias, int64, f32 = bias is not None, _needs_int64(a, b, c), f32_dot(a.dtype)
    key = ("pointer", M, N, K, a.dtype, int64, f32, has_bias, activation)
    picked = _PICKED.get(key)
    if picked is not None:
        kw, grid = picked
        args = _ptr_args(M, N, K, a.stride(), b.stride())
        return _Runner(_first_launch(matmul_kernel, grid[0], args(a, b, c, bias), kw), args)
    args = (a, b, c, a if bias is None else bias, M, N, K, *a.stride(), *b.stride(), *c.stride())
    grid = lambda meta: (_cdiv(M, meta["BLOCK_M"]) * _cdiv(N, meta["BLOCK_N"]),)
    flags = {"HAS_BIAS": has_bias, "ACTIVATION": activation, "INT64": int64, "F32_DOT": f32}
    _ptr_kernel[grid](*args, **flags)
    kw = _ptr_kernel.best_config.all_kwargs()
    kw.update(flags)
    kw["EVEN_K"] = _even_k({**kw, "K": K})  # what the autotuned launch just used
    _PICKED[key] = (kw, grid(kw))
    return True


def compile_ahead(
    kernel: str,
    config: triton.Config,
    dtype: str = "bf16",
    *,
    a_t: bool = False,
    b_t: bool = False,
    activation: str = "none",
    has_bias: bool = False,
    arch: int = 90,
):
    """Compile ``"tma"`` (:func:`matmul_tma_kernel`) or ``"pointer"`` (:func:`matmul_kernel`)
    for ``sm_<arch>`` without a GPU, as a launch with ``config`` would; returns a
    :class:`tilebook.course.aot.CompiledKernel` (SASS, registers, spills).

    ``dtype`` is Triton's name ("bf16", "fp16", "fp32").  The pointer kernel is
    compiled for row-major operands whose sizes are multiples of 16, the common case.
    A config's ``maxnreg`` is not applied: the register count is the uncapped one.
    """
    from ..course.aot import compile_kernel

    job = _ahead_job(kernel, config, dtype, a_t, b_t, activation, has_bias, arch)
    # kernel, signature and constexprs by position, as compile_kernel's callers pass them
    return compile_kernel(job.pop("kernel"), job.pop("signature"), job.pop("constexprs"), **job)


def _ahead_job(kernel, config, dtype, a_t, b_t, activation, has_bias, arch) -> dict:
    """:func:`compile_ahead`'s compile job (for :func:`tilebook.course.aot.compile_many`)."""
    kw = config.kwargs
    bm, bn, bk = kw["BLOCK_M"], kw["BLOCK_N"], kw["BLOCK_K"]
    consts = {
        "BLOCK_M": bm,
        "BLOCK_N": bn,
        "BLOCK_K": bk,
        "GROUP_M": kw["GROUP_M"],
        "HAS_BIAS": has_bias,
        "ACTIVATION": activation,
    }
    ints = {"M": "i32", "N": "i32", "K": "i32"}
    if kernel == "tma":
        split = kw["SPLIT_N"]

        def desc(shape):
            return f"tensordesc<{dtype}[{shape[0]}, {shape[1]}]>"

        sig = {
            "a_desc": desc([bk, bm] if a_t else [bm, bk]),
            "b_desc": desc([bn, bk] if b_t else [bk, bn]),
            "c_desc": desc([bm, bn // 2 if split else bn]),
            "bias_ptr": f"*{dtype}",
            **ints,
        }
        consts.update(A_T=a_t, B_T=b_t, CTAS_PER_SM=kw["CTAS_PER_SM"], SPLIT_N=split)
        consts["FLATTEN"] = kw["FLATTEN"]
        spec, aligned = "tilebook.ops.matmul:matmul_tma_kernel", ["bias_ptr"]
    elif kernel == "pointer":
        ptrs = {n: f"*{dtype}" for n in ("a_ptr", "b_ptr", "c_ptr", "bias_ptr")}
        strides = {n: "i32" for n in ("stride_am", "stride_bk", "stride_cm")}
        sig = {**ptrs, **ints, **strides}
        # Unit strides are what a launch specialises to for row-major operands.
        consts.update(stride_ak=1, stride_bn=1, stride_cn=1, EVEN_K=True, INT64=False,
                      F32_DOT="tf32")  # fmt: skip
        spec, aligned = "tilebook.ops.matmul:matmul_kernel", list(sig)
    else:
        raise ValueError(f"compile_ahead: kernel must be 'tma' or 'pointer', got {kernel!r}")
    return {
        "kernel": spec,
        "signature": sig,
        "constexprs": consts,
        "arch": arch,
        "num_warps": config.num_warps,
        "num_stages": config.num_stages,
        "divisible_by_16": aligned,
    }


def compile_jobs(arch: int = 90, dtype: torch.dtype | None = None) -> dict[str, dict]:
    """The kernels a product launches on ``sm_<arch>``, as jobs of
    :func:`tilebook.course.aot.compile_many`, with the ``linear_act`` epilogue (bias and
    GELU): the pointer kernel in the first configuration that :func:`prune_configs`
    keeps for a large product there (what :func:`set_autotune` off launches), and on
    Hopper the TMA kernel likewise.  Below sm_90 there is no TMA job: the package
    never launches that kernel there."""
    from . import targets

    dt = dtype or targets.default_dtype(arch)
    name, elem = targets.dtype_name(dt), dt.itemsize
    big = 8192
    jobs = {}
    budget = smem_budget_for(arch)
    if dt in _TMA_DTYPES and _tma_target(arch):
        cfg = prune_configs(GPU_TMA_CONFIGS, big, big, big, elem, budget=budget)[0]
        jobs["matmul_tma_kernel bias+gelu"] = _ahead_job(
            "tma", cfg, name, False, True, "gelu", True, arch
        )
    cfg = prune_configs(GPU_PTR_CONFIGS, big, big, big, elem, budget=budget)[0]
    jobs["matmul_kernel bias+gelu"] = _ahead_job(
        "pointer", cfg, name, False, False, "gelu", True, arch
    )
    return jobs


# --------------------------------------------------------------------------- public API


_DEVICE_TYPE = runtime.device().type
_MM_DTYPE_SET = frozenset(MM_DTYPES)
_Tensor = torch.Tensor
_IMPLS = ("auto", "tma", "pointer")


def _is_operand(t: object, ndim: int = 2) -> bool:
    """check_tensor's conditions in one cheap expression: launch latency is host time."""
    return (
        isinstance(t, torch.Tensor)
        and t.layout is torch.strided
        and t.dtype in _MM_DTYPE_SET
        and t.device.type == _DEVICE_TYPE
        and t.dim() == ndim
    )


def _check_activation(activation: object, op: str) -> str:
    if not isinstance(activation, str) or activation not in ACTIVATIONS:
        raise ValueError(
            f"{op}: unknown activation {activation!r}; choose one of {', '.join(ACTIVATIONS)}"
        )
    return activation


_check_pair = check_same_dtype_device


# Calls seen before: a key holding everything the input checks read (types, shapes,
# dtypes, devices, the activation and impl) and everything Triton specialises on
# (strides, data pointers' 16-byte alignment) maps to (_Runner, output shape).  A call
# whose key is here passed every check before, with inputs indistinguishable to them.
_RUNNERS = Memo(4096)
_KEY_ERRORS = (AttributeError, TypeError, RuntimeError)  # RuntimeError: storage-less tensors


def _tensor_key(t: torch.Tensor) -> tuple:
    return (t.shape, t.stride(), t.dtype, t.device, t.data_ptr() & 15)


_F32 = torch.float32
_tf32_allowed = torch._C._get_cublas_allow_tf32  # torch.backends.cuda.matmul.allow_tf32


def f32_dot(dtype: torch.dtype) -> str:
    """How the pointer kernel multiplies ``dtype`` operands on the tensor cores: float32
    as TF32 only where ``torch.backends.cuda.matmul.allow_tf32`` allows it, as
    ``torch.matmul`` does (off by default); else in full float32 ("ieee")."""
    return "ieee" if dtype is _F32 and not _tf32_allowed() else "tf32"


def _call_key(tag: str, a, b, bias, activation, impl) -> tuple | None:
    """The key of a call in _RUNNERS, or None for arguments that cannot have one."""
    if not (isinstance(a, _Tensor) and isinstance(b, _Tensor)):
        return None
    if bias is not None and not isinstance(bias, _Tensor):
        return None
    try:
        key = (
            tag,
            a.shape,
            a.stride(),
            a.dtype,
            a.device,
            a.data_ptr() & 15,
            b.shape,
            b.stride(),
            b.dtype,
            b.device,
            b.data_ptr() & 15,
            None if bias is None else _tensor_key(bias),
            activation,
            impl,
            a.dtype is _F32 and _tf32_allowed(),
        )
    except _KEY_ERRORS:
        return None
    return key


def _run_cached(key: tuple | None, a, b, bias) -> torch.Tensor | None:
    """The result of a call seen before, launched directly; None: take the full path."""
    try:
        hit = _RUNNERS.get(key)
    except TypeError:  # an unhashable activation or impl: the checks will say what is wrong
        return None
    if hit is None:
        return None
    c = a.new_empty(hit[1])
    return c if hit[0](a, b, c, bias) else None


def _remember(key: tuple | None, runner, out_shape: tuple) -> None:
    if key is not None and isinstance(runner, _Runner):
        _RUNNERS.remember(key, (runner, out_shape))


def _run(a, b, bias, activation, impl, op) -> tuple[torch.Tensor, _Runner | bool | None]:
    """``act(a @ b + bias)`` for checked 2-D operands; ``impl`` is "auto", "tma" or "pointer".

    Returns the result and what launched it: a :class:`_Runner` that repeats the launch
    for new tensors like these, or True/None (autotuned, or nothing to launch)."""
    M, K = a.shape
    N = b.shape[1]
    c = a.new_empty((M, N))
    if M == 0 or N == 0:
        return c, None
    contiguous_bias = bias
    if bias is not None:
        contiguous_bias = bias.contiguous()
    want_tma = impl == "tma" or (impl == "auto" and runtime.is_gpu())
    tma_ok = want_tma and K > 0 and a.dtype in _TMA_DTYPES and _tma_supported(a.device)
    if impl == "tma" and not tma_ok:
        raise ValueError(
            f"{op}: impl='tma' needs 16-bit operands (float16 or bfloat16) and K > 0, on a "
            "Hopper GPU or under the interpreter"
        )
    with device_guard(a):  # the autotuner and the JIT launch on the current device
        launched = _launch_tma(a, b, c, contiguous_bias, activation) if tma_ok else None
        if launched is None and tma_ok and (impl == "tma" or M * N * K >= STAGE_MIN_MACS):
            launched = _launch_staged(a, b, c, contiguous_bias, activation)
        if launched is None:
            launched = _launch_ptr(a, b, c, contiguous_bias, activation)
    # A runner reads the bias it is given: one that needed a copy cannot be repeated.
    return c, (launched if contiguous_bias is bias else None)


# --------------------------------------------------------------------------- autograd


class MatmulFunction(torch.autograd.Function):
    """Autograd for ``a @ b + bias``: ``dA = dC @ B^T``, ``dB = A^T @ dC`` (the same
    kernels, reading the transposed views in place) and ``dbias = dC.sum(0)``
    (accumulated in float32).  An activation other than "none" goes through
    :class:`tilebook.ops.linear_act.LinearActFunction` instead."""

    @staticmethod
    def forward(ctx, a, b, bias, impl, op):
        c, _ = _run(a, b, bias, "none", impl, op)
        need_a, need_b = ctx.needs_input_grad[:2]
        ctx.save_for_backward(a if need_b else None, b if need_a else None)
        ctx.op = op
        return c

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dc):
        a, b = ctx.saved_tensors
        need_a, need_b, need_bias = ctx.needs_input_grad[:3]
        # "auto": dC's layout (an expanded ones tensor, say) is not the caller's choice.
        da = fused_matmul(dc, b.t(), op=ctx.op) if need_a else None
        db = fused_matmul(a.t(), dc, op=ctx.op) if need_b else None
        dbias = dc.sum(0, dtype=torch.float32).to(dc.dtype) if need_bias else None
        return da, db, dbias, None, None


_grad_enabled = torch.is_grad_enabled


def _wants_grad(*tensors) -> bool:
    return _grad_enabled() and any(getattr(t, "requires_grad", False) for t in tensors)


# --------------------------------------------------------------------------- torch.library
# Inside torch.compile the products are operators.  The pointer kernel is traced
# (Inductor sees it and autotunes it over the same pruned configurations); the
# Hopper kernel takes host-side tensor descriptors, which PyTorch's tracer cannot
# record, so where eager calls would take it the operator is opaque and runs the
# eager path (remembered launches included).  Their autograd is registered by
# tilebook.ops.linear_act, next to the kernel of the activation's derivative.


def _op_pointer(
    a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, activation: str
) -> torch.Tensor:
    """``activation(a @ b + bias)`` by the pointer kernel, for checked 2-D operands."""
    M, K = a.shape
    N = b.shape[1]
    c = a.new_empty((M, N))
    if M == 0 or N == 0:
        return c
    flags = {"HAS_BIAS": bias is not None, "ACTIVATION": activation, "INT64": _needs_int64(a, b, c),
             "F32_DOT": f32_dot(a.dtype)}  # fmt: skip
    bias = a if bias is None else bias.contiguous()
    args = (a, b, c, bias, M, N, K, *a.stride(), *b.stride(), *c.stride())
    grid = lambda meta: (_cdiv(M, meta["BLOCK_M"]) * _cdiv(N, meta["BLOCK_N"]),)
    library.launch(_ptr_kernel, grid, *args, **flags)
    return c


def _op_eager(
    a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, activation: str, impl: str
) -> torch.Tensor:
    """``activation(a @ b + bias)`` as an eager call with no autograd would compute it."""
    key = _call_key("matmul", a, b, bias, activation, impl)
    out = _run_cached(key, a, b, bias)
    if out is None:
        out, runner = _run(a, b, bias, activation, impl, "fused_matmul")
        _remember(key, runner, (a.shape[0], b.shape[1]))
    return out


def _op_eager_fake(a, b, bias, activation, impl):
    return a.new_empty((a.shape[0], b.shape[1]))


fused_matmul_op = library.define("fused_matmul", _op_pointer, kernels=(matmul_kernel,))
fused_matmul_eager_op = library.define_opaque("fused_matmul_eager", _op_eager, fake=_op_eager_fake)


def traced_product(a, b, bias, activation: str, impl: str) -> torch.Tensor:
    """The operator a traced ``fused_matmul(a, b, bias, activation, impl=impl)`` calls
    (checked operands): the pointer kernel's, unless an eager call could take the
    Hopper kernel, whose opaque operator then decides at run time as eager does."""
    if impl == "pointer" or (impl == "auto" and not _tma_possible(a.device, a.dtype)):
        return fused_matmul_op(a, b, bias, activation)
    return fused_matmul_eager_op(a, b, bias, activation, impl)


def _assume_constant_result(fn):
    """Mark ``fn`` as :func:`torch.compiler.assume_constant_result` does: Dynamo calls it
    while tracing and keeps its result as a constant, instead of tracing into it.

    The public decorator imports ``torch._dynamo`` first, about 2 s that every
    ``import tilebook`` paid, only to set this attribute, which Dynamo reads when it
    meets the function (``tests/test_import_cost.py`` checks the two stay alike).
    """
    fn._dynamo_marked_constant = True
    return fn


# Traced code must not step into _tma_supported_on (functools.cache, CUDA queries):
# the answer is fixed for a device and dtype, so the trace takes it as a constant.
@_assume_constant_result
def _tma_possible(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether an ``impl="auto"`` call on ``device`` with ``dtype`` may take the Hopper kernel."""
    return runtime.is_gpu() and dtype in _TMA_DTYPES and _tma_supported(device)


def _compiled(a, b, bias, activation, impl, op) -> torch.Tensor:
    """:func:`fused_matmul` inside torch.compile: the checks, then an operator."""
    _check_operands(a, b, bias, activation, impl, op)
    return traced_product(a, b, bias, activation, impl)


_compiling = torch.compiler.is_compiling


def fused_matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str = "none",
    *,
    impl: str = "auto",
    op: str = "fused_matmul",
) -> torch.Tensor:
    """Return ``activation(a @ b + bias)`` from one kernel: the engine behind
    :func:`matmul` and :func:`tilebook.linear_act`.

    Parameters
    ----------
    a, b
        2-D tensors ``(M, K)`` and ``(K, N)`` of one dtype (float16, bfloat16, or
        float32, which the tensor cores take as TF32: expect ~1e-3 relative error
        on a GPU).  Any strides; transposed views are read in place.
    bias
        Optional ``(N,)`` tensor of the same dtype, added to every row.
    activation
        One of :data:`ACTIVATIONS`; ``"gelu"`` is the erf form, ``"gelu_tanh"`` the
        tanh approximation, as in ``torch.nn.functional.gelu``.
    impl
        ``"auto"`` takes the TMA kernel on a Hopper GPU when the operands allow it,
        else the pointer kernel; ``"tma"`` or ``"pointer"`` forces one (lessons and
        tests compare them; ``"tma"`` also runs under the interpreter).
    op
        The name that error messages start with.

    Notes
    -----
    Differentiable with respect to ``a``, ``b`` and ``bias`` (:class:`MatmulFunction`,
    or for an activation :class:`tilebook.ops.linear_act.LinearActFunction`).
    Inside ``torch.compile`` the call is an operator (:func:`traced_product`).
    """
    if _compiling():
        return _compiled(a, b, bias, activation, impl, op)
    if _wants_grad(a, b, bias):
        _check_operands(a, b, bias, activation, impl, op)
        if activation == "none":
            return MatmulFunction.apply(a, b, bias, impl, op)
        from .linear_act import LinearActFunction  # it imports this module

        return LinearActFunction.apply(a, b.t(), bias, activation, impl)
    key = _call_key("matmul", a, b, bias, activation, impl)
    out = _run_cached(key, a, b, bias)
    if out is not None:
        return out
    _check_operands(a, b, bias, activation, impl, op)
    out, runner = _run(a, b, bias, activation, impl, op)
    _remember(key, runner, (a.shape[0], b.shape[1]))
    return out


def _check_operands(a, b, bias, activation, impl, op) -> None:
    """Every check of fused_matmul's arguments; raises TypeError or ValueError."""
    if not (_is_operand(a) and _is_operand(b)):  # the slow checks say what is wrong
        check_tensor(a, "a", op, dtypes=MM_DTYPES, ndim=2)
        check_tensor(b, "b", op, dtypes=MM_DTYPES, ndim=2)
    _check_pair(a, b, ("a", "b"), op)
    if a.shape[1] != b.shape[0]:
        raise ValueError(
            f"{op}: inner dimensions differ: a is {tuple(a.shape)} and b is {tuple(b.shape)} "
            f"(a.shape[1] must equal b.shape[0])"
        )
    if bias is not None:
        check_tensor(bias, "bias", op, dtypes=MM_DTYPES, ndim=1)
        _check_pair(a, bias, ("a", "bias"), op)
        if bias.shape[0] != b.shape[1]:
            raise ValueError(f"{op}: bias must have shape ({b.shape[1]},), got {tuple(bias.shape)}")
    _check_activation(activation, op)
    if impl not in _IMPLS:
        raise ValueError(f"{op}: impl must be 'auto', 'tma' or 'pointer', got {impl!r}")


_PLAIN = frozenset({torch.Tensor, torch.nn.Parameter})


def _batched(a, b) -> torch.Tensor | None:
    """``a @ b`` for operands that are not both 2-D, by 2-D products; None for two
    2-D tensors (of a tensor subclass: the 2-D path checks them)."""
    if not (isinstance(a, _Tensor) and isinstance(b, _Tensor)):
        check_tensor(a, "a", "matmul", dtypes=MM_DTYPES)
        check_tensor(b, "b", "matmul", dtypes=MM_DTYPES)
    if a.dim() == 2 and b.dim() == 2:
        return None
    if a.dim() == 0 or b.dim() == 0:
        raise ValueError(
            f"matmul: both operands need at least one dimension, got shapes "
            f"{tuple(a.shape)} and {tuple(b.shape)} (use * for a scalar)"
        )
    if a.dim() == 1:  # a row vector, removed from the result
        return matmul(a.unsqueeze(0), b).squeeze(-2)
    if b.dim() == 1:  # a column vector
        return matmul(a, b.unsqueeze(-1)).squeeze(-1)
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(
            f"matmul: inner dimensions differ: a is {tuple(a.shape)} and b is "
            f"{tuple(b.shape)} (a.shape[-1] must equal b.shape[-2])"
        )
    if b.dim() == 2:  # every matrix of a times one b: one product, rows stacked
        lead = a.shape[:-1]
        return matmul(a.reshape(-1, a.shape[-1]), b).reshape(*lead, b.shape[-1])
    try:
        batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    except RuntimeError:
        raise ValueError(
            f"matmul: the batch dimensions of a {tuple(a.shape)} and b {tuple(b.shape)} "
            "do not broadcast"
        ) from None
    a3 = a.expand(*batch, *a.shape[-2:]).reshape(-1, *a.shape[-2:])
    b3 = b.expand(*batch, *b.shape[-2:]).reshape(-1, *b.shape[-2:])
    out = torch.stack([matmul(x, y) for x, y in zip(a3.unbind(0), b3.unbind(0), strict=True)])
    return out.reshape(*batch, a.shape[-2], b.shape[-1])


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Return ``a @ b`` computed by Triton kernels, with ``torch.matmul``'s shapes.

    ``a`` is (..., M, K) and ``b`` is (..., K, N); leading dimensions broadcast, and a
    1-D operand is a vector (its dimension is added for the product and removed from
    the result), as in :func:`torch.matmul`.  A batch whose ``b`` is 2-D is one
    product of (batch x M, K) by (K, N); a batched ``b`` is a product per matrix.

    float16 and bfloat16 accumulate in float32 and return the input dtype.  float32
    follows ``torch.backends.cuda.matmul.allow_tf32`` as ``torch.matmul`` does: off
    (PyTorch's default), the products are in full float32; on, the tensor cores take
    the operands as TF32 (about 1e-3 relative error), much faster.  Any M, N, K and
    any strides (transposed views included).  On a Hopper GPU aligned 16-bit operands
    take the persistent TMA kernel, everything else the pointer kernel.  Under
    ``torch.autocast`` both operands are cast to the autocast dtype first, as
    ``torch.matmul``'s are (:mod:`tilebook.ops.precision`).

    Differentiable: ``dA = dC @ B^T`` and ``dB = A^T @ dC`` come from the same kernels
    (:class:`MatmulFunction`).  Inside ``torch.compile`` the call is an operator of
    ``torch.ops.tilebook`` (:func:`tilebook.ops.matmul.traced_product`).

    Examples
    --------
    >>> c = tilebook.matmul(a, b)   # doctest: +SKIP
    """
    if autocasting(a):  # as torch.matmul: both operands in the autocast dtype
        a, b = lower(a, b)
    if not (type(a) in _PLAIN and type(b) in _PLAIN and a.dim() == 2 and b.dim() == 2):
        batched = _batched(a, b)
        if batched is not None:
            return batched
    if _compiling():
        return _compiled(a, b, None, "none", "auto", "matmul")
    if _wants_grad(a, b):
        return fused_matmul(a, b, op="matmul")
    key = _call_key("matmul", a, b, None, "none", "auto")
    out = _run_cached(key, a, b, None)
    if out is not None:
        return out
    return fused_matmul(a, b, op="matmul")
