"""Every kernel of the ops survives Inductor's copy of it (a CPU test of a GPU failure).

Under ``torch.compile`` on a GPU, Inductor does not call a user's ``@triton.jit``
kernel: it writes the kernel's source into a module of its own, with the source of
every ``@triton.jit`` function the kernel names as a bare global, and the imports
of bare names that come from ``triton``
(``torch._inductor.codegen.wrapper.user_defined_triton_kernel_transitive_closure_source_code``).
Anything else a kernel reaches through a global is missing there: a helper called
as a module attribute (``norms.columns(...)``) compiled in eager mode and failed in
Inductor with ``NameError('norms is not defined')`` (H100, torch 2.11, 2026-12-07).

The interpreter never copies a kernel, so the CPU suite cannot see that by running
the ops; this test applies Inductor's rule to every kernel's globals instead.
"""

from __future__ import annotations

import builtins
import dis
import importlib
import importlib.util
import pkgutil
import types

import pytest
import triton

import tilebook.ops

#: Globals Inductor's module has without being told (its header imports them).
HEADER = {"triton", "tl"}


def _jit_fn(obj) -> types.FunctionType | None:
    """The Python function of a ``@triton.jit`` object (JIT or interpreter), else None."""
    fn = getattr(obj, "fn", None)
    if isinstance(fn, types.FunctionType) and callable(getattr(obj, "__getitem__", None)):
        return fn
    return None


def _kernels() -> dict[str, object]:
    found = {}
    for info in pkgutil.iter_modules(tilebook.ops.__path__):
        mod = importlib.import_module(f"tilebook.ops.{info.name}")
        for name, obj in vars(mod).items():
            fn = _jit_fn(obj)
            # Gluon kernels (the Hopper attention) belong to an opaque operator, which
            # Inductor calls as it is.
            gluon = "gluon" in type(obj).__module__
            if fn is not None and fn.__module__ == mod.__name__ and not gluon:
                found[f"{info.name}.{name}"] = obj
    return found


KERNELS = _kernels()


def unreachable(kernel) -> list[str]:
    """The globals of ``kernel`` and of the jit functions it calls that Inductor's copy
    would not define: ``"function: name (what it is)"`` each."""
    bad, seen, todo = [], set(), [kernel]
    while todo:
        fn = _jit_fn(todo.pop())
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        for ins in dis.Bytecode(fn):
            if ins.opname != "LOAD_GLOBAL":
                continue
            name = ins.argval
            if name in HEADER:
                continue
            if name not in fn.__globals__:
                if not hasattr(builtins, name):  # range, min: any module has those
                    bad.append(f"{fn.__name__}: {name} (undefined)")
                continue
            value = fn.__globals__[name]
            if _jit_fn(value) is not None:
                todo.append(value)
            elif isinstance(value, (int, str, bool, triton.language.constexpr)):
                continue  # Inductor writes these out as literals
            elif getattr(value, "__module__", "").startswith("triton"):
                continue  # Inductor imports these (tl.float32 and the like)
            else:
                bad.append(f"{fn.__name__}: {name} ({type(value).__name__})")
    return bad


def test_the_ops_have_kernels():
    assert {"rms_norm.rms_norm_fwd_kernel", "layer_norm.layer_norm_bwd_kernel",
            "softmax.softmax_fwd_kernel", "dropout.dropout_kernel"} <= set(KERNELS)  # fmt: skip


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_kernel_names_only_what_inductor_copies(name):
    assert unreachable(KERNELS[name]) == []


def test_a_module_attribute_is_caught(tmp_path):
    """The rule bites: a kernel that calls a helper through its module is refused."""
    from tilebook.ops import norms

    src = (
        "import triton\nimport triton.language as tl\n"
        "@triton.jit\n"
        "def bad_kernel(x_ptr, n, BLOCK: tl.constexpr):\n"
        "    cols, ok = norms.columns(0, n, BLOCK)\n"
        "    tl.store(x_ptr + cols, 0.0, mask=ok)\n"
    )
    path = tmp_path / "tilebook_bad_kernel.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("tilebook_bad_kernel", path)
    mod = importlib.util.module_from_spec(spec)
    mod.norms = norms
    spec.loader.exec_module(mod)
    assert unreachable(mod.bad_kernel) == ["bad_kernel: norms (module)"]


def test_dropout_compiles_with_constant_seed_and_threshold():
    """Inductor may hand a kernel an int argument as a constant (a seed of 1, the
    threshold of a fixed p): the dropout kernel once called ``seed.to(...)`` on it and
    failed to compile under torch.compile (H100, torch 2.11).  Compiled ahead of time
    for sm_90 with both as constexprs, as Inductor passes them."""
    from tilebook.course import aot
    from tilebook.ops import dropout

    (job,) = dropout.compile_jobs(90).values()
    signature = {k: v for k, v in job["signature"].items() if k not in ("seed", "thr_bits")}
    compiled = aot.compile_kernel(
        job["kernel"], signature, {**job["constexprs"], "seed": 1, "thr_bits": 429496730},
        arch=90, num_warps=job["num_warps"], divisible_by_16=job["divisible_by_16"],
    )  # fmt: skip
    assert compiled.stage("ptx").count(".entry") == 1
