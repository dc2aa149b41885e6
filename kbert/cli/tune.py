"""``kbert tune``: an Optuna study over the k folds, or with --report its best trials and plots (options, handler)."""

from __future__ import annotations

import argparse

from kbert.cli.common import add_command, add_competition, add_data_dir, add_number, add_out, add_setting

EPILOG = """examples:
  kbert tune titanic --timeout 8h                  overnight (on a CPU, a worker per core)
  kbert tune titanic --trials 30 --pruner median   30 finished trials
  kbert tune titanic --report                      best trials, plots, report/best.yaml
  kbert run --config runs/titanic/tune/report/best.yaml
  kbert tune titanic --dashboard                   watch the study in a browser (pip install "kbert[dashboard]")

several machines (pip install "kbert[distributed]"), the same command on each:
  kbert tune titanic --study night --storage postgresql://kaggle@db-host/kbert --artifacts /mnt/shared/kbert \
      --timeout 8h --workers 2
  kbert ensemble titanic --study night --storage postgresql://kaggle@db-host/kbert --artifacts /mnt/shared/kbert

study: runs/<competition>/<study>/{journal.log, trial-<NNNN>/ (run artifacts), report/}"""


def add_parser(commands) -> None:
    from kbert.pipeline.config import words_of

    tune = add_command(commands, "tune",
                       help="tune settings with Optuna over the k folds (resumable, pruned, parallel)",
                       description="Run an Optuna study: each trial is a full k-fold run with sampled "
                                   "settings, reported fold by fold and pruned when clearly worse. Rerun the "
                                   "same command to resume after Ctrl-C, a crash or a kill.",
                       epilog=EPILOG)
    add_competition(tune)
    add_number(tune, "--trials", int, {"at_least": 1},
               help="trials the study should reach, complete, pruned or failed (a failed one counts, so a setting "
                    "that always fails ends the study; one stopped by Ctrl-C or --timeout counts once, when its retry "
                    "finishes) (default 100; with --timeout alone: no limit)")
    tune.add_argument("--timeout", help="a deadline, e.g. 8h, 90m, 1h30m: a trial running then stops after its current "
                      "fold and is queued again for the next run (default: none)")
    tune.add_argument("--study", default="tune", help="study name: runs/<competition>/<study>/ (default tune)")
    tune.add_argument("--storage", help="journal file (default runs/<competition>/<study>/journal.log) or an RDB "
                      "URL such as postgresql://user@host/db for several machines")
    tune.add_argument("--artifacts", help="a shared artifact store for the trials' run folders, so that any machine "
                      "can blend or rerun any trial: a folder every machine mounts, or s3://BUCKET (an existing "
                      "bucket; pip install \"kbert[distributed]\"; endpoint and keys from boto3's variables: "
                      "AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)")
    add_number(tune, "--db-wait", float, {"at_least": 0}, default=600.0,
               help="seconds a worker waits for a lost database (restart, network) before it gives up "
                    "(default 600)")
    add_number(tune, "--workers", int, {"at_least": 1},
               help="worker processes, each running one trial at a time (default: on a CPU one per core, each "
                    "trial on its core; on a GPU one)")
    tune.add_argument("--space", help="search space YAML replacing kbert/tune/search_space.yaml")
    tune.add_argument("--pruner", choices=words_of("kbert.tune.options", "PRUNERS"),
                      help="fold-wise pruning (default: the study's; a new study wilcoxon)")
    add_number(tune, "--prune-p", float, {"at_least": 0, "at_most": 1},
               help="Wilcoxon p-value threshold; larger prunes more (default: the study's; a new study 0.2, "
                    "after 3 of 5 folds)")
    add_number(tune, "--keep-top", int, {"at_least": 0},
               help="keep fold weights of the best N trials (default 3)")
    add_number(tune, "--heartbeat", float, {"above": 0},
               help="seconds between heartbeats; a trial silent for 4 is stale and retried (default 30)")
    add_number(tune, "--seed", int, "seed", dest="sampler_seed", help="the TPE sampler's seed (default: random)")
    add_setting(tune, "folds", help="number of CV folds for every trial")
    add_setting(tune, "limit_rows", help="every trial uses the first N training rows (quick studies)")
    add_data_dir(tune)
    add_out(tune, default="runs", help="runs folder (default runs)")
    tune.add_argument("--report", action="store_true",
                      help="do not tune: print the best trials, write plots and best.yaml to <study>/report/")
    tune.add_argument("--dashboard", action="store_true",
                      help="do not tune: serve optuna-dashboard on the study's storage (Ctrl-C stops it)")
    add_number(tune, "--port", int, {"at_least": 1, "at_most": 65535},
               help="the dashboard's port (default 8080)")
    tune.add_argument("--host",
                      help="the dashboard's address (default 127.0.0.1; 0.0.0.0 to reach it from other machines)")
    tune.set_defaults(handler=cmd_tune)


def cmd_tune(args: argparse.Namespace) -> int:
    from kbert.names import check_run_name
    from kbert.pipeline.config import POSITIVE, check_number
    from kbert.tune import TuneOptions, auto_workers, parse_duration, tune, write_report

    check_run_name(args.study, "--study")
    check_mode(args)
    timeout = parse_duration(args.timeout, "--timeout")
    if timeout is not None:
        check_number(timeout, "--timeout", POSITIVE)
    trials = args.trials if args.trials is not None else (None if timeout else 100)
    overrides = {name: getattr(args, name) for name in ("folds", "limit_rows", "data_dir")
                 if getattr(args, name) is not None}
    options = TuneOptions(competition=args.competition, study=args.study, storage=args.storage or "", trials=trials,
                          timeout=timeout, workers=args.workers or 1, space=args.space or "", pruner=args.pruner or "",
                          prune_p=args.prune_p, heartbeat=args.heartbeat or TuneOptions.heartbeat,
                          keep_top=TuneOptions.keep_top if args.keep_top is None else args.keep_top,
                          sampler_seed=args.sampler_seed, overrides=overrides, out_dir=args.out_dir,
                          artifacts=args.artifacts or "", db_wait=args.db_wait)
    if args.dashboard:
        from kbert.tune import serve_dashboard

        return serve_dashboard(options, args.host, args.port)
    if args.report:
        write_report(options)
        return 0
    options.workers = args.workers or auto_workers(trials)
    study, code = tune(options)
    from kbert.tune import trials_table

    print(trials_table(study, top=5))
    print(f"report and best.yaml: kbert tune {args.competition} --study {args.study} --report")
    return code


# what only tuning reads: --report and --dashboard read the study as it is (its own settings)
TUNING_OPTIONS = {"trials": "--trials", "timeout": "--timeout", "workers": "--workers", "space": "--space",
                  "pruner": "--pruner", "prune_p": "--prune-p", "sampler_seed": "--seed", "folds": "--folds",
                  "limit_rows": "--limit-rows", "keep_top": "--keep-top", "heartbeat": "--heartbeat"}
DASHBOARD_OPTIONS = {"port": "--port", "host": "--host"}  # what only --dashboard reads


def check_mode(args: argparse.Namespace) -> None:
    """--report and --dashboard, which do not tune, are not given together, nor with an option only tuning reads:
    each was ignored silently."""
    from kbert.errors import KbertError

    if args.report and args.dashboard:
        raise KbertError("--report and --dashboard: give one (neither tunes)")
    import os

    from kbert.pipeline.config import SETTINGS

    def from_environment(dest: str) -> bool:  # KBERT_LIMIT_ROWS, set for quick runs, is no option given here
        env = SETTINGS[dest].metadata["env"] if dest in SETTINGS else ""
        return bool(env) and os.environ.get(env) == str(getattr(args, dest))

    mode = "--report" if args.report else "--dashboard" if args.dashboard else None
    given = [flag for dest, flag in TUNING_OPTIONS.items()
             if getattr(args, dest) is not None and not from_environment(dest)]
    if mode and given:
        raise KbertError(f"{mode} reads the study with its own settings, and does not tune: drop {', '.join(given)}")
    if args.prune_p is not None and args.pruner not in (None, "wilcoxon"):  # (another study's: its settings differ)
        raise KbertError("--prune-p acts only with --pruner wilcoxon; here it would be ignored: drop it")
    served = [flag for dest, flag in DASHBOARD_OPTIONS.items() if getattr(args, dest) is not None]
    if served and not args.dashboard:
        raise KbertError(f"{', '.join(served)} acts only with --dashboard; here it would be ignored: drop it")
