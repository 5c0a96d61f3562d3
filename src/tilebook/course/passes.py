"""What Triton's compiler did to a kernel, pass by pass, read from its own IR dumps.

Triton's MLIR passes print the module before each pass when the environment
variable ``MLIR_ENABLE_DUMP=1`` is set, into the file ``MLIR_DUMP_PATH`` names.
Both are read by Triton's C++ code (they are not among :mod:`triton.knobs`),
once per process, so :func:`compile_with_passes` compiles in child processes
of its own: always afresh (``TRITON_ALWAYS_COMPILE=1``), into a Triton cache
of their own (``TRITON_CACHE_DIR``), with ``TRITON_KERNEL_DUMP=1`` writing
each stage into ``TRITON_DUMP_DIR`` too.  For each compile it returns::

    t = compile_with_passes({"sm_90": {"arch": 90}}, kernel=k, signature=sig)["sm_90"]
    t.kernel                     # the CompiledKernel of tilebook.course.aot: every stage
    t.passes.changed("ttgir")    # the passes that changed the kernel on the way to TTGIR
    t.passes.diff("tritongpu-coalesce")   # what one of them changed
    t.front_end                  # the TTIR that Triton's code generator wrote
    t.cache_files                # the files of the kernel's entry in Triton's cache

A pass belongs to the IR it produced: the passes before
``convert-triton-to-tritongpu`` work on TTIR, that one and the passes up to
``convert-triton-gpu-to-llvm`` produce TTGIR, and from there on the module is
MLIR's LLVM dialect, which Triton translates into LLVM IR.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import pickle
import re
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

from .. import runtime
from .aot import AotError, CompiledKernel
from .aot.lines import mlir_line_map
from .aot.shipping import kernel_ref, load_kernel

__all__ = [
    "IRS",
    "PassLog",
    "PassRun",
    "Traced",
    "compile_with_passes",
    "parse_mlir_dump",
]

#: The IRs the MLIR passes produce, in order.
IRS = ("ttir", "ttgir", "llvm")
#: The passes that turn one IR into the next.
TO_TTGIR = "convert-triton-to-tritongpu"
TO_LLVM = "convert-triton-gpu-to-llvm"

# "Before Class: arg{options} (...)" (the MLIR of Triton 3.8 on) or
# "Before Class (arg) (...)" (Triton 3.6).
_HEADER = re.compile(
    r"^// -----// IR Dump Before (\w+)(?:: ([\w-]+)(?:\{.*\})?| \(([\w-]+)\)) "
    r"\('([\w.]+)' operation(?:: @\w+)?\) //----- //$"
)
_LOC_LINE = re.compile(r"^#loc\d* = ")
_TRAILING_LOC = re.compile(r"\s+loc\((?:[^()]|\([^()]*\))*\)\s*$")
_SSA_SUFFIX = re.compile(r"(%[A-Za-z_]\w*?)_\d+\b")
_NUMBERED = re.compile(r"%\d+\b")
_JOB_KEYS = {
    "kernel",
    "signature",
    "constexprs",
    "arch",
    "num_warps",
    "num_stages",
    "divisible_by_16",
    "options",
}


class PassRun(NamedTuple):
    """One pass over the module.

    ``name`` is the pass's argument (``"tritongpu-coalesce"``), ``cls`` its C++
    class (``"TritonGPUCoalesce"``), ``ir`` the IR it produced (one of
    :data:`IRS`), ``changed`` whether the module differed after it (``None``
    for the last pass, whose output was not dumped) and ``index`` its place
    in the log.
    """

    name: str
    cls: str
    ir: str
    changed: bool | None
    index: int


class PassLog:
    """The MLIR passes of one compile, in the order they ran, with the module before each."""

    def __init__(self, runs: list[PassRun], modules: list[str]) -> None:
        if len(runs) != len(modules):
            raise ValueError("one module text per pass")
        self.runs = runs
        self.modules = modules

    def __len__(self) -> int:
        return len(self.runs)

    def __repr__(self) -> str:
        return f"<PassLog: {len(self)} passes, {len(self.changed())} changed the kernel>"

    def ran(self, name: str) -> bool:
        """Whether the pass ``name`` ran (changed the kernel or not)."""
        return any(r.name == name for r in self.runs)

    def did(self, name: str) -> bool:
        """Whether the pass ``name`` ran and changed the kernel at least once."""
        return any(r.name == name and r.changed for r in self.runs)

    def changed(self, ir: str | None = None) -> list[PassRun]:
        """The passes that changed the kernel, on the way to ``ir`` (default: all)."""
        if ir is not None and ir not in IRS:
            raise ValueError(f"ir must be one of {', '.join(IRS)}, got {ir!r}")
        return [r for r in self.runs if r.changed and (ir is None or r.ir == ir)]

    def before(self, name: str, occurrence: int = 0) -> str:
        """The module as the pass ``name`` received it (its ``occurrence``-th run)."""
        return self.modules[self._find(name, occurrence).index]

    def after(self, name: str, occurrence: int = 0) -> str:
        """The module as the pass ``name`` left it; ``ValueError`` for the last pass."""
        run = self._find(name, occurrence)
        if run.index + 1 >= len(self.modules):
            raise ValueError(f"{name} is the last pass: its output was not dumped")
        return self.modules[run.index + 1]

    def diff(self, name: str, occurrence: int = 0, *, width: int = 88) -> list[str]:
        """The lines the pass ``name`` removed (``-``) and added (``+``).

        Location records (``#loc`` lines, trailing ``loc(...)``) are left out
        and value names lose their numbering (``%x_5`` reads ``%x``, ``%12``
        reads ``%N``), so that a
        line the pass only renumbered does not count as changed; lines are cut
        to ``width`` characters.
        """

        def body(text: str) -> list[str]:
            return [
                _NUMBERED.sub("%N", _SSA_SUFFIX.sub(r"\1", _TRAILING_LOC.sub("", line).rstrip()))
                for line in text.splitlines()
                if line.strip() and not _LOC_LINE.match(line)
            ]

        old, new = body(self.before(name, occurrence)), body(self.after(name, occurrence))
        out = []
        for line in difflib.ndiff(old, new):
            if line[:1] in "+-":
                out.append(line if len(line) <= width else line[: width - 3] + "...")
        return out

    def _find(self, name: str, occurrence: int) -> PassRun:
        found = [r for r in self.runs if r.name == name]
        if not found:
            raise ValueError(f"no pass {name!r} ran; the passes were {self._names()}")
        if not 0 <= occurrence < len(found):
            raise ValueError(f"{name} ran {len(found)} time(s); occurrence {occurrence} is out")
        return found[occurrence]

    def _names(self) -> str:
        return ", ".join(dict.fromkeys(r.name for r in self.runs))


def _split_compiles(text: str) -> list[str]:
    """One piece of dump text per compile: each begins with the same first header."""
    lines = text.splitlines(keepends=True)
    first = next((line for line in lines if _HEADER.match(line.rstrip("\n"))), None)
    if first is None:
        return []
    pieces: list[list[str]] = []
    for line in lines:
        if line == first:
            pieces.append([])
        if pieces:
            pieces[-1].append(line)
    return ["".join(p) for p in pieces]


def parse_mlir_dump(text: str) -> PassLog:
    """The :class:`PassLog` of one compile's ``MLIR_ENABLE_DUMP`` output.

    Only module-level dumps count: a pass nested in another (the inliner's
    canonicaliser on one function) belongs to the pass around it.

    Raises
    ------
    ValueError
        The text holds no dump, or lacks one of the two passes that turn TTIR
        into TTGIR and TTGIR into LLVM (``convert-triton-to-tritongpu``,
        ``convert-triton-gpu-to-llvm``): then it is not a whole compile.
    """
    dumps: list[tuple[str, str, list[str]]] = []
    current: list[str] | None = None
    for line in text.splitlines(keepends=True):
        m = _HEADER.match(line.rstrip("\n"))
        if m:
            current = None
            if m.group(4) == "builtin.module":
                current = []
                dumps.append((m.group(2) or m.group(3), m.group(1), current))
            continue
        if line.startswith("// -----//"):  # another kind of dump (the pipeliner's own)
            current = None
            continue
        if current is not None:
            current.append(line)
    if not dumps:
        raise ValueError("no MLIR pass dump in the text (was MLIR_ENABLE_DUMP=1 set?)")
    names = [name for name, _, _ in dumps]
    for anchor in (TO_TTGIR, TO_LLVM):
        if anchor not in names:
            raise ValueError(f"the dump has no {anchor} pass: not the dump of a whole compile")
    to_ttgir, to_llvm = names.index(TO_TTGIR), names.index(TO_LLVM)
    modules = ["".join(body).strip("\n") + "\n" for _, _, body in dumps]
    runs = []
    for i, (name, cls, _) in enumerate(dumps):
        ir = "ttir" if i < to_ttgir else "ttgir" if i < to_llvm else "llvm"
        changed = modules[i + 1] != modules[i] if i + 1 < len(modules) else None
        runs.append(PassRun(name, cls, ir, changed, i))
    return PassLog(runs, modules)


@dataclasses.dataclass(repr=False)
class Traced:
    """One compile with its passes: what :func:`compile_with_passes` returns per job.

    Attributes
    ----------
    kernel : CompiledKernel
        Every stage, its source lines and resources (see :mod:`tilebook.course.aot`).
    passes : PassLog
        The MLIR passes that ran, in order.
    front_end : str
        The TTIR that Triton's code generator wrote from the Python AST, before
        any pass (the ``.source`` file of the cache entry).
    front_end_lines : list
        Its source-line map, as ``CompiledKernel.line_map`` has for the stages.
    cache_files : dict of str to int
        Name and size in bytes of each file Triton wrote into the kernel's
        cache entry (a directory named by a hash, under ``TRITON_CACHE_DIR``).
    dump_files : list of str
        The files ``TRITON_KERNEL_DUMP=1`` wrote into ``TRITON_DUMP_DIR``.
    """

    kernel: CompiledKernel
    passes: PassLog
    front_end: str
    front_end_lines: list
    cache_files: dict[str, int]
    dump_files: list[str]

    def __repr__(self) -> str:
        return f"<Traced {self.kernel.summary()}; {self.passes!r}>"

    def caption(self) -> str:
        """Where the text comes from, for a table, a widget or a list of claims."""
        version = self.kernel.extra.get("triton_version", "?")
        return f"compiled ahead of time for sm_{self.kernel.arch} with Triton {version}"


def _check_job(label: str, job: Mapping[str, Any]) -> None:
    unknown = sorted(set(job) - _JOB_KEYS)
    if unknown:
        raise TypeError(
            f"[{label}] unknown compile option {', '.join(map(repr, unknown))}; the "
            f"options are {', '.join(sorted(_JOB_KEYS))}"
        )
    for key in ("kernel", "signature"):
        if key not in job:
            raise TypeError(f"[{label}] a compile job needs {key!r}")


def _child_env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    src = str(Path(__file__).resolve().parents[2])  # the directory holding tilebook/
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    env.update(
        {
            runtime.MODE_ENV: "aot",
            "MLIR_ENABLE_DUMP": "1",
            "MLIR_DUMP_PATH": str(tmp / "mlir.txt"),
            "TRITON_ALWAYS_COMPILE": "1",
            "TRITON_CACHE_DIR": str(tmp / "cache"),
            "TRITON_KERNEL_DUMP": "1",
            "TRITON_DUMP_DIR": str(tmp / "dump"),
        }
    )
    return env


def _child_main() -> None:
    """Entry point of a compiling child: pickled jobs in, JSON results out."""
    from .aot import compile_kernel

    payload_path, result_path = sys.argv[1], sys.argv[2]
    with open(payload_path, "rb") as f:
        payload = pickle.load(f)  # written by our parent a moment ago
    for entry in payload["sys_path"]:
        if entry not in sys.path:
            sys.path.append(entry)
    cache_dir = Path(os.environ["TRITON_CACHE_DIR"])
    dump_dir = Path(os.environ["TRITON_DUMP_DIR"])

    def entries(root: Path) -> set[Path]:
        return set(root.iterdir()) if root.is_dir() else set()

    kernels: dict[int, Any] = {}
    results = []
    for job in payload["jobs"]:
        cached, dumped = entries(cache_dir), entries(dump_dir)
        try:
            fn = load_kernel(job.pop("kernel"), kernels)
            k = compile_kernel(fn, **job)
            new_cache = sorted(entries(cache_dir) - cached)
            files = {p.name: p.stat().st_size for d in new_cache for p in sorted(d.iterdir())}
            source = next((p for d in new_cache for p in d.glob("*.source")), None)
            results.append(
                {
                    "ok": dataclasses.asdict(k),
                    "front_end": source.read_text() if source else "",
                    "cache_files": files,
                    "dump_files": sorted(
                        p.name for d in entries(dump_dir) - dumped for p in d.iterdir()
                    ),
                }
            )
        except Exception as exc:  # noqa: BLE001  (every job gets its own report)
            known = isinstance(exc, (AotError, ValueError, TypeError))
            results.append(
                {
                    "error": str(exc) if known else "".join(traceback.format_exception(exc)),
                    "type": type(exc).__name__,
                }
            )
    with open(result_path, "w") as f:
        json.dump(results, f)


def _run_child(jobs: list[dict[str, Any]], timeout: float) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="tilebook_passes_") as name:
        tmp = Path(name)
        payload, result = tmp / "jobs.pickle", tmp / "results.json"
        payload.write_bytes(pickle.dumps({"sys_path": sys.path, "jobs": jobs}))
        code = "from tilebook.course.passes import _child_main; _child_main()"
        try:
            proc = subprocess.run(
                [sys.executable, "-c", code, str(payload), str(result)],
                capture_output=True,
                text=True,
                env=_child_env(tmp),
                timeout=timeout * len(jobs),
                check=False,
            )
        except subprocess.TimeoutExpired:
            error = f"the compiling process ran past {timeout * len(jobs):.0f} s"
            return [{"error": error, "type": "AotError"}] * len(jobs)
        if proc.returncode != 0 or not result.exists():
            tail = (proc.stderr or proc.stdout)[-4000:]
            error = f"the compiling process failed (exit {proc.returncode}):\n{tail}"
            return [{"error": error, "type": "AotError"}] * len(jobs)
        outcomes = json.loads(result.read_text())
        dump = tmp / "mlir.txt"
        pieces = _split_compiles(dump.read_text()) if dump.exists() else []
        done = [o for o in outcomes if "ok" in o]
        if len(pieces) != len(done):
            error = (
                f"expected one MLIR dump per compile, found {len(pieces)} for {len(done)} "
                "compiles: does this Triton read MLIR_ENABLE_DUMP and MLIR_DUMP_PATH?"
            )
            return [{"error": error, "type": "AotError"}] * len(jobs)
        it = iter(pieces)
        for o in done:
            o["dump"] = next(it)
        return outcomes


def compile_with_passes(
    jobs: Mapping[str, Mapping[str, Any]],
    *,
    workers: int | None = None,
    timeout: float = 300.0,
    **common: Any,
) -> dict[str, Traced]:
    """Compile kernels ahead of time and log every MLIR pass that ran on each.

    Parameters
    ----------
    jobs : mapping of label to dict
        Each job gives the arguments of :func:`tilebook.course.aot.compile_kernel`
        that it changes (``kernel``, ``signature``, ``constexprs``, ``arch``,
        ``num_warps``, ``num_stages``, ``divisible_by_16``, ``options``);
        ``common`` gives the rest.
    workers : int, optional
        Child processes (default: one per CPU core, at most one per job); each
        compiles its share of the jobs one after another.  Children are used
        on a GPU machine too: the dump settings are read once per process.
    timeout : float
        Seconds allowed per job.

    Returns
    -------
    dict of str to Traced
        One :class:`Traced` per label, in the order of ``jobs``.

    Raises
    ------
    AotError
        A compile failed (every job still ran; the message names each failure).
    ValueError, TypeError
        A job's arguments are wrong.
    """
    if not isinstance(jobs, Mapping) or not jobs:
        raise TypeError(f"jobs must be a non-empty dict of label -> options, got {jobs!r}")
    if workers is not None and (
        isinstance(workers, bool) or not isinstance(workers, int) or workers < 1
    ):
        raise ValueError(f"workers must be a positive int, got {workers!r}")
    labels = [str(label) for label in jobs]
    prepared = []
    for label, job in zip(labels, jobs.values(), strict=True):
        if not isinstance(job, Mapping):
            raise TypeError(f"[{label}] each job must be a dict of compile options, got {job!r}")
        merged = {**common, **job}
        _check_job(label, merged)
        prepared.append({**merged, "kernel": kernel_ref(merged["kernel"])})
    n = min(len(prepared), workers or os.cpu_count() or 1)
    chunks = [list(range(i, len(prepared), n)) for i in range(n)]
    outcomes: list[dict[str, Any]] = [{}] * len(prepared)

    def run(indices: list[int]) -> None:
        for i, out in zip(
            indices, _run_child([prepared[i] for i in indices], timeout), strict=True
        ):
            outcomes[i] = out

    with ThreadPoolExecutor(max_workers=n) as pool:
        list(pool.map(run, chunks))
    failures = [(label, o) for label, o in zip(labels, outcomes, strict=True) if "ok" not in o]
    if failures:
        kinds = {o["type"] for _, o in failures}
        cls = AotError
        if len(kinds) == 1:
            cls = {"ValueError": ValueError, "TypeError": TypeError}.get(kinds.pop(), AotError)
        text = "\n\n".join(f"[{label}] {o['error']}" for label, o in failures)
        raise cls(f"{len(failures)} of the compile jobs failed:\n\n{text}")
    out = {}
    for label, o in zip(labels, outcomes, strict=True):
        out[label] = Traced(
            kernel=CompiledKernel(**o["ok"]),
            passes=parse_mlir_dump(o["dump"]),
            front_end=o["front_end"],
            front_end_lines=mlir_line_map(o["front_end"]),
            cache_files=o["cache_files"],
            dump_files=o["dump_files"],
        )
    return out
