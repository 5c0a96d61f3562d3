"""tilebook: Triton kernels, and the course that teaches how they are written.

Importing tilebook picks the runtime first (a CUDA GPU, or Triton's interpreter
on the CPU; see :mod:`tilebook.runtime`), and only then imports Triton.

``import tilebook`` loads the library alone: the runtime, the input checks and the
ops.  The course's tooling (aot, bench, claims, prose, tables, plots, widgets, ...)
is the subpackage :mod:`tilebook.course`, which the lessons import by name
(``from tilebook.course.claims import Claims``) and the library never does, so that
a user of the ops does not pay for matplotlib or the compile tools.
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
from . import arch, ops  # noqa: F401  (the library modules, bound as attributes)
from .ops.dropout import dropout
from .ops.flash_attention import flash_attention
from .ops.layer_norm import layer_norm
from .ops.linear_act import linear_act
from .ops.matmul import matmul
from .ops.rms_norm import rms_norm
from .ops.softmax import softmax
from .ops.vector_add import vector_add

__version__ = "0.1.0"

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
