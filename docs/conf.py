"""Sphinx configuration of kbert's documentation: MyST Markdown pages, built offline (no CDN assets, no web fonts)
and strictly (``-W``: a broken link or reference fails the build). ``python -m sphinx -W -b html docs build/docs``."""

project = "kbert"
author = "kbert's developers"
extensions = ["myst_parser"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
myst_heading_anchors = 3  # #section links within and across pages
html_theme = "alabaster"  # Sphinx's own theme: its CSS and fonts are local
html_theme_options = {"font_family": "system-ui, sans-serif", "head_font_family": "system-ui, sans-serif",
                      "code_font_family": "monospace", "page_width": "1100px"}
html_static_path = ["_static"]
html_favicon = "_static/favicon.svg"  # a browser asks for one; none would be a 404 in its console
