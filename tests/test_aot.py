"""tilebook.course.aot: stages and their source lines, resources, targets, lesson kernels, errors.

On a CPU every compile is a child process (about 3 s to start), so the kernels
are compiled once, in one ``compile_many`` call, and shared by the tests.
"""

from __future__ import annotations

import linecache
import os
import textwrap

import pytest
import triton
import triton.language as tl

import tilebook
from tilebook.course.aot import (
    STAGES,
    AotError,
    compile_kernel,
    compile_many,
    count_opcodes,
    instruction_table,
    ptxas_for,
)
from tilebook.course.aot.lines import (
    add_call_sites,
    llvm_call_sites,
    llvm_line_map,
    mlir_line_map,
    ptx_line_map,
    sass_line_map,
)
from tilebook.course.aot.shipping import kernel_ref

SCALE = tl.constexpr(3.0)


@triton.jit
def dot_kernel(
    a_ptr, b_ptr, c_ptr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr, PREC: tl.constexpr
):
    rm = tl.arange(0, M)[:, None]
    rn = tl.arange(0, N)[None, :]
    rk = tl.arange(0, K)
    a = tl.load(a_ptr + rm * K + rk[None, :])
    b = tl.load(b_ptr + rk[:, None] * N + rn)
    c = tl.dot(a, b, input_precision=PREC)
    tl.store(c_ptr + rm * N + rn, c * SCALE)


@triton.jit
def loop_kernel(a_ptr, b_ptr, c_ptr, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rm = tl.arange(0, BM)
    rn = tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, K, BK):
        a = tl.load(a_ptr + rm[:, None] * K + (k + rk)[None, :])
        b = tl.load(b_ptr + (k + rk)[:, None] * BN + rn[None, :])
        acc += tl.dot(a, b)
    tl.store(c_ptr + rm[:, None] * BN + rn[None, :], acc)


# A lesson defines its kernels in the script that sphinx-gallery executes as
# __main__: a kernel that no other process can import.
LESSON = textwrap.dedent(
    """
    import triton
    import triton.language as tl

    OFFSET = tl.constexpr(7.0)


    @triton.jit
    def _shift(x):
        return x + OFFSET


    @triton.jit
    def lesson_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask)
        tl.store(out_ptr + offs, _shift(x), mask=mask)


    if OFFSET.value > 0:  # under a block, as lesson 04 defines its block pointer kernel

        @triton.jit
        def guarded_kernel(x_ptr, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            x = tl.load(x_ptr + offs, mask=offs < n)
            tl.store(x_ptr + offs, x * 3.0, mask=offs < n)
    """
)

DOT_SIG = {"a_ptr": "*bf16", "b_ptr": "*bf16", "c_ptr": "*fp32"}
DOT_CONSTS = {"M": 64, "N": 64, "K": 32, "PREC": "tf32"}
FMA_SIG = {"a_ptr": "*fp32", "b_ptr": "*fp32", "c_ptr": "*fp32"}
ADD = "tilebook.ops.vector_add:add_kernel"
ADD_SIG = {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "n_elements": "i32"}
ADD_CONSTS = {"BLOCK_SIZE": 1024, "INT64_OFFSETS": False}
LOOP_SIG = {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp32", "K": "i32"}
LOOP = {
    "kernel": loop_kernel,
    "signature": LOOP_SIG,
    "constexprs": {"BM": 128, "BN": 128, "BK": 64},
    "divisible_by_16": list(LOOP_SIG),
    "num_stages": 7,  # six 32 KiB buffers: more than an A100 has, less than an H100
}


def _run_script(path):
    """A lesson script's namespace, executed as sphinx-gallery does it."""
    path.write_text(LESSON)
    namespace = {"__name__": "__main__"}
    exec(compile(LESSON, str(path), "exec"), namespace)  # noqa: S102
    return path, namespace


@pytest.fixture(scope="module")
def lesson(tmp_path_factory):
    return _run_script(tmp_path_factory.mktemp("lesson") / "lesson_script.py")


@pytest.fixture(scope="module")
def lesson_copy(tmp_path_factory):
    """The same script in another file: same kernel text, same lines."""
    return _run_script(tmp_path_factory.mktemp("copy") / "lesson_script.py")


@pytest.fixture(scope="module")
def compiled(lesson, lesson_copy):
    dot = {"kernel": dot_kernel, "signature": DOT_SIG, "constexprs": DOT_CONSTS}
    add = {"kernel": ADD, "signature": ADD_SIG, "constexprs": ADD_CONSTS}
    add["divisible_by_16"] = list(ADD_SIG)
    scale = {"signature": {"x_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32"}, "arch": 80}
    scale["constexprs"] = {"BLOCK": 256}
    jobs = {
        "dot sm_80": {**dot, "arch": 80},
        "dot sm_90": {**dot, "arch": "sm_90a"},
        "fma sm_90": {**dot, "signature": FMA_SIG, "constexprs": {**DOT_CONSTS, "PREC": "ieee"}},
        "lesson sm_80": {**scale, "kernel": lesson[1]["lesson_kernel"]},
        "guarded sm_80": {
            "kernel": lesson[1]["guarded_kernel"],
            "signature": {"x_ptr": "*fp32", "n": "i32"},
            "constexprs": {"BLOCK": 256},
            "arch": 80,
        },
        "add sm_75": {**add, "arch": 75},
        "add sm_80": {**add, "arch": 80},
        "add sm_90": {**add, "arch": 90},
        # With two workers, jobs 3 and 7 share a child: the copy is compiled after
        # the original, where Triton's cache would hand back the original's text.
        "copy sm_80": {**scale, "kernel": lesson_copy[1]["lesson_kernel"]},
        "add sm_100": {**add, "arch": 100},
        "loop sm_90": {**LOOP, "arch": 90},
    }
    return compile_many(jobs, workers=2)


# ------------------------------------------------------------ what tl.dot became


def test_sm90_dot_is_wgmma(compiled):
    k = compiled["dot sm_90"]
    assert k.arch == 90
    counts = k.instructions("HGMMA", "HMMA")
    assert counts["HGMMA"] > 0 and counts["HMMA"] == 0, counts
    assert "wgmma.mma_async" in k.stage("ptx")


def test_sm80_dot_is_mma(compiled):
    k = compiled["dot sm_80"]
    counts = k.instructions("HGMMA", "HMMA")
    assert counts["HMMA"] > 0 and counts["HGMMA"] == 0, counts
    assert "mma.sync" in k.stage("ptx") and "wgmma" not in k.stage("ptx")


def test_fp32_ieee_dot_is_plain_fma(compiled):
    k = compiled["fma sm_90"]
    counts = k.instructions("HGMMA", "HMMA", "FFMA")
    assert counts["HGMMA"] == 0 and counts["HMMA"] == 0, counts
    assert counts["FFMA"] > 0, counts
    assert "mma" not in k.stage("ptx")


# ------------------------------------------------------------------ source lines


@pytest.mark.parametrize("stage", STAGES)
def test_dot_line_reaches_every_stage(compiled, stage):
    for label, tensor_op in (("dot sm_80", "HMMA"), ("dot sm_90", "HGMMA")):
        k = compiled[label]
        text = k.stage(stage).splitlines()
        found = k.lines_for("tl.dot(", stage)
        assert found, f"{label}: no {stage} line came from the tl.dot line"
        for line in found:
            assert text[line.number - 1] == line.text
        if stage == "sass":
            assert any(tensor_op in line.text for line in found), found


def test_line_numbers_are_the_files(compiled):
    k = compiled["dot sm_90"]
    assert k.kernel_file == os.path.normpath(__file__)
    lines = k.source_lines()
    assert any("tl.dot(" in line.text for line in lines)
    for line in lines:
        assert linecache.getline(line.file, line.line).rstrip("\n") == line.text
    dot_line = next(line.line for line in lines if "tl.dot(" in line.text)
    assert k.lines_for(dot_line, "ptx") == k.lines_for("tl.dot(", "ptx")
    index = k.line_index("sass")
    assert index[(k.kernel_file, dot_line)] == [s.number for s in k.lines_for(dot_line, "sass")]


def test_lines_for_says_what_is_wrong(compiled):
    k = compiled["dot sm_90"]
    with pytest.raises(ValueError, match="2 lines contain"):
        k.lines_for("tl.load(", "ptx")
    with pytest.raises(ValueError, match="no line"):
        k.lines_for("tl.atomic_add(", "ptx")
    with pytest.raises(ValueError, match="no stage 'cubin'"):
        k.lines_for("tl.dot(", "cubin")
    trace = k.trace("tl.dot(")
    assert all(len(line) <= 88 for line in trace.splitlines())
    assert [s for s in STAGES if f"\n{s}: " in trace] == list(STAGES)


# ---------------------------------------------------------- resources and ptxas


def test_registers_spills_shared(compiled):
    for label, k in compiled.items():
        assert isinstance(k.registers, int) and 0 < k.registers <= 255, (label, k.registers)
        assert f"Used {k.registers} registers" in k.ptxas_log, label
        assert k.spill_stores_bytes >= 0 and k.spill_loads_bytes >= 0
        assert k.num_warps == 4
    assert compiled["dot sm_90"].shared_bytes > 0
    assert compiled["add sm_90"].shared_bytes == 0


def test_ptxas_is_the_one_triton_uses(compiled):
    from triton.backends.nvidia.compiler import get_ptxas

    for arch in (75, 80, 90, 100):
        assert ptxas_for(arch) == str(get_ptxas(arch).path)
    for label, k in compiled.items():
        assert k.ptxas == ptxas_for(k.arch), label
        # ptxas names itself in its report: the log is that executable's.
        assert f"{os.path.basename(k.ptxas)} info" in k.ptxas_log, label
    # sm_100 takes Triton's Blackwell ptxas on every supported Triton: the case
    # that Triton 3.9 extends to sm_90 and that the old helper got wrong.
    assert os.path.basename(compiled["add sm_100"].ptxas) == "ptxas-blackwell"


def test_package_kernel_compiles_for_75_80_90(compiled):
    for arch in (75, 80, 90):
        k = compiled[f"add sm_{arch}"]
        assert k.arch == arch
        assert f".target sm_{arch}" in k.stage("ptx")
        assert k.instructions("LDG.E.128")["LDG.E.128"] > 0, f"sm_{arch}: loads not vectorised"


def test_shared_memory_is_checked_against_the_target(compiled):
    fits = compiled["loop sm_90"]
    assert 166912 < fits.shared_bytes <= 232448, fits.shared_bytes
    with pytest.raises(AotError, match=r"shared memory.*allows at most 166912"):
        compile_kernel(**{**LOOP, "arch": 80})


# ------------------------------------------------------------- lesson kernels


def test_lesson_kernel_object_compiles(compiled, lesson):
    path, namespace = lesson
    kernel = namespace["lesson_kernel"]
    if tilebook.is_interpreter():
        assert type(kernel).__name__ == "InterpretedFunction"
    assert "ship" in kernel_ref(kernel)  # sent as source: no other process can import it
    k = compiled["lesson sm_80"]
    assert k.name == "lesson_kernel"
    assert k.kernel_file == os.path.normpath(str(path))
    shift = k.lines_for("x + OFFSET", "ptx")  # the helper's line, with the global's value
    assert any("0f40E00000" in line.text for line in shift), shift  # 7.0 as PTX writes it
    call = k.lines_for("_shift(x)", "ptx")  # the call site gets the inlined helper's code
    assert {line.number for line in shift} <= {line.number for line in call}


def test_a_kernel_under_a_block_compiles_on_its_own_lines(compiled, lesson):
    # Its source is indented: it travels to the compiling process dedented.
    path, _ = lesson
    k = compiled["guarded sm_80"]
    assert k.name == "guarded_kernel"
    line = 1 + LESSON.splitlines().index("        x = tl.load(x_ptr + offs, mask=offs < n)")
    where = [s for s in k.source_lines() if "x = tl.load(x_ptr + offs" in s.text]
    assert [(s.file, s.line) for s in where] == [(os.path.normpath(str(path)), line)]
    assert k.lines_for(line, "ptx"), "the PTX names no instruction of that line"


def test_each_file_sees_its_own_lines(compiled, lesson, lesson_copy):
    for label, (path, _) in (("lesson sm_80", lesson), ("copy sm_80", lesson_copy)):
        k = compiled[label]
        assert {line.file for line in k.source_lines()} == {os.path.normpath(str(path))}
        assert str(path) in k.stage("ptx")


def test_kernel_in_a_function_is_refused():
    @triton.jit
    def local_kernel(x_ptr):
        tl.store(x_ptr, 1.0)

    with pytest.raises(ValueError, match="top level"):
        kernel_ref(local_kernel)


# ------------------------------------------------------------------ many targets


def test_instruction_table(compiled):
    names = ["HMMA", "HGMMA", "LDGSTS", "UTMALDG", "MUFU", "LDG.E.128", "FFMA", "STG.E", "BAR"]
    table = instruction_table(compiled, names)
    text = str(table)
    assert all(len(line) <= 88 for line in text.splitlines()), text
    assert all(label in text for label in compiled)
    for label, k in compiled.items():
        assert table[label]["registers"] == k.registers
        assert table[label]["HMMA"] == k.instructions("HMMA")["HMMA"]
    assert table["dot sm_80"]["HMMA"] > 0 and table["dot sm_90"]["HGMMA"] > 0


SASS = """
        /*0000*/                   HMMA.16816.F32.BF16 R4, R8, R12, R4 ;
        /*0010*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT ;
        /*0020*/              @!P0 LDGSTS.E.BYPASS.128 [R2], desc[UR4][R6.64] ;
        /*0030*/               @P1 LDG.E.128 R8, desc[UR4][R10.64] ;
        /*0040*/                   LDG.E.128.CONSTANT R8, desc[UR4][R10.64] ;
        /*0050*/                   MUFU.EX2 R3, R3 ;
"""


def test_opcodes_are_counted_by_whole_words():
    counts = count_opcodes(SASS, ["HMMA", "HGMMA", "LDG", "LDGSTS", "LDG.E.128", "MUFU", "MMA"])
    assert counts == {
        "HMMA": 1,
        "HGMMA": 1,
        "LDG": 2,
        "LDGSTS": 1,
        "LDG.E.128": 2,
        "MUFU": 1,
        "MMA": 0,
    }
    ptx = "\t@%p1 ld.global.v4.b32 { %r1, %r2, %r3, %r4 }, [ %rd1 + 0 ];\n\tld.global.b32 %r5, [%rd2];"
    assert count_opcodes(ptx, ["ld.global.v4", "ld.global"], "ptx") == {
        "ld.global.v4": 1,
        "ld.global": 2,
    }


# ------------------------------------------------------------------ the parsers


def test_mlir_locations_follow_aliases_and_call_sites():
    text = textwrap.dedent(
        """\
        module {
          %0 = tt.load %p : tensor<4xf32> loc(#loc3)
          %1 = arith.mulf %0, %0 : tensor<4xf32> loc(#loc4)
        } loc(#loc)
        #loc = loc("/k.py":1:1)
        #loc1 = loc("/k.py":5:9)
        #loc2 = loc("/h.py":20:4)
        #loc3 = loc("x"(#loc1))
        #loc4 = loc(callsite(#loc2 at #loc1))
        """
    )
    assert mlir_line_map(text) == [
        (2, (("/k.py", 5),)),
        (3, (("/h.py", 20), ("/k.py", 5))),
        (4, (("/k.py", 1),)),
    ]


def test_llvm_locations_follow_inlining():
    text = textwrap.dedent(
        """\
        define void @k() !dbg !4 {
          %1 = fmul float %0, %0, !dbg !7
          ret void, !dbg !6
        }
        !1 = !DIFile(filename: "k.py", directory: "/src")
        !4 = distinct !DISubprogram(name: "k", scope: !1, file: !1, line: 3, unit: !0)
        !5 = distinct !DISubprogram(name: "h", scope: !1, file: !1, line: 30, unit: !0)
        !6 = !DILocation(line: 9, column: 5, scope: !4)
        !7 = !DILocation(line: 31, column: 12, scope: !5, inlinedAt: !6)
        """
    )
    assert llvm_line_map(text) == [
        (1, (("/src/k.py", 3),)),
        (2, (("/src/k.py", 9), ("/src/k.py", 31))),
        (3, (("/src/k.py", 9),)),
    ]


def test_ptx_and_sass_locations():
    ptx = textwrap.dedent(
        """\
        .visible .entry k(
        )
        {
        \t.loc\t1 7 3
        \tmov.u32 \t%r1, %ctaid.x;
        $L__BB0_1:
        \t.loc\t1 20 5, function_name $L__info_string0, inlined_at 1 8 9
        \t@%p1 st.global.b32 [ %rd1 + 0 ], { %r1 };
        }
        \t.file\t1 "/src/k.py"
        """
    )
    assert ptx_line_map(ptx) == [
        (5, (("/src/k.py", 7),)),
        (8, (("/src/k.py", 8), ("/src/k.py", 20))),
    ]
    nvdisasm = textwrap.dedent(
        """\
        \t//## File "/src/k.py", line 7
                /*0000*/                   S2R R0, SR_CTAID.X ;
        \t//## File "/src/k.py", line 20 inlined at "/src/k.py", line 8
        \t//## File "/src/k.py", line 8
                /*0010*/                   STG.E desc[UR4][R2.64], R0 ;
                /*0020*/                   EXIT ;
        """
    )
    sass, line_map = sass_line_map(nvdisasm)
    assert "//##" not in sass and sass.splitlines()[1].strip().startswith("/*0010*/")
    both = (("/src/k.py", 8), ("/src/k.py", 20))
    assert line_map == [(1, (("/src/k.py", 7),)), (2, both), (3, both)]


def test_call_sites_come_from_llvm_when_ptx_lacks_them():
    text = textwrap.dedent(
        """\
        !1 = !DIFile(filename: "k.py", directory: "/src")
        !4 = distinct !DISubprogram(name: "k", scope: !1, file: !1, line: 3, unit: !0)
        !5 = distinct !DISubprogram(name: "h", scope: !1, file: !1, line: 30, unit: !0)
        !6 = !DILocation(line: 9, column: 5, scope: !4)
        !7 = !DILocation(line: 31, column: 12, scope: !5, inlinedAt: !6)
        """
    )
    sites = llvm_call_sites(text)
    assert sites == {("/src/k.py", 31): {("/src/k.py", 9)}}
    ptx_map = [(5, (("/src/k.py", 31),)), (6, (("/src/k.py", 4),))]
    assert add_call_sites(ptx_map, sites) == [
        (5, (("/src/k.py", 9), ("/src/k.py", 31))),
        (6, (("/src/k.py", 4),)),
    ]


# ----------------------------------------------------------------------- errors


def test_bad_arguments_are_clear_errors():
    base = {"kernel": dot_kernel, "signature": DOT_SIG, "constexprs": DOT_CONSTS}
    cases = [
        ({"arch": "sm_61"}, ValueError, "unknown compute capability 61"),
        ({"arch": "gpu"}, ValueError, "not a target name"),
        ({"arch": True}, TypeError, "arch must be"),
        ({"signature": {"a_ptr": "*bf16", "b_ptr": "*bf16"}}, ValueError, "'c_ptr'"),
        ({"signature": {**DOT_SIG, "zz": "i32"}}, ValueError, "has no argument 'zz'"),
        ({"signature": {**DOT_SIG, "c_ptr": "*fp33"}}, ValueError, "not a Triton type"),
        ({"kernel": lambda x: x}, TypeError, "@triton.jit kernel"),
        ({"num_warps": 3}, ValueError, "num_warps"),
        ({"warps": 4}, TypeError, "unknown compile option 'warps'"),
        ({"divisible_by_16": ["M"]}, ValueError, "not runtime arguments"),
    ]
    if not tilebook.is_interpreter():  # checked where the compile runs: here on a GPU
        cases.append(({"options": {"maxnregs": 128}}, ValueError, "no compile option 'maxnregs'"))
    for change, error, message in cases:
        with pytest.raises(error, match=message):
            compile_many([{**base, **change}])


def test_errors_of_the_compiling_process_come_back_whole():
    # The kernel is only found in the compiling process: its argument names are
    # checked there, and so are Triton's option names.
    jobs = [
        {"kernel": ADD, "signature": {"x_ptr": "*fp32"}, "constexprs": ADD_CONSTS},
        {"kernel": ADD, "signature": ADD_SIG, "constexprs": ADD_CONSTS, "options": {"x": 1}},
    ]
    with pytest.raises(ValueError, match=r"(?s)2 of the compile jobs.*'y_ptr'.*option 'x'"):
        compile_many(jobs, workers=1)


# ----------------------------------------------------------------------- on a GPU


@pytest.mark.gpu
def test_same_binary_as_a_launch():
    import torch

    from tilebook.ops.vector_add import add_kernel

    major, minor = torch.cuda.get_device_capability()
    n = 1 << 16
    x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    out = torch.empty_like(x)
    launched = add_kernel[(n // 1024,)](x, y, out, n, **ADD_CONSTS, num_warps=4)
    torch.testing.assert_close(out, x + y)
    k = compile_kernel(
        add_kernel, ADD_SIG, ADD_CONSTS, arch=10 * major + minor, divisible_by_16=list(ADD_SIG)
    )
    assert k.registers == launched.n_regs
    assert k.shared_bytes == launched.metadata.shared
    assert k.stage("ptx") == launched.asm["ptx"]
