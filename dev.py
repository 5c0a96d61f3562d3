#!/usr/bin/env python3
"""Run the project's nox sessions with nothing installed but Python (3.10 or newer).

    python3 dev.py -s docs     # build the site
    python3 dev.py -s tests    # run the tests
    python3 dev.py -l          # list the sessions (also what no argument does)

Every argument goes to nox as it is (``python3 dev.py -s docs -- --serve``).

Debian's and Ubuntu's own Python refuses ``pip install`` outside a virtual
environment ("externally-managed-environment", PEP 668), so nox is installed once
into a virtual environment of its own, ``.nox/_nox``, and run from there.  The Python
that runs this script stays the one the sessions are made from: it is passed on as
``TILEBOOK_HOST_PYTHON``, and on a GPU machine its torch is reused (noxfile.py).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".nox" / "_nox"
NOX = "nox>=2025.2.9"  # noxfile.py's nox.needs_version
APT_HINT = "on Debian or Ubuntu: sudo apt-get install python3-venv"


def _python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _stamp() -> str:
    """What the nox environment was made from: when it changes, it is made again."""
    return f"{NOX}\n{sys.executable}\n{sys.version}\n"


def _make_nox_environment() -> None:
    stamp = VENV / ".dev-stamp"
    if stamp.is_file() and stamp.read_text() == _stamp() and _python(VENV).exists():
        return
    if importlib.util.find_spec("ensurepip") is None:
        # Debian and Ubuntu ship venv's pip installer in a package of its own.
        sys.exit(f"dev.py: this Python ({sys.executable}) cannot make a virtual environment "
                 f"with pip: its ensurepip module is missing ({APT_HINT})")  # fmt: skip
    print(f"dev.py: installing {NOX} into {VENV.relative_to(ROOT)} (once)", flush=True)
    shutil.rmtree(VENV, ignore_errors=True)
    made = subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=False)
    if made.returncode != 0:
        sys.exit(f"dev.py: `{sys.executable} -m venv` failed ({APT_HINT})")
    pip = [str(_python(VENV)), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    if subprocess.run([*pip, NOX], check=False).returncode != 0:
        sys.exit(f"dev.py: pip could not install {NOX} into {VENV}")
    stamp.write_text(_stamp())


def main(args: list[str]) -> None:
    if sys.version_info < (3, 10):  # noqa: UP036 (an older Python is told why, here)
        sys.exit(f"dev.py: tilebook needs Python 3.10 or newer, not {sys.version.split()[0]}")
    _make_nox_environment()
    if not args:
        print(__doc__.split("\n\n")[1] + "\n", flush=True)
        args = ["-l"]
    os.chdir(ROOT)  # nox reads noxfile.py from the working directory
    env = dict(os.environ, TILEBOOK_HOST_PYTHON=sys.executable)
    command = [str(_python(VENV)), "-m", "nox", *args]
    if os.name == "posix":
        os.execve(command[0], command, env)  # Ctrl-C and the exit status go to nox itself
    sys.exit(subprocess.run(command, env=env, check=False).returncode)


if __name__ == "__main__":
    main(sys.argv[1:])
