"""How much of a lesson's code is plumbing: claims, sentences made from data, record
handling, tables and widget wiring (issue 28: at most 15% of its code lines).

A *code line* is a line of a lesson's Python that is neither blank nor a comment (the
prose cells are comments).  A top-level statement, or a statement in the body of a
top-level ``if``/``for``/``with``, is *plumbing* when it uses a plumbing name: one
imported from a plumbing module (:data:`PLUMBING_MODULES`, matched by the module's last
name, so that ``tilebook.claims`` and ``tilebook.course.claims`` both count), one of
:data:`PLUMBING_CALLS` from elsewhere, or a variable that an earlier plumbing statement
bound from a plumbing module's name (``costs = Claims(...)`` makes ``costs.check(...)``
plumbing; the data a record call returns is not).  A function
defined at the top level is plumbing when every statement of its body is, and a
top-level literal (a dict of claims, a table's columns, a template) that only plumbing
reads is plumbing, wherever it is bound.  Imports are code lines of neither kind.

    python tests/plumbing.py            # the table, one row per lesson
"""

from __future__ import annotations

import ast
import io
import sys
import tokenize
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: Modules whose every name is plumbing (the last part of the module's dotted name).
PLUMBING_MODULES = ("claims", "prose", "tables", "display")
PLUMBING_PREFIXES = ("widgets",)  # tilebook.widgets, tilebook.widgets_grid, ...
#: Names of other modules that are plumbing: record handling.
PLUMBING_CALLS = frozenset({"record_or_measure", "load_record", "no_record", "save_record"})


@dataclass(frozen=True)
class Share:
    lesson: str
    code: int
    plumbing: int

    @property
    def share(self) -> float:
        return self.plumbing / self.code if self.code else 0.0


def _code_lines(source: str) -> set[int]:
    """Line numbers that hold code: a token other than a comment or a newline."""
    lines: set[int] = set()
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT,
            tokenize.DEDENT, tokenize.ENDMARKER, tokenize.ENCODING}  # fmt: skip
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in skip:
            lines.update(range(tok.start[0], tok.end[0] + 1))
    return lines


def _plumbing_module(module: str) -> bool:
    last = module.rsplit(".", 1)[-1]
    return last in PLUMBING_MODULES or last.startswith(PLUMBING_PREFIXES)


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _bound(node: ast.stmt) -> set[str]:
    targets: list[ast.AST] = []
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
        targets = [node.target]
    elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
        return {node.name}
    return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}


def measure(path: Path) -> Share:
    source = path.read_text()
    tree = ast.parse(source)
    code = _code_lines(source)
    if tree.body and _docstring(tree.body[0]):  # the page's title and introduction: prose
        code -= set(range(tree.body[0].lineno, tree.body[0].end_lineno + 1))
    tainted: set[str] = set(PLUMBING_CALLS)
    plumbing: set[int] = set()

    def lines_of(node: ast.stmt) -> set[int]:
        return set(range(node.lineno, node.end_lineno + 1)) & code

    def visit(node: ast.stmt) -> bool:
        """Mark ``node``'s lines if it is plumbing; True when it is."""
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            if isinstance(node, ast.ImportFrom) and _plumbing_module(node.module or ""):
                tainted.update(a.asname or a.name for a in node.names)
            elif isinstance(node, ast.Import):
                tainted.update(a.asname or a.name.split(".")[0] for a in node.names
                               if _plumbing_module(a.name))  # fmt: skip
            return False
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            body = [s for s in node.body if not _docstring(s)]
            is_plumbing = bool(body) and all(_uses(s) for s in body)
            if is_plumbing:
                tainted.add(node.name)
                plumbing.update(lines_of(node))
            return is_plumbing
        if isinstance(node, (ast.If, ast.For, ast.With, ast.While, ast.Try)):
            head = _uses(node.test) if isinstance(node, (ast.If, ast.While)) else False
            parts = [visit(s) for s in _bodies(node)]
            if head or (parts and all(parts)):
                plumbing.update(lines_of(node))
                return True
            return False
        if _uses(node):
            if _names(node) & (tainted - PLUMBING_CALLS):  # a claim, a widget: its name too
                tainted.update(_bound(node))
            plumbing.update(lines_of(node))
            return True
        return False

    def _uses(node: ast.AST) -> bool:
        return bool(_names(node) & tainted)

    for stmt in tree.body:
        if not _docstring(stmt):
            visit(stmt)
    # A literal (a dict of claims, a table's columns, a sentence's template) that only
    # plumbing reads is plumbing too, bound apart or not.
    loads = [(n.id, n.lineno) for n in ast.walk(tree)
             if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)]  # fmt: skip
    specs = [s for s in tree.body if isinstance(s, (ast.Assign, ast.AnnAssign))
             and isinstance(s.value, _LITERALS) and not lines_of(s) <= plumbing]  # fmt: skip
    changed = True
    while changed:
        changed = False
        for stmt in specs:
            names = _bound(stmt)
            uses = [line for name, line in loads if name in names and line > stmt.end_lineno]
            if uses and all(line in plumbing for line in uses) and not lines_of(stmt) <= plumbing:
                plumbing.update(lines_of(stmt))
                changed = True
    return Share(path.stem, len(code), len(plumbing))


_LITERALS = (ast.Dict, ast.List, ast.Tuple, ast.Set, ast.Constant, ast.JoinedStr, ast.DictComp,
             ast.ListComp, ast.SetComp, ast.Lambda)  # fmt: skip


def _docstring(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)


def _bodies(node: ast.stmt) -> list[ast.stmt]:
    out = list(getattr(node, "body", [])) + list(getattr(node, "orelse", []))
    out += list(getattr(node, "finalbody", []))
    for h in getattr(node, "handlers", []):
        out += h.body
    return out


def lessons() -> list[Path]:
    return sorted(ROOT.glob("gallery/*/[0-9][0-9]_*.py"))


def table(shares: list[Share]) -> str:
    rows = [f"{'lesson':<34}{'code lines':>11}{'plumbing':>10}{'share':>8}"]
    rows += [f"{s.lesson:<34}{s.code:>11}{s.plumbing:>10}{s.share:>8.0%}" for s in shares]
    return "\n".join(rows)


if __name__ == "__main__":
    print(table([measure(p) for p in lessons()]))
    sys.exit(0)
