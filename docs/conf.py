"""Sphinx configuration of kbert's documentation: MyST Markdown pages, built offline (no CDN assets, no web fonts)
and strictly (``-W``: a broken link or reference fails the build). ``python -m sphinx -W -b html docs build/docs``.

A page with MyST-NB front matter (``file_format: mystnb``) is executed during the build, each in a temporary
folder: its ``{code-cell}`` examples run kbert on tiny data, and one that fails fails the build.
``-D nb_execution_mode=off`` builds without running them (the tests' structural checks).

Measured figures come from benchmarks/results/ through substitutions (``{{ fig.NAME.KEY }}``, ``{{ table.NAME.KEY }}``,
``{{ output.NAME.KEY }}``; benchmarks/figures.py): the pages themselves hold none."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import figures  # noqa: E402

project = "kbert"
author = "kbert's developers"
extensions = ["myst_nb"]
nb_execution_mode = "force"  # every executable page, every build
nb_execution_raise_on_error = False  # a failing example is a warning (an error under -W) that shows its cell and output
nb_execution_in_temp = True  # the examples write runs/ and submissions/ in a temporary folder, not in docs/
nb_execution_timeout = 300
nb_merge_streams = True
nb_execution_show_tb = True
exclude_patterns = ["_build"]
myst_enable_extensions = ["substitution"]
myst_substitutions = figures.substitutions()
myst_heading_anchors = 3  # #section links within and across pages
html_theme = "alabaster"  # Sphinx's own theme: its CSS and fonts are local
html_theme_options = {"font_family": "system-ui, sans-serif", "head_font_family": "system-ui, sans-serif",
                      "code_font_family": "monospace", "page_width": "1100px"}
html_static_path = ["_static"]
html_favicon = "_static/favicon.svg"  # a browser asks for one; none would be a 404 in its console
