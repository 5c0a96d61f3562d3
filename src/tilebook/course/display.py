"""What a lesson shows when it runs as a plain script, outside the site and Jupyter.

On the site and in a notebook, a lesson's tables, sentences made from data,
checked claims, plots and widgets appear where their cell ends.  Run as
``python 07_vector_add.py`` there is nowhere for them to appear, so tilebook
collects them as they are made and, when the script ends, writes them in order
into one self-contained HTML page next to it (``07_vector_add.html`` in the
working directory), says where, and opens it in a browser when there is a
display.

``TILEBOOK_SHOW=0`` turns this off, ``=1`` turns it on in any context;
``TILEBOOK_OPEN=0`` writes the page without opening it.
"""

from __future__ import annotations

import atexit
import base64
import html
import io
import os
import sys
import webbrowser
from pathlib import Path
from typing import Any

__all__ = ["enabled", "register", "report_path"]

SHOW_ENV = "TILEBOOK_SHOW"
OPEN_ENV = "TILEBOOK_OPEN"

_ITEMS: list[Any] = []  # displayable objects and figure numbers, in the order made
_FIGS_SEEN: set[int] = set()
_HOOKED = False
_SCRIPT: list[Path] = []  # the script, noted while it runs (at exit __main__ may be gone)


def _script() -> Path | None:
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if not path or not str(path).endswith(".py"):
        return None
    return Path(path)


def enabled() -> bool:
    """True when the running program is a lesson run as a plain script."""
    flag = os.environ.get(SHOW_ENV, "").strip().lower()
    if flag in ("0", "false", "no", "off"):
        return False
    if flag in ("1", "true", "yes", "on"):
        return _script() is not None
    if any(m in sys.modules for m in ("sphinx", "IPython", "pytest", "ipykernel")):
        return False
    return _script() is not None


def report_path() -> Path | None:
    script = _SCRIPT[0] if _SCRIPT else _script()
    return None if script is None else Path.cwd() / f"{script.stem}.html"


def _new_figures() -> list[int]:
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return []
    new = [n for n in plt.get_fignums() if n not in _FIGS_SEEN]
    _FIGS_SEEN.update(new)
    return new


def register(obj: Any, replaces: tuple[Any, ...] = ()) -> None:
    """Remember ``obj`` (anything with ``_repr_html_``) for the end-of-script page.

    ``replaces``: objects registered before that ``obj`` now shows instead (two
    paragraphs joined into one, say); they are dropped from the page.
    """
    global _HOOKED
    if not enabled():
        return
    if replaces:
        _ITEMS[:] = [it for it in _ITEMS if not any(it[1] is r for r in replaces)]
    _ITEMS.extend(("figure", n) for n in _new_figures())
    _ITEMS.append(("object", obj))
    if not _HOOKED:
        _SCRIPT.append(_script())
        atexit.register(_write)
        _HOOKED = True


def _figure_html(num: int) -> str:
    import matplotlib.pyplot as plt

    if num not in plt.get_fignums():
        return ""
    buf = io.BytesIO()
    plt.figure(num).savefig(buf, format="png", dpi=110)
    data = base64.b64encode(buf.getvalue()).decode()
    return f'<img alt="figure {num}" style="max-width:100%" src="data:image/png;base64,{data}">'


def _write() -> None:
    path = report_path()
    if path is None:
        return
    _ITEMS.extend(("figure", n) for n in _new_figures())
    parts = []
    for kind, item in _ITEMS:
        if kind == "figure":
            parts.append(_figure_html(item))
        else:
            try:
                parts.append(item._repr_html_())
            except Exception as exc:  # noqa: BLE001  (show the rest even if one fails)
                parts.append(f"<pre>{html.escape(repr(exc))}</pre>")
    title = html.escape(path.stem)
    page = (
        f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{title}</title>"
        "<style>body{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;"
        "padding:0 1rem;line-height:1.5}table{border-collapse:collapse}"
        "td,th{padding:2px 8px;border-bottom:1px solid #ccc}"
        "th{word-break:normal;overflow-wrap:normal;hyphens:manual}"
        ".tb-table-wrap{overflow-x:auto}"
        ".tb-claims{border-left:4px solid #0a7d3b;padding:0.2rem 0.9rem;margin:0.8rem 0}"
        ".tb-claims.tb-claims-failed{border-left-color:#a1231b}"
        ".tb-claims.tb-claims-unchecked{border-left-color:#8a8f98}"
        ".tb-claim-bad{color:#a1231b;font-weight:600}"
        "</style></head><body>"
        f"<h1>{title}</h1>{''.join(parts)}</body></html>"
    )
    try:
        path.write_text(page, encoding="utf-8")
    except OSError as exc:
        print(f"tilebook: could not write {path}: {exc}", file=sys.stderr)
        return
    print(f"tilebook: this lesson's tables, plots and widgets are in {path}")
    wants = os.environ.get(OPEN_ENV, "1").strip().lower() not in ("0", "false", "no")
    has_display = sys.platform in ("darwin", "win32") or bool(
        os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")
    )
    if wants and has_display:
        webbrowser.open(path.as_uri())
