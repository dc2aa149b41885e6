"""``kbert auto``: from the competition's CSVs to the best honest ensemble within a time limit (options, handler)."""

from __future__ import annotations

import argparse
import sys

from kbert.cli.common import add_command, add_competition, add_data_dir, add_out, add_setting, add_submissions_dir

EPILOG = """examples:
  kbert auto titanic --time-limit 30m                  baselines, encoder runs, the best honest blend
  kbert auto titanic --time-limit 2h --preset balanced adds the concat fusion and a tuning study
  kbert auto my_competition.yaml --time-limit 1h       a `kbert init` competition

resume: after Ctrl-C or a crash, the same command continues (finished members are kept); a larger --time-limit
adds members to the same ensemble. leaderboard: <out>/<competition>/auto/leaderboard.csv and report/index.html
submission: <submissions-dir>/<competition>/auto-ensemble.csv (+ .json sidecar); when a single member finished, that
member's own submission (the last line printed names it)"""


def add_parser(commands) -> None:
    from kbert.pipeline.config import words_of

    auto = add_command(commands, "auto", help="baselines, encoder runs and a blend within a time limit",
                       description="Run the tabular baselines, then encoder runs (and a tuning study) while the time "
                                   "limit allows, each estimated from the finished ones, and submit the ensemble with "
                                   "the best honest (nested-CV) score, with a leaderboard of every member.",
                       epilog=EPILOG)
    add_competition(auto)
    auto.add_argument("--time-limit", required=True, help="total time, e.g. 30m, 2h, 1h30m (over every rerun)")
    auto.add_argument("--preset", choices=words_of("kbert.auto.plan", "PRESETS"), default="fast",
                      help="fast: baselines, one encoder, its embeddings, pseudo-labels, seeds and up to 8 tuning "
                           "trials; balanced, best: more epochs, the concat fusion and a longer study (40, 200 trials) "
                           "(default fast)")
    add_setting(auto, "seed", default=42, help="seed of every member (default 42)")
    add_setting(auto, "precision", default="auto")
    add_data_dir(auto)
    add_out(auto)
    add_submissions_dir(auto)
    auto.add_argument("--no-progress", action="store_true", help="hide the per-fold progress bars")
    auto.set_defaults(handler=cmd_auto)


def cmd_auto(args: argparse.Namespace) -> int:
    from kbert.auto import AutoOptions, run_auto
    from kbert.errors import KbertError
    from kbert.tune.options import parse_duration

    limit = parse_duration(args.time_limit, "--time-limit")
    if limit is None or limit <= 0:
        raise KbertError(f"--time-limit must be a positive duration, got {args.time_limit!r}")
    options = AutoOptions(competition=args.competition, time_limit=limit, preset=args.preset, seed=args.seed,
                          precision=args.precision, data_dir=args.data_dir, out_dir=args.out_dir or "runs",
                          submissions_dir=args.submissions_dir or "submissions",
                          progress=not args.no_progress)
    try:
        result = run_auto(options)
    except KeyboardInterrupt:
        print("kbert: interrupted; finished members are kept; the same command continues", file=sys.stderr)
        return 130
    print(f"leaderboard: {result.leaderboard}\nreport: {result.report}")
    return 0
