"""Benchmark harness: live measurements on a GPU, recorded ones everywhere else.

On a GPU every figure comes from :func:`triton.testing.do_bench` (CUDA events,
median over many repetitions, with the 20th and 80th percentiles as spread).
Each benchmark is saved as a :class:`Record` (JSON) with its provenance: GPU,
torch, triton, CUDA, Python, date and git commit, and the device's copy
bandwidth measured in the same process so that every GB/s figure can be read as a
fraction of the ceiling.

On a CPU there is nothing to time: a lesson calls :func:`load_record` and plots
what was committed from a GPU run, captioned with where it was measured.  No
function here ever produces a number that was not measured.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from .. import runtime

__all__ = [
    "MEASURED_KEYS",
    "PROVENANCE_KEYS",
    "RECORDS_DIR",
    "RECORDS_ROOT",
    "Measurement",
    "Record",
    "benchmark_header",
    "commit_records",
    "compare",
    "copy_bandwidth",
    "host_us",
    "load_record",
    "measure",
    "measure_interleaved",
    "provenance",
    "record_or_measure",
    "record_sets",
    "save_benchmark",
    "save_record",
    "shown_records_dir",
    "shown_records_gpu",
]

#: Committed GPU records, shipped with the package so downloaded lessons find them:
#: one folder per GPU kind (``records/h200/``, ``records/h100/``; the kind is
#: :func:`tilebook.course.datasheet.gpu_kind` of the GPU that measured them).
RECORDS_ROOT = Path(__file__).parent / "records"
#: ``TILEBOOK_RECORDS_GPU=h100`` makes a CPU build show that kind's records instead of
#: the newest complete set.
RECORDS_GPU_ENV = "TILEBOOK_RECORDS_GPU"
#: Where live runs write their records: ``$TILEBOOK_RECORD_DIR``, else
#: ``./tilebook-records``.  ``nox -s docs`` points it at the build folder, and
#: ``nox -s bench`` and ``nox -s record`` copy what it measured into the GPU's folder
#: of :data:`RECORDS_ROOT`.
RECORD_DIR_ENV = "TILEBOOK_RECORD_DIR"
#: What a record's provenance must say before it is saved or shown: the GPU and
#: versions a caption names, the date, and the copy ceiling its GB/s are read against.
PROVENANCE_KEYS = ("gpu", "torch", "triton", "cuda", "date", "copy_gbps")
#: What a row may have measured: a time; registers read from a compiled kernel
#: (lesson10_binaries); the code torch.compile wrote (lesson01_inductor); the binaries
#: in Triton's cache after a call (lesson02_specialise); the error of repeated runs
#: (lesson06_repeat); the order in which programs took tickets (lesson02_start_order).
#: A row with none of them holds only what was asked for, not what was found.
MEASURED_KEYS = ("median_ms", "registers", "source", "binaries", "rel_err", "in_order")


@dataclass(frozen=True)
class Measurement:
    """One timed function: milliseconds (median and spread) and the rates they imply."""

    median_ms: float
    p20_ms: float
    p80_ms: float
    bytes_moved: int | None = None
    flops: int | None = None

    @property
    def gbps(self) -> float | None:
        """Bytes read plus bytes written, each counted once, per second (1e9)."""
        if self.bytes_moved is None:
            return None
        return self.bytes_moved / (self.median_ms * 1e-3) / 1e9

    @property
    def tflops(self) -> float | None:
        if self.flops is None:
            return None
        return self.flops / (self.median_ms * 1e-3) / 1e12

    def as_row(self) -> dict[str, Any]:
        row: dict[str, Any] = {
            "median_ms": self.median_ms,
            "p20_ms": self.p20_ms,
            "p80_ms": self.p80_ms,
        }
        if self.bytes_moved is not None:
            row["bytes"] = self.bytes_moved
            row["gbps"] = self.gbps
        if self.flops is not None:
            row["flops"] = self.flops
            row["tflops"] = self.tflops
        return row


def _require_gpu(what: str) -> None:
    if not runtime.is_gpu():
        raise RuntimeError(
            f"{what} needs a CUDA GPU (tilebook is in {runtime.get_runtime().mode} mode); "
            "on a CPU, plot a committed record with tilebook.course.bench.load_record instead"
        )


def measure(
    fn: Callable[[], Any],
    *,
    bytes_moved: int | None = None,
    flops: int | None = None,
    warmup: float = 25,
    rep: float = 100,
) -> Measurement:
    """Time ``fn`` with :func:`triton.testing.do_bench` (GPU only).

    ``warmup`` and ``rep`` are milliseconds, as in ``do_bench``.  ``bytes_moved``
    counts each input read once and each output written once; ``flops`` counts
    floating-point operations.  Either turns into GB/s or TFLOP/s.
    """
    _require_gpu("measure()")
    from triton.testing import do_bench

    med, p20, p80 = do_bench(fn, warmup=warmup, rep=rep, quantiles=[0.5, 0.2, 0.8])
    return Measurement(float(med), float(p20), float(p80), bytes_moved, flops)


def measure_interleaved(
    fns: dict[str, Callable[[], Any]],
    *,
    rounds: int = 5,
    bytes_moved: int | dict[str, int] | None = None,
    flops: int | dict[str, int] | None = None,
    warmup: float = 25,
    rep: float = 100,
    timer: Callable[[Callable[[], Any]], Any] | None = None,
) -> dict[str, Measurement]:
    """Time several functions in turn, ``rounds`` times over: A B C, A B C, ...

    A GPU's clocks follow its power and temperature, which drift over a run by a few
    percent: more than the gap between two implementations that are close.  Timed
    in one block each, the second can look faster or slower for that alone;
    interleaved, each round compares them under the same conditions.  Each
    function's ``median_ms`` is the median of its per-round medians, and ``p20_ms``
    / ``p80_ms`` the 20th and 80th percentiles of those, so they show the drift.
    ``bytes_moved`` and ``flops`` are one number for all or a dict by name.

    ``timer`` times one function in one round, returning its median in ms (or a
    sequence that starts with it, as ``do_bench`` with ``quantiles`` does): a lesson
    passes its own ``do_bench`` call, so that the reader sees how it times.
    ``warmup`` and ``rep`` are then the timer's business.  Default: :func:`measure`.
    """
    _require_gpu("measure_interleaved()")
    if not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be a positive int, got {rounds!r}")
    if not fns:
        raise ValueError("measure_interleaved() needs at least one function")

    def pick(value, name):
        return value.get(name) if isinstance(value, dict) else value

    per_round: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            if timer is None:
                per_round[name].append(measure(fn, warmup=warmup, rep=rep).median_ms)
            else:
                per_round[name].append(_median_ms(timer(fn)))
    out = {}
    for name, times in per_round.items():
        q = torch.quantile(
            torch.tensor(times, dtype=torch.float64),
            torch.tensor([0.5, 0.2, 0.8], dtype=torch.float64),
        )
        med, p20, p80 = (float(v) for v in q)
        out[name] = Measurement(med, p20, p80, pick(bytes_moved, name), pick(flops, name))
    return out


def _median_ms(timed: Any) -> float:
    """A timer's answer as a median in ms: a number, or the first of a sequence."""
    value = timed[0] if isinstance(timed, (list, tuple)) else timed
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"a timer must return a positive time in ms, got {timed!r}")
    return float(value)


def compare(
    impls: dict[str, Callable[[], Any]],
    *,
    rounds: int = 3,
    bytes_moved: int | dict[str, int] | None = None,
    flops: int | dict[str, int] | None = None,
    warmup: float = 10,
    rep: float = 40,
    timer: Callable[[Callable[[], Any]], Any] | None = None,
    **fields: Any,
) -> list[dict[str, Any]]:
    """Time ``impls`` against each other in interleaved rounds: one row per implementation.

    Each row is ``{**fields, "impl": name, **measurement}``, ready for a
    :class:`Record`; its ``p20_ms``/``p80_ms`` spread is taken across the rounds,
    so it includes the drift that :mod:`tilebook.course.claims` must not mistake for a
    difference.  The defaults (fewer and shorter rounds than
    :func:`measure_interleaved`'s) keep a lesson inside its time budget;
    ``benchmarks/`` passes more.  ``timer``: see :func:`measure_interleaved`.
    """
    got = measure_interleaved(
        impls,
        rounds=rounds,
        bytes_moved=bytes_moved,
        flops=flops,
        warmup=warmup,
        rep=rep,
        timer=timer,
    )
    return [{**fields, "impl": name, **m.as_row()} for name, m in got.items()]


_COPY_CACHE: dict[int, Measurement] = {}


def host_us(fn: Callable[[], Any], calls: int = 30) -> float:
    """Host time of one call in microseconds: ``calls`` calls back to back without
    waiting for the GPU, which runs behind, so this is the Python, checks and launch
    work (synchronised before and after, outside the timing)."""
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - t) / calls * 1e6
    torch.cuda.synchronize()
    return host


def copy_bandwidth(nbytes: int = 1 << 30) -> Measurement:
    """Device-to-device copy of ``nbytes`` (default 1 GiB): the practical ceiling for
    memory-bound kernels, measured once per process and reused."""
    if nbytes not in _COPY_CACHE:
        _require_gpu("copy_bandwidth()")
        src = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").uniform_()
        dst = torch.empty_like(src)
        _COPY_CACHE[nbytes] = measure(lambda: dst.copy_(src), bytes_moved=2 * src.numel() * 4)
        del src, dst
    return _COPY_CACHE[nbytes]


def _git_commit() -> str | None:
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"],
            cwd=here,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=here,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def provenance() -> dict[str, Any]:
    """Where and with what a measurement is being taken."""
    import triton

    info: dict[str, Any] = {
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "cuda": torch.version.cuda,
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": os.environ.get("TILEBOOK_COMMIT") or _git_commit(),
        "mode": runtime.get_runtime().mode,
    }
    if runtime.is_gpu():
        props = torch.cuda.get_device_properties(0)
        info["gpu"] = props.name
        info["sm_count"] = props.multi_processor_count
        info["capability"] = f"{props.major}.{props.minor}"
        # The code paths the ops took: lower than the capability under TILEBOOK_ARCH.
        paths = runtime.capability()
        info["paths"] = f"{paths[0]}.{paths[1]}" if paths else info["capability"]
    return info


def _short_commit(commit: str) -> str:
    """A commit as git's 12-character short form (a caption has no room for 40), keeping
    a ``+dirty`` mark."""
    sha, plus, rest = commit.partition("+")
    return sha[:12] + plus + rest


def benchmark_header() -> dict[str, Any] | None:
    """How every script of ``benchmarks/`` starts: print tilebook's banner and, on a
    GPU, one line naming it (SMs, versions, the copy ceiling); return the
    :func:`provenance`, or None (after saying so) where there is no GPU to measure."""
    from .. import banner

    print(banner(), flush=True)
    if not runtime.is_gpu():
        print("no GPU: nothing to measure (see the committed records instead)", flush=True)
        return None
    p = provenance()
    print(
        f"# {p['gpu']}, {p['sm_count']} SMs, CUDA {p['cuda']}, torch {p['torch']}, "
        f"triton {p['triton']}, copy {copy_bandwidth().gbps:.0f} GB/s",
        flush=True,
    )
    return p


def save_benchmark(name: str, rows: list[dict[str, Any]]) -> Path:
    """Save a benchmark's rows as the record ``bench_<name>``, with the provenance and
    the copy ceiling of this run (see :func:`save_record` for where it goes)."""
    prov = provenance()
    prov["copy_gbps"] = copy_bandwidth().gbps
    title = f"{name}: tilebook against its baselines"
    return save_record(Record(f"bench_{name}", title, rows, prov, live=True))


@dataclass
class Record:
    """A benchmark's rows (one dict per measured point) plus its provenance."""

    name: str
    title: str
    rows: list[dict[str, Any]]
    provenance: dict[str, Any]
    notes: dict[str, Any] = field(default_factory=dict)
    live: bool = False  # True when measured in this process, False when loaded from disk
    path: str | None = None

    def caption(self) -> str:
        """``measured live on …`` or ``recorded on …``, with versions and date."""
        p = self.provenance
        date = str(p.get("date", "unknown date"))[:10]
        where = p.get("gpu", "an unknown GPU")
        versions = f"torch {p.get('torch', '?')}, triton {p.get('triton', '?')}"
        if p.get("cuda"):
            versions += f", CUDA {p['cuda']}"
        verb = "measured live on" if self.live else "recorded on"
        commit = f", commit {_short_commit(str(p['commit']))}" if p.get("commit") else ""
        return f"{verb} {where}, {versions}, {date}{commit}"

    @property
    def paths(self) -> str | None:
        """The compute capability whose code paths the ops took (``"9.0"``): lower than
        the GPU's under ``TILEBOOK_ARCH``; a record from before this field, its GPU's."""
        p = self.provenance
        return p.get("paths") or p.get("capability")

    def select(self, **where: Any) -> list[dict[str, Any]]:
        """Rows whose fields equal every ``key=value`` given."""
        return [r for r in self.rows if all(r.get(k) == v for k, v in where.items())]

    def one(self, **where: Any) -> dict[str, Any]:
        """The single row whose fields equal every ``key=value`` given.

        Raises :class:`LookupError` naming the record and the query when there is
        no such row or more than one: a lesson that reads a row its record lacks
        must fail loudly, not print a stale number.
        """
        found = self.select(**where)
        if len(found) != 1:
            raise LookupError(
                f"record {self.name!r}: {len(found)} rows match {where} (expected one)"
            )
        return found[0]

    def values(self, key: str, **where: Any) -> list[Any]:
        """The distinct values of ``key`` among the rows matching ``where``, in row order."""
        return list(dict.fromkeys(r[key] for r in self.select(**where) if key in r))

    def validate(self) -> Record:
        """Return this record if it may be saved or shown; else raise :class:`ValueError`
        naming the record and every fault found.

        A record must come from a GPU (provenance ``mode`` ``"gpu"``) and carry
        :data:`PROVENANCE_KEYS` with a positive, finite ``copy_gbps``; hold at least one
        row, each a dict with one of :data:`MEASURED_KEYS` and only finite numbers; and
        where a row has a time with its spread, ``0 < p20_ms <= median_ms <= p80_ms``.
        A record read from a file must be named as the file is.
        """
        faults = []
        prov = self.provenance if isinstance(self.provenance, dict) else {}
        if prov.get("mode") != "gpu":
            faults.append(f"provenance mode is {prov.get('mode')!r}, not 'gpu'")
        missing = [k for k in PROVENANCE_KEYS if prov.get(k) in (None, "")]
        if missing:
            faults.append(f"provenance lacks {', '.join(missing)}")
        elif not _positive(prov["copy_gbps"]):
            faults.append(f"provenance copy_gbps is {prov['copy_gbps']!r}")
        if self.path is not None and Path(self.path).stem != self.name:
            faults.append(f"its file is named {Path(self.path).name}")
        if not isinstance(self.rows, list) or not self.rows:
            faults.append("it has no rows")
        else:
            faults += [f"row {i} {f}" for i, row in enumerate(self.rows) if (f := _row_fault(row))]
        if faults:
            where = f" ({self.path})" if self.path else ""
            more = f"; and {len(faults) - 5} more" if len(faults) > 5 else ""
            shown = "; ".join(faults[:5])
            raise ValueError(f"record {self.name!r}{where} is not a measurement: {shown}{more}")
        return self

    def to_json(self) -> str:
        d = asdict(self)
        d.pop("live")
        d.pop("path")
        return json.dumps(d, indent=1, sort_keys=True)


def _positive(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < math.inf


def _row_fault(row: Any) -> str | None:
    """What is wrong with one row of a record (see :meth:`Record.validate`), or None."""
    if not isinstance(row, dict):
        return f"is a {type(row).__name__}, not a dict"
    if not any(k in row for k in MEASURED_KEYS):
        return f"holds nothing measured (none of {', '.join(MEASURED_KEYS)}): {sorted(row)}"
    bad = [k for k, v in row.items() if isinstance(v, float) and not math.isfinite(v)]
    if bad:
        return f"has {', '.join(f'{k}={row[k]}' for k in bad)}"
    if "median_ms" in row:
        if not _positive(row["median_ms"]):
            return f"has median_ms={row['median_ms']!r}"
        spread = [row.get("p20_ms"), row["median_ms"], row.get("p80_ms")]
        if None not in spread and not spread[0] <= spread[1] <= spread[2]:
            return f"has p20_ms, median_ms, p80_ms = {spread}, out of order"
    return None


def _record_dir() -> Path:
    return Path(os.environ.get(RECORD_DIR_ENV) or "tilebook-records")


def save_record(record: Record, directory: str | os.PathLike | None = None) -> Path:
    """Write ``record`` as ``<directory>/<name>.json``.  Only live GPU records are saved,
    and only those that pass :meth:`Record.validate`."""
    if not record.live or record.provenance.get("mode") != "gpu":
        raise ValueError(
            f"refusing to save record {record.name!r}: it was not measured live on a GPU"
        )
    record.validate()
    out_dir = Path(directory) if directory is not None else _record_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{record.name}.json"
    path.write_text(record.to_json() + "\n")
    record.path = str(path)
    return path


def record_sets() -> dict[str, Path]:
    """The committed record sets: GPU kind -> its folder under :data:`RECORDS_ROOT`."""
    if not RECORDS_ROOT.is_dir():
        return {}
    return {
        d.name: d for d in sorted(RECORDS_ROOT.iterdir()) if d.is_dir() and any(d.glob("*.json"))
    }


def _set_summary(folder: Path) -> tuple[set[str], str, str | None]:
    """A set's record names, its newest date and the GPU that measured it."""
    names, newest, gpu = set(), "", None
    for path in folder.glob("*.json"):
        prov = json.loads(path.read_text()).get("provenance", {})
        names.add(path.stem)
        newest = max(newest, str(prov.get("date", "")))
        gpu = gpu or prov.get("gpu")
    return names, newest, gpu


def shown_records_dir() -> Path:
    """The folder of committed records that a CPU build shows.

    ``$TILEBOOK_RECORDS_GPU`` names a kind; otherwise the newest *complete* set, one
    holding every record that any set holds (a set that lacks some is shown only
    where none is complete: then the one with the most records, newest first).  One
    set is shown whole, so that every plot of a page speaks for the same GPU.
    """
    sets = record_sets()
    wanted = os.environ.get(RECORDS_GPU_ENV, "").strip()
    if wanted:
        if wanted not in sets:
            raise LookupError(
                f"{RECORDS_GPU_ENV}={wanted!r}: no committed records of that GPU kind "
                f"(there are: {', '.join(sets) or 'none'})"
            )
        return sets[wanted]
    if not sets:
        return RECORDS_ROOT
    summaries = {kind: _set_summary(folder) for kind, folder in sets.items()}
    every = set().union(*(names for names, _, _ in summaries.values()))
    best = max(
        summaries,
        key=lambda k: (summaries[k][0] >= every, len(summaries[k][0]), summaries[k][1]),
    )
    return sets[best]


def shown_records_gpu() -> str | None:
    """The name of the GPU (as CUDA reports it) whose records a CPU build shows."""
    folder = shown_records_dir()
    return _set_summary(folder)[2] if folder.is_dir() else None


def _committed_dir() -> Path:
    """The committed records this process reads: on a GPU, those of this GPU's kind
    where there are any (a build never shows another GPU's record when its own
    exists); otherwise the set a CPU build shows."""
    if runtime.is_gpu():
        from .datasheet import gpu_kind

        own = RECORDS_ROOT / gpu_kind(torch.cuda.get_device_name())
        if own.is_dir() and any(own.glob("*.json")):
            return own
    return shown_records_dir()


def load_record(name: str, directory: str | os.PathLike | None = None) -> Record | None:
    """The record called ``name``, or None if there is none.

    With ``directory``, from there alone.  Otherwise from ``$TILEBOOK_RECORD_DIR``
    (this build's live records) first, then from the committed records
    (:func:`_committed_dir`).  A record loaded from disk is never ``live``: its
    :meth:`Record.caption` says "recorded on" with its GPU, versions, date and commit.
    One that fails :meth:`Record.validate` (edited by hand, cut short) raises
    :class:`ValueError` naming its file: a page never shows it.
    """
    if directory is not None:
        candidates = [Path(directory)]
    elif os.environ.get(RECORD_DIR_ENV):
        candidates = [Path(os.environ[RECORD_DIR_ENV]), _committed_dir()]
    else:
        candidates = [_committed_dir()]
    for d in candidates:
        path = d / f"{name}.json"
        if path.exists():
            try:
                data = json.loads(path.read_text())
            except json.JSONDecodeError as exc:
                raise ValueError(f"record {name!r} ({path}) is not JSON: {exc}") from exc
            if not isinstance(data, dict):
                raise ValueError(f"record {name!r} ({path}) is not a JSON object")
            return Record(
                name=data.get("name"),
                title=data.get("title", data.get("name")),
                rows=data.get("rows"),
                provenance=data.get("provenance") or {},
                notes=data.get("notes", {}),
                live=False,
                path=str(path),
            ).validate()
    return None


def commit_records(built: str | os.PathLike) -> list[Path]:
    """Copy the GPU-measured records of a run (a ``$TILEBOOK_RECORD_DIR``) into the
    committed set of the GPU that measured each, ``records/<kind>/``; return the
    paths written.  What ``nox -s record``, ``nox -s bench`` and
    ``nox -s docs -- --save-records`` call.  A record of CPU mode is never copied; one
    of a GPU that fails :meth:`Record.validate` raises before anything is copied."""
    from .datasheet import gpu_kind

    chosen = []
    for path in sorted(Path(built).glob("*.json")):
        prov = json.loads(path.read_text()).get("provenance", {})
        if prov.get("mode") != "gpu" or not prov.get("gpu"):
            continue
        load_record(path.stem, path.parent)  # raises for a broken record
        chosen.append((path, RECORDS_ROOT / gpu_kind(str(prov["gpu"]))))
    written = []
    for path, folder in chosen:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / path.name).write_text(path.read_text())
        written.append(folder / path.name)
    return written


#: The committed records a CPU build shows (:func:`shown_records_dir`), as of import.
RECORDS_DIR = shown_records_dir()


def record_or_measure(
    name: str,
    title: str,
    sweep: Callable[[], Sequence[dict[str, Any]]],
    *,
    notes: dict[str, Any] | None = None,
    save: bool = True,
) -> Record | None:
    """The heart of the two-mode rule.

    On a GPU, run ``sweep()`` (which measures and returns rows), wrap the rows in a
    live :class:`Record` with provenance and the copy ceiling, save it, and return it.
    On a CPU, return the committed record of the same name, or None when there is
    none (callers then say so in text instead of plotting).
    """
    if runtime.is_gpu():
        rows = list(sweep())
        prov = provenance()
        prov["copy_gbps"] = copy_bandwidth().gbps
        rec = Record(name, title, rows, prov, dict(notes or {}), live=True)
        if save:
            save_record(rec)
        return rec
    return load_record(name)
