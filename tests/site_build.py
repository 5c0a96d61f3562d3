"""Build the site once per test session (CPU mode) for the site and browser tests."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LESSON_07 = "lessons/03_real_kernels/07_vector_add.html"


def build_site(out: Path, *, fresh: bool = True) -> tuple[Path, str]:
    """Run sphinx-build (warnings are errors) in CPU mode; return the html dir and the log.

    ``fresh=False`` builds again over what a build into ``out`` left, as a maintainer's
    second ``nox -s docs`` does.
    """
    env = dict(os.environ)
    env["TILEBOOK_MODE"] = "cpu"
    env.pop("TILEBOOK_RECORD_DIR", None)  # plot only what is committed
    html = out / "html"
    doctrees = out / "doctrees"
    # sphinx-gallery writes the generated lesson pages into docs/lessons; start clean
    # so that every lesson really runs in this build.
    if fresh:
        shutil.rmtree(ROOT / "docs" / "lessons", ignore_errors=True)
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
            str(ROOT / "docs"),
            str(html),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    log = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise RuntimeError(f"sphinx-build failed ({proc.returncode}):\n{log[-6000:]}")
    return html, log
