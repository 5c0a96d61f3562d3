"""Development tasks: ``nox -s tests``, ``nox -s docs``, ``nox -s lint``, ``nox -s bench``,
``nox -s record``.

``tests``, ``docs``, ``bench`` and ``record`` share ONE environment, ``.nox/tilebook``,
made on the first run and reused until ``pyproject.toml`` changes (a CUDA build of
torch alone is several GB: it is installed once, not once per session and run).
``nox -s env -- --rebuild`` makes it again.

On a machine whose Python already has a CUDA build of torch (a GPU box), the
environment reuses that torch (and whatever else that Python has) instead of
downloading another: see :func:`_reuse_host_packages`.  Set
``TILEBOOK_REUSE_TORCH=0`` to always install fresh, ``=1`` to force reuse.
``TILEBOOK_TORCH_INDEX=https://download.pytorch.org/whl/cpu`` installs PyTorch's
CPU-only build first (a few hundred MB instead of several GB), for a machine
without a GPU.

``python3 dev.py -s tests`` runs nox from a virtual environment of its own (a
system Python may refuse ``pip install nox``); it names the Python that ran it in
``TILEBOOK_HOST_PYTHON``, and that Python, not nox's, is the one the shared
environment is made from and whose torch it reuses.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nox

nox.needs_version = ">=2025.2.9"
# nox looks for uv whether a session uses it or not, and says so: noise, not news.
logging.getLogger("nox").addFilter(lambda r: "uv binary not found" not in r.getMessage())
nox.options.sessions = ["lint", "tests"]

ROOT = Path(__file__).parent
PYPROJECT = nox.project.load_toml(ROOT / "pyproject.toml")
BUILD_HTML = ROOT / "docs" / "_build" / "html"
RECORDS = ROOT / "src" / "tilebook" / "course" / "records"  # one folder per GPU kind
ENV_DIR = ROOT / ".nox" / "tilebook"  # the one environment of tests, docs and bench
GROUPS = ("docs", "tests")  # the dependency groups the environment installs by default
# The Python the environment is made from: the one that ran dev.py, else nox's own.
HOST_PYTHON = os.environ.get("TILEBOOK_HOST_PYTHON") or sys.executable


def _groups() -> tuple[str, ...]:
    """The groups to install: ``TILEBOOK_ENV_GROUPS`` (comma-separated) or :data:`GROUPS`.

    ``TILEBOOK_ENV_GROUPS=docs`` makes an environment that builds the site, benchmarks
    and records, without the tests' browser and notebook packages: what an offline
    GPU machine with a wheelhouse of the docs group can install.
    """
    raw = os.environ.get("TILEBOOK_ENV_GROUPS", "").strip()
    if not raw:
        return GROUPS
    groups = tuple(dict.fromkeys(g.strip() for g in raw.split(",") if g.strip()))
    unknown = [g for g in groups if g not in GROUPS]
    if unknown:
        raise SystemExit(f"TILEBOOK_ENV_GROUPS: unknown groups {unknown}; known: {GROUPS}")
    return groups


def _host(code: str) -> str:
    """What :data:`HOST_PYTHON` prints running ``code``."""
    run = subprocess.run([HOST_PYTHON, "-c", code], capture_output=True, text=True, check=True)
    return run.stdout.strip()


def _host_has_cuda_torch() -> bool:
    """Does :data:`HOST_PYTHON` have a torch that sees a CUDA GPU?"""
    code = "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"
    try:
        proc = subprocess.run(
            [HOST_PYTHON, "-c", code], capture_output=True, timeout=120, check=False
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


def _bin(name: str) -> str:
    return str(ENV_DIR / ("Scripts" if os.name == "nt" else "bin") / name)


def _reuse_host_packages(session: nox.Session) -> None:
    """Make the host interpreter's packages visible inside the environment.

    ``--system-site-packages`` is not enough when the host Python is itself a
    virtual environment (as on many GPU images): the venv would see the *base*
    Python, not the one that holds torch.  A ``.pth`` file naming the host's
    site-packages works in both cases, and the venv's own packages still come
    first on ``sys.path``.
    """
    venv_site = subprocess.run(
        [_bin("python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    # The folder torch is in, too: a distribution's Python may keep its packages apart
    # from sysconfig's paths (Debian: /usr/lib/python3/dist-packages).
    code = (
        "import os, sysconfig, importlib.util as u; p = sysconfig.get_paths(); "
        "t = u.find_spec('torch'); torch = [os.path.dirname(os.path.dirname(t.origin))] if t "
        "else []; print(p['purelib'], p['platlib'], *torch, sep='\\n')"
    )
    host_paths = set(_host(code).splitlines())
    Path(venv_site, "_tilebook_host_site.pth").write_text("\n".join(sorted(host_paths)) + "\n")
    session.log(f"reusing the host's torch and packages from {', '.join(sorted(host_paths))}")


def _stamp(reuse: bool) -> str:
    """What the environment was made from: when it changes, the environment is remade."""
    same = sys.executable == HOST_PYTHON
    python = sys.version if same else _host("import sys; print(sys.version)")
    what = {
        "pyproject": (ROOT / "pyproject.toml").read_text(),
        "python": python,
        "reuse": reuse,
        "torch_index": os.environ.get("TILEBOOK_TORCH_INDEX", ""),
        "groups": _groups(),
    }
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()


def _environment(
    session: nox.Session, *, rebuild: bool = False, needs: tuple[str, ...] = ()
) -> None:
    """Make ``.nox/tilebook`` with tilebook (editable) and the dependency groups
    (:func:`_groups`), or reuse it when it was made from the same ``pyproject.toml``
    and groups.  ``needs``: groups the session cannot run without."""
    missing = [g for g in needs if g not in _groups()]
    if missing:
        session.error(
            f"this session needs the {', '.join(missing)} group, which TILEBOOK_ENV_GROUPS="
            f"{os.environ.get('TILEBOOK_ENV_GROUPS')!r} leaves out"
        )
    reuse = _want_reuse()
    stamp_file = ENV_DIR / ".tilebook-stamp"
    stamp = _stamp(reuse)
    if not rebuild and stamp_file.exists() and stamp_file.read_text() == stamp:
        session.log(f"reusing the environment {ENV_DIR} (pyproject.toml unchanged)")
        return
    if ENV_DIR.exists():
        shutil.rmtree(ENV_DIR)
    session.log(f"making the environment {ENV_DIR} (once; reused by tests, docs and bench)")
    session.run(HOST_PYTHON, "-m", "venv", str(ENV_DIR), external=True, silent=True)
    pip = [_bin("python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    if reuse:
        _reuse_host_packages(session)
    elif os.environ.get("TILEBOOK_TORCH_INDEX"):
        session.run(
            *pip, "torch", "--index-url", os.environ["TILEBOOK_TORCH_INDEX"], external=True
        )  # fmt: skip
    reqs = [r for g in _groups() for r in nox.project.dependency_groups(PYPROJECT, g)]
    session.run(*pip, "-e", str(ROOT), *reqs, external=True)
    stamp_file.write_text(stamp)


@nox.session(venv_backend="none")
def env(session: nox.Session) -> None:
    """Make (``-- --rebuild``: remake) the shared environment, ``.nox/tilebook``."""
    _environment(session, rebuild="--rebuild" in session.posargs)


@nox.session(venv_backend="none")
def tests(session: nox.Session) -> None:
    """Run the test suite (CPU: Triton's interpreter; GPU tests run when a GPU is present)."""
    _environment(session, needs=("docs", "tests"))
    # On every core by default (pytest-xdist), with the site built once in the
    # background beside them (tests/conftest.py); the 30 slowest tests are listed at the
    # end, to keep CI's time in view.  Arguments given after -- replace these.
    args = session.posargs or ["-n", "auto", "--durations=30"]
    session.run(_bin("python"), "-m", "pytest", *args, external=True)


# The build log's first line says which mode the build runs in, before Sphinx's own.
_SPHINX_WITH_MODE_LINE = (
    "import os, sys, tilebook; print(tilebook.banner(), flush=True); "
    "os.environ['TILEBOOK_BANNER_SHOWN'] = '1'; "
    "from sphinx.cmd.build import main; sys.exit(main(sys.argv[1:]))"
)


def _sphinx(session: nox.Session, env: dict[str, str], *extra: str) -> None:
    args = ["-W", "--keep-going", "-b", "html", "docs", str(BUILD_HTML), *extra]
    session.run(_bin("python"), "-c", _SPHINX_WITH_MODE_LINE, *args, env=env, external=True)


@nox.session(venv_backend="none")
def docs(session: nox.Session) -> None:
    """Build the site into docs/_build/html (warnings are errors; every lesson runs).

    A rebuild executes only the lessons whose script changed (sphinx-gallery
    compares each script with what it last ran).  ``nox -s docs -- --serve``
    rebuilds on every change and serves the site at http://127.0.0.1:8000.  On a
    GPU, ``nox -s docs -- --save-records`` also copies the records the lessons
    just measured into ``src/tilebook/course/records/`` (what CPU builds plot).
    """
    serve = "--serve" in session.posargs
    _environment(session, needs=("docs",))
    env = {
        "TILEBOOK_RECORD_DIR": os.environ.get(
            "TILEBOOK_RECORD_DIR", str(BUILD_HTML.parent / "records")
        )
    }
    if serve:
        session.run(_bin("python"), "-m", "pip", "install", "-q", "sphinx-autobuild",
                    external=True)  # fmt: skip
        args = ["-W", "--keep-going", "-b", "html", "docs", str(BUILD_HTML)]
        watch = ["--watch", "src", "--watch", "gallery", "--port", "8000"]
        session.run(_bin("sphinx-autobuild"), *args, *watch, env=env, external=True)
        return
    _sphinx(session, env)
    session.log(f"site built: open {BUILD_HTML / 'index.html'}")
    if "--save-records" in session.posargs:
        _save_records(session, Path(env["TILEBOOK_RECORD_DIR"]))


def _save_records(session: nox.Session, built: Path) -> list[str]:
    """Copy the GPU-measured records of a run into ``src/tilebook/course/records/<gpu kind>/``
    (:func:`tilebook.course.bench.commit_records`)."""
    code = (
        "import sys; from tilebook.course.bench import commit_records; "
        "print('\\n'.join(str(p) for p in commit_records(sys.argv[1])))"
    )
    out = session.run(_bin("python"), "-c", code, str(built), external=True, silent=True)
    saved = [line for line in (out or "").splitlines() if line.strip()]
    if not saved:
        session.error("no GPU-measured record in this run: was it made on a GPU?")
    session.log(f"saved {len(saved)} records: {', '.join(saved)}")
    return saved


@nox.session
def lint(session: nox.Session) -> None:
    """ruff over the package, lessons, tests and this file: the lint rules, then the format."""
    session.install(*nox.project.dependency_groups(PYPROJECT, "lint"))
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(venv_backend="none")
def bench(session: nox.Session) -> None:
    """GPU only: measure every kernel against its baselines and write the records
    that CPU builds plot (into src/tilebook/course/records, to be committed)."""
    _environment(session)
    built = BUILD_HTML.parent / "bench-records"
    shutil.rmtree(built, ignore_errors=True)
    env = {"TILEBOOK_RECORD_DIR": str(built), "TILEBOOK_MODE": "gpu"}
    session.run(
        _bin("python"), "benchmarks/run_all.py", *session.posargs, env=env, external=True
    )  # fmt: skip
    _save_records(session, built)


@nox.session(venv_backend="none")
def record(session: nox.Session) -> None:
    """GPU only, the maintainer's one command: re-measure every committed record (the
    benchmarks, then a clean docs build whose lessons measure live) and commit them.

    ``-- --no-commit`` leaves the new records uncommitted for a look first.
    """
    if subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                      capture_output=True, text=True, check=True, cwd=ROOT).stdout.strip():  # fmt: skip
        session.error("commit or stash your changes first: records name the commit they ran at")
    _environment(session, needs=("docs",))
    built = BUILD_HTML.parent / "records"
    shutil.rmtree(built, ignore_errors=True)
    env = {"TILEBOOK_MODE": "gpu", "TILEBOOK_RECORD_DIR": str(built)}
    session.run(_bin("python"), "benchmarks/run_all.py", env=env, external=True)
    shutil.rmtree(ROOT / "docs" / "lessons", ignore_errors=True)  # every lesson runs
    _sphinx(session, {"TILEBOOK_MODE": "gpu", "TILEBOOK_RECORD_DIR": str(built)})
    _save_records(session, built)
    if "--no-commit" in session.posargs:
        return
    session.run("git", "add", str(RECORDS), external=True)
    session.run(
        "git", "commit", "-q", "-m", "GPU records re-measured (nox -s record)", external=True
    )  # fmt: skip
