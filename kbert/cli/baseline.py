"""``kbert baseline``: a tabular model (gradient-boosted trees or linear) on the run's folds, written as an ensemble
member in the run format (options and handler)."""

from __future__ import annotations

import argparse

from kbert.cli.common import (add_command, add_competition, add_data_dir, add_number, add_out, add_setting,
                              add_submissions_dir, print_run_result)

EPILOG = """examples:
  kbert baseline titanic                     HistGradientBoosting on the 5 folds of kbert run
  kbert baseline titanic --model logreg      logistic regression on one-hot and TF-IDF features
  kbert baseline house-prices-advanced-regression-techniques --model logreg   trimmed lasso on log-scaled sizes
  kbert baseline nlp-getting-started --embeddings minilm-l6   + 32 PCA components of the tweets' sentence embeddings
  kbert baseline titanic --embeddings fusion-none   + those of run fusion-none's fine-tuned fold k model, per fold

member: <out>/<competition>/baseline-<model>[-emb-<source>]-seed<S>/{config.yaml, folds.csv, oof.csv, test.csv, metrics.json}"""


def add_parser(commands) -> None:
    from kbert.pipeline.config import shipped_names

    baseline = add_command(commands, "baseline", help="train a tabular baseline (gradient-boosted trees or linear) "
                           "on the same folds, as an ensemble member",
                           description="Train a tabular model per fold on the competition's raw columns plus "
                                       "its engineered features and write a member in the run format "
                                       "(oof.csv, test.csv, metrics.json) with a submission.",
                           epilog=EPILOG)
    add_competition(baseline)
    baseline.add_argument("--model", default="hgb", choices=("hgb", "logreg", "lgbm", "catboost"),
                          help="hgb: scikit-learn HistGradientBoosting (default); logreg: logistic regression on "
                               "one-hot and TF-IDF features (an outlier-trimmed lasso for regression); lgbm, catboost: "
                               "if installed")
    add_number(baseline, "--seed", int, "seed", help="model seed (default: the run default, 42)")
    add_number(baseline, "--folds", int, "folds", help="number of CV folds (default: the competition's)")
    baseline.add_argument("--embeddings", metavar="SOURCE",
                          help="add an encoder's text embeddings, reduced to 32 PCA components per fold on its "
                               "training rows: a finished kbert run on the same folds (its folder, or its id under "
                               "--out; fold k's fine-tuned model embeds fold k's rows) or a pretrained encoder "
                               f"({shipped_names()}, a model folder, a Hub id)")
    baseline.add_argument("--run-id", help="run folder name (default baseline-<model>[-emb-<source>]-seed<S>)")
    add_setting(baseline, "limit_rows")
    add_data_dir(baseline)
    add_out(baseline)
    add_submissions_dir(baseline)
    baseline.set_defaults(handler=cmd_baseline)


def cmd_baseline(args: argparse.Namespace) -> int:
    from kbert.ensembles.baseline import run_baseline
    from kbert.names import check_run_name
    from kbert.pipeline.config import load_competition, resolve_run_config

    if args.run_id is not None:
        check_run_name(args.run_id, "--run-id")
    overrides = {name: getattr(args, name) for name in ("seed", "folds", "limit_rows", "data_dir", "out_dir",
                                                         "submissions_dir")}
    config = resolve_run_config(load_competition(args.competition), overrides)
    print_run_result(run_baseline(config, args.model, run_id=args.run_id, embeddings=args.embeddings))
    return 0
