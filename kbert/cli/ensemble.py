"""``kbert ensemble``: blend runs, trials and baselines on their OOF predictions, scored by nested CV, and write
the chosen blend's submission (options and handler)."""

from __future__ import annotations

import argparse

from kbert.cli.common import add_command, add_competition, add_data_dir, add_number, add_out, add_submissions_dir

EPILOG = """examples:
  kbert ensemble titanic                               every member, every method; the best honest CV is submitted
  kbert ensemble titanic --members top:5 --method hill
  kbert ensemble house-prices-advanced-regression-techniques --members run-a,tune/trial-0003,baseline-hgb-seed42
  kbert ensemble titanic --study night --storage postgresql://kaggle@db-host/kbert --artifacts /mnt/shared/kbert
                                                       every trial of a study that ran on several machines

honest CV: each method's weights, meta-model and cut-off are fitted on all outer folds but one and scored on
that one (nested CV); the in-sample figure fits and scores on the same rows and is optimistic.
output: submissions/<competition>/ensemble-<method>-<time>.csv and .json (members, weights, method, honest CV)"""


def add_parser(commands) -> None:
    ensemble = add_command(commands, "ensemble", help="blend runs, trials and baselines on OOF; write a submission",
                           description="Score blending methods with nested cross-validation on the members' "
                                       "out-of-fold predictions, then write the best (or the named) method's "
                                       "submission and a sidecar JSON with members, weights and honest CV.",
                           epilog=EPILOG)
    add_competition(ensemble)
    ensemble.add_argument("--members", default="all",
                          help="all (default), top:K (the K best by CV), or comma-separated run ids / "
                               "<study>/trial-NNNN folders under runs/<competition>/")
    ensemble.add_argument("--method", default="best",
                          help="best (default: every method, the best honest CV is submitted), or one or more of "
                               "mean, top-k, weighted, rank, hill, stack (comma-separated)")
    add_number(ensemble, "--top-k", int, {"at_least": 1}, help="members in the top-k mean (default 3)")
    ensemble.add_argument("--threshold", choices=("auto", "tune", "fixed"), default="auto",
                          help="label metrics: tune the cut-off (binary), per-label cut-offs or per-class weights "
                               "on OOF (tune), keep 0.5 / argmax (fixed), or tune for every label metric but "
                               "accuracy (auto, default)")
    add_number(ensemble, "--outer-folds", int, {"at_least": 2}, default=5,
               help="outer folds of the nested CV (default 5)")
    add_number(ensemble, "--outer-repeats", int, {"at_least": 1}, default=3,
               help="outer splits (seeds S, S+1, ...) whose nested-CV scores are averaged (default 3)")
    add_number(ensemble, "--seed", int, "seed", default=0, help="seed of the outer split and of hill-climbing bags")
    ensemble.add_argument("--study", help="a study whose completed trials (from every machine) are fetched from "
                                           "--artifacts into the runs folder first")
    ensemble.add_argument("--storage", help="the study's storage: journal file or RDB URL, as given to kbert tune")
    ensemble.add_argument("--artifacts", help="the study's shared artifact store, as given to kbert tune")
    ensemble.add_argument("--name", help="the submission's file name, without .csv (default "
                                          "ensemble-<method>-<time>); its JSON is <name>.json beside it")
    add_data_dir(ensemble)
    add_out(ensemble, default="runs", help="runs folder to read members from")
    add_submissions_dir(ensemble, default="submissions", help="where the submission goes")
    ensemble.set_defaults(handler=cmd_ensemble)


def cmd_ensemble(args: argparse.Namespace) -> int:
    from kbert.ensembles.blend import METHODS, BlendOptions
    from kbert.ensembles.ensemble import (EnsembleSpec, build_ensemble, check_ensemble_name, ensemble_table,
                                         named_methods, write_ensemble)
    from kbert.errors import KbertError
    from kbert.pipeline.config import load_competition

    check_member_ids(args.members)
    methods = METHODS if args.method in ("best", "all") else named_methods(args.method)
    if args.top_k is not None and "top-k" not in methods:
        raise KbertError(f"--top-k {args.top_k} acts only with --method top-k (or best); here it would be ignored")
    if args.threshold != "auto" and set(methods) == {"rank"}:
        raise KbertError(f"--threshold {args.threshold} acts only with methods other than rank (a rank average's "
                         "cut-off is always fitted: a rank is no probability); here it would be ignored")
    if args.name is not None:
        from kbert.names import check_name

        check_name(args.name, "--name")
    competition = load_competition(args.competition)
    if args.name is not None:
        check_ensemble_name(args.submissions_dir, competition.name, args.name, args.out_dir)
    if args.study:
        fetch_study_trials(args)
    elif args.storage or args.artifacts:
        raise KbertError(f"{'--storage' if args.storage else '--artifacts'} names a study's store: give --study too")
    options = BlendOptions(top_k=args.top_k or BlendOptions.top_k, seed=args.seed, decision=args.threshold)
    spec = EnsembleSpec(args.members, args.method, folds=args.outer_folds, repeats=args.outer_repeats, seed=args.seed,
                        options=options)
    result = build_ensemble(competition, spec, runs_dir=args.out_dir, data_dir=args.data_dir)
    result = write_ensemble(result, args.submissions_dir, args.name)
    print(ensemble_table(result, competition.metric))
    print(f"submission: {result.submission_path}")
    print(f"members, weights and honest CV: {result.sidecar_path}")
    return 0


def fetch_study_trials(args: argparse.Namespace) -> None:
    from kbert.names import check_name
    from kbert.tune import TuneOptions
    from kbert.tune.trial_store import fetch_study

    check_name(args.study, "--study")
    options = TuneOptions(competition=args.competition, study=args.study, storage=args.storage or "",
                          artifacts=args.artifacts or "", out_dir=args.out_dir)
    fetched, missing = fetch_study(options)
    print(f"study '{args.study}': {fetched} trial(s) fetched from the artifact store"
          + (f"; {missing} completed trial(s) are not on this machine (give --artifacts)" if missing else ""))


def check_member_ids(spec: str) -> None:
    """``--members``: all, top:K, or run ids and <study>/trial-NNNN under runs/<competition>/, each part of
    which is a plain name (no '..', no absolute path: a member is never read from outside --out)."""
    spec = spec.strip()
    if spec == "all" or spec.startswith("top:"):
        return
    from kbert.names import check_name

    for name in (n.strip() for n in spec.split(",") if n.strip()):
        for part in name.split("/"):
            check_name(part, f"--members entry {name!r}: part")
