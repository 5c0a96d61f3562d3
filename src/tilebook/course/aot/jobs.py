"""compile_kernel and compile_many: in this process on a GPU, in child processes on a CPU."""

from __future__ import annotations

import inspect
import json
import os
import pickle
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ... import runtime
from ...arch import parse_arch
from .compiler import AotError, compile_here
from .kernel import CompiledKernel
from .shipping import jit_function, kernel_ref, load_kernel, python_function, resolve_spec

__all__ = ["compile_kernel", "compile_many"]

_JOB_KEYS = (
    "kernel",
    "signature",
    "constexprs",
    "arch",
    "num_warps",
    "num_stages",
    "divisible_by_16",
    "options",
)
_ERRORS = {"ValueError": ValueError, "TypeError": TypeError}


def _label(kernel: Any) -> str:
    if isinstance(kernel, str):
        return kernel.rpartition(":")[2] or kernel
    return getattr(python_function(kernel), "__name__", "kernel")


def _prepare(job: Mapping[str, Any]) -> dict[str, Any]:
    """Check one job's arguments in the caller's process, where the mistake was made."""
    unknown = sorted(set(job) - set(_JOB_KEYS))
    if unknown:
        raise TypeError(
            f"unknown compile option {', '.join(map(repr, unknown))}; the options are "
            f"{', '.join(_JOB_KEYS)}"
        )
    for key in ("kernel", "signature"):
        if key not in job:
            raise TypeError(f"a compile job needs {key!r}")
    kernel = job["kernel"]
    # A dict is what shipping.kernel_ref made of a kernel already (one noted while a
    # lesson ran, sent on later: docs/_ext/lesson_launches.py).
    if not isinstance(kernel, (str, dict)):
        python_function(kernel)  # a clear TypeError for anything but a kernel
    signature = job["signature"]
    if not isinstance(signature, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in signature.items()
    ):
        raise TypeError(
            f"signature must map argument names to Triton types like '*fp32', got {signature!r}"
        )
    constexprs = job.get("constexprs") or {}
    if not isinstance(constexprs, Mapping):
        raise TypeError(f"constexprs must map argument names to values, got {constexprs!r}")
    num_warps = job.get("num_warps", 4)
    if isinstance(num_warps, bool) or num_warps not in (1, 2, 4, 8, 16, 32):
        raise ValueError(f"num_warps must be a power of two from 1 to 32, got {num_warps!r}")
    num_stages = job.get("num_stages", 3)
    if isinstance(num_stages, bool) or not isinstance(num_stages, int) or num_stages < 1:
        raise ValueError(f"num_stages must be a positive int, got {num_stages!r}")
    divisible = job.get("divisible_by_16")
    if divisible is None:
        divisible = [n for n, t in signature.items() if t.startswith("*")]
    elif isinstance(divisible, str) or not all(isinstance(n, str) for n in divisible):
        raise TypeError(f"divisible_by_16 must be a list of argument names, got {divisible!r}")
    options = job.get("options") or {}
    if not isinstance(options, Mapping):
        raise TypeError(f"options must be a dict of Triton compile options, got {options!r}")
    if not isinstance(kernel, (str, dict)):
        _check_names(kernel, signature, constexprs)
    return {
        "kernel": kernel,
        "signature": dict(signature),
        "constexprs": dict(constexprs),
        "arch": parse_arch(job.get("arch", 90)),
        "num_warps": num_warps,
        "num_stages": num_stages,
        "divisible_by_16": list(divisible),
        "options": dict(options),
    }


def _check_names(kernel: Any, signature: Mapping, constexprs: Mapping) -> None:
    from .compiler import check_arguments

    fn = python_function(kernel)
    names = list(inspect.signature(fn).parameters)
    check_arguments(fn.__name__, names, dict(signature), dict(constexprs), [])


def _compile_job(job: dict[str, Any], kernel) -> dict[str, Any]:
    return compile_here(
        kernel,
        job["signature"],
        job["constexprs"],
        job["arch"],
        job["num_warps"],
        job["num_stages"],
        job["divisible_by_16"],
        job["options"],
    )


def _outcome(exc: BaseException) -> dict[str, Any]:
    kind = type(exc).__name__
    message = str(exc)
    if not isinstance(exc, (AotError, ValueError, TypeError)):
        message = "".join(traceback.format_exception(exc))
    return {"error": message, "type": kind}


def _run_here(job: dict[str, Any]) -> dict[str, Any]:
    try:
        k = job["kernel"]
        fn = jit_function(resolve_spec(k) if isinstance(k, str) else k, _label(k))
        return {"ok": _compile_job(job, fn)}
    except Exception as exc:  # noqa: BLE001  (reported with the job's label by the caller)
        return _outcome(exc)


def _child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env[runtime.MODE_ENV] = "aot"
    src = str(Path(__file__).resolve().parents[3])  # the directory holding tilebook/
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    return env


def _run_children(jobs: list[dict[str, Any]], workers: int, timeout: float) -> list[dict]:
    payloads = []
    for job in jobs:
        ref = job["kernel"]
        payloads.append({**job, "kernel": ref if isinstance(ref, dict) else kernel_ref(ref)})
    chunks = [list(range(i, len(jobs), workers)) for i in range(workers)]
    results: list[dict] = [{}] * len(jobs)
    env = _child_env()

    def run(indices: list[int]) -> None:
        with tempfile.TemporaryDirectory(prefix="tilebook_aot_") as tmp:
            payload = Path(tmp, "jobs.pickle")
            result = Path(tmp, "results.json")
            try:
                data = pickle.dumps({"sys_path": sys.path, "jobs": [payloads[i] for i in indices]})
            except Exception as exc:  # noqa: BLE001  (e.g. a tl.dtype that will not pickle)
                for i in indices:
                    results[i] = {
                        "error": f"constexprs and options must be plain values: {exc}",
                        "type": "TypeError",
                    }
                return
            payload.write_bytes(data)
            code = "from tilebook.course.aot.jobs import _child_main; _child_main()"
            try:
                proc = subprocess.run(
                    [sys.executable, "-c", code, str(payload), str(result)],
                    capture_output=True,
                    text=True,
                    env=env,
                    timeout=timeout * len(indices),
                    check=False,
                )
            except subprocess.TimeoutExpired:
                for i in indices:
                    results[i] = {
                        "error": f"the compiling process ran past {timeout * len(indices):.0f} s",
                        "type": "AotError",
                    }
                return
            if proc.returncode != 0 or not result.exists():
                tail = (proc.stderr or proc.stdout)[-4000:]
                for i in indices:
                    results[i] = {
                        "error": f"the compiling process failed (exit {proc.returncode}):\n{tail}",
                        "type": "AotError",
                    }
                return
            for i, out in zip(indices, json.loads(result.read_text()), strict=True):
                results[i] = out

    with ThreadPoolExecutor(max_workers=len(chunks)) as pool:
        list(pool.map(run, chunks))
    return results


def _child_main() -> None:
    """Entry point of the compiling child process: pickled jobs in, JSON results out."""
    payload_path, result_path = sys.argv[1], sys.argv[2]
    with open(payload_path, "rb") as f:
        payload = pickle.load(f)  # written by our parent a moment ago
    for entry in payload["sys_path"]:
        if entry not in sys.path:
            sys.path.append(entry)
    cache: dict[int, Any] = {}
    results = []
    for job in payload["jobs"]:
        ref = job["kernel"]
        try:
            fn = load_kernel(ref, cache)
            results.append({"ok": _compile_job(job, fn)})
        except Exception as exc:  # noqa: BLE001  (every job gets its own report)
            out = _outcome(exc)
            missing = ref.get("ship", {}).get("missing")
            if missing:
                out["error"] += (
                    "\n(globals the kernel reads that could not be sent to the compiling "
                    f"process: {', '.join(missing)})"
                )
            results.append(out)
    with open(result_path, "w") as f:
        json.dump(results, f)


def _raise(failures: list[tuple[str, dict]], many: bool) -> None:
    kinds = {out["type"] for _, out in failures}
    cls = _ERRORS.get(kinds.pop(), AotError) if len(kinds) == 1 else AotError
    if not many:
        raise cls(failures[0][1]["error"])
    text = "\n\n".join(f"[{label}] {out['error']}" for label, out in failures)
    raise cls(f"{len(failures)} of the compile jobs failed:\n\n{text}")


def compile_many(
    jobs: Mapping[str, Mapping[str, Any]] | Sequence[Mapping[str, Any]],
    *,
    workers: int | None = None,
    timeout: float = 300.0,
    **common: Any,
) -> dict[str, CompiledKernel] | list[CompiledKernel]:
    """Compile several kernels or targets ahead of time, in parallel on a CPU.

    Parameters
    ----------
    jobs : mapping of label to dict, or sequence of dicts
        Each job gives the arguments of :func:`compile_kernel` that it changes
        (``kernel``, ``signature``, ``constexprs``, ``arch``, ``num_warps``,
        ``num_stages``, ``divisible_by_16``, ``options``); ``common`` gives the
        rest.
    workers : int, optional
        Child processes in CPU mode (default: one per CPU core, at most one per
        job).  Each compiles its share of the jobs one after another.  On a GPU
        (and in ``TILEBOOK_MODE=aot``) the jobs run in this process.
    timeout : float
        Seconds allowed per job.
    **common
        Arguments every job shares, e.g. ``kernel=..., signature=...``.

    Returns
    -------
    dict or list of CompiledKernel
        A dict with the labels of a mapping, a list in the order of a sequence.

    Raises
    ------
    AotError
        A compile failed (every job still ran; the message names each failure).
    ValueError, TypeError
        A job's arguments are wrong (when every failure is of that kind).

    Examples
    --------
    One kernel for three GPUs:

    >>> ks = compile_many({f"sm_{a}": {"arch": a} for a in (75, 80, 90)},
    ...                   kernel=my_kernel, signature=sig, constexprs=consts)
    >>> print(instruction_table(ks))  # doctest: +SKIP
    """
    if isinstance(jobs, Mapping):
        labels = [str(k) for k in jobs]
        items = list(jobs.values())
    elif isinstance(jobs, Sequence) and not isinstance(jobs, str):
        labels, items = [], list(jobs)
    else:
        raise TypeError(
            f"jobs must be a dict of label -> options or a list of options, got {jobs!r}"
        )
    if not items:
        raise ValueError("compile_many needs at least one job")
    prepared = []
    for job in items:
        if not isinstance(job, Mapping):
            raise TypeError(f"each job must be a dict of compile_kernel arguments, got {job!r}")
        prepared.append(_prepare({**common, **job}))
    if not labels:
        labels = [
            f"{i}: {_label(job['kernel'])} sm_{job['arch']}" for i, job in enumerate(prepared)
        ]
    if workers is not None and (
        isinstance(workers, bool) or not isinstance(workers, int) or workers < 1
    ):
        raise ValueError(f"workers must be a positive int, got {workers!r}")

    if runtime.get_runtime().mode in ("gpu", "aot"):
        outcomes = [_run_here(job) for job in prepared]
    else:
        n = min(len(prepared), workers or os.cpu_count() or 1)
        outcomes = _run_children(prepared, n, timeout)
    failures = [
        (label, out) for label, out in zip(labels, outcomes, strict=True) if "ok" not in out
    ]
    if failures:
        _raise(failures, many=len(prepared) > 1)
    kernels = [CompiledKernel(**out["ok"]) for out in outcomes]
    return dict(zip(labels, kernels, strict=True)) if isinstance(jobs, Mapping) else kernels


def compile_kernel(
    kernel: Any,
    signature: Mapping[str, str],
    constexprs: Mapping[str, Any] | None = None,
    *,
    arch: int | str = 90,
    num_warps: int = 4,
    num_stages: int = 3,
    divisible_by_16: Sequence[str] | None = None,
    options: Mapping[str, Any] | None = None,
    timeout: float = 300.0,
) -> CompiledKernel:
    """Compile a kernel for ``sm_<arch>`` without launching it, on any machine.

    On a GPU (or with ``TILEBOOK_MODE=aot``) Triton compiles in this process; in
    CPU mode, where kernels are interpreter wrappers, a child process with
    ``TILEBOOK_MODE=aot`` compiles and sends the results back.  No GPU is needed
    for any target.

    Parameters
    ----------
    kernel : JITFunction, interpreter wrapper, Autotuner or str
        The kernel object itself (one defined in a lesson script works too: its
        source, its helpers' and the constants they read go to the compiling
        process), or where it lives: ``"tilebook.ops.vector_add:add_kernel"`` or
        ``"path/to/file.py:my_kernel"`` (that file is executed to find it).
        Autotuner and heuristics wrappers are compiled as the kernel inside.
    signature : dict of str to str
        Triton type of each runtime argument: ``{"x_ptr": "*fp32", "n": "i32"}``;
        tensor descriptors as ``"tensordesc<bf16[64, 64]>"``.
    constexprs : dict, optional
        Values of the ``tl.constexpr`` arguments.  A runtime argument given here
        instead of in ``signature`` is compiled as that constant, as Triton
        does for an integer argument equal to 1.
    arch : int or str
        Target GPU: ``75`` or ``"sm_75"`` (T4), ``80`` (A100), ``89`` (L4),
        ``90`` (H100, H200); see :data:`tilebook.course.aot.TARGETS`.
    num_warps, num_stages : int
        Launch options, as in ``kernel[grid](..., num_warps=8, num_stages=4)``.
    divisible_by_16 : list of str, optional
        Arguments a launch would find divisible by 16 (pointers of aligned
        tensors, sizes like 4096); Triton vectorises loads only with this hint.
        Default: every pointer argument.
    options : dict, optional
        Further Triton compile options, e.g. ``{"maxnreg": 128}``.
    timeout : float
        Seconds allowed for the compile.

    Returns
    -------
    CompiledKernel
        Every stage (``k.stage("ptx")``), its source lines
        (``k.lines_for("tl.load(x_ptr", "sass")``) and the resources:
        registers, spills, shared memory, warps.

    Raises
    ------
    TypeError, ValueError
        ``kernel`` is not a kernel, ``arch`` names no known GPU, or
        ``signature``/``constexprs`` do not match the kernel's arguments.
    AotError
        Triton or ``ptxas`` refused the kernel for this target (the message
        carries their text), the kernel needs more shared memory than the
        target has, or the ptxas report could not be read.

    Examples
    --------
    >>> k = compile_kernel("tilebook.ops.vector_add:add_kernel",
    ...                    {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32",
    ...                     "n_elements": "i32"},
    ...                    {"BLOCK_SIZE": 1024, "INT64_OFFSETS": False}, arch=80)
    >>> k.registers > 0, k.instructions("LDG.E.128")  # doctest: +SKIP
    (True, {'LDG.E.128': 2})
    """
    job = {
        "kernel": kernel,
        "signature": signature,
        "constexprs": constexprs,
        "arch": arch,
        "num_warps": num_warps,
        "num_stages": num_stages,
        "divisible_by_16": divisible_by_16,
        "options": options,
    }
    return compile_many([job], workers=1, timeout=timeout)[0]
