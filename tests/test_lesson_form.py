"""Every lesson, present and future, keeps the lesson form (see tests/lesson_form.py)."""

from __future__ import annotations

import pytest
from lesson_form import check_code, check_lesson, figures_in, lessons

LESSONS = lessons()


def test_there_are_lessons():
    assert len(LESSONS) >= 5


@pytest.mark.parametrize("path", LESSONS, ids=[p.stem for p in LESSONS])
def test_lesson_keeps_the_form(path):
    problems = check_lesson(path)
    assert not problems, "\n".join(map(str, problems))


# Sentences of lessons 07-11 as published at commit 3eaf063, whose figures the
# output beside them contradicted (issue "lessons that cannot contradict themselves").
OLD_SENTENCES = [
    (
        "09",
        "is the fastest setting, 724 TFLOP/s, 9% ahead of the best pointer setting (664).",
        ["724 TFLOP/s", "9%"],
    ),
    ("09", "tilebook reaches 710 against 682 TFLOP/s at 4096", ["682 TFLOP/s"]),
    (
        "11",
        "tilebook (1050-1910 GB/s up to 8192 columns) and torch.compile (1180-2090",
        ["1050-1910 GB/s"],
    ),
    ("10", "for which the package runs 8 rows a program on 8\nwarps", ["8 warps"]),
    ("07", "runs out of the 255 registers a thread may have and spills", ["255 registers"]),
    ("08", "with the fitted form, 1.04x to 1.08x across our runs", ["1.04x", "1.08x"]),
    ("09", "At 700 TFLOP/s the product takes about 1.6 ms", ["700 TFLOP/s", "1.6 ms"]),
]


@pytest.mark.parametrize(("lesson", "sentence", "expected"), OLD_SENTENCES)
def test_the_scan_catches_the_published_contradictions(lesson, sentence, expected):
    assert figures_in(sentence) == expected, lesson


@pytest.mark.parametrize(
    "text",
    [
        "a 128 x 128 tile",  # a shape, not a ratio
        "bf16 and fp8 on sm_90",
        "2^26 elements of float32",
        "four warps make a warpgroup",
        "16-byte loads",
        "the 2**31 - 1 limit",
        ":datasheet:`h100.memory_bandwidth`",
    ],
)
def test_the_scan_leaves_words_and_shapes_alone(text):
    assert figures_in(text) == []


@pytest.mark.parametrize(
    ("text", "figure"),
    [
        ("runs 1.5x faster", "1.5x"),
        ("takes 17 us", "17 us"),
        ("at 42% of copy", "42%"),
        ("2.5 times faster", "2.5 times faster"),
        ("3 programs per SM", "3 programs"),
        ("3,000 GB/s", "3,000 GB/s"),
        ("64 registers", "64 registers"),
    ],
)
def test_the_scan_finds_figures(text, figure):
    assert figures_in(text) == [figure]


def test_format_specs_are_code_and_typed_figures_in_f_strings_are_not(tmp_path):
    """Under Python 3.11 an f-string is one STRING token; under 3.12 its text and the
    format specs of its fields come as separate FSTRING_MIDDLE tokens: either way a
    spec like ``.1%`` is code, and a figure typed into the text is caught."""
    path = tmp_path / "lesson.py"
    path.write_text(
        '"""A lesson."""\n\nx = 0.5\n'
        "print(f\"{x:.1%} of {x:8.2f}, {f'{x:.0%}'} and {x:>{4}.1%}\")\n"
        'print(f"{x} took 5 ms, {x:.2f} x")\n'
    )
    found = check_code(path, "lesson.py")
    assert [(p.line, p.kind, p.text) for p in found] == [(5, "typed figure in a string", "5 ms")]
