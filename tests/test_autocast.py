"""torch.autocast: the ops that torch runs in the lower precision under autocast
(matmul, linear, scaled-dot-product attention) do so in tilebook too, with gradients
back to float32 leaves, eager and under torch.compile."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import tilebook

DEV = tilebook.device()
# The interpreter's bfloat16 arithmetic is wrong: float16 on the CPU.
LOW = torch.bfloat16 if tilebook.is_gpu() else torch.float16
TOL = 2e-2


def _cases():
    g = torch.Generator(device="cpu").manual_seed(0)

    def r(*shape):
        return torch.randn(*shape, generator=g).to(DEV)

    q, k, v = r(1, 2, 16, 32), r(1, 2, 16, 32), r(1, 2, 16, 32)
    x, w, b = r(24, 32), r(48, 32), r(48)
    return {
        "matmul": (tilebook.matmul, torch.matmul, (r(3, 24, 32), r(32, 40))),
        "linear_act": (
            lambda x, w, b: tilebook.linear_act(x, w, b, "relu"),
            lambda x, w, b: F.relu(F.linear(x, w, b)),
            (x, w, b),
        ),
        "flash_attention": (
            lambda q, k, v: tilebook.flash_attention(q, k, v, causal=True),
            lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
            (q, k, v),
        ),
    }


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.parametrize("name", ["matmul", "linear_act", "flash_attention"])
def test_autocast_runs_the_op_in_the_lower_precision_as_torch_does(name):
    ours, theirs, inputs = _cases()[name]
    leaves = [t.clone().requires_grad_() for t in inputs]
    with torch.autocast(DEV.type, dtype=LOW):
        got = ours(*leaves)
        want = theirs(*inputs)
    assert got.dtype == want.dtype == LOW
    # the same computation in float64 from the inputs as autocast cast them
    ref = theirs(*(t.to(LOW).double() for t in inputs))
    assert _rel(got, ref) < TOL
    grads = torch.autograd.grad(got.float().sum(), leaves)
    assert all(g.dtype == torch.float32 and torch.isfinite(g).all() for g in grads)
    # outside autocast nothing is cast: float32 in, float32 out, or (attention on a
    # GPU, whose kernels take float16 and bfloat16 only) the dtype error
    if name == "flash_attention" and tilebook.is_gpu():
        with pytest.raises(TypeError, match="float32"):
            ours(*inputs)
    else:
        assert ours(*inputs).dtype == torch.float32


@pytest.mark.gpu
def test_autocast_holds_under_torch_compile():
    a, b = torch.randn(64, 32, device=DEV), torch.randn(32, 48, device=DEV)
    torch._dynamo.reset()
    fn = torch.compile(lambda a, b: tilebook.matmul(a, b), fullgraph=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        got = fn(a, b)
    assert got.dtype == torch.bfloat16
    assert _rel(got, a.to(torch.bfloat16).double() @ b.to(torch.bfloat16).double()) < TOL


def _row_cases():
    g = torch.Generator(device="cpu").manual_seed(1)
    x = torch.randn(6, 64, generator=g).to(DEV, LOW)
    w = (1 + 0.1 * torch.randn(64, generator=g)).to(DEV)  # float32 parameters
    b = (0.1 * torch.randn(64, generator=g)).to(DEV)
    return {
        "softmax": (lambda x: tilebook.softmax(x), lambda x: torch.softmax(x, -1), (x,)),
        "rms_norm": (tilebook.rms_norm, lambda x, w: F.rms_norm(x, (64,), w, 1e-6), (x, w)),
        "layer_norm": (
            tilebook.layer_norm,
            lambda x, w, b: F.layer_norm(x, (64,), w, b),
            (x, w, b),
        ),
        "dropout": (lambda x: tilebook.dropout(x, 0.0), lambda x: F.dropout(x, 0.0), (x,)),
    }


# torch's own rms_norm warns that a float32 weight with a float16 input takes its slow path
@pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight")
@pytest.mark.parametrize("name", ["softmax", "rms_norm", "layer_norm", "dropout"])
def test_row_ops_under_autocast_return_what_torch_returns(name):
    """torch runs some row ops in float32 under autocast on some devices (softmax and
    layer_norm on a GPU), others in their input's dtype: tilebook's give the same dtype,
    and the values of that computation."""
    ours, theirs, inputs = _row_cases()[name]
    with torch.autocast(DEV.type, dtype=LOW):
        want = theirs(*inputs)
        got = ours(*inputs)
    assert got.dtype == want.dtype
    ref = theirs(*(t.to(want.dtype).double() for t in inputs))
    assert _rel(got, ref) < (1e-5 if got.dtype == torch.float32 else TOL)
