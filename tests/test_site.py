"""Build the whole site on CPU and read lesson 07's page as HTML."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
import site_build

pytestmark = pytest.mark.site

LESSON = "lessons/03_real_kernels/07_vector_add.html"
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def page(built_site):
    html_dir, _ = built_site
    return html_dir, (html_dir / LESSON).read_text()


def test_build_says_which_mode(built_site):
    _, log = built_site
    assert "tilebook: CPU mode" in log


#: A terminal colour code: Sphinx colours its log when FORCE_COLOR is set (nox sets it).
COLOUR = re.compile(r"\x1b\[[0-9;]*m")


def test_build_log_carries_no_noise(built_site):
    """Lines every build printed that need no action (issue 11): none is left."""
    log = COLOUR.sub("", built_site[1])
    for noise in (
        "[autosummary] generating autosummary",
        "Using Sphinx-Gallery to convert rst",
        "The configuration has changed",
        "myst v",
        "reference_url",
        "uv binary not found",
        "gpuGetDeviceCount failed",  # Kineto (torch.profiler, lesson 14) without a GPU
        "profiler_start",
    ):
        assert noise not in log, noise


def test_a_rebuild_with_nothing_changed_runs_and_reads_nothing(built_site):
    """A second build over the first (the maintainer's warm ``nox -s docs``) executes no
    lesson, reads no page again and opens with no "configuration has changed".  The
    session's build runs it right after the first (tests/site_build.py)."""
    html_dir, _ = built_site
    report = html_dir.parent / "rebuild.json"
    if not report.is_file():
        pytest.skip("TILEBOOK_BUILT_SITE names a build that was not rebuilt")
    rebuild = json.loads(report.read_text())
    log = COLOUR.sub("", rebuild["log"])
    assert rebuild["returncode"] == 0, log[-3000:]
    # sphinx-gallery writes a lesson's page source when it executes the lesson.
    assert len(rebuild["before"]) == 14
    assert rebuild["after"] == rebuild["before"], "a lesson ran again"
    assert "updating environment: 0 added, 0 changed, 0 removed" in log, log[-3000:]
    assert "The configuration has changed" not in log


def test_correctness_table_printed_and_all_ok(page):
    _, html = page
    assert "vector_add vs float64 reference" in html
    assert "max abs err" in html and "rel err" in html
    # The printed table (not the code that makes it): from its header to the end of
    # that output block.
    start = html.index("max abs err")
    start = html.rindex("vector_add vs float64 reference", 0, start)
    block = html[start : html.index("</pre>", start)]
    rows = [line for line in block.splitlines() if "n=" in line or "strided" in line]
    assert len(rows) >= 8
    assert all(line.rstrip().endswith("ok") for line in rows), rows
    assert "FAIL" not in block


def test_plot_image_from_the_committed_record(page):
    html_dir, html = page
    images = re.findall(r'src="([^"]*sphx_glr_07_vector_add_\d+\.png)"', html)
    assert images, "the lesson page shows no plot"
    for src in images:
        assert (html_dir / "lessons" / "03_real_kernels" / src).resolve().exists(), src
    # CPU build: the plot comes from a GPU record and says where it was measured.
    assert "recorded on NVIDIA" in html


def test_widget_markup_is_self_contained(page):
    _, html = page
    assert 'data-tilebook-widget="sweep"' in html
    start = html.index('data-tilebook-widget="sweep"')
    widget = html[start : html.index("</script></div>", start)]
    assert 'type="application/json"' in widget
    assert not re.search(r"(src|href)=\"https?://", widget), "widget must not load external URLs"


def test_downloads_py_and_ipynb(page):
    html_dir, html = page
    for suffix in (".py", ".ipynb"):
        m = re.search(r'href="([^"]*07_vector_add' + re.escape(suffix) + r')"', html)
        assert m, f"no {suffix} download link"
        assert (html_dir / "lessons" / "03_real_kernels" / m.group(1)).resolve().exists()


def _lesson_time():
    """docs/_ext/lesson_time.py: the budgets, and what the build's clock made of them."""
    spec = importlib.util.spec_from_file_location(
        "lesson_time", ROOT / "docs" / "_ext" / "lesson_time.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


lesson_time = _lesson_time()


def _running_time(html: str) -> float | None:
    """Seconds of sphinx-gallery's "Total running time of the script", or None."""
    m = re.search(
        r"Total running time of the script:.*?\((\d+) minutes ([\d.]+) seconds\)", html, re.S
    )
    return None if m is None else int(m.group(1)) * 60 + float(m.group(2))


def _over_budget(html_dir: Path, pages: list[Path]) -> tuple[dict, list[str]]:
    """The lessons of ``pages`` over their CPU budget (or not run in this build), and a
    line per lesson with its times."""
    clocks = lesson_time.clocks(site_build.source_tree(html_dir.parent) / "docs" / "lessons")
    over, lines = {}, []
    for page in pages:
        name, running = page.stem, _running_time(page.read_text())
        clock = clocks.get(name)
        if not running:  # a lesson that did not run reports 0
            over[name] = "not run in this build"
            continue
        if clock is None:
            over[name] = "ran without the build's clock (docs/_ext/lesson_time.py)"
            continue
        own = lesson_time.own_time(running, clock)
        limit = lesson_time.budget(name, "cpu")
        line = f"{own:.1f} s of {limit:.0f} s (running time {running:.1f} s, clock {clock})"
        lines.append(f"{name}: {line}")
        if clock["mode"] != "cpu":
            over[name] = "not a CPU build"
        elif own > limit:
            over[name] = line
    return over, lines


def test_running_time_is_parsed_and_within_the_budget(page):
    html_dir, html = page
    assert _running_time(html), "no running time on the page (or 0 s: the lesson did not run)"
    over, _ = _over_budget(html_dir, [html_dir / LESSON])
    assert not over, over


def test_every_lesson_within_the_cpu_budget(built_site):
    """Every lesson ran in this build, each within its CPU budget
    (``lesson_time.BUDGET_S``, docs/_ext/lesson_time.py).

    The figure held to the budget is the lesson's own time, not its wall time: the
    tests run beside the build and the machine may run other work, and on a busy
    2-core machine lessons went over by the wall clock alone.  The build's clock
    (``lesson_time.lesson_clock``) measures, over each lesson of this same build, the
    time its main thread waited for a CPU and the CPU time of the build and of the
    processes it waited for; :func:`lesson_time.own_time` takes the least of the
    running time, the running time less that wait, and that CPU time.  Each is at
    least what the lesson takes on a machine to itself, so a lesson that computes for
    three times its budget on an idle machine is over by all three and fails, while
    one that only waited for the CPU does not.
    """
    html_dir, _ = built_site
    pages = sorted((html_dir / "lessons").glob("*/[0-9][0-9]_*.html"))
    assert len(pages) >= 5, [p.name for p in pages]
    over, lines = _over_budget(html_dir, pages)
    assert not over, "over the CPU budget (or not run):\n" + "\n".join(
        [*(f"{name}: {why}" for name, why in over.items()), "every lesson that ran:", *lines]
    )


def test_the_budget_check_fails_a_slow_lesson_and_forgives_a_wait():
    """:func:`lesson_time.own_time` on the clocks of three made-up lessons."""
    limit = lesson_time.budget("07_vector_add", "cpu")
    idle_slow = {"wall_s": 3 * limit, "cpu_s": 3 * limit, "waited_s": 0.0, "mode": "cpu"}
    assert lesson_time.own_time(3 * limit, idle_slow) > limit
    # Twice the budget by the wall clock, half of it waiting for a CPU.
    waited = {"wall_s": 2 * limit, "cpu_s": 0.9 * limit, "waited_s": limit, "mode": "cpu"}
    assert lesson_time.own_time(2 * limit, waited) <= limit
    # Work in parallel on an idle machine: more CPU time than wall time, which counts.
    parallel = {"wall_s": 1.2 * limit, "cpu_s": 2 * limit, "waited_s": 0.0, "mode": "cpu"}
    assert lesson_time.own_time(1.1 * limit, parallel) > limit


def test_every_lesson_shows_its_check_widget_plots_and_downloads(built_site):
    """Each lesson page was executed and shows what every lesson must: a float64
    correctness table that passed, a widget, its two downloads and, where its script
    draws a figure, the figure or the message naming the record it lacks."""
    html_dir, _ = built_site
    problems = {}
    for page in sorted((html_dir / "lessons").glob("*/[0-9][0-9]_*.html")):
        html = page.read_text()
        missing = []
        tables = [b for b in re.findall(r"<pre>(.*?)</pre>", html, re.S) if "max abs err" in b]
        if not tables or any("FAIL" in t for t in tables):
            missing.append("a passing correctness table")
        if "data-tilebook-widget" not in html:
            missing.append("a widget")
        (script,) = ROOT.glob(f"gallery/*/{page.stem}.py")
        draws = re.search(r"plot_record\(|plt\.|\.subplots\(", script.read_text())
        shown = re.search(r"sphx_glr_\w+_\d+\.png", html) or "No GPU" in html
        if re.search(r"object at 0x[0-9a-f]+|&lt;Figure size \d+x\d+", html):
            missing.append("no stray repr ('object at 0x...' or '<Figure size ...>')")
        if draws and not shown:
            missing.append("a plot (or the message that its record is missing)")
        for suffix in (".py", ".ipynb"):
            if not re.search(r'href="[^"]*' + re.escape(page.stem + suffix) + '"', html):
                missing.append(f"the {suffix} download")
        if missing:
            problems[page.stem] = missing
    assert not problems, problems


def test_lesson_links_to_the_api(page):
    _, html = page
    assert re.search(r'href="[^"]*api\.html#tilebook\.vector_add"', html)


def test_records_page_lists_provenance(built_site):
    html_dir, _ = built_site
    text = (html_dir / "measurements.html").read_text()
    assert "lesson07_launch" in text and "recorded on NVIDIA" in text


def test_pages_list_every_lesson_and_call_none_in_preparation(built_site):
    """The landing page and the syllabus link every lesson of the gallery; no page of
    lists says a lesson is in preparation (issue 27)."""
    html_dir, _ = built_site
    pages = ["index.html", "syllabus.html", "lessons/index.html"]
    pages += [str(p.relative_to(html_dir)) for p in html_dir.glob("lessons/*/index.html")]
    stems = [p.stem for p in sorted(ROOT.glob("gallery/*/[0-9][0-9]_*.py"))]
    for name in pages:
        text = (html_dir / name).read_text()
        assert "in preparation" not in text.lower(), name
        if name in ("index.html", "syllabus.html"):
            missing = [s for s in stems if not re.search(rf'href="[^"]*/{s}\.html"', text)]
            assert not missing, (name, missing)


def test_measurements_page_states_the_settings_of_the_code(built_site):
    import inspect

    from tilebook.course import bench

    html_dir, _ = built_site
    text = re.sub(r"<[^>]+>", "", (html_dir / "measurements.html").read_text())
    text = re.sub(r"\s+", " ", text)
    measure = inspect.signature(bench.measure).parameters
    assert f"warm-up of {measure['warmup'].default:g} ms" in text
    assert f"about {measure['rep'].default:g} ms" in text
    assert "20th and 80th percentiles" in text
    assert "shown by" in text and "CPU builds" in text
