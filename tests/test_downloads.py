"""A reader's downloads run: lesson 07's ``.py`` and ``.ipynb``, taken from the built
site, executed on the CPU in a fresh virtual environment into which tilebook is
installed from this repository (not in editable mode), outside the repository."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

pytestmark = pytest.mark.site

ROOT = Path(__file__).resolve().parents[1]
LESSON = "07_vector_add"


def _download(html_dir: Path, suffix: str) -> Path:
    page = (html_dir / "lessons" / "03_real_kernels" / f"{LESSON}.html").read_text()
    m = re.search(r'href="([^"]*' + re.escape(LESSON + suffix) + r')"', page)
    assert m, f"no {suffix} download on the lesson page"
    return (html_dir / "lessons" / "03_real_kernels" / m.group(1)).resolve()


@pytest.fixture(scope="module")
def fresh_env(tmp_path_factory) -> Path:
    """A new venv that sees this environment's third-party packages (torch is several
    GB) but gets its own tilebook, built and installed from the repository."""
    env = tmp_path_factory.mktemp("fresh") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
    py = env / "bin" / "python"
    site = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    Path(site, "_host.pth").write_text("\n".join(sorted(ours)) + "\n")
    subprocess.run(
        [str(py), "-m", "pip", "install", "-q", "--no-deps", "--disable-pip-version-check",
         str(ROOT)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    where = subprocess.run(
        [str(py), "-c", "import tilebook; print(tilebook.__file__)"],
        capture_output=True, text=True, check=True, cwd=env.parent,
    ).stdout.strip()  # fmt: skip
    assert where.startswith(str(env)), f"the fresh venv imports tilebook from {where}"
    return py


def _env() -> dict[str, str]:
    drop = ("TILEBOOK_", "PYTEST", "MPLBACKEND", "PYTHONPATH")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(TILEBOOK_MODE="cpu", TILEBOOK_OPEN="0")
    return env


def test_downloaded_script_runs_and_shows_its_output(built_site, fresh_env, tmp_path):
    html_dir, _ = built_site
    script = tmp_path / f"{LESSON}.py"
    script.write_bytes(_download(html_dir, ".py").read_bytes())
    proc = subprocess.run(
        [str(fresh_env), script.name], cwd=tmp_path, env=_env(),
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "tilebook: CPU mode" in proc.stdout
    page = tmp_path / f"{LESSON}.html"
    assert page.exists(), proc.stdout[-2000:]
    assert f"are in {page}" in proc.stdout
    html = page.read_text()
    assert "data-tilebook-widget" in html, "the widget is not on the script's page"
    assert "data:image/png;base64," in html, "no plot on the script's page"
    assert "tb-table" in html and "tb-claims" in html


def test_downloaded_notebook_runs(built_site, fresh_env, tmp_path):
    html_dir, _ = built_site
    nb_path = tmp_path / f"{LESSON}.ipynb"
    nb_path.write_bytes(_download(html_dir, ".ipynb").read_bytes())
    nb = json.loads(nb_path.read_text())
    assert nb["cells"][0]["cell_type"] == "markdown"
    assert "tilebook" in nb["cells"][1]["source"]  # the install cell
    runner = (
        "import sys, nbformat\n"
        "from nbclient import NotebookClient\n"
        "nb = nbformat.read(sys.argv[1], as_version=4)\n"
        "NotebookClient(nb, timeout=600, kernel_name='python3').execute()\n"
        "nbformat.write(nb, sys.argv[1])\n"
    )
    proc = subprocess.run(
        [str(fresh_env), "-c", runner, nb_path.name], cwd=tmp_path, env=_env(),
        capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    done = json.loads(nb_path.read_text())
    outputs = [o for c in done["cells"] if c["cell_type"] == "code" for o in c["outputs"]]
    assert not [o for o in outputs if o["output_type"] == "error"]
    html = [o for o in outputs if "text/html" in o.get("data", {})]
    assert any("data-tilebook-widget" in "".join(o["data"]["text/html"]) for o in html)
    assert any("image/png" in o.get("data", {}) for o in outputs), "no plot in the notebook"
