"""Sphinx configuration for the tilebook site."""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

# Importing tilebook chooses GPU or interpreter mode before anything imports
# Triton; the build log then says which one this build ran in.
import tilebook

# nox -s docs prints it before Sphinx's own first line (and says so in the variable).
if not os.environ.get("TILEBOOK_BANNER_SHOWN"):
    print(tilebook.banner(), flush=True)

# Lesson 14 runs torch.profiler; on a machine without a GPU, PyTorch's CUDA build has
# its profiler library (Kineto) print "USDT: profiler_start" and "gpuGetDeviceCount
# failed" lines straight to stderr: noise in the build log that asks for no action.
# Level 6 is past every level Kineto logs at (it reads the variable when profiling).
os.environ.setdefault("KINETO_LOG_LEVEL", "6")

# To link a lesson's code to the API, sphinx-gallery looks every dotted name up in
# the lesson's globals, names inside functions too: lesson 12's kernels transpose
# their tiles with ``k.T``, and the lesson's module-level ``k`` is a 4-D tensor, on
# which torch deprecates ``.T``.  The lesson evaluates no such ``.T``; the lookup
# does (and its link would be wrong), so its warning is silenced there only.
warnings.filterwarnings(
    "ignore", r"The use of `x\.T` on tensors", UserWarning, r"sphinx_gallery\.backreferences"
)

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent / "_ext"))

project = "tilebook"
author = "the tilebook team"
copyright = "2026, the tilebook team"
release = version = tilebook.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.intersphinx",
    "sphinx.ext.mathjax",
    "sphinx-mathjax-offline",  # MathJax from the built site, never a CDN
    "sphinx.ext.viewcode",
    "myst_parser",
    "sphinx_design",
    "sphinx_copybutton",
    "sphinx_gallery.gen_gallery",
    "tilebook_ext",  # :datasheet: and :repo: roles, install commands, records (docs/_ext)
    "tilebook_notebooks",  # lesson notebooks with Markdown, not raw reST (docs/_ext)
    "tilebook_wheel",  # the package's wheel in the site, for the notebooks (docs/_ext)
]

# The one setting that connects the site to its repository: clone and install
# commands, "view source" links, "Open in Colab" and the notebooks' install cell.
# Off when unset.
tilebook_repo_url = os.environ.get("TILEBOOK_REPO_URL") or None
tilebook_repo_branch = os.environ.get("TILEBOOK_REPO_BRANCH", "main")
tilebook_pages_branch = os.environ.get("TILEBOOK_PAGES_BRANCH", "gh-pages")
# Where the site is published: the notebooks install the wheel it ships from there.
# Unset, a GitHub repository URL gives its GitHub Pages address (docs/_ext/tilebook_wheel.py).
tilebook_site_url = os.environ.get("TILEBOOK_SITE_URL") or None

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build", "**.ipynb_checkpoints", "lessons/**/*.py", "lessons/**/*.ipynb"]
myst_enable_extensions = ["colon_fence", "deflist", "dollarmath"]
myst_heading_anchors = 3

autodoc_typehints = "description"
autodoc_member_order = "bysource"
# The API page's summary table needs no generated stub pages (it has no :toctree:),
# and the scan for them only prints a line listing every page.
autosummary_generate = False
napoleon_numpy_docstring = True
napoleon_google_docstring = False
nitpicky = False
# Intersphinx needs the network; the build must work offline, so it is off
# unless TILEBOOK_INTERSPHINX=1.
intersphinx_mapping = (
    {
        "python": ("https://docs.python.org/3", None),
        "torch": ("https://pytorch.org/docs/stable", None),
    }
    if os.environ.get("TILEBOOK_INTERSPHINX") == "1"
    else {}
)

part_dirs = [
    "../gallery/01_the_model",
    "../gallery/02_the_dsl",
    "../gallery/03_real_kernels",
    "../gallery/04_flagship",
    "../gallery/05_production",
]

sphinx_gallery_conf = {
    "examples_dirs": ["../gallery"],
    "gallery_dirs": ["lessons"],
    # Every lesson is named NN_name.py and every one is executed.  For a quick
    # look at a few, TILEBOOK_LESSONS="07|08" executes only the lessons whose
    # file names match (the others are rendered without their output).
    "filename_pattern": (
        rf"/({os.environ['TILEBOOK_LESSONS']})\w*\.py$"
        if os.environ.get("TILEBOOK_LESSONS")
        else r"/\d\d_\w+\.py$"
    ),
    "ignore_pattern": r"(__init__|conftest)\.py",
    "subsection_order": part_dirs,
    "within_subsection_order": "FileNameSortKey",
    "download_all_examples": True,
    "capture_repr": ("_repr_html_", "__repr__"),
    # A cell that ends in a plot call or a kernel launch would otherwise print the
    # returned object ("<Figure size 770x440 with 1 Axes>"): the figure is shown
    # anyway, and a launch's handle means nothing to a reader.
    "ignore_repr_types": r"matplotlib\.(figure|axes|artist|lines|text)|CompiledKernel",
    "image_scrapers": ("matplotlib",),
    # lesson_time.lesson_clock writes what each lesson took beside its page, from
    # clocks read before and after it (docs/_ext/lesson_time.py; the site test holds
    # each lesson to its budget with them).  Matplotlib's reset, sphinx-gallery's
    # default, now runs after each lesson too: a no-op there.
    "reset_modules": ("matplotlib", "lesson_time.lesson_clock", "lesson_launches.lesson_launches"),
    "reset_modules_order": "both",
    "matplotlib_animations": False,
    "remove_config_comments": True,
    "doc_module": ("tilebook",),
    "backreferences_dir": "api/generated/backrefs",
    "abort_on_example_error": True,
    "only_warn_on_example_error": False,
    "show_memory": False,
    "min_reported_time": 0,
    # tilebook_notebooks rewrites the notebooks with its own first cells.
    "first_notebook_cell": None,
}

html_theme = "pydata_sphinx_theme"
html_title = "tilebook"
html_static_path = ["_static"]
templates_path = ["_templates"]
html_favicon = "_static/favicon.svg"
html_logo = "_static/favicon.svg"
html_css_files = ["tilebook.css"]
html_js_files = ["tilebook.js"]
html_theme_options = {
    "navbar_align": "left",
    "show_toc_level": 2,
    "navigation_with_keys": False,
    "header_links_before_dropdown": 6,
    "secondary_sidebar_items": ["page-toc", "sg_download_links", "tilebook-colab"],
    "footer_start": ["copyright"],
    "footer_end": ["theme-version"],
}
# Top-level pages have no section to navigate: no empty left sidebar there.
html_sidebars = {
    page: [] for page in ("index", "start", "syllabus", "api", "glossary", "measurements")
}
html_context = {"default_mode": "auto"}
html_show_sourcelink = False
