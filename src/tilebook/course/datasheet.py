"""Datasheet facts: the figures a lesson may state without measuring them.

A lesson never types a number into its prose.  A measured figure comes from the
data of the same build (:mod:`tilebook.course.prose`); a figure that the hardware's
maker publishes (a GPU's memory bandwidth, its SM count, the register limit of a
thread) comes from this table, which names its source.

Facts are kept per GPU.  Keys are ``<gpu>.<name>`` (``h200.memory_bandwidth``) for a
named GPU's figure, and ``gpu.<name>`` for **the GPU that builds the page**: on a
GPU, the device this process runs on (:func:`build_gpu`); on a CPU, the GPU whose
committed records the page shows (:func:`tilebook.course.bench.shown_records_gpu`).  A
page built on an H200 thus states the H200's bandwidth beside the H200's measured
copy, and one built on an A100 the A100's.  In a lesson's text the role
``:datasheet:`gpu.memory_bandwidth``` renders the value with its unit and links to
the row of the table on the site's glossary page; in code,
``fact("gpu.memory_bandwidth").value`` is the number and :func:`build_gpu` names the
GPU.  A build GPU that has no row here (:func:`build_gpu` returns None) makes
``fact("gpu.…")`` raise :class:`LookupError`; :func:`lookup` returns None instead,
for a lesson that states the figure only where it is known.

Peak tensor-core rates are the *dense* figures (NVIDIA's datasheets print the
2:4-sparse figure, twice as large, with a footnote).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = [
    "FACTS",
    "GPUS",
    "SOURCES",
    "Fact",
    "Gpu",
    "build_fact",
    "build_gpu",
    "build_gpu_name",
    "fact",
    "facts_for",
    "gpu_for_name",
    "gpu_kind",
    "lookup",
]

#: Where the figures come from: key -> (title, URL).
SOURCES: dict[str, tuple[str, str]] = {
    "h100-datasheet": (
        "NVIDIA H100 Tensor Core GPU datasheet (SXM5)",
        "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet",
    ),
    "h200-datasheet": (
        "NVIDIA H200 Tensor Core GPU datasheet (SXM)",
        "https://www.nvidia.com/en-us/data-center/h200/",
    ),
    "hopper-whitepaper": (
        "NVIDIA H100 Tensor Core GPU Architecture whitepaper (the GH100 chip)",
        "https://resources.nvidia.com/en-us-tensor-core/gtc22-whitepaper-hopper",
    ),
    "a100-datasheet": (
        "NVIDIA A100 Tensor Core GPU datasheet (SXM4 80GB)",
        (
            "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
            "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"
        ),
    ),
    "l4-datasheet": (
        "NVIDIA L4 Tensor Core GPU datasheet",
        "https://www.nvidia.com/en-us/data-center/l4/",
    ),
    "ada-whitepaper": (
        "NVIDIA Ada GPU Architecture whitepaper (GeForce RTX 4090, appendix A)",
        ("https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf"),
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
class Gpu:
    """A GPU the datasheet has rows for: its key, the name prose uses, the pattern
    that recognises it in the device name CUDA reports, and its compute capability."""

    key: str
    name: str
    pattern: str
    capability: str

    def matches(self, device_name: str) -> bool:
        return re.search(self.pattern, device_name) is not None


#: The GPUs of the table.  Patterns tell the variants apart that the datasheets do
#: (an H100 PCIe has another bandwidth and SM count than the SXM5 part).
GPUS: dict[str, Gpu] = {
    g.key: g
    for g in (
        Gpu("h100", "H100 SXM5", r"H100(?!.*(PCIe|NVL))", "9.0"),
        Gpu("h200", "H200 SXM", r"H200(?!.*NVL)", "9.0"),
        Gpu("a100", "A100 SXM4 80GB", r"A100-SXM4-80GB", "8.0"),
        Gpu("l4", "L4", r"(?<![A-Za-z0-9])L4(?![0-9])", "8.9"),
        Gpu("rtx4090", "GeForce RTX 4090", r"RTX 4090(?! ?[A-Za-z])", "8.9"),
        Gpu("t4", "T4", r"(?<![A-Za-z0-9])T4(?![0-9])", "7.5"),
    )
}


_SCALE = {"TB/s": 1e12, "GB/s": 1e9, "TFLOP/s": 1e12, "GB": 1e9, "MB": float(1 << 20), "KB": 1024.0}


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
    def si(self) -> float:
        """The value in base units (bytes/s, FLOP/s, bytes), so that rates given in
        different units divide correctly: ``fact("gpu.bf16_dense").si /
        fact("gpu.memory_bandwidth").si`` is FLOP per byte on every GPU."""
        return self.value * _SCALE.get(self.unit, 1.0)

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


def _per_capability(key: str, capability: str) -> tuple[tuple, ...]:
    """Shared memory by compute capability (the CUDA guide's table), for one GPU
    (``key`` a key of GPUS) or for a compile target (``key`` like ``"sm90"``)."""
    per_sm, per_block = {"9.0": (228, 227), "8.9": (100, 99), "8.0": (164, 163), "7.5": (64, 64)}[
        capability
    ]
    name = GPUS[key].name if key in GPUS else f"compute capability {capability}"
    return (
        (f"{key}.smem_per_sm", name, "shared memory per SM (at most)", per_sm, "KB", "cuda-guide"),
        (
            f"{key}.smem_per_block",
            name,
            "shared memory one program may use",
            per_block,
            "KB",
            "cuda-guide",
        ),
    )


H100, H200, A100 = GPUS["h100"].name, GPUS["h200"].name, GPUS["a100"].name
L4, RTX4090, T4 = GPUS["l4"].name, GPUS["rtx4090"].name, GPUS["t4"].name
ALL = "every CUDA GPU"
TF = "TFLOP/s"

#: Every fact, by key.  Keys are ``<gpu or family>.<name>``.
FACTS: dict[str, Fact] = _facts(
    # -- H100 SXM5 (compute capability 9.0)
    ("h100.memory_bandwidth", H100, "HBM3 memory bandwidth", 3.35, "TB/s", "h100-datasheet"),
    ("h100.memory", H100, "HBM3 memory", 80, "GB", "h100-datasheet"),
    ("h100.sm_count", H100, "streaming multiprocessors", 132, "SMs", "hopper-whitepaper"),
    ("h100.l2", H100, "L2 cache", 50, "MB", "hopper-whitepaper"),
    *_per_capability("h100", "9.0"),
    ("h100.bf16_dense", H100, "bf16 tensor-core peak, dense", 989, TF, "h100-datasheet"),
    ("h100.fp16_dense", H100, "fp16 tensor-core peak, dense", 989, TF, "h100-datasheet"),
    ("h100.tf32_dense", H100, "TF32 tensor-core peak, dense", 495, TF, "h100-datasheet"),
    ("h100.fp8_dense", H100, "fp8 tensor-core peak, dense", 1979, TF, "h100-datasheet"),
    ("h100.fp32", H100, "fp32 peak without tensor cores", 67, TF, "h100-datasheet"),
    # -- H200 SXM (9.0): the H100's GH100 chip and rates, with more and faster memory
    ("h200.memory_bandwidth", H200, "HBM3e memory bandwidth", 4.8, "TB/s", "h200-datasheet"),
    ("h200.memory", H200, "HBM3e memory", 141, "GB", "h200-datasheet"),
    (
        "h200.sm_count",
        H200,
        "streaming multiprocessors (GH100, SXM)",
        132,
        "SMs",
        "hopper-whitepaper",
    ),
    ("h200.l2", H200, "L2 cache (GH100)", 50, "MB", "hopper-whitepaper"),
    *_per_capability("h200", "9.0"),
    ("h200.bf16_dense", H200, "bf16 tensor-core peak, dense", 989, TF, "h200-datasheet"),
    ("h200.fp16_dense", H200, "fp16 tensor-core peak, dense", 989, TF, "h200-datasheet"),
    ("h200.tf32_dense", H200, "TF32 tensor-core peak, dense", 495, TF, "h200-datasheet"),
    ("h200.fp8_dense", H200, "fp8 tensor-core peak, dense", 1979, TF, "h200-datasheet"),
    ("h200.fp32", H200, "fp32 peak without tensor cores", 67, TF, "h200-datasheet"),
    # -- A100 SXM4 80GB (8.0)
    ("a100.memory_bandwidth", A100, "HBM2e memory bandwidth", 2039, "GB/s", "a100-datasheet"),
    ("a100.memory", A100, "HBM2e memory", 80, "GB", "a100-datasheet"),
    ("a100.sm_count", A100, "streaming multiprocessors", 108, "SMs", "a100-datasheet"),
    ("a100.l2", A100, "L2 cache", 40, "MB", "a100-datasheet"),
    *_per_capability("a100", "8.0"),
    ("a100.bf16_dense", A100, "bf16 tensor-core peak, dense", 312, TF, "a100-datasheet"),
    ("a100.fp16_dense", A100, "fp16 tensor-core peak, dense", 312, TF, "a100-datasheet"),
    ("a100.tf32_dense", A100, "TF32 tensor-core peak, dense", 156, TF, "a100-datasheet"),
    ("a100.fp32", A100, "fp32 peak without tensor cores", 19.5, TF, "a100-datasheet"),
    # -- L4 (8.9)
    ("l4.memory_bandwidth", L4, "GDDR6 memory bandwidth", 300, "GB/s", "l4-datasheet"),
    ("l4.memory", L4, "GDDR6 memory", 24, "GB", "l4-datasheet"),
    *_per_capability("l4", "8.9"),
    ("l4.bf16_dense", L4, "bf16 tensor-core peak, dense", 121, TF, "l4-datasheet"),
    ("l4.fp16_dense", L4, "fp16 tensor-core peak, dense", 121, TF, "l4-datasheet"),
    ("l4.tf32_dense", L4, "TF32 tensor-core peak, dense", 60, TF, "l4-datasheet"),
    ("l4.fp8_dense", L4, "fp8 tensor-core peak, dense", 242.5, TF, "l4-datasheet"),
    ("l4.fp32", L4, "fp32 peak without tensor cores", 30.3, TF, "l4-datasheet"),
    # -- GeForce RTX 4090 (8.9); tensor rates with fp32 accumulation, as kernels here use
    (
        "rtx4090.memory_bandwidth",
        RTX4090,
        "GDDR6X memory bandwidth",
        1008,
        "GB/s",
        "ada-whitepaper",
    ),
    ("rtx4090.memory", RTX4090, "GDDR6X memory", 24, "GB", "ada-whitepaper"),
    ("rtx4090.sm_count", RTX4090, "streaming multiprocessors", 128, "SMs", "ada-whitepaper"),
    ("rtx4090.l2", RTX4090, "L2 cache", 72, "MB", "ada-whitepaper"),
    *_per_capability("rtx4090", "8.9"),
    (
        "rtx4090.bf16_dense",
        RTX4090,
        "bf16 tensor-core peak, dense, fp32 accumulate",
        165.2,
        TF,
        "ada-whitepaper",
    ),
    (
        "rtx4090.fp16_dense",
        RTX4090,
        "fp16 tensor-core peak, dense, fp32 accumulate",
        165.2,
        TF,
        "ada-whitepaper",
    ),
    ("rtx4090.tf32_dense", RTX4090, "TF32 tensor-core peak, dense", 82.6, TF, "ada-whitepaper"),
    ("rtx4090.fp32", RTX4090, "fp32 peak without tensor cores", 82.6, TF, "ada-whitepaper"),
    # -- T4 (7.5), the GPU of a free Colab notebook (no bf16 tensor cores)
    ("t4.memory_bandwidth", T4, "GDDR6 memory bandwidth", 320, "GB/s", "t4-datasheet"),
    ("t4.sm_count", T4, "streaming multiprocessors", 40, "SMs", "t4-datasheet"),
    ("t4.memory", T4, "GDDR6 memory", 16, "GB", "t4-datasheet"),
    *_per_capability("t4", "7.5"),
    ("t4.fp16_dense", T4, "fp16 tensor-core peak, dense", 65, TF, "t4-datasheet"),
    ("t4.fp32", T4, "fp32 peak without tensor cores", 8.1, TF, "t4-datasheet"),
    # -- the programming model (compute capabilities 7.5 to 9.0)
    # -- by compute capability, for code compiled for a target rather than a GPU
    *(
        row
        for cc in ("9.0", "8.9", "8.0", "7.5")
        for row in _per_capability("sm" + cc.replace(".", ""), cc)
    ),
    ("cuda.warp_size", ALL, "threads in a warp", 32, "threads", "cuda-guide"),
    ("cuda.max_registers", ALL, "registers one thread may use", 255, "registers", "cuda-guide"),
    ("cuda.registers_per_sm", ALL, "32-bit registers per SM", 65536, "registers", "cuda-guide"),
    ("hopper.warpgroup", "Hopper (sm_90)", "warps in a warpgroup (wgmma)", 4, "warps", "ptx-isa"),
)

#: The prefix of keys that name the GPU building the page, whichever it is.
BUILD = "gpu"


def gpu_for_name(device_name: str) -> Gpu | None:
    """The datasheet's GPU for a device name as CUDA reports it (``"NVIDIA H200"``),
    or None when the table has no row for that device."""
    if not isinstance(device_name, str):
        raise TypeError(f"gpu_for_name() takes a device name, got {type(device_name).__name__}")
    for gpu in GPUS.values():
        if gpu.matches(device_name):
            return gpu
    return None


def gpu_kind(device_name: str) -> str:
    """A short folder-safe name for a device: the datasheet key where the table knows
    the GPU (``"h200"``), else its name in lower case (``"nvidia-rtx-a6000"``).
    Committed records are kept in one folder per kind."""
    gpu = gpu_for_name(device_name)
    if gpu is not None:
        return gpu.key
    slug = re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-")
    return slug or "unknown-gpu"


def build_gpu() -> Gpu | None:
    """The GPU this page speaks for, or None where the datasheet has no row for it.

    On a GPU, the device this process runs on; on a CPU, the GPU whose committed
    records the page shows (:func:`tilebook.course.bench.shown_records_gpu`).
    """
    from .. import runtime

    if runtime.is_gpu():
        import torch

        return gpu_for_name(torch.cuda.get_device_name())
    from .bench import shown_records_gpu

    name = shown_records_gpu()
    return gpu_for_name(name) if name else None


def _resolve(key: str) -> str:
    if not isinstance(key, str):
        raise TypeError(f"fact() takes a key string, got {type(key).__name__}")
    prefix, dot, rest = key.partition(".")
    if prefix != BUILD or not dot:
        return key
    gpu = build_gpu()
    if gpu is None:
        raise LookupError(
            f"{key!r}: the GPU this page is built for has no row in the datasheet "
            f"(known: {', '.join(g.name for g in GPUS.values())})"
        )
    return f"{gpu.key}.{rest}"


def fact(key: str) -> Fact:
    """The :class:`Fact` called ``key``; ``gpu.<name>`` is the build GPU's (see the
    module's docstring).  A :class:`KeyError` lists the known keys; a
    :class:`LookupError`, a build GPU the table does not know."""
    resolved = _resolve(key)
    try:
        return FACTS[resolved]
    except KeyError:
        raise KeyError(
            f"no datasheet fact {resolved!r}; known: {', '.join(sorted(FACTS))}"
        ) from None


def lookup(key: str) -> Fact | None:
    """Like :func:`fact`, but None where the build GPU, or its fact, is not in the table."""
    try:
        return fact(key)
    except LookupError:  # KeyError is a LookupError too
        return None


def build_fact(name: str, fallback: str = "h200") -> Fact:
    """The build GPU's fact ``name`` (``"memory_bandwidth"``), or, where the table has
    none for it, the ``fallback`` GPU's.  The fact's ``gpu`` names whose figure it is,
    so that a sentence made with it can say so: a figure of another GPU is never
    presented as this one's."""
    return lookup(f"{BUILD}.{name}") or fact(f"{fallback}.{name}")


def build_gpu_name() -> str | None:
    """The name of the GPU this page speaks for, as CUDA reports it (``"NVIDIA
    H200"``): the device on a GPU, the GPU of the shown records on a CPU."""
    from .. import runtime

    if runtime.is_gpu():
        import torch

        return torch.cuda.get_device_name()
    from .bench import shown_records_gpu

    return shown_records_gpu()


def facts_for(gpu: str) -> list[Fact]:
    """Every fact about one GPU (as named in the ``gpu`` column), in table order."""
    return [f for f in FACTS.values() if f.gpu == gpu]
