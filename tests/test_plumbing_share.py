"""The plumbing share of each lesson (tests/plumbing.py): measured, printed, held.

Issue 28 sets at most 15% of a lesson's code lines for claims, sentences made from
data, record handling, tables and widget wiring.  Most lessons are above it today, so
the test holds each at its ceiling below (the share measured when the ceiling was
set, rounded up; a literal that only plumbing reads counts since session 18): plumbing may shrink, never grow.  Lower a ceiling when a lesson
sheds plumbing; the aim is :data:`TARGET` for all.
"""

from __future__ import annotations

import textwrap

import plumbing
import pytest

TARGET = 0.15
CEILING = {
    "01_why_triton": 0.15,
    "02_programs_and_grid": 0.14,
    "03_python_to_ptx": 0.03,
    "04_pointers_masks_strides": 0.16,
    "05_dot_and_tensor_cores": 0.04,
    "06_reductions_online_softmax": 0.11,
    "07_vector_add": 0.11,
    "08_linear_act": 0.06,
    "09_matmul": 0.05,
    "10_softmax": 0.07,
    "11_rms_norm": 0.07,
    "12_flash_attention": TARGET,
    "13_autotune_pipelining_pitfalls": 0.10,
    "14_autograd_profiling": 0.08,
}
SHARES = {p.stem: plumbing.measure(p) for p in plumbing.lessons()}


def test_every_lesson_has_a_ceiling_and_the_table_prints(capsys):
    assert set(SHARES) == set(CEILING)
    with capsys.disabled():
        print("\n" + plumbing.table(list(SHARES.values())))


@pytest.mark.parametrize("lesson", sorted(CEILING))
def test_plumbing_does_not_grow(lesson):
    share = SHARES[lesson]
    assert share.share <= max(CEILING[lesson], TARGET), (
        f"{lesson}: plumbing is {share.plumbing} of {share.code} code lines "
        f"({share.share:.0%}), over its ceiling {CEILING[lesson]:.0%}"
    )


def test_the_measure_tells_plumbing_from_the_lesson(tmp_path):
    script = tmp_path / "99_x.py"
    script.write_text(
        textwrap.dedent('''\
        """Doc."""
        # %%
        # Prose is a comment: not a code line.
        import torch
        from tilebook.course.claims import Claims
        from tilebook.course.prose import say
        from tilebook.course.bench import record_or_measure

        x = torch.ones(4)
        y = x + 1
        rec = record_or_measure("r", "t", lambda: [y])
        z = rec[0] * 2
        c = Claims("99", rec)
        c.check("y is two", bool((y == 2).all()),
                "evidence")
        if z is not None:
            say("{n}", n=1)


        def helper():
            return say("x")


        SAID = {"y is two": True,
                "z is four": False}
        SIZES = (1, 2)
        c.check_all(SAID)
        sizes = [s * 2 for s in SIZES]
        say("{s}", s=SIZES)
    ''')
    )
    got = plumbing.measure(script)
    # code: import x4, x, y, rec, z, c, check x2, if, say, def, return = 15, and
    # SAID x2, SIZES, check_all, sizes, say = 21
    assert got.code == 21
    # plumbing: rec (a record call), c, check x2, the if (its body is plumbing), say,
    # the def and its return; not z, which only uses the record's data; then SAID
    # (a literal only plumbing reads), check_all and say, but not SIZES, which the
    # lesson's own code reads too
    assert got.plumbing == 8 + 4
