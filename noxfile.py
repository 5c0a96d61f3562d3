"""Development tasks: ``nox -s tests``, ``nox -s docs``, ``nox -s lint``, ``nox -s bench``.

On a machine whose Python already has a CUDA build of torch (a GPU box), the
sessions reuse that torch (and whatever else that Python has) instead of
downloading another: see :func:`_reuse_host_packages`.  Set
``TILEBOOK_REUSE_TORCH=0`` to always install fresh, ``=1`` to force reuse.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import nox

nox.needs_version = ">=2025.2.9"
nox.options.default_venv_backend = "uv|virtualenv"
nox.options.sessions = ["lint", "tests"]

ROOT = Path(__file__).parent
PYPROJECT = nox.project.load_toml(ROOT / "pyproject.toml")
BUILD_HTML = ROOT / "docs" / "_build" / "html"


def _host_has_cuda_torch() -> bool:
    """Does the interpreter running nox have a torch that sees a CUDA GPU?"""
    code = "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, timeout=120, check=False
        )
        return proc.returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _want_reuse() -> bool:
    flag = os.environ.get("TILEBOOK_REUSE_TORCH", "auto").strip().lower()
    if flag in ("1", "true", "yes"):
        return True
    if flag in ("0", "false", "no"):
        return False
    return _host_has_cuda_torch()


def _reuse_host_packages(session: nox.Session) -> None:
    """Make the host interpreter's packages visible inside the session's venv.

    ``--system-site-packages`` is not enough when the host Python is itself a
    virtual environment (as on many GPU images): the venv would see the *base*
    Python, not the one that holds torch.  A ``.pth`` file naming the host's
    site-packages works in both cases, and the venv's own packages still come
    first on ``sys.path``.
    """
    venv_site = session.run(
        "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", silent=True
    ).strip()
    host_paths = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    Path(venv_site, "_tilebook_host_site.pth").write_text("\n".join(sorted(host_paths)) + "\n")
    session.log(f"reusing the host's torch and packages from {', '.join(sorted(host_paths))}")


# uv does not see packages that a .pth file adds, so reusing the host's torch needs pip.
REUSE_HOST = _want_reuse()
BACKEND = "virtualenv" if REUSE_HOST else "uv|virtualenv"


def _install(session: nox.Session, *groups: str) -> None:
    """Install tilebook (editable) and the named dependency groups."""
    if REUSE_HOST:
        _reuse_host_packages(session)
    reqs = [r for g in groups for r in nox.project.dependency_groups(PYPROJECT, g)]
    session.install("-e", ".", *reqs)


@nox.session(venv_backend=BACKEND)
def tests(session: nox.Session) -> None:
    """Run the test suite (CPU: Triton's interpreter; GPU tests run when a GPU is present)."""
    _install(session, "tests", "docs")
    session.run("pytest", *session.posargs)


@nox.session(venv_backend=BACKEND)
def docs(session: nox.Session) -> None:
    """Build the site into docs/_build/html (warnings are errors; every lesson runs).

    ``nox -s docs -- --serve`` rebuilds on every change and serves the site
    (sphinx-autobuild) at http://127.0.0.1:8000.  On a GPU, ``nox -s docs --
    --save-records`` also copies the records the lessons just measured into
    ``src/tilebook/records/`` (what CPU builds plot), ready to commit.
    """
    serve = "--serve" in session.posargs
    save_records = "--save-records" in session.posargs
    _install(session, "docs-live" if serve else "docs")
    env = {
        "TILEBOOK_RECORD_DIR": os.environ.get(
            "TILEBOOK_RECORD_DIR", str(BUILD_HTML.parent / "records")
        )
    }
    args = ["-W", "--keep-going", "-b", "html", "docs", str(BUILD_HTML)]
    if serve:
        session.run(
            "sphinx-autobuild",
            *args,
            "--watch",
            "src",
            "--watch",
            "gallery",
            "--port",
            "8000",
            env=env,
        )
    else:
        session.run("sphinx-build", *args, env=env)
        session.log(f"site built: open {BUILD_HTML / 'index.html'}")
        if save_records:
            _save_records(session, Path(env["TILEBOOK_RECORD_DIR"]))


def _save_records(session: nox.Session, built: Path) -> None:
    """Copy GPU-measured records from a build into the package's committed records."""
    import json

    dest = ROOT / "src" / "tilebook" / "records"
    saved = []
    for path in sorted(built.glob("*.json")):
        if json.loads(path.read_text())["provenance"].get("mode") != "gpu":
            continue
        (dest / path.name).write_text(path.read_text())
        saved.append(path.name)
    if not saved:
        session.error("no GPU-measured record in this build: was it built on a GPU?")
    session.log(f"saved {len(saved)} records into {dest}: {', '.join(saved)}")


@nox.session
def lint(session: nox.Session) -> None:
    """ruff over the package, lessons, tests and this file: the lint rules, then the format."""
    session.install(*nox.project.dependency_groups(PYPROJECT, "lint"))
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(venv_backend=BACKEND)
def bench(session: nox.Session) -> None:
    """GPU only: measure every kernel against its baselines and write the records
    that CPU builds plot (into src/tilebook/records, to be committed)."""
    _install(session)
    env = {
        "TILEBOOK_RECORD_DIR": str(ROOT / "src" / "tilebook" / "records"),
        "TILEBOOK_MODE": "gpu",
    }
    session.run("python", "benchmarks/run_all.py", *session.posargs, env=env)
