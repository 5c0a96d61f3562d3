"""What lesson 03 (from Python to PTX) reads from the stages of its compiles.

The lesson compiles ``scale_kernel`` and ``tile_dot_kernel`` ahead of time
(:func:`tilebook.course.passes.compile_with_passes`, no GPU needed) and reads
each build's stages.  This module holds what the page says of those builds,
made from them: the loads each build makes (:func:`loads`), the tables, the
sentences, the claims (checked with :meth:`tilebook.course.claims.Claims.check_all`)
and the stage viewer.  A ``builds`` argument is what ``compile_with_passes``
returned: a mapping from a label to a build with ``.kernel`` (a
:class:`~tilebook.course.aot.CompiledKernel`) and ``.passes`` (a
:class:`~tilebook.course.passes.PassLog`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import triton

__all__ = [
    "JOBS",
    "KNOBS",
    "dot_claims",
    "env_var",
    "knob_claims",
    "knobs_table",
    "layouts",
    "loads",
    "loads_table",
    "passes_table",
    "say_loads",
    "say_mma",
    "say_other_passes",
    "shared_buffers",
    "viewer_setup",
    "width_claims",
]


def layouts(text: str) -> list[str]:
    """The ``sizePerThread`` of each ``#blocked`` layout a TTGIR module defines."""
    return re.findall(r"^#blocked\d* = .*sizePerThread = \[(\d+)\]", text, re.M)


def loads(builds: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Per build, counted per thread in its SASS: ``wide`` (16-byte loads),
    ``narrow`` (4-byte loads), ``guarded`` (predicated loads), ``stores``
    (16-byte stores), and ``layout``, the ``sizePerThread`` of its TTGIR."""
    return {
        label: {
            "wide": t.kernel.count(r"LDG\.E\.128"),
            "narrow": t.kernel.count(r"LDG\.E(?!\.128)"),
            "guarded": t.kernel.count(r"@!?P\d+ LDG"),
            "stores": t.kernel.count(r"STG\.E\.128"),
            "layout": layouts(t.kernel.stage("ttgir")),
        }
        for label, t in builds.items()
    }


def _first(kernel: Any, pattern: str, line: str, stage: str) -> str:
    """The first match of ``pattern`` in the lines of ``stage`` from one Python line."""
    return next(m[0] for s in kernel.lines_for(line, stage) if (m := re.search(pattern, s.text)))


def say_loads(build: Any, block: int, load: str, mask: str) -> Any:
    """How ``build``'s threads load a ``block``-element tile: how many elements
    each owns, in groups of its layout, and the predicated wide load that the
    Python lines ``load`` and ``mask`` became in PTX and SASS."""
    from ..prose import say

    k = build.kernel
    threads = 32 * k.num_warps
    per, spt = block // threads, int(layouts(k.stage("ttgir"))[0])
    return say(
        "Each thread owns {per} elements ({block} over {threads} threads), in "
        "{groups} groups of {spt}, and each group is one load: ``ld.global.v4.b32`` "
        "in PTX, ``LDG.E.128`` in SASS, {wide} per thread.  The load is "
        "*predicated*: the mask line became a comparison into a predicate register "
        "(``{setp}``) and the load runs only where it holds (``{guard}``).  In SASS "
        "the comparison is ``{isetp}`` and the load is guarded by ``{sguard}``: "
        "lanes past the end are switched off, with no branch.",
        per=per,
        block=block,
        threads=threads,
        groups=per // spt,
        spt=spt,
        wide=k.count(r"LDG\.E\.128"),
        setp=_first(k, r"setp\.\w+\.\w+", mask, "ptx"),
        guard=_first(k, r"@%p\d+", load, "ptx"),
        isetp=_first(k, r"ISETP\.\w+", mask, "sass"),
        sguard=_first(k, r"@!?P\d+", load, "sass"),
    )


def loads_table(builds: Mapping[str, Any], labels: Sequence[str], caption: str) -> Any:
    """The layout, loads, stores and registers of the builds ``labels``."""
    from ..tables import table

    counts = loads({label: builds[label] for label in labels})
    return table(
        [{"build": label, "registers": builds[label].kernel.registers} for label in labels],
        {
            "build": "build",
            "sizePerThread": lambda r: ", ".join(counts[r["build"]]["layout"]),
            "16-byte loads": lambda r: counts[r["build"]]["wide"],
            "4-byte loads": lambda r: counts[r["build"]]["narrow"],
            "predicated loads": lambda r: counts[r["build"]]["guarded"],
            "16-byte stores": lambda r: counts[r["build"]]["stores"],
            "registers": "registers",
        },
        caption=caption,
    )


def width_claims(
    builds: Mapping[str, Any],
    labels: Sequence[str],
    snapshots: Sequence[tuple[str, str]],
    unmasked: Any,
    block: int,
) -> dict[str, Any]:
    """What lesson 03 says of its ``scale_kernel`` builds, for ``check_all``.

    ``labels``: the builds of the loads table; ``snapshots``: ``(when, TTGIR)``
    before coalesce, after it and after remove-layout-conversions;
    ``unmasked``: the exercise checker's verdict on the kernel without a mask.
    """
    k80, k90 = builds["sm_80"].kernel, builds["sm_90"].kernel
    n = loads(builds)
    wide, narrow = {k: v["wide"] for k, v in n.items()}, {k: v["narrow"] for k, v in n.items()}
    guarded, stores = (
        {k: v["guarded"] for k, v in n.items()},
        {k: v["stores"] for k, v in n.items()},
    )
    per_thread = block // (32 * k90.num_warps)
    spt = int(layouts(k90.stage("ttgir"))[0])
    snaps = [layouts(text) for _, text in snapshots]
    return {
        "The TTIR is the same for sm_80 and sm_90": k80.stage("ttir") == k90.stage("ttir"),
        "coalesce made the layout of four; remove-layout-conversions left only it": (
            snaps == [["1"], ["1", str(spt)], [str(spt)]],
            f"sizePerThread {snaps}",
        ),
        "All five builds give the load the same layout": all(
            n[label]["layout"] == [str(spt)] for label in labels
        ),
        "With the hints, each group of four is one predicated 16-byte load": (
            wide["sm_90"] == wide["sm_80"] == per_thread // spt == guarded["sm_90"]
            and narrow["sm_90"] == 0,
            f"{wide['sm_90']} LDG.E.128 per thread, {guarded['sm_90']} of them predicated",
        ),
        "n=4100 and x[1:] load one element at a time; x[1:] still stores 16 bytes": (
            wide["sm_90, n=4100"] == wide["sm_90, x[1:]"] == 0
            and narrow["sm_90, n=4100"] == narrow["sm_90, x[1:]"] == per_thread
            and stores["sm_90, x[1:]"] == stores["sm_90"] > stores["sm_90, n=4100"]
        ),
        "Without the mask the loads are wide and unpredicated, and the result is wrong": (
            wide["sm_90, no mask"] == wide["sm_90"]
            and guarded["sm_90, no mask"] == 0
            and not unmasked.ok
            and "past the end" in str(unmasked),
            f"{wide['sm_90, no mask']} LDG.E.128, {guarded['sm_90, no mask']} predicated",
        ),
    }


#: The passes that shape a kernel with a loop and a ``tl.dot`` on its way to
#: TTGIR, and what each does.
JOBS = {
    "convert-triton-to-tritongpu": "gives every tensor a default layout",
    "tritongpu-coalesce": "layouts for coalesced loads and stores",
    "tritongpu-remove-layout-conversions": "removes layout conversions it can",
    "tritongpu-accelerate-matmul": "tensor-core layout and operation for tl.dot",
    "tritongpu-assign-latencies": "how far ahead each load must start",
    "tritongpu-schedule-loops": "orders the loop's operations into stages",
    "tritongpu-pipeline": "copies later tiles into shared memory early",
    "tritongpu-prefetch": "reads the next operands from shared memory early",
    "allocate-shared-memory-nv": "places the buffers in shared memory",
}


def _changed(builds: Sequence[Any]) -> set[str]:
    return {r.name for t in builds for r in t.passes.changed("ttgir")}


def passes_table(dot80: Any, dot90: Any) -> Any:
    """The passes of :data:`JOBS` that changed either build, and which of the two."""
    from ..tables import table

    changed = _changed((dot80, dot90))
    return table(
        [{"pass": name} for name in JOBS if name in changed],
        {
            "pass": "pass",
            "what it does": lambda r: JOBS[r["pass"]],
            "sm_80": lambda r: "changed" if dot80.passes.did(r["pass"]) else "no change",
            "sm_90": lambda r: "changed" if dot90.passes.did(r["pass"]) else "no change",
        },
        caption=f"{dot90.caption()} and sm_80",
    )


def say_other_passes(dot80: Any, dot90: Any) -> Any:
    """The passes outside :data:`JOBS` that changed either build."""
    from ..prose import say

    return say(
        "Other passes changed it too (clean-ups, loop-invariant code motion, "
        "bookkeeping): {others}.",
        others=", ".join(f"``{name}``" for name in sorted(_changed((dot80, dot90)) - set(JOBS))),
    )


def _mma(dot80: Any, dot90: Any) -> dict[int, dict[str, int]]:
    return {t.kernel.arch: t.kernel.instructions("HMMA", "HGMMA") for t in (dot80, dot90)}


def say_mma(dot80: Any, dot90: Any) -> Any:
    """The ``nvidia_mma`` layout version and the tensor-core instructions of each build."""
    from ..prose import say

    ops = _mma(dot80, dot90)
    major = [re.search(r"versionMajor = (\d)", t.kernel.stage("ttgir"))[1] for t in (dot80, dot90)]
    return say(
        "For ``sm_80`` the layout is ``nvidia_mma`` version {v80}, ``tt.dot`` stays "
        "and becomes {h80} ``HMMA`` instructions in SASS; for ``sm_90`` it is version "
        "{v90}, ``tt.dot`` is replaced by ``ttng.warp_group_dot``, which becomes "
        "{g90} ``HGMMA`` instructions.",
        v80=major[0],
        h80=ops[80]["HMMA"],
        v90=major[1],
        g90=ops[90]["HGMMA"],
    )


def shared_buffers(build: Any) -> tuple[list[tuple[int, int, int]], int]:
    """(copies, rows, cols) of each fp16 ``local_alloc`` in the TTGIR; bytes in all."""
    found = re.findall(
        r"local_alloc : \(\) -> !ttg\.memdesc<(\d+)x(\d+)x(\d+)xf16",
        build.kernel.stage("ttgir"),
    )
    shapes = [tuple(map(int, f)) for f in found]
    return shapes, sum(s * r * c * 2 for s, r, c in shapes)


def dot_claims(dot80: Any, dot90: Any, acc: int) -> dict[str, Any]:
    """What lesson 03 says of its ``tile_dot_kernel`` builds, for ``check_all``:
    tensor cores, asynchronous copies into exactly the shared memory recorded, and
    more registers a thread than its ``acc`` values of the accumulator."""
    both = (dot80, dot90)
    ops = _mma(dot80, dot90)
    key = ("tritongpu-accelerate-matmul", "tritongpu-pipeline")
    return {
        "accelerate-matmul and pipeline changed the kernel on both targets; tl.dot "
        "became mma (HMMA) on sm_80 and wgmma (HGMMA) on sm_90": (
            all(t.passes.did(p) for t in both for p in key)
            and ops[80]["HMMA"] > 0 == ops[80]["HGMMA"]
            and ops[90]["HGMMA"] > 0 == ops[90]["HMMA"],
            f"sm_80 {ops[80]}, sm_90 {ops[90]}",
        ),
        "The loads became asynchronous copies, and the shared memory in the metadata "
        "is exactly their buffers, on both targets": (
            all(shared_buffers(t)[1] == t.kernel.shared_bytes > 0 for t in both)
            and all(t.kernel.instructions("LDGSTS")["LDGSTS"] > 0 for t in both)
            and all("async_copy_global_to_local" in t.kernel.stage("ttgir") for t in both),
            "; ".join(f"sm_{t.kernel.arch}: {t.kernel.shared_bytes} bytes" for t in both),
        ),
        "Each thread holds its share of the accumulator in registers, and more": (
            all(t.kernel.registers > acc for t in both),
            f"{acc} accumulator values per thread; "
            + ", ".join(f"sm_{t.kernel.arch}: {t.kernel.registers} registers" for t in both),
        ),
    }


def viewer_setup(builds: Mapping[str, Any], compiled: str) -> dict[str, Any]:
    """The settings of lesson 03's :class:`~tilebook.course.widgets_stages.StageViewer`
    but its builds and line: its title and caption (``compiled``, where the builds
    come from), the build that computes a wrong answer, the two that load narrowly,
    and what the ``tl.dot`` builds became."""
    n = loads({k: builds[k] for k in ("sm_90", "sm_90, n=4100", "sm_90, x[1:]")})
    return {
        "title": "From Python to SASS: every stage of every build",
        "caption": f"{compiled} (and sm_80); no GPU needed",
        "wrong": {
            "sm_90, no mask": "no mask: the last program reads and writes past the "
            "end of the vectors unless n is a multiple of BLOCK (the check above)."
        },
        "warn": {
            "sm_90, n=4100": f"{n['sm_90, n=4100']['narrow']} narrow loads per thread "
            f"where {n['sm_90']['wide']} wide ones do: n is not known divisible by 16.",
            "sm_90, x[1:]": f"{n['sm_90, x[1:]']['narrow']} narrow loads per thread: x "
            "is not known to be aligned to 16 bytes.",
        },
        "notes": {
            "dot sm_80": "tl.dot as mma.sync (HMMA); cp.async into shared memory.",
            "dot sm_90": "tl.dot as wgmma (HGMMA), operands read from shared memory.",
        },
    }


#: The knobs of ``triton.knobs`` that concern the cache and the stages:
#: ``(group, name, what it does)``.
KNOBS = [
    ("cache", "dir", "where the cache lives (default: ~/.triton/cache)"),
    ("compilation", "always_compile", "compile even when the cache has the binary"),
    ("compilation", "dump_ir", "write every stage of each compile to dump_dir"),
    ("cache", "dump_dir", "where dump_ir writes"),
    ("compilation", "override", "use stage files from override_dir instead"),
    ("cache", "override_dir", "hand-edited stages (a .ptx, say), by cache key"),
    ("compilation", "store_binary_only", "cache only the cubin, not the stages"),
    ("compilation", "disable_line_info", "no source locations in PTX and SASS"),
    ("nvidia", "dump_ptxas_log", "print ptxas -v: registers and spills"),
    ("autotuning", "print", "print each autotuned kernel's best config (lesson 13)"),
    ("runtime", "interpret", "run kernels in the interpreter (this site's CPU mode)"),
]


def env_var(group: str, name: str) -> str:
    """The environment variable behind ``triton.knobs.<group>.<name>``."""
    return vars(type(getattr(triton.knobs, group)))[name].key


def knobs_table() -> Any:
    """:data:`KNOBS`, with the environment variable this Triton reads for each."""
    from ..tables import table

    return table(
        [{"knob": f"{g}.{n}", "env": env_var(g, n), "what": w} for g, n, w in KNOBS],
        {"triton.knobs.": "knob", "environment variable": "env", "what it does": "what"},
        caption=f"triton.knobs of Triton {triton.__version__}",
    )


def _every_knob() -> set[str]:
    return {
        d.key
        for group in vars(triton.knobs).values()
        if isinstance(group, triton.knobs.base_knobs)
        for d in vars(type(group)).values()
        if isinstance(d, triton.knobs.env_base)
    }


def knob_claims(build: Any) -> dict[str, Any]:
    """The pass-by-pass dump is not a knob, yet logged ``build``'s passes; the
    kernel dump wrote the stages the cache keeps."""
    every = _every_knob()
    dumped = {name.rsplit(".", 1)[1] for name in build.dump_files}
    return {
        "MLIR_ENABLE_DUMP is not one of triton.knobs, and it works: passes were logged": (
            "MLIR_ENABLE_DUMP" not in every and len(build.passes) > 0,
            f"{len(every)} knobs read; {len(build.passes)} passes logged",
        ),
        "TRITON_KERNEL_DUMP wrote the stages the cache keeps": (
            dumped >= {"ttir", "ttgir", "llir", "ptx", "cubin"},
            ", ".join(build.dump_files),
        ),
    }
