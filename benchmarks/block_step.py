"""One training step of the transformer block of ``tests/block.py``: tilebook's ops
against torch's, eager and under ``torch.compile``, in interleaved rounds.

A step is the forward under ``torch.autocast(bfloat16)`` with float32 parameters, the
backward and an Adam update.  The torch block uses ``F.dropout`` (as a user writes it);
tilebook's, :func:`tilebook.dropout`.  Each round times ``STEPS`` steps of each of the
four with CUDA events; the table gives the median per step over the rounds and the
spread (20th-80th percentile), and the ratio of tilebook's to torch's.

    python benchmarks/block_step.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from block import Block

SIZE = (8, 1024, 1024, 16, 4, 4096)  # B, N, dim, heads, kv_heads, hidden
STEPS = 10


def _stepper(block: Block, compiled: bool):
    opt = torch.optim.Adam(block.parameters(), lr=1e-4)

    def loss_of(x, y, seed):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = block(x, seed)
        return F.mse_loss(out.float(), y)

    if compiled:
        loss_of = torch.compile(loss_of, fullgraph=True)

    def step(x, y, seed):
        loss = loss_of(x, y, seed)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    import tilebook

    B, N, dim = SIZE[:3]
    x = torch.randn(B, N, dim, device="cuda")
    y = torch.randn(B, N, dim, device="cuda")
    torch.manual_seed(0)
    base = Block(*SIZE[2:]).cuda()
    steppers = {}
    for ops in ("tilebook", "torch"):
        for compiled in (False, True):
            block = copy.deepcopy(base)
            block.ops, block.same_mask = ops, False
            steppers[f"{ops} {'compiled' if compiled else 'eager'}"] = _stepper(block, compiled)
    for name, step in steppers.items():  # compile and warm up
        for s in range(3):
            step(x, y, s)
        print(f"warm: {name}", file=sys.stderr, flush=True)
    times: dict[str, list[float]] = {k: [] for k in steppers}
    for r in range(args.rounds):
        order = list(steppers) if r % 2 == 0 else list(reversed(steppers))
        for name in order:
            step = steppers[name]
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for s in range(STEPS):
                step(x, y, 100 + s)
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end) / STEPS)
    print(tilebook.banner())
    print(f"block {SIZE} (B, N, dim, heads, kv_heads, hidden), bf16 autocast, Adam; "
          f"{args.rounds} rounds of {STEPS} steps")  # fmt: skip
    print(f"{'step (ms)':<20}{'median':>9}{'p20':>9}{'p80':>9}")
    med = {}
    for name, ts in times.items():
        q = statistics.quantiles(ts, n=5) if len(ts) > 1 else [ts[0]] * 4
        med[name] = statistics.median(ts)
        print(f"{name:<20}{med[name]:9.3f}{q[0]:9.3f}{q[3]:9.3f}")
    for mode in ("eager", "compiled"):
        print(f"tilebook / torch, {mode}: {med[f'tilebook {mode}'] / med[f'torch {mode}']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
