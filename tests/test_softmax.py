"""tilebook.ops.softmax against a float64 torch reference, forward and backward.

Under the interpreter every program is a Python call, so the sizes are small and
the online (chunked) kernels are reached by lowering the module's threshold.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

import tilebook
from tilebook.course.aot import compile_kernel
from tilebook.ops import softmax as sm

INF = float("inf")
# The interpreter computes -inf - -inf and 0 * inf with numpy, on purpose.
pytestmark = pytest.mark.filterwarnings("ignore:(invalid value|divide by zero):RuntimeWarning")
# (rtol, atol) of the output against float64; the atol covers fp16 subnormals.
TOL = {torch.float32: (1e-5, 1e-7), torch.float16: (2e-3, 1e-6), torch.bfloat16: (8e-3, 1e-6)}


@pytest.fixture
def online(monkeypatch):
    """Send rows longer than 32 elements through the online kernels, in chunks of 16."""
    monkeypatch.setattr(sm, "ONLINE_THRESHOLD", 32)
    monkeypatch.setattr(sm, "ONLINE_BLOCK", 16)


def _ref(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    return torch.softmax(x.double(), dim=dim)


def _assert_matches(y: torch.Tensor, x: torch.Tensor, dim: int = -1) -> None:
    assert y.shape == x.shape
    assert y.dtype == x.dtype
    rtol, atol = TOL[x.dtype]
    torch.testing.assert_close(y.double(), _ref(x, dim), rtol=rtol, atol=atol, equal_nan=True)


def _check_grad(x: torch.Tensor, dim: int = -1) -> None:
    """Gradient through tilebook vs float64 autograd of torch.softmax on the upcast input."""
    x = x.detach().requires_grad_()
    y = sm.softmax(x, dim)
    dy = torch.randn(y.shape, device=x.device, dtype=x.dtype)
    y.backward(dy)
    x64 = x.detach().double().requires_grad_()
    torch.softmax(x64, dim).backward(dy.double())
    assert x.grad.dtype == x.dtype
    # dx = y * (dy - sum(dy * y)) inherits y's rounding in the storage dtype.
    rtol, _ = TOL[x.dtype]
    atol = rtol * max(float(x64.grad.abs().max()), 1e-3)
    torch.testing.assert_close(x.grad.double(), x64.grad, rtol=rtol, atol=atol, equal_nan=True)


SHAPES = [(5, 1), (4, 3), (6, 17), (3, 1000), (2, 3, 40), (33, 64)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_forward_and_backward(shape, dtype, device):
    x = torch.randn(shape, device=device) * 3
    _assert_matches(sm.softmax(x.to(dtype)), x.to(dtype))
    _check_grad(x.to(dtype))


@pytest.mark.usefixtures("online")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("n", [33, 48, 100])
def test_online_path(n, dtype, device):
    assert sm.pick_config(n).online
    assert sm.pick_config(n, backward=True).online
    x = (torch.randn(4, n, device=device) * 5).to(dtype)
    # A maximum in a late chunk forces the running sum to be rescaled.
    x[1, -1] = 30
    _assert_matches(sm.softmax(x), x)
    _check_grad(x)


def _with_infs(n: int, device) -> torch.Tensor:
    x = torch.randn(5, n, device=device)
    x[0] = -INF  # the whole row: NaN, as torch gives
    x[1, ::3] = -INF  # scattered
    x[2, : n - 1] = -INF  # all but the last entry: probability 1 at the end
    x[3, 1:] = -INF  # all but the first
    return x


@pytest.mark.parametrize("path", ["single", "online"])
def test_minus_inf(path, device, request):
    if path == "online":
        request.getfixturevalue("online")
    for n in (7, 40, 100):
        x = _with_infs(n, device)
        y = sm.softmax(x)
        torch.testing.assert_close(y, torch.softmax(x, -1), equal_nan=True)
        assert torch.isnan(y[0]).all()
        assert not torch.isnan(y[1:]).any()
        _check_grad(x[1:])


@pytest.mark.parametrize("dim", [0, 1, -2, 2])
def test_other_dims(dim, device):
    x = torch.randn(6, 5, 7, device=device)
    _assert_matches(sm.softmax(x, dim=dim), x, dim)
    _check_grad(x, dim)


def test_non_contiguous(device):
    base = torch.randn(20, 48, device=device)
    views = {
        "transposed": base.t(),
        "strided": base[:, ::3],
        "row-sliced": base[3:, 5:40],  # unit stride along the row, rows 48 apart
        "expanded": base[:1].expand(6, 48),  # rows 0 apart
        "permuted": base.view(4, 5, 48).permute(2, 0, 1),
    }
    for name, x in views.items():
        assert not x.is_contiguous(), name
        _assert_matches(sm.softmax(x), x)
        _check_grad(x.clone() if name == "expanded" else x)


def test_grad_from_sum_and_reused_graph(device):
    # .sum() hands backward an expanded, stride-0 gradient.
    x = torch.randn(3, 10, device=device, requires_grad=True)
    sm.softmax(x).sum().backward()
    torch.testing.assert_close(x.grad, torch.zeros_like(x), atol=1e-6, rtol=0)
    # The saved output feeds a second backward after retain_graph.
    x.grad = None
    w = torch.randn(3, 10, device=device)
    y = sm.softmax(x)
    (y * w).sum().backward(retain_graph=True)
    first = x.grad.clone()
    (y * w).sum().backward()
    torch.testing.assert_close(x.grad, 2 * first)


def test_empty_and_scalar(device):
    for shape in [(0, 5), (5, 0), (0,), (2, 0, 3)]:
        x = torch.randn(shape, device=device, requires_grad=True)
        y = sm.softmax(x)
        assert y.shape == x.shape
        y.sum().backward()
        assert x.grad.shape == x.shape
    s = torch.tensor(3.0, device=device)
    for dim in (0, -1):
        assert sm.softmax(s, dim).shape == ()
        assert sm.softmax(s, dim).item() == 1.0


@pytest.mark.parametrize(
    ("int64", "evict", "reload"),
    [(False, "", False), (True, "evict_first", False), (False, "", True)],
)
def test_persistent_loop_covers_every_tile(int64, evict, reload, device):
    # A grid smaller than the work: each program must stride over several tiles/rows.
    x = torch.randn(11, 40, device=device)
    y = torch.full_like(x, -1.0)
    knobs = {"NUM_STAGES": 1, "EVICT": evict, "INT64": int64}
    fwd_args = (x, y, 11, 40, 40, 40)
    sm.softmax_fwd_kernel[(3,)](
        *fwd_args, BLOCK_M=2, BLOCK_N=64, EVEN_M=False, EVEN_N=False, **knobs
    )
    _assert_matches(y, x)
    y.fill_(-1.0)
    sm.softmax_fwd_online_kernel[(3,)](*fwd_args, BLOCK_N=16, **knobs)
    _assert_matches(y, x)
    p = torch.softmax(x, -1)
    dy = torch.randn_like(x)
    want = torch.ops.aten._softmax_backward_data(dy, p, -1, x.dtype)
    dx = torch.full_like(x, -1.0)
    bwd_args = (p, dy, dx, 11, 40, 40, 40, 40)
    sm.softmax_bwd_kernel[(3,)](
        *bwd_args, BLOCK_M=4, BLOCK_N=64, EVEN_M=False, EVEN_N=False, RELOAD=reload, **knobs
    )
    torch.testing.assert_close(dx, want, rtol=1e-5, atol=1e-7)
    dx.fill_(-1.0)
    sm.softmax_bwd_online_kernel[(3,)](*bwd_args, BLOCK_N=16, **knobs)
    torch.testing.assert_close(dx, want, rtol=1e-5, atol=1e-7)


def test_int64_offsets_only_when_needed():
    cfg = sm.SoftmaxConfig(4, 64, 4)
    small = torch.empty(1000, 64, device="meta")
    far = torch.empty_strided((5, 64), (2**29, 1), device="meta")
    assert not sm._needs_int64(1000, cfg, small, small)
    assert sm._needs_int64(5, cfg, far, small)


def test_explicit_configs(device):
    x = torch.randn(9, 300, device=device)
    y = torch.empty_like(x)
    configs = [
        sm.SoftmaxConfig(4, 512, 4),
        sm.SoftmaxConfig(1, 512, 8, num_stages=2, ctas_per_sm=1),
        sm.SoftmaxConfig(1, 128, 4, online=True, ctas_per_sm=2, evict="evict_first"),
    ]
    for cfg in configs:
        _assert_matches(sm.launch_softmax_forward(x, y, cfg), x)
    with pytest.raises(ValueError, match="cover the row"):
        sm.launch_softmax_forward(x, y, sm.SoftmaxConfig(1, 256, 4))
    with pytest.raises(ValueError, match="powers of two"):
        sm.launch_softmax_forward(x, y, sm.SoftmaxConfig(3, 512, 4))
    with pytest.raises(ValueError, match="evict"):
        sm.launch_softmax_forward(x, y, sm.SoftmaxConfig(1, 512, 4, evict="evict_normal"))
    # reload belongs to the single-pass backward: there it must agree with torch.
    dy = torch.randn_like(x)
    p = torch.softmax(x, -1)
    want = torch.ops.aten._softmax_backward_data(dy, p, -1, x.dtype)
    dx = sm.launch_softmax_backward(
        p, dy, torch.empty_like(x), sm.SoftmaxConfig(2, 512, 4, reload=True)
    )
    torch.testing.assert_close(dx, want, rtol=1e-5, atol=1e-7)
    with pytest.raises(ValueError, match="reload is an option of the backward"):
        sm.launch_softmax_forward(x, y, sm.SoftmaxConfig(1, 512, 4, reload=True))
    with pytest.raises(ValueError, match="single-pass backward"):
        sm.launch_softmax_backward(p, dy, y, sm.SoftmaxConfig(1, 128, 4, online=True, reload=True))


def test_pick_config(monkeypatch):
    for n in (1, 17, 256, 1000, 4096, 16384, sm.ONLINE_THRESHOLD):
        for backward in (False, True):
            cfg = sm.pick_config(n, backward=backward)
            sm._check_config(cfg, n)
            assert cfg.block_m * cfg.block_n <= 2**16
            if n <= 16384:
                assert not cfg.online
    for backward in (False, True):
        cfg = sm.pick_config(sm.ONLINE_THRESHOLD + 1, backward=backward)
        assert cfg.online
        sm._check_config(cfg, sm.ONLINE_THRESHOLD + 1)
    monkeypatch.setattr(sm, "ONLINE_BLOCK", 64)
    assert sm.pick_config(10**6).block_n == 64


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "match"),
    [
        (([1.0, 2.0],), {}, TypeError, "softmax: x must be a torch.Tensor, got list"),
        ((torch.ones(3, dtype=torch.int32),), {}, TypeError, "softmax: x has dtype int32"),
        ((torch.ones(3, dtype=torch.float64),), {}, TypeError, "softmax: x has dtype float64"),
        ((torch.ones(3, device="meta"),), {}, ValueError, r"softmax: x is on meta.*move it"),
        ((torch.ones(2, 3),), {"dim": 2}, ValueError, "softmax: dim 2 is out of range"),
        ((torch.ones(2, 3),), {"dim": -3}, ValueError, "softmax: dim -3 is out of range"),
        ((torch.ones(2, 3),), {"dim": 1.0}, TypeError, "softmax: dim must be an int"),
        ((torch.ones(2, 3),), {"dim": True}, TypeError, "softmax: dim must be an int"),
    ],
    ids=["list", "int32", "float64", "device", "dim-high", "dim-low", "dim-float", "dim-bool"],
)
def test_bad_input(args, kwargs, error, match, device):
    if isinstance(args[0], torch.Tensor) and args[0].device.type != "meta":
        args = (args[0].to(device),)
    with pytest.raises(error, match=match):
        sm.softmax(*args, **kwargs)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "shape", [(4096, 256), (2048, 1000), (512, 4096), (64, 32768), (16, 100_000)]
)
def test_bf16_on_gpu(shape, device):
    x = (torch.randn(shape, device=device) * 4).to(torch.bfloat16)
    _assert_matches(sm.softmax(x), x)
    _check_grad(x)


@pytest.mark.gpu
def test_bf16_minus_inf_on_gpu(device):
    for n in (1000, 40_000):
        x = _with_infs(n, device).to(torch.bfloat16)
        torch.testing.assert_close(sm.softmax(x), torch.softmax(x, -1), equal_nan=True)


@pytest.mark.gpu
def test_row_offsets_past_int32_on_gpu(device):
    # Rows 2**29 elements apart: the last row starts at element 2**31.
    n, stride = 64, 2**29
    buf = torch.randn(4 * stride + n, device=device, dtype=torch.bfloat16)
    x = buf.as_strided((5, n), (stride, 1))
    _assert_matches(sm.softmax(x), x)
    _check_grad(x)


_SIG_FWD = {"x_ptr": "*bf16", "y_ptr": "*bf16", "n_rows": "i32", "n_cols": "i32"}
_SIG_FWD |= {"stride_x": "i32", "stride_y": "i32"}
_SIG_BWD = {"y_ptr": "*bf16", "dy_ptr": "*bf16", "dx_ptr": "*bf16", "n_rows": "i32"}
_SIG_BWD |= {"n_cols": "i32", "stride_y": "i32", "stride_dy": "i32", "stride_dx": "i32"}


def test_kernels_compile_for_sm90():
    """Each kernel compiles ahead of time for an H100 with 16-byte loads and no spills."""
    jobs = [
        (
            "softmax_fwd_kernel",
            _SIG_FWD,
            {"BLOCK_M": 8, "BLOCK_N": 1024, "EVEN_M": True, "EVEN_N": True},
            8,
        ),
        ("softmax_fwd_online_kernel", _SIG_FWD, {"BLOCK_N": 4096}, 8),
        (
            "softmax_bwd_kernel",
            _SIG_BWD,
            {"BLOCK_M": 4, "BLOCK_N": 1024, "EVEN_M": False, "EVEN_N": True, "RELOAD": False},
            8,
        ),
        # The tuned 32768-wide backward, which reads its rows twice.
        (
            "softmax_bwd_kernel",
            _SIG_BWD,
            {"BLOCK_M": 1, "BLOCK_N": 32768, "EVEN_M": True, "EVEN_N": True, "RELOAD": True},
            32,
        ),
        ("softmax_bwd_online_kernel", _SIG_BWD, {"BLOCK_N": 4096}, 8),
    ]

    def build(job):
        name, sig, consts, warps = job
        aligned = [a for a in sig if a != "n_rows"]  # as a launch on 256-aligned rows sees them
        return compile_kernel(
            f"tilebook.ops.softmax:{name}",
            sig,
            {**consts, "NUM_STAGES": 1, "EVICT": "", "INT64": False},
            arch=90,
            num_warps=warps,
            divisible_by_16=aligned,
        )

    # On a CPU each compile is a child process, so they can overlap.
    with ThreadPoolExecutor(max_workers=4 if tilebook.is_interpreter() else 1) as pool:
        kernels = list(pool.map(build, jobs))
    for (name, *_), k in zip(jobs, kernels, strict=True):
        ptx = k.stages["ptx"]
        assert k.name == name
        assert ptx.strip()
        assert ".v4.b32" in ptx, f"{name}: no 16-byte global loads"
        assert not k.spill_stores_bytes, k.ptxas_log
        assert not k.spill_loads_bytes, k.ptxas_log


class _Planned:
    """Counts the calls of :func:`tilebook.ops.softmax.pick_config`: each one is a call,
    or a first backward, being planned."""

    def __init__(self, monkeypatch):
        self.fwd = self.bwd = 0
        real = sm.pick_config

        def counted(n_cols, *, backward=False):
            self.bwd += backward
            self.fwd += not backward
            return real(n_cols, backward=backward)

        monkeypatch.setattr(sm, "pick_config", counted)


def test_repeat_calls_take_the_plan_and_stay_right(monkeypatch, device):
    """The first call of a kind plans it; later ones with fresh tensors of the same
    layout take the plan (no planning), with or without a gradient, forward and
    backward, and are right; another layout, dim or knob is another kind."""
    planned = _Planned(monkeypatch)
    n = 41  # a width no other test plans first (plans outlive a test)
    for step in range(3):
        x = torch.randn(6, n, device=device, requires_grad=step != 1)
        y = sm.softmax(x)
        _assert_matches(y.detach(), x.detach())
        if x.requires_grad:  # fresh dy, contiguous: the plan's backward after the first
            _check_grad(x)
    assert (planned.fwd, planned.bwd) == (1, 1)
    # Kinds of their own: a transposed view (same shape), another dim, a stride-0 dy.
    xt = torch.randn(n, 6, device=device).t()
    _assert_matches(sm.softmax(xt), xt)
    _check_grad(torch.randn(6, n, device=device), 0)
    x = torch.randn(6, n, device=device, requires_grad=True)
    sm.softmax(x).sum().backward()
    torch.testing.assert_close(x.grad, torch.zeros_like(x), atol=1e-6, rtol=0)
    assert planned.fwd == 3
    monkeypatch.setattr(sm, "ONLINE_THRESHOLD", 32)  # a knob is part of the kind
    _assert_matches(sm.softmax(x.detach()), x.detach())
    assert planned.fwd == 4
    # The checks still run for what no plan holds.
    with pytest.raises(TypeError, match="dim must be an int"):
        sm.softmax(x, True)
    with pytest.raises(ValueError, match="out of range"):
        sm.softmax(x, 2)
