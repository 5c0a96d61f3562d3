"""tilebook: Triton kernels and the helpers that the tilebook lessons share.

Importing tilebook picks the runtime first (a CUDA GPU, or Triton's interpreter
on the CPU; see :mod:`tilebook.runtime`), and only then imports Triton.

``import tilebook`` loads the library alone: the runtime and the ops.  The course's
tooling (aot, bench, check, claims, prose, tables, plots, widgets, ...) is imported
the first time it is named, as ``tilebook.aot`` or ``from tilebook import aot``, so
that a user of the ops does not pay for matplotlib or the compile tools.
"""

from . import runtime  # noqa: I001  (must run before anything imports triton)
from .runtime import (
    banner,
    capability,
    device,
    get_runtime,
    has_block_pointers,
    is_gpu,
    is_hopper,
    is_interpreter,
    pick,
)
from . import _compat

# Triton 3.6's interpreter under NumPy >= 2.4; 3.8 has the fix.  The probe runs a
# kernel, whose first launch imports Triton's Gluon (0.1 s): only where it may help.
if is_interpreter() and runtime.triton_version() < (3, 8):
    _compat.apply()
from . import ops
from .ops.dropout import dropout
from .ops.flash_attention import flash_attention
from .ops.layer_norm import layer_norm
from .ops.linear_act import linear_act
from .ops.matmul import matmul
from .ops.rms_norm import rms_norm
from .ops.softmax import softmax
from .ops.vector_add import vector_add

__version__ = "0.1.0"

#: The course's tooling: submodules imported when first named (see :func:`__getattr__`).
COURSE_MODULES = frozenset(
    {
        "aot",
        "bench",
        "check",
        "claims",
        "datasheet",
        "display",
        "exercises",
        "experiments",
        "passes",
        "plots",
        "prose",
        "tables",
        "widgets",
        "widgets_attention",
        "widgets_decision",
        "widgets_dot",
        "widgets_grid",
        "widgets_memory",
        "widgets_pipeline",
        "widgets_softmax",
        "widgets_stages",
    }
)


def __getattr__(name: str):
    # Called only for a name the module does not have yet: a course module is
    # imported on first use, after which it is an ordinary attribute.
    if name in COURSE_MODULES:
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | COURSE_MODULES)


__all__ = [
    "__version__",
    "banner",
    "capability",
    "device",
    "dropout",
    "flash_attention",
    "get_runtime",
    "has_block_pointers",
    "is_gpu",
    "is_hopper",
    "is_interpreter",
    "layer_norm",
    "linear_act",
    "matmul",
    "ops",
    "pick",
    "rms_norm",
    "runtime",
    "softmax",
    "vector_add",
]
