"""Which machine the lessons run on: a CUDA GPU, or a CPU through Triton's interpreter.

The choice has to be made before :mod:`triton` is imported, because Triton reads
``TRITON_INTERPRET`` when it decorates a kernel with ``@triton.jit``.  Importing
:mod:`tilebook` (or this module) makes the choice once per process:

* ``TILEBOOK_MODE=gpu`` forces the GPU (and fails loudly when CUDA is unusable);
* ``TILEBOOK_MODE=cpu`` forces the interpreter, even on a machine with a GPU;
* ``TILEBOOK_MODE=auto`` (the default) takes the GPU when ``torch.cuda`` works;
* ``TILEBOOK_MODE=aot`` runs no kernel at all: kernels stay real ``JITFunction``
  objects so that :mod:`tilebook.inspect` can compile them ahead of time for a GPU
  this machine does not have (used in a child process of a CPU build).

A process that already set ``TRITON_INTERPRET=1`` is taken at its word: CPU mode.

``TILEBOOK_ARCH=80`` (or ``75``) makes a newer GPU take the code paths of that
older one: :func:`capability` reports it, so the Hopper-only paths (TMA,
wgmma-sized configurations) are not taken and lessons show those sections from
ahead-of-time compiled output instead, as a reader with an A100 or a T4 sees them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TypeVar

import torch

__all__ = [
    "ARCH_ENV",
    "MODE_ENV",
    "Runtime",
    "banner",
    "capability",
    "device",
    "get_runtime",
    "has_block_pointers",
    "is_gpu",
    "is_hopper",
    "is_interpreter",
    "pick",
    "triton_version",
]

MODE_ENV = "TILEBOOK_MODE"
ARCH_ENV = "TILEBOOK_ARCH"
_VALID = ("auto", "gpu", "cpu", "aot")

T = TypeVar("T")


@dataclass(frozen=True)
class Runtime:
    """The mode this process runs in and why."""

    mode: str  # "gpu", "cpu" or "aot"
    reason: str

    @property
    def device(self) -> torch.device:
        return torch.device("cuda" if self.mode == "gpu" else "cpu")


def _env_truthy(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _cuda_usable() -> tuple[bool, str]:
    try:
        if not torch.cuda.is_available():
            return False, "torch.cuda.is_available() is False"
        name = torch.cuda.get_device_name(0)
    except Exception as exc:  # noqa: BLE001  (a broken driver must not crash a CPU build)
        return False, f"CUDA failed to initialise ({exc})"
    return True, name


def _decide() -> Runtime:
    requested = os.environ.get(MODE_ENV, "auto").strip().lower() or "auto"
    if requested not in _VALID:
        raise ValueError(
            f"{MODE_ENV}={os.environ[MODE_ENV]!r} is not understood; use one of {', '.join(_VALID)}"
        )
    interpret_preset = _env_truthy("TRITON_INTERPRET")

    if requested == "cpu":
        return Runtime("cpu", f"forced by {MODE_ENV}=cpu")
    if requested == "aot":
        if interpret_preset:
            raise RuntimeError(f"{MODE_ENV}=aot needs TRITON_INTERPRET unset")
        return Runtime("aot", f"forced by {MODE_ENV}=aot (compile only)")
    if requested == "gpu":
        if interpret_preset:
            raise RuntimeError(
                f"{MODE_ENV}=gpu conflicts with TRITON_INTERPRET=1 in the environment; unset one"
            )
        ok, what = _cuda_usable()
        if not ok:
            raise RuntimeError(f"{MODE_ENV}=gpu, but no usable CUDA GPU: {what}")
        return Runtime("gpu", f"forced by {MODE_ENV}=gpu ({what})")
    if interpret_preset:
        return Runtime("cpu", "TRITON_INTERPRET=1 was already set")
    ok, what = _cuda_usable()
    if ok:
        return Runtime("gpu", f"CUDA GPU found ({what})")
    return Runtime("cpu", f"no usable CUDA GPU ({what})")


def _select() -> Runtime:
    rt = _decide()
    if rt.mode == "cpu":
        # Triton reads this when @triton.jit decorates a kernel, so it must be set
        # before tilebook's kernel modules are imported.
        os.environ["TRITON_INTERPRET"] = "1"
    return rt


_RUNTIME = _select()


def get_runtime() -> Runtime:
    """The :class:`Runtime` chosen when tilebook was imported."""
    return _RUNTIME


def is_gpu() -> bool:
    """True when kernels run on a CUDA GPU."""
    return _RUNTIME.mode == "gpu"


def is_interpreter() -> bool:
    """True when kernels run on the CPU through Triton's interpreter."""
    return _RUNTIME.mode == "cpu"


def device() -> torch.device:
    """The torch device that tilebook's kernels take their tensors on."""
    return _RUNTIME.device


def _forced_arch() -> int | None:
    raw = os.environ.get(ARCH_ENV, "").strip().lower().removeprefix("sm_")
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < 70:
        raise ValueError(f"{ARCH_ENV}={os.environ[ARCH_ENV]!r}: give a compute capability like 80")
    return int(raw)


def capability(device: torch.device | int | None = None) -> tuple[int, int] | None:
    """The compute capability the code paths are chosen for: ``(9, 0)`` on an H100.

    ``TILEBOOK_ARCH`` lowers it (never raises it above the real one), so that an
    H100 can run the paths an A100 (``80``) or a T4 (``75``) takes.  None in CPU
    mode, where the interpreter has no architecture.
    """
    if not is_gpu():
        return None
    real = torch.cuda.get_device_capability(device)
    forced = _forced_arch()
    if forced is not None and forced < real[0] * 10 + real[1]:
        return divmod(forced, 10)
    return real


def is_hopper(device: torch.device | int | None = None) -> bool:
    """True on a Hopper GPU (sm_90) whose Hopper-only paths are not switched off."""
    cap = capability(device)
    return cap is not None and cap[0] == 9


def has_block_pointers() -> bool:
    """True when the installed Triton still has block pointers (``tl.make_block_ptr``,
    ``tl.advance``): Triton 3.8 and older.

    Triton 3.8 deprecates them (it warns ``tl.make_block_ptr is deprecated``); Triton
    3.9 removed them, and both functions raise ``NotImplementedError("Block pointers
    have been removed in favor of the tensor descriptor API")``.  Tensor descriptors
    are what replaces them.
    """
    return triton_version() < (3, 9)


def triton_version() -> tuple[int, int]:
    """The installed Triton's ``(major, minor)``: ``(3, 8)`` for 3.8.0."""
    import re

    import triton  # imported here: the mode is already fixed

    major, minor = (int(p) for p in re.findall(r"\d+", triton.__version__)[:2])
    return major, minor


def pick(*, gpu: T, cpu: T) -> T:
    """Return the value for the current mode.

    Lessons state both problem sizes once, side by side::

        N = tilebook.pick(gpu=2**26, cpu=2**12)
    """
    return gpu if is_gpu() else cpu


def banner() -> str:
    """Which mode runs and on what, for build logs and lessons.

    The first line starts with ``tilebook: GPU mode`` or ``tilebook: CPU mode``;
    no line is longer than 88 characters (lessons are read at 1280 px).
    """
    import textwrap

    import triton  # imported here: the mode is already fixed

    versions = f"torch {torch.__version__}, triton {triton.__version__}"
    if is_gpu():
        forced = _forced_arch()
        paths = f"; code paths of sm_{forced} ({ARCH_ENV})" if forced else ""
        text = f"tilebook: GPU mode on {torch.cuda.get_device_name(0)} ({versions}{paths})"
    else:
        text = (
            "tilebook: CPU mode, kernels run through Triton's interpreter at small sizes; "
            f"benchmarks show recorded GPU measurements ({versions}; {_RUNTIME.reason})"
        )
    return textwrap.fill(text, 88, subsequent_indent="  ", break_on_hyphens=False)
