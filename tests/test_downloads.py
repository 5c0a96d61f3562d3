"""A reader's downloads run.

The site ships the package as a wheel built from the same tree.  Lesson 07's
notebook and ``.py``, taken from the built site, run on the CPU in a fresh virtual
environment outside the repository, where tilebook is not importable until the
notebook's own first cell installs it from the site, served on 127.0.0.1; the
lesson's zip installs it offline, from the wheel it carries.  Nothing reaches the
internet: pip runs without an index (``PIP_NO_INDEX``) and without the machine's
configuration.  The fresh environments see this one's third-party packages
(torch is several GB), but not its tilebook.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import warnings
import zipfile
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs" / "_ext"))

import tilebook_notebooks  # docs/_ext is not a package
import tilebook_wheel

LESSON = "11_rms_norm"  # the quickest lesson to run on a CPU (records, small sizes)
PART = "03_real_kernels"
WHEEL = tilebook_wheel.wheel_name(ROOT)


def _download(html_dir: Path, suffix: str) -> Path:
    page = (html_dir / "lessons" / PART / f"{LESSON}.html").read_text()
    m = re.search(r'href="([^"]*' + re.escape(LESSON + suffix) + r')"', page)
    assert m, f"no {suffix} download on the lesson page"
    return (html_dir / "lessons" / PART / m.group(1)).resolve()


def _validate(text: str) -> None:
    """nbformat's validation, any warning (MissingIDFieldWarning) an error."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        nbformat.validate(nbformat.reads(text, as_version=nbformat.NO_CONVERT))


def test_every_lesson_notebook_validates_without_warnings():
    scripts = sorted((ROOT / "gallery").glob("*/[0-9][0-9]_*.py"))
    assert scripts
    for script in scripts:
        nb = tilebook_notebooks.lesson_notebook(
            script, "https://github.com/someone/tilebook", wheel=WHEEL,
            site_url="https://someone.github.io/tilebook",
        )  # fmt: skip
        assert (nb["nbformat"], nb["nbformat_minor"]) == (4, 5)
        ids = [c["id"] for c in nb["cells"]]
        assert len(set(ids)) == len(ids), f"{script.name}: cell ids repeat"
        _validate(json.dumps(nb))


# -- a fresh virtual environment, as a reader makes one ------------------------------

#: What must not leak into a reader's environment: this environment's tilebook (an
#: editable install: its .dist-info and the files that point at the clone).
_OURS = re.compile(r"(_*editable.*tilebook.*|_?tilebook([-_.].*)?)", re.IGNORECASE)


def _host_packages(farm: Path) -> list[str]:
    """This environment's site directories, as folders of links without tilebook."""
    dirs = []
    for i, entry in enumerate(dict.fromkeys(sys.path)):
        path = Path(entry or ".").resolve()
        # Only site directories: the test environment may live inside the clone
        # (.nox/tilebook, as in CI), the clone's sources never do.
        if not path.is_dir() or path.name not in ("site-packages", "dist-packages"):
            continue
        linked = farm / f"site{i}"
        linked.mkdir(parents=True)
        for item in path.iterdir():
            if not _OURS.fullmatch(item.name) and item.suffix != ".pth":
                (linked / item.name).symlink_to(item)
        dirs.append(str(linked))
    return dirs


@pytest.fixture
def reader_python(tmp_path_factory):
    """Make a fresh venv outside the clone; return its python."""

    def make() -> Path:
        base = tmp_path_factory.mktemp("reader")
        env = base / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(env)], check=True, timeout=300)
        py = env / "bin" / "python"
        site = subprocess.run(
            [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        host = _host_packages(base / "host")
        Path(site, "_host_packages.pth").write_text("\n".join(host) + "\n")
        probe = subprocess.run(
            [str(py), "-c", "import importlib.util as u; print(u.find_spec('tilebook'))"],
            capture_output=True, text=True, check=True, cwd=base, env=_reader_env(),
        ).stdout.strip()  # fmt: skip
        assert probe == "None", f"tilebook is importable before any install: {probe}"
        return py

    return make


def _reader_env(**extra: str) -> dict[str, str]:
    """A reader's environment: none of the test run's settings, and a pip that can
    reach no index (nor read this machine's pip configuration)."""
    drop = ("TILEBOOK_", "PYTEST", "MPLBACKEND", "PYTHONPATH", "PIP_", "JUPYTER_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(
        TILEBOOK_MODE="cpu",
        TILEBOOK_OPEN="0",
        PIP_NO_INDEX="1",
        PIP_CONFIG_FILE=os.devnull,
        PIP_DISABLE_PIP_VERSION_CHECK="1",
    )
    env.update(extra)
    return env


_RUN_NOTEBOOK = """\
import sys, nbformat
from nbclient import NotebookClient
path = sys.argv[1]
nb = nbformat.read(path, as_version=4)
client = NotebookClient(nb, timeout=600, kernel_name="python3",
                        resources={"metadata": {"path": sys.argv[2]}})
client.execute()
nbformat.write(nb, path)
"""

_WHERE = (
    "import sys, tilebook\n"
    "print('kernel python:', sys.executable)\n"
    "print('tilebook from:', tilebook.__file__)"
)


def _run_notebook(py: Path, nb: dict, folder: Path, env: dict[str, str]) -> dict:
    """Run ``nb`` in ``folder`` with nbclient under ``py``, then a cell that says which
    Python ran it and where its tilebook came from; the executed notebook."""
    nb = nbformat.from_dict(nb)
    nb.cells.append(nbformat.v4.new_code_cell(_WHERE))
    path = folder / "executed.ipynb"
    nbformat.write(nb, path)
    proc = subprocess.run(
        [str(py), "-c", _RUN_NOTEBOOK, str(path), str(folder)], cwd=folder, env=env,
        capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(path.read_text())


def _text(cell: dict) -> str:
    return "".join(
        "".join(o.get("text", "")) for o in cell["outputs"] if o["output_type"] == "stream"
    )


def _installed_in(py: Path, done: dict) -> str:
    """The tilebook the notebook's kernel imported, checked to be the fresh venv's."""
    where = _text(done["cells"][-1])
    venv = str(py.parent.parent)
    assert f"kernel python: {py}" in where, where
    found = re.search(r"tilebook from: (\S+)", where)
    assert found and found.group(1).startswith(venv), f"tilebook not from {venv}: {where}"
    return found.group(1)


# -- the site ---------------------------------------------------------------------


@pytest.mark.site
def test_the_site_ships_the_wheel_of_its_own_tree(built_site):
    html_dir, _ = built_site
    wheel = html_dir / "wheels" / WHEEL
    assert wheel.is_file(), f"no {WHEEL} in the site"
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        package = ROOT / "src" / "tilebook"
        for f in package.rglob("*"):  # code, records, the widgets' scripts and styles
            if "__pycache__" in f.parts or not f.is_file():
                continue
            name = f.relative_to(package.parent).as_posix()
            assert name in names, f"{name} is not in the wheel"
            assert z.read(name) == f.read_bytes(), f"{name} differs from the tree's"
        meta = z.read(f"tilebook-{WHEEL.split('-')[1]}.dist-info/METADATA").decode()
    assert "Requires-Dist: torch" in meta
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    index = (html_dir / "wheels" / "index.html").read_text()
    assert f'href="{WHEEL}#sha256={sha}"' in index, "pip --find-links would not find it"
    zips = sorted((html_dir / "_downloads").rglob("*.zip"))
    assert zips, "no zip among the downloads"
    for z in zips:
        with zipfile.ZipFile(z) as zf:
            assert zf.read(WHEEL) == wheel.read_bytes(), f"{z.name} carries another wheel"
    start = (html_dir / "start.html").read_text()
    assert f'href="wheels/{WHEEL}"' in start, "the start page does not link the wheel"


@pytest.mark.site
def test_downloaded_notebook_installs_tilebook_from_the_site_and_runs(
    built_site, server, reader_python, tmp_path
):
    html_dir, _ = built_site
    text = _download(html_dir, ".ipynb").read_text()
    _validate(text)
    nb = json.loads(text)
    assert nb["cells"][0]["cell_type"] == "markdown"
    assert WHEEL in nb["cells"][1]["source"]  # the install cell
    py = reader_python()
    done = _run_notebook(py, nb, tmp_path, _reader_env(TILEBOOK_SITE_URL=server))
    errors = [
        (i, o.get("ename"), o.get("evalue"))
        for i, c in enumerate(done["cells"]) if c["cell_type"] == "code"
        for o in c["outputs"] if o["output_type"] == "error"
    ]  # fmt: skip
    assert not errors, errors
    assert f"installing tilebook from {server}/wheels/{WHEEL}" in _text(done["cells"][1])
    _installed_in(py, done)
    outputs = [o for c in done["cells"] if c["cell_type"] == "code" for o in c["outputs"]]
    html = ["".join(o["data"]["text/html"]) for o in outputs if "text/html" in o.get("data", {})]
    assert any("data-tilebook-widget" in h for h in html), "no widget in the notebook"
    assert any("image/png" in o.get("data", {}) for o in outputs), "no plot in the notebook"


@pytest.mark.site
def test_lesson_zip_installs_tilebook_offline(built_site, reader_python, tmp_path):
    """Unpacked anywhere, the lesson's zip installs tilebook from the wheel it
    carries, with no site and no index to reach."""
    html_dir, _ = built_site
    with zipfile.ZipFile(_download(html_dir, ".zip")) as z:
        z.extractall(tmp_path)
    assert (tmp_path / WHEEL).is_file()
    nb = json.loads((tmp_path / f"{LESSON}.ipynb").read_text())
    nb["cells"] = nb["cells"][:2]  # the notes and the install cell; the lesson runs above
    py = reader_python()
    done = _run_notebook(py, nb, tmp_path, _reader_env())
    assert f"installing tilebook from {tmp_path / WHEEL}" in _text(done["cells"][1])
    _installed_in(py, done)


@pytest.mark.site
def test_downloaded_script_runs_and_shows_its_output(built_site, server, reader_python, tmp_path):
    """The start page's command installs the site's wheel; the ``.py`` then runs as
    a script and writes its page, plots included."""
    html_dir, _ = built_site
    py = reader_python()
    # Where torch and the rest are installed already, tilebook alone (start page).
    subprocess.run(
        [str(py), "-m", "pip", "install", "-q", "--no-deps", f"{server}/wheels/{WHEEL}"],
        env=_reader_env(), cwd=tmp_path, check=True, capture_output=True, text=True,
    )  # fmt: skip
    script = tmp_path / f"{LESSON}.py"
    script.write_bytes(_download(html_dir, ".py").read_bytes())
    proc = subprocess.run(
        [str(py), script.name], cwd=tmp_path, env=_reader_env(),
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
