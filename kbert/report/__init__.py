"""``kbert report <run-id|study|ensemble>``: PNG plots and a small self-contained ``index.html`` beside them.

``write_report`` is the entry point; ``resolve`` tells a run, a study and an ensemble sidecar apart, and
``run_page``, ``study_page`` and ``ensemble_page`` draw each. The page links its pictures by relative path and runs
no scripts; matplotlib (``kbert[report]``) is imported only when a report is drawn.
"""

from __future__ import annotations

from pathlib import Path

from kbert.errors import KbertError
from kbert.io import removed_on_refusal, write_text
from kbert.pipeline.artifacts import check_outside_members
from kbert.report.ensemble_page import ensemble_report
from kbert.report.page import GENERATOR, Page, format_score, render_html
from kbert.report.plots import pyplot
from kbert.report.run_page import run_report
from kbert.report.study_page import STUDY_PLOTS, study_report
from kbert.report.resolve import output_folder, resolve_target

__all__ = ["Page", "format_score", "render_html", "resolve_target", "write_report"]

REPORTS = {"run": run_report, "study": study_report, "ensemble": ensemble_report}


def write_report(target: str, runs_dir: str = "runs", output: str | None = None) -> Path:
    """Write the plots and index.html for a run, a study or an ensemble; returns the page's path."""
    kind, path = resolve_target(target, runs_dir)
    pyplot()  # fail before anything is written when matplotlib is missing
    if output is not None and not output.strip():
        raise KbertError("--output is empty: give the folder for the report, or leave the option out")
    out = Path(output) if output else output_folder(kind, path)
    if out.exists() and not out.is_dir():
        raise KbertError(f"--output {output}: a file, not a folder; give the folder for the report's PNGs and page")
    if out != output_folder(kind, path):
        check_report_folder(out, f"--output {output}")
    before = kbert_page(out / "index.html")
    with removed_on_refusal():  # each report reads its files before it draws; this takes back any plot drawn anyway
        page = ensemble_report(path, out, runs_dir) if kind == "ensemble" else REPORTS[kind](path, out)
        page.notes += [f"{name} was not written" for name, _ in page.figures if not (out / name).is_file()]
        page.figures = [(name, caption) for name, caption in page.figures if (out / name).is_file()]
        written = write_text(out / "index.html", render_html(page, source=path))
    if before:  # the plots of the report this one replaced that it did not draw again (an importance.json gone)
        for name in PLOTS - {name for name, _ in page.figures}:
            (out / name).unlink(missing_ok=True)
    return written


PLOTS = {"fold_scores.png", "curves.png", "importance.png", "confusion.png", "calibration.png", "residuals.png",
         "weights.png", "correlations.png", "methods.png", *STUDY_PLOTS}  # every plot a report draws


def kbert_page(page: Path) -> bool:
    """Whether ``page`` is an index.html that kbert report wrote (and may write again)."""
    return page.is_file() and GENERATOR in page.read_text(encoding="utf-8", errors="replace")[:2000]


def check_report_folder(out: Path, what: str) -> None:
    """A report written where the user says loses nothing: not among a run's or baseline's files, and not over a
    page kbert did not write (its plots would replace files of the same names beside it)."""
    page = out / "index.html"
    check_outside_members(page, what)
    if page.is_file() and not kbert_page(page):
        raise KbertError(f"{what}: {page} is a page kbert did not write; give an empty or a new folder")
