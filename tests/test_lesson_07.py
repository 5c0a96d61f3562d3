"""Lesson 07 (vector_add): its kernels, its launchers, and the measurement it shares.

Running the whole lesson takes a while, so these tests lift its kernels and
launchers out of the script (by their source) into a small module and check
them against float64 and against the package.  The lesson's last kernel must
stay the package's :func:`tilebook.ops.vector_add.add_kernel`, its first one
the same kernel without the 64-bit flag, and the lesson and
``benchmarks/vector_add.py`` must time through the one definition in
:mod:`tilebook.course.experiments.vector_add`.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from pathlib import Path

import pytest
import torch
from exercise_blocks import exercise_blocks, exercise_text, run_blocks
from lesson_source import LessonSource

import tilebook
from tilebook.course.bench import RECORDS_DIR, load_record
from tilebook.course.exercises import SIZES, check_elementwise
from tilebook.course.experiments import vector_add as experiment
from tilebook.ops import vector_add as va

ROOT = Path(__file__).parents[1]
SCRIPT = LessonSource(7)
LIFTED = ["plain_add_kernel", "add", "add_kernel", "vector_add"]


@pytest.fixture(scope="module")
def lesson(tmp_path_factory):
    """The lifted definitions as a module (an importable file, as Triton needs source)."""
    head = (
        "import torch\nimport triton\nimport triton.language as tl\n"
        "from tilebook.ops.vector_add import DEFAULT_CONFIG\n\n"
    )
    # after add_kernel, the lesson's one-config autotuner, as the lesson builds it
    at = LIFTED.index("add_kernel") + 1
    names = [*LIFTED[:at], "tuned_add_kernel", *LIFTED[at:]]
    return SCRIPT.lift(names, tmp_path_factory.mktemp("lesson07"), head)


def test_the_final_kernel_is_the_package_kernel():
    package = textwrap.dedent(inspect.getsource(va.add_kernel.fn))
    package = package[package.index("@triton.jit") :]
    assert SCRIPT.source("add_kernel").strip() == package.strip()


def test_the_teaching_kernel_is_the_final_one_without_the_64_bit_flag():
    plain = SCRIPT.body("plain_add_kernel")
    final = SCRIPT.body("add_kernel")
    flag = [s for s in final if s.startswith("if INT64_OFFSETS")]
    assert len(flag) == 1
    assert [s for s in final if s not in flag] == plain


@pytest.mark.parametrize("n", [1, 97, 1000, 4097])
def test_the_lesson_launchers_match_float64(lesson, device, n):
    x = torch.randn(n, device=device)
    y = torch.randn(n, device=device)
    ref = x.double() + y.double()
    for out in (lesson.add(x, y), lesson.add(x, y, block_size=256, num_warps=2)):
        torch.testing.assert_close(out.double(), ref, rtol=1e-6, atol=1e-6)
    assert torch.equal(lesson.vector_add(x, y), tilebook.vector_add(x, y))


def test_64_bit_offsets_compute_the_same(lesson, device):
    import triton

    x = torch.randn(3001, device=device)
    y = torch.randn(3001, device=device)
    out = torch.full_like(x, float("nan"))
    grid = (triton.cdiv(3001, 1024),)
    lesson.add_kernel[grid](x, y, out, 3001, BLOCK_SIZE=1024, INT64_OFFSETS=True)
    assert torch.equal(out, lesson.add(x, y))


class _Recorder:
    """Stands in for an autotuned kernel: notes the INT64_OFFSETS each launch asks for."""

    def __init__(self):
        self.flags = []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.flags.append(kwargs["INT64_OFFSETS"])


def test_64_bit_offsets_from_the_same_size_as_the_package(lesson, monkeypatch):
    """Both launchers switch where the last program's offsets could pass 2**31 - 1.

    Meta tensors stand in for the 8 GiB vectors: the launchers read only sizes.
    """
    block = va.DEFAULT_CONFIG.kwargs["BLOCK_SIZE"]
    ours, package = _Recorder(), _Recorder()
    monkeypatch.setattr(lesson, "tuned_add_kernel", ours)
    monkeypatch.setattr(va, "_tuned_add_kernel", package)
    for n in (2**31 - block - 1, 2**31 - block, 2**31 + 5):
        x = torch.empty(n, device="meta")
        lesson.vector_add(x, x)
        va.launch_add(x, x, torch.empty_like(x))
    assert ours.flags == package.flags == [False, True, True]


def _calls(tree: ast.AST) -> set[str]:
    return {
        ast.unparse(n.func) if not isinstance(n.func, ast.Name) else n.func.id
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
    } | {ast.unparse(n) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}


def test_lesson_and_benchmark_share_one_definition():
    lesson = _calls(SCRIPT.tree)
    bench = _calls(ast.parse((ROOT / "benchmarks" / "vector_add.py").read_text()))
    for fn in ("experiment.sizes", "experiment.launch_settings"):
        assert fn in lesson, fn
        assert fn in bench, fn
    # Neither times vector_add on its own.
    for calls in (lesson, bench):
        assert not {"measure", "measure_interleaved", "bench.measure"} & calls


def test_committed_records_are_the_experiment_s_grids():
    sizes = load_record("lesson07_sizes", RECORDS_DIR)
    launch = load_record("lesson07_launch", RECORDS_DIR)
    assert sizes is not None and launch is not None
    assert sizes.values("log2n") == list(experiment.EXPONENTS)
    assert sizes.values("impl") == ["tilebook", "torch.add"]
    assert launch.values("BLOCK_SIZE") == list(experiment.BLOCKS)
    assert launch.values("num_warps") == list(experiment.WARPS)
    for r in launch.rows:
        assert r["setting"] == experiment.setting(r["BLOCK_SIZE"], r["num_warps"])
        assert r["elements_per_thread"] == experiment.elements_per_thread(
            r["BLOCK_SIZE"], r["num_warps"]
        )
        assert r["p20_ms"] <= r["median_ms"] <= r["p80_ms"]
    # The widget starts at the package's setting, so the sweep must hold it.
    cfg = va.DEFAULT_CONFIG
    launch.one(BLOCK_SIZE=cfg.kwargs["BLOCK_SIZE"], num_warps=cfg.num_warps)
    # A record from before the host/GPU split has none of its fields (the lesson says
    # so); a newer one has all of them, at exactly the split's sizes.
    split = [r for r in sizes.rows if "gpu_us" in r]
    if split:
        assert sorted({r["log2n"] for r in split}) == list(experiment.SPLIT_EXPONENTS)
        for r in split:
            for key in ("host", "gpu"):
                assert r[f"{key}_p20_us"] <= r[f"{key}_us"] <= r[f"{key}_p80_us"]


def test_host_and_gpu_times_each_call_both_ways(monkeypatch):
    """The split's control flow without a GPU: host time from unsynchronised calls,
    GPU time from one do_bench_cudagraph per round, both in interleaved rounds."""
    import triton.testing

    calls, graphs = {"a": 0, "b": 0}, []

    def fake_graph(fn, rep, quantiles):
        graphs.append(rep)
        fn()
        return [0.002 * (1 + len(graphs) % 2), 0.0, 0.0]  # ms: 2 and 4 us, alternating

    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(triton.testing, "do_bench_cudagraph", fake_graph)
    impls = {name: (lambda name=name: calls.__setitem__(name, calls[name] + 1)) for name in calls}
    got = experiment.host_and_gpu(impls, rounds=3, calls=7)
    assert calls == {"a": 3 * 7 + 3, "b": 3 * 7 + 3}  # host loops, plus one call a graph
    assert graphs == [experiment.GRAPH_MS] * 6  # a round: a, then b
    assert got["a"]["gpu_us"] == pytest.approx(4.0) and got["b"]["gpu_us"] == pytest.approx(2.0)
    for r in got.values():
        assert r["host_p20_us"] <= r["host_us"] <= r["host_p80_us"] and r["host_us"] > 0
        assert set(r) == {f"{k}{q}_us" for k in ("host", "gpu") for q in ("", "_p20", "_p80")}


def _row(ms, gpu, host, spread=0.02):
    """A made-up row of experiment.sizes at a split size: do_bench ms, GPU and host us,
    each with a p20-p80 spread of ``spread`` either side of its median."""
    row = {"median_ms": ms, "p20_ms": ms * (1 - spread), "p80_ms": ms * (1 + spread)}
    for key, us in (("gpu", gpu), ("host", host)):
        row |= {f"{key}_us": us, f"{key}_p20_us": us * (1 - spread)}
        row[f"{key}_p80_us"] = us * (1 + spread)
    return row


# The H200 record at 2^12 (ab05eff): do_bench 43.3 against 4.7 us, the kernels alone
# 1.5 against 1.2 us, one call's host time 57.8 against 9.1 us, with its spreads.
H200_TILEBOOK = {
    "median_ms": 0.0433, "p20_ms": 0.0418, "p80_ms": 0.0439,
    "gpu_us": 1.4897, "gpu_p20_us": 1.4816, "gpu_p80_us": 1.4967,
    "host_us": 57.755, "host_p20_us": 55.9218, "host_p80_us": 61.6508,
}  # fmt: skip
H200_TORCH = {
    "median_ms": 0.0047, "p20_ms": 0.0047, "p80_ms": 0.0047,
    "gpu_us": 1.1804, "gpu_p20_us": 1.1804, "gpu_p80_us": 1.1909,
    "host_us": 9.1485, "host_p20_us": 9.0293, "host_p80_us": 9.1998,
}  # fmt: skip


@pytest.mark.parametrize(
    ("slow", "fast", "kind"),
    [
        # a 38.6 us gap; the kernels 0.3 us apart, the host 48.6 us: the host's
        (H200_TILEBOOK, H200_TORCH, "host"),
        (_row(0.0433, 1.5, 57.8), _row(0.0047, 1.2, 9.1), "host"),
        # a 10 us gap, the kernels 10 us apart, the host 2 us: the kernel's
        (_row(0.020, 18.0, 12.0), _row(0.010, 8.0, 10.0), "kernel"),
        # the host even faster in tilebook: still the kernel's
        (_row(0.020, 18.0, 8.0), _row(0.010, 8.0, 10.0), "kernel"),
        # 6 and 7 us of a 10 us gap: both
        (_row(0.020, 14.0, 17.0), _row(0.010, 8.0, 10.0), "both"),
        # 1 us each of a 10 us gap: neither
        (_row(0.020, 11.0, 11.0), _row(0.010, 10.0, 10.0), "neither"),
        # slower beyond the spreads, but by far less than half the gap: not the kernel
        (_row(0.050, 13.0, 10.0, 0.001), _row(0.010, 10.0, 10.0, 0.001), "neither"),
        # host 6 us apart at the medians, but its spreads leave less than half of 10
        (_row(0.020, 10.0, 56.0, 0.05), _row(0.010, 10.0, 50.0, 0.05), "neither"),
    ],
)
def test_explain_gap_names_the_part_that_accounts_for_the_gap(slow, fast, kind):
    gap = experiment.explain_gap(slow, fast)
    assert gap.kind == kind
    assert gap.gap_us == pytest.approx(1e3 * (slow["median_ms"] - fast["median_ms"]))
    assert gap.kernel_us == pytest.approx(slow["gpu_us"] - fast["gpu_us"])
    assert gap.host_us == pytest.approx(slow["host_us"] - fast["host_us"])
    assert gap.kernel_low_us <= gap.kernel_us and gap.host_low_us <= gap.host_us


def test_explain_gap_on_the_h200_record():
    gap = experiment.explain_gap(H200_TILEBOOK, H200_TORCH)
    assert gap.gap_us == pytest.approx(38.6)
    assert gap.kernel_us == pytest.approx(0.31, abs=0.01)
    assert gap.host_us == pytest.approx(48.6, abs=0.1)
    assert (gap.kernel, gap.host, gap.kind) == (False, True, "host")


def test_explain_gap_share_moves_the_line():
    slow, fast = _row(0.020, 14.0, 10.0, 0.001), _row(0.010, 10.0, 10.0, 0.001)  # 4 of 10
    assert experiment.explain_gap(slow, fast).kind == "neither"
    assert experiment.explain_gap(slow, fast, share=0.3).kind == "kernel"


def test_explain_gap_refuses_bad_input():
    slow, fast = _row(0.020, 14.0, 10.0), _row(0.010, 10.0, 10.0)
    with pytest.raises(ValueError, match="slower under do_bench"):
        experiment.explain_gap(fast, slow)
    with pytest.raises(ValueError, match="share"):
        experiment.explain_gap(slow, fast, share=0)
    with pytest.raises(KeyError, match="host_and_gpu"):
        experiment.explain_gap(slow, {k: v for k, v in fast.items() if k != "gpu_p80_us"})
    with pytest.raises(ValueError, match="inconsistent host"):
        experiment.explain_gap(slow, fast | {"host_p20_us": 11.0})


def test_the_lesson_attributes_the_gap_through_explain_gap():
    """One rule for every size and every record: the page's verdict and its claims
    come from experiment.explain_gap (through read_split), not from a rule of the
    lesson's own."""
    calls = _calls(SCRIPT.tree)
    assert "experiment.read_split" in calls and "experiment.EXPLAINS" in calls
    assert "explain_gap" in _calls(ast.parse(inspect.getsource(experiment.read_split)))


def test_every_verdict_reads_with_its_figures():
    """Each kind's sentence fills from the figures the lesson passes it (say() refuses a
    missing or unused one), and states the kind's verdict and nothing else's."""
    verdicts = experiment
    from tilebook.course.prose import say

    assert set(verdicts.SAYS) == {"kernel", "host", "both", "neither"}
    assert verdicts.span([1.23, 1.21]) == "1.2" and verdicts.span([1.0, 2.0]) == "1.0 to 2.0"
    for kind, template in verdicts.SAYS.items():
        said = {"at": "2^12", "gap": "38.6", "kernel": "+0.3", "host": "+48.6"}
        said |= {"share": 0.5} if kind == "neither" else {}
        text = str(say(verdicts.GAP + template, **said))
        assert "38.6" in text and "+0.3" in text and "+48.6" in text
        flat = " ".join(text.split())
        assert ("the host can account" in flat) == (kind == "host")
        assert ("the kernel can account" in flat) == (kind == "kernel")
        assert ("could each account" in flat) == (kind == "both")
        assert ("neither explains" in flat) == (kind == "neither")
    assert str(say(verdicts.OVERLAP))


def test_experiment_arithmetic():
    assert experiment.traffic(1000) == 12_000
    assert experiment.traffic(1000, torch.float16) == 6_000
    assert experiment.elements_per_thread(4096, 8) == 16
    assert experiment.elements_per_thread(128, 16) == 0.25
    assert experiment.setting(4096, 8) == "4096/8"


@pytest.mark.gpu
def test_experiments_run_on_a_gpu():
    rows = experiment.sizes((12, 14), split=(12,), rounds=1, warmup=1, rep=5)
    assert [(r["log2n"], r["impl"]) for r in rows] == [
        (12, "tilebook"),
        (12, "torch.add"),
        (14, "tilebook"),
        (14, "torch.add"),
    ]
    # Split at 2^12 only; a call there costs the GPU less than do_bench measures.
    assert [("gpu_us" in r, "host_us" in r) for r in rows] == [(True, True)] * 2 + [
        (False, False)
    ] * 2
    assert all(0 < r["gpu_us"] < 1e3 * r["median_ms"] and r["host_us"] > 0 for r in rows[:2])
    rows = experiment.launch_settings(2**16, blocks=(256, 1024), warps=(1, 4), rounds=1, rep=5)
    assert [r["setting"] for r in rows] == ["256/1", "256/4", "1024/1", "1024/4"]
    assert all(r["programs"] == 2**16 // r["BLOCK_SIZE"] and r["gbps"] > 0 for r in rows)


# ----------------------------------------------------------------------------- exercises

EXERCISE_HEAD = (
    "import torch\nimport triton\nimport triton.language as tl\n"
    "from tilebook.course.exercises import check_elementwise\n"
)


def test_exercise_1_axpy_solution_passes_its_check(tmp_path):
    (solution,) = exercise_blocks(SCRIPT.text)[1]
    said = " ".join(exercise_text(SCRIPT.text, 1).split())
    assert "``check_elementwise(axpy, lambda x, y: 2.5 * x + y, block=1024)``" in said
    mod = run_blocks(tmp_path / "ex1_axpy.py", EXERCISE_HEAD, solution)
    (verdict,) = mod.PRINTED
    assert verdict.ok, str(verdict)
    assert len(verdict.cases) == len(SIZES)

    def axpy_floor_grid(x, y, out):  # the same kernel, a grid one program short
        n = out.numel()
        mod.axpy_kernel[(max(n // 1024, 1),)](x, y, out, 2.5, n, BLOCK=1024)

    broken = check_elementwise(axpy_floor_grid, lambda x, y: 2.5 * x + y, block=1024)
    assert "unwritten" in broken.kinds() and "triton.cdiv" in str(broken), str(broken)


def test_exercise_2_the_checker_says_why_block_1000_fails(lesson):
    text = " ".join(exercise_text(SCRIPT.text, 2).split())
    assert "``check_elementwise(lambda x, y: add(x, y, block_size=1000), torch.add)``" in text
    verdict = check_elementwise(lambda x, y: lesson.add(x, y, block_size=1000), torch.add)
    assert verdict.kinds() == {"raised"}, str(verdict)
    assert "power-of-two" in str(verdict)
    assert check_elementwise(lambda x, y: lesson.add(x, y, block_size=1024), torch.add).ok


def test_the_split_is_read_from_the_record_and_a_wrong_record_stops_the_page():
    import copy as copying

    from tilebook.course.claims import ClaimError, Claims

    sizes = load_record("lesson07_sizes", RECORDS_DIR)
    claims = Claims("07", sizes)
    said = str(experiment.read_split(sizes, claims))
    split = [r for r in sizes.rows if "gpu_us" in r]
    assert claims.ok and bool(claims.items) == bool(split)
    assert ("costs the host" in said) == bool(split), said
    if not split:
        return
    # A graph replay slower than do_bench contradicts the first claim.
    broken = copying.deepcopy(sizes)
    for r in broken.rows:
        if "gpu_us" in r:
            r["gpu_p80_us"] = 2e3 * r["p80_ms"]
    with pytest.raises(ClaimError, match="replayed from a graph"):
        experiment.read_split(broken, Claims("07", broken))


def test_check_all_states_each_claim_and_stops_at_a_contradicted_one():
    from tilebook.course.claims import ClaimError, Claims, speedup

    row = {"median_ms": 1.0, "p20_ms": 0.9, "p80_ms": 1.1}
    slow = {"median_ms": 2.0, "p20_ms": 1.9, "p80_ms": 2.1}
    claims = Claims("07", "data").check_all(
        {"a holds": True, "b holds": (True, "why"), "c is faster": speedup(row, slow)}
    )
    assert [(c.text, c.holds) for c in claims.items] == [
        ("a holds", True),
        ("b holds", True),
        ("c is faster", True),
    ]
    assert claims.items[1].evidence == "why" and "2.000x" in claims.items[2].evidence
    with pytest.raises(ClaimError, match="d is faster"):
        Claims("07", "data").check_all({"d is faster": speedup(slow, row)})


# ------------------------------------------------- what the page says of its records
# The page's tables, claims, sentences and explorer are made by the experiment module
# from the records it shows; a CPU build shows the committed GPU records, so these
# run on them, through the lesson's own choice of what to compile (the lesson's run
# compiles for real).

LAUNCH = ["SLOW", "sweep", "best", "slow", "smallest", "block", "chosen", "unexplained"]
LAUNCH += ["shown", "SIGNATURE", "compiled", "NEAR_BEST"]


def compiled_like_ptxas(jobs, **common):
    """A stand-in for compile_many (a real compile of the five settings takes a minute
    of CPU): each setting's code as ptxas makes it for sm_90, modelled: 16-byte loads
    where a thread owns four float32 elements or more, narrower ones below, and spills
    from 256 elements per thread (the registers run out)."""
    from tilebook.course.aot import CompiledKernel

    out = {}
    for label, job in jobs.items():
        per_thread = job["constexprs"]["BLOCK_SIZE"] / (32 * job["num_warps"])
        wide = 2 * int(per_thread // 4)  # both inputs
        sass = "LDG.E.128 R4, desc[UR4][R2.64]\n" * wide or "LDG.E R4, desc[UR4][R2.64]\n" * 2
        out[label] = CompiledKernel(
            name="add_kernel", arch=90, stages={"sass": sass}, num_warps=job["num_warps"],
            num_stages=3, shared_bytes=0, registers=min(255, 16 + int(per_thread) // 2),
            spill_stores_bytes=0 if per_thread < 256 else 4 * int(per_thread),
            spill_loads_bytes=0,
        )  # fmt: skip
    return out


@pytest.fixture(scope="module")
def launch(tmp_path_factory):
    """The lesson's launch-setting section, on the committed record (a stand-in for
    record_or_measure loads it, on any machine), its settings "compiled" by
    :func:`compiled_like_ptxas`."""
    head = (
        "from test_lesson_07 import compiled_like_ptxas as compile_many\n"
        "from tilebook.course.bench import RECORDS_DIR, load_record\n"
        "from tilebook.course.experiments import vector_add as experiment\n"
        "from tilebook.ops.vector_add import DEFAULT_CONFIG\n\n"
        "def record_or_measure(name, title, sweep):\n"
        "    return load_record(name, RECORDS_DIR)\n\n"
        "time_ms = None\n\n"
    )
    return SCRIPT.lift(LAUNCH, tmp_path_factory.mktemp("lesson07_launch"), head)


def test_the_size_claims_hold_on_the_record_and_bite():
    import copy as copying

    from tilebook.course.claims import ClaimError, Claims

    sizes = load_record("lesson07_sizes", RECORDS_DIR)
    near, above = SCRIPT.constant("NEAR_COPY"), SCRIPT.constant("ABOVE_COPY")
    claims = Claims("07", sizes).check_all(experiment.sizes_claims(sizes, near, above))
    assert len(claims.items) == 4
    with pytest.raises(ClaimError, match="faster than the copy"):  # no room above the copy
        Claims("07", sizes).check_all(experiment.sizes_claims(sizes, near, -0.5))
    with pytest.raises(ClaimError, match="come close to the copy line"):  # 100x the copy
        Claims("07", sizes).check_all(experiment.sizes_claims(sizes, 100.0, above))
    slow = copying.deepcopy(sizes)  # torch.add's time grows with its bytes at small sizes
    small = experiment.EXPONENTS[:3]
    for r in slow.select(impl="torch.add"):
        if r["log2n"] in small:
            for key in ("median_ms", "p20_ms", "p80_ms"):
                r[key] *= 2 ** (r["log2n"] - small[0])
    with pytest.raises(ClaimError, match="hardly grows"):
        Claims("07", slow).check_all(experiment.sizes_claims(slow, near, above))


def test_the_size_table_and_sentence_follow_the_record():
    import copy as copying

    sizes = load_record("lesson07_sizes", RECORDS_DIR)
    copy = sizes.provenance["copy_gbps"]
    near = SCRIPT.constant("NEAR_COPY")
    table = experiment.sizes_table(sizes)
    assert table.column("n") == [f"2^{e}" for e in experiment.EXPONENTS]
    # both reach near the copy from the first size at which every larger one does
    reach = min(
        e
        for e in experiment.EXPONENTS
        if all(r["gbps"] >= near * copy for r in sizes.rows if r["log2n"] >= e)
    )
    said = " ".join(str(experiment.say_sizes(sizes, near)).split())
    assert f"Both reach {near:.0%} of the copy from 2^{reach} elements on" in said
    verdicts = zip(table.column("n"), table.column(""), strict=True)
    behind = [n for n, verdict in verdicts if verdict == "behind"]
    if behind:
        assert "torch.add is ahead at " + ", ".join(behind) in said
    split = experiment.split_table(sizes)
    assert split.column("n") == [f"2^{e}" for e in experiment.SPLIT_EXPONENTS]
    older = copying.deepcopy(sizes)  # a record from before the split: no table
    for r in older.rows:
        for key in [k for k in r if k.startswith(("gpu_", "host_"))]:
            del r[key]
    assert experiment.split_table(older) is None


def test_the_launch_claims_hold_on_the_record_and_bite(launch):
    import copy as copying

    from tilebook.course.claims import ClaimError, Claims

    lesson = launch
    args = (lesson.compiled, lesson.shown, lesson.SLOW, lesson.NEAR_BEST, lesson.chosen)
    claims = Claims("07", lesson.sweep).check_all(experiment.launch_claims(lesson.sweep, *args))
    assert len(claims.items) == 6
    # every setting slow: the package's, of none of the three kinds, too
    with pytest.raises(ClaimError, match="one of the three kinds"):
        Claims("07", lesson.sweep).check_all(
            experiment.launch_claims(lesson.sweep, args[0], args[1], 2.0, *args[3:])
        )
    # a package whose setting were the smallest block on one warp, a slow one
    small = {"BLOCK_SIZE": lesson.smallest, "num_warps": 1}
    with pytest.raises(ClaimError, match="package's setting is among the best"):
        Claims("07", lesson.sweep).check_all(
            experiment.launch_claims(lesson.sweep, *args[:-1], small)
        )
    # a setting that does not spill, made slow: of none of the three kinds
    slowed = copying.deepcopy(lesson.sweep)
    slowed.one(**lesson.chosen)["gbps"] *= 0.5
    with pytest.raises(ClaimError, match="one of the three kinds"):
        Claims("07", slowed).check_all(experiment.launch_claims(slowed, *args))


def test_the_compiled_table_and_the_explorer_say_why_each_slow_setting_is_slow(launch):
    lesson = launch
    table = experiment.compiled_table(lesson.shown, lesson.compiled, lesson.best)
    assert table.column("BLOCK_SIZE / num_warps") == [r["setting"] for r in lesson.shown]
    spills = [int(s) for s in table.column("spilled bytes")]
    assert spills == [lesson.compiled[r["setting"]].spill_stores_bytes for r in lesson.shown]
    copy = load_record("lesson07_sizes", RECORDS_DIR).provenance["copy_gbps"]
    settings = experiment.explorer(lesson.sweep, lesson.compiled, copy, lesson.SLOW, lesson.chosen)
    notes = {r["setting"]: r["note"] for r in settings["rows"]}
    assert {s for s, note in notes.items() if note} == {r["setting"] for r in lesson.slow}
    smallest = experiment.setting(lesson.smallest, 1)
    assert notes[smallest].startswith("The smallest block")
    assert "threads load copies" in notes[experiment.setting(128, 16)]
    spilled = [r["setting"] for r, s in zip(lesson.shown, spills, strict=True) if s]
    assert spilled and all("ptxas spills" in notes[s] for s in spilled)
    assert settings["initial"] == lesson.chosen and settings["ceiling"] == copy
