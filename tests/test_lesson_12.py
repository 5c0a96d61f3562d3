"""Lesson 12 (flash attention): its kernels, its widget, its measurement, its claims.

Running the whole lesson takes a while, so these tests lift its kernels and
launchers out of the script (by their source) into a small module and check them
against float64 (ragged shapes, causal and not, grouped heads, the backward) and
against the tile states the widget and FlexAttention use; compile them ahead of
time for sm_90; check the widget's data; run the shared measurement's control
flow on the CPU with stand-ins for what only a GPU has; and check that what the
lesson calls the package's kernel is the one the package launches.
"""

from __future__ import annotations

import ast
import importlib
import itertools
import json
import math
import sys
from pathlib import Path

import pytest
import torch
from lesson_source import LessonSource, write_module

import tilebook._launch as launching
import tilebook.course.aot
from tilebook.course.bench import RECORDS_DIR, Record, load_record
from tilebook.course.experiments import flash_attention as xp
from tilebook.course.widgets import embed_json
from tilebook.course.widgets_attention import (
    FULL,
    MASKED,
    SETTINGS,
    SKIP,
    TilingStepper,
    block_mask_states,
    replay,
    tile_states,
)
from tilebook.ops import flash_attention as fa

ROOT = Path(__file__).parents[1]
SCRIPT = LessonSource(12)
LIFTED = [
    "attention_kernel",
    "FWD_GPU",
    "FWD",
    "launch",
    "attention",
    "visible_mask",
    "reference",
    "attention_fwd_kernel",
    "attention_fwd",
    "dkdv_kernel",
    "dq_kernel",
    "BWD",
    "attention_bwd",
    "packed",
    "documents_in_window",
    "as_score_mod",
]


def _lift(folder: Path, name: str, replace: tuple[str, str] | None = None, register=False):
    """The lifted definitions as a module (an importable file, as Triton needs source)."""
    head = (
        "import math\nimport torch\nimport triton\nimport triton.language as tl\n"
        "import tilebook\nimport tilebook.ops.flash_attention as fa\n"
        "LOG2E = math.log2(math.e)\n\n"
    )
    body = "\n\n".join(SCRIPT.source(n) for n in LIFTED)
    if replace is not None:
        assert replace[0] in body
        body = body.replace(*replace)
    return write_module(folder / f"{name}.py", head + body + "\n", register=register)


@pytest.fixture(scope="module")
def lesson(tmp_path_factory):
    # Registered: torch.compile (FlexAttention's tests below) imports it by name.
    module = _lift(tmp_path_factory.mktemp("lesson12"), "lesson12_lifted", register=True)
    yield module
    sys.modules.pop(module.__name__, None)


# float32 products: exact under the interpreter; a GPU's tl.dot takes them as TF32.
TOL = 1e-5 if tilebook.is_interpreter() else 5e-3


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref).norm() / ref.norm()).item()


def _qkv(B, H, Hkv, Nq, Nk, D, device):
    make = lambda h, n: torch.randn(B, h, n, D, device=device)
    return make(H, Nq), make(Hkv, Nk), make(Hkv, Nk)


# (B, H, Hkv, Nq, Nk, D): one tile, ragged tiles with Nq < Nk and Nq == Nk, and grouped
# heads (G = 1, 2, 4) against the interpreter's tiles of 16.
SHAPES = [(1, 1, 1, 16, 16, 16), (2, 2, 2, 21, 50, 16), (1, 4, 2, 33, 33, 32), (1, 4, 1, 7, 40, 16)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_lesson_kernels_match_float64(lesson, device, shape, causal):
    q, k, v = _qkv(*shape, device)
    want, want_lse = lesson.reference(q, k, v, causal=causal)
    o, lse = lesson.attention_fwd(q, k, v, causal)
    assert _rel(o, want) < TOL and _rel(lse, want_lse) < TOL
    do = torch.randn_like(q)
    got = lesson.attention_bwd(q, k, v, o, lse, do, causal)
    x64 = [t.double().requires_grad_() for t in (q, k, v)]
    ref = torch.autograd.grad(lesson.reference(*x64, causal=causal)[0], x64, do.double())
    for name, g, r in zip(("dq", "dk", "dv"), got, ref, strict=True):
        assert _rel(g, r) < TOL, name
    if shape[1] == shape[2] and not causal:  # the smallest kernel: all keys, any layout
        assert _rel(lesson.attention(q, k, v), want) < TOL
        qt = q.transpose(1, 2).contiguous().transpose(1, 2)
        assert _rel(lesson.attention(qt, k, v), want) < TOL


def test_a_wrong_kernel_fails_the_check(tmp_path, device):
    """The check catches the forward without its rescale (the widget's wrong setting)."""
    # Ones in alpha's shape; keys in several tiles (a GPU's too), or nothing rescales.
    alpha = "            alpha = tl.math.exp2({} - m_new)"
    wrong = (alpha.format("m_i"), alpha.format("m_new"))
    broken = _lift(tmp_path, "lesson12_no_rescale", wrong)
    q, k, v = _qkv(1, 1, 1, 40, 600, 16, device)
    assert _rel(broken.attention_fwd(q, k, v)[0], broken.reference(q, k, v)[0]) > 1e-2


@pytest.mark.parametrize("tiles", [(16, 16), (32, 16), (16, 32), (128, 64)])
@pytest.mark.parametrize(("nq", "nk"), [(64, 64), (37, 53), (200, 200), (50, 130)])
def test_the_stage_split_is_the_tile_states(lesson, tiles, nq, nk):
    """The forward's loop bounds (full tiles, then masked ones up to ``hi``, nothing
    past it) classify the key tiles as :func:`tile_states` does from the mask."""
    bm, bn = tiles
    for causal in (False, True):
        reach = nk - nq if causal else nk
        want = tile_states(lesson.visible_mask(nq, nk, causal=causal), bm, bn)
        for t in range(want.shape[0]):
            m0 = t * bm
            full = min(m0 + reach + 1, nk) // bn * bn
            hi = min(min(m0 + bm, nq) + reach, nk)
            got = [FULL if j * bn < full else MASKED if j * bn < hi else SKIP
                   for j in range(want.shape[1])]  # fmt: skip
            assert got == want[t].tolist(), (causal, t)


def test_visible_mask_matches_the_package_contract(lesson):
    nq, nk = 9, 14
    i = torch.arange(nq)[:, None] + nk - nq
    j = torch.arange(nk)[None, :]
    assert torch.equal(lesson.visible_mask(nq, nk, causal=True), j <= i)
    window = lesson.visible_mask(nq, nk, window=(2, 1))
    assert torch.equal(window, (j >= i - 2) & (j <= i + 1))
    both = lesson.visible_mask(nq, nk, causal=True, window=(3, 5))
    assert torch.equal(both, (j <= i) & (j >= i - 3))
    docs = lesson.packed(3, 6)
    same = lesson.visible_mask(9, 9, document_ids=docs)[0]
    assert same[0, 2] and not same[2, 3] and same[8, 3]


EAGER_FLEX = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


@EAGER_FLEX
def test_both_definitions_of_the_mask_agree(lesson):
    """tilebook's arguments and FlexAttention's mask_mod: the same pairs, the same tiles."""
    from torch.nn.attention import flex_attention as flex

    docs = lesson.packed(5, 30, 13, 16)
    n = docs.shape[1]
    mod = lesson.documents_in_window(docs, 11)
    ours = lesson.visible_mask(n, n, True, (11, None), document_ids=docs)[0]
    theirs = flex.create_mask(mod, 1, 1, n, n, device="cpu")[0, 0]
    assert torch.equal(ours, theirs)
    for block in (8, 16):
        blocks = flex.create_block_mask(mod, 1, 1, n, n, "cpu", block)
        assert torch.equal(block_mask_states(blocks), tile_states(ours, block, block))
    q, k, v = _qkv(1, 2, 2, n, n, 16, "cpu")
    out = flex.flex_attention(q, k, v, score_mod=lesson.as_score_mod(mod))
    ref = lesson.reference(q, k, v, causal=True, window=(11, None), document_ids=docs)[0]
    assert _rel(out, ref) < 1e-5


# --------------------------------------------------------------------------- the widget


def _brute_states(mask: torch.Tensor, bm: int, bn: int) -> torch.Tensor:
    nq, nk = mask.shape
    out = torch.empty(math.ceil(nq / bm), math.ceil(nk / bn), dtype=torch.int64)
    for i in range(out.shape[0]):
        for j in range(out.shape[1]):
            tile = mask[i * bm : (i + 1) * bm, j * bn : (j + 1) * bn]
            whole = tile.shape[1] == bn  # a tile reaching past Nk is never full
            out[i, j] = SKIP if not tile.any() else FULL if tile.all() and whole else MASKED
    return out


def test_tile_states_by_brute_force(lesson):
    docs = lesson.packed(6, 26, 16)
    masks = [
        lesson.visible_mask(48, 48),
        lesson.visible_mask(37, 53, causal=True),
        lesson.visible_mask(48, 48, causal=True, window=(15, None)),
        lesson.visible_mask(48, 48, causal=True, document_ids=docs)[0],
        lesson.visible_mask(30, 30, window=(3, 2)),
    ]
    for mask in masks:
        for bm, bn in ((8, 8), (16, 8), (5, 7)):
            assert torch.equal(tile_states(mask, bm, bn), _brute_states(mask, bm, bn))
    with pytest.raises(TypeError):
        tile_states(torch.ones(4, 4), 2, 2)


@pytest.fixture(scope="module")
def demo(lesson):
    torch.manual_seed(1)
    q, k, v = (torch.randn(48, 16, dtype=torch.float64) for _ in range(3))
    scores = 2 * math.log2(math.e) * (q @ k.T) / 4
    docs = lesson.packed(6, 26, 16)
    masks = {
        "full": lesson.visible_mask(48, 48),
        "causal": lesson.visible_mask(48, 48, causal=True),
        "causal window": lesson.visible_mask(48, 48, causal=True, window=(15, None)),
        "causal documents": lesson.visible_mask(48, 48, True, document_ids=docs)[0],
    }
    return masks, scores, v


def test_the_stepper_replays_the_kernel(demo):
    masks, scores, v = demo
    for name, mask in masks.items():
        right = replay(scores, v, mask, 8, 8, "as written")
        assert all(t["error"] < 1e-12 for t in right), name
        assert all(t["visited"] == t["needed"] for t in right)
        slow = replay(scores, v, mask, 8, 8, "no skip")
        assert all(t["error"] < 1e-12 for t in slow)
        if name != "full":  # every mask but the full one has tiles to skip
            assert any(t["visited"] > t["needed"] for t in slow), name
            unmasked = replay(scores, v, mask, 8, 8, "no mask on partial tiles")
            assert max(t["error"] for t in unmasked) > 1e-3, name
        assert max(t["error"] for t in replay(scores, v, mask, 8, 8, "no rescale")) > 1e-3
    # The running maximum only grows, the sum is positive once a key is seen.
    steps = replay(scores, v, masks["causal"], 8, 8, "as written")[5]["steps"]
    for a, b in itertools.pairwise(steps):
        assert all(y >= x for x, y in zip(a["m"], b["m"], strict=True))
    assert [s["tile"] for s in steps] == list(range(6))


def test_the_stepper_widget_data(demo):
    masks, scores, v = demo
    w = TilingStepper(masks, scores, v, 8, 8, caption="test")
    data = w.data()
    assert list(data["settings"]) == list(SETTINGS)
    assert set(SETTINGS.values()) == {"right", "wrong", "slow"}
    assert data["states"]["causal"][0] == [MASKED, SKIP, SKIP, SKIP, SKIP, SKIP]
    json.loads(embed_json(data))  # no NaN, no infinity
    html = w._repr_html_()
    assert 'data-tilebook-widget="tiling"' in html and "root.dataset.value" in html
    with pytest.raises(ValueError, match="boolean tensor"):
        TilingStepper({"bad": torch.ones(3, 3, dtype=torch.bool)}, scores, v, 8, 8, caption="")


# ----------------------------------------------------------------- the package's kernels


def test_what_the_lesson_calls_the_package_s_kernel_is_the_package_s(monkeypatch, device):
    """The lesson compiles ``compile_ahead("fwd")`` as the package's forward: it must be
    the kernel that ``attention_forward`` (and so ``tilebook.flash_attention``) launches."""
    launched = []
    real_launch = launching.launch  # the one launch of every plan's steps
    monkeypatch.setattr(launching, "launch", lambda kernel, *a, **k: (launched.append(kernel),
                                                                      real_launch(kernel, *a, **k))[1])  # fmt: skip
    launching.PLANS.clear()  # a kept plan of an earlier call would launch without it
    dtype = torch.bfloat16 if tilebook.is_gpu() else torch.float32  # D 32: not Gluon's
    q, k, v = (torch.randn(1, 2, 20, 32, device=device, dtype=dtype) for _ in range(3))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    fa.flash_attention(q, k, v, causal=True).sum().backward()
    assert launched[0] is fa._fwd_kernel
    assert {fa._bwd_dkdv_kernel, fa._bwd_dq_kernel} <= set(launched)
    specs = []
    monkeypatch.setattr(
        tilebook.course.aot, "compile_kernel", lambda spec, *a, **k: specs.append(spec)
    )
    fa.compile_ahead("fwd", fa.CONFIGS[(90, 128, "bf16", True)]["fwd"], band=True)
    module, name = specs[0].split(":")
    assert getattr(importlib.import_module(module), name) is fa._fwd_kernel
    assert 'fa.compile_ahead("fwd"' in SCRIPT.text
    # On an H100 the package's forward is the Gluon one: the lesson lists that too.
    assert "attention_hopper.compile_ahead(128" in SCRIPT.text


def test_lesson_kernels_compile_for_sm90(lesson):
    """The GPU paths (tiles, warps, stages of the page's GPU run) compile for an H100."""
    from tilebook.course.aot import compile_many

    bf16 = "*bf16"
    ints = dict.fromkeys(("G", "Nq", "Nk", "reach"), "i32")
    fwd_sig = dict.fromkeys(("q_ptr", "k_ptr", "v_ptr", "o_ptr"), bf16)
    a_sig = fwd_sig | dict.fromkeys(("stride_qb", "stride_qh", "stride_qn", "stride_kb",
                                     "stride_kh", "stride_kn", "H", "Nq", "Nk"), "i32")  # fmt: skip
    bwd_common = dict.fromkeys(("q_ptr", "k_ptr", "v_ptr", "do_ptr"), bf16)
    bwd_common |= {"lse_ptr": "*fp32", "delta_ptr": "*fp32"}
    scales = ints | {"sm_scale": "fp32", "qk_scale": "fp32"}
    fb = lesson.FWD_GPU
    bb = (64, 64, 8, 2)  # the lesson's BWD on a GPU
    jobs = {
        "attention": {"kernel": lesson.attention_kernel, "signature": a_sig | {"qk_scale": "fp32"},
                      "constexprs": {"HEAD_DIM": 128, "BLOCK_M": fb[0], "BLOCK_N": fb[1]},
                      "num_warps": fb[2], "num_stages": fb[3]},
        "dkdv": {"kernel": lesson.dkdv_kernel,
                 "signature": bwd_common | {"dk_ptr": bf16, "dv_ptr": bf16} | scales,
                 "constexprs": {"HEAD_DIM": 128, "BLOCK_M": bb[0], "BLOCK_N": bb[1]},
                 "num_warps": bb[2], "num_stages": bb[3]},
        "dq": {"kernel": lesson.dq_kernel, "signature": bwd_common | {"dq_ptr": bf16} | scales,
               "constexprs": {"HEAD_DIM": 128, "BLOCK_M": bb[0], "BLOCK_N": bb[1]},
               "num_warps": bb[2], "num_stages": bb[3]},
    }  # fmt: skip
    assert _constant_bwd_gpu() == bb
    compiled = compile_many(jobs, arch=90)
    for name, k in compiled.items():
        assert k.instructions("HGMMA")["HGMMA"] > 0, name
        assert 0 < k.registers <= 255 and k.shared_bytes < 227 * 1024, name


def _constant_bwd_gpu():
    call = SCRIPT.node("BWD").value
    (gpu,) = [kw.value for kw in call.keywords if kw.arg == "gpu"]
    return ast.literal_eval(gpu)


# ------------------------------------------------------------------- the measurement


def _calls(tree: ast.AST) -> set[str]:
    return {ast.unparse(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}


def test_no_table_or_sentence_hides_inside_a_block():
    """sphinx-gallery shows a cell's last expression only: a ``table(...)`` or ``say(...)``
    under an ``if`` or a loop never reaches the page (the H100 build lost two so)."""
    for node in SCRIPT.tree.body:
        if not isinstance(node, ast.If | ast.For | ast.While | ast.With):
            continue
        for inner in ast.walk(node):
            if isinstance(inner, ast.Expr) and isinstance(inner.value, ast.Call):
                assert ast.unparse(inner.value.func) not in {"table", "say"}, ast.unparse(inner)


def test_lesson_and_benchmark_share_one_definition():
    assert "xp.lengths" in _calls(SCRIPT.tree)
    bench = ast.parse((ROOT / "benchmarks" / "flash_attention.py").read_text())
    funcs = {n.name: n for n in bench.body if isinstance(n, ast.FunctionDef)}
    assert {"experiment.versus", "experiment.masked"} <= _calls(funcs["run"])
    assert "experiment.lengths" in _calls(funcs["length_sweep"])
    for calls in (_calls(SCRIPT.tree), _calls(funcs["run"]), _calls(funcs["length_sweep"])):
        assert not {"measure", "measure_interleaved", "compare", "do_bench"} & calls


def test_experiment_arithmetic():
    assert xp.flops(4, 16, 4096, 4096, 128, False) == 4 * 4 * 16 * 4096 * 4096 * 128
    assert xp.flops(1, 1, 8, 8, 16, True) * 2 == xp.flops(1, 1, 8, 8, 16, False)
    assert xp.shapes([1024, 4096, 16384], 16384) == [(16, 1024), (4, 4096), (1, 16384)]
    assert xp.shapes([512], 100) == [(1, 512)]
    i, j = torch.arange(100)[:, None], torch.arange(100)[None, :]
    causal = j <= i
    assert xp.visible_pairs(100) == int(causal.sum())
    assert xp.visible_pairs(100, window=7) == int((causal & (i - j < 7)).sum())
    docs = xp.documents(2, 3000)
    assert docs.shape == (2, 3000) and (docs[:, 1:] >= docs[:, :-1]).all()
    _, sizes = torch.unique_consecutive(docs[0], return_counts=True)
    assert sizes[:-1].min() >= 256 and sizes.max() <= 4096
    n = torch.arange(3000)
    seen = (docs[:, :, None] == docs[:, None, :]) & (n[None, :] <= n[:, None])
    assert xp.visible_pairs(3000, docs=docs) == int(seen.sum())


def _timed(impl, ms, spread=0.01, **fields):
    return {"impl": impl, "median_ms": ms, "p20_ms": ms * (1 - spread),
            "p80_ms": ms * (1 + spread), **fields}  # fmt: skip


def test_verdicts_and_targets_read_the_spread():
    rows = []
    for n, ours, cudnn in ((1024, 1.0, 1.5), (4096, 1.0, 0.8), (16384, 1.0, 1.001)):
        for kernel in ("forward", "backward"):
            for mask in ("full", "causal"):
                f = {"kernel": kernel, "mask": mask, "n": n}
                rows += [_timed("tilebook", ours, **f), _timed("sdpa_cudnn", cudnn, **f)]
    rec = Record("t", "t", rows, {})
    words = xp.verdicts(rec, "tilebook", "sdpa_cudnn", "cuDNN", kernel="forward", mask="full")
    assert words == "faster than cuDNN at 1024; slower than it at 4096; level with it at 16384"
    assert xp.verdicts(rec, "tilebook", "flex", kernel="forward", mask="full") == "not timed"
    table = xp.verdict_rows(rec, {"sdpa_cudnn": "cuDNN"})
    assert [r["case"] for r in table][:2] == ["forward, full", "forward, causal"]
    assert table[0]["cuDNN"] == "faster at 1024; slower at 4096; level at 16384"
    goals = {(g["kernel"], g["mask"], g["baseline"]): g for g in xp.targets(rec, 4096)}
    assert set(goals) == {(k, m, "sdpa_cudnn") for k in ("forward", "backward")
                          for m in ("full", "causal")}  # fmt: skip
    assert goals[("forward", "full", "sdpa_cudnn")]["verdict"] == "missed"  # 0.8 < 0.90
    assert goals[("backward", "full", "sdpa_cudnn")]["verdict"] == "met"  # 0.8 > 0.75


def test_a_series_keeps_its_colour_from_plot_to_plot():
    """The forward plots hold this page's kernel, the backward plots do not: every
    implementation must keep its colour across them (cuDNN's once took
    FlashAttention-2's in the backward), and two never share one."""
    from tilebook.course.plots import plot_record

    order = SCRIPT.constant("IMPLS")
    rows = []
    for kernel, impls in (("forward", order), ("backward", [i for i in order if i != "lesson"])):
        for n in (1024, 4096):
            rows += [_timed(i, 1.0, kernel=kernel, mask="full", n=n, tflops=100.0) for i in impls]
    rec = Record("t", "t", rows, {})
    colours = []
    for kernel in ("forward", "backward"):
        fig = plot_record(rec, x="n", y="tflops", series="impl", order=order,
                          where={"kernel": kernel, "mask": "full"})  # fmt: skip
        colours.append({line.get_label(): line.get_color() for line in fig.axes[0].lines})
    forward, backward = colours
    assert set(forward) == set(order) and set(backward) == set(order) - {"lesson"}
    assert all(backward[i] == forward[i] for i in backward)
    assert len(set(forward.values())) == len(forward)


@EAGER_FLEX
@pytest.mark.skipif(tilebook.is_gpu(), reason="CPU stand-ins: see the GPU test below")
def test_the_measurement_s_control_flow_on_a_cpu(monkeypatch):
    """``versus``, ``lengths`` and ``masked`` end to end under the interpreter, with CPU
    stand-ins for what needs a GPU (cuDNN, compiled Flex, timing): every check runs,
    the rows come out as the lesson and the benchmark read them."""
    from torch.nn.attention import flex_attention as flex

    def inputs(batch, heads, n, d, seed=0):
        g = torch.Generator().manual_seed(seed)
        q, k, v, do = (torch.randn(batch, heads, n, d, generator=g) for _ in range(4))
        return q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), do

    def fake_compare(impls, *, flops, **fields):
        fields = {k: v for k, v in fields.items() if k not in ("rounds", "warmup", "rep")}
        rows = []
        for name, fn in impls.items():
            fn()
            f = flops[name] if isinstance(flops, dict) else flops
            rows.append({**fields, **_timed(name, 1.0), "flops": f, "tflops": f / 1e9})
        return rows

    sdpa = lambda backend: lambda q, k, v, causal: torch.nn.functional.scaled_dot_product_attention(
        q, k, v, is_causal=causal)  # fmt: skip
    monkeypatch.setattr(xp, "inputs", inputs)
    monkeypatch.setattr(xp, "compare", fake_compare)
    monkeypatch.setattr(xp, "sdpa", sdpa)

    def flex_on_cpu(q, k, v, block_mask=None):  # FlexAttention has no CPU backward
        n, mask = q.shape[2], None
        if block_mask is not None:
            mask = flex.create_mask(block_mask.mask_mod, q.shape[0], 1, n, n, device="cpu")
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    monkeypatch.setattr(xp, "flex", lambda: flex_on_cpu)
    monkeypatch.setattr(xp, "block_mask", lambda mod, b, n, compiled=False:
                        flex.create_block_mask(mod, b, None, n, n, device="cpu"))  # fmt: skip
    monkeypatch.setattr(xp, "documents", lambda b, n, seed=0: torch.tensor([[0] * 20 + [1] * 28]))
    monkeypatch.setattr(xp, "WINDOW", 9)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    extra = {"lesson": lambda q, k, v, causal: fa.flash_attention(q, k, v, causal=causal)}
    rows = xp.lengths([24, 48], d=32, heads=2, tokens=48, flex_at=[48], extra=extra)
    only_causal = xp.lengths([48], d=32, heads=2, tokens=48, flex_at=[48], flex_masks=[True])
    flexed = {(r["kernel"], r["mask"]) for r in only_causal if r["impl"] == "flex"}
    assert flexed == {("forward", "causal"), ("backward", "causal")}
    got = [(r["kernel"], r["mask"], r["n"], r["impl"]) for r in rows]
    assert got[:5] == [("forward", "full", 24, i)
                       for i in ("tilebook", "sdpa_cudnn", "sdpa_flash", "lesson")] + [
                       ("backward", "full", 24, "tilebook")]  # fmt: skip
    assert ("forward", "causal", 48, "flex") in got and ("forward", "causal", 24, "flex") not in got
    assert not [g for g in got if g[0] == "backward" and g[3] == "lesson"]
    assert {r["batch"] for r in rows if r["n"] == 24} == {2}
    causal = next(r for r in rows if r["mask"] == "causal" and r["kernel"] == "forward")
    assert causal["flops"] == xp.flops(2, 2, 24, 24, 32, True)
    for kind in ("window", "documents"):
        rows = xp.masked(kind, d=32, heads=2, n=48, batch=1)
        assert [r["impl"] for r in rows] == ["tilebook", "flex", "tilebook_causal"] * 2
    with pytest.raises(ValueError, match="sdpa_cudnn"):
        xp.versus(16, False, n=16, batch=1, heads=1, impls=("tilebook",))


# ----------------------------------------------------------------------- the record


def test_the_record_holds_the_lesson_s_grid():
    rec = load_record("lesson12_lengths", RECORDS_DIR)
    if rec is None:
        pytest.skip("lesson12_lengths is recorded by the GPU docs build (not yet committed)")
    lengths = ast.literal_eval(SCRIPT.node("LENGTHS").value.elts[0])
    assert rec.provenance["mode"] == "gpu"
    assert rec.values("n") == lengths
    for r in rec.rows:
        assert r["p20_ms"] <= r["median_ms"] <= r["p80_ms"] and r["tflops"] > 0
        assert r["batch"] * r["n"] == 16384 and r["d"] == 128 and r["heads"] == 16
    assert set(rec.values("impl", kernel="backward")) >= {"tilebook", "sdpa_cudnn", "sdpa_flash"}
    assert set(rec.values("n", impl="flex")) <= {4096}  # records before FlexAttention moved out


def test_the_page_s_sweep_passes_the_measurement_s_checks(monkeypatch):
    """The sweep's arguments get past versus()'s checks (they run only on a GPU, where
    a wrong list of implementations once stopped the build)."""
    timed = ast.literal_eval(SCRIPT.node("TIMED").value)

    class Reached(Exception):
        pass

    def stop(*args, **kwargs):
        raise Reached

    monkeypatch.setattr(xp, "inputs", stop)
    with pytest.raises(Reached):
        xp.lengths([64], tokens=64, impls=timed, extra={"lesson": None})
    with pytest.raises(ValueError, match="sdpa_cudnn"):
        xp.lengths([64], tokens=64, impls=(*timed, "lesson"))


@pytest.mark.gpu
def test_the_measurement_runs_on_a_gpu():
    rows = xp.versus(64, True, n=256, batch=1, heads=2, impls=("tilebook", "sdpa_cudnn"),
                     rounds=1, warmup=1, rep=3)  # fmt: skip
    assert [(r["kernel"], r["impl"]) for r in rows] == [
        ("forward", "tilebook"), ("forward", "sdpa_cudnn"),
        ("backward", "tilebook"), ("backward", "sdpa_cudnn")]  # fmt: skip
    assert all(r["tflops"] > 0 for r in rows)
