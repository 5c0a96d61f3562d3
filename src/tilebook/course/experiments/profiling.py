"""What lesson 14 reads from its own op: whether it traces, where its time goes.

The lesson compiles its SwiGLU gate, times it with both of Triton's timers and
profiles one step; it passes what those gave to these functions, which make the
tables, check the claims and build the sentences the page shows.  Runs in either
mode: it reads what the page computed or the record it shows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..claims import speedup
from ..prose import say
from ..tables import table

__all__ = ["check_replay", "explain_said", "fullgraph_table"]


def fullgraph_table(outcome: Mapping[str, str]):
    """What ``torch.compile(fullgraph=True)`` did with each version of the op."""
    rows = [{"version": k, "fullgraph": v} for k, v in outcome.items()]
    return table(rows, {"version": "version", "torch.compile(fullgraph=True)": "fullgraph"})


def explain_said(explained: Any, package: Any, bare: str):
    """The graphs and breaks ``torch._dynamo.explain`` found around the lesson's op
    (``explained``) and around ``tilebook.rms_norm`` (``package``, with the package's
    operators its graph calls); ``bare`` is what fullgraph did with the bare Function."""
    called = {str(n.target) for g in package.graphs for n in g.graph.nodes}
    return say(
        "``explain`` finds {g} graph and {b} breaks around the lesson's registered op, "
        "and {pg} graph and {pb} breaks around ``tilebook.rms_norm``, whose graph calls "
        "``{ops}``.  The bare Function is {bare} in this run.",
        g=explained.graph_count,
        b=explained.graph_break_count,
        pg=package.graph_count,
        pb=package.graph_break_count,
        ops=", ".join(sorted(t for t in called if t.startswith("tilebook."))),
        bare=bare,
    )


def check_replay(claims: Any, overhead: Any, timers: Sequence[str]):
    """Check ``claims`` on ``overhead`` (rows of ``impl``, ``timer``, ``log2n``; None
    without a record): at the small size the graph replay (``timers[1]``) times the
    Function faster than ``do_bench`` (``timers[0]``) does."""
    c = None
    if overhead is not None:
        small = [overhead.one(impl="SwiGLU.apply", log2n=12, timer=t) for t in timers]
        c = speedup(small[1], small[0])  # the graph replay against do_bench
    return claims.check(
        "At the small size, the graph replay times the Function faster",
        c is not None and c.faster,
        c.evidence("the replay", "do_bench") if c else "",
    )
