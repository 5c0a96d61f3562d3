"""Lesson 02 (programs and the grid): its kernels, and how it asks Triton what compiled.

The lesson's kernels are lifted out of the script into a small module.  The
ownership maps are checked against the arithmetic on shapes the lesson does not
use; reading Triton's cache is checked on a stand-in with Triton's layout (on a
CPU) and on the real thing (on a GPU), where the lesson's calls must compile
exactly the binaries its table says.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import triton
from lesson_source import LessonSource

from tilebook.course.bench import RECORDS_DIR, load_record
from tilebook.course.exercises import check
from tilebook.course.experiments import programs as experiment

SCRIPT = LessonSource(2)
LIFTED = [
    "stamp_kernel",
    "stamp",
    "stamp_tiles_kernel",
    "stamp_tiles",
    "ticket_kernel",
    "tickets",
    "scale_kernel",
    "scale",
    "vec",
    "CALLS",
    "NEW",
]


@pytest.fixture(scope="module")
def lesson(tmp_path_factory):
    head = (
        "import torch\nimport triton\nimport triton.language as tl\nimport tilebook\n"
        "DEVICE = tilebook.device()\n\n"
    )
    return SCRIPT.lift(LIFTED, tmp_path_factory.mktemp("lesson02"), head)


def test_1d_ownership_through_the_exercise_checker(lesson):
    def fn(n, out):
        lesson.stamp_kernel[(triton.cdiv(n, 256),)](out, n, BLOCK=256)

    def floor(n, out):
        lesson.stamp_kernel[(n // 256,)](out, n, BLOCK=256)

    def ref(n):
        return (torch.arange(n) // 256).to(torch.int32)

    cases = [(1,), (255,), (256,), (700,)]
    assert check(fn, ref, cases, block=256).ok
    v = check(floor, ref, cases, block=256)
    assert [c.label for c in v.cases if not c.ok] == ["1", "255", "700"]
    assert v.kinds() == {"unwritten"}


@pytest.mark.parametrize(("m", "n", "bm", "bn", "batch"), [(5, 9, 4, 8, 3), (33, 17, 16, 4, 1)])
def test_tile_stamps_are_the_launch_order(lesson, m, n, bm, bn, batch):
    g = (triton.cdiv(m, bm), triton.cdiv(n, bn))
    got = lesson.stamp_tiles(m, n, bm, bn, (*g, batch), batch=batch).cpu()
    pm = torch.arange(m)[:, None] // bm
    pn = torch.arange(n)[None, :] // bn
    want = torch.stack([pm + pn * g[0] + b * g[0] * g[1] for b in range(batch)])
    assert torch.equal(got.to(torch.int64), want)


def test_the_grid_function_follows_block(lesson):
    for block in (32, 128):
        got = lesson.stamp(300, block).cpu()
        assert torch.equal(got.to(torch.int64), torch.arange(300) // block)


@pytest.mark.parametrize("grid", [(1, 1), (3, 5), (16, 2)])
def test_every_program_takes_one_ticket(lesson, grid):
    got = lesson.tickets(*grid).cpu()
    assert got.shape == grid
    rows = experiment.start_order(got)  # raises unless the tickets are 0..n-1, each once
    assert [r["numbering"] for r in rows] == list(experiment.NUMBERINGS)
    assert all(r["programs"] == grid[0] * grid[1] for r in rows)


def test_start_order_measures_the_order():
    m, n = torch.arange(6)[:, None], torch.arange(4)[None, :]
    by = {r["numbering"]: r for r in experiment.start_order(m + 6 * n)}
    first, other = by["axis 0 fastest"], by["axis 1 fastest"]
    assert first["in_order"] == 1.0 and first["same_place"] == 24 and first["median_shift"] == 0
    assert other["in_order"] < 1.0 and other["same_place"] < 24
    reverse = experiment.start_order(23 - (m + 6 * n))[0]
    assert reverse["in_order"] == 0.0
    shuffled = torch.randperm(4096, generator=torch.Generator().manual_seed(0)).view(64, 64)
    for r in experiment.start_order(shuffled):  # a random order: one half, within the spread
        assert abs(r["in_order"] - 0.5) < 4 * r["chance_sd"]


@pytest.mark.parametrize(
    "bad",
    [torch.zeros(2, 2, dtype=torch.int32), torch.arange(4.0).view(2, 2), torch.arange(4)],
)
def test_start_order_refuses_what_is_not_one_ticket_each(bad):
    with pytest.raises(ValueError, match="ticket"):
        experiment.start_order(bad)


def test_the_lesson_s_table_of_calls_is_complete(lesson):
    assert [label for label, _ in lesson.CALLS] == list(lesson.NEW)
    assert sum(lesson.NEW.values()) == 7  # the GPU test below asks Triton for each


class _FakeKernel:
    """Triton's layout: device -> (binaries by key, key cache, target, backend, binder)."""

    def __init__(self, keys_by_device):
        self.device_caches = {
            d: ({k: object() for k in ks}, {}, None, None, None) for d, ks in keys_by_device.items()
        }


def test_reading_triton_s_cache():
    k = _FakeKernel({0: ["[('*fp32', 'D'), ('constexpr', 1)]{'num_warps': 4}", "b"], 1: ["c"]})
    assert experiment.binaries(k) == 3
    assert experiment._specialisation(experiment.cache_keys(k)[0]) == (
        "[('*fp32', 'D'), ('constexpr', 1)]"
    )
    assert experiment.binaries(object()) is None  # an interpreted kernel has no cache

    odd = SimpleNamespace(device_caches={0: {"not": "a tuple"}})
    with pytest.raises(TypeError, match="unknown layout"):
        experiment.cache_keys(odd)


def test_fresh_cache_dir_is_restored(monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", "/somewhere")
    with experiment.fresh_cache_dir() as d:
        import os

        assert os.environ["TRITON_CACHE_DIR"] == d != "/somewhere"
    assert os.environ["TRITON_CACHE_DIR"] == "/somewhere"


def test_interpreted_kernels_have_no_binaries(lesson):
    import tilebook

    if tilebook.is_interpreter():
        assert experiment.binaries(lesson.scale_kernel) is None
        with pytest.raises(RuntimeError, match="GPU"):
            experiment.specialisations(lesson.scale_kernel, lesson.CALLS)


def test_committed_records_match_the_lesson(lesson):
    spec = load_record("lesson02_specialise", RECORDS_DIR)
    first = load_record("lesson02_first_call", RECORDS_DIR)
    if spec is None and first is None:
        pytest.skip("lesson 02 has no GPU record yet: its GPU run records them")
    assert spec.values("call") == list(lesson.NEW)
    assert [bool(r["new"]) for r in spec.rows] == list(lesson.NEW.values())
    assert first.values("call") == ["compile", "disk cache", "later call"]
    order = load_record("lesson02_start_order", RECORDS_DIR)
    if order is not None:  # recorded by the lesson's GPU run since it measures the order
        assert order.values("numbering") == list(experiment.NUMBERINGS)
        assert {"in_order", "chance_sd", "same_place", "median_shift"} <= set(order.rows[0])


@pytest.mark.gpu
def test_the_calls_compile_what_the_lesson_says(lesson):
    rows = experiment.specialisations(lesson.scale_kernel, lesson.CALLS)
    assert [bool(r["new"]) for r in rows] == list(lesson.NEW.values())
    assert rows[-1]["binaries"] == experiment.binaries(lesson.scale_kernel)
    x = lesson.vec(4096)
    timed = experiment.first_calls(lesson.scale_kernel, lambda: lesson.scale(x), repeats=2, later=5)
    first = {r["call"]: r for r in timed}
    assert first["compile"]["median_ms"] > first["disk cache"]["median_ms"]
    assert first["disk cache"]["median_ms"] > first["later call"]["median_ms"]
    assert experiment.binaries(lesson.scale_kernel) == 1  # first_calls emptied the cache


@pytest.mark.gpu
def test_a_gpu_starts_programs_mostly_in_linear_order(lesson):
    by = {r["numbering"]: r for r in experiment.start_order(lesson.tickets(128, 128))}
    first, other = by["axis 0 fastest"], by["axis 1 fastest"]
    assert first["in_order"] > 0.5 + 6 * first["chance_sd"]
    assert first["in_order"] > other["in_order"] + 6 * first["chance_sd"]


def _records():
    names = ("lesson02_start_order", "lesson02_specialise", "lesson02_first_call")
    found = [load_record(name, RECORDS_DIR) for name in names]
    if None in found:
        pytest.skip("lesson 02's GPU records are not all committed for the records shown")
    return found


def test_the_page_s_claims_hold_on_its_records_and_bite(lesson):
    from tilebook.course.claims import ClaimError, Claims

    order, spec, first = _records()
    assert Claims("02", order).check_all(experiment.start_order_claims(order)).ok
    assert Claims("02", first).check_all(experiment.first_call_claims(first)).ok
    said = experiment.specialisation_claims(spec, lesson.NEW, None)
    assert len(Claims("02", spec).check_all(said).items) == len(lesson.NEW) + 1
    flipped = {label: not new for label, new in lesson.NEW.items()}
    with pytest.raises(ClaimError, match=r"compiles a new binary|reuses a binary"):
        Claims("02", spec).check_all(experiment.specialisation_claims(spec, flipped, None))
    with pytest.raises(ClaimError, match="cache holds"):  # a cache that holds fewer
        Claims("02", spec).check_all(experiment.specialisation_claims(spec, lesson.NEW, 1))
    # no record: the claims are shown unchecked, and the tables say why they are empty
    assert "No GPU record" in str(experiment.start_order_table(None))
    assert "No GPU record" in str(experiment.say_first_calls(None))


def test_the_page_s_sentences_on_a_gpu(monkeypatch):
    """The GPU branches of the sentences, on the committed records (a CPU cannot run
    the lesson's GPU path, so its sentences are made here from a GPU's data)."""
    import tilebook.runtime

    order, _, first = _records()
    monkeypatch.setattr(tilebook.runtime, "is_interpreter", lambda: False)
    said = str(experiment.say_start_order(order.rows, order))
    linear = order.one(numbering="axis 0 fastest")
    assert f"Of the {linear['programs']:,} programs" in said
    kernel = _FakeKernel({0: ["[('*fp32', 'D')]{'num_warps': 4}"]})
    kernel.__name__ = "scale_kernel"
    said = " ".join(str(experiment.say_binaries(kernel, first, 7)).split())
    assert "holding 7 binaries" in said and "now holds 1 binary: the timed call's alone" in said
    rounds = first.one(call="compile")["samples"]
    assert f"each of its {rounds} rounds" in said
