"""The code of a lesson's "Try this" exercises, for tests that run the solutions.

A lesson's exercises are numbered items in its "Try this" section; their code
(the checking line and the solution, in ``.. code-block:: python`` blocks) is
text in comments, never run by the page build.  :func:`exercise_blocks` gives
each exercise's blocks as runnable text, and :func:`run_blocks` runs them as a
module (an importable file, as Triton needs source) with ``print`` captured,
so a test can assert that the verdict a solution prints is right.
"""

from __future__ import annotations

import importlib.util
import re
import textwrap
from pathlib import Path


def exercise_blocks(source: str) -> dict[int, list[str]]:
    """``{number: [code block, ...]}`` for each exercise of the "Try this" section."""
    text = source[source.index("# Try this") :]
    lines = [re.sub(r"^# ?", "", line) for line in text.splitlines()]
    found: dict[int, list[str]] = {}
    number, block, indent = None, None, 0
    for line in [*lines, "end"]:
        if block is not None:
            if line.strip() and len(line) - len(line.lstrip()) <= indent:
                found[number].append(textwrap.dedent("\n".join(block)).strip() + "\n")
                block = None
            else:
                block.append(line)
                continue
        m = re.match(r"^(\d+)\. ", line)
        if m:
            number = int(m.group(1))
            found[number] = []
        if line.strip() == ".. code-block:: python":
            block, indent = [], len(line) - len(line.lstrip())
    return found


def exercise_text(source: str, number: int) -> str:
    """Exercise ``number``'s text (with its solution), comment marks removed."""
    text = source[source.index("# Try this") :]
    lines = [re.sub(r"^# ?", "", line) for line in text.splitlines()]
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{number}. "))
    end = next(
        (i for i, line in enumerate(lines[start + 1 :], start + 1) if re.match(r"^\d+\. ", line)),
        len(lines),
    )
    return "\n".join(lines[start:end])


PRINT_CAPTURE = "PRINTED = []\n\n\ndef print(*args, **kwargs):\n    PRINTED.extend(args)\n\n\n"


def run_blocks(path: Path, *code: str):
    """``code`` run as one module at ``path``; what it prints is in ``module.PRINTED``."""
    text = "\n\n".join(code)
    path.write_text(PRINT_CAPTURE + text + "\n")
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def exercise_intro(source: str) -> str:
    """The "Try this" section's text before its first exercise, on one line."""
    text = source[source.index("# Try this") :].split("\n# 1. ")[0]
    return " ".join(re.sub(r"^# ?", "", line) for line in text.splitlines()).strip()
