"""Lesson notebooks that read well and run: Markdown cells without raw reST.

sphinx-gallery turns each lesson's text blocks into notebook Markdown, but only
part of reStructuredText survives (directives such as ``.. dropdown::`` and
roles such as ``:func:`` appear as raw text, and the exercises' solutions sit in
plain view).  After sphinx-gallery has written the notebooks, this extension
writes them again from the lesson scripts, converting the reST subset the
lessons use into Markdown (solutions fold into ``<details>``), and puts a first
cell that installs tilebook when it is missing: from the wheel of the same build
(``tilebook_wheel``) beside the notebook, which every lesson zip carries, else from
the site's address, else from the repository.  Its cells have ids (nbformat 4.5).

Each page links its notebook and zip with ``:download:``, which makes them
dependencies of the page: a file newer than the page's last read makes Sphinx read
the page again.  sphinx-gallery writes both on every build, so an unchanged file
gets back the modification time it had when its content last changed
(``.tilebook_stamps.json`` in the gallery directory remembers both), and a rebuild
reads again only the pages whose lessons changed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import zipfile
from pathlib import Path

from sphinx_gallery.py_source_parser import split_code_and_text_blocks
from tilebook_wheel import site_url as tilebook_site_url
from tilebook_wheel import site_wheel, wheel_name

_HEADING = {"=": "#", "-": "##", "~": "###", "^": "####"}


def _fact_text(key: str) -> str:
    """The figure as the page states it: a ``gpu.`` key is the build GPU's, else the
    fallback GPU's named (as the site's role does)."""
    from tilebook.course.datasheet import BUILD, build_fact, build_gpu, fact

    prefix, _, name = key.partition(".")
    try:
        f = build_fact(name) if prefix == BUILD else fact(key)
    except LookupError:  # KeyError too
        return key
    gpu = build_gpu()
    if prefix == BUILD and (gpu is None or not f.key.startswith(f"{gpu.key}.")):
        return f"{f.text()} (an {f.gpu}'s)"
    return f.text()


def _inline(text: str, repo_url: str | None, branch: str) -> str:
    def role(m: re.Match) -> str:
        name, body = m.group(1), m.group(2)
        label, _, target = body.partition(" <")
        target = target.rstrip(">") if target else label
        if name == "math":
            return f"${body}$"
        if name == "datasheet":
            return _fact_text(body.strip())
        if name == "build-gpu":
            from tilebook.course.datasheet import build_gpu_name

            return build_gpu_name() or "no GPU"
        if name in ("term", "doc", "ref"):
            return label.strip()
        if name == "repo":
            if repo_url:
                return f"[`{label.strip()}`]({repo_url}/blob/{branch}/{target.strip()})"
            return f"`{label.strip()}`"
        shown = label.strip().lstrip("~")
        if label.strip().startswith("~"):
            shown = shown.rsplit(".", 1)[-1]
        return f"`{shown}`"

    text = re.sub(r":([a-z][a-z-]*)(?::[a-z]+)?:`([^`]+)`", role, text)
    text = re.sub(r"``(.+?)``", lambda m: f"`{m.group(1)}`", text)
    text = re.sub(r"`([^`<]+?)\s*<(https?://[^>]+)>`_+", r"[\1](\2)", text)
    return text


def _indent_of(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def rst_to_markdown(text: str, repo_url: str | None = None, branch: str = "main") -> str:
    """Convert the reStructuredText subset of tilebook's lessons to Markdown."""
    # A role or literal may wrap over lines: join it first, so it converts whole.
    text = re.sub(
        r"(:[a-z][a-z-]*:`[^`]*`|``[^`]+``)",
        lambda m: re.sub(r"\s*\n\s*", " ", m.group(1)),
        text,
    )
    lines = text.splitlines()
    out: list[str] = []
    i = 0

    def block(start: int, base: int) -> tuple[list[str], int]:
        """The lines indented deeper than ``base`` from ``start`` on (blank lines kept)."""
        body, j = [], start
        while j < len(lines) and (not lines[j].strip() or _indent_of(lines[j]) > base):
            body.append(lines[j])
            j += 1
        while body and not body[-1].strip():
            body.pop()
            j -= 1
        while body and not body[0].strip():
            body.pop(0)
        width = min((_indent_of(b) for b in body if b.strip()), default=0)
        return [b[width:] for b in body], j

    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        indent = _indent_of(line)
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        # Section titles: a line underlined (and maybe overlined) with = - ~ ^
        if stripped and re.fullmatch(r"([=\-~^])\1{2,}", nxt.strip() or "x") and indent == 0:
            level = _HEADING[nxt.strip()[0]]
            out.append(f"{level} {_inline(stripped, repo_url, branch)}")
            i += 2
            continue
        if re.fullmatch(r"([=\-~^])\1{2,}", stripped) and out[-1:] != [""]:
            i += 1
            continue
        m = re.match(r"\.\. (\w[\w-]*)::\s*(.*)$", stripped)
        if m:
            kind, arg = m.group(1), m.group(2)
            j = i + 1
            while j < len(lines) and re.match(r"\s*:\w[\w-]*:", lines[j]) and lines[j].strip():
                j += 1  # directive options
            body, end = block(j, indent)
            if kind == "rubric":
                out.append(f"**{_inline(arg, repo_url, branch)}**")
            elif kind == "math":
                out += ["$$", *([arg] if arg else []), *body, "$$"]
            elif kind in ("code-block", "code"):
                out += [f"```{arg or 'python'}", *body, "```"]
            elif kind == "dropdown":
                inner = rst_to_markdown("\n".join(body), repo_url, branch)
                out += ["<details>", f"<summary>{arg or 'Details'}</summary>", "", inner, "",
                        "</details>"]  # fmt: skip
            elif kind in ("note", "warning", "tip", "important", "seealso"):
                inner = rst_to_markdown("\n".join(([arg] if arg else []) + body), repo_url, branch)
                quoted = [f"> {q}" if q else ">" for q in inner.splitlines()]
                out += [f"> **{kind.capitalize()}:**", *quoted]
            else:  # an unknown directive: keep its content as plain text
                out += [rst_to_markdown("\n".join(body), repo_url, branch)]
            out.append("")
            i = end
            continue
        # A simple table (==== ==== rules): keep it preformatted.
        if re.fullmatch(r"=+(\s+=+)+", stripped):
            j = i + 1
            while j < len(lines) and lines[j].strip():
                j += 1
            out += ["```text", *[ln[indent:] for ln in lines[i:j]], "```"]
            i = j
            continue
        # A definition list item: a term line followed by a deeper indented paragraph.
        if (
            stripped
            and nxt.strip()
            and _indent_of(nxt) > indent
            and not re.match(r"(\d+\.|[-*])\s", stripped)
            and not stripped.endswith("::")
        ):
            body, end = block(i + 1, indent)
            term = _inline(stripped, repo_url, branch)
            desc = " ".join(rst_to_markdown("\n".join(body), repo_url, branch).split())
            out.append(" " * indent + f"- **{term}**: {desc}")
            i = end
            continue
        if stripped.endswith("::") and not stripped.startswith(".."):
            # "text::" introduces a literal block
            out.append(_inline(line[:-1] if stripped != "::" else "", repo_url, branch))
            body, end = block(i + 1, indent)
            out += ["```", *body, "```"]
            i = end
            continue
        out.append(_inline(line, repo_url, branch))
        i += 1
    md = "\n".join(out)
    return re.sub(r"\n{3,}", "\n\n", md).strip() + "\n"


#: PyTorch's own index of its CPU-only build: without a GPU, pip would otherwise take
#: the CUDA build from PyPI, many times larger.
CPU_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"

_INSTALL = """\
# Installs tilebook when this Python lacks it, from the first of the places below
# that works.  TILEBOOK_SITE_URL, if set, names another copy of the site.
import importlib, importlib.util, os, pathlib, shutil, subprocess, sys

WHEEL = {wheel}  # built from the same commit as this notebook
SITE = os.environ.get("TILEBOOK_SITE_URL") or {site}
REPO = {repo}


def install_tilebook():
    here = pathlib.Path.cwd()
    beside = [d / WHEEL for d in (here, here.parent) if (d / WHEEL).is_file()]
    sources = [str(w) for w in beside[:1]]  # a downloaded zip carries the wheel
    if SITE:
        sources.append(SITE.rstrip("/") + "/wheels/" + WHEEL)
    if REPO:
        sources.append("tilebook @ git+" + REPO)
    if not sources:
        raise ModuleNotFoundError(
            "tilebook is not installed: put " + WHEEL + " (from the site's start page) "
            "beside this notebook, or set TILEBOOK_SITE_URL to the site's address"
        )
    if importlib.util.find_spec("pip") is None:
        raise ModuleNotFoundError("this Python has no pip: install tilebook from " + sources[0])
    pip = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    if all(importlib.util.find_spec(m) for m in ("torch", "triton", "numpy", "matplotlib")):
        pip.append("--no-deps")  # keep this Python's PyTorch as it is
    elif importlib.util.find_spec("torch") is None and shutil.which("nvidia-smi") is None:
        # No NVIDIA GPU: PyTorch's CPU build, not the far larger CUDA one.
        subprocess.check_call(pip + ["torch", "--index-url", {cpu_index}])
    for source in sources:
        print("installing tilebook from", source, flush=True)
        if subprocess.call(pip + [source]) == 0:
            importlib.invalidate_caches()
            return
    raise RuntimeError("could not install tilebook from any of " + ", ".join(sources))


if importlib.util.find_spec("tilebook") is None:
    install_tilebook()
# os.environ["TILEBOOK_MODE"] = "cpu"  # uncomment to force the interpreter
"""


def first_cells(wheel: str, site_url: str | None, repo_url: str | None) -> list[dict]:
    """A Markdown cell on how to run the lesson, and a cell that installs tilebook:
    from ``wheel`` beside the notebook, else from the site, else from the repository."""
    places = [f"the wheel `{wheel}` beside it (each lesson's zip carries it: offline)"]
    if site_url:
        places.append(f"[this site]({site_url}/start.html), which ships the same wheel")
    if repo_url:
        places.append(f"[the repository]({repo_url})")
    text = (
        "**Running this notebook.** It needs the `tilebook` package, built from the "
        "same commit as the notebook. The next cell installs it when it is missing, "
        "from the first of: " + "; ".join(places) + ". Where PyTorch, Triton, NumPy "
        "and Matplotlib are installed already (as in Colab), it installs tilebook "
        "alone and leaves your PyTorch as it is. On a machine without an NVIDIA GPU "
        "and without PyTorch, it installs PyTorch's CPU build first "
        f"(from `{CPU_TORCH_INDEX}`), far smaller than the CUDA build pip "
        "would take otherwise.\n\n"
        "On a CUDA GPU (in Colab: *Runtime > Change runtime type > T4 GPU*) the "
        "lesson runs its kernels at full size and measures them live. Without one, "
        "`import tilebook` switches to Triton's interpreter: the kernels run on the "
        "CPU at small sizes, and the plots show measurements recorded on a GPU, "
        "captioned with where and when. Set `TILEBOOK_MODE` to `gpu` or `cpu` "
        "before importing tilebook to choose."
    )
    quoted = {"wheel": wheel, "site": site_url or "", "repo": repo_url or "",
              "cpu_index": CPU_TORCH_INDEX}  # fmt: skip
    install = _INSTALL.format(**{k: json.dumps(v) for k, v in quoted.items()})
    return [_md(text), _code(install.rstrip("\n"))]


def _md(text: str) -> dict:
    return {"cell_type": "markdown", "metadata": {}, "source": text}


def _code(src: str) -> dict:
    return {
        "cell_type": "code",
        "execution_count": None,
        "metadata": {"collapsed": False},
        "outputs": [],
        "source": src,
    }


def lesson_notebook(
    script: Path,
    repo_url: str | None,
    branch: str = "main",
    *,
    wheel: str,
    site_url: str | None = None,
) -> dict:
    """The notebook of one lesson script (nbformat 4.5: every cell has an id)."""
    _, blocks = split_code_and_text_blocks(str(script))
    cells = first_cells(wheel, site_url, repo_url)
    for b in blocks:
        if b.type == "text":
            cells.append(_md(rst_to_markdown(b.content, repo_url, branch)))
        elif b.content.strip():
            cells.append(_code(b.content.strip("\n")))
    for i, cell in enumerate(cells):
        cell["id"] = f"cell-{i:03d}"  # stable from build to build, unlike random ids
    return {
        "cells": cells,
        "metadata": {
            "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
            "language_info": {"name": "python"},
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def _refresh_zip(path: Path, notebooks: dict[str, bytes], wheel: Path | None) -> None:
    """Replace the notebooks inside a zip that sphinx-gallery made before we rewrote
    them, and put the site's wheel at its top, where a notebook's first cell looks."""
    with zipfile.ZipFile(path) as z:
        members = [(info, z.read(info)) for info in z.infolist()]
    members = [(i, d) for i, d in members if not re.fullmatch(r"tilebook-.*\.whl", i.filename)]
    tmp = path.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for info, data in members:
            z.writestr(info, notebooks.get(Path(info.filename).name, data))
        if wheel is not None:
            info = zipfile.ZipInfo(wheel.name, (2020, 2, 2, 0, 0, 0))
            info.external_attr = 0o644 << 16  # a wheel is compressed already: stored
            z.writestr(info, wheel.read_bytes(), compress_type=zipfile.ZIP_STORED)
    tmp.replace(path)


def _content_digest(path: Path) -> str:
    """What a reader downloads: the bytes of a notebook; the members of a zip (names
    and contents, not the times stamped in it, which change on every build)."""
    h = hashlib.sha256()
    if path.suffix == ".zip":
        with zipfile.ZipFile(path) as z:
            for info in sorted(z.infolist(), key=lambda i: i.filename):
                h.update(info.filename.encode() + b"\0" + z.read(info) + b"\0")
    else:
        h.update(path.read_bytes())
    return h.hexdigest()


def _keep_times(gal_root: Path, paths: list[Path]) -> None:
    """Give each unchanged file the modification time of its last change."""
    stamps_file = gal_root / ".tilebook_stamps.json"
    try:
        stamps = json.loads(stamps_file.read_text())
    except (OSError, ValueError):
        stamps = {}
    for path in paths:
        key = path.relative_to(gal_root).as_posix()
        digest = _content_digest(path)
        old = stamps.get(key)
        if old and old.get("digest") == digest:
            os.utime(path, (old["mtime"], old["mtime"]))
        else:
            stamps[key] = {"digest": digest, "mtime": path.stat().st_mtime}
    stamps_file.write_text(json.dumps(stamps, indent=1, sort_keys=True) + "\n")


def rewrite_notebooks(app) -> None:
    """Replace the notebooks sphinx-gallery wrote, inside its zips too."""
    conf = app.config.sphinx_gallery_conf
    srcdir = Path(app.srcdir)
    repo_url = (app.config.tilebook_repo_url or "").rstrip("/") or None
    branch = app.config.tilebook_repo_branch
    wheel = site_wheel(app)  # None for a builder that writes no site
    wheel_file = wheel.name if wheel else wheel_name(srcdir.resolve().parent)
    site_url = tilebook_site_url(app.config)
    for ex_dir, gal_dir in zip(conf["examples_dirs"], conf["gallery_dirs"], strict=True):
        ex_root, gal_root = (srcdir / ex_dir).resolve(), srcdir / gal_dir
        written: dict[str, bytes] = {}
        downloads: list[Path] = []
        for script in sorted(ex_root.glob("*/[0-9][0-9]_*.py")):
            target = gal_root / script.parent.name / (script.stem + ".ipynb")
            if target.parent.exists():
                nb = lesson_notebook(script, repo_url, branch, wheel=wheel_file, site_url=site_url)
                data = (json.dumps(nb, indent=1, ensure_ascii=False) + "\n").encode()
                target.write_bytes(data)
                written[target.name] = data
                downloads.append(target)
        for z in sorted(gal_root.rglob("*.zip")):
            _refresh_zip(z, written, wheel)
            downloads.append(z)
        if gal_root.exists():
            _keep_times(gal_root, downloads)


def setup(app):
    app.setup_extension("tilebook_wheel")  # the wheel the first cell installs
    app.connect("builder-inited", rewrite_notebooks, priority=600)  # after sphinx-gallery
    return {"parallel_read_safe": True, "parallel_write_safe": True}
