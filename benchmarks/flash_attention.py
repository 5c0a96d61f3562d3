"""Flash attention on a GPU: tilebook against SDPA (cuDNN and flash backends) and
FlexAttention, bf16, forward and backward, causal and not, windows and documents.

The measurements are defined once, for this file and lesson 12, in
:mod:`tilebook.course.experiments.flash_attention` (its docstring says what is counted and
checked): the target table is ``experiment.versus`` and ``experiment.masked`` with
more rounds, the length sweep ``experiment.lengths`` at more lengths.  The tile sweep
(``--tune``) stays here: it launches the package's kernels one by one.

    PYTHONPATH=src python benchmarks/flash_attention.py             # the target table
    PYTHONPATH=src python benchmarks/flash_attention.py --tune      # sweep tiles, then the table
    PYTHONPATH=src python benchmarks/flash_attention.py --lengths   # TFLOP/s against N (lesson 12)
    PYTHONPATH=src python benchmarks/flash_attention.py --warm flex # compile only (caches)
    PYTHONPATH=src python benchmarks/flash_attention.py --head-dims 80,96  # against cuDNN
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from typing import Any

import torch

import tilebook
from tilebook.course.bench import measure, measure_interleaved
from tilebook.course.experiments import flash_attention as experiment
from tilebook.ops import flash_attention as fa

DTYPE = experiment.DTYPE
BATCH = 4
N = 4096
# (heads, head dim) of the targets: H=16 at D=128, H=32 at D=64 (the same FLOPs).
HEADS = {128: 16, 64: 32}
MASK_N = 16384  # sliding-window and document rows
IMPLS = experiment.IMPLS
#: Interleaved rounds of the target table (the lesson uses compare()'s shorter defaults).
TIMING = {"rounds": 5, "warmup": 25, "rep": 100}

#: The baselines each kernel is held against (``run_all`` reports the best of them).
BASELINE = {
    "attn_fwd_full": ["sdpa_cudnn", "sdpa_flash", "flex"],
    "attn_fwd_causal": ["sdpa_cudnn", "sdpa_flash", "flex"],
    "attn_bwd_full": ["sdpa_cudnn", "sdpa_flash", "flex"],
    "attn_bwd_causal": ["sdpa_cudnn", "sdpa_flash", "flex"],
    "attn_fwd_window": ["flex"],
    "attn_bwd_window": ["flex"],
    "attn_fwd_documents": ["flex"],
    "attn_bwd_documents": ["flex"],
}


def _named(rows: list[dict]) -> list[dict]:
    """The experiment's rows under this benchmark's kernel names (``attn_fwd_full``, ...)."""
    short = {"forward": "fwd", "backward": "bwd"}
    return [{**r, "kernel": f"attn_{short[r['kernel']]}_{r['mask']}"} for r in rows]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


# --------------------------------------------------------------------------- rows


def run(quick: bool = False) -> list[dict]:
    """Check, then time, the target table on a GPU (tilebook.course.experiments.flash_attention)."""
    if not tilebook.is_gpu():
        raise RuntimeError("benchmarks/flash_attention.py needs a CUDA GPU")
    timing = {**TIMING, "rounds": 3 if quick else 5}
    rows: list[dict] = []
    start = time.perf_counter()

    def progress(step: str) -> None:
        # Each step compiles FlexAttention and Triton kernels first: a cold run takes
        # minutes, and a run cut short should say how far it got.
        print(f"# {step} done at {time.perf_counter() - start:.0f} s", flush=True)

    for d in (128, 64):
        for causal in (False, True):
            rows += experiment.versus(d, causal, n=N, batch=BATCH, heads=HEADS[d], host=True,
                                      **timing)  # fmt: skip
            torch.cuda.empty_cache()
            progress(f"D={d} {'causal' if causal else 'full'}")
    for kind in ("window", "documents"):
        rows += experiment.masked(kind, n=MASK_N, batch=BATCH, heads=HEADS[128], **timing)
        torch.cuda.empty_cache()
        progress(kind)
    return _named(rows)


def length_sweep(lengths=(512, 1024, 2048, 4096, 8192, 16384), d: int = 128, heads: int = 16,
                 tokens: int = 65536, impls=IMPLS, rounds: int = 2) -> list[dict]:  # fmt: skip
    """TFLOP/s against sequence length (the same number of tokens at every length, so
    the batch shrinks as N grows): lesson 12's curves, at more lengths."""
    rows = experiment.lengths(lengths, d=d, heads=heads, tokens=tokens, impls=impls,
                              rounds=rounds, rep=50)  # fmt: skip
    return _named(rows)


def table(rows: list[dict]) -> str:
    """One line per kernel and shape: TFLOP/s of each implementation and tilebook's ratio
    to each baseline (baseline time / tilebook time)."""
    names = ("tilebook", "sdpa_cudnn", "sdpa_flash", "flex")
    head = f"{'kernel':<20} {'shape':>16} " + " ".join(f"{n:>10}" for n in names)
    head += "   ratios: cudnn  flash   flex"
    out = [head]
    keys = dict.fromkeys((r["kernel"], r["shape"]) for r in rows)
    for kernel, shape in keys:
        by = {r["impl"]: r for r in rows if r["kernel"] == kernel and r["shape"] == shape}
        rate = " ".join(f"{by[n]['tflops']:10.0f}" if n in by else f"{'-':>10}" for n in names)
        ours = by["tilebook"]["median_ms"]
        ratio = " ".join(
            f"{by[n]['median_ms'] / ours:6.3f}" if n in by else f"{'-':>6}" for n in names[1:]
        )
        extra = ""
        if "tilebook_causal" in by:
            extra = f"  (full causal {by['tilebook_causal']['median_ms'] / ours:.1f}x slower)"
        out.append(f"{kernel:<20} {shape:>16} {rate}   {ratio}{extra}")
    return "\n".join(out)


# --------------------------------------------------------------------------- the sweep

# Candidates per kernel and head dim.  Shared memory and registers of each were read
# ahead of time (fa.compile_ahead, sm_90): none of these spills in its inner loop.
K = fa.KernelConfig
CANDIDATES: dict[tuple[str, int], list[fa.KernelConfig]] = {
    # 64 x 64 tiles in one warpgroup fit twice on an SM (registers and shared memory):
    # two independent programs whose softmax and products can interleave.
    ("fwd", 128): [K(128, 128, 8, 3), K(128, 64, 8, 3), K(128, 64, 8, 4), K(64, 64, 4, 2),
                   K(64, 64, 4, 3), K(64, 64, 4, 4), K(128, 128, 8, 2), K(128, 64, 4, 3),
                   K(64, 128, 4, 2)],
    ("fwd", 64): [K(128, 128, 4, 3), K(64, 64, 4, 4), K(64, 64, 4, 3), K(64, 128, 4, 3),
                  K(128, 64, 4, 3), K(128, 64, 4, 4), K(128, 128, 8, 3), K(128, 64, 8, 4)],
    ("dkdv", 128): [K(64, 128, 8, 2), K(32, 128, 8, 2), K(32, 128, 8, 3), K(64, 128, 8, 1),
                    K(32, 64, 4, 2), K(64, 64, 4, 2)],
    ("dkdv", 64): [K(64, 128, 8, 2), K(32, 128, 8, 3), K(64, 128, 8, 3), K(32, 128, 4, 3),
                   K(64, 64, 4, 3)],
    ("dq", 128): [K(128, 64, 8, 2), K(128, 64, 8, 3), K(64, 64, 4, 2), K(128, 128, 8, 2),
                  K(64, 128, 4, 2)],
    ("dq", 64): [K(128, 64, 8, 2), K(128, 64, 8, 3), K(128, 128, 8, 2), K(64, 64, 4, 3),
                 K(64, 128, 4, 3)],
}  # fmt: skip


class _Case:
    """Inputs of one (D, causal) point of the sweep, and a launcher per kernel and config."""

    def __init__(self, d: int, causal: bool):
        h = HEADS[d]
        self.d, self.causal = d, causal
        q, k, v, self.do = experiment.inputs(BATCH, h, N, d)
        self.q, self.k, self.v = (t.detach() for t in (q, k, v))
        self.scale = d**-0.5
        self.mask = fa._mask_for(causal, None, N, N)
        base = fa.pick_configs(d, DTYPE, causal, self.q.device)
        self.o, self.lse = self.fwd(base["fwd"])()
        self.delta = fa.launch_preprocess(self.o, self.do, torch.empty_like(self.lse))
        self.dq = torch.empty_like(self.q)
        self.dk, self.dv = torch.empty_like(self.k), torch.empty_like(self.v)
        self.kw = {"sm_scale": self.scale, "mask": self.mask, "document_ids": None}
        self.launcher("dkdv", base["dkdv"])()
        self.launcher("dq", base["dq"])()
        self.refs = {"fwd": [self.o], "dkdv": [self.dk.clone(), self.dv.clone()],
                     "dq": [self.dq.clone()]}  # fmt: skip

    def agrees(self, kernel: str) -> bool:
        """Whether the last launch of ``kernel`` matches the base configuration's."""
        got = {"fwd": [self.last_o], "dkdv": [self.dk, self.dv], "dq": [self.dq]}[kernel]
        return all(_rel(g, r) < 1e-2 for g, r in zip(got, self.refs[kernel], strict=True))

    def fwd(self, cfg):
        def go():
            # The Triton forward, whose tiles the sweep tunes (not the Gluon one).
            out = fa.attention_forward(
                self.q, self.k, self.v, sm_scale=self.scale, mask=self.mask,
                document_ids=None, config=cfg, gluon=False,
            )  # fmt: skip
            self.last_o = out[0]
            return out

        return go

    def launcher(self, kernel: str, cfg):
        if kernel == "fwd":
            return self.fwd(cfg)
        args = (self.q, self.k, self.v, self.do, self.lse, self.delta)
        if kernel == "dkdv":
            return lambda: fa.launch_dkdv(*args, self.dk, self.dv, config=cfg, **self.kw)
        return lambda: fa.launch_dq(*args, self.dq, config=cfg, **self.kw)

    def flops(self, kernel: str) -> int:
        f = experiment.flops(BATCH, HEADS[self.d], N, N, self.d, self.causal)
        # Of the backward's 2.5x: dK/dV does 4 of the 5 products, dQ 3 (recomputing P).
        return {"fwd": f, "dkdv": f * 2, "dq": int(f * 1.5)}[kernel]


def _literal(c: fa.KernelConfig) -> str:
    return f"_kc({c.block_m}, {c.block_n}, {c.num_warps}, {c.num_stages})"


def _candidates(kernel: str, d: int, first: int | None) -> list[fa.KernelConfig]:
    return CANDIDATES[(kernel, d)][:first]


def _warm_sweep(part: int, parts: int, kernels=("fwd", "dkdv", "dq"), first=None) -> None:
    """Compile (by launching once) every ``parts``-th candidate, starting at ``part``,
    and the committed configurations that the table will run."""
    jobs = [(kernel, d, causal, cfg) for (kernel, d) in CANDIDATES if kernel in kernels
            for causal in (False, True) for cfg in _candidates(kernel, d, first)]  # fmt: skip
    jobs += [(kernel, d, causal, fa.CONFIGS[(90, d, "bf16", causal)][kernel])
             for kernel in ("fwd", "dkdv", "dq") for d in (128, 64) for causal in (False, True)]  # fmt: skip
    cases: dict[tuple, _Case] = {}
    for i, (kernel, d, causal, cfg) in enumerate(jobs):
        if i % parts != part:
            continue
        case = cases.get((d, causal)) or cases.setdefault((d, causal), _Case(d, causal))
        try:
            case.launcher(kernel, cfg)()
        except Exception as exc:  # noqa: BLE001  (the sweep will report it)
            print(f"warm {kernel} D={d} causal={causal} {cfg}: {exc!r}"[:300], flush=True)
    torch.cuda.synchronize()


def _warm_flex() -> None:
    """Compile FlexAttention's forward and backward for every row of the table."""
    quick = {"rounds": 1, "warmup": 1, "rep": 5}
    for d in (128, 64):
        for causal in (False, True):
            experiment.versus(d, causal, n=N, batch=BATCH, heads=HEADS[d],
                              impls=("sdpa_cudnn", "flex"), **quick)  # fmt: skip
    for kind in ("window", "documents"):
        with contextlib.suppress(AssertionError):
            experiment.masked(kind, n=MASK_N, batch=BATCH, **quick)


def sweep(
    budget_s: float = 240.0, kernels=("fwd", "dkdv", "dq"), first=None
) -> tuple[list[dict], dict]:
    """Time the candidates per (kernel, D, causal) (the ``first`` of each list, or all);
    return rows and the winners."""
    deadline = time.time() + budget_s
    rows: list[dict] = []
    best: dict[tuple, fa.KernelConfig] = {}
    for d in (128, 64):
        for causal in (False, True):
            case = _Case(d, causal)
            for kernel in kernels:
                timed = []
                for cfg in _candidates(kernel, d, first):
                    if time.time() > deadline:
                        break
                    fn = case.launcher(kernel, cfg)
                    try:
                        fn()
                    except Exception as exc:  # noqa: BLE001  (out of resources, say)
                        print(f"  {kernel} D={d} causal={causal} {cfg}: {exc!r}"[:200])
                        continue
                    ok = case.agrees(kernel)
                    t = measure(fn, warmup=10, rep=40).median_ms
                    tf = case.flops(kernel) / t / 1e9
                    rows.append({"kernel": kernel, "d": d, "causal": causal,
                                 "config": _literal(cfg), "ms": t, "tflops": tf, "ok": ok})  # fmt: skip
                    print(f"  {kernel:4} D={d:3} causal={causal:d} {_literal(cfg):24} "
                          f"{t:7.3f} ms {tf:5.0f} TFLOP/s {'' if ok else 'WRONG'}", flush=True)  # fmt: skip
                    if ok:
                        timed.append((t, cfg, fn))
                timed.sort(key=lambda r: r[0])
                top = {_literal(c): fn for _, c, fn in timed[:3]}
                if len(top) > 1:  # the front runners, again, interleaved
                    final = measure_interleaved(top, rounds=3, rep=60)
                    name = min(final, key=lambda n: final[n].median_ms)
                    cfg = next(c for _, c, _ in timed if _literal(c) == name)
                elif timed:
                    cfg = timed[0][1]
                else:
                    continue
                best[(kernel, d, causal)] = cfg
                print(f"best {kernel} D={d} causal={causal}: {_literal(cfg)}", flush=True)
            del case
            torch.cuda.empty_cache()
    return rows, best


def install(best: dict[tuple, fa.KernelConfig]) -> str:
    """Put the winners in fa.CONFIGS (bf16 and fp16 alike); return them as source."""
    lines = []
    for d in (64, 128):
        for causal in (False, True):
            entry = {kernel: best.get((kernel, d, causal)) for kernel in ("fwd", "dkdv", "dq")}
            for dtype in ("bf16", "fp16"):
                cur = fa.CONFIGS[(90, d, dtype, causal)]
                cur.update({kk: c for kk, c in entry.items() if c is not None})
            cur = fa.CONFIGS[(90, d, "bf16", causal)]
            lines.append(
                f"(D={d}, causal={causal}): fwd={_literal(cur['fwd'])}, "
                f"dkdv={_literal(cur['dkdv'])}, dq={_literal(cur['dq'])}"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer interleaved rounds")
    p.add_argument(
        "--tune", action="store_true", help="sweep the tiles, use the winners, benchmark"
    )
    p.add_argument("--budget", type=float, default=240.0, help="seconds the sweep may take")
    p.add_argument("--lengths", action="store_true", help="the sequence-length sweep only")
    p.add_argument("--no-table", action="store_true", help="skip the target table")
    p.add_argument("--warm", help="compile only: 'flex' or 'sweep:PART:PARTS'")
    p.add_argument("--kernels", default="fwd,dkdv,dq", help="kernels the sweep tunes")
    p.add_argument("--first", type=int, help="only the first FIRST candidates of each list")
    p.add_argument("--json", help="write the rows to this file")
    p.add_argument("--head-dims", help="only these head dims against cuDNN, e.g. 80,96,128")
    args = p.parse_args(argv)
    print(tilebook.banner(), flush=True)
    if args.warm:
        if args.warm == "flex":
            _warm_flex()
        else:
            _, part, parts = args.warm.split(":")
            _warm_sweep(int(part), int(parts), args.kernels.split(","), args.first)
        return 0
    out: dict[str, Any] = {}

    def save():
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1)

    if args.head_dims:  # H x D = 2048 at every D (16 heads of 128)
        rows = []
        for d in map(int, args.head_dims.split(",")):
            for causal in (False, True):
                rows += experiment.versus(d, causal, n=N, batch=BATCH, heads=2048 // d,
                                          impls=("tilebook", "sdpa_cudnn"), **TIMING)  # fmt: skip
        for r in rows:
            r["kernel"] = f"{r['kernel']} {r['mask']}"
        out["head_dims"] = rows
        save()
        print(table(rows))
        return 0
    if args.tune:
        out["sweep"], best = sweep(args.budget, args.kernels.split(","), args.first)
        out["winners"] = install(best)
        print(out["winners"], flush=True)
        save()
    if args.lengths:
        out["lengths"] = length_sweep()
        save()
        print(table(out["lengths"]))
    if not args.no_table and not args.lengths:
        out["bench"] = run(quick=args.quick)
        save()
        import triton

        print(f"torch {torch.__version__}, triton {triton.__version__}, "
              f"{torch.cuda.get_device_name()}, cuDNN {torch.backends.cudnn.version()}")  # fmt: skip
        print(table(out["bench"]))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "4")
    sys.exit(main())
