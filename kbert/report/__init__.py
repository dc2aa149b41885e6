"""``kbert report <run-id|study|ensemble>``: PNG plots and a small self-contained ``index.html`` beside them.

Targets and what each report draws:

- a run folder or run id (``kbert run``, a tuning trial, ``kbert baseline``): fold_scores.png, curves.png
  (when the folds kept a history.json), and from the OOF predictions against the competition's targets:
  confusion.png + calibration.png (binary, multiclass, multilabel), residuals.png (regression, timeseries),
  confusion.png + residuals.png (ordinal). Written to ``<run>/report/``.
- a study folder (``runs/<competition>/<study>``, holding journal.log): Optuna's history.png, importances.png and
  parallel_coordinate.png plus best.yaml (``kbert.tune.write_report``), and the best trial's fold_scores.png
  and curves.png. Written to ``<study>/report/``.
- an ensemble sidecar JSON (``kbert ensemble``): weights.png, correlations.png (members' OOF predictions) and
  methods.png (honest CV per method). Written to ``<json stem>-report/`` beside the JSON.

The page links its pictures by relative ``src`` (the folder can be moved or zipped), has inline CSS and no
scripts. matplotlib is an optional extra (``kbert[report]``), imported only when a report is drawn. Every file
is written atomically (kbert/io.py).

What lives where:

- here: ``write_report``, the entry point (``kbert report``);
- ``target``: ``resolve_target`` (run, study or ensemble?) and each one's default output folder;
- ``runs``: the run report (its facts, the fold plots, the truth read back for the OOF plots);
- ``studies``: the study report (Optuna's plots via ``kbert.tune``, the best trial's fold plots);
- ``ensembles``: the ensemble report and its plots (weights, correlations, methods);
- ``plots``: matplotlib (``pyplot``, ``save_figure``) and the plots of a run's folds and OOF predictions;
- ``page``: ``Page`` (what index.html shows), ``format_score`` and ``render_html``.
"""

from __future__ import annotations

from pathlib import Path

from kbert.io import removed_on_refusal, write_text
from kbert.report.ensemble_page import ensemble_report
from kbert.report.page import Page, format_score, render_html
from kbert.report.plots import pyplot
from kbert.report.run_page import run_report
from kbert.report.study_page import study_report
from kbert.report.resolve import output_folder, resolve_target

__all__ = ["Page", "format_score", "render_html", "resolve_target", "write_report"]

REPORTS = {"run": run_report, "study": study_report, "ensemble": ensemble_report}


def write_report(target: str, runs_dir: str = "runs", output: str | None = None) -> Path:
    """Write the plots and index.html for a run, a study or an ensemble; returns the page's path."""
    kind, path = resolve_target(target, runs_dir)
    pyplot()  # fail before anything is written when matplotlib is missing
    out = Path(output) if output else output_folder(kind, path)
    with removed_on_refusal():  # each report reads its files before it draws; this takes back any plot drawn anyway
        page = REPORTS[kind](path, out)
        page.notes += [f"{name} was not written" for name, _ in page.figures if not (out / name).is_file()]
        page.figures = [(name, caption) for name, caption in page.figures if (out / name).is_file()]
        return write_text(out / "index.html", render_html(page, source=path))
