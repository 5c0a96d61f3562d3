"""Build the site once per test session (CPU mode) for the site and browser tests.

The build takes minutes, so it starts in the background as soon as a session has
collected a test that needs it (:func:`start`), and runs beside the other tests;
the ``built_site`` fixture waits for it (:func:`wait`).  Under pytest-xdist the
controller starts it and every worker shares it.  After it, the same process builds again over it, as a
maintainer's second ``nox -s docs`` does, and writes what that rebuild did to
``rebuild.json`` for the test of it.

    python tests/site_build.py OUT    # build into OUT (html/, build.log, ...)
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LESSON_07 = "lessons/03_real_kernels/07_vector_add.html"


# What a build writes into its source tree: never copied from the checkout.
_WRITTEN = {
    ("docs", "_build"),
    ("docs", "lessons"),
    ("docs", "api", "generated"),
    ("docs", "sg_execution_times.rst"),
}


def _ignore_written(top: Path):
    def ignore(folder, names):
        rel = Path(folder).relative_to(top.parent).parts
        return [n for n in names if (*rel, n) in _WRITTEN or n == "__pycache__"]

    return ignore


def source_tree(out: Path) -> Path:
    """The private checkout a build into ``out`` reads: ``out/src``."""
    return out / "src"


def _make_source_tree(root: Path) -> None:
    """Copy docs/ and gallery/ (what sphinx-gallery writes beside) into ``root`` and link
    everything else of the checkout, so that a build never writes into the checkout
    (a maintainer's ``nox -s docs`` and a test run can then go on at once)."""
    root.mkdir(parents=True)
    for entry in ROOT.iterdir():
        if entry.name in ("docs", "gallery"):
            shutil.copytree(entry, root / entry.name, ignore=_ignore_written(entry))
        else:
            (root / entry.name).symlink_to(entry)


def _build(out: Path, *, fresh: bool = True) -> tuple[Path, str, int]:
    """Run sphinx-build (warnings are errors) in CPU mode: (html dir, log, return code).

    The build reads a private copy of the sources (``source_tree(out)``) and writes only
    under ``out``.  ``fresh=False`` builds again over what a build into ``out`` left, as a
    maintainer's second ``nox -s docs`` does.
    """
    env = dict(os.environ)
    env["TILEBOOK_MODE"] = "cpu"
    env.pop("TILEBOOK_RECORD_DIR", None)  # plot only what is committed
    # What each lesson launched, for tests/test_lesson_targets.py (the first build runs
    # every lesson; a rebuild runs none).
    if fresh:
        env["TILEBOOK_LAUNCH_LOG"] = str(out / "launches")
    html = out / "html"
    doctrees = out / "doctrees"
    root = source_tree(out)
    if fresh or not root.is_dir():
        # Every lesson really runs in this build.
        shutil.rmtree(root, ignore_errors=True)
        _make_source_tree(root)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sphinx",
            "-W",
            "--keep-going",
            "-b",
            "html",
            "-d",
            str(doctrees),
            str(root / "docs"),
            str(html),
        ],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    return html, proc.stdout + proc.stderr, proc.returncode


def _lesson_sources(out: Path) -> dict[str, int]:
    """The lesson pages' sources (which sphinx-gallery writes when it runs a lesson)
    and their modification times."""
    lessons = source_tree(out) / "docs" / "lessons"
    return {str(p): p.stat().st_mtime_ns for p in sorted(lessons.glob("*/[0-9][0-9]_*.rst"))}


def _write(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)  # readers poll for the file: never let them see half of it


def main(out: Path) -> int:
    """Build into ``out``, then rebuild over it; write ``build.log``, ``rebuild.json``
    and, last, ``done.json`` (the build's return code)."""
    out.mkdir(parents=True, exist_ok=True)
    _, log, returncode = _build(out)
    _write(out / "build.log", log)
    if returncode == 0:
        before = _lesson_sources(out)
        _, again, rc = _build(out, fresh=False)
        report = {"returncode": rc, "before": before, "after": _lesson_sources(out)}
        _write(out / "rebuild.json", json.dumps({**report, "log": again}))
    _write(out / "done.json", json.dumps({"returncode": returncode}))
    return returncode


# -- the background build of a test session -----------------------------------------

_STARTED: dict[str, subprocess.Popen] = {}


def start(shared: Path) -> bool:
    """Start the build into ``shared/site`` in the background, unless a process of this
    session did already; True if this call started it.  The process that calls it must
    call :func:`stop` before it ends (pytest's controller does, in tests/conftest.py)."""
    try:
        fd = os.open(shared / "started", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    log = open(shared / "background.log", "w")  # noqa: SIM115 (the child writes it)
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), str(shared / "site")],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=ROOT,
        start_new_session=True,  # its own process group: stop() ends Sphinx with it
    )
    log.close()
    _STARTED[str(shared)] = proc
    # Collect its exit as soon as it comes: the other processes of the session, which
    # watch its pid, then see a build that died, not a zombie that still answers.
    threading.Thread(target=proc.wait, name="site-build-reaper", daemon=True).start()
    os.write(fd, str(proc.pid).encode())
    os.close(fd)
    return True


def _running(shared: Path) -> bool:
    proc = _STARTED.get(str(shared))
    if proc is not None:
        return proc.poll() is None
    try:
        os.kill(int((shared / "started").read_text()), 0)
    except (OSError, ValueError):
        return False
    return True


def building(shared: Path) -> bool:
    """Whether a build started in ``shared`` is still running."""
    return (
        (shared / "started").is_file()
        and not (shared / "site" / "done.json").is_file()
        and _running(shared)
    )


def wait(shared: Path, timeout: float = 2400.0) -> tuple[Path, str]:
    """The background build's html dir and log, once it has finished; raises if it
    failed or died."""
    out = shared / "site"
    done = out / "done.json"
    deadline = time.monotonic() + timeout
    while not done.is_file():
        if not _running(shared) and not done.is_file():
            tail = (shared / "background.log").read_text()[-6000:]
            raise RuntimeError(f"the background site build stopped without a result:\n{tail}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"the site build took more than {timeout:.0f} s")
        time.sleep(1.0)
    returncode = json.loads(done.read_text())["returncode"]
    log = (out / "build.log").read_text()
    if returncode != 0:
        raise RuntimeError(f"sphinx-build failed ({returncode}):\n{log[-6000:]}")
    return out / "html", log


def stop(shared: Path) -> None:
    """End a background build that the session no longer waits for (it may have been
    started by another process of the session: a pytest-xdist worker)."""
    started = shared / "started"
    if started.is_file() and not (shared / "site" / "done.json").is_file():
        with contextlib.suppress(OSError, ValueError):
            os.killpg(int(started.read_text()), signal.SIGTERM)
    proc = _STARTED.pop(str(shared), None)
    if proc is not None:
        proc.wait()


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
