"""Getting a kernel to the process that compiles it.

On a GPU the kernel object is compiled where it is.  In CPU mode the kernels
of this process are interpreter wrappers, so the compile runs in a child
process (``TILEBOOK_MODE=aot``) and the kernel has to be found again there:

* a kernel that lives in an importable module travels as ``"module:name"``;
* a kernel defined in a lesson script, a notebook or any other module that the
  child cannot import travels as source: its ``def`` (with its decorators),
  the sources of the ``@triton.jit`` helpers it calls, recursively, and the
  globals they read (modules, ``tl.constexpr`` values, importable functions,
  anything that pickles).  The child puts each function's lines back at their
  original line numbers under the original file name, so the locations in
  every stage point at the reader's own file and lines.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import importlib.machinery
import importlib.util
import inspect
import linecache
import os
import pickle
import sys
import textwrap
import types
from typing import Any

__all__ = ["jit_function", "kernel_ref", "load_kernel", "python_function", "resolve_spec"]


def _chain(obj: Any) -> list[Any]:
    """``obj`` and what it wraps: Autotuner -> JITFunction or InterpretedFunction -> function."""
    out = [obj]
    while not isinstance(out[-1], types.FunctionType) and hasattr(out[-1], "fn"):
        out.append(out[-1].fn)
        if len(out) > 16:
            break
    return out


def _is_kernel(obj: Any) -> bool:
    names = {type(o).__name__ for o in _chain(obj)}
    return bool(names & {"JITFunction", "InterpretedFunction"})


def python_function(obj: Any) -> types.FunctionType:
    """The plain Python function inside a ``@triton.jit`` kernel (or its wrappers)."""
    chain = _chain(obj)
    if not _is_kernel(obj) or not isinstance(chain[-1], types.FunctionType):
        raise TypeError(
            f"expected a @triton.jit kernel (or a 'module:name' string), got "
            f"{type(obj).__name__} {obj!r}"
        )
    return chain[-1]


def jit_function(obj: Any, what: str = "the kernel"):
    """The ``JITFunction`` inside ``obj`` (an Autotuner or Heuristics wraps one)."""
    from triton.runtime.jit import JITFunction

    for o in _chain(obj):
        if isinstance(o, JITFunction):
            return o
    if any(type(o).__name__ == "InterpretedFunction" for o in _chain(obj)):
        raise TypeError(
            f"{what} is an interpreter wrapper: this process runs Triton's interpreter "
            "(TRITON_INTERPRET=1), and only a JITFunction can be compiled here"
        )
    raise TypeError(f"{what} is not a @triton.jit kernel: {type(obj).__name__}")


def resolve_spec(spec: str):
    """``"package.module:name"`` or ``"/path/file.py:name"`` to the object it names."""
    target, _, attr = spec.rpartition(":")
    if not target or not attr:
        raise ValueError(
            f"kernel spec must look like 'module:name' or 'file.py:name', got {spec!r}"
        )
    if target.endswith(".py"):
        if not os.path.isfile(target):
            raise ValueError(f"kernel spec {spec!r}: no file {target}")
        mod_spec = importlib.util.spec_from_file_location("_tilebook_aot_kernel", target)
        if mod_spec is None or mod_spec.loader is None:
            raise ValueError(f"cannot import {target}")
        module = importlib.util.module_from_spec(mod_spec)
        mod_spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as exc:
            raise ValueError(f"kernel spec {spec!r}: cannot import {target}: {exc}") from exc
    if not hasattr(module, attr):
        raise ValueError(f"kernel spec {spec!r}: {target} has no {attr!r}")
    return getattr(module, attr)


# ---------------------------------------------------------------- the parent


def _importable(module: types.ModuleType) -> bool:
    """Whether a fresh process with this ``sys.path`` imports the same file by name."""
    name = module.__name__
    spec = getattr(module, "__spec__", None)
    origin = getattr(spec, "origin", None)
    if name == "__main__" or spec is None or spec.name != name or not origin:
        return False
    if not os.path.isfile(origin):
        return False
    top = importlib.machinery.PathFinder.find_spec(name.partition(".")[0], sys.path)
    if top is None:
        return False
    origin = os.path.realpath(origin)
    if top.submodule_search_locations:
        return any(
            origin.startswith(os.path.realpath(root) + os.sep)
            for root in top.submodule_search_locations
        )
    return bool(top.origin) and os.path.realpath(top.origin) == origin


def _spec_of(obj: Any, fn: types.FunctionType) -> str | None:
    """``"module:name"`` when the child can import ``obj`` under its own name."""
    module = sys.modules.get(fn.__module__)
    if module is None or not _importable(module):
        return None
    bound = getattr(module, fn.__name__, None)
    if bound is None or _chain(bound)[-1] is not fn:
        return None
    return f"{fn.__module__}:{fn.__name__}"


def _global_names(tree: ast.AST) -> set[str]:
    """Names a function's source reads that are not its arguments or locals."""
    loads = {
        n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
    }
    local: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = node.args
            for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]:
                if arg is not None:
                    local.add(arg.arg)
            body = node.body if isinstance(node.body, list) else [node.body]
            for stmt in body:
                for n in ast.walk(stmt):
                    if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)):
                        local.add(n.id)
    return loads - local


def _entry(name: str, value: Any, visit) -> tuple | None:
    """How the child gets the global ``name``; None when it cannot."""
    if isinstance(value, types.ModuleType):
        return ("module", value.__name__)
    if _is_kernel(value):
        fn = python_function(value)
        spec = _spec_of(value, fn)
        if spec is not None:
            return ("import", *spec.split(":"))
        visit(fn)
        return ("shipped", os.path.normpath(fn.__code__.co_filename), fn.__name__)
    module_name = getattr(value, "__module__", None)
    qualname = getattr(value, "__qualname__", None)
    if (
        isinstance(value, (type, types.FunctionType, types.BuiltinFunctionType))
        and module_name
        and qualname
        and "<locals>" not in qualname
    ):
        module = sys.modules.get(module_name)
        if module is not None and _importable(module):
            return ("import", module_name, qualname)
        return None
    try:
        data = pickle.dumps(value)
    except Exception:  # noqa: BLE001  (anything unpicklable is simply not sent)
        return None
    if b"__main__" in data:  # pickled by reference to this process's script
        return None
    return ("value", data)


def kernel_ref(kernel: Any) -> dict[str, Any]:
    """What a child process needs to find ``kernel`` again (picklable).

    Raises
    ------
    TypeError
        ``kernel`` is not a ``@triton.jit`` kernel or a spec string.
    ValueError
        The kernel is defined inside a function (a closure), or its source
        cannot be read.
    """
    if isinstance(kernel, str):
        target, _, attr = kernel.rpartition(":")
        if not target or not attr:
            raise ValueError(
                f"kernel spec must look like 'module:name' or 'file.py:name', got {kernel!r}"
            )
        return {"spec": kernel}
    fn = python_function(kernel)
    spec = _spec_of(kernel, fn)
    if spec is not None:
        return {"spec": spec}

    files: dict[str, dict[int, str]] = {}
    namespaces: dict[str, dict[str, tuple]] = {}
    missing: list[str] = []
    seen: set[tuple[str, str]] = set()

    def visit(f: types.FunctionType) -> None:
        path = os.path.normpath(f.__code__.co_filename)
        if (path, f.__qualname__) in seen:
            return
        seen.add((path, f.__qualname__))
        if "<locals>" in f.__qualname__ or f.__closure__:
            raise ValueError(
                f"{f.__qualname__} is defined inside a function; define @triton.jit "
                "kernels and helpers at the top level of the script to compile them"
            )
        try:
            src, first = inspect.getsourcelines(f)
        except (OSError, TypeError) as exc:
            raise ValueError(f"cannot read the source of {f.__qualname__}: {exc}") from exc
        # A def under a top-level block (lesson 04's ``if BLOCK_POINTERS:``) is indented;
        # the child runs it at the top level, so it travels dedented, on the same lines.
        src = textwrap.dedent("".join(src)).splitlines(True)
        lines = files.setdefault(path, {})
        for i, text in enumerate(src):
            lines[first + i] = text if text.endswith("\n") else text + "\n"
        ns = namespaces.setdefault(path, {})
        for name in sorted(_global_names(ast.parse(textwrap.dedent("".join(src))))):
            if name in ns or name not in f.__globals__:
                continue
            value = f.__globals__[name]
            if _chain(value)[-1] is f:  # the def itself binds it
                continue
            entry = _entry(name, value, visit)
            if entry is None:
                missing.append(f"{name} ({type(value).__name__})")
            elif entry[0] == "shipped" and entry[1] == path and entry[2] == name:
                continue  # a helper of the same file: its own def binds it
            else:
                ns[name] = entry

    visit(fn)
    return {
        "ship": {"files": files, "namespaces": namespaces, "missing": missing},
        "file": os.path.normpath(fn.__code__.co_filename),
        "name": fn.__name__,
    }


# ----------------------------------------------------------------- the child


def _rebuild(ship: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Execute shipped sources at their original file names and line numbers."""
    spaces: dict[str, dict[str, Any]] = {}
    for i, (path, lines) in enumerate(sorted(ship["files"].items())):
        text = "".join(lines.get(n, "\n") for n in range(1, max(lines) + 1))
        # inspect (and so Triton) reads a function's source through linecache;
        # an entry without a modification time is never reloaded from disk.
        linecache.cache[path] = (len(text), None, text.splitlines(True), path)
        ns: dict[str, Any] = {
            "__name__": f"_tilebook_aot_shipped_{i}",
            "__file__": path,
            "__builtins__": builtins,
        }
        for name, entry in ship["namespaces"].get(path, {}).items():
            kind = entry[0]
            try:
                if kind == "module":
                    ns[name] = importlib.import_module(entry[1])
                elif kind == "import":
                    value: Any = importlib.import_module(entry[1])
                    for part in entry[2].split("."):
                        value = getattr(value, part)
                    ns[name] = value
                elif kind == "value":
                    ns[name] = pickle.loads(entry[1])  # our own parent's data
            except Exception as exc:
                raise RuntimeError(
                    f"could not rebuild the global {name!r} of {path}: {exc}"
                ) from exc
        exec(compile(text, path, "exec"), ns)  # noqa: S102  (the kernel source we were sent)
        spaces[path] = ns
    for path, entries in ship["namespaces"].items():
        for name, entry in entries.items():
            if entry[0] == "shipped":
                spaces[path][name] = spaces[entry[1]][entry[2]]
    return spaces


def load_kernel(ref: dict[str, Any], cache: dict[int, Any] | None = None):
    """The ``JITFunction`` that ``ref`` (from :func:`kernel_ref`) names, in this process."""
    if "spec" in ref:
        return jit_function(resolve_spec(ref["spec"]), ref["spec"])
    key = id(ref["ship"])
    if cache is not None and key in cache:
        spaces = cache[key]
    else:
        spaces = _rebuild(ref["ship"])
        if cache is not None:
            cache[key] = spaces
    obj = spaces[ref["file"]][ref["name"]]
    if isinstance(obj, types.FunctionType):  # kernel = triton.jit(fn) outside the def
        import triton

        obj = triton.jit(obj)
    return jit_function(obj, ref["name"])
