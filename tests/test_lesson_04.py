"""Lesson 04 (pointers, masks and strides): its kernels, its exercises, and its experiment.

Running the whole lesson takes a while, so these tests lift its kernels and
launchers out of the script (by their source) into a small module and check
them: against float64, against the measured kernels of
:mod:`tilebook.course.experiments.memory_access` (the lesson's copies must stay the
same kernels), and the claims its prose makes about them (a missing mask reads
the neighbour and writes past the end; a descriptor refuses a transposed
view).  The block pointer kernel runs where the installed Triton has block
pointers (3.9 removed them); the lesson run with block pointers taken away must
still check and compile its descriptor.  The exercises' solutions are taken from
the lesson's text and run through :mod:`tilebook.course.exercises`, so that a solution
that stops being right fails here.  The experiment's functions run under the
interpreter with a stand-in timer, so that the rows the lesson reads are checked
on any machine.
"""

from __future__ import annotations

import ast
import inspect
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from lesson_source import LessonSource, write_module

import tilebook
from tilebook.course.bench import RECORDS_DIR, load_record
from tilebook.course.exercises import check, check_elementwise
from tilebook.course.experiments import memory_access as experiment

SCRIPT = LessonSource(4)
LIFTED = [
    "load_block_kernel",
    "strided_copy_kernel",
    "strided_copy",
    "scale_2d_kernel",
    "scale_2d",
    "scale_block_ptr_kernel",
    "scale_descriptor_kernel",
    "scale_descriptor",
]
HEAD = (
    "import torch\nimport triton\nimport triton.language as tl\n"
    "from triton.tools.tensor_descriptor import TensorDescriptor\n\n"
)


BLOCK_POINTERS_ONLY = pytest.mark.skipif(
    not tilebook.has_block_pointers(), reason="this Triton has no block pointers (3.9 on)"
)


def _guarded(name: str) -> ast.stmt:
    """The definition of ``name`` that the lesson makes under ``if BLOCK_POINTERS:``."""
    found = [
        n
        for guard in SCRIPT.tree.body
        if isinstance(guard, ast.If) and ast.unparse(guard.test) == "BLOCK_POINTERS"
        for n in guard.body
        if getattr(n, "name", None) == name
    ]
    assert len(found) == 1, f"lesson 04 defines {name!r} {len(found)} times under its guard"
    return found[0]


def _source(name: str) -> str:
    """A top-level definition's source, or a guarded one's, dedented."""
    if SCRIPT.nodes(name):
        return SCRIPT.source(name)
    return textwrap.dedent(SCRIPT.segment(_guarded(name)))


@pytest.fixture(scope="module")
def lesson(tmp_path_factory):
    """The lifted definitions as a module (an importable file, as Triton needs source)."""
    return SCRIPT.lift(LIFTED, tmp_path_factory.mktemp("lesson04"), HEAD, source=_source)


def test_the_block_pointer_kernel_is_defined_only_where_triton_has_them():
    (node,) = SCRIPT.nodes("BLOCK_POINTERS")
    assert ast.unparse(node.value) == "tilebook.has_block_pointers()"
    assert not SCRIPT.nodes("scale_block_ptr_kernel")
    assert _guarded("scale_block_ptr_kernel")


def _body(fn_source: str) -> list[str]:
    (node,) = ast.parse(textwrap.dedent(fn_source)).body
    return [ast.dump(node.args), *(ast.unparse(s) for s in node.body)]


@pytest.mark.parametrize("name", ["strided_copy_kernel", "scale_2d_kernel"])
def test_the_lesson_kernels_are_the_measured_kernels(name):
    package = textwrap.dedent(inspect.getsource(getattr(experiment, name).fn))
    package = package[package.index("def ") :]
    assert _body(SCRIPT.source(name)) == _body(package)


def test_the_launchers_match_float64_on_views(lesson, device):
    for stride in (1, 3, 16):
        x = torch.randn(1000 * stride, device=device)[::stride]
        assert torch.equal(lesson.strided_copy(x), x)
        assert torch.equal(experiment.strided_copy(x), x)
    for name, v in experiment.view_inputs(37, 70).items():
        ref = 2.5 * v.double()
        for out in (lesson.scale_2d(v, 2.5), experiment.scale_2d(v, 2.5)):
            torch.testing.assert_close(out.double(), ref, rtol=1e-6, atol=1e-6, msg=name)
    x = torch.randn(40, 72, device=device)  # rows of 16-byte multiples, as a descriptor needs
    torch.testing.assert_close(lesson.scale_descriptor(x, 2.5).double(), 2.5 * x.double())


# Triton 3.8 deprecates tl.make_block_ptr (the lesson says so and silences it too).
@BLOCK_POINTERS_ONLY
@pytest.mark.filterwarnings("ignore:tl.make_block_ptr is deprecated")
def test_the_block_pointer_kernel_matches_float64_on_views(lesson):
    for name, v in experiment.view_inputs(37, 70).items():
        out = lesson.scale_2d(v, 2.5, lesson.scale_block_ptr_kernel)
        torch.testing.assert_close(out.double(), 2.5 * v.double(), rtol=1e-6, atol=1e-6, msg=name)


@pytest.mark.skipif(tilebook.has_block_pointers(), reason="this Triton has block pointers")
def test_a_triton_without_block_pointers_refuses_them(lesson):
    """What tilebook.has_block_pointers says of this Triton is what Triton does."""
    x = experiment.view_inputs(37, 70)["contiguous"]
    with pytest.raises(Exception, match="Block pointers have been removed"):
        lesson.scale_2d(x, 2.5, lesson.scale_block_ptr_kernel)


# The lesson run as a script, with block pointers taken away as Triton 3.9 takes them.
WITHOUT_BLOCK_POINTERS = """
import json, runpy, sys
import tilebook
import triton.language as tl


def removed(*args, **kwargs):
    raise NotImplementedError("Block pointers have been removed (by this test)")


tilebook.has_block_pointers = lambda: False
tl.make_block_ptr = tl.advance = removed
page = runpy.run_path(sys.argv[1], run_name="__main__")
seen, ways, code = page["seen"], page["ways"], page["code"]
print("RESULT=" + json.dumps({
    "defined": "scale_block_ptr_kernel" in page,
    "compiled": list(seen),
    "descriptor": seen["descriptor"],
    "checked": [r.case for r in ways.rows],
    "claims": [(c.text, c.holds) for c in code.items],
}))
"""


def test_without_block_pointers_the_lesson_keeps_its_descriptor_rows(tmp_path):
    driver = tmp_path / "without_block_pointers.py"
    driver.write_text(WITHOUT_BLOCK_POINTERS)
    src = str(Path(__file__).parents[1] / "src")
    env = {
        **os.environ,
        "TILEBOOK_MODE": "cpu",
        "MPLBACKEND": "Agg",
        "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(
        [sys.executable, str(driver), str(SCRIPT.path)],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=900, check=False,
    )  # fmt: skip
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT=")), None)
    assert proc.returncode == 0 and line, proc.stdout[-2000:] + proc.stderr[-3000:]
    result = json.loads(line.removeprefix("RESULT="))
    assert not result["defined"]
    assert result["compiled"] == [*experiment.VIEWS, "strides unknown", "descriptor"]
    assert result["descriptor"]["UTMALDG"] > 0 and result["descriptor"]["LDG"] == 0
    assert result["checked"] == ["descriptor, contiguous"]
    claims = dict(result["claims"])
    assert all(claims.values()) and len(claims) == 5, claims
    assert not [c for c in claims if "block pointer" in c], claims


def test_a_missing_mask_reads_the_neighbour_and_writes_past_the_end(lesson, device):
    """What the lesson prints, inside one allocation as the lesson does it."""
    block, n = 8, 5
    memory = torch.cat([torch.arange(1.0, n + 1), torch.full((block,), -999.0)]).to(device)
    x = memory[:n]
    out = torch.zeros(block, device=device)
    lesson.load_block_kernel[(1,)](x, out, n, BLOCK=block, MASKED=True)
    assert out.tolist() == [1, 2, 3, 4, 5, -1, -1, -1]
    lesson.load_block_kernel[(1,)](x, out, n, BLOCK=block, MASKED=False)
    assert out.tolist() == [1, 2, 3, 4, 5, -999, -999, -999]  # the neighbour's poison
    out_memory = torch.zeros(n + block, device=device)
    lesson.load_block_kernel[(1,)](x, out_memory[:n], n, BLOCK=block, MASKED=True)
    assert out_memory[n:].tolist() == [-1, -1, -1, 0, 0, 0, 0, 0]


def test_descriptors_refuse_what_the_copy_engine_cannot_read():
    from triton.tools.tensor_descriptor import TensorDescriptor

    refused = {}
    for name, v in experiment.view_inputs(40, 72).items():
        try:
            TensorDescriptor(v, list(v.shape), list(v.stride()), [64, 64])
        except AssertionError as exc:
            refused[name] = str(exc)
    assert set(refused) == {"transposed", "column slice"}
    assert "aligned" in refused["column slice"]


# ----------------------------------------------------------------------------- exercises


def _exercises() -> dict[int, list[str]]:
    """The code blocks of each "Try this" exercise, in order, as runnable text."""
    text = SCRIPT.text[SCRIPT.text.index("# Try this") :]
    lines = [re.sub(r"^# ?", "", line) for line in text.splitlines()]
    found: dict[int, list[str]] = {}
    number, block, indent = None, None, 0
    for line in [*lines, "end"]:
        if block is not None:
            if line.strip() and len(line) - len(line.lstrip()) <= indent:
                found[number].append(textwrap.dedent("\n".join(block)))
                block = None
            else:
                block.append(line)
                continue
        m = re.match(r"^(\d+)\. ", line)
        if m:
            number = int(m.group(1))
            found[number] = []
        if line.strip() == ".. code-block:: python":
            block, indent = [], len(line) - len(line.lstrip())
    return found


# Shapes with rows of 16-byte multiples (float32), ragged against 64 x 64 tiles.
RAGGED = [(72, 40), (130, 68), (64, 4)]
EXERCISE_HEAD = HEAD + (
    "import tilebook\nfrom tilebook.course.exercises import check\n\n"
    "DEVICE = tilebook.device()\nALPHA = 2.5\nPRINTED = []\n\n\n"
    "def print(*args, **kwargs):\n    PRINTED.extend(args)\n\n\n"
)


@pytest.fixture(scope="module")
def blocks():
    return _exercises()


def _exercise(path: Path, *code: str):
    """The exercise's code as a module, after the lesson's names it may use."""
    return write_module(
        path, EXERCISE_HEAD + SCRIPT.source("scale_2d_kernel") + "\n\n\n" + "\n".join(code)
    )


def test_exercise_1_flip_passes_the_checker(blocks, tmp_path):
    (solution,) = blocks[1]
    mod = _exercise(tmp_path / "ex1.py", solution)
    verdict = check_elementwise(mod.my_flip, lambda x: x.flip(0), inputs=1, block=1024)
    assert verdict.ok, str(verdict)


def test_exercise_2_transpose_passes_the_checker(blocks, tmp_path):
    checking, solution = blocks[2]
    mod = _exercise(tmp_path / "ex2.py", solution, checking)
    (verdict,) = mod.PRINTED
    assert verdict.ok, str(verdict)


def test_exercise_3_the_checker_finds_the_missing_row_mask(tmp_path, lesson):
    """The answer the lesson gives: writes past the end, and only for ragged M."""
    kernel = SCRIPT.source("scale_2d_kernel")
    assert "(rows[:, None] < M) & " in kernel
    broken = kernel.replace("(rows[:, None] < M) & ", "")
    mod = write_module(
        tmp_path / "ex3.py", HEAD + broken + "\n\n\n" + SCRIPT.source("scale_2d") + "\n"
    )

    def my_scale(x, out):
        m, n = x.shape
        grid = (-(-m // 64), -(-n // 64))
        mod.scale_2d_kernel[grid](
            x, out, m, n, *x.stride(), *out.stride(), 2.5, BLOCK_M=64, BLOCK_N=64
        )

    dev = tilebook.device()
    ragged = {"70x40": (torch.randn(70, 40, device=dev),)}
    verdict = check(my_scale, lambda x: 2.5 * x, ragged, block=(64, 64))
    assert not verdict.ok and "outside" in verdict.kinds(), str(verdict)
    even = {"64x40": (torch.randn(64, 40, device=dev),)}
    verdict = check(my_scale, lambda x: 2.5 * x, even, block=(64, 64))
    assert verdict.ok, str(verdict)


def test_exercise_5_in_kernel_descriptors_pass_the_checker(blocks, tmp_path):
    (solution,) = blocks[5]
    if tilebook.is_gpu():
        import triton

        triton.set_allocator(
            lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda")
        )
    mod = _exercise(tmp_path / "ex5.py", solution)
    cases = {f"{m}x{n}": (torch.randn(m, n, device=tilebook.device()),) for m, n in RAGGED}
    verdict = check(mod.my_scale, lambda x: 2.5 * x, cases, block=(64, 64))
    assert verdict.ok, str(verdict)


def test_exercise_5_kernel_compiles_for_hopper(blocks, tmp_path):
    """The interpreter accepts what the compiler refuses: compile the solution for sm_90."""
    from tilebook.course.aot import compile_kernel

    (solution,) = blocks[5]
    mod = write_module(tmp_path / "ex5_aot.py", HEAD + solution.split("def my_scale")[0])
    sig = {"x_ptr": "*fp32", "out_ptr": "*fp32", "M": "i32", "N": "i32", "sxm": "i32"}
    sig.update(som="i32", alpha="fp32")
    k = compile_kernel(mod.scale_tma_kernel, sig, {"BLOCK_M": 64, "BLOCK_N": 64}, arch=90)
    assert k.instructions("UTMALDG")["UTMALDG"] > 0


def test_exercise_4_answer_is_the_model_s():
    """int8 at 32, float16 at 16, float32 at 8, float64 at 4: as the solution says."""
    for itemsize, stride in ((1, 32), (2, 16), (4, 8), (8, 4)):
        at = experiment.warp_access(stride, itemsize)
        before = experiment.warp_access(stride // 2, itemsize)
        assert at.sectors == experiment.WARP_SIZE
        assert at.efficiency == itemsize / experiment.SECTOR_BYTES
        assert before.sectors < experiment.WARP_SIZE


# ----------------------------------------------------------------------------- the experiment


def test_lesson_measures_through_the_experiment():
    calls = {ast.unparse(n.func) for n in ast.walk(SCRIPT.tree) if isinstance(n, ast.Call)}
    assert "experiment.strides" in calls and "experiment.views" in calls
    assert not {"measure", "measure_interleaved", "compare", "do_bench"} & calls


def _stand_in_compare(impls, *, bytes_moved=None, **fields):
    """Times nothing: runs each function once and reports a made-up, consistent time."""
    rows = []
    for i, (name, fn) in enumerate(impls.items()):
        fn()
        t = 1.0 + i
        timing = {"median_ms": t, "p20_ms": t, "p80_ms": t}
        rows.append({**fields, "impl": name, **timing, "bytes": bytes_moved, "gbps": 1 / t})
    return rows


def test_strides_rows_under_the_interpreter(monkeypatch, lesson):
    monkeypatch.setattr(experiment, "compare", _stand_in_compare)
    rows = experiment.strides((1, 2, 16), n=1040, kernel=lesson.strided_copy_kernel)
    assert [r["stride"] for r in rows] == [1, 2, 16]
    assert all(r["n"] == 1040 and r["dtype"] == "float32" and r["itemsize"] == 4 for r in rows)
    assert all(r["bytes"] == 2 * 1040 * 4 for r in rows)


def test_views_rows_under_the_interpreter(monkeypatch, lesson):
    monkeypatch.setattr(experiment, "compare", _stand_in_compare)
    rows = experiment.views((40, 72), kernel=lesson.scale_2d_kernel)
    assert [(r["view"], r["impl"]) for r in rows] == [
        (v, i) for v in experiment.VIEWS for i in ("kernel", "torch.mul")
    ]


WRONG_COPY = """
@triton.jit
def copy_ignoring_stride(x_ptr, out_ptr, n, stride, BLOCK_SIZE: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask), mask=mask)
"""


def test_the_experiment_refuses_a_wrong_kernel(monkeypatch, tmp_path):
    monkeypatch.setattr(experiment, "compare", _stand_in_compare)
    wrong = write_module(tmp_path / "wrong_copy.py", HEAD + WRONG_COPY)
    with pytest.raises(AssertionError, match="stride 2"):
        experiment.strides((1, 2), n=64, kernel=wrong.copy_ignoring_stride)


def test_committed_records_are_the_experiment_s_grids():
    """Once the GPU build has recorded them, the records hold what the lesson reads."""
    strides = load_record("lesson04_strides", RECORDS_DIR)
    views = load_record("lesson04_views", RECORDS_DIR)
    if strides is None and views is None:
        return  # not recorded yet: the lesson says so in text (checked by its CPU run)
    assert strides is not None and views is not None
    assert strides.values("stride") == list(experiment.STRIDES)
    assert set(strides.values("dtype")) == {"float32"}
    assert views.values("view") == list(experiment.VIEWS)
    assert views.values("impl") == ["kernel", "torch.mul"]
    for r in strides.rows + views.rows:
        assert r["p20_ms"] <= r["median_ms"] <= r["p80_ms"]
        assert "copy_gbps" in strides.provenance and "copy_gbps" in views.provenance


@pytest.mark.gpu
def test_experiments_run_on_a_gpu():
    rows = experiment.strides((1, 8), n=2**16, rounds=1, warmup=1, rep=5)
    assert [r["stride"] for r in rows] == [1, 8] and all(r["gbps"] > 0 for r in rows)
    rows = experiment.views((256, 320), rounds=1, warmup=1, rep=5)
    assert len(rows) == 2 * len(experiment.VIEWS)


def test_claims_on_compiled_code_say_where_it_was_compiled():
    """The lesson's compiled-code claims name their source with a string."""
    from tilebook.course.claims import Claims

    claims = Claims("04", "compiled ahead of time for sm_90 by Triton x")
    claims.check("a claim that holds", True, "evidence")
    assert "compiled ahead of time for sm_90 by Triton x" in repr(claims)
    assert "compiled ahead of time" in claims._repr_html_()


def test_claims_in_one_compact_form_are_checked_like_single_claims():
    """The lessons' table of claims (Claims.check_all) stops on a contradicted claim, and
    reads no data where there is none (a function of the data is not called)."""
    from tilebook.course.claims import ClaimError, Claims, all_faster, speedup

    fast = {"median_ms": 1.0, "p20_ms": 0.9, "p80_ms": 1.1}
    slow = {"median_ms": 2.0, "p20_ms": 1.9, "p80_ms": 2.1}
    shown = Claims("04", "data").check_all(
        {"holds": True, "with evidence": (True, "seen"), "later": lambda: (True, "x")}
    )
    assert [(c.text, c.holds, c.evidence) for c in shown.items] == [
        ("holds", True, ""), ("with evidence", True, "seen"), ("later", True, "x"),
    ]  # fmt: skip
    with pytest.raises(ClaimError, match="'wrong'"):
        Claims("04", "data").check_all({"right": True, "wrong": False})
    unread = Claims("04", None).check_all({"needs data": lambda: 1 / 0})
    assert [c.holds for c in unread.items] == [None]
    holds, evidence = all_faster({("a", "b"): speedup(fast, slow)})
    assert holds and "a runs 2.000x the speed of b" in evidence
    assert not all_faster({("a", "b"): speedup(slow, fast)})[0]
    assert not all_faster({})[0]


def test_a_lesson_s_own_timer_times_the_interleaved_rounds(monkeypatch):
    """The lessons pass their do_bench call as ``timer``: each round calls it once per
    function, in turn, and its medians make the rows (a stand-in timer, on any machine)."""
    from tilebook.course import bench

    monkeypatch.setattr(bench.runtime, "is_gpu", lambda: True)
    calls, times = [], {"a": iter([3.0, 1.0, 2.0]), "b": iter([[5.0, 4.0, 6.0]] * 3)}
    fns = {"a": lambda: "a", "b": lambda: "b"}

    def timer(fn):
        calls.append(fn())
        return next(times[fn()])

    rows = bench.compare(fns, rounds=3, bytes_moved=2_000_000, timer=timer)
    assert calls == ["a", "b"] * 3
    assert [(r["impl"], r["median_ms"]) for r in rows] == [("a", 2.0), ("b", 5.0)]
    assert rows[0]["gbps"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="positive time"):
        bench.compare({"a": fns["a"]}, rounds=1, timer=lambda fn: float("nan"))
