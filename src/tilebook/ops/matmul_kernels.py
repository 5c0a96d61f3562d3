"""The portable kernels of :func:`tilebook.matmul` and :func:`tilebook.linear_act`, and the
tuning rules that the Hopper kernel (:mod:`tilebook.ops.matmul_hopper`) shares.

* :func:`matmul_kernel` loads tiles through pointers with arbitrary strides and
  masks, so it takes any shape, any layout and float32 (in full float32, or as TF32
  where ``torch.backends.cuda.matmul.allow_tf32`` allows it).  One program owns one
  ``BLOCK_M x BLOCK_N`` tile of the output and visits tiles in grouped order
  (:func:`tile_coords`); the accumulator stays in float32, and the bias and the
  activation (:func:`tilebook.ops.epilogue.epilogue`) run on it in registers before
  the single store.
* :func:`act_grad_kernel` is the backward's element-wise step, ``dZ = dY * act'(Z)``.
* The configurations: a handful per kernel, pruned to what fits in the GPU's shared
  memory and to one for a small product (:func:`prune_configs`), timed by Triton's
  autotuner on a product's first call (or not: :func:`set_autotune`).

How close this comes to cuBLAS is measured, never stated: ``benchmarks/matmul.py``
times it against ``a @ b`` on the GPU it runs on (the record ``bench_matmul``), and
lesson 09 plots its own sweep.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from .. import runtime
from .epilogue import epilogue

__all__ = [
    "GPU_PTR_CONFIGS",
    "INTERPRETER_PTR_CONFIGS",
    "PTR_CONFIGS",
    "act_grad_kernel",
    "compile_ahead",
    "fits",
    "matmul_kernel",
    "prune_configs",
    "set_autotune",
    "smem_budget_for",
    "tile_coords",
]


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
def act_grad_kernel(
    dy_ptr,  # dY, contiguous
    t_ptr,  # Z (the pre-activation), or Y for "relu"; contiguous
    dz_ptr,  # dZ = dY * act'(Z), contiguous
    n_elements,
    ACTIVATION: tl.constexpr,  # "relu", "gelu", "gelu_tanh" or "silu"
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(axis=0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_elements
    dy = tl.load(dy_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    z = tl.load(t_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if ACTIVATION == "relu":
        dz = tl.where(z > 0.0, dy, 0.0)
    elif ACTIVATION == "gelu":
        # d/dz z * Phi(z) = Phi(z) + z * phi(z)
        cdf = 0.5 * (1.0 + tl.math.erf(z * 0.7071067811865476))
        pdf = 0.3989422804014327 * tl.exp(-0.5 * z * z)
        dz = dy * (cdf + z * pdf)
    elif ACTIVATION == "gelu_tanh":
        # 0.5 z (1 + tanh(u)) == z * s with s = sigmoid(2u), u = c (z + a z^3):
        # derivative s + z * 2 s (1 - s) * c (1 + 3 a z^2).  No tanh (libdevice).
        z2 = z * z
        s = tl.sigmoid(1.5957691216057308 * (z + 0.044715 * z2 * z))
        dz = dy * (s + 1.5957691216057308 * z * s * (1.0 - s) * (1.0 + 0.134145 * z2))
    else:  # "silu": d/dz z * sigmoid(z) = s (1 + z (1 - s))
        s = tl.sigmoid(z)
        dz = dy * (s * (1.0 + z * (1.0 - s)))
    tl.store(dz_ptr + offs, dz.to(dz_ptr.dtype.element_ty), mask=mask)


ACT_GRAD_BLOCK = 1024


# --------------------------------------------------------------------------- configs


def _cfg(bm, bn, bk, warps, stages, group_m=8, maxnreg=None, **extra) -> triton.Config:
    kw = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group_m, **extra}
    return triton.Config(kw, num_warps=warps, num_stages=stages, maxnreg=maxnreg)


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
# The interpreter runs one config (autotuning would time nothing); small tiles keep the
# emulated programs cheap.
INTERPRETER_PTR_CONFIGS = [_cfg(32, 32, 32, 4, 1, group_m=4)]
PTR_CONFIGS = INTERPRETER_PTR_CONFIGS if runtime.is_interpreter() else GPU_PTR_CONFIGS

SMEM_BUDGET = 220 * 1024  # H100: 227 KB per block, minus room for barriers and layouts
_SMEM_RESERVE = 7 * 1024  # what the budget leaves of a block's shared memory


def smem_budget_for(arch: int) -> int:
    """Bytes of operand tiles a configuration may pipeline on ``sm_<arch>``: the most
    shared memory a block may use there (:data:`tilebook.arch.TARGETS`) less a reserve
    for barriers and the epilogue (220 KB for sm_90)."""
    from ..arch import TARGETS, parse_arch

    return TARGETS[parse_arch(arch)][1] - _SMEM_RESERVE


def device_budget(device: torch.device) -> int:
    """:func:`smem_budget_for` the GPU of ``device`` (the code paths' capability:
    ``TILEBOOK_ARCH`` lowers it); the interpreter keeps sm_90's."""
    if device.type != "cuda":
        return SMEM_BUDGET
    return _budget_of(device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def _budget_of(index: int) -> int:
    from ..arch import TARGETS

    major, minor = runtime.capability(index)
    if major * 10 + minor in TARGETS:
        return smem_budget_for(major * 10 + minor)
    optin = torch.cuda.get_device_properties(index).shared_memory_per_block_optin
    return optin - _SMEM_RESERVE


def fits(cfg: triton.Config, elem: int, budget: int = SMEM_BUDGET) -> bool:
    """Whether ``cfg``'s pipeline of ``elem``-byte operand tiles fits in ``budget`` bytes."""
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
    configuration of ``GPU_TMA_CONFIGS`` or :data:`GPU_PTR_CONFIGS` that
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
    budget = SMEM_BUDGET if budget is None else budget
    kept = [c for c in configs if fits(c, elem, budget)] or configs[-1:]
    if M * N * K <= _SMALL_MNK:
        small = [c for c in kept if c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"] <= 128 * 128]
        kept = (small or kept)[:1]
    return kept if _AUTOTUNE["on"] else kept[:1]


def _prune_ptr(configs, named_args, **kwargs):
    a = named_args["a_ptr"]
    M, N, K = named_args["M"], named_args["N"], named_args["K"]
    return prune_configs(configs, M, N, K, a.element_size(), budget=device_budget(a.device))


def even_k(args) -> bool:
    # bool(): under torch.compile with dynamic shapes K is symbolic, and a constexpr
    # must be a plain bool (this guards the graph on K's divisibility instead).
    return bool(args["K"] % args["BLOCK_K"] == 0)


#: :func:`matmul_kernel` as the autotuner runs it on a product's first call (later
#: calls launch its pick: :mod:`tilebook.ops.matmul`).
ptr_autotuned = triton.autotune(
    configs=PTR_CONFIGS,
    key=["M", "N", "K", "HAS_BIAS", "ACTIVATION", "F32_DOT"],
    prune_configs_by={"early_config_prune": _prune_ptr},
)(triton.heuristics({"EVEN_K": even_k})(matmul_kernel))


# --------------------------------------------------------------------------- launching

_INT32_LIMIT = 2**31


def cdiv(a: int, b: int) -> int:
    return -(-a // b)  # triton.cdiv is a constexpr function now: slower on the host


def _max_offset(t: torch.Tensor) -> int:
    return sum((size - 1) * abs(stride) for size, stride in zip(t.shape, t.stride(), strict=True))


def needs_int64(a: torch.Tensor, b: torch.Tensor, M: int, N: int) -> bool:
    """Whether :func:`matmul_kernel`'s element offsets into ``a``, ``b`` or a contiguous
    ``(M, N)`` output may pass int32."""
    # A tile may hang 256 rows or columns past the edge before the mask applies.
    reach = max(_max_offset(t) + 256 * max(t.stride(), default=1) for t in (a, b))
    reach = max(reach, M * N - 1 + 256 * max(N, 1))
    # bool(): traced with symbolic shapes, the comparison is a SymBool, and a
    # constexpr must be a plain bool (Triton hashes it into the cache key).
    return bool(reach >= _INT32_LIMIT)


def ptr_args(M, N, K, a_strides, b_strides, c_strides):
    """``args(a, b, c, bias)``: :func:`matmul_kernel`'s runtime arguments for operands
    with these strides (any tensor with the operand's data pointer will do)."""
    rest = (M, N, K, *a_strides, *b_strides, *c_strides)

    def args(a, b, c, bias):
        return (a, b, c, a if bias is None else bias, *rest)

    return args


def ptr_grid(M: int, N: int):
    return lambda meta: (cdiv(M, meta["BLOCK_M"]) * cdiv(N, meta["BLOCK_N"]),)


def tune(a, b, c, bias, flags: dict) -> tuple:
    """Launch :data:`ptr_autotuned` on 2-D operands (``flags``: ``HAS_BIAS``,
    ``ACTIVATION``, ``INT64``, ``F32_DOT``); returns what it picked, as ``(kernel, grid,
    constexprs and options, args)`` with ``args(a, b, c, bias)`` building the runtime
    arguments for tensors laid out like these."""
    M, K = a.shape
    N = b.shape[1]
    args, grid = ptr_args(M, N, K, a.stride(), b.stride(), c.stride()), ptr_grid(M, N)
    ptr_autotuned[grid](*args(a, b, c, bias), **flags)
    kw = {**ptr_autotuned.best_config.all_kwargs(), **flags}
    kw["EVEN_K"] = even_k({**kw, "K": K})  # what the autotuned launch just used
    return matmul_kernel, grid(kw), kw, args


# --------------------------------------------------------------------------- ahead of time


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
    """Compile ``"tma"`` (:func:`tilebook.ops.matmul_hopper.matmul_tma_kernel`) or
    ``"pointer"`` (:func:`matmul_kernel`) for ``sm_<arch>`` without a GPU, as a launch
    with ``config`` would; returns a :class:`tilebook.course.aot.CompiledKernel` (SASS,
    registers, spills).

    ``dtype`` is Triton's name ("bf16", "fp16", "fp32").  The pointer kernel is
    compiled for row-major operands whose sizes are multiples of 16, the common case.
    A config's ``maxnreg`` is not applied: the register count is the uncapped one.
    """
    from ..course.aot import compile_kernel

    job = ahead_job(kernel, config, dtype, a_t, b_t, activation, has_bias, arch)
    # kernel, signature and constexprs by position, as compile_kernel's callers pass them
    return compile_kernel(job.pop("kernel"), job.pop("signature"), job.pop("constexprs"), **job)


def ahead_job(kernel, config, dtype, a_t, b_t, activation, has_bias, arch) -> dict:
    """:func:`compile_ahead`'s compile job (for :func:`tilebook.course.aot.compile_many`)."""
    kw = config.kwargs
    bm, bn, bk = kw["BLOCK_M"], kw["BLOCK_N"], kw["BLOCK_K"]
    consts = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": kw["GROUP_M"],
              "HAS_BIAS": has_bias, "ACTIVATION": activation}  # fmt: skip
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
        consts.update(A_T=a_t, B_T=b_t, CTAS_PER_SM=kw["CTAS_PER_SM"], SPLIT_N=split,
                      FLATTEN=kw["FLATTEN"])  # fmt: skip
        spec, aligned = "tilebook.ops.matmul_hopper:matmul_tma_kernel", ["bias_ptr"]
    elif kernel == "pointer":
        ptrs = {n: f"*{dtype}" for n in ("a_ptr", "b_ptr", "c_ptr", "bias_ptr")}
        strides = {n: "i32" for n in ("stride_am", "stride_bk", "stride_cm")}
        sig = {**ptrs, **ints, **strides}
        # Unit strides are what a launch specialises to for row-major operands.
        consts.update(stride_ak=1, stride_bn=1, stride_cn=1, EVEN_K=True, INT64=False,
                      F32_DOT="tf32")  # fmt: skip
        spec, aligned = "tilebook.ops.matmul_kernels:matmul_kernel", list(sig)
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
