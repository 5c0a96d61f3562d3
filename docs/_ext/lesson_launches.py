"""The first launch of each kernel a lesson defines, noted while the lesson runs.

``tests/test_lesson_targets.py`` compiles every lesson kernel for older GPUs as the
lesson launches it.  A CPU build of the site already runs every lesson under Triton's
interpreter, so the test reads what that run launched rather than running all 14
lessons again (about six minutes of CI's two cores): when ``TILEBOOK_LAUNCH_LOG``
names a folder (``tests/site_build.py`` sets it), :func:`lesson_launches`, which
sphinx-gallery calls before and after each lesson (``reset_modules`` in ``conf.py``),
writes ``<folder>/NN_name.pickle`` with the compile jobs of the first launch of each
kernel and the lesson's ``@triton.jit`` functions that no launch reached.  Without the
variable it does nothing.  ``tests/lesson_targets.py`` runs one lesson the same way
outside a build.
"""

from __future__ import annotations

import ast
import inspect
import os
import pickle
import re
from pathlib import Path

ENV = "TILEBOOK_LAUNCH_LOG"


def _job(kernel, args: tuple, kwargs: dict) -> dict:
    """The compile job of one launch, specialised as Triton would
    (:func:`tilebook.ops.targets.launch_job`): the runtime arguments in order, then
    the constexprs (and any argument passed as None) with the launch options."""
    from tilebook.ops.targets import launch_job

    params = inspect.signature(kernel.fn).parameters
    values = dict(zip(params, args, strict=False)) | kwargs
    runtime, meta = [], {k: v for k, v in kwargs.items() if k not in params}
    for name, param in params.items():
        value = values.get(name, param.default)
        if value is inspect.Parameter.empty:
            raise TypeError(f"no value for {name}")
        if "constexpr" in str(param.annotation) or value is None:
            meta[name] = value
        elif meta.keys() & params.keys():
            raise TypeError(f"{name}: a runtime argument after a constexpr")
        else:
            runtime.append(value)
    job = launch_job(kernel, tuple(runtime), meta, 0)
    del job["arch"]
    return job


def jit_functions(path: Path) -> dict[str, str]:
    """The module-level functions the lesson decorates with ``triton.jit``: their source."""
    found = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef):
            for dec in node.decorator_list:
                target = dec.func if isinstance(dec, ast.Call) else dec
                if ast.unparse(target).endswith("jit"):
                    found[node.name] = ast.unparse(node)
    return found


def unreached(jit: dict[str, str], launched: set[str]) -> list[str]:
    """Functions neither launched nor called (by name) from one that is: a device
    function is compiled inside the kernels that call it."""
    reached = set(launched)
    grew = True
    while grew:
        grew = False
        for name in set(jit) - reached:
            if any(re.search(rf"\b{name}\b", jit[r]) for r in reached if r in jit):
                reached.add(name)
                grew = True
    return sorted(set(jit) - reached)


class Recorder:
    """Notes, while active, the first launch under the interpreter of each kernel
    defined in the file named ``filename``: ``first[name] = job`` (a dict whose
    ``"kernel"`` is what a compiling process needs, or a string saying why no job)."""

    def __init__(self, filename: str):
        self.filename, self.first = filename, {}
        self._original = None

    def start(self) -> None:
        from triton.runtime.interpreter import InterpretedFunction

        from tilebook.course.aot.shipping import kernel_ref

        original = self._original = InterpretedFunction.run
        first, filename = self.first, self.filename

        def run(fn_self, *args, grid, warmup, **kwargs):
            fn = fn_self.fn
            name = fn.__name__
            if Path(fn.__code__.co_filename).name == filename and name not in first:
                try:
                    first[name] = {**_job(fn_self, args, kwargs), "kernel": kernel_ref(fn_self)}
                except (TypeError, KeyError, ValueError) as exc:
                    first[name] = f"not compiled: {exc}"
            return original(fn_self, *args, grid=grid, warmup=warmup, **kwargs)

        InterpretedFunction.run = run

    def stop(self) -> None:
        from triton.runtime.interpreter import InterpretedFunction

        if self._original is not None:
            InterpretedFunction.run = self._original
            self._original = None

    def result(self, path: Path) -> dict:
        """``{"jobs": first launches, "unlaunched": [names]}`` for the lesson at ``path``."""
        return {
            "jobs": dict(self.first),
            "unlaunched": unreached(jit_functions(path), set(self.first)),
        }


_active: dict[str, Recorder] = {}


def lesson_launches(gallery_conf: dict, fname: str, when: str) -> None:
    """sphinx-gallery's ``reset_modules`` hook (see the module docstring)."""
    folder = os.environ.get(ENV)
    if not folder or fname is None:
        return
    if when == "before":
        import tilebook

        if tilebook.is_interpreter():
            _active[fname] = rec = Recorder(Path(fname).name)
            rec.start()
        return
    rec = _active.pop(fname, None)
    if rec is None:
        return
    rec.stop()
    dirs = gallery_conf["examples_dirs"]
    dirs = [dirs] if isinstance(dirs, str) else dirs
    found = [p for d in dirs for p in Path(gallery_conf["src_dir"], d).rglob(Path(fname).name)]
    if len(found) != 1:
        return
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f"{found[0].stem}.tmp"
    tmp.write_bytes(pickle.dumps(rec.result(found[0])))
    tmp.replace(out / f"{found[0].stem}.pickle")
