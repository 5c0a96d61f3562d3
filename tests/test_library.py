"""Every public op as a ``torch.library`` operator: ``torch.compile(fullgraph=True)``
traces it with no graph break, and gives eager's outputs and gradients.

On CPU the operators run Triton's interpreter under ``backend="aot_eager"`` (every
operator is a ``custom_op`` there: see :mod:`tilebook.ops.library`); the graphs are
read to check that the ``tilebook`` operators, forward and backward, are in them.
``torch.library.opcheck`` checks each operator's schema, fake implementation and
autograd registration.  The Inductor tests (the default backend, where Inductor
launches the traced kernels itself) need a GPU.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
import torch
import triton
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.testing import CompileCounterWithBackend
from torch._functorch.aot_autograd import make_boxed_func

import tilebook
from tilebook.ops import library
from tilebook.ops.partials import sum_partials_kernel

PUBLIC_OPS = (
    "vector_add",
    "linear_act",
    "matmul",
    "softmax",
    "rms_norm",
    "layer_norm",
    "dropout",
    "flash_attention",
)


@dataclasses.dataclass(frozen=True)
class Case:
    """A small function of a public op, its inputs, and the operators its compiled
    forward and backward graphs must call."""

    name: str
    fn: Callable
    make: Callable  # (device, dtype) -> tuple of inputs
    forward_ops: tuple[str, ...]
    backward_ops: tuple[str, ...] = ()


def _t(*shape, device, dtype, grad=True, scale=1.0):
    return (
        (scale * torch.randn(shape, device=device, dtype=torch.float32))
        .to(dtype)
        .requires_grad_(grad)
    )


def _near_one(n, device, dtype):
    return (1 + 0.5 * torch.randn(n, device=device)).to(dtype).requires_grad_()


CASES = [
    Case(
        "vector_add",
        lambda x, y: tilebook.vector_add(x, y) * 3,
        lambda d, t: (_t(37, device=d, dtype=t), _t(37, device=d, dtype=t)),
        ("vector_add",),
    ),
    Case(
        "matmul",
        lambda a, b: tilebook.matmul(a, b).tanh(),
        lambda d, t: (_t(9, 16, device=d, dtype=t), _t(16, 12, device=d, dtype=t)),
        ("fused_matmul",),
        ("fused_matmul",),
    ),
    Case(
        "linear_act gelu",
        lambda x, w, b: tilebook.linear_act(x, w, b, "gelu"),
        lambda d, t: (
            _t(2, 5, 16, device=d, dtype=t),
            _t(12, 16, device=d, dtype=t, scale=0.25),
            _t(12, device=d, dtype=t),
        ),
        ("fused_matmul",),
        ("act_grad", "fused_matmul"),
    ),
    Case(
        "linear_act relu",
        lambda x, w: tilebook.linear_act(x, w, None, "relu"),
        lambda d, t: (_t(7, 16, device=d, dtype=t), _t(12, 16, device=d, dtype=t, scale=0.25)),
        ("fused_matmul",),
        ("act_grad", "fused_matmul"),
    ),
    Case(
        "softmax",
        lambda x: tilebook.softmax(x, dim=1) * 2,  # not the last dim: moved and back
        lambda d, t: (_t(3, 5, 7, device=d, dtype=t),),
        ("softmax",),
        ("softmax_backward",),
    ),
    Case(
        "rms_norm",
        lambda x, w: tilebook.rms_norm(x, w, 1e-6) + 1,
        lambda d, t: (_t(2, 3, 32, device=d, dtype=t), _near_one(32, d, t)),
        ("rms_norm",),
        ("rms_norm_backward",),
    ),
    Case(
        "layer_norm",
        lambda x, w, b: tilebook.layer_norm(x, w, b, 1e-5) + 1,
        lambda d, t: (_t(6, 32, device=d, dtype=t), _near_one(32, d, t), _t(32, device=d, dtype=t)),
        ("layer_norm",),
        ("layer_norm_backward",),
    ),
    Case(
        "layer_norm no params",
        lambda x: tilebook.layer_norm(x) * 2,
        lambda d, t: (_t(3, 4, 24, device=d, dtype=t),),
        ("layer_norm",),
        ("layer_norm_backward",),
    ),
    Case(
        "dropout seeded",
        lambda x: tilebook.dropout(x, 0.3, seed=1234) * 2,
        lambda d, t: (_t(4, 50, device=d, dtype=t),),
        ("dropout",),
        ("dropout",),
    ),
    Case(
        "dropout drawn seed",
        lambda x: tilebook.dropout(x, 0.5) + 1,
        lambda d, t: (_t(4, 50, device=d, dtype=t),),
        ("dropout_drawn",),
        ("dropout_drawn",),
    ),
    Case(
        "flash_attention",
        lambda q, k, v: tilebook.flash_attention(q, k, v, causal=True),
        lambda d, t: tuple(_t(1, 2, 16, 32, device=d, dtype=t) for _ in range(3)),
        ("flash_attention",),
        ("flash_attention_backward",),
    ),
]
IDS = [c.name for c in CASES]


DEVICE = tilebook.device()  # the interpreter's CPU, or the GPU in GPU mode


def _dtype(case):
    # float32 attention runs under the interpreter only; a GPU takes 16-bit.
    gpu_fa = DEVICE.type == "cuda" and case.name.startswith("flash")
    return torch.float16 if gpu_fa else torch.float32


def _clone(args):
    return tuple(a.detach().clone().requires_grad_(a.requires_grad) for a in args)


def _run(fn, args, seed=7):
    """Output and the gradients of ``(out * g).sum()`` for every input, from ``seed``."""
    args = _clone(args)
    torch.manual_seed(seed)
    out = fn(*args)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out)
    grads = torch.autograd.grad((out * g).sum(), args)
    return out.detach(), grads


def _jit(kernel) -> str:
    """A kernel (under any autotune or heuristics wrappers) as its function's name."""
    while not isinstance(kernel, triton.runtime.JITFunction) and hasattr(kernel, "fn"):
        kernel = kernel.fn
    return f"{kernel.fn.__module__}.{kernel.fn.__qualname__}"


def _ops_in(gm: torch.fx.GraphModule) -> set[str]:
    """The ``tilebook`` operators a graph calls, by name, and the Triton kernels it
    launches itself: on a GPU AOTAutograd traces into a ``triton_op`` (its graphs
    launch the operator's kernels)."""
    from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table

    names = set()
    for node in gm.graph.nodes:
        target = node.target
        if node.op != "call_function":
            continue
        if getattr(target, "namespace", None) == library.NAMESPACE:
            names.add(target.name().split("::")[1].split(".")[0])
        elif "kernel_idx" in node.kwargs:  # triton_kernel_wrapper_{functional,mutation}
            names.add(_jit(kernel_side_table.get_kernel(node.kwargs["kernel_idx"])))
    return names


def _called(op: str, seen: set[str]) -> bool:
    """Whether a graph that calls ``seen`` calls the operator ``op``, or launches one of
    the kernels it registered."""
    from torch._library.triton import triton_ops_to_kernels

    kernels = triton_ops_to_kernels.get(f"{library.NAMESPACE}::{op}", [])
    return op in seen or any(_jit(k) in seen for k in kernels)


def test_every_public_op_has_operators():
    names = {q.split("::")[1] for q in library.registered()}
    for op in PUBLIC_OPS:
        assert any(c.name.startswith(op) for c in CASES), op
    covered = {n for c in CASES for n in c.forward_ops + c.backward_ops}
    assert covered <= names
    # fused_matmul_eager is the Hopper path (opaque): a GPU takes it, not the interpreter.
    assert names - covered == {"fused_matmul_eager"}
    for name in names:
        assert hasattr(torch.ops.tilebook, name)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_compiled_matches_eager(case):
    """aot_eager, fullgraph: eager's outputs and gradients; one frame compiled; the
    graph calls the operators forward and backward."""
    torch._dynamo.reset()
    args = case.make(DEVICE, _dtype(case))
    ref_out, ref_grads = _run(case.fn, args)

    counter = CompileCounterWithBackend("aot_eager")
    out, grads = _run(torch.compile(case.fn, backend=counter, fullgraph=True), args)
    assert counter.frame_count == 1
    torch.testing.assert_close(out, ref_out)
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r)

    explained = torch._dynamo.explain(case.fn)(*_clone(args))
    assert explained.graph_break_count == 0
    assert explained.graph_count == 1

    graphs = {"fw": [], "bw": []}

    def keep(kind):
        def compiler(gm, example_inputs):
            graphs[kind].append(gm)
            return make_boxed_func(gm.forward)

        return compiler

    torch._dynamo.reset()
    traced = torch.compile(
        case.fn,
        backend=aot_autograd(fw_compiler=keep("fw"), bw_compiler=keep("bw")),
        fullgraph=True,
    )
    _run(traced, args)
    for kind, ops in (("fw", case.forward_ops), ("bw", case.backward_ops)):
        seen = set().union(*map(_ops_in, graphs[kind]))
        assert all(_called(op, seen) for op in ops), (kind, ops, seen)


@pytest.mark.parametrize("case", CASES[:8], ids=IDS[:8])
def test_dynamic_shapes_compile(case):
    """``dynamic=True``: the bodies see symbolic sizes (a block size computed from one
    used to take minutes to simplify); eager's outputs."""
    torch._dynamo.reset()
    args = case.make(DEVICE, _dtype(case))
    compiled = torch.compile(case.fn, backend="aot_eager", fullgraph=True, dynamic=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(*args), case.fn(*args))


def test_compiled_dropout_draws_from_torch_generator():
    """Without ``seed=``, a compiled dropout draws as eager does: the same mask after
    the same ``torch.manual_seed``, another one after another."""
    torch._dynamo.reset()
    x = torch.randn(64, 64, device=DEVICE)
    f = torch.compile(lambda x: tilebook.dropout(x, 0.5), backend="aot_eager", fullgraph=True)
    torch.manual_seed(3)
    eager = tilebook.dropout(x, 0.5)
    torch.manual_seed(3)
    first = f(x)
    torch.testing.assert_close(first, eager)
    second = f(x)
    assert not torch.equal(first == 0, second == 0)


def test_compiled_vector_add_out():
    torch._dynamo.reset()
    x, y = torch.randn(33, device=DEVICE), torch.randn(33, device=DEVICE)

    def f(x, y, out):
        return tilebook.vector_add(x, y, out=out) * 2

    out = torch.empty(33, device=DEVICE)
    res = torch.compile(f, backend="aot_eager", fullgraph=True)(x, y, out)
    torch.testing.assert_close(out, x + y)
    torch.testing.assert_close(res, 2 * (x + y))


# (the call, the error class, a piece of the message eager gives)
BAD_CALLS = [
    (lambda x: tilebook.rms_norm(x, x.new_ones(5)), ValueError, "weight must have shape"),
    (lambda x: tilebook.layer_norm(x, None, None, -1.0), ValueError, "eps"),
    (lambda x: tilebook.softmax(x.to(torch.int32)), TypeError, "softmax: x"),
    (lambda x: tilebook.vector_add(x, x[:, :3]), ValueError, "vector_add"),
    (lambda x: tilebook.matmul(x, x), ValueError, "matmul"),
    (lambda x: tilebook.linear_act(x, x, None, "swish"), ValueError, "activation"),
    (lambda x: tilebook.dropout(x, 1.5), ValueError, "dropout: p"),
    (lambda x: tilebook.flash_attention(*[x.half()] * 3), ValueError, "flash_attention"),
]
BAD_IDS = ["rms_norm", "layer_norm", "softmax", "vector_add", "matmul", "linear_act", "dropout",
           "flash_attention"]  # fmt: skip


@pytest.mark.parametrize(("call", "error", "message"), BAD_CALLS, ids=BAD_IDS)
def test_bad_input_gets_the_clear_error_inside_compile(call, error, message):
    """The checks run in the traced code: a compiled call raises eager's error (with
    fullgraph=True Dynamo reports it as an observed exception, quoting it whole)."""
    x = torch.randn(4, 8, device=DEVICE)
    with pytest.raises(error, match=message) as eager:
        call(x)
    torch._dynamo.reset()
    with pytest.raises(error) as compiled:
        torch.compile(call, backend="aot_eager")(x)
    assert str(compiled.value) == str(eager.value)
    torch._dynamo.reset()
    with pytest.raises(torch._dynamo.exc.Unsupported) as full:
        torch.compile(call, backend="aot_eager", fullgraph=True)(x)
    if torch.__version__ >= "2.13":  # torch 2.11's Dynamo (seen on the GPU) quotes no exception
        assert repr(eager.value) in str(full.value)


CAUSAL_16 = (32, 0, True)  # the mask operands of causal=True for 16 queries and 16 keys


def _opcheck_samples():
    """Inputs for every operator (tiny: opcheck runs each several times)."""
    dev = tilebook.device()
    r = lambda *s, grad=True, dtype=torch.float32: torch.randn(
        *s, device=dev, dtype=dtype
    ).requires_grad_(grad)
    x, w = r(4, 16), 1 + 0.1 * r(16)
    _, rstd = torch.ops.tilebook.rms_norm(x.detach(), w.detach(), 1e-6)
    _, stats = torch.ops.tilebook.layer_norm(x.detach(), w.detach(), w.detach(), 1e-5)
    # float32 attention runs under the interpreter only; a GPU takes 16-bit.
    fa_dtype = torch.float16 if dev.type == "cuda" else torch.float32
    fa = lambda *s, grad=True: r(*s, grad=grad, dtype=fa_dtype)
    q = fa(1, 2, 16, 32)
    o, lse = torch.ops.tilebook.flash_attention(
        q.detach(), q.detach(), q.detach(), None, 0.2, *CAUSAL_16
    )
    sm = torch.softmax(x.detach(), -1)
    return {
        "vector_add": (r(37, grad=False), r(37, grad=False), None, None),  # VectorAddFunction's
        # No autograd of their own: tilebook.ops.matmul.ProductFunction differentiates.
        "fused_matmul": (r(5, 16, grad=False), r(16, 7, grad=False), r(7, grad=False), "gelu"),
        "fused_matmul_eager": (r(5, 16, grad=False), r(16, 7, grad=False), None, "relu", "auto"),
        "act_grad": (r(5, 7, grad=False), r(5, 7, grad=False), "gelu"),
        "softmax": (r(4, 16, grad=False),),  # its autograd is SoftmaxFunction's
        "softmax_backward": (sm, r(4, 16, grad=False)),
        "rms_norm": (x.detach(), w.detach(), 1e-6),  # its gradient: RMSNormFunction's
        "rms_norm_backward": (r(4, 16, grad=False), x.detach(), w.detach(), rstd),
        "layer_norm": (x.detach(), w.detach(), r(16, grad=False), 1e-5),
        "layer_norm_backward": (r(4, 16, grad=False), x.detach(), w.detach(), stats, True, True),
        "dropout": (r(4, 16, grad=False), 0.25, 99),
        "dropout_drawn": (r(4, 16, grad=False), 0.25, torch.tensor(99)),
        # No gradient: flash_attention's autograd is its autograd.Function, which calls
        # the operators (and so has no autograd formula to check here).
        "flash_attention": (q.detach(), q.detach(), q.detach(), None, 0.2, *CAUSAL_16),
        "flash_attention_backward": (
            fa(1, 2, 16, 32, grad=False),
            q.detach(),
            q.detach(),
            q.detach(),
            o,
            lse,
            None,
            0.2,
            *CAUSAL_16,
        ),
    }


SAMPLES = _opcheck_samples()


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_opcheck(name):
    assert f"{library.NAMESPACE}::{name}" in library.registered()
    op = getattr(torch.ops.tilebook, name).default
    torch.library.opcheck(op, SAMPLES[name])


# ----------------------------------------------------- the traced bodies, without a GPU

# In TILEBOOK_MODE=aot the kernels are real JITFunctions and the operators triton_ops,
# as on a GPU: their bodies trace through wrap_triton on "meta" tensors.  With no
# driver, PyTorch cannot read a kernel's IR to see what it writes and assumes every
# input is written, which the partitioner accepts only with
# keep_inference_input_mutations (aot_eager's setting).
_TRACE_SCRIPT = r"""
import json, sys
import torch, tilebook
from tilebook.ops import library
from tilebook.ops.dropout import DropoutFunction
from tilebook.ops.layer_norm import LayerNormFunction
from tilebook.ops.rms_norm import RMSNormFunction
from tilebook.ops.matmul import ProductFunction as Product
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func
from torch._functorch.partitioners import min_cut_rematerialization_partition
from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table

assert library.TRACEABLE
graphs = []
def keep(gm, example_inputs):
    graphs.append(gm)
    return make_boxed_func(gm.forward)
backend = aot_autograd(fw_compiler=keep, bw_compiler=keep, keep_inference_input_mutations=True,
                       partition_fn=min_cut_rematerialization_partition)
T = torch.ops.tilebook
SF = tilebook.ops.softmax.SoftmaxFunction.apply  # the operators' autograd
VA = tilebook.ops.vector_add.VectorAddFunction.apply
r = lambda *s: torch.randn(*s, device="meta", dtype=torch.float16, requires_grad=True)
cases = {
    "vector_add": (lambda x, y: VA(x, y, None, None), r(4096), r(4096)),
    # ProductFunction: the operators' autograd (fused_matmul checks refuse meta tensors)
    "fused_matmul": (lambda a, b, c: Product.apply(a, b, c, "gelu", "auto", False, None),
                     r(256, 128), r(128, 64), r(64)),
    "softmax": (lambda x: SF(x), r(64, 4096)),
    "softmax online": (lambda x: SF(x), r(8, 131072)),
    "rms_norm": (lambda x, w: RMSNormFunction.apply(x, w, 1e-6), r(64, 4096), r(4096)),
    "rms_norm chunked": (lambda x, w: RMSNormFunction.apply(x, w, 1e-6), r(8, 65536), r(65536)),
    "layer_norm": (lambda x, w, b: LayerNormFunction.apply(x, w, b, 1e-5), r(64, 4096), r(4096), r(4096)),
    "layer_norm chunked": (lambda x, w, b: LayerNormFunction.apply(x, w, b, 1e-5), r(8, 65536), r(65536), r(65536)),
    "dropout": (lambda x: DropoutFunction.apply(x, 0.1, 5), r(4096)),
}
found = {}
for name, (fn, *args) in cases.items():
    graphs.clear()
    torch._dynamo.reset()
    torch.compile(fn, backend=backend, fullgraph=True)(*args).sum().backward()
    found[name] = sorted(
        getattr(kernel_side_table.get_kernel(n.kwargs["kernel_idx"]), "fn").__name__
        for g in graphs for n in g.graph.nodes if "triton_kernel_wrapper" in str(n.target)
    )
print("KERNELS=" + json.dumps(found))
"""

TRACED_KERNELS = {
    "vector_add": ["add_kernel"],
    # forward; backward: the pre-activation again, GELU's derivative, dA and dB
    "fused_matmul": ["act_grad_kernel"] + ["matmul_kernel"] * 4,
    "softmax": ["softmax_bwd_kernel", "softmax_fwd_kernel"],
    "softmax online": ["softmax_bwd_online_kernel", "softmax_fwd_online_kernel"],
    "rms_norm": ["rms_norm_bwd_kernel", "rms_norm_fwd_kernel", "sum_partials_kernel"],
    "rms_norm chunked": [
        "rms_norm_bwd_chunked_kernel",
        "rms_norm_bwd_dot_kernel",
        "rms_norm_fwd_chunked_kernel",
        "sum_partials_kernel",
    ],
    "layer_norm": [
        "layer_norm_bwd_kernel",
        "layer_norm_fwd_kernel",
        "sum_partials_kernel",
    ],
    "layer_norm chunked": [
        "layer_norm_bwd_chunked_kernel",
        "layer_norm_bwd_dot_kernel",
        "layer_norm_fwd_chunked_kernel",
        "sum_partials_kernel",
    ],
    "dropout": ["dropout_kernel", "dropout_kernel"],
}


def test_traceable_operators_trace_their_kernels_without_a_gpu():
    """The GPU's operators (triton_op + wrap_triton), traced forward and backward on
    meta tensors in compile-only mode: each graph launches the kernels an eager call
    would, as Triton kernels that Inductor would compile itself."""
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TILEBOOK_MODE"] = "aot"
    proc = subprocess.run(
        [sys.executable, "-c", _TRACE_SCRIPT],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("KERNELS="))
    assert json.loads(line.removeprefix("KERNELS=")) == TRACED_KERNELS


def test_a_tensor_the_body_made_is_never_passed_twice():
    """When PyTorch cannot tell which arguments a kernel writes, it clones each tensor
    argument separately and the tensor takes the last clone: an output passed twice
    would come back unwritten.  An operator's input passed twice is harmless (bodies
    never write their inputs).  Every operator's launches keep to that (the compiled
    tests above run them); here the check itself."""
    x = torch.ones(8)
    kernel = sum_partials_kernel

    def body(x: torch.Tensor, made_twice: bool) -> torch.Tensor:
        y = torch.empty_like(x)
        with library.recording() as launches:
            library.launch(kernel, (1,), x, y, x)  # an input twice: fine
            if made_twice:
                library.launch(kernel, (1,), x, y, y)
        assert len(launches) == 1 + made_twice
        return y

    checked = library._body(body)
    checked(x, False)
    with pytest.raises(RuntimeError, match="sum_partials_kernel is given one tensor the op"):
        checked(x, True)
    body(x, True)  # a body called outside an operator (compile jobs) is not checked


# --------------------------------------------------------------------------- GPU: Inductor


def _gpu_close(a, b):
    # Inductor may pick another autotuned matmul configuration than eager: 16-bit rounding.
    torch.testing.assert_close(a, b, atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_inductor_matches_eager_on_gpu(case, dtype):
    """Inductor, fullgraph: eager's outputs and gradients, one frame, no graph break."""
    import torch._inductor.config as inductor_config

    torch._dynamo.reset()
    args = case.make("cuda", dtype)
    # Inductor would otherwise draw dropout's seed from its own generator, not torch's.
    with inductor_config.patch(fallback_random=True):
        ref_out, ref_grads = _run(case.fn, args)
        counter = CompileCounterWithBackend("inductor")
        out, grads = _run(torch.compile(case.fn, backend=counter, fullgraph=True), args)
        assert counter.frame_count == 1
        _gpu_close(out, ref_out)
        for g, r in zip(grads, ref_grads, strict=True):
            _gpu_close(g, r)
        assert torch._dynamo.explain(case.fn)(*_clone(args)).graph_break_count == 0


def _every_tensor_written(*args, **kwargs):
    # torch's fallback when it cannot analyse a kernel: every tensor argument is
    # taken as written (and cloned, each argument apart).
    named = next(a for a in (*args, *kwargs.values()) if isinstance(a, dict) and a)
    return [k for k, v in named.items() if isinstance(v, torch.Tensor)]


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_compiled_is_right_when_torch_cannot_read_the_kernels(case, monkeypatch):
    """With torch 2.11 and Triton 3.8, torch's analysis of which tensors a kernel
    writes fails and it assumes all of them; Inductor's rms_norm weight gradient then
    came back unwritten (its kernel was given that output twice).  The same fallback,
    forced where AOTAutograd functionalizes the traced kernels (``aot_eager``: Inductor
    reads the kernels again for itself)."""
    from torch._higher_order_ops import triton_kernel_wrap as wrap

    patched = [n for n in ("get_mutated_tensors", "identify_mutated_tensors") if hasattr(wrap, n)]
    assert patched, "torch's triton_kernel_wrap has neither analysis function"
    for name in patched:
        monkeypatch.setattr(wrap, name, _every_tensor_written)
    torch._dynamo.reset()
    args = case.make("cuda", torch.float16)
    ref_out, ref_grads = _run(case.fn, args)
    out, grads = _run(torch.compile(case.fn, backend="aot_eager", fullgraph=True), args)
    _gpu_close(out, ref_out)
    for g, r in zip(grads, ref_grads, strict=True):
        _gpu_close(g, r)


@pytest.mark.gpu
def test_an_operator_called_with_cpu_tensors_says_so():
    """torch.ops.tilebook.* skips the public functions' checks; the launch checks the
    devices itself instead of leaving Triton's "cpu tensor?" to the user."""
    x, w = torch.randn(4, 16), torch.ones(16)
    with pytest.raises(ValueError, match="runs on CUDA tensors only; its inputs are on cpu"):
        torch.ops.tilebook.rms_norm(x, w, 1e-6)
    with pytest.raises(ValueError, match="cpu, cuda:0"):
        torch.ops.tilebook.rms_norm(x.cuda(), w, 1e-6)
    q = torch.randn(1, 2, 16, 32, device="cuda")
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        torch.ops.tilebook.flash_attention(q, q, q, None, 0.2, *CAUSAL_16)
