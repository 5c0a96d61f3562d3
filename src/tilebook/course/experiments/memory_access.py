"""Memory access: strided kernels, the sector model of a warp's loads, and their measurements.

Lesson 04 (pointers, masks and strides) teaches these kernels and measures them;
each piece is defined once here:

* :func:`strided_copy_kernel` reads every ``stride``-th element of a vector and
  writes them contiguously; :func:`strides` times it over strides, the
  measurement of coalesced against uncoalesced reads;
* :func:`scale_2d_kernel` scales a 2-D tensor of any strides (a transposed or
  sliced view) into a contiguous output; :func:`views` times it on a
  contiguous, a transposed and a column-sliced view against ``torch.mul``;
* :func:`warp_access` counts the 32-byte sectors one warp's load touches (the
  model behind the lesson's coalescing widget) and :func:`predicted_ratio` what
  that predicts for :func:`strides`;
* :func:`specialization` says what Triton learns from a launch's arguments (which
  integers are 1, which are divisible by 16), in the form
  :func:`tilebook.course.aot.compile_kernel` takes, so that a lesson can compile exactly
  what a launch on a given view would run.

The model and the launchers run anywhere (the launchers under Triton's
interpreter on a CPU); :func:`strides` and :func:`views` time on a GPU only,
like every measurement of :mod:`tilebook.course.experiments`.  Both check what they
time first (bit for bit: a copy and a multiplication by two are exact).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl

from ... import runtime
from ...validation import check_same_device, check_tensor
from ..bench import compare

__all__ = [
    "BLOCK",
    "BLOCK_SIZE",
    "NUM_WARPS",
    "SECTOR_BYTES",
    "STRIDES",
    "STRIDE_N",
    "VIEWS",
    "VIEW_SHAPE",
    "WARP_SIZE",
    "WarpAccess",
    "predicted_ratio",
    "scale_2d",
    "scale_2d_args",
    "scale_2d_kernel",
    "specialization",
    "strided_copy",
    "strided_copy_kernel",
    "strides",
    "view_inputs",
    "views",
    "warp_access",
]

#: Bytes of one sector: the unit in which the memory system moves data to an SM.
SECTOR_BYTES = 32
#: Threads of a warp: the lanes whose addresses one load instruction serves.
WARP_SIZE = 32
#: Elements a program of :func:`strided_copy_kernel` copies, and its warps.
BLOCK_SIZE = 1024
NUM_WARPS = 4
#: The tile of :func:`scale_2d_kernel`, ``(BLOCK_M, BLOCK_N)``, on ``NUM_WARPS`` warps.
BLOCK = (64, 64)
#: Strides of the stride sweep, in elements.
STRIDES = (1, 2, 4, 8, 16, 32)
#: Elements each strided copy writes: 64 MiB of float32 written and at least as
#: much read, beyond the L2 cache of every GPU in the datasheet, so that the figures
#: measure HBM.
STRIDE_N = 2**24
#: Shape of the view sweep: three inputs and one output of 256 MiB (float32).
VIEW_SHAPE = (8192, 8192)
#: The views of :func:`views`, in order.
VIEWS = ("contiguous", "transposed", "column slice")

_INT32_MAX = 2**31 - 1
_COPY_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_SCALE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


# ----------------------------------------------------------------------------- kernels


@triton.jit
def strided_copy_kernel(x_ptr, out_ptr, n, stride, BLOCK_SIZE: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n
    x = tl.load(x_ptr + offsets * stride, mask=mask)
    tl.store(out_ptr + offsets, x, mask=mask)


@triton.jit
def scale_2d_kernel(
    x_ptr,
    out_ptr,
    M,
    N,
    stride_xm,
    stride_xn,
    stride_om,
    stride_on,
    alpha,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :] * stride_xn, mask=mask)
    out = out_ptr + rows[:, None] * stride_om + cols[None, :] * stride_on
    tl.store(out, x * alpha, mask=mask)


# ----------------------------------------------------------------------------- launchers


def _last_offset(t: torch.Tensor) -> int:
    return sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True))


def _check_offsets(op: str, *tensors: torch.Tensor) -> None:
    """These kernels compute offsets in 32 bits: refuse tensors that would overflow them."""
    for t in tensors:
        if any(s < 0 for s in t.stride()):
            raise ValueError(f"{op}: negative strides are not supported, got {t.stride()}")
        if _last_offset(t) > _INT32_MAX:
            raise ValueError(
                f"{op}: a tensor spans more than 2**31 - 1 elements of memory "
                f"(shape {tuple(t.shape)}, strides {t.stride()}): its offsets overflow int32"
            )


def strided_copy(
    x: torch.Tensor, out: torch.Tensor | None = None, *, block_size: int = BLOCK_SIZE
) -> torch.Tensor:
    """Copy the 1-D tensor ``x`` (any stride, e.g. ``base[::4]``) into contiguous ``out``.

    Launches :func:`strided_copy_kernel` with ``x.stride(0)`` as its stride and
    :data:`NUM_WARPS` warps; returns ``out`` (allocated when not given).
    """
    op = "strided_copy"
    check_tensor(x, "x", op, dtypes=_COPY_DTYPES, ndim=1)
    if out is None:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    check_tensor(out, "out", op, dtypes=(x.dtype,), ndim=1)
    check_same_device(op, x=x, out=out)
    if out.shape != x.shape or not out.is_contiguous():
        raise ValueError(f"{op}: out must be contiguous with x's shape {tuple(x.shape)}")
    if not isinstance(block_size, int) or block_size < 1 or block_size & (block_size - 1):
        raise ValueError(f"{op}: block_size must be a power of two, got {block_size!r}")
    _check_offsets(op, x)
    n = x.numel()
    if n:
        grid = (triton.cdiv(n, block_size),)
        strided_copy_kernel[grid](
            x, out, n, x.stride(0), BLOCK_SIZE=block_size, num_warps=NUM_WARPS
        )
    return out


def scale_2d(
    x: torch.Tensor,
    alpha: float,
    out: torch.Tensor | None = None,
    *,
    block: tuple[int, int] = BLOCK,
) -> torch.Tensor:
    """``alpha * x`` for a 2-D ``x`` of any strides, written into ``out`` (any strides).

    Launches :func:`scale_2d_kernel` on a grid of ``(BLOCK_M, BLOCK_N)`` tiles
    with :data:`NUM_WARPS` warps; ``out`` defaults to a new contiguous tensor.
    """
    op = "scale_2d"
    check_tensor(x, "x", op, dtypes=_SCALE_DTYPES, ndim=2)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        raise TypeError(f"{op}: alpha must be a Python number, got {type(alpha).__name__}")
    if out is None:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    check_tensor(out, "out", op, dtypes=(x.dtype,), ndim=2)
    check_same_device(op, x=x, out=out)
    if out.shape != x.shape:
        raise ValueError(f"{op}: out has shape {tuple(out.shape)}, x {tuple(x.shape)}")
    bm, bn = block
    for b in (bm, bn):
        if not isinstance(b, int) or b < 1 or b & (b - 1):
            raise ValueError(f"{op}: block sizes must be powers of two, got {block!r}")
    _check_offsets(op, x, out)
    m, n = x.shape
    if m and n:
        grid = (triton.cdiv(m, bm), triton.cdiv(n, bn))
        args = scale_2d_args(x, out, alpha)
        scale_2d_kernel[grid](**args, BLOCK_M=bm, BLOCK_N=bn, num_warps=NUM_WARPS)
    return out


def scale_2d_args(x: torch.Tensor, out: torch.Tensor, alpha: float) -> dict[str, Any]:
    """The runtime arguments :func:`scale_2d` passes to :func:`scale_2d_kernel`, by name.

    Feed them to :func:`specialization` to compile what a launch on ``x`` runs.
    """
    m, n = x.shape
    return {
        "x_ptr": x,
        "out_ptr": out,
        "M": m,
        "N": n,
        "stride_xm": x.stride(0),
        "stride_xn": x.stride(1),
        "stride_om": out.stride(0),
        "stride_on": out.stride(1),
        "alpha": float(alpha),
    }


def specialization(
    kernel_args: dict[str, Any],
    *,
    constexprs: dict[str, Any] | None = None,
    do_not_specialize: Sequence[str] = (),
) -> dict[str, Any]:
    """What Triton learns from one launch's arguments, as compile-job options.

    ``kernel_args`` maps each runtime argument to its value: tensors become
    pointers (``"*fp32"``), divisible by 16 when their address is; integers equal
    to 1 become compile-time constants, as Triton makes them, and other
    integers ``"i32"`` (divisible by 16 when they are); floats ``"fp32"``.
    Returns ``{"signature", "constexprs", "divisible_by_16"}`` for
    :func:`tilebook.course.aot.compile_kernel` or a job of
    :func:`tilebook.course.aot.compile_many`.  Meta tensors (``device="meta"``) stand in
    for large ones: their addresses count from zero.  Arguments named in
    ``do_not_specialize`` are compiled as Triton's ``@triton.jit(do_not_specialize=...)``
    compiles them: as plain ``"i32"``, with nothing known of their value.
    """
    unknown = set(do_not_specialize) - set(kernel_args)
    if unknown:
        raise ValueError(f"specialization(): do_not_specialize names unknown {sorted(unknown)}")
    signature: dict[str, str] = {}
    consts: dict[str, Any] = dict(constexprs or {})
    divisible: list[str] = []
    for name, value in kernel_args.items():
        if isinstance(value, torch.Tensor):
            dt = {
                torch.float16: "fp16",
                torch.bfloat16: "bf16",
                torch.float32: "fp32",
                torch.float64: "fp64",
            }.get(value.dtype)
            if dt is None:
                raise TypeError(f"specialization(): {name} has unsupported dtype {value.dtype}")
            signature[name] = f"*{dt}"
            if value.data_ptr() % 16 == 0:
                divisible.append(name)
        elif isinstance(value, bool):
            raise TypeError(f"specialization(): {name} is a bool; pass it in constexprs")
        elif isinstance(value, int):
            if name in do_not_specialize:
                signature[name] = "i32"
            elif value == 1:
                consts[name] = 1
            else:
                signature[name] = "i32"
                if value % 16 == 0:
                    divisible.append(name)
        elif isinstance(value, float):
            signature[name] = "fp32"
        else:
            raise TypeError(f"specialization(): {name}={value!r} is not a tensor or a number")
    return {"signature": signature, "constexprs": consts, "divisible_by_16": divisible}


# ----------------------------------------------------------------------------- the model


@dataclass(frozen=True)
class WarpAccess:
    """The sectors one warp's load touches; see :func:`warp_access`.

    ``sector_map`` has one character per sector from the first byte of the
    warp's tile to its last: ``.`` not fetched (``,`` when it lies past the end
    of the tensor), ``a`` to ``h`` fetched with one to eight eighths of it
    holding elements the program asked for, the same in capitals when the
    sector also holds reads past the end, ``x`` fetched only for reads past the
    end.
    """

    stride: int
    itemsize: int
    per_thread: int
    valid: int
    masked: bool
    elements: int
    loads: int
    load_bytes: int
    sectors: int
    useful_bytes: int
    past_end: int
    past_end_sectors: int
    sector_map: str

    @property
    def fetched_bytes(self) -> int:
        return self.sectors * SECTOR_BYTES

    @property
    def efficiency(self) -> float:
        """Useful bytes over bytes fetched (1.0: every fetched byte was asked for)."""
        return self.useful_bytes / self.fetched_bytes if self.sectors else 1.0

    def as_row(self) -> dict[str, Any]:
        """The fields and ``fetched_bytes`` and ``efficiency``, as a dict (a table row)."""
        row = {f: getattr(self, f) for f in self.__dataclass_fields__}
        return {**row, "fetched_bytes": self.fetched_bytes, "efficiency": self.efficiency}


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"warp_access(): {name} must be a positive int, got {value!r}")
    return value


def warp_access(
    stride: int,
    itemsize: int,
    per_thread: int = 1,
    *,
    valid: int | None = None,
    masked: bool = True,
) -> WarpAccess:
    """The 32-byte sectors one warp touches loading ``WARP_SIZE * per_thread`` elements.

    Element ``i`` of the warp's tile lies at byte ``i * stride * itemsize`` (the
    tile starts on a sector boundary); lane ``l`` owns elements ``l *
    per_thread`` to ``l * per_thread + per_thread - 1``, as in Triton's layout
    of a 1-D block.  The tensor ends after ``valid`` of them (default: all).
    With ``masked`` the lanes past the end are switched off and fetch nothing;
    without it they read past the end.  Sectors are counted once each, as
    the traffic that reaches the memory: a sector two instructions touch
    is fetched once and found in the cache the second time.

    ``loads`` and ``load_bytes`` are the load instructions each thread issues and
    their width: contiguous elements (``stride == 1``) are loaded up to 16 bytes
    at a time, strided ones one by one.
    """
    stride = _positive_int("stride", stride)
    itemsize = _positive_int("itemsize", itemsize)
    per_thread = _positive_int("per_thread", per_thread)
    if itemsize > SECTOR_BYTES or itemsize & (itemsize - 1):
        raise ValueError(f"warp_access(): itemsize must be 1, 2, 4, 8, 16 or 32, got {itemsize}")
    elements = WARP_SIZE * per_thread
    valid = elements if valid is None else valid
    if isinstance(valid, bool) or not isinstance(valid, int) or not 0 <= valid <= elements:
        raise ValueError(f"warp_access(): valid must be an int from 0 to {elements}, got {valid!r}")
    if stride == 1:
        load_bytes = min(per_thread * itemsize, 16)
        loads = per_thread * itemsize // load_bytes
    else:
        load_bytes, loads = itemsize, per_thread
    step = stride * itemsize
    span = ((elements - 1) * step + itemsize - 1) // SECTOR_BYTES + 1
    useful = [0] * span
    past = [0] * span
    for i in range(elements):
        if i >= valid and masked:
            continue
        start = i * step
        for sector in range(start // SECTOR_BYTES, (start + itemsize - 1) // SECTOR_BYTES + 1):
            lo = max(start, sector * SECTOR_BYTES)
            hi = min(start + itemsize, (sector + 1) * SECTOR_BYTES)
            (useful if i < valid else past)[sector] += hi - lo
    end = (valid - 1) * step + itemsize if valid else 0  # first byte past the tensor
    chars = []
    for k in range(span):
        if useful[k]:
            eighths = math.ceil(8 * useful[k] / SECTOR_BYTES)
            letter = chr(ord("a") + eighths - 1)
            chars.append(letter.upper() if past[k] else letter)
        elif past[k]:
            chars.append("x")
        else:
            chars.append("," if k * SECTOR_BYTES >= end else ".")
    fetched = [u or p for u, p in zip(useful, past, strict=True)]
    return WarpAccess(
        stride=stride,
        itemsize=itemsize,
        per_thread=per_thread,
        valid=valid,
        masked=masked,
        elements=elements,
        loads=loads,
        load_bytes=load_bytes,
        sectors=sum(1 for f in fetched if f),
        useful_bytes=min(valid, elements) * itemsize,
        past_end=0 if masked else elements - valid,
        past_end_sectors=sum(1 for u, p in zip(useful, past, strict=True) if p and not u),
        sector_map="".join(chars),
    )


def predicted_ratio(stride: int, itemsize: int) -> float:
    """The rate of :func:`strided_copy` at ``stride`` over its rate at stride 1, as
    the sector count predicts for a kernel bound by memory traffic.

    Each element costs ``itemsize / efficiency`` bytes read (whole sectors) and
    ``itemsize`` written, against ``2 * itemsize`` at stride 1.
    """
    eff = warp_access(stride, itemsize, 1).efficiency
    return 2.0 / (1.0 / eff + 1.0)


# ----------------------------------------------------------------------------- measurements


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _launch_copy(kernel, x: torch.Tensor, out: torch.Tensor):
    """The launch of a strided copy, without the launcher's checks (host time is timed too)."""
    n = x.numel()
    grid = (triton.cdiv(n, BLOCK_SIZE),)
    stride = x.stride(0)
    return lambda: kernel[grid](x, out, n, stride, BLOCK_SIZE=BLOCK_SIZE, num_warps=NUM_WARPS)


def strides(
    strides: Sequence[int] = STRIDES,
    n: int = STRIDE_N,
    *,
    dtype: torch.dtype = torch.float32,
    kernel: Any = strided_copy_kernel,
    **timing: Any,
) -> list[dict[str, Any]]:
    """A strided copy of ``n`` elements read at each stride, in interleaved rounds.

    ``kernel`` (default :func:`strided_copy_kernel`; a lesson passes its own
    copy of it, so that the measurement reuses the binaries its checks
    compiled) is launched as :func:`strided_copy` launches it.  All strides
    read views of one buffer of ``n * max(strides)`` elements and write one
    output; each is checked bit for bit before it is timed.  One row per
    stride: ``stride``, ``n``, ``dtype``, ``itemsize`` and the timing fields.
    GB/s count the bytes the copy needs, ``n`` elements read and ``n``
    written, whatever the stride: what the stride wastes shows as a lower
    rate.  ``timing`` goes to :func:`tilebook.course.bench.compare`.
    """
    strides = list(strides)
    if not strides or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in strides):
        raise ValueError(f"strides(): strides must be positive ints, got {strides!r}")
    dev = runtime.device()
    base = torch.randn(n * max(strides), device=dev).to(dtype)
    out = torch.empty(n, device=dev, dtype=dtype)
    _check_offsets("strides()", base)
    impls = {}
    for s in strides:
        x = base[::s][:n]
        fn = _launch_copy(kernel, x, out)
        out.fill_(float("nan"))
        fn()  # compiles happen here, never inside the timing
        if not torch.equal(out, x):
            raise AssertionError(f"the strided copy at stride {s} did not copy its input")
        impls[str(s)] = fn
    item = torch.empty((), dtype=dtype).element_size()
    timed = compare(impls, bytes_moved=2 * n * item, **timing)
    rows = []
    for s, r in zip(strides, timed, strict=True):
        r = dict(r)
        del r["impl"]
        rows.append({"stride": s, "n": n, "dtype": _dtype_name(dtype), "itemsize": item, **r})
    return rows


def view_inputs(
    m: int, n: int, *, dtype: torch.dtype = torch.float32, device: Any = None
) -> dict[str, torch.Tensor]:
    """The views of :data:`VIEWS`, each ``m x n``: a contiguous tensor, the
    transpose of a contiguous ``n x m`` one, and columns 1 to ``n`` of an
    ``m x (n + 1)`` one (its rows start one element past a 16-byte boundary)."""
    dev = runtime.device() if device is None else device
    return {
        "contiguous": torch.randn(m, n, device=dev, dtype=dtype),
        "transposed": torch.randn(n, m, device=dev, dtype=dtype).t(),
        "column slice": torch.randn(m, n + 1, device=dev, dtype=dtype)[:, 1:],
    }


def views(
    shape: tuple[int, int] = VIEW_SHAPE,
    *,
    alpha: float = 2.0,
    dtype: torch.dtype = torch.float32,
    kernel: Any = scale_2d_kernel,
    **timing: Any,
) -> list[dict[str, Any]]:
    """``kernel`` (default :func:`scale_2d_kernel`, launched as :func:`scale_2d`
    launches it) and ``torch.mul`` on each view of :func:`view_inputs`.

    Each is checked bit for bit first (``alpha`` is a power of two, so the
    product is exact), then everything is timed in the same interleaved
    rounds.  One row per (view, implementation): ``view``, ``impl``
    (``"kernel"`` or ``"torch.mul"``), ``m``, ``n``, ``dtype`` and the timing
    fields; GB/s count ``m * n`` elements read and as many written.
    """
    m, n = shape
    inputs = view_inputs(m, n, dtype=dtype)
    out = torch.empty(m, n, device=runtime.device(), dtype=dtype)
    _check_offsets("views()", *inputs.values())
    bm, bn = BLOCK
    grid = (triton.cdiv(m, bm), triton.cdiv(n, bn))
    impls = {}
    for name, x in inputs.items():
        args = scale_2d_args(x, out, alpha)
        fns = {
            "kernel": lambda args=args: kernel[grid](
                **args, BLOCK_M=bm, BLOCK_N=bn, num_warps=NUM_WARPS
            ),
            "torch.mul": lambda x=x: torch.mul(x, alpha, out=out),
        }
        for impl, fn in fns.items():
            out.fill_(float("nan"))
            fn()
            if not torch.equal(out, x * alpha):
                raise AssertionError(f"{impl} on the {name} view is wrong")
            impls[f"{name}|{impl}"] = fn
    item = torch.empty((), dtype=dtype).element_size()
    rows = []
    for r in compare(impls, bytes_moved=2 * m * n * item, **timing):
        view, impl = r.pop("impl").split("|")
        rows.append({"view": view, "impl": impl, "m": m, "n": n, "dtype": _dtype_name(dtype), **r})
    return rows


# ----------------------------------------------------------------------------- tables


def sector_table(sweep: Any) -> Any:
    """Lesson 04's table: the sector model of one warp's float32 load at each stride
    (sectors, bytes used, the predicted rate) beside the rate ``sweep`` (the record of
    :func:`strides`, or None) measured, both as a share of the rate at stride one."""
    from ..tables import table

    f32 = torch.float32.itemsize
    gbps = {r["stride"]: r["gbps"] for r in sweep.rows} if sweep else {}

    def measured(a: dict[str, Any]) -> str:
        s = a["stride"]
        return f"{gbps[s] / gbps[1]:.0%}" if s in gbps and 1 in gbps else "n/a"

    columns = {
        "stride": "stride",
        "sectors per warp": "sectors",
        "bytes used": lambda a: f"{a['useful_bytes']} of {a['fetched_bytes']}",
        "predicted": lambda a: f"{predicted_ratio(a['stride'], f32):.0%}",
        "measured": measured,
    }
    rows = [warp_access(s, f32).as_row() for s in STRIDES]
    return table(
        rows, columns, caption=sweep.caption() if sweep else "no GPU record of the sweep yet"
    )


def views_table(measured: Any) -> Any:
    """Lesson 04's table of :func:`views`' record: the kernel's GB/s on each view, as a
    share of the copy, beside ``torch.mul``'s and the verdict of the two (beyond the
    spread: ahead, behind, or a tie)."""
    from ..claims import speedup
    from ..tables import table

    def mul(r: dict[str, Any]) -> dict[str, Any]:
        return measured.one(view=r["view"], impl="torch.mul")

    def versus(r: dict[str, Any]) -> str:
        vs = speedup(r, mul(r))
        return "tie" if vs.tied else ("ahead" if vs.faster else "behind")

    copy = measured.provenance["copy_gbps"]
    columns = {
        "view": "view",
        "kernel GB/s": ("gbps", "{:,.0f}"),
        "of copy": lambda r: f"{r['gbps'] / copy:.0%}",
        "torch.mul GB/s": lambda r: f"{mul(r)['gbps']:,.0f}",
        "kernel vs torch.mul": versus,
    }
    return table(measured.select(impl="kernel"), columns, caption=measured.caption())
