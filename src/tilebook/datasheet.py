"""Datasheet facts: the figures a lesson may state without measuring them.

A lesson never types a number into its prose.  A measured figure comes from the
data of the same build (:mod:`tilebook.prose`); a figure that the hardware's
maker publishes (an H100's HBM bandwidth, its SM count, the register limit of a
thread) comes from this table, which names its source.  In a lesson's text the
role ``:datasheet:`h100.hbm_bandwidth``` renders the value with its unit and
links to the row of the table on the site's glossary page; in code,
``fact("h100.hbm_bandwidth").value`` is the number.

Peak tensor-core rates are the *dense* figures (NVIDIA's datasheets print the
2:4-sparse figure, twice as large, with a footnote).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FACTS", "SOURCES", "Fact", "fact", "facts_for"]

#: Where the figures come from: key -> (title, URL).
SOURCES: dict[str, tuple[str, str]] = {
    "h100-datasheet": (
        "NVIDIA H100 Tensor Core GPU datasheet (SXM5)",
        "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet",
    ),
    "hopper-whitepaper": (
        "NVIDIA H100 Tensor Core GPU Architecture whitepaper",
        "https://resources.nvidia.com/en-us-tensor-core/gtc22-whitepaper-hopper",
    ),
    "a100-datasheet": (
        "NVIDIA A100 Tensor Core GPU datasheet (SXM4 80GB)",
        (
            "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
            "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"
        ),
    ),
    "t4-datasheet": (
        "NVIDIA T4 Tensor Core GPU datasheet",
        (
            "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/tesla-t4/"
            "t4-tensor-core-datasheet-951643.pdf"
        ),
    ),
    "cuda-guide": (
        "CUDA C++ Programming Guide: technical specifications per compute capability",
        (
            "https://docs.nvidia.com/cuda/cuda-c-programming-guide/index.html"
            "#features-and-technical-specifications"
        ),
    ),
    "ptx-isa": (
        "PTX ISA: asynchronous warpgroup-level matrix instructions (wgmma)",
        (
            "https://docs.nvidia.com/cuda/parallel-thread-execution/index.html"
            "#asynchronous-warpgroup-level-matrix-instructions"
        ),
    ),
}


@dataclass(frozen=True)
class Fact:
    """One published figure: its value in ``unit``, what it is, and its source."""

    key: str
    gpu: str
    what: str
    value: float
    unit: str
    source: str  # a key of SOURCES

    def text(self) -> str:
        """The value with its unit, as prose states it: ``"3.35 TB/s"``."""
        v = self.value
        number = f"{v:,.0f}" if float(v).is_integer() else f"{v:g}"
        return f"{number} {self.unit}".strip()

    @property
    def source_title(self) -> str:
        return SOURCES[self.source][0]

    @property
    def source_url(self) -> str:
        return SOURCES[self.source][1]

    @property
    def anchor(self) -> str:
        """The HTML id of this fact's row in the site's datasheet table."""
        return "datasheet-" + self.key.replace(".", "-").replace("_", "-")


def _facts(*rows: tuple) -> dict[str, Fact]:
    return {r[0]: Fact(*r) for r in rows}


H100, A100, T4, ALL = "H100 SXM5", "A100 SXM4 80GB", "T4", "every CUDA GPU"

#: Every fact, by key.  Keys are ``<gpu or family>.<name>``.
FACTS: dict[str, Fact] = _facts(
    # -- H100 SXM5 (compute capability 9.0), the GPU the published site runs on
    ("h100.hbm_bandwidth", H100, "HBM3 memory bandwidth", 3.35, "TB/s", "h100-datasheet"),
    ("h100.memory", H100, "HBM3 memory", 80, "GB", "h100-datasheet"),
    ("h100.sm_count", H100, "streaming multiprocessors", 132, "SMs", "hopper-whitepaper"),
    ("h100.l2", H100, "L2 cache", 50, "MB", "hopper-whitepaper"),
    ("h100.smem_per_sm", H100, "shared memory per SM (at most)", 228, "KB", "cuda-guide"),
    ("h100.smem_per_block", H100, "shared memory one program may use", 227, "KB", "cuda-guide"),
    ("h100.bf16_dense", H100, "bf16 tensor-core peak, dense", 989, "TFLOP/s", "h100-datasheet"),
    ("h100.fp16_dense", H100, "fp16 tensor-core peak, dense", 989, "TFLOP/s", "h100-datasheet"),
    ("h100.tf32_dense", H100, "TF32 tensor-core peak, dense", 495, "TFLOP/s", "h100-datasheet"),
    ("h100.fp8_dense", H100, "fp8 tensor-core peak, dense", 1979, "TFLOP/s", "h100-datasheet"),
    ("h100.fp32", H100, "fp32 peak without tensor cores", 67, "TFLOP/s", "h100-datasheet"),
    # -- A100 SXM4 80GB (8.0)
    ("a100.hbm_bandwidth", A100, "HBM2e memory bandwidth", 2039, "GB/s", "a100-datasheet"),
    ("a100.sm_count", A100, "streaming multiprocessors", 108, "SMs", "a100-datasheet"),
    ("a100.l2", A100, "L2 cache", 40, "MB", "a100-datasheet"),
    ("a100.smem_per_sm", A100, "shared memory per SM (at most)", 164, "KB", "cuda-guide"),
    ("a100.smem_per_block", A100, "shared memory one program may use", 163, "KB", "cuda-guide"),
    ("a100.bf16_dense", A100, "bf16 tensor-core peak, dense", 312, "TFLOP/s", "a100-datasheet"),
    ("a100.fp32", A100, "fp32 peak without tensor cores", 19.5, "TFLOP/s", "a100-datasheet"),
    # -- T4 (7.5), the GPU of a free Colab notebook
    ("t4.memory_bandwidth", T4, "GDDR6 memory bandwidth", 320, "GB/s", "t4-datasheet"),
    ("t4.sm_count", T4, "streaming multiprocessors", 40, "SMs", "t4-datasheet"),
    ("t4.memory", T4, "GDDR6 memory", 16, "GB", "t4-datasheet"),
    ("t4.smem_per_block", T4, "shared memory one program may use", 64, "KB", "cuda-guide"),
    ("t4.fp16_dense", T4, "fp16 tensor-core peak, dense", 65, "TFLOP/s", "t4-datasheet"),
    ("t4.fp32", T4, "fp32 peak without tensor cores", 8.1, "TFLOP/s", "t4-datasheet"),
    # -- the programming model (compute capabilities 7.5 to 9.0)
    ("cuda.warp_size", ALL, "threads in a warp", 32, "threads", "cuda-guide"),
    ("cuda.max_registers", ALL, "registers one thread may use", 255, "registers", "cuda-guide"),
    ("cuda.registers_per_sm", ALL, "32-bit registers per SM", 65536, "registers", "cuda-guide"),
    ("hopper.warpgroup", H100, "warps in a warpgroup (wgmma)", 4, "warps", "ptx-isa"),
)


def fact(key: str) -> Fact:
    """The :class:`Fact` called ``key``; a :class:`KeyError` lists the known keys."""
    if not isinstance(key, str):
        raise TypeError(f"fact() takes a key string, got {type(key).__name__}")
    try:
        return FACTS[key]
    except KeyError:
        raise KeyError(f"no datasheet fact {key!r}; known: {', '.join(sorted(FACTS))}") from None


def facts_for(gpu: str) -> list[Fact]:
    """Every fact about one GPU (as named in the ``gpu`` column), in table order."""
    return [f for f in FACTS.values() if f.gpu == gpu]
