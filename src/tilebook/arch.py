"""The GPUs a kernel can be compiled for, named by compute capability (used by the ops
for their shared-memory budget, and by :mod:`tilebook.course.aot` for its targets)."""

from __future__ import annotations

import re

__all__ = ["TARGETS", "parse_arch"]

#: Compute capability -> (GPUs a reader may have, most shared memory one program
#: may use in bytes).  The byte counts are the opt-in maximum per thread block of
#: the CUDA C++ Programming Guide, "Technical Specifications per Compute
#: Capability"; a launch of a kernel that needs more fails with Triton's
#: OutOfResources, so an ahead-of-time compile refuses it up front.
TARGETS: dict[int, tuple[str, int]] = {
    75: ("Turing: T4, RTX 20xx", 64 * 1024),
    80: ("Ampere: A100", 163 * 1024),
    86: ("Ampere: A10, RTX 30xx", 99 * 1024),
    87: ("Ampere: Jetson Orin", 163 * 1024),
    89: ("Ada: L4, RTX 40xx", 99 * 1024),
    90: ("Hopper: H100, H200", 227 * 1024),
    100: ("Blackwell: B200", 227 * 1024),
    120: ("Blackwell: RTX 50xx", 99 * 1024),
}

_ARCH = re.compile(r"(?:sm_?)?(\d{2,3})a?", re.IGNORECASE)


def parse_arch(arch: int | str) -> int:
    """The compute capability named by ``arch``: ``90``, ``"sm_90"``, ``"sm_90a"`` or ``"90"``.

    Raises
    ------
    TypeError
        ``arch`` is neither an int nor a string.
    ValueError
        ``arch`` names no GPU in :data:`TARGETS`.
    """
    if isinstance(arch, bool) or not isinstance(arch, (int, str)):
        raise TypeError(f"arch must be an int like 90 or a name like 'sm_90', got {arch!r}")
    if isinstance(arch, str):
        m = _ARCH.fullmatch(arch.strip())
        if m is None:
            raise ValueError(f"arch {arch!r} is not a target name like 'sm_80' or 'sm_90a'")
        arch = int(m.group(1))
    if arch not in TARGETS:
        known = ", ".join(f"{cc} ({TARGETS[cc][0]})" for cc in TARGETS)
        raise ValueError(f"unknown compute capability {arch}; known targets: {known}")
    return arch
