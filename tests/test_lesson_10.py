"""Lesson 10 (softmax): its kernels, its launchers, the measurements it shares, its records.

Running the whole lesson takes a while, so these tests lift its kernels and
launchers out of the script (by their source) into a small module and check
them against float64 and against the package.  The kernel the lesson calls the
package's must stay :func:`tilebook.ops.softmax.softmax_fwd_kernel`, and the
lesson and ``benchmarks/softmax.py`` must time through the one definition in
:mod:`tilebook.course.experiments.softmax`.
"""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
from pathlib import Path

import pytest
import torch
from exercise_blocks import exercise_text, run_blocks
from lesson_source import LessonSource

import tilebook
from tilebook.course.bench import RECORDS_DIR, load_record
from tilebook.course.experiments import softmax as experiment
from tilebook.ops import softmax as sm

ROOT = Path(__file__).parents[1]
SCRIPT = LessonSource(10)
LIFTED = [
    "softmax_row_kernel",
    "ROW_WARPS",
    "softmax_rows",
    "softmax_fwd_kernel",
    "softmax_tiles",
    "softmax_online_kernel",
    "softmax_online",
    "softmax_bwd_row_kernel",
    "softmax_backward_rows",
    "programs_per_sm",
]
H100 = {"sm_threads": 2048, "sm_registers": 65536, "sm_shared": 233472, "sm_programs": 32}


@pytest.fixture(scope="module")
def lesson(tmp_path_factory):
    """The lifted definitions as a module (an importable file, as Triton needs source)."""
    head = (
        "import torch\nimport triton\nimport triton.language as tl\n"
        "import tilebook.ops.softmax as sm\n\n"
    )
    return SCRIPT.lift(LIFTED, tmp_path_factory.mktemp("lesson10"), head)


def test_the_kernel_called_the_package_s_is_the_package_s():
    package = textwrap.dedent(inspect.getsource(sm.softmax_fwd_kernel.fn))
    package = package[package.index("@triton.jit") :]
    assert SCRIPT.source("softmax_fwd_kernel").strip() == package.strip()


def _awkward(n_rows: int, n_cols: int, device) -> torch.Tensor:
    x = torch.randn(n_rows, n_cols, device=device) * 4
    x[0] = -float("inf")
    x[1, ::3] = -float("inf")
    x[2, -1] = 30.0  # the maximum in the last chunk: the sum must be rescaled
    return x


def _close(out: torch.Tensor, ref: torch.Tensor) -> None:
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-6, equal_nan=True)


@pytest.mark.parametrize("n_cols", [1, 37, 128, 300])
def test_the_lesson_launchers_match_float64(lesson, device, n_cols):
    x = _awkward(5, n_cols, device) if n_cols > 2 else torch.randn(5, n_cols, device=device)
    ref = torch.softmax(x.double(), -1)
    _close(lesson.softmax_rows(x), ref)
    _close(lesson.softmax_online(x, 32), ref)
    cfg = sm.pick_config(n_cols)
    _close(lesson.softmax_tiles(x, cfg, 2), ref)
    y = tilebook.softmax(x).nan_to_num()
    dy = torch.randn_like(y)
    y64, dy64 = y.double(), dy.double()
    _close(lesson.softmax_backward_rows(y, dy), y64 * (dy64 - (y64 * dy64).sum(-1, True)))


def test_the_lesson_s_copy_computes_what_the_package_does(lesson, device):
    x = torch.randn(37, 1000, device=device)
    cfg = sm.pick_config(1000)
    # The same kernel under the same configuration: the same bits, looping or not.
    assert torch.equal(lesson.softmax_tiles(x, cfg), tilebook.softmax(x))
    assert torch.equal(lesson.softmax_tiles(x, cfg, 3), tilebook.softmax(x))


@pytest.mark.parametrize(
    ("registers", "shared", "warps", "expected"),
    [
        (64, 128, 8, (4, "registers")),  # 64 x 256 threads: 4 x 16384 registers
        (61, 128, 8, (4, "registers")),  # handed out as 64
        (65, 128, 8, (3, "registers")),  # handed out as 72
        (128, 64, 16, (1, "registers")),
        (32, 0, 16, (4, "threads")),  # 512 threads of 2048
        (16, 0, 1, (32, "program slots")),
        (32, 100_000, 4, (2, "shared memory")),  # plus the 1 KiB kept per program
    ],
)
def test_occupancy_arithmetic(lesson, registers, shared, warps, expected):
    assert lesson.programs_per_sm(registers, shared, warps, H100) == expected


def _calls(tree: ast.AST) -> set[str]:
    return {ast.unparse(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}


def test_lesson_and_benchmark_share_one_definition():
    lesson = _calls(SCRIPT.tree)
    for fn in ("xp.forward", "xp.backward", "xp.launches", "xp.binary"):
        assert fn in lesson, fn
    bench = ast.parse((ROOT / "benchmarks" / "softmax.py").read_text())
    (run,) = [n for n in bench.body if isinstance(n, ast.FunctionDef) and n.name == "run"]
    assert {"experiment.forward", "experiment.backward"} <= _calls(run)
    # Neither times softmax on its own.
    for calls in (lesson, _calls(run)):
        assert not {"measure", "measure_interleaved", "compare", "do_bench"} & calls


def test_experiment_arithmetic():
    assert experiment.shapes([256, 131072]) == [(2**19, 256), (2**10, 131072)]
    assert experiment.shapes([64], elements=100) == [(1, 64)]
    tile = sm.SoftmaxConfig(4, 2048, 16)
    assert experiment.programs(65536, tile, 132) == 16384
    assert experiment.programs(65536, sm.SoftmaxConfig(4, 2048, 16, ctas_per_sm=3), 132) == 396
    online = sm.SoftmaxConfig(1, 4096, 8, online=True, ctas_per_sm=6)
    assert experiment.programs(1024, online, 132) == 792
    assert experiment.programs(100, online, 132) == 100


def _record(name: str):
    rec = load_record(name, RECORDS_DIR)
    assert rec is not None, f"the record {name} is not committed"
    assert rec.provenance["mode"] == "gpu" and rec.provenance.get("copy_gbps")
    return rec


def _timed(rows: list[dict], passes: int) -> None:
    for r in rows:
        assert r["p20_ms"] <= r["median_ms"] <= r["p80_ms"]
        assert r["rows"] * r["n"] == experiment.ELEMENTS
        assert r["bytes"] == passes * experiment.ELEMENTS * 2  # bfloat16
        assert r["dtype"] == "bfloat16"


def test_forward_record_is_the_lesson_s_grid():
    rec = _record("lesson10_forward")
    widths = SCRIPT.constant("WIDTHS")
    assert rec.values("n") == widths
    fits = sm.ONLINE_THRESHOLD
    for n in widths:
        mine = ["one row a program", "online always"] if n <= fits else ["single pass always"]
        assert rec.values("impl", n=n) == ["tilebook", "torch", "torch.compile", *mine]
    _timed(rec.rows, 2)


def test_backward_record():
    rec = _record("lesson10_backward")
    assert rec.values("n") == [SCRIPT.constant("WIDTHS")[1], sm.ONLINE_THRESHOLD]
    for n in rec.values("n"):
        assert rec.values("impl", n=n) == ["tilebook", "torch", "torch.compile"]
    _timed(rec.rows, 3)


def test_binaries_record_matches_the_configurations(lesson):
    rec = _record("lesson10_binaries")
    fits, long = sm.ONLINE_THRESHOLD, SCRIPT.constant("WIDTHS")[-1]
    assert rec.one(impl="one row a program", n=fits)["num_warps"] == SCRIPT.constant("ROW_WARPS")
    assert rec.one(impl="single pass always", n=long)["num_warps"] == 32
    for r in rec.select(impl="tilebook"):
        assert r["num_warps"] == sm.pick_config(r["n"]).num_warps
    for r in rec.rows:
        assert 0 < r["registers"] <= 255 and r["spills"] >= 0 and r["shared_bytes"] >= 0
        fit, _ = lesson.programs_per_sm(r["registers"], r["shared_bytes"], r["num_warps"], r)
        assert 1 <= fit <= r["sm_programs"]


def test_launches_record_sizes_its_grids_from_the_binaries(lesson):
    rec = _record("lesson10_launches")
    bins = _record("lesson10_binaries")
    sms = rec.provenance["sm_count"]
    _timed(rec.rows, 2)
    for r in rec.rows:
        cfg = sm.SoftmaxConfig(
            r["block_m"], r["block_n"], r["num_warps"], 1, r["online"], r["ctas_per_sm"], r["evict"]
        )
        assert r["programs"] == experiment.programs(r["rows"], cfg, sms)
        if r["impl"] == "persistent":
            b = bins.one(impl="tilebook", n=r["n"])
            fit, _ = lesson.programs_per_sm(b["registers"], b["shared_bytes"], b["num_warps"], b)
            assert r["ctas_per_sm"] == fit
        else:
            assert r["ctas_per_sm"] is None


@pytest.mark.gpu
def test_experiments_run_on_a_gpu():
    timing = {"rounds": 1, "warmup": 1, "rep": 5}
    shapes = [(64, 256), (8, 40000)]
    rows = experiment.forward(shapes, with_compile=False, **timing)
    assert [(r["n"], r["impl"]) for r in rows] == [
        (256, "tilebook"),
        (256, "torch"),
        (40000, "tilebook"),
        (40000, "torch"),
    ]
    rows = experiment.backward(shapes, with_compile=False, **timing)
    assert all(r["gbps"] > 0 and r["bytes"] == 3 * r["rows"] * r["n"] * 2 for r in rows)
    cfg = sm.pick_config(256)
    configs = {"tile": cfg, "persistent": sm.SoftmaxConfig(cfg.block_m, 256, 4, ctas_per_sm=1)}
    rows = experiment.launches((4096, 256), configs, **timing)
    assert [r["programs"] for r in rows] == [4096 // cfg.block_m, experiment.sm_limits()["sms"]]
    facts = experiment.resources(experiment.binary(cfg, 256))
    assert facts["num_warps"] == cfg.num_warps and facts["registers"] > 0


# ----------------------------------------------------------------------------- exercises

ROW_KERNEL = ("    e = tl.exp(x - tl.max(x, axis=0))\n", "    y = e / tl.sum(e, axis=0)\n")


def _said(number: int) -> str:
    return " ".join(exercise_text(SCRIPT.text, number).split())


def _inline(text: str) -> list[str]:
    return re.findall(r"``(.+?)``", text)


def _exercise_module(path: Path, *extra: str, change: tuple[str, str] = ("", "")):
    """The lesson's kernels, launchers and ``awkward`` input (with ``change`` made), then
    ``extra`` code."""
    head = (
        "import torch\nimport triton\nimport triton.language as tl\n"
        "import tilebook\nimport tilebook.ops.softmax as sm\n"
        "from tilebook.course.exercises import check\n\n"
        "DEVICE = tilebook.device()\nROWS, COLS = 37, 1000\n\n"
    )
    names = ["softmax_row_kernel", "ROW_WARPS", "softmax_rows", "softmax_online_kernel"]
    names += ["softmax_online", "CHUNK", "awkward"]
    body = "\n\n".join(SCRIPT.source(name) for name in names)
    assert change[0] in body
    body = body.replace(*change)
    return run_blocks(path, head + body, "cases = [(awkward(torch.float32),)]", *extra)


def _check_line(number: int) -> str:
    """The exercise's checking line, as its text gives it."""
    (line,) = [c for c in _inline(_said(number)) if c.startswith("check(")]
    return f"print({line})"


def test_the_exercises_cases_are_the_lesson_s():
    intro = " ".join(SCRIPT.text[SCRIPT.text.index("# Try this") :].split("# 1. ")[0].split())
    assert "``cases = [(awkward(torch.float32),)]``" in intro


def test_exercise_1_the_checker_names_the_rows_a_skipped_rescale_breaks(tmp_path):
    rescale = "s = s * tl.exp(m - shift) + tl.sum"
    assert "``s = s * tl.exp(m - shift) + …``" in _said(1)
    right = _exercise_module(tmp_path / "ex1_right.py", _check_line(1))
    (verdict,) = right.PRINTED
    assert verdict.ok, str(verdict)
    skip = (rescale, "s = s + tl.sum")
    mod = _exercise_module(tmp_path / "ex1_skip.py", _check_line(1), change=skip)
    (verdict,) = mod.PRINTED
    ((_, wrong),) = verdict.findings
    assert wrong.kind == "wrong" and " in rows " in wrong.message, str(verdict)
    got, expected = re.search(r"got (\S+), expected (\S+)\.", wrong.message).groups()
    assert float(got) < float(expected)  # too small, as the solution says
    # The rows that go wrong are those whose maximum is not in the first chunk.
    x = mod.cases[0][0]
    out = mod.softmax_online(x, mod.CHUNK).double()
    ref = torch.softmax(x.double(), -1)
    bad = ~torch.isclose(out, ref, rtol=1e-4, atol=1e-7).all(1)
    late = x[:, : mod.CHUNK].amax(1) < x.amax(1)
    assert torch.equal(bad[1:], late[1:]) and late[3]  # row 0 is all -inf: NaN in both
    first = late[1:].nonzero()[0].item() + 1
    assert wrong.message.split(" in rows ")[1].startswith(str(first))


def test_exercise_2_log_softmax_solution_passes_its_check(tmp_path):
    z, y = (c for c in _inline(_said(2)) if c.startswith(("z = ", "y = ")))
    kernel = SCRIPT.source("softmax_row_kernel").replace("softmax_row_kernel", "log_softmax_kernel")
    assert all(line in kernel for line in ROW_KERNEL)
    kernel = kernel.replace(ROW_KERNEL[0], f"    {z}\n").replace(ROW_KERNEL[1], f"    {y}\n")
    mod = _exercise_module(tmp_path / "ex2.py", kernel, _check_line(2))
    (verdict,) = mod.PRINTED
    assert verdict.ok, str(verdict)


def test_exercise_3_temperature_solution_passes_its_check(tmp_path):
    (load,) = [c for c in _inline(_said(3)) if c.startswith("x = x.to(")]
    kernel = SCRIPT.source("softmax_row_kernel").replace("softmax_row_kernel", "softmax_t_kernel")
    kernel = kernel.replace("stride_y, BLOCK_N", "stride_y, inv_t, BLOCK_N")
    assert kernel.count("    x = x.to(tl.float32)\n") == 1
    kernel = kernel.replace("    x = x.to(tl.float32)\n", f"    {load}\n")
    mod = _exercise_module(tmp_path / "ex3.py", kernel, _check_line(3))
    (verdict,) = mod.PRINTED
    assert verdict.ok, str(verdict)
    # Without the multiplication the same check fails, on every row with two values.
    plain = kernel.replace(f"    {load}\n", "    x = x.to(tl.float32)\n")
    mod = _exercise_module(tmp_path / "ex3_plain.py", plain, _check_line(3))
    (verdict,) = mod.PRINTED
    assert verdict.kinds() == {"wrong"}, str(verdict)


def test_the_backward_prose_matches_the_package():
    # The page says that at the longest register-resident row the backward reads
    # y and dy twice (reload) and that shorter rows keep them in registers.
    text = SCRIPT.text
    assert "keeps in registers, where its backward reads ``y`` and ``dy`` twice" in text
    assert sm.pick_config(sm.ONLINE_THRESHOLD, backward=True).reload
    assert not sm.pick_config(2048, backward=True).reload


def test_the_page_s_claims_and_sentences_on_the_committed_records():
    """The GPU build's branch, on the committed H200 records: every claim of the page
    holds, each sentence is made, and a claim fails on data that contradicts it."""
    from tilebook.course.claims import ClaimError, Claims

    fwd, bwd, bins, runs = (
        _record(f"lesson10_{n}") for n in ("forward", "backward", "binaries", "launches")
    )
    widths, row_warps = SCRIPT.constant("WIDTHS"), SCRIPT.constant("ROW_WARPS")
    short, mid, long, fits = widths[0], widths[1], widths[-1], sm.ONLINE_THRESHOLD
    one_row, online, single = "one row a program", "online always", "single pass always"
    for rec, said in [
        (fwd, experiment.launch_claims(fwd, short, fits, row_warps, one_row)),
        (bins, experiment.spill_claims(bins, one_row, single, fits, long)),
        (fwd, experiment.online_claims(fwd, (short, mid, long), fits, online, single)),
        (bwd, experiment.backward_claims(bwd, (mid, fits))),
        (fwd, experiment.versus_claims(fwd, widths, (mid, fits))),
    ]:
        assert Claims("10", rec).check_all(said).ok
    one_pass = [n for n in widths if n <= fits]
    text = " ".join(str(experiment.say_launch(fwd, one_pass, row_warps, one_row)).split())
    assert text.startswith(f"Against the kernel above (one row a program on {row_warps} warps)")
    assert "the copy bandwidth" in str(experiment.say_forward(fwd))
    said = " ".join(
        str(
            experiment.say_launches(runs, "persistent", "no eviction hint", "a program a tile")
        ).split()
    )
    assert re.search(r"The persistent grid runs (faster than|slower than|level with) the", said)
    assert experiment.binaries_table(bins).column("kernel") == [r["impl"] for r in bins.rows]
    assert experiment.explorer_setup(fwd, ["tilebook"])["ceiling"] == fwd.provenance["copy_gbps"]

    r = bins.one(impl="tilebook", n=fits)
    r["spills"] = 4  # the package's launch spilling: the claim must fail
    with pytest.raises(ClaimError, match="on the package's warps does not spill"):
        Claims("10", bins).check_all(experiment.spill_claims(bins, one_row, single, fits, long))
    torch_row = fwd.one(kernel="forward", n=mid, impl="torch")
    torch_row.update(median_ms=1e-6, p20_ms=1e-6, p80_ms=1e-6)  # torch far faster at mid
    with pytest.raises(ClaimError, match=r"faster than torch\.softmax at every row length"):
        Claims("10", fwd).check_all(experiment.versus_claims(fwd, widths, (mid, fits)))
