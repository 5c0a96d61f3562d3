"""Records kept per GPU kind, and datasheet facts that resolve to the build's GPU."""

from __future__ import annotations

import json

import pytest

from tilebook.course import bench, datasheet


def _record(folder, name, gpu, date, mode="gpu"):
    folder.mkdir(parents=True, exist_ok=True)
    prov = {"gpu": gpu, "date": date, "mode": mode, "commit": "abc", "torch": "t", "triton": "t"}
    prov |= {"cuda": "c", "copy_gbps": 1000.0}  # all that Record.validate asks for
    data = {"name": name, "title": name, "rows": [{"x": 1, "median_ms": 1.0}], "provenance": prov}
    (folder / f"{name}.json").write_text(json.dumps(data))


@pytest.fixture
def root(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "RECORDS_ROOT", tmp_path)
    monkeypatch.delenv(bench.RECORDS_GPU_ENV, raising=False)
    monkeypatch.delenv(bench.RECORD_DIR_ENV, raising=False)
    return tmp_path


def test_a_cpu_build_shows_the_newest_complete_set(root):
    for name in ("a", "b"):
        _record(root / "h100", name, "NVIDIA H100 80GB HBM3", "2026-11-01")
    _record(root / "h200", "a", "NVIDIA H200", "2026-11-20")  # newer, incomplete
    assert bench.shown_records_dir() == root / "h100"
    assert bench.shown_records_gpu() == "NVIDIA H100 80GB HBM3"
    _record(root / "h200", "b", "NVIDIA H200", "2026-11-21")  # now complete and newer
    assert bench.shown_records_dir() == root / "h200"
    rec = bench.load_record("b")
    assert "NVIDIA H200" in rec.caption() and "recorded on" in rec.caption()
    assert datasheet.build_gpu().key == "h200"  # this test runs in CPU mode
    assert datasheet.fact("gpu.memory_bandwidth") is datasheet.FACTS["h200.memory_bandwidth"]


def test_the_gpu_set_can_be_chosen_and_a_wrong_choice_is_named(root, monkeypatch):
    for kind, gpu in (("h100", "NVIDIA H100 80GB HBM3"), ("h200", "NVIDIA H200")):
        _record(root / kind, "a", gpu, "2026-11-01")
    monkeypatch.setenv(bench.RECORDS_GPU_ENV, "h100")
    assert bench.shown_records_dir() == root / "h100"
    monkeypatch.setenv(bench.RECORDS_GPU_ENV, "a100")
    with pytest.raises(LookupError, match=r"a100.*h100, h200"):
        bench.shown_records_dir()


def test_commit_records_files_each_record_under_its_gpu(root, tmp_path_factory):
    built = tmp_path_factory.mktemp("built")
    _record(built, "x", "NVIDIA H200", "2026-11-28")
    _record(built, "y", "NVIDIA A100-SXM4-80GB", "2026-11-28")
    _record(built, "z", None, "2026-11-28", mode="cpu")  # never committed
    written = bench.commit_records(built)
    assert sorted(p.relative_to(root).as_posix() for p in written) == ["a100/y.json", "h200/x.json"]


def test_the_committed_sets_each_hold_one_gpu():
    """Every committed record sits in the folder of the GPU that measured it."""
    sets = bench.record_sets()
    assert sets, "no committed records"
    for kind, folder in sets.items():
        for path in folder.glob("*.json"):
            prov = json.loads(path.read_text())["provenance"]
            assert prov["mode"] == "gpu", path
            assert datasheet.gpu_kind(prov["gpu"]) == kind, path


@pytest.mark.parametrize(
    ("device", "key"),
    [
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA H200", "h200"),
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("NVIDIA L4", "l4"),
        ("NVIDIA GeForce RTX 4090", "rtx4090"),
        ("Tesla T4", "t4"),
        ("NVIDIA H100 PCIe", None),  # another bandwidth and SM count than the SXM5
        ("NVIDIA A100 80GB PCIe", None),
        ("NVIDIA L40S", None),
    ],
)
def test_device_names_find_their_datasheet_rows(device, key):
    gpu = datasheet.gpu_for_name(device)
    assert (gpu.key if gpu else None) == key


def test_every_gpu_has_the_core_facts_with_a_source():
    for gpu in datasheet.GPUS.values():
        for name in ("memory_bandwidth", "memory", "smem_per_sm", "smem_per_block", "fp32"):
            f = datasheet.fact(f"{gpu.key}.{name}")
            assert f.gpu == gpu.name and f.source in datasheet.SOURCES
    # rates in different units divide correctly: FLOP per byte, on every GPU
    h200 = datasheet.fact("h200.bf16_dense").si / datasheet.fact("h200.memory_bandwidth").si
    a100 = datasheet.fact("a100.bf16_dense").si / datasheet.fact("a100.memory_bandwidth").si
    assert 150 < a100 < 160 and 200 < h200 < 210


def test_an_unknown_build_gpu_is_said_not_guessed(root):
    _record(root / "nvidia-l40s", "a", "NVIDIA L40S", "2026-11-01")
    assert datasheet.build_gpu() is None
    with pytest.raises(LookupError, match="no row in the datasheet"):
        datasheet.fact("gpu.memory_bandwidth")
    assert datasheet.lookup("gpu.memory_bandwidth") is None
    fallback = datasheet.build_fact("memory_bandwidth")
    assert fallback.key == "h200.memory_bandwidth" and fallback.gpu == "H200 SXM"
    with pytest.raises(TypeError):
        datasheet.gpu_for_name(None)
