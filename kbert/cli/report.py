"""``kbert report``: PNG plots and an HTML page for a run, a study or an ensemble (options and handler)."""

from __future__ import annotations

import argparse

from kbert.cli.common import add_command, add_out, check_run_id


def add_parser(commands) -> None:
    report = add_command(commands, "report", help="plots and an HTML page for a run, a study or an ensemble",
                         description="Write PNG plots and a self-contained index.html: fold scores, training "
                                     "curves, confusion matrix or residuals and calibration for a run; "
                                     "Optuna history and importances for a study; member weights and "
                                     "correlations for an ensemble (its sidecar .json). Needs matplotlib.")
    report.add_argument("target", help="a run folder or run id, a study folder (runs/<comp>/<study>), or an "
                        "ensemble sidecar JSON (submissions/<comp>/ensemble-*.json)")
    add_out(report, default="runs", help="runs folder to look run ids up in")
    report.add_argument("--output", help="folder for the PNGs and index.html (default <target>/report; for an "
                        "ensemble, <json name>-report/ beside the JSON)")
    report.set_defaults(handler=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    from pathlib import Path

    from kbert.report import write_report

    if not Path(args.target).exists():
        check_run_id(args.target, "kbert report TARGET")
    page = write_report(args.target, args.out_dir, args.output)
    print(f"report: {page}")
    return 0
