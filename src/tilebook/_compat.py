"""Keeps Triton 3.6's interpreter working with NumPy 2.4 (CPU mode only).

Triton 3.6's interpreter turns a scalar kernel value into a Python ``int`` (a loop
bound such as ``range(tl.cdiv(K, BLOCK_K))``) with ``int(array)`` on a one-element
1-D array.  NumPy deprecated that in 1.25 and refuses it from 2.4 ("only
0-dimensional arrays can be converted to Python scalars"), so under Triton 3.6 and
NumPy >= 2.4 every such kernel fails in CPU mode.  Triton 3.8 squeezes the array
first.  :func:`apply` asks the interpreter (a probe kernel) whether it has the
problem and, only then, makes it squeeze as Triton 3.8 does.  The GPU never takes
this path.
"""

from __future__ import annotations

import warnings

__all__ = ["apply"]


def _probe() -> bool:
    """True when the interpreter turns a loop bound into an int without complaint."""
    import triton
    import triton.language as tl

    @triton.jit
    def index_probe(n):
        for _ in range(tl.cdiv(n, 2)):
            pass

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", DeprecationWarning)
            index_probe[(1,)](3)
    except Exception:  # noqa: BLE001  (InterpreterError wrapping TypeError or the warning)
        return False
    return True


def apply() -> bool:
    """Make ``__index__`` of interpreted scalars NumPy-2.4-safe where it is not.

    Returns True when a fix was needed and works; False when none was needed or
    this Triton's interpreter is laid out differently (then nothing is changed).
    """
    if _probe():
        return False
    try:
        from triton.runtime import interpreter
    except ImportError:  # pragma: no cover - depends on the installed Triton
        return False
    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None:
        return False

    def patch_lang_tensor(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    interpreter._patch_lang_tensor = patch_lang_tensor
    if _probe():
        return True
    interpreter._patch_lang_tensor = original  # not the problem we know: leave it alone
    return False
