"""A lesson script as source, for tests that lift its definitions out of it.

Running a whole lesson takes minutes under Triton's interpreter (and parts of it
need a GPU), so a lesson's tests take the definitions they check out of the
script by their source: a kernel, its launcher, a constant.  What they test is
then the very text the page shows, not a copy that could drift from it.
:class:`LessonSource` finds those definitions; :meth:`LessonSource.lift` turns a
chosen set of them into a module.  The lifted text is written to a file and
imported, never ``exec``'d from a string: Triton reads a kernel's source from
its file.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from types import ModuleType

GALLERY = Path(__file__).parents[1] / "gallery"


def lesson_path(number: int) -> Path:
    """The script of lesson ``number`` (``gallery/<part>/NN_<name>.py``)."""
    found = sorted(GALLERY.glob(f"*/{number:02d}_*.py"))
    assert len(found) == 1, f"{len(found)} scripts for lesson {number:02d}: {found}"
    return found[0]


def bound_names(node: ast.stmt) -> list[str]:
    """The names a top-level statement defines: a ``def`` or ``class`` its name, an
    assignment each plain name it assigns (``a, b = ...`` both).  ``x.attr = ...``
    and ``x[i] = ...`` change ``x`` and define nothing."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return [node.name]
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, ast.AnnAssign | ast.AugAssign):
        targets = [node.target]
    else:
        return []
    names = []
    stack = list(targets)
    while stack:
        target = stack.pop(0)
        if isinstance(target, ast.Name):
            names.append(target.id)
        elif isinstance(target, ast.Tuple | ast.List):
            stack[:0] = target.elts
        elif isinstance(target, ast.Starred):
            stack.insert(0, target.value)
    return names


def write_module(path: Path, text: str, *, register: bool = False) -> ModuleType:
    """``text`` written to ``path`` and imported as a module named for the file.

    ``register`` puts the module in ``sys.modules`` (the interpreter looks a
    kernel's globals up there); the caller removes it when done.
    """
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    if register:
        sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


class LessonSource:
    """One lesson script: its path, text, lines and syntax tree, and lookups of the
    definitions at its top level (a lesson defines each name it shows once there)."""

    def __init__(self, lesson: int | Path):
        self.path = lesson_path(lesson) if isinstance(lesson, int) else Path(lesson)
        self.number = int(self.path.name[:2])
        self.text = self.path.read_text()
        self.lines = self.text.splitlines()
        self.tree = ast.parse(self.text)

    def nodes(self, name: str) -> list[ast.stmt]:
        """Every top-level statement that defines ``name``, in order."""
        return [n for n in self.tree.body if name in bound_names(n)]

    def node(self, name: str) -> ast.stmt:
        """The one top-level statement that defines ``name`` (a second one is an error:
        the tests would check one and the page would run the other)."""
        found = self.nodes(name)
        assert len(found) == 1, (
            f"lesson {self.number:02d} defines {name!r} {len(found)} times at top level"
        )
        return found[0]

    def segment(self, node: ast.stmt) -> str:
        """The lines of ``node`` as the lesson writes them, decorators included (a
        lifted kernel keeps its ``@triton.jit``, comments and line wrapping)."""
        decorators = getattr(node, "decorator_list", [])
        start = min([node.lineno] + [d.lineno for d in decorators])
        return "\n".join(self.lines[start - 1 : node.end_lineno])

    def source(self, name: str) -> str:
        """The source of the one top-level definition of ``name``."""
        return self.segment(self.node(name))

    def body(self, name: str) -> list[str]:
        """The statements of function ``name``'s body, unparsed: the code without its
        signature, comments or line wrapping, to compare two kernels' logic."""
        return [ast.unparse(s) for s in self.node(name).body]

    def constant(self, name: str):
        """The literal value the lesson assigns to ``name`` (in ``a, b = 1, 2`` too)."""
        node = self.node(name)
        assert isinstance(node, ast.Assign) and len(node.targets) == 1, ast.unparse(node)
        target, value = node.targets[0], node.value
        if isinstance(target, ast.Tuple):
            names = [e.id for e in target.elts]
            value = value.elts[names.index(name)]
        return ast.literal_eval(value)

    def lift(
        self,
        names: Iterable[str],
        folder: Path,
        head: str = "",
        *,
        source: Callable[[str], str] | None = None,
        register: bool = False,
    ) -> ModuleType:
        """The definitions ``names`` (in that order, after ``head``: the imports and
        stand-ins they need) as module ``lessonNN_lifted`` in ``folder``.

        ``source`` replaces :meth:`source` for a lesson whose tests lift more than
        one statement per name.
        """
        source = source or self.source
        body = "\n\n\n".join(source(name) for name in names)
        path = folder / f"lesson{self.number:02d}_lifted.py"
        return write_module(path, head + body + "\n", register=register)
