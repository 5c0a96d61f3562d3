"""Dropout whose mask is never stored: forward and backward regenerate it from a seed.

``y = x * keep / (1 - p)``, where ``keep`` is 1 with probability ``1 - p``.  PyTorch's
dropout writes the mask (a byte per element) in the forward pass and reads it back
in the backward.  Here both passes compute it from ``(seed, element index)`` with
Triton's counter-based Philox generator (``tl.randint4x``, the generator behind
``tl.rand``): the forward reads ``x`` and writes ``y``, the backward reads ``dy`` and
writes ``dx``, and nothing else crosses memory.

Which element gets which random number (the mask's definition, independent of
dtype, launch configuration and GPU, and identical in Triton's interpreter):

* elements are numbered in row-major order of the tensor's shape (``i``);
* they come in groups of ``4 * SUB`` (:data:`SUB` = 1024); element ``i`` takes word
  ``(i % (4 * SUB)) // SUB`` of the four that Philox4x32-10 gives for the seed and
  the counter ``(i // (4 * SUB)) * SUB + i % SUB``.  One Philox call serves four
  elements ``SUB`` apart, so a program loads four contiguous runs of ``SUB``
  elements, each with full-width vector loads;
* the element is kept when that unsigned 32-bit word is at least
  ``round(p * 2**32)``: it is dropped with probability ``p`` to within ``2**-33``.

Philox is pure integer arithmetic: 10 rounds of two 32x32-bit multiplies and some
xors per four words.  :func:`philox4x32` takes each product as one 64-bit multiply
(high and low words from one instruction, where ``tl.randint4x`` spends two), the
same stream bit for bit; with the loads and stores left to the default cache
policy, the kernel comes within a few percent of a plain copy of the tensor
(``benchmarks/dropout.py`` measures both, and ``--tune`` the variants).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._launch import PLANS, Step, call_key, device_guard, launch
from ..validation import check_tensor
from . import library

__all__ = [
    "GROUP",
    "MAX_NUMEL",
    "SUB",
    "DropoutFunction",
    "compile_jobs",
    "dropout",
    "dropout_kernel",
    "launch_dropout",
    "philox4x32",
]

#: Elements that one Philox word-position covers in a group: part of the mask's
#: definition (changing it changes every mask), not a tuning knob.
SUB = 1024
#: Elements per group: four runs of SUB, one per Philox output word.
GROUP = 4 * SUB
#: Largest tensor: Philox counters are 32-bit, one per four elements.
MAX_NUMEL = 4 << 32


@triton.jit
def philox4x32(seed, c0):
    """Philox4x32-10 of the 64-bit ``seed`` (key) and the uint32 counters ``c0``
    (the other three counter words 0): the four words ``tl.randint4x(seed, c0)``
    returns, bit for bit.  Each 32x32-bit product is one 64-bit multiply, whose
    high and low halves the round needs, instead of ``umulhi`` plus a low multiply:
    fewer instructions per word (``benchmarks/dropout.py --tune`` times both)."""
    # tl.cast, not seed.to: torch.compile's Inductor may pass a constant seed as a
    # plain int (a constexpr), which has no .to (H100, torch 2.11, 2026-12-07).
    seed = tl.cast(seed, tl.uint64)
    k0 = (seed & 0xFFFFFFFF).to(tl.uint32)
    k1 = ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32)
    c1 = c0 * 0
    c2 = c1
    c3 = c1
    for _ in tl.static_range(10):
        pb = c2.to(tl.uint64) * 0xCD9E8D57
        pa = c0.to(tl.uint64) * 0xD2511F53
        c0 = (pb >> 32).to(tl.uint32) ^ c1 ^ k0
        c2 = (pa >> 32).to(tl.uint32) ^ c3 ^ k1
        c1 = pb.to(tl.uint32)
        c3 = pa.to(tl.uint32)
        k0 = k0 + 0x9E3779B9
        k1 = k1 + 0xBB67AE85
    return c0, c1, c2, c3


# seed and the threshold change from call to call: specialising on them (== 1,
# divisible by 16) would only compile more copies of the same kernel.
@triton.jit(do_not_specialize=["seed", "thr_bits"])
def dropout_kernel(
    x_ptr,  # (n,) contiguous
    y_ptr,  # (n,) contiguous
    n,
    seed,  # 0 <= seed < 2**63
    thr_bits,  # the 32-bit threshold round(p * 2**32), as an int32 bit pattern
    scale,  # 1 / (1 - p), or 0 when p == 1
    SUB: tl.constexpr,  # see the module docstring: part of the mask's definition
    GROUPS: tl.constexpr,  # groups of 4 * SUB elements per program
):
    pid = tl.program_id(0)
    lane = tl.arange(0, SUB)
    word = tl.arange(0, 4)[:, None]
    thr = tl.cast(thr_bits, tl.uint32, bitcast=True)  # tl.cast: see philox4x32
    for i in tl.static_range(GROUPS):
        group = (pid * GROUPS + i).to(tl.int64)
        # A group as one (4, SUB) tile: row q holds the elements that take word q.
        # One load, one select and one store per tile let the compiler give Philox
        # the layout of the 16-byte loads; four separate (SUB,) loads sharing the
        # Philox words made it move the masks through shared memory instead.
        offs = group * (4 * SUB) + word * SUB + lane[None, :]
        mask = offs < n
        # No cache hints: evict_first on the load and the store measured slower than
        # the default (H100, benchmarks/dropout.py --tune).
        x = tl.load(x_ptr + offs, mask=mask, other=0.0)
        # uint32 counters, part of the mask's definition (tl.randint4x's handling
        # of 64-bit offsets has changed across Triton versions).
        w0, w1, w2, w3 = philox4x32(seed, (group * SUB + lane).to(tl.uint32))
        w = tl.where(
            word == 0,
            w0[None, :],
            tl.where(word == 1, w1[None, :], tl.where(word == 2, w2[None, :], w3[None, :])),
        )
        y = tl.where(w >= thr, x.to(tl.float32) * scale, 0.0)
        tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def _threshold_bits(p: float) -> int:
    """round(p * 2**32), capped at 2**32 - 1, as the int32 with the same bits."""
    t = min(round(p * 2.0**32), 2**32 - 1)
    return t - 2**32 if t >= 2**31 else t


def _scale(p: float) -> float:
    # p == 1 drops everything; a scale of 0 also zeroes the 2**-32 chance of a keep.
    return 0.0 if p >= 1.0 else 1.0 / (1.0 - p)


def _config(x: torch.Tensor) -> tuple[int, int]:
    """(groups per program, num_warps).

    A (4, SUB) tile with 4 warps gives each thread 8 contiguous elements of a row:
    one 16-byte load of bf16 (two of fp32) and 8 Philox counters.  More warps than
    SUB / 256 would replicate a bf16 tile across threads, each computing the same
    Philox words.
    """
    return 1, 4


def launch_dropout(
    x: torch.Tensor,
    p: float,
    seed: int,
    out: torch.Tensor | None = None,
    *,
    groups: int | None = None,
    num_warps: int | None = None,
) -> torch.Tensor:
    """Apply the mask of ``(seed, p)`` to a contiguous ``x``, into ``out`` (new if None).

    No checks beyond contiguity: :func:`dropout` validates.  ``groups`` (groups of
    :data:`GROUP` elements per program) and ``num_warps`` override the defaults;
    the mask does not depend on them.
    """
    if not x.is_contiguous():
        raise ValueError("launch_dropout: x must be contiguous")
    y = torch.empty_like(x, memory_format=torch.contiguous_format) if out is None else out
    n = x.numel()
    if n == 0:
        return y
    grid, meta = _plan(x, groups, num_warps)
    with device_guard(x):
        launch(dropout_kernel, grid, x, y, n, seed, _threshold_bits(p), _scale(p), **meta)
    return y


def _plan(x, groups=None, num_warps=None) -> tuple[tuple[int], dict]:
    def_groups, def_warps = _config(x)
    groups = groups or def_groups
    meta = {"SUB": SUB, "GROUPS": groups, "num_warps": num_warps or def_warps}
    return (-(-x.numel() // (GROUP * groups)),), meta


# Host time.  Through autograd, the backward of a 16384 x 4096 bf16 dropout took
# 150 us against the bare kernel's 98 (H100): the Python around the launch (a
# Function's backward, Triton's launch key) outlasted do_bench's cache flush.  So a
# call of the default configuration is planned once per call key (_launch.PLANS: the
# layout of x and the seed's integer width; seed and threshold are not specialised
# on), and later ones with the same key only allocate the output and launch.


def _apply(x: torch.Tensor, p: float, seed: int) -> torch.Tensor:
    """:func:`launch_dropout` of a contiguous ``x`` with the default configuration."""
    key = call_key(x, None, None, _apply, seed < 2**31)
    step = PLANS.get(key)
    if step is None:
        step = PLANS.remember(key, Step(dropout_kernel, *_plan(x)))
    y = torch.empty_like(x)
    n = x.numel()
    if n:
        args = (x, y, n, seed, _threshold_bits(p), _scale(p))
        if y.data_ptr() & 15:  # fresh tensors are aligned, as at the plan's first launch
            step.anew(*args)
        else:
            step(*args) or step.anew(*args)
    return y


def _check_p(p: object) -> float:
    if isinstance(p, bool) or not isinstance(p, (float, int)):
        raise TypeError(f"dropout: p must be a float, got {type(p).__name__}")
    p = float(p)
    if not 0.0 <= p <= 1.0:  # also False for NaN
        raise ValueError(f"dropout: p must be a probability in [0, 1], got {p!r}")
    return p


def _check_seed(seed: object) -> int:
    if seed is None:
        # From torch's default generator, so that torch.manual_seed makes runs
        # repeatable (and each call without a seed draws a fresh mask).
        return int(torch.randint(0, 2**62, (), dtype=torch.int64).item())
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"dropout: seed must be an int or None, got {type(seed).__name__}")
    if not 0 <= seed < 2**63:
        raise ValueError(f"dropout: seed must be in [0, 2**63), got {seed}")
    return int(seed)


_grad_enabled = torch.is_grad_enabled


# --------------------------------------------------------------------------- torch.library
# Two operators.  With a seed, the kernel is traced (Inductor launches it).  Without
# one, eager dropout draws a seed from torch's generator on every call; a compiled
# graph cannot turn a drawn tensor into the kernel's integer argument without a
# data-dependent .item(), so there the seed is drawn in the graph as a CPU tensor
# (the same generator and draw as eager) and an opaque operator reads it at run time.


def _op_forward(x: torch.Tensor, p: float, seed: int) -> torch.Tensor:
    """The mask of ``(seed, p)`` applied to ``x`` (any strides: copied if needed)."""
    x = x.contiguous()
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    if x.numel():
        grid, meta = _plan(x)
        library.launch(dropout_kernel, grid, x, y, x.numel(), seed, _threshold_bits(p),
                       _scale(p), **meta)  # fmt: skip
    return y


def _op_drawn(x: torch.Tensor, p: float, seed: torch.Tensor) -> torch.Tensor:
    """:func:`_op_forward` with the seed held in a 0-d int64 tensor (read at run time)."""
    return _apply(x.contiguous(), p, int(seed))


def _op_drawn_fake(x: torch.Tensor, p: float, seed: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


dropout_op = library.define("dropout", _op_forward, kernels=(dropout_kernel,))
dropout_drawn_op = library.define_opaque("dropout_drawn", _op_drawn, fake=_op_drawn_fake)


def _traced(x: torch.Tensor, p: float, seed) -> torch.Tensor:
    """Inside torch.compile: the operator of an int ``seed``, or of one drawn in the graph
    (a 0-d tensor)."""
    if isinstance(seed, torch.Tensor):
        return dropout_drawn_op(x, p, seed)
    return dropout_op(x, p, seed)


_compiling = torch.compiler.is_compiling


class DropoutFunction(torch.autograd.Function):
    """Dropout with the mask regenerated from the seed in the backward pass: the kernel,
    or, inside ``torch.compile``, the operators (``seed`` an int or, drawn in the graph,
    a 0-d int64 tensor)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, p: float, seed) -> torch.Tensor:
        ctx.p, ctx.seed = p, seed
        if _compiling():
            return _traced(x, p, seed)
        return _apply(x.contiguous(), p, seed)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        # Dropout is linear: its gradient is the same mask and scale applied to dy.
        # Elements are numbered by position in the shape, so dy's strides (the
        # expanded ones of .sum().backward(), say) only cost a copy.
        if _compiling():
            return _traced(dy, ctx.p, ctx.seed), None, None
        return _apply(dy.contiguous(), ctx.p, ctx.seed), None, None


def _checked(x, p, seed, training) -> tuple[float, int | None, bool]:
    """The checks of :func:`dropout`'s arguments: ``(p, seed or None, whether x is
    returned as it is)``."""
    check_tensor(x, "x", "dropout")
    p = _check_p(p)
    if not isinstance(training, bool):
        raise TypeError(f"dropout: training must be a bool, got {type(training).__name__}")
    if seed is not None:
        seed = _check_seed(seed)
    if not training or p == 0.0:
        return p, seed, True
    if x.numel() > MAX_NUMEL:
        raise ValueError(
            f"dropout: x has {x.numel()} elements, but dropout supports at most {MAX_NUMEL}"
        )
    return p, seed, False


def compile_jobs(arch: int = 90, dtype: torch.dtype | None = None) -> dict[str, dict]:
    """:func:`dropout_kernel` as a job of :func:`tilebook.course.aot.compile_many` for
    ``sm_<arch>``, configured as :func:`launch_dropout` configures it (a 64-bit seed,
    as drawn ones are)."""
    from . import targets

    x = targets.meta_tensor(1 << 24, dtype=dtype or targets.default_dtype(arch))
    return targets.recorded(lambda: _op_forward(x, 0.1, 2**40 + 1), arch, "2^24")


def dropout(
    x: torch.Tensor, p: float = 0.5, *, seed: int | None = None, training: bool = True
) -> torch.Tensor:
    """Zero each element of ``x`` with probability ``p`` and scale the rest by ``1 / (1 - p)``.

    Like ``torch.nn.functional.dropout(x, p, training)``, but the mask is a function
    of ``seed`` and the element's position alone: the same seed and shape always
    give the same mask (on a GPU and in the interpreter alike), and the backward
    pass regenerates it instead of storing it.

    Parameters
    ----------
    x
        float16, bfloat16 or float32 tensor on tilebook's device, any shape and
        strides (a strided ``x`` is copied first; the result is contiguous).
    p
        Probability of dropping an element, in ``[0, 1]``.  ``p = 0`` returns ``x``
        itself; ``p = 1`` returns zeros.
    seed
        Integer in ``[0, 2**63)``, or None to draw one from torch's default
        generator (so that ``torch.manual_seed`` makes the result repeatable).
    training
        When False, dropout is the identity and ``x`` itself is returned.

    Notes
    -----
    Inside ``torch.compile`` the call is the operator ``torch.ops.tilebook.dropout``
    (with ``seed=``: Inductor sees the kernel) or ``torch.ops.tilebook.dropout_drawn``
    (without: the seed is drawn in the graph, from the same generator).

    Examples
    --------
    >>> y = tilebook.dropout(x, 0.1, seed=1234)   # doctest: +SKIP
    """
    p, seed, identity = _checked(x, p, seed, training)
    if identity:
        return x
    if _compiling():
        if seed is None:  # drawn in the graph, from torch's generator as eager draws it
            seed = torch.randint(0, 2**62, (), dtype=torch.int64)
        return DropoutFunction.apply(x, p, seed)
    if seed is None:
        seed = _check_seed(None)
    if x.requires_grad and _grad_enabled():
        return DropoutFunction.apply(x, p, seed)
    return _apply(x.contiguous(), p, seed)
