"""tilebook: Triton kernels and the helpers that the tilebook lessons share.

Importing tilebook picks the runtime first (a CUDA GPU, or Triton's interpreter
on the CPU; see :mod:`tilebook.runtime`), and only then imports Triton.
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

if is_interpreter():
    _compat.apply()  # Triton 3.6's interpreter under NumPy >= 2.4
from . import aot, bench, check, exercises, ops
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
    "aot",
    "banner",
    "bench",
    "capability",
    "check",
    "device",
    "dropout",
    "exercises",
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
