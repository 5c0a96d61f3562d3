"""Widgets and figures of Part I (lessons 01 and 02): how a grid of programs covers data.

* :class:`ThreadsVsTilesExplorer` (lesson 01): a vector of ``N`` elements cut into
  programs of ``BLOCK`` elements by a grid rule, beside CUDA's one thread per
  element: programs launched, elements per program and per thread, and what a
  wrong grid leaves unprocessed or launches for nothing.
* :class:`GridExplorer` (lesson 02): an ``M x N`` matrix cut into
  ``BLOCK_M x BLOCK_N`` tiles, each owned by one program of a 2-D grid: which
  program owns which tile, in which order the GPU starts them, and the tiles
  nobody owns when the grid is too small or its axes are swapped.

Every figure the widgets show is computed here in Python, for every setting
of the knobs (:meth:`ThreadsVsTilesExplorer.rows`, :meth:`GridExplorer.rows`), so a
test can check it and a lesson can check it against a kernel's own output;
the JavaScript only draws the row the knobs select.  :func:`ownership_figure`
draws what a kernel itself reported: a tensor in which each program stored
its id over the elements it owns.  The widgets follow
:class:`tilebook.course.widgets.Widget`: self-contained HTML, native inputs with
labels, colours from the page's theme, and a root ``data-value`` that changes
when a knob turns.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from .widgets import Widget, asset

__all__ = [
    "GRID_RULES",
    "TILE_RULES",
    "GridExplorer",
    "ThreadsVsTilesExplorer",
    "ownership_figure",
]

_WARP = 32  # threads in a warp on every CUDA GPU

#: The grid rules of :class:`ThreadsVsTilesExplorer`, in the order shown: the right
#: one first.
GRID_RULES = ("cdiv(N, BLOCK)", "N // BLOCK", "N")
#: The grid rules of :class:`GridExplorer`, in the order shown.
TILE_RULES = ("cdiv", "floor", "swapped axes")


def _pack(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Rows as a table of columns, each distinct text stored once (``"@3"``: text 3).

    Knob values that are text (grid rules) stay inline so that rows can be
    found by them; long texts (notes, verdicts) are shared between the rows.
    """
    columns = list(rows[0])
    texts: list[str] = []
    index: dict[str, int] = {}

    def cell(key, v):
        if isinstance(v, str) and key not in ("grid",):
            if v not in index:
                index[v] = len(texts)
                texts.append(v)
            return f"@{index[v]}"
        return v

    table = [[cell(k, r[k]) for k in columns] for r in rows]
    return {"columns": columns, "table": table, "texts": texts}


def _check_values(name: str, values: Sequence[int]) -> list[int]:
    vals = list(values)
    if not vals or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in vals):
        raise ValueError(f"{name} must be positive ints, got {values!r}")
    return sorted(dict.fromkeys(vals))


class ThreadsVsTilesExplorer(Widget):
    """``N`` elements cut into programs of ``BLOCK`` elements, by three grid rules.

    Parameters
    ----------
    sizes, blocks
        The values of the ``N`` and ``BLOCK`` sliders.
    num_warps
        Warps per program (to show threads per program and elements per thread).
    cuda_block
        Threads per block of the CUDA version shown beside it.
    notes
        ``{grid rule: text}``: an explanation shown with every row of that rule
        (say, the measured cost of launching ``N`` programs, from a record).
    caption
        Where the notes' figures come from.
    initial
        ``{"n": ..., "block": ..., "grid": ...}``.
    """

    kind = "threads-vs-tiles"
    scripts = ("tiles.js", "threads-vs-tiles.js")
    max_segments = 256

    def __init__(
        self,
        sizes: Sequence[int],
        blocks: Sequence[int],
        *,
        num_warps: int = 4,
        cuda_block: int = 256,
        notes: dict[str, str] | None = None,
        caption: str = "",
        initial: dict[str, Any] | None = None,
        title: str = "Threads vs tiles: one program per block of elements",
    ) -> None:
        self.sizes = _check_values("sizes", sizes)
        self.blocks = _check_values("blocks", blocks)
        if not isinstance(num_warps, int) or num_warps < 1:
            raise ValueError(f"num_warps must be a positive int, got {num_warps!r}")
        if not isinstance(cuda_block, int) or cuda_block < 1:
            raise ValueError(f"cuda_block must be a positive int, got {cuda_block!r}")
        self.notes = dict(notes or {})
        unknown = set(self.notes) - set(GRID_RULES)
        if unknown:
            raise ValueError(f"notes name unknown grid rules {sorted(unknown)}; see GRID_RULES")
        self.num_warps = num_warps
        self.cuda_block = cuda_block
        self.caption = caption
        self.title = title
        self.initial = {"n": self.sizes[0], "block": self.blocks[0], "grid": GRID_RULES[0]}
        self.initial.update(initial or {})
        for key, allowed in (("n", self.sizes), ("block", self.blocks), ("grid", GRID_RULES)):
            if self.initial[key] not in allowed:
                raise ValueError(f"initial {key}={self.initial[key]!r} is not among {allowed}")

    @staticmethod
    def programs(n: int, block: int, grid: str) -> int:
        """Programs that ``grid`` launches for ``n`` elements and blocks of ``block``."""
        if grid == "cdiv(N, BLOCK)":
            return -(-n // block)
        if grid == "N // BLOCK":
            return n // block
        if grid == "N":
            return n
        raise ValueError(f"unknown grid rule {grid!r}; use one of {GRID_RULES}")

    def row(self, n: int, block: int, grid: str) -> dict[str, Any]:
        """Everything the widget shows for one setting."""
        programs = self.programs(n, block, grid)
        needed = -(-n // block)
        covered = min(n, programs * block)
        tail = n - covered
        idle = max(0, programs - needed)
        threads = _WARP * self.num_warps
        per_thread = block / threads
        wrong = slow = ""
        if tail:
            who = "1 program covers" if programs == 1 else f"{programs} programs cover"
            span = f"element {covered} is" if tail == 1 else f"elements {covered} to {n - 1} are"
            wrong = f"{who} {covered} elements; {span} never processed."
        elif idle:
            slow = (
                f"{programs} programs for {needed} blocks: {idle} of them own no element, "
                "start, find their mask all false and exit."
            )
        return {
            "n": n,
            "block": block,
            "grid": grid,
            "programs": programs,
            "needed": needed,
            "covered": covered,
            "tail": tail,
            "idle": idle,
            "threads_per_program": threads,
            "elements_per_thread": f"{per_thread:g}",
            "cuda_blocks": -(-n // self.cuda_block),
            "wrong": wrong,
            "slow": slow,
            "note": self.notes.get(grid, ""),
        }

    def rows(self) -> list[dict[str, Any]]:
        """One row per setting of the knobs."""
        return [self.row(n, b, g) for n in self.sizes for b in self.blocks for g in GRID_RULES]

    def data(self) -> dict[str, Any]:
        return {
            "knobs": [
                {
                    "name": "n",
                    "label": "N",
                    "kind": "slider",
                    "values": self.sizes,
                    "initial": self.initial["n"],
                },
                {
                    "name": "block",
                    "label": "BLOCK",
                    "kind": "slider",
                    "values": self.blocks,
                    "initial": self.initial["block"],
                },
                {
                    "name": "grid",
                    "label": "grid",
                    "kind": "choice",
                    "values": list(GRID_RULES),
                    "initial": self.initial["grid"],
                },
            ],
            **_pack(self.rows()),
            "num_warps": self.num_warps,
            "cuda_block": self.cuda_block,
            "max_segments": self.max_segments,
            "caption": self.caption,
            "css": asset("tiles.css"),
        }


class GridExplorer(Widget):
    """An ``M x N`` matrix in ``BLOCK_M x BLOCK_N`` tiles, one program per tile.

    The kernel it models reads ``tl.program_id(0)`` as the tile's row and
    ``tl.program_id(1)`` as its column, and masks the edges.  Grid rules:
    ``"cdiv"`` (``(cdiv(M, BLOCK_M), cdiv(N, BLOCK_N))``, right),
    ``"floor"`` (``M // BLOCK_M``: too small when a size is not a multiple)
    and ``"swapped axes"`` (``(cdiv(N, BLOCK_N), cdiv(M, BLOCK_M))``, the grid of a
    kernel that reads the axes the other way round).  Programs are numbered by
    their linear index ``pid_0 + pid_1 * grid_0``, the order a GPU mostly (not
    exactly) starts them in; "programs started" takes it as the start order.
    """

    kind = "grid-explorer"
    scripts = ("tiles.js", "grid-explorer.js")

    def __init__(
        self,
        sizes: Sequence[int],
        tiles: Sequence[int],
        *,
        caption: str = "",
        initial: dict[str, Any] | None = None,
        title: str = "Grid explorer: which program owns which tile",
    ) -> None:
        self.sizes = _check_values("sizes", sizes)
        self.tiles = _check_values("tiles", tiles)
        self.caption = caption
        self.title = title
        self.initial = {
            "m": self.sizes[0],
            "n": self.sizes[0],
            "block_m": self.tiles[0],
            "block_n": self.tiles[0],
            "grid": TILE_RULES[0],
        }
        self.initial.update(initial or {})
        for key, allowed in (
            ("m", self.sizes),
            ("n", self.sizes),
            ("block_m", self.tiles),
            ("block_n", self.tiles),
            ("grid", TILE_RULES),
        ):
            if self.initial[key] not in allowed:
                raise ValueError(f"initial {key}={self.initial[key]!r} is not among {allowed}")

    @staticmethod
    def grid(m: int, n: int, block_m: int, block_n: int, rule: str) -> tuple[int, int]:
        """The grid ``(grid_0, grid_1)`` that ``rule`` launches."""
        if rule == "cdiv":
            return math.ceil(m / block_m), math.ceil(n / block_n)
        if rule == "floor":
            return m // block_m, n // block_n
        if rule == "swapped axes":
            return math.ceil(n / block_n), math.ceil(m / block_m)
        raise ValueError(f"unknown grid rule {rule!r}; use one of {TILE_RULES}")

    @classmethod
    def owners(cls, m: int, n: int, block_m: int, block_n: int, rule: str) -> list[list[int]]:
        """The program (linear launch index) that owns each tile; -1 where none does."""
        g0, g1 = cls.grid(m, n, block_m, block_n, rule)
        tm, tn = math.ceil(m / block_m), math.ceil(n / block_n)
        return [[i + j * g0 if i < g0 and j < g1 else -1 for j in range(tn)] for i in range(tm)]

    def row(self, m: int, n: int, block_m: int, block_n: int, rule: str) -> dict[str, Any]:
        """Everything the widget shows for one setting."""
        g0, g1 = self.grid(m, n, block_m, block_n, rule)
        tm, tn = math.ceil(m / block_m), math.ceil(n / block_n)
        owned = min(g0, tm) * min(g1, tn)
        programs = g0 * g1
        unowned = tm * tn - owned
        idle = programs - owned
        wrong = note = ""
        if unowned:
            wrong = f"{unowned} of {tm * tn} tiles are owned by no program."
            note = "Their elements are never computed: " + (
                "the grid's axes are the other way round from the kernel's."
                if rule == "swapped axes"
                else "rounding down drops the ragged last row or column of tiles."
            )
        elif idle:
            note = f"{idle} of {programs} programs fall outside the matrix and store nothing."
        return {
            "m": m,
            "n": n,
            "block_m": block_m,
            "block_n": block_n,
            "grid": rule,
            "grid_0": g0,
            "grid_1": g1,
            "tiles_m": tm,
            "tiles_n": tn,
            "tiles": tm * tn,
            "programs": programs,
            "unowned": unowned,
            "idle": idle,
            "swapped": rule == "swapped axes",
            "wrong": wrong,
            "note": note,
        }

    def rows(self) -> list[dict[str, Any]]:
        """One row per setting of the knobs."""
        return [
            self.row(m, n, bm, bn, g)
            for m in self.sizes
            for n in self.sizes
            for bm in self.tiles
            for bn in self.tiles
            for g in TILE_RULES
        ]

    def data(self) -> dict[str, Any]:
        def knob(name, label, values, kind="slider"):
            return {
                "name": name,
                "label": label,
                "kind": kind,
                "values": list(values),
                "initial": self.initial[name],
            }

        return {
            "knobs": [
                knob("m", "M (rows)", self.sizes),
                knob("n", "N (columns)", self.sizes),
                knob("block_m", "BLOCK_M", self.tiles),
                knob("block_n", "BLOCK_N", self.tiles),
                knob("grid", "grid", TILE_RULES, "choice"),
            ],
            **_pack([{k: v for k, v in r.items() if k != "swapped"} for r in self.rows()]),
            "caption": self.caption,
            "css": asset("tiles.css"),
        }


def ownership_figure(
    owner: Any,
    *,
    tile: tuple[int, int] | None = None,
    title: str = "",
    label: str = "program",
):
    """Draw which program owns each element, from a tensor the kernel itself wrote.

    ``owner`` holds, per element, the id a program stored there, or a
    negative value where no program stored anything (drawn hatched).  A 1-D
    ``owner`` is drawn as a strip with each program's id over its run of
    elements; a 2-D one as a matrix, with the id written in each ``tile``
    (``(BLOCK_M, BLOCK_N)``) when given.  Returns the figure.
    """
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.colors import ListedColormap

    from .plots import PALETTE, house_style

    ids = np.asarray(owner.detach().cpu() if hasattr(owner, "detach") else owner)
    if ids.ndim not in (1, 2):
        raise ValueError(f"ownership_figure() draws 1-D or 2-D maps, got {ids.ndim}-D")
    grid = ids[None, :] if ids.ndim == 1 else ids
    shown = np.ma.masked_less(grid, 0)

    def light(hex_colour):  # the palette mixed with white, so that labels stay legible
        rgb = np.array([int(hex_colour[i : i + 2], 16) for i in (1, 3, 5)]) / 255
        return tuple(0.45 * rgb + 0.55)

    cmap = ListedColormap([light(PALETTE[i]) for i in range(4)])
    with house_style():
        height = 1.6 if ids.ndim == 1 else max(2.5, min(6.0, 7.0 * grid.shape[0] / grid.shape[1]))
        fig, ax = plt.subplots(figsize=(7.0, height))
        ax.grid(False)
        ax.add_patch(
            plt.Rectangle(
                (-0.5, -0.5), grid.shape[1], grid.shape[0], hatch="////",
                facecolor="none", edgecolor="#B3261E", linewidth=0, zorder=1,
            )
        )  # fmt: skip
        ax.imshow(
            shown % 4, cmap=cmap, aspect="auto", interpolation="nearest", vmin=0, vmax=3,
            zorder=2,
        )  # fmt: skip
        if ids.ndim == 1:
            for p in np.unique(ids[ids >= 0]):
                where = np.flatnonzero(ids == p)
                ax.text(where.mean(), 0, str(p), ha="center", va="center", fontsize=8, zorder=3)
            ax.set_yticks([])
            ax.set_xlabel("element")
        else:
            bm, bn = tile or (0, 0)
            if tile:
                for i in range(0, grid.shape[0], bm):
                    for j in range(0, grid.shape[1], bn):
                        v = grid[i, j]
                        text = str(v) if v >= 0 else "none"
                        y = i + (min(bm, grid.shape[0] - i) - 1) / 2
                        x = j + (min(bn, grid.shape[1] - j) - 1) / 2
                        ax.text(x, y, text, ha="center", va="center", fontsize=8, zorder=3)
                for i in range(bm, grid.shape[0], bm):
                    ax.axhline(i - 0.5, color="white", linewidth=1, zorder=3)
                for j in range(bn, grid.shape[1], bn):
                    ax.axvline(j - 0.5, color="white", linewidth=1, zorder=3)
            ax.set_xlabel("column")
            ax.set_ylabel("row")
        ax.set_title(title or f"which {label} wrote each element")
        fig.tight_layout()
    return fig
