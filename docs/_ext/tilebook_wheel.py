"""The tilebook package, shipped with the site that teaches from it.

A reader who downloads a lesson needs the package the lesson imports, in the
version the page was built with.  Each build writes a wheel of the source tree it
builds from into the site, ``wheels/tilebook-<version>-py3-none-any.whl``, with
``wheels/index.html`` beside it (so ``pip install --find-links <site>/wheels/``
finds it too).  The notebooks' first cell (``tilebook_notebooks``) installs it from
there, or offline from the copy the lessons' zips carry.

The build is offline.  hatchling, the project's build backend, builds the wheel
when this Python can import it (no isolated build environment: that would need
the network).  Otherwise the wheel is written here from ``pyproject.toml``, as
hatchling writes it for this project: the files of ``src/tilebook`` and the
``.dist-info`` files of PEP 427 (a pure-Python wheel needs nothing else).

``tilebook_site_url`` (``TILEBOOK_SITE_URL``) is the address the site is
published at; unset, a GitHub repository URL gives its GitHub Pages address.
The ``tilebook-wheel`` directive shows the install command on the start page.
"""

from __future__ import annotations

import base64
import hashlib
import html
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from docutils import nodes
from sphinx.util.docutils import SphinxDirective

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

#: hatchling's reproducible-build date: the same tree gives the same bytes, so the
#: zips that carry the wheel change only when the package does.
_ZIP_DATE = (2020, 2, 2, 0, 0, 0)
_WHEEL_FILE = (
    b"Wheel-Version: 1.0\nGenerator: tilebook docs build\nRoot-Is-Purelib: true\n"
    b"Tag: py3-none-any\n"
)


def _project(root: Path) -> dict:
    with open(root / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]


def wheel_name(root: Path) -> str:
    """The wheel's file name (PEP 427), from ``pyproject.toml``."""
    p = _project(root)
    name = re.sub(r"[-_.]+", "_", p["name"]).lower()
    return f"{name}-{p['version']}-py3-none-any.whl"


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return "sha256=" + digest.decode()


def _metadata(root: Path, p: dict) -> str:
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {p['name']}",
        f"Version: {p['version']}",
        f"Summary: {p['description']}",
    ]
    lines += [f"Author: {a['name']}" for a in p.get("authors", []) if "name" in a]
    if isinstance(p.get("license"), dict) and "text" in p["license"]:
        lines.append(f"License: {p['license']['text']}")
    lines += [f"Classifier: {c}" for c in sorted(p.get("classifiers", []))]
    lines.append(f"Requires-Python: {p['requires-python']}")
    lines += [f"Requires-Dist: {d}" for d in sorted(p.get("dependencies", []))]
    readme = p.get("readme")
    if readme:
        lines.append("Description-Content-Type: text/markdown")
        return "\n".join(lines) + "\n\n" + (root / readme).read_text(encoding="utf-8")
    return "\n".join(lines) + "\n"


def _package_files(package: Path) -> list[Path]:
    """The package's files, as hatchling takes them (no byte code)."""
    found = []
    for folder, dirs, files in os.walk(package):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        found += [Path(folder, f) for f in sorted(files) if not f.endswith((".pyc", ".pyo"))]
    return found


def _write_wheel(root: Path, dest: Path) -> Path:
    """Write the pure-Python wheel of ``root`` (``src/<name>``) into ``dest``."""
    p = _project(root)
    path = dest / wheel_name(root)
    dist_info = f"{path.name.split('-')[0]}-{p['version']}.dist-info"
    package = root / "src" / re.sub(r"[-.]+", "_", p["name"]).lower()
    members = [(f.relative_to(package.parent).as_posix(), f.read_bytes())
               for f in _package_files(package)]  # fmt: skip
    members += [
        (f"{dist_info}/METADATA", _metadata(root, p).encode()),
        (f"{dist_info}/WHEEL", _WHEEL_FILE),
    ]
    record = "".join(f"{n},{_record_hash(d)},{len(d)}\n" for n, d in members)
    members.append((f"{dist_info}/RECORD", (record + f"{dist_info}/RECORD,,\n").encode()))
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in members:
            info = zipfile.ZipInfo(name, _ZIP_DATE)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    return path


def _hatchling_wheel(root: Path, dest: Path) -> Path:
    code = "import sys; from hatchling.build import build_wheel; print(build_wheel(sys.argv[1]))"
    proc = subprocess.run(
        [sys.executable, "-c", code, str(dest)],
        cwd=root, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"hatchling could not build the wheel:\n{proc.stderr[-3000:]}")
    return dest / proc.stdout.strip().splitlines()[-1]


def build_wheel(root: Path, dest: Path) -> Path:
    """Build the wheel of the source tree ``root`` into ``dest``; its path."""
    dest.mkdir(parents=True, exist_ok=True)
    if importlib.util.find_spec("hatchling") is not None:
        return _hatchling_wheel(root, dest)
    return _write_wheel(root, dest)


def site_url(config) -> str | None:
    """Where the site is published: ``tilebook_site_url``, else the GitHub Pages
    address of a GitHub ``tilebook_repo_url``, else None."""
    if config.tilebook_site_url:
        return config.tilebook_site_url.rstrip("/")
    repo = (config.tilebook_repo_url or "").rstrip("/")
    gh = re.fullmatch(r"https://github\.com/([^/]+)/([^/]+?)(?:\.git)?", repo)
    if gh:
        return f"https://{gh.group(1).lower()}.github.io/{gh.group(2)}"
    return None


def site_wheel(app) -> Path | None:
    """The wheel in the site being built (``wheels/``), built on the first call of a
    build; None for a builder that writes no HTML."""
    if app.builder.format != "html":
        return None
    built = getattr(app, "_tilebook_wheel", None)
    if built is not None:
        return built
    root = Path(app.srcdir).resolve().parent
    out = Path(app.outdir) / "wheels"
    with tempfile.TemporaryDirectory() as tmp:
        made = build_wheel(root, Path(tmp))
        if made.name != wheel_name(root):
            raise RuntimeError(f"the build made {made.name}, not {wheel_name(root)}")
        if out.exists():
            shutil.rmtree(out)  # no wheel of an older version lingers
        out.mkdir(parents=True)
        wheel = out / made.name
        shutil.copyfile(made, wheel)
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    name = html.escape(wheel.name)
    (out / "index.html").write_text(
        "<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>tilebook wheels</title>"
        f'</head>\n<body>\n<a href="{name}#sha256={sha}">{name}</a>\n</body></html>\n'
    )
    app._tilebook_wheel = wheel
    return wheel


class WheelInstall(SphinxDirective):
    """The command that installs this site's wheel: from the site's address when it is
    known, else from the wheel downloaded through the link the directive puts above."""

    has_content = False

    def run(self):
        root = Path(self.env.srcdir).resolve().parent
        self.env.note_dependency(str(root / "pyproject.toml"))  # the wheel's name
        name = wheel_name(root)
        relative = "../" * self.env.docname.count("/") + f"wheels/{name}"
        url = site_url(self.config)
        para = nodes.paragraph()
        para += nodes.Text("The wheel of this build: ")
        link = nodes.reference("", "", internal=False, refuri=relative)
        link += nodes.literal(text=name)
        para += link
        para += nodes.Text(
            " (pure Python: pip installs PyTorch, Triton, NumPy and Matplotlib with it, "
            "unless they are installed already)."
        )
        if url:
            code = f"python -m pip install {url}/wheels/{name}"
        else:
            code = (
                "# this build of the site names no address (TILEBOOK_SITE_URL): download\n"
                "# the wheel through the link above, then\n"
                f"python -m pip install ./{name}"
            )
        block = nodes.literal_block(code, code)
        block["language"] = "bash"
        return [para, block]


def setup(app):
    app.add_config_value("tilebook_site_url", None, "html")
    app.add_directive("tilebook-wheel", WheelInstall)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
