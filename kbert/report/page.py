"""The page: what index.html shows (``Page``), how it shows numbers (``format_score``, ``direction``) and the
HTML itself (``render_html``: one self-contained document, inline CSS, no scripts, every text escaped)."""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path


@dataclass
class Page:
    """What index.html shows, top to bottom."""

    title: str
    subtitle: str = ""
    facts: list[tuple[str, str]] = field(default_factory=list)  # (name, value): the key numbers
    notes: list[str] = field(default_factory=list)  # what was skipped, and why
    figures: list[tuple[str, str]] = field(default_factory=list)  # (PNG file name in the report folder, caption)
    tables: list[tuple[str, list[str], list[list[str]]]] = field(default_factory=list)  # (heading, header, rows)
    text: list[tuple[str, str]] = field(default_factory=list)  # (heading, preformatted text)


def format_score(value: float | None) -> str:
    """A metric value as the page shows it: 4 decimals, or thousands for large errors (RMSE in dollars)."""
    if value is None or not math.isfinite(float(value)):
        return "-"
    return f"{value:.4f}" if abs(value) < 1000 else f"{value:,.0f}"


def direction(greater_is_better: bool) -> str:
    """``higher is better`` or ``lower is better``, as the pages and the plots' axes say it."""
    return "higher is better" if greater_is_better else "lower is better"


CSS = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 2em auto; max-width: 1200px;
       padding: 0 1em; color: #222; line-height: 1.4; }
h1 { margin-bottom: 0.1em; } .subtitle { color: #666; margin-top: 0; font-size: 0.95em; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.92em; }
th, td { border: 1px solid #ddd; padding: 0.3em 0.7em; text-align: left; vertical-align: top; }
th { background: #f3f4f6; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
figure { margin: 1.5em 0; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { color: #555; font-size: 0.9em; margin-top: 0.3em; }
pre { background: #f6f8fa; padding: 0.8em; overflow-x: auto; font-size: 0.82em; }
.notes { background: #fff8e5; border-left: 4px solid #f0b429; padding: 0.5em 1em; }
footer { color: #888; font-size: 0.8em; margin-top: 3em; }
"""


GENERATOR = '<meta name="generator" content="kbert report">'  # a page kbert wrote, and may write again


def render_html(page: Page, source: Path) -> str:
    """The page as one self-contained HTML document (inline CSS, no scripts); every text is escaped."""
    e = html.escape
    parts = ["<!DOCTYPE html>", f'<html lang="en"><head><meta charset="utf-8">{GENERATOR}',
             '<link rel="icon" href="data:,">',
             f"<title>{e(page.title)}</title>", f"<style>{CSS}</style></head><body>",
             f"<h1>{e(page.title)}</h1>", f'<p class="subtitle">{e(page.subtitle)}</p>']
    if page.facts:
        parts.append("<table>")
        parts += [f"<tr><th>{e(name)}</th><td>{e(value)}</td></tr>" for name, value in page.facts]
        parts.append("</table>")
    if page.notes:
        parts.append('<div class="notes"><ul>' + "".join(f"<li>{e(note)}</li>" for note in page.notes) + "</ul></div>")
    for name, caption in page.figures:
        parts.append(f'<figure><img src="{e(name)}" alt="{e(caption)}"><figcaption>{e(caption)}</figcaption></figure>')
    for heading, header, rows in page.tables:
        parts.append(f"<h2>{e(heading)}</h2><table><tr>" + "".join(f"<th>{e(h)}</th>" for h in header) + "</tr>")
        parts += ["<tr>" + "".join(f'<td class="num">{e(c)}</td>' if _numeric(c) else f"<td>{e(c)}</td>" for c in row)
                  + "</tr>" for row in rows]
        parts.append("</table>")
    for heading, text in page.text:
        parts.append(f"<h2>{e(heading)}</h2><pre>{e(text)}</pre>")
    parts.append(f"<footer>kbert report of {e(str(source))}, {datetime.now():%Y-%m-%d %H:%M}</footer></body></html>")
    return "\n".join(parts) + "\n"


def _numeric(text: str) -> bool:
    try:
        float(text.replace(",", ""))
    except ValueError:
        return False
    return True
