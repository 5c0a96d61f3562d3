"""Flash attention's tiles: the tile shapes and launch options of its three kernels,
tuned ahead (``benchmarks/flash_attention.py --tune``) and committed in :data:`CONFIGS`:
no autotuning happens at import or during a call."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import runtime

__all__ = ["CONFIGS", "HEAD_DIMS", "INTERPRETER", "KernelConfig", "configs_for", "pick_configs"]

#: Head dimensions the kernels are built for (a tile's row must be a power of two).
HEAD_DIMS = (32, 64, 128, 256)
_GPU_DTYPES = (torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class KernelConfig:
    """Tile shape and launch options of one kernel.

    ``block_m`` counts query rows and ``block_n`` key rows, whichever kernel it is.
    """

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


def _kc(bm: int, bn: int, warps: int, stages: int) -> KernelConfig:
    return KernelConfig(bm, bn, warps, stages)


#: Tuned ahead (``benchmarks/flash_attention.py --tune``; the sweeps, and the GPU they
#: ran on, are in ``benchmarks/notes/flash_attention.md``), one entry per
#: (compute capability, head dim, dtype, causal): the forward, the dK/dV kernel and the
#: dQ kernel.  Windows and document masks take the causal entry (masked tiles at both
#: ends of every row).  The D=32 and D=256 entries are compiled and checked, not tuned.
CONFIGS: dict[tuple[int, int, str, bool], dict[str, KernelConfig]] = {}


def _fill_defaults() -> None:
    # Swept on an H100 (torch 2.11, triton 3.6), bf16, B=4, N=4096: H=16 at D=128 and
    # H=32 at D=64; see benchmarks/notes/flash_attention.md.  fp16 takes the same tiles.
    # The D=128 forward's 64 x 64 tiles take 115,712 bytes of shared memory and 143
    # registers a thread: two programs fit on an SM, and one's softmax overlaps the
    # other's products (491 TFLOP/s, against 491 for 128 x 128 tiles in 8 warps without
    # a mask and 453 against 421 causal).
    tuned = {
        (64, False): (_kc(128, 128, 4, 3), _kc(32, 128, 4, 3), _kc(128, 64, 8, 3)),
        (64, True): (_kc(128, 128, 4, 3), _kc(64, 64, 4, 3), _kc(128, 64, 8, 3)),
        (128, False): (_kc(64, 64, 4, 3), _kc(64, 64, 4, 2), _kc(128, 64, 8, 3)),
        (128, True): (_kc(64, 64, 4, 3), _kc(64, 64, 4, 2), _kc(128, 64, 8, 3)),
    }
    # D=32 takes D=64's tiles; D=256 the ones that keep registers spill-free or nearly
    # (dK/dV spills 176 bytes outside its inner loop).  Compiled and checked, not swept.
    for causal in (False, True):
        tuned[(32, causal)] = tuned[(64, causal)]
        tuned[(256, causal)] = (_kc(64, 64, 4, 2), _kc(64, 64, 8, 1), _kc(64, 32, 4, 2))
    for (head_dim, causal), (fwd, dkdv, dq) in tuned.items():
        for dtype in ("bf16", "fp16"):
            CONFIGS[(90, head_dim, dtype, causal)] = {"fwd": fwd, "dkdv": dkdv, "dq": dq}


_fill_defaults()

# Other GPUs (not tuned): tiles that fit in 100 KB of shared memory.
_FALLBACK = {
    "fwd": _kc(64, 64, 4, 2),
    "dkdv": _kc(32, 64, 4, 2),
    "dq": _kc(64, 32, 4, 2),
}
_FALLBACK_256 = {"fwd": _kc(32, 32, 4, 1), "dkdv": _kc(16, 32, 4, 1), "dq": _kc(32, 16, 4, 1)}
# The interpreter: tiles of 16 keep the emulated programs cheap and make even the
# small test shapes cross several tiles (and BLOCK_M != BLOCK_N in the forward).
#: Tests swap them.
INTERPRETER = {"fwd": _kc(32, 16, 4, 1), "dkdv": _kc(16, 32, 4, 1), "dq": _kc(32, 16, 4, 1)}
_DTYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}


def pick_configs(
    head_dim: int, dtype: torch.dtype, causal: bool, device: torch.device
) -> dict[str, KernelConfig]:
    """The committed configurations for a call: ``{"fwd", "dkdv", "dq"}`` to KernelConfig."""
    if device.type != "cuda":
        return INTERPRETER
    if dtype not in _GPU_DTYPES or head_dim not in HEAD_DIMS:
        # torch.ops.tilebook.* reaches here without the public function's checks.
        raise ValueError(
            f"flash_attention on a GPU takes float16 or bfloat16 with a head dimension "
            f"in {HEAD_DIMS}; got {dtype} and {head_dim}"
        )
    major, minor = runtime.capability(device)
    return configs_for(major * 10 + minor, head_dim, _DTYPE_NAMES[dtype], causal)


def configs_for(arch: int, head_dim: int, dtype: str, causal: bool) -> dict[str, KernelConfig]:
    """The configurations on ``sm_<arch>`` (a GPU's, or a compile target's): ``{"fwd",
    "dkdv", "dq"}`` to KernelConfig; ``dtype`` is Triton's name ("bf16", "fp16")."""
    key = (arch, head_dim, dtype, bool(causal))
    if key in CONFIGS:
        return CONFIGS[key]
    if arch // 10 == 9:  # H100 and H200 share the sm_90 tables
        return CONFIGS[(90, *key[1:])]
    return _FALLBACK_256 if head_dim == 256 else _FALLBACK
