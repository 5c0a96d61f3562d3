"""tilebook.course.passes and the stage viewer; the source lines of inline-asm loads
(tilebook.course.aot).

One ``compile_with_passes`` call (child processes, about 3 s each to start on a
CPU) compiles the kernels that every test here reads.
"""

from __future__ import annotations

import json
import re
import textwrap

import pytest
import triton
import triton.language as tl

from tilebook.course.aot import AotError, CompiledKernel, compile_many
from tilebook.course.aot.lines import ptx_line_map, without_inline_asm_locs
from tilebook.course.passes import IRS, PassLog, Traced, compile_with_passes, parse_mlir_dump
from tilebook.course.widgets import embed_json
from tilebook.course.widgets_stages import STAGE_JOBS, StageViewer, stage_texts


@triton.jit
def scale_kernel(x_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    offsets = tl.program_id(axis=0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    # a line of code between the load and the store, so that a load's
    # instructions given to the lines after it would land on real code
    y = alpha * x
    tl.store(out_ptr + offsets, y, mask=mask)


@triton.jit
def dot_kernel(a_ptr, b_ptr, c_ptr, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rm = tl.arange(0, BM)
    rn = tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, K, BK):
        a = tl.load(a_ptr + rm[:, None] * K + (k + rk)[None, :])
        b = tl.load(b_ptr + (k + rk)[:, None] * BN + rn[None, :])
        acc += tl.dot(a, b)
    tl.store(c_ptr + rm[:, None] * BN + rn[None, :], acc)


SIG = {"x_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "alpha": "fp32"}
SCALE = {"kernel": scale_kernel, "signature": SIG, "constexprs": {"BLOCK": 1024}}
DOT_SIG = {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp32", "K": "i32"}
DOT = {"kernel": dot_kernel, "signature": DOT_SIG, "constexprs": {"BM": 64, "BN": 64, "BK": 32}}


@pytest.fixture(scope="module")
def builds():
    return compile_with_passes(
        {
            "wide": {**SCALE, "divisible_by_16": ["x_ptr", "out_ptr", "n"]},
            "narrow": {**SCALE, "divisible_by_16": ["x_ptr", "out_ptr"]},
            "dot sm_80": {**DOT, "arch": 80, "divisible_by_16": list(DOT_SIG)},
            "dot sm_90": {**DOT, "divisible_by_16": list(DOT_SIG)},
        },
        arch=90,
        workers=2,
    )


# ------------------------------------------------------------ the pass log


def test_passes_are_logged_for_every_ir(builds):
    for label, t in builds.items():
        assert isinstance(t, Traced) and isinstance(t.passes, PassLog)
        assert [r.index for r in t.passes.runs] == list(range(len(t.passes)))
        seen = [r.ir for r in t.passes.runs]
        assert seen == sorted(seen, key=IRS.index), f"{label}: IRs out of order"
        assert set(seen) == set(IRS)
        assert t.passes.runs[-1].changed is None
        assert t.passes.did("convert-triton-to-tritongpu")
        assert t.passes.did("convert-triton-gpu-to-llvm")


def test_the_passes_that_make_a_dot_fast_changed_it(builds):
    for label in ("dot sm_80", "dot sm_90"):
        log = builds[label].passes
        for name in ("tritongpu-accelerate-matmul", "tritongpu-pipeline"):
            assert log.did(name), f"{label}: {name} changed nothing"
            assert log.after(name) != log.before(name)
        assert {r.ir for r in log.changed("ttgir")} == {"ttgir"}
    mma = {a: builds[f"dot sm_{a}"].passes.after("tritongpu-accelerate-matmul") for a in (80, 90)}
    assert "versionMajor = 2" in mma[80] and "versionMajor = 3" in mma[90]
    added = [line for line in builds["dot sm_90"].passes.diff("tritongpu-accelerate-matmul")]
    assert any(line.startswith("+") and "warp_group_dot" in line for line in added)
    assert any(line.startswith("-") and "tt.dot" in line for line in added)


def test_coalesce_gives_the_wide_layout(builds):
    log = builds["wide"].passes
    before = re.findall(r"sizePerThread = \[(\d+)\]", log.before("tritongpu-coalesce"))
    after = re.findall(r"sizePerThread = \[(\d+)\]", log.after("tritongpu-coalesce"))
    assert before == ["1"] and "4" in after
    diff = log.diff("tritongpu-coalesce")
    assert all(len(line) <= 88 for line in diff)
    assert not any("loc(" in line for line in diff)


def test_a_pass_log_answers_clearly(builds):
    log = builds["wide"].passes
    with pytest.raises(ValueError, match="no pass 'no-such-pass' ran"):
        log.before("no-such-pass")
    with pytest.raises(ValueError, match="occurrence"):
        log.before("tritongpu-coalesce", occurrence=5)
    with pytest.raises(ValueError, match="last pass"):
        log.after(
            log.runs[-1].name, occurrence=sum(r.name == log.runs[-1].name for r in log.runs) - 1
        )
    with pytest.raises(ValueError, match="ir must be one of"):
        log.changed("ptx")


def test_front_end_and_cache_files(builds):
    t = builds["wide"]
    assert "tt.func" in t.front_end and "tt.load" in t.front_end
    assert len(t.front_end.splitlines()) > len(t.kernel.stage("ttir").splitlines())
    assert any(n for n, locs in t.front_end_lines)
    suffixes = {name.rsplit(".", 1)[1] for name in t.cache_files}
    assert {"source", "ttir", "ttgir", "llir", "ptx", "cubin", "json"} <= suffixes
    assert all(size > 0 for size in t.cache_files.values())
    assert {"ttir", "ttgir", "llir", "ptx", "cubin"} <= {f.rsplit(".", 1)[1] for f in t.dump_files}
    assert t.caption().startswith("compiled ahead of time for sm_90 with Triton")


def test_parse_mlir_dump_on_a_small_dump():
    def dump(name, cls, body, op="builtin.module"):
        return f"// -----// IR Dump Before {cls}: {name} ('{op}' operation) //----- //\n{body}\n\n"

    text = (
        dump("inline", "InlinerPass", "module { a }")
        + dump("canonicalize", "CanonicalizerPass", "func b", op="tt.func")
        + dump("convert-triton-to-tritongpu", "ConvertTritonToTritonGPU", "module { b }")
        + dump("tritongpu-coalesce", "TritonGPUCoalesce", "module { c }")
        + "// -----// SoftwarePipeliner internal IR Dump After: LowerLoops\nnoise\n"
        + dump("cse", "CSEPass", "module { c }")
        + dump("convert-triton-gpu-to-llvm", "ConvertTritonGPUToLLVM", "module { c }")
        + dump("cse", "CSEPass", "llvm { d }")
    )
    log = parse_mlir_dump(text)
    assert [(r.name, r.ir, r.changed) for r in log.runs] == [
        ("inline", "ttir", True),
        ("convert-triton-to-tritongpu", "ttgir", True),
        ("tritongpu-coalesce", "ttgir", False),
        ("cse", "ttgir", False),
        ("convert-triton-gpu-to-llvm", "llvm", True),
        ("cse", "llvm", None),
    ]
    assert "noise" not in log.modules[2]
    assert [r.name for r in log.changed("ttgir")] == ["convert-triton-to-tritongpu"]
    old_style = re.sub(r"Before (\w+): ([\w-]+)", r"Before \1 (\2)", text)
    assert old_style != text
    assert [(r.name, r.changed) for r in parse_mlir_dump(old_style).runs] == [
        (r.name, r.changed) for r in log.runs
    ]
    with pytest.raises(ValueError, match="no MLIR pass dump"):
        parse_mlir_dump("nothing here")
    with pytest.raises(ValueError, match="not the dump of a whole compile"):
        parse_mlir_dump(dump("inline", "InlinerPass", "module {}"))


def test_bad_jobs_are_clear_errors():
    with pytest.raises(TypeError, match="non-empty dict"):
        compile_with_passes({})
    with pytest.raises(TypeError, match="unknown compile option 'archh'"):
        compile_with_passes({"x": {**SCALE, "archh": 90}})
    with pytest.raises(TypeError, match="needs 'signature'"):
        compile_with_passes({"x": {"kernel": scale_kernel}})
    with pytest.raises(ValueError, match="workers"):
        compile_with_passes({"x": SCALE}, workers=0)
    with pytest.raises((AotError, ValueError), match="no argument 'bogus'"):
        compile_with_passes({"x": {**SCALE, "signature": {**SIG, "bogus": "i32"}}})


# ------------------------------------------- source lines of inline asm (aot)


PTX = textwrap.dedent(
    """\
    .visible .entry k(
    )
    {
    \t.loc\t1 12 9
    \t// begin inline asm
    \t.loc\t1 12 9
    \tmov.u32 %r1, 0x0;
    \t.loc\t1 13 9
    \tmov.u32 %r2, 0x0;
    \t@%p1 ld.global.v2.b32 { %r1, %r2 }, [ %rd1 + 0 ];
    \t// end inline asm
    \t.loc\t1 13 5
    \t@%p1 st.global.v2.b32 [ %rd2 + 0 ], { %r1, %r2 };
    }
    \t.file\t1 "/src/k.py"
    """
)


def test_ptx_lines_of_inline_asm_are_the_block_s_own():
    twelve, thirteen = (("/src/k.py", 12),), (("/src/k.py", 13),)
    assert ptx_line_map(PTX) == [(7, twelve), (9, twelve), (10, twelve), (13, thirteen)]
    clean = without_inline_asm_locs(PTX)
    assert clean.count(".loc\t1 13 9") == 0 and clean.count(".loc\t1 12 9") == 2
    assert clean.count("\n") == PTX.count("\n") - 1
    assert without_inline_asm_locs(clean) is clean


def test_sass_of_a_vector_load_belongs_to_the_load_line(builds):
    """Each LDG comes from the tl.load line, whatever the Triton version writes."""
    for label in ("wide", "narrow"):
        k = builds[label].kernel
        loads = [line for line in k.lines_for("tl.load(x_ptr", "sass") if "LDG" in line.text]
        assert len(loads) == k.count(r"\bLDG\b"), label
        ptx = [line for line in k.lines_for("tl.load(x_ptr", "ptx") if "ld.global" in line.text]
        assert len(ptx) == k.count(r"ld\.global", "ptx"), label
        for other in ("y = alpha * x", "tl.store("):
            got = k.lines_for(other, "sass") + k.lines_for(other, "ptx")
            assert not [line for line in got if re.search(r"LDG|ld\.global", line.text)], other


# ---------------------------------------------------------------- the viewer


def test_stage_viewer_data(builds):
    plain = compile_many({"aot": {**SCALE, "arch": 80}})["aot"]
    viewer = StageViewer(
        {**builds, "aot only": plain},
        caption="compiled ahead of time",
        line="tl.load(x_ptr",
        warn={"narrow": "narrow loads"},
        notes={"dot sm_90": "wgmma"},
    )
    data = viewer.data()
    json.loads(embed_json(data))  # serialisable
    assert [s["key"] for s in data["stages"]] == [key for key, _, _ in STAGE_JOBS]
    labels = [b["label"] for b in data["builds"]]
    assert labels == [*builds, "aot only"]
    wide = data["builds"][0]
    load_line = data["initial"]["line"]
    assert "tl.load(x_ptr" in wide["source"][load_line - wide["first"]]
    for key in ("front", "ttir", "ttgir", "llir", "ptx", "sass"):
        stage = wide["stages"][key]
        text = data["texts"][stage["text"]].splitlines()
        lit = stage["index"][str(load_line)]
        assert lit and all(1 <= n <= len(text) for n in lit), key
    ptx = data["texts"][wide["stages"]["ptx"]["text"]]
    assert ".debug_abbrev" not in ptx and "ld.global.v4.b32" in ptx
    assert "tritongpu-coalesce" in wide["stages"]["ttgir"]["passes"]
    assert "passes" not in data["builds"][-1]["stages"]["ttgir"]
    assert "front" not in data["builds"][-1]["stages"]
    assert data["builds"][1]["verdict"] == {"kind": "warn", "text": "narrow loads"}
    assert data["builds"][3]["note"] == "wgmma"
    # identical texts are stored once: sm_90's TTIR is shared by two builds
    assert wide["stages"]["ttir"]["text"] == data["builds"][1]["stages"]["ttir"]["text"] or (
        builds["wide"].kernel.stage("ttir") != builds["narrow"].kernel.stage("ttir")
    )
    html = viewer._repr_html_()
    assert 'data-tilebook-widget="stages"' in html and "tbw-stages" in html


def test_stage_viewer_refuses_what_it_cannot_show(builds):
    with pytest.raises(ValueError, match="non-empty"):
        StageViewer({}, caption="c")
    with pytest.raises(TypeError, match="Traced or a CompiledKernel"):
        StageViewer({"x": "ptx text"}, caption="c")
    with pytest.raises(ValueError, match="do not exist"):
        StageViewer(builds, caption="c", wrong={"nope": "why"})
    with pytest.raises(ValueError, match="at least one build that is not wrong"):
        StageViewer(builds, caption="c", wrong={label: "bad" for label in builds})
    with pytest.raises(ValueError, match="stage must be one of"):
        StageViewer(builds, caption="c", stage="cubin")
    with pytest.raises(ValueError, match="exactly one"):
        StageViewer(builds, caption="c", line="tl.")
    with pytest.raises(ValueError, match="initial"):
        StageViewer(builds, caption="c", initial="nope")


def test_stage_texts_keep_line_numbers(builds):
    k = builds["wide"].kernel
    shown = stage_texts(k)
    assert set(shown) == {"ttir", "ttgir", "llir", "ptx", "sass"}
    full, cut = k.stage("ptx").splitlines(), shown["ptx"].splitlines()
    assert len(cut) < len(full) and full[: len(cut) - 1] == cut[:-1]
    assert isinstance(k, CompiledKernel)
