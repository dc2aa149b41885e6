"""``kbert adversarial``: adversarial validation, a cross-validated train-versus-test classifier whose AUC says
whether the test rows are drawn like the training rows, and which columns differ (options and handler)."""

from __future__ import annotations

import argparse

from kbert.cli.common import add_command, add_competition, add_data_dir, add_number, add_out

EPILOG = """examples:
  kbert adversarial titanic                   5-fold AUC of train versus test, the 10 columns that differ most
  kbert adversarial spaceship-titanic --top 20 --seed 7

verdict: AUC < 0.55 no detectable drift, 0.55 to 0.7 mild drift, > 0.7 strong drift
importance: the drop of the held-out AUC when the column is shuffled (permutation importance, mean over folds)
output: <out>/<competition>/adversarial.json (AUC, fold AUCs, importances, verdict, seed, most test-like rows)"""


def add_parser(commands) -> None:
    adversarial = add_command(commands, "adversarial", help="adversarial validation: can a model tell train rows "
                              "from test rows, and by which columns",
                              description="Stack the training rows (targets dropped) on the test rows, "
                                          "cross-validate gradient-boosted trees that predict which file a row "
                                          "comes from, and report the out-of-fold AUC with the columns that "
                                          "separate the files.",
                              epilog=EPILOG)
    add_competition(adversarial)
    add_number(adversarial, "--folds", int, "folds", default=5, help="CV folds over the stacked rows (default 5)")
    add_number(adversarial, "--seed", int, "seed", default=42,
               help="seed of the fold split, the trees and the shuffles (default 42)")
    add_number(adversarial, "--top", int, {"at_least": 1}, default=10, help="columns listed (default 10)")
    add_data_dir(adversarial)
    add_out(adversarial, help="runs folder; the report goes to <out>/<competition>/adversarial.json (default: runs)")
    adversarial.set_defaults(handler=cmd_adversarial)


def cmd_adversarial(args: argparse.Namespace) -> int:
    from kbert.ensembles.adversarial import (adversarial_table, adversarial_validation, check_adversarial_output,
                                             write_adversarial)
    from kbert.pipeline.config import load_competition, resolve_run_config

    overrides = {name: getattr(args, name) for name in ("seed", "data_dir", "out_dir")}
    config = resolve_run_config(load_competition(args.competition), overrides)
    check_adversarial_output(config)
    result = adversarial_validation(config, folds=args.folds)
    print(f"AUC train vs test: {result.auc:.4f}  (folds: {', '.join(f'{a:.4f}' for a in result.fold_aucs)})")
    print(f"verdict: {result.verdict}  ({result.n_train} training rows, {result.n_test} test rows)")
    print(adversarial_table(result, args.top))
    print(f"report: {write_adversarial(config, result)}")
    return 0
