"""Records, plots and the never-invent rule, without a GPU."""

from __future__ import annotations

import json
import re

import matplotlib
import pytest

import tilebook
from tilebook.course import bench
from tilebook.course.plots import plot_record

matplotlib.use("Agg")


def _gpu_record(live: bool) -> bench.Record:
    prov = {
        "gpu": "NVIDIA H100 80GB HBM3",
        "torch": "2.11.0",
        "triton": "3.6.0",
        "cuda": "13.0",
        "date": "2026-11-22T09:00:00Z",
        "commit": "abc123",
        "mode": "gpu",
        "copy_gbps": 3000.0,
    }
    rows = [
        {
            "n": 2**k,
            "impl": impl,
            "gbps": 100.0 * k + (5 if impl == "torch" else 0),
            "median_ms": 0.01 * k,
            "p20_ms": 0.009 * k,
            "p80_ms": 0.011 * k,
        }
        for k in range(10, 14)
        for impl in ("tilebook", "torch")
    ]
    return bench.Record("demo", "a demo", rows, prov, live=live)


def test_caption_says_recorded_or_live():
    assert (
        _gpu_record(False)
        .caption()
        .startswith(
            "recorded on NVIDIA H100 80GB HBM3, torch 2.11.0, triton 3.6.0, CUDA 13.0, 2026-11-22"
        )
    )
    assert _gpu_record(True).caption().startswith("measured live on NVIDIA H100")


def test_save_and_load_round_trip(tmp_path):
    rec = _gpu_record(True)
    path = bench.save_record(rec, tmp_path)
    data = json.loads(path.read_text())
    assert data["provenance"]["gpu"] == "NVIDIA H100 80GB HBM3"
    loaded = bench.load_record("demo", tmp_path)
    assert loaded is not None and not loaded.live
    assert loaded.rows == rec.rows
    assert loaded.select(impl="torch", n=1024) == [
        r for r in rec.rows if r["impl"] == "torch" and r["n"] == 1024
    ]


def test_refuses_to_save_what_was_not_measured_on_a_gpu(tmp_path):
    with pytest.raises(ValueError, match="not measured live on a GPU"):
        bench.save_record(_gpu_record(False), tmp_path)
    rec = _gpu_record(True)
    rec.provenance["mode"] = "cpu"
    with pytest.raises(ValueError, match="not measured live on a GPU"):
        bench.save_record(rec, tmp_path)


def test_missing_record_is_none(tmp_path):
    assert bench.load_record("no_such_benchmark", tmp_path) is None


@pytest.mark.skipif(tilebook.is_gpu(), reason="CPU behaviour")
def test_cpu_mode_never_measures():
    calls = []
    rec = bench.record_or_measure("lesson07_launch", "t", lambda: calls.append(1) or [])
    assert calls == []  # the sweep function was never run
    assert rec is not None and not rec.live
    assert rec.provenance["mode"] == "gpu" and rec.provenance["gpu"].startswith("NVIDIA")
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        bench.measure(lambda: None)
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        bench.measure_interleaved({"a": lambda: None})
    assert bench.record_or_measure("no_such_benchmark", "t", lambda: calls.append(1) or []) is None
    assert calls == []


SPREAD = "row 4 has p20_ms, median_ms, p80_ms = [0.3, 0.2, 0.1], out of order"
FAULTS = [
    "provenance lacks cuda, copy_gbps",
    "provenance copy_gbps is nan",
    "it has no rows",
    "row 1 holds nothing measured",
    "row 2 has gbps=inf",
    "row 3 has median_ms=0.0",
    SPREAD,
    "row 5 is a list, not a dict",
]


def _broken(fault: str) -> bench.Record:
    """The demo record with one fault, named as :meth:`Record.validate` names it."""
    rec = _gpu_record(True)
    rows, prov = rec.rows, rec.provenance
    match fault:
        case "provenance lacks cuda, copy_gbps":
            del prov["cuda"], prov["copy_gbps"]
        case "provenance copy_gbps is nan":
            prov["copy_gbps"] = float("nan")
        case "it has no rows":
            rows.clear()
        case "row 1 holds nothing measured":
            del rows[1]["median_ms"]
        case "row 2 has gbps=inf":
            rows[2]["gbps"] = float("inf")
        case "row 3 has median_ms=0.0":
            rows[3]["median_ms"] = 0.0
        case "row 5 is a list, not a dict":
            rows[5] = [1.0]
        case _:
            assert fault == SPREAD, fault
            rows[4].update(p20_ms=0.3, median_ms=0.2, p80_ms=0.1)
    return rec


@pytest.mark.parametrize("fault", FAULTS)
def test_a_broken_record_is_neither_saved_nor_loaded(tmp_path, fault):
    rec = _broken(fault)
    with pytest.raises(ValueError, match=re.escape(f"record 'demo' is not a measurement: {fault}")):
        bench.save_record(rec, tmp_path)
    assert list(tmp_path.iterdir()) == []  # nothing written
    # The same record in a file (edited by hand, say): refused when read, with its path.
    (tmp_path / "demo.json").write_text(rec.to_json())
    with pytest.raises(ValueError, match=re.escape(fault)) as refused:
        bench.load_record("demo", tmp_path)
    assert str(tmp_path / "demo.json") in str(refused.value)


def test_a_record_file_that_is_no_measurement_is_named(tmp_path):
    good = json.loads(_gpu_record(True).to_json())
    (tmp_path / "renamed.json").write_text(json.dumps(good))
    (tmp_path / "cut.json").write_text(json.dumps(good)[:100])
    (tmp_path / "cpu.json").write_text(
        json.dumps(good | {"name": "cpu", "provenance": good["provenance"] | {"mode": "cpu"}})
    )
    (tmp_path / "bare.json").write_text(json.dumps({"name": "bare"}))
    for name, fault in (
        ("renamed", "its file is named renamed.json"),
        ("cut", "is not JSON"),
        ("cpu", "provenance mode is 'cpu', not 'gpu'"),
        ("bare", "mode is None, not 'gpu'; provenance lacks gpu, torch"),
    ):
        with pytest.raises(ValueError, match=re.escape(fault)):
            bench.load_record(name, tmp_path)
    (tmp_path / "bare.json").write_text(json.dumps(good | {"name": "bare"}))
    assert bench.load_record("bare", tmp_path).rows == good["rows"]


def test_commit_records_copies_nothing_while_a_record_is_broken(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "RECORDS_ROOT", tmp_path / "records")
    built = tmp_path / "built"
    bench.save_record(_gpu_record(True), built)
    broken = _gpu_record(True)
    broken.name = "broken"
    bench.save_record(broken, built)
    data = json.loads((built / "broken.json").read_text())
    (built / "broken.json").write_text(json.dumps(data | {"rows": []}))
    with pytest.raises(ValueError, match=r"'broken'.*no rows"):
        bench.commit_records(built)
    assert not (tmp_path / "records").exists()
    (built / "broken.json").unlink()
    assert bench.commit_records(built) == [tmp_path / "records" / "h100" / "demo.json"]


def test_every_committed_record_passes_validation():
    sets = bench.record_sets()
    assert sets, "no committed records"
    for folder in sets.values():
        for path in folder.glob("*.json"):
            bench.load_record(path.stem, folder)  # raises for a record that fails validate()


def test_plot_from_record_has_caption_and_lines():
    fig = plot_record(_gpu_record(False), x="n", y="gbps", series="impl", logx=True, ceiling=3000.0)
    texts = [t.get_text() for t in fig.texts]
    assert any(t.startswith("recorded on NVIDIA H100") for t in texts)
    ax = fig.axes[0]
    assert len(ax.lines) == 3  # two series and the ceiling
    assert list(ax.lines[0].get_ydata()) == [1000.0, 1100.0, 1200.0, 1300.0]


def test_plot_without_record_draws_nothing(capsys):
    assert plot_record(None, x="n", y="gbps", name="missing_thing") is None
    assert "No GPU measurement named 'missing_thing'" in capsys.readouterr().out


def test_measurement_rates():
    m = bench.Measurement(2.0, 1.9, 2.1, bytes_moved=6_000_000_000, flops=4_000_000_000_000)
    assert m.gbps == pytest.approx(3000.0)
    assert m.tflops == pytest.approx(2000.0)
    assert set(m.as_row()) >= {"median_ms", "p20_ms", "p80_ms", "gbps", "tflops"}


@pytest.mark.gpu
def test_measure_interleaved_orders_and_spreads():
    import torch

    small = torch.empty(1 << 20, device="cuda")
    big = torch.empty(1 << 27, device="cuda")  # 128x the bytes: clearly slower
    got = bench.measure_interleaved(
        {"small": small.zero_, "big": big.zero_},
        rounds=3,
        bytes_moved={"small": small.numel() * 4, "big": big.numel() * 4},
        warmup=5,
        rep=20,
    )
    assert list(got) == ["small", "big"]
    for m in got.values():
        assert 0 < m.p20_ms <= m.median_ms <= m.p80_ms
    assert got["big"].median_ms > 10 * got["small"].median_ms
    assert got["big"].gbps > 100  # a 512 MB fill: hundreds of GB/s on any datacenter GPU
    with pytest.raises(ValueError, match="rounds"):
        bench.measure_interleaved({"a": small.zero_}, rounds=0)


def test_benchmark_header_without_a_gpu_says_so(capsys):
    if tilebook.is_gpu():
        pytest.skip("this is the no-GPU start of a benchmark script")
    assert bench.benchmark_header() is None
    out = capsys.readouterr().out
    assert "tilebook: CPU mode" in out
    assert "no GPU: nothing to measure" in out


@pytest.mark.gpu
def test_benchmark_header_and_save_on_a_gpu(tmp_path, monkeypatch, capsys):
    prov = bench.benchmark_header()
    assert prov is not None and prov["gpu"] in capsys.readouterr().out
    monkeypatch.setenv(bench.RECORD_DIR_ENV, str(tmp_path))
    rows = [{"kernel": "k", "impl": "tilebook", "median_ms": 1.0}]
    path = bench.save_benchmark("probe", rows)
    saved = json.loads(path.read_text())
    assert path.parent == tmp_path and saved["name"] == "bench_probe"
    assert saved["rows"] == rows and saved["provenance"]["copy_gbps"] > 100


def test_plot_caption_fits_inside_the_figure():
    """A live record's caption (GPU, versions, date, a 40-character commit) is wrapped to
    the figure's width: nothing of it is cut off at the edge."""
    rec = _gpu_record(True)
    rec.provenance["commit"] = "7b3f75d89b87b78500f7e9ba29baa373471e27f1+dirty"
    rec.provenance["torch"] = "2.11.0+cu130"
    rec.provenance["gpu"] = "NVIDIA H100 80GB HBM3 (a long name: another GPU's may be longer)"
    assert rec.caption().endswith("commit 7b3f75d89b87+dirty")
    fig = plot_record(rec, x="n", y="gbps", series="impl", title="t")
    fig.canvas.draw()
    (caption,) = [t for t in fig.texts if "measured live" in t.get_text()]
    box, frame = caption.get_window_extent(), fig.bbox
    assert frame.x0 <= box.x0 and box.x1 <= frame.x1, (box, frame)
    assert box.y0 >= frame.y0
    # the axes' labels stay above the caption
    assert fig.axes[0].get_tightbbox().y0 >= box.y1 - 1


@pytest.mark.parametrize("title", [None, "num_warps"])
def test_plot_legend_hides_no_data_and_stays_in_the_figure(title):
    """The legend sits beside the axes, not on them (no line runs under it), has a
    background, and the layout keeps all of it, its title too, inside the figure."""
    fig = plot_record(
        _gpu_record(False), x="n", y="gbps", series="impl", ceiling=3000.0,
        legend_title=title,
    )  # fmt: skip
    fig.canvas.draw()
    ax = fig.axes[0]
    legend = ax.get_legend()
    box, axes, frame = legend.get_window_extent(), ax.get_window_extent(), fig.bbox
    assert box.x0 >= axes.x1, (box, axes)  # right of the axes: no overlap with data
    assert frame.x0 <= box.x0 and box.x1 <= frame.x1 and box.y1 <= frame.y1, (box, frame)
    assert legend.get_frame_on() and legend.get_frame().get_alpha() > 0.5
    assert legend.get_title().get_text() == (title or "")
    assert [t.get_text() for t in legend.get_texts()] == ["tilebook", "torch", "copy bandwidth"]
