"""Each lesson's time budget, and the clock that records what a build's lessons took.

The budgets are stated here once; README.md, CONTRIBUTING.md and the site test
(``tests/test_site.py``) refer to them.  A lesson's time is its own running time in a
docs build: sphinx-gallery's "Total running time of the script".

That figure is wall time, and on a shared machine it grows with whatever else runs.
:func:`lesson_clock`, which sphinx-gallery calls before and after each lesson it
executes (``reset_modules`` in ``conf.py``), writes beside the lesson's page source
(``docs/lessons/NN_name.clock.json``) what else the build measured over the same
span: the CPU time of the build and of the processes it waited for (a lesson's
ahead-of-time compiles), and the time the build's main thread, which runs the
lesson, was ready to run but waiting for a CPU (Linux's run-queue delay,
``/proc/thread-self/schedstat``).  :func:`own_time` makes of them the time the
lesson would have taken on a machine to itself.

    python docs/_ext/lesson_time.py [docs/lessons]   # each lesson's times and budget
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

#: Seconds a lesson may run in a docs build: ``BUDGET_S[mode]`` (``"gpu"``: one GPU,
#: cold Triton cache; ``"cpu"``: Triton's interpreter on two cores), unless
#: ``OVERRIDES_S`` names the lesson.
BUDGET_S = {"gpu": 30.0, "cpu": 60.0}
#: The flagship attention lesson runs a forward and a backward of each kernel.
OVERRIDES_S = {"12_flash_attention": {"gpu": 60.0, "cpu": 90.0}}

SUFFIX = ".clock.json"

_started: dict[str, tuple[float, float, float, float | None]] = {}


def budget(lesson: str, mode: str) -> float:
    """The budget in seconds of ``lesson`` (``"NN_name"``) in a ``mode`` build."""
    return OVERRIDES_S.get(lesson, {}).get(mode, BUDGET_S[mode])


def _waited() -> float | None:
    """Seconds this thread has been ready to run but waiting for a CPU, or None where
    the kernel does not say (not Linux, or built without scheduler statistics)."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


def _now() -> tuple[float, float, float, float | None]:
    t = os.times()
    # The children's share counts the processes the build has waited for.
    return time.perf_counter(), t.user + t.system, t.children_user + t.children_system, _waited()


def lesson_clock(gallery_conf: dict, fname: str, when: str) -> None:
    """sphinx-gallery's ``reset_modules`` hook: note the clocks before a lesson runs,
    and write what they measured after it (``NN_name.clock.json``)."""
    if fname is None:
        return
    lesson = Path(fname).stem
    if when == "before":
        _started[lesson] = _now()
        return
    if lesson not in _started:
        return
    (wall0, cpu0, children0, waited0), (wall1, cpu1, children1, waited1) = (
        _started.pop(lesson),
        _now(),
    )
    clock = {
        "wall_s": wall1 - wall0,
        "cpu_s": (cpu1 - cpu0) + (children1 - children0),
        "waited_s": None if waited0 is None or waited1 is None else waited1 - waited0,
        "mode": _mode(),
    }
    gallery_dirs = gallery_conf["gallery_dirs"]
    folder = gallery_dirs if isinstance(gallery_dirs, str) else gallery_dirs[0]
    out = Path(gallery_conf["src_dir"], folder)
    out.mkdir(parents=True, exist_ok=True)
    (out / (lesson + SUFFIX)).write_text(json.dumps(clock, indent=1) + "\n")


def _mode() -> str:
    import tilebook

    return "gpu" if tilebook.is_gpu() else "cpu"


def own_time(running_s: float, clock: dict) -> float:
    """The seconds a lesson that ran ``running_s`` (sphinx-gallery's figure) would have
    taken on a machine to itself, from its ``clock``: the least of three measures, each
    at least that time, and each close to it where the others are not:

    - the running time: exact on an idle machine;
    - the running time less the main thread's wait for a CPU: close under load while
      the lesson computes in its own thread;
    - the CPU time of the build and of the processes it waited for: close under load
      while the lesson waits for its compiling processes (it exceeds the running time
      when work runs in parallel, and is then not the least).

    A lesson that computes for longer than its budget on a machine to itself is over
    by all three.  The clock spans a little more than sphinx-gallery's figure (the
    page is written inside it): the others are taken in proportion.  In a GPU build
    the running time alone counts: the GPU's work is no CPU time of the build.
    """
    if clock["mode"] != "cpu":
        return running_s
    share = min(1.0, running_s / clock["wall_s"]) if clock["wall_s"] > 0 else 1.0
    measures = [running_s, clock["cpu_s"] * share]
    if clock.get("waited_s") is not None:
        measures.append(running_s - clock["waited_s"] * share)
    return max(0.0, min(measures))


def clocks(lessons_dir: Path) -> dict[str, dict]:
    """Every lesson's clock written under ``lessons_dir`` (``docs/lessons``)."""
    return {
        p.name[: -len(SUFFIX)]: json.loads(p.read_text())
        for p in sorted(lessons_dir.glob("*" + SUFFIX))
    }


def main(lessons_dir: Path) -> int:
    found = clocks(lessons_dir)
    if not found:
        print(f"no lesson clock under {lessons_dir}: build the site first (nox -s docs)")
        return 1
    print(f"{'lesson':28} {'wall s':>7} {'waited s':>8} {'cpu s':>7} {'own s':>7} {'budget s':>8}")
    for lesson, c in found.items():
        waited = "-" if c["waited_s"] is None else f"{c['waited_s']:.1f}"
        print(
            f"{lesson:28} {c['wall_s']:7.1f} {waited:>8} {c['cpu_s']:7.1f} "
            f"{own_time(c['wall_s'], c):7.1f} {budget(lesson, c['mode']):8.0f}"
        )
    return 0


if __name__ == "__main__":
    here = Path(__file__).resolve().parents[1]
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else here / "lessons"))
