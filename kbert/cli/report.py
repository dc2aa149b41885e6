"""``kbert report``: PNG plots and an HTML page for a run, a study or an ensemble (options and handler)."""

from __future__ import annotations

import argparse

from kbert.cli.common import add_command, add_out, check_run_id


def add_parser(commands) -> None:
    report = add_command(commands, "report", help="plots and an HTML page for a run, a study or an ensemble",
                         description="Write PNG plots and a self-contained index.html: fold scores, training "
                                     "curves, confusion matrix or residuals, calibration and (with "
                                     "--importance) the CV drop without each column's words for a run; "
                                     "Optuna history and importances for a study; member weights and "
                                     "correlations for an ensemble (its sidecar .json). Needs matplotlib.")
    report.add_argument("target", help="a run folder or run id, a study folder (runs/<comp>/<study>), or an "
                        "ensemble sidecar JSON (submissions/<comp>/ensemble-*.json)")
    add_out(report, default="runs", help="runs folder to look run ids up in")
    report.add_argument("--output", help="folder for the PNGs and index.html (default <target>/report; for an "
                        "ensemble, <json name>-report/ beside the JSON)")
    report.add_argument("--importance", action="store_true",
                        help="a run: first compute its column importance with the saved fold models (the CV "
                             "without each column's words; no retraining) into <run>/importance.json, which the "
                             "report then shows (an existing one is shown without this flag)")
    report.set_defaults(handler=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    from pathlib import Path

    from kbert.report import write_report

    if not Path(args.target).exists():
        check_run_id(args.target, "kbert report TARGET")
    if args.importance:
        compute_importance(args.target, args.out_dir)
    page = write_report(args.target, args.out_dir, args.output)
    print(f"report: {page}")
    return 0


def compute_importance(target: str, runs_dir: str) -> None:
    """``--importance``: the run's importance.json, written before the report that shows it; matplotlib is
    checked first, so a missing one fails before the fold models are run."""
    from kbert.errors import KbertError
    from kbert.report import resolve_target
    from kbert.report.plots import pyplot

    kind, path = resolve_target(target, runs_dir)
    if kind != "run":
        raise KbertError(f"--importance: {path} is {'a study' if kind == 'study' else 'an ensemble'}; column "
                         "importance is computed for a run folder")
    pyplot()
    from kbert.pipeline.importance import column_importance

    column_importance(path)
