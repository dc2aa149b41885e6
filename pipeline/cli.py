"""The ``kbert`` command line."""

from __future__ import annotations

import argparse
import sys

from pipeline.errors import KbertError

DESCRIPTION = """kbert: fine-tune BERT-family encoders in MLX on Kaggle competitions.

Tabular rows become text, a BERT encoder is trained per fold, and the fold models'
out-of-fold and test predictions are written to runs/ with a submission file."""

RUN_EPILOG = """examples:
  kbert run titanic                          bundled Titanic data, 5 folds, seed 42
  kbert run titanic --epochs 5 --folds 3     a quicker run
  kbert run titanic --encoder minilm-l6      fine-tune pretrained all-MiniLM-L6-v2
  kbert run titanic --data-dir ~/kaggle/titanic --out /tmp/runs
  kbert run path/to/my_competition.yaml

artifacts: <out>/<competition>/<run-id>/{config.yaml, folds.csv, oof.csv, test.csv, metrics.json, folds/<k>/}
submission: <submissions-dir>/<competition>/<run-id>.csv
resume: after Ctrl-C or a crash, rerun the same command with --run-id <run-id> (printed first): finished folds
are kept, the others are trained"""

TUNE_EPILOG = """examples:
  kbert tune titanic --timeout 8h --workers 2      overnight, two processes
  kbert tune titanic --trials 30 --pruner median   30 finished trials
  kbert tune titanic --report                      best trials, plots, report/best.yaml
  kbert run --config runs/titanic/tune/report/best.yaml

study: runs/<competition>/<study>/{journal.log, trial-<NNNN>/ (run artifacts), report/}
dashboard: optuna-dashboard runs/<competition>/<study>/journal.log"""


PRETRAIN_EPILOG = """examples:
  kbert pretrain titanic --steps 3000 --run-id mlm          from scratch, the size kbert run trains
  kbert run titanic --encoder runs/titanic/pretrain/mlm     fine-tune it on the folds
  kbert pretrain titanic --encoder minilm-l6 --steps 1000   continue pretraining a pretrained encoder

output: runs/<competition>/pretrain/<id>/{config.json, model.safetensors (encoder + MLM head), tokenizer.json,
pretrain.json (held-out masked accuracy, perplexity, history, time)}"""


BASELINE_EPILOG = """examples:
  kbert baseline titanic                     HistGradientBoosting on the 5 folds of kbert run
  kbert baseline titanic --model logreg      logistic regression on one-hot and TF-IDF features
  kbert baseline house-prices-advanced-regression-techniques --model logreg   trimmed lasso on log-scaled sizes

member: <out>/<competition>/baseline-<model>-seed<S>/{config.yaml, folds.csv, oof.csv, test.csv, metrics.json}"""

ENSEMBLE_EPILOG = """examples:
  kbert ensemble titanic                               every member, every method; the best honest CV is submitted
  kbert ensemble titanic --members top:5 --method hill
  kbert ensemble house-prices-advanced-regression-techniques --members run-a,tune/trial-0003,baseline-hgb-seed42

honest CV: each method's weights, meta-model and cut-off are fitted on all outer folds but one and scored on
that one (nested CV); the in-sample figure fits and scores on the same rows and is optimistic.
output: submissions/<competition>/ensemble-<method>-<time>.csv and .json (members, weights, method, honest CV)"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kbert", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    run = commands.add_parser("run", help="train k fold models and write OOF, test predictions and a submission",
                              description="Run the whole pipeline for one competition: folds -> text -> tokens -> "
                                          "MLX training per fold -> OOF/test predictions -> submission.",
                              epilog=RUN_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("competition", nargs="?",
                     help="a name under competitions/ (e.g. titanic) or a path to a competition YAML")
    run.add_argument("--config", help="a run config YAML: a run's config.yaml, `kbert tune --report`'s best.yaml, "
                     "or `competition: <name>` with settings (flags override them)")
    run.add_argument("--folds", type=int, help="number of CV folds (default: the competition's, 5 for titanic)")
    run.add_argument("--repeats", type=int, help="repeated k-fold: this many different splits, OOF averaged")
    run.add_argument("--augment", type=int, help="augmented serializations of the training rows (column shuffle, "
                     "paraphrase, numeric jitter); epochs cycle through them (default 0: off)")
    run.add_argument("--tta", type=int, help="test-time augmentation: average over this many serializations "
                     "(default 1: off)")
    run.add_argument("--seed", type=int, help="training seed: initialisation, dropout, batch order (default 42)")
    run.add_argument("--encoder", help="bert (default: a small BERT trained from scratch), a size to train from "
                                       "scratch (bert-tiny, bert-mini, modernbert-base, neobert, ...), a shipped "
                                       "pretrained name (minilm-l6), or a local Hugging Face model folder")
    run.add_argument("--adapter", help="train adapters on a pretrained encoder instead of all its weights: a preset "
                     "(efficient r=4, balanced r=8, expressive r=16, qlora_memory: 4-bit base r=8) or a kind "
                     "(lora, rslora, dora, qlora)")
    run.add_argument("--lora-rank", type=int, help="adapter rank (overrides the preset's)")
    run.add_argument("--lora-alpha", type=float, help="adapter alpha: the update is scaled by alpha / rank")
    run.add_argument("--lora-dropout", type=float, help="dropout on the adapters' input")
    run.add_argument("--lora-targets", help="comma-separated encoder layers to adapt, as name patterns "
                     "(e.g. query,value or attention.* or Wqkv,Wo,Wi; default: every linear layer of the blocks)")
    run.add_argument("--adapter-checkpoint", choices=("adapter", "merged"),
                     help="fold checkpoints hold the adapter weights only (default) or the merged full model")
    run.add_argument("--epochs", type=int, help="maximum epochs per fold (early stopping may end sooner)")
    run.add_argument("--batch-size", type=int, help="training batch size")
    run.add_argument("--lr", type=float, dest="learning_rate", help="peak learning rate")
    run.add_argument("--max-length", type=int, help="maximum tokens per row")
    run.add_argument("--data-dir", help="folder with the competition's CSV files (default: the bundled copy)")
    run.add_argument("--out", dest="out_dir", help="runs folder (default: runs)")
    run.add_argument("--submissions-dir", help="submissions folder (default: submissions)")
    run.add_argument("--run-id", help="name of the run folder (default: <timestamp>-seed<S>)")
    run.add_argument("--limit-rows", type=int, help="use only the first N training rows (quick smoke runs)")
    run.add_argument("--no-progress", action="store_true", help="hide the per-fold progress bars")
    run.add_argument("--pooling", choices=("cls", "mean", "max", "attention"), help="how token states are pooled")
    run.add_argument("--loss", help="the head's loss (e.g. focal, huber, gaussian_nll; see models/heads.py)")
    run.add_argument("--label-smoothing", type=float, help="multiclass cross-entropy label smoothing")
    run.add_argument("--focal-gamma", type=float, help="focal loss gamma")
    run.add_argument("--head-dropout", type=float, help="dropout before the head")
    run.add_argument("--target-transform", choices=("none", "log1p", "standardize", "log1p_standardize"),
                     help="regression/timeseries target transform, fitted per fold")
    run.add_argument("--threshold", help="binary/multilabel cut-off for label submissions: a probability or 'tune'")
    run.add_argument("--calibrate", action="store_const", const=True,
                     help="temperature-scale binary/multiclass probabilities on OOF logits")
    run.add_argument("--permute-target", action="store_const", const=True,
                     help="sanity check: shuffle the training targets; the CV should fall to the trivial baseline")
    run.add_argument("--gradient-checkpointing", action="store_const", const=True,
                     help="recompute encoder layers in the backward pass: much less memory, about 1/3 more time")
    run.add_argument("--no-compile", dest="compile", action="store_const", const=False,
                     help="run the train and eval steps eagerly instead of with mx.compile")
    run.add_argument("--no-dynamic-padding", dest="dynamic_padding", action="store_const", const=False,
                     help="pad every batch to --max-length instead of to its own longest row")

    tune = commands.add_parser("tune", help="tune settings with Optuna over the k folds (resumable, pruned, parallel)",
                               description="Run an Optuna study: each trial is a full k-fold run with sampled "
                                           "settings, reported fold by fold and pruned when clearly worse. Rerun the "
                                           "same command to resume after Ctrl-C, a crash or a kill.",
                               epilog=TUNE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    tune.add_argument("competition", help="a name under competitions/ or a path to a competition YAML")
    tune.add_argument("--trials", type=int, help="finished (complete or pruned) trials the study should reach "
                      "(default 100; with --timeout alone: no limit)")
    tune.add_argument("--timeout", help="a deadline, e.g. 8h, 90m, 1h30m: a trial running then stops after its current "
                      "fold and is queued again for the next run (default: none)")
    tune.add_argument("--study", default="tune", help="study name: runs/<competition>/<study>/ (default tune)")
    tune.add_argument("--storage", help="journal file (default runs/<competition>/<study>/journal.log) or an RDB "
                      "URL such as postgresql://user@host/db for several machines")
    tune.add_argument("--workers", type=int, default=1, help="worker processes (default 1)")
    tune.add_argument("--space", help="search space YAML replacing pipeline/search_space.yaml")
    tune.add_argument("--pruner", choices=("wilcoxon", "median", "none"), default="wilcoxon",
                      help="fold-wise pruning (default wilcoxon)")
    tune.add_argument("--prune-p", type=float, default=0.2,
                      help="Wilcoxon p-value threshold; larger prunes more (default 0.2: after 3 of 5 folds)")
    tune.add_argument("--keep-top", type=int, default=3, help="keep fold weights of the best N trials (default 3)")
    tune.add_argument("--heartbeat", type=float, default=30.0,
                      help="seconds between heartbeats; a trial silent for 4 is stale and retried (default 30)")
    tune.add_argument("--seed", type=int, dest="sampler_seed", help="the TPE sampler's seed (default: random)")
    tune.add_argument("--folds", type=int, help="number of CV folds for every trial")
    tune.add_argument("--limit-rows", type=int, help="every trial uses the first N training rows (quick studies)")
    tune.add_argument("--data-dir", help="folder with the competition's CSV files (default: the bundled copy)")
    tune.add_argument("--out", dest="out_dir", default="runs", help="runs folder (default runs)")
    tune.add_argument("--report", action="store_true",
                      help="do not tune: print the best trials, write plots and best.yaml to <study>/report/")

    baseline = commands.add_parser("baseline", help="train a tabular baseline (gradient-boosted trees or linear) "
                                   "on the same folds, as an ensemble member",
                                   description="Train a tabular model per fold on the competition's raw columns plus "
                                               "its engineered features and write a member in the run format "
                                               "(oof.csv, test.csv, metrics.json) with a submission.",
                                   epilog=BASELINE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    baseline.add_argument("competition", help="a name under competitions/ or a path to a competition YAML")
    baseline.add_argument("--model", default="hgb", choices=("hgb", "logreg", "lgbm", "catboost"),
                          help="hgb: scikit-learn HistGradientBoosting (default); logreg: logistic regression on "
                               "one-hot and TF-IDF features (an outlier-trimmed lasso for regression); lgbm, catboost: "
                               "if installed")
    baseline.add_argument("--seed", type=int, help="model seed (default: the run default, 42)")
    baseline.add_argument("--folds", type=int, help="number of CV folds (default: the competition's)")
    baseline.add_argument("--run-id", help="run folder name (default baseline-<model>-seed<S>)")
    baseline.add_argument("--limit-rows", type=int, help="use only the first N training rows")
    baseline.add_argument("--data-dir", help="folder with the competition's CSV files (default: the bundled copy)")
    baseline.add_argument("--out", dest="out_dir", help="runs folder (default: runs)")
    baseline.add_argument("--submissions-dir", help="submissions folder (default: submissions)")

    ensemble = commands.add_parser("ensemble", help="blend runs, trials and baselines on OOF; write a submission",
                                   description="Score blending methods with nested cross-validation on the members' "
                                               "out-of-fold predictions, then write the best (or the named) method's "
                                               "submission and a sidecar JSON with members, weights and honest CV.",
                                   epilog=ENSEMBLE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    ensemble.add_argument("competition", help="a name under competitions/ or a path to a competition YAML")
    ensemble.add_argument("--members", default="all",
                          help="all (default), top:K (the K best by CV), or comma-separated run ids / "
                               "<study>/trial-NNNN folders under runs/<competition>/")
    ensemble.add_argument("--method", default="best",
                          help="best (default: every method, the best honest CV is submitted), or one or more of "
                               "mean, top-k, weighted, rank, hill, stack (comma-separated)")
    ensemble.add_argument("--top-k", type=int, default=3, help="members in the top-k mean (default 3)")
    ensemble.add_argument("--threshold", choices=("auto", "tune", "fixed"), default="auto",
                          help="label metrics: tune the cut-off (binary), per-label cut-offs or per-class weights "
                               "on OOF (tune), keep 0.5 / argmax (fixed), or tune for every label metric but "
                               "accuracy (auto, default)")
    ensemble.add_argument("--outer-folds", type=int, default=5, help="outer folds of the nested CV (default 5)")
    ensemble.add_argument("--outer-repeats", type=int, default=3,
                          help="outer splits (seeds S, S+1, ...) whose nested-CV scores are averaged (default 3)")
    ensemble.add_argument("--seed", type=int, default=0, help="seed of the outer split and of hill-climbing bags")
    ensemble.add_argument("--data-dir", help="folder with the competition's CSV files (default: the bundled copy)")
    ensemble.add_argument("--out", dest="out_dir", default="runs", help="runs folder to read members from")
    ensemble.add_argument("--submissions-dir", default="submissions", help="where the submission goes")

    predict = commands.add_parser("predict", help="predict a CSV with a finished run's fold models",
                                  description="Predict new rows with every saved fold model of a run and average "
                                              "them; the text is serialized as the run did, fold by fold.")
    predict.add_argument("run", help="a run folder, or a run id under <out>/<competition>/")
    predict.add_argument("--data", required=True, help="CSV with the competition's input columns (and ids)")
    predict.add_argument("--tta", type=int, default=1, help="average over this many serializations (default 1: off)")
    predict.add_argument("--output", help="where to write id + predictions (default <run>/predictions/<name>.csv)")
    predict.add_argument("--out", dest="out_dir", default="runs", help="runs folder to look run ids up in")

    embed = commands.add_parser("embed", help="write sentence embeddings of a text file with an encoder",
                                description="Embed one text per line of FILE with a pretrained encoder and write "
                                            "a (lines, hidden) float32 .npy array.")
    embed.add_argument("model", help="a shipped name (minilm-l6) or a local Hugging Face model folder")
    embed.add_argument("--texts", required=True, help="UTF-8 text file, one text per line")
    embed.add_argument("--out", required=True, help="output .npy file")
    embed.add_argument("--pooling", choices=("cls", "mean", "max"), default="mean", help="how to pool tokens (default mean)")
    embed.add_argument("--normalize", action="store_true", help="L2-normalise each embedding")
    embed.add_argument("--max-length", type=int, default=256, help="maximum tokens per text (default 256)")
    embed.add_argument("--batch-size", type=int, default=64)

    commands.add_parser("doctor", help="report the platform, MLX device, BLAS speed, versions, disk and credentials",
                        description="Report the platform, the MLX version, device and GPU backends, which BLAS "
                                    "MLX's CPU matmuls use and its measured 1024^3 float32 sgemm throughput, package "
                                    "versions, free disk, and whether Kaggle credentials are present (never their "
                                    "values). Exits 1 on the slow reference BLAS.")

    validate = commands.add_parser("validate", help="check a submission file against the sample submission",
                                   description="Check that a submission CSV has the sample submission's columns, "
                                               "row count, ids and dtypes. Exits 0 when it does, 2 otherwise.")
    validate.add_argument("competition", help="a name under competitions/ or a path to a competition YAML")
    validate.add_argument("file", help="the submission CSV to check")
    validate.add_argument("--data-dir", help="folder with the sample submission (default: the bundled copy)")

    init = commands.add_parser("init", help="write a competition YAML for a new train/test CSV pair",
                               description="Infer the id, target, task and column types of a CSV pair and write "
                                           "a competition YAML to edit; `kbert run` works on it as is.")
    init.add_argument("name", help="the competition's name")
    init.add_argument("--train", required=True, help="training CSV")
    init.add_argument("--test", required=True, help="test CSV (same folder)")
    init.add_argument("--sample-submission", help="sample submission CSV: names the id and target columns")
    init.add_argument("--out", help="where to write the YAML (default: competitions/<name>.yaml)")
    init.add_argument("--id", dest="id_column", help="the id column (default: inferred)")
    init.add_argument("--target", help="the target column (default: the training column missing from test)")
    init.add_argument("--force", action="store_true", help="overwrite an existing YAML")

    pretrain = commands.add_parser("pretrain", help="masked-language-model pretraining on the competition's text",
                                   description="Pretrain an encoder with masked-language modelling on every train "
                                               "and test row as text (never a target column), then fine-tune it "
                                               "with kbert run --encoder runs/<competition>/pretrain/<id>.",
                                   epilog=PRETRAIN_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    pretrain.add_argument("competition", help="a name under competitions/ or a path to a competition YAML")
    source = pretrain.add_mutually_exclusive_group()
    source.add_argument("--from-scratch", dest="scratch", metavar="SIZE",
                        help="bert (default: the size kbert run trains, with a WordPiece vocabulary learned on the "
                             "corpus) or a preset (bert-mini, modernbert-base, neobert, ...)")
    source.add_argument("--encoder", help="continue pretraining a pretrained encoder: minilm-l6 or a model folder")
    pretrain.add_argument("--steps", type=int, default=2000, help="optimizer steps (default 2000)")
    pretrain.add_argument("--batch-size", type=int, default=64, help="texts per step (default 64)")
    pretrain.add_argument("--lr", type=float, dest="learning_rate",
                          help="peak learning rate (default 5e-4 from scratch, 5e-5 for a pretrained encoder)")
    pretrain.add_argument("--mask-prob", type=float, default=0.15, help="share of tokens predicted (default 0.15)")
    pretrain.add_argument("--whole-word", action="store_true", help="mask whole words, not single word pieces")
    pretrain.add_argument("--augment", type=int, default=4,
                          help="augmented serializations of every row next to the plain one (default 4)")
    pretrain.add_argument("--holdout", type=float, default=0.05, help="share of rows held out for masked "
                          "accuracy and perplexity (default 0.05)")
    pretrain.add_argument("--eval-every", type=int, default=200, help="steps between held-out evaluations")
    pretrain.add_argument("--vocab-size", type=int, help="from scratch: WordPiece vocabulary size (default: the "
                          "run's, 1000)")
    pretrain.add_argument("--max-length", type=int, help="maximum tokens per row (default: the run's)")
    pretrain.add_argument("--seed", type=int, default=42)
    pretrain.add_argument("--run-id", help="folder name under runs/<competition>/pretrain/ (default: timestamp)")
    pretrain.add_argument("--data-dir", help="folder with the competition's CSV files (default: as kbert run)")
    pretrain.add_argument("--out", dest="out_dir", help="runs folder (default: runs)")
    pretrain.add_argument("--no-progress", action="store_true", help="print evaluations instead of a progress bar")

    download = commands.add_parser("download", help="download and unzip a Kaggle competition's files",
                                   description="Fetch a competition's files with the official kaggle package and "
                                               "unzip them into data/<slug>/, the folder kbert run reads first. "
                                               "Accept the competition's rules on kaggle.com first.")
    download.add_argument("slug", help="the competition's Kaggle slug, e.g. titanic")
    download.add_argument("--data-dir", help="where the files go (default data/<slug>)")
    download.add_argument("--force", action="store_true", help="download again even if the files are there")

    submit = commands.add_parser("submit", help="validate a submission file, then submit it to Kaggle",
                                 description="Check the file against the competition's sample submission (as kbert "
                                             "validate does) and submit it with the official kaggle package.")
    submit.add_argument("competition", help="a name under competitions/ or a path to a competition YAML; its name "
                        "is the Kaggle slug")
    submit.add_argument("file", help="the submission CSV")
    submit.add_argument("-m", "--message", required=True, help="the submission's description on Kaggle")
    submit.add_argument("--data-dir", help="folder with the sample submission (default: as kbert run)")

    submissions = commands.add_parser("submissions", help="list your Kaggle submissions and their scores")
    submissions.add_argument("competition", help="a competition name, YAML path or Kaggle slug")

    leaderboard = commands.add_parser("leaderboard", help="show the top of a competition's public leaderboard")
    leaderboard.add_argument("competition", help="a competition name, YAML path or Kaggle slug")
    leaderboard.add_argument("--top", type=int, default=20, help="rows to show (default 20)")

    report = commands.add_parser("report", help="plots and an HTML page for a run, a study or an ensemble",
                                 description="Write PNG plots and a self-contained index.html: fold scores, training "
                                             "curves, confusion matrix or residuals and calibration for a run; "
                                             "Optuna history and importances for a study; member weights and "
                                             "correlations for an ensemble (its sidecar .json). Needs matplotlib.")
    report.add_argument("target", help="a run folder or run id, a study folder (runs/<comp>/<study>), or an "
                        "ensemble sidecar JSON (submissions/<comp>/ensemble-*.json)")
    report.add_argument("--out", dest="out_dir", default="runs", help="runs folder to look run ids up in")
    report.add_argument("--output", help="folder for the PNGs and index.html (default <target>/report; for an "
                        "ensemble, <json name>-report/ beside the JSON)")

    show = commands.add_parser("show-text", help="print training rows as the model reads them",
                               description="Serialize the first N training rows with the competition's text "
                                           "settings (fitted on all training rows) and print them with their targets.")
    show.add_argument("competition", help="a name under competitions/ or a path to a competition YAML")
    show.add_argument("--n", type=int, default=5, help="how many rows (default 5)")
    show.add_argument("--data-dir", help="folder with the competition's CSV files (default: the bundled copy)")
    return parser


def cmd_tune(args: argparse.Namespace) -> int:
    from pipeline.tune import TuneOptions, parse_duration, tune, write_report

    timeout = parse_duration(args.timeout)
    trials = args.trials if args.trials is not None else (None if timeout else 100)
    overrides = {name: getattr(args, name) for name in ("folds", "limit_rows", "data_dir")
                 if getattr(args, name) is not None}
    options = TuneOptions(competition=args.competition, study=args.study, storage=args.storage or "", trials=trials,
                          timeout=timeout, workers=args.workers, space=args.space or "", pruner=args.pruner,
                          prune_p=args.prune_p, keep_top=args.keep_top, heartbeat=args.heartbeat,
                          sampler_seed=args.sampler_seed, overrides=overrides, out_dir=args.out_dir)
    if args.report:
        write_report(options)
        return 0
    study, code = tune(options)
    from pipeline.tune import trials_table

    print(trials_table(study, top=5))
    print(f"report and best.yaml: kbert tune {args.competition} --study {args.study} --report")
    return code


def _probability(text: str) -> float:
    from pipeline.errors import KbertError

    try:
        return float(text)
    except ValueError:
        raise KbertError(f"--threshold must be a probability or 'tune', got {text!r}") from None


def cmd_run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from pipeline.config import load_competition, resolve_run_config, run_config_from_file
    from pipeline.run import run_competition

    names = ("folds", "seed", "encoder", "epochs", "batch_size", "learning_rate", "max_length", "data_dir", "out_dir",
             "submissions_dir", "limit_rows", "compile", "gradient_checkpointing", "dynamic_padding", "pooling", "loss",
             "label_smoothing", "focal_gamma", "head_dropout", "target_transform", "calibrate", "permute_target",
             "repeats", "augment", "tta", "adapter", "adapter_checkpoint")
    overrides = {name: getattr(args, name) for name in names}
    adapter_options = {name: getattr(args, f"lora_{name}") for name in ("rank", "alpha", "dropout", "targets")
                       if getattr(args, f"lora_{name}") is not None}
    if adapter_options:
        overrides["adapter_options"] = adapter_options
    if args.threshold is not None:
        overrides["threshold"] = args.threshold if args.threshold == "tune" else _probability(args.threshold)
    if args.config:
        if args.competition:
            raise KbertError("give a competition or --config, not both")
        config = run_config_from_file(args.config, overrides)
    elif not args.competition:
        raise KbertError("name a competition (e.g. kbert run titanic) or pass --config FILE")
    else:
        config = resolve_run_config(load_competition(args.competition), overrides)
    from pipeline.run import new_run_id

    run_id = args.run_id or new_run_id(config.seed)
    try:
        result = run_competition(config, run_id=run_id, progress=not args.no_progress)
    except KeyboardInterrupt:
        print(f"kbert: interrupted; finished folds are kept in {Path(config.out_dir) / config.competition.name / run_id}"
              f"; resume with the same command and --run-id {run_id}", file=sys.stderr)
        return 130
    print_run_result(result)
    return 0


def print_run_result(result) -> None:
    """The closing lines of `kbert run` and `kbert baseline` (a pipeline.run.RunResult)."""
    print(f"CV {result.metric}: {result.cv_score:.4f}  (folds: {', '.join(f'{s:.4f}' for s in result.fold_scores)})")
    print(f"run folder: {result.run_dir}")
    print(f"submission: {result.submission_path}")
    print(f"wall time: {result.seconds:.0f}s")


def cmd_baseline(args: argparse.Namespace) -> int:
    from ensembles.baseline import run_baseline
    from pipeline.config import load_competition, resolve_run_config

    overrides = {name: getattr(args, name) for name in ("seed", "folds", "limit_rows", "data_dir", "out_dir",
                                                         "submissions_dir")}
    config = resolve_run_config(load_competition(args.competition), overrides)
    print_run_result(run_baseline(config, args.model, run_id=args.run_id))
    return 0


def cmd_ensemble(args: argparse.Namespace) -> int:
    from ensembles.blend import BlendOptions
    from ensembles.ensemble import build_ensemble, ensemble_table
    from pipeline.config import load_competition

    competition = load_competition(args.competition)
    options = BlendOptions(top_k=args.top_k, seed=args.seed, decision=args.threshold)
    result = build_ensemble(competition, args.members, args.method, args.out_dir, args.submissions_dir, args.data_dir,
                            args.outer_folds, args.seed, options, repeats=args.outer_repeats)
    print(ensemble_table(result, competition.metric))
    print(f"submission: {result.submission_path}")
    print(f"members, weights and honest CV: {result.sidecar_path}")
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    from pipeline.predict import predict_run, resolve_run_dir

    path = predict_run(resolve_run_dir(args.run, args.out_dir), args.data, args.tta, args.output)
    print(f"predictions: {path}")
    return 0


def cmd_embed(args: argparse.Namespace) -> int:
    from pathlib import Path

    from models.encoders import load_encoder
    from pipeline.embed import embed_texts
    from pipeline.errors import KbertError
    from pipeline.io import write_npy

    path = Path(args.texts)
    if not path.is_file():
        raise KbertError(f"{path}: file not found")
    try:
        texts = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise KbertError(f"{path}: not valid UTF-8 (byte {exc.start})") from None
    if not texts:
        raise KbertError(f"{path}: no lines to embed")
    encoder, _, tokenizer = load_encoder(args.model)
    vectors = embed_texts(encoder, tokenizer, texts, args.pooling, args.normalize, args.max_length, args.batch_size)
    out = Path(args.out)
    with_suffix = out if out.suffix == ".npy" else out.with_name(out.name + ".npy")
    write_npy(with_suffix, vectors)
    print(f"{with_suffix}: {vectors.shape[0]} x {vectors.shape[1]} embeddings")
    return 0


SLOW_BLAS_GFLOPS = 20.0  # the reference netlib BLAS measures ~5; OpenBLAS and MKL measure 100+


DOCTOR_PACKAGES = ("mlx", "numpy", "pandas", "scikit-learn", "optuna", "tokenizers", "safetensors", "kaggle",
                   "matplotlib", "torch", "transformers")
LOW_DISK_GB = 5.0


def cmd_doctor(args: argparse.Namespace) -> int:
    """Platform, MLX device and backends, BLAS and its speed, versions, disk, Kaggle credentials (never values)."""
    import platform
    import shutil
    from importlib import metadata
    from pathlib import Path

    import mlx.core as mx

    from models import cpu_kernels
    from models.blas import MALLOC_STATUS, STATUS, measure_sgemm_gflops
    from pipeline.kaggle import credential_source

    print(f"platform: {platform.system()} {platform.machine()}, Python {platform.python_version()}")
    backends = [name for name, module in (("metal", getattr(mx, "metal", None)), ("cuda", getattr(mx, "cuda", None)))
                if module is not None and module.is_available()]
    print(f"mlx: {mx.__version__}, default device {mx.default_device()}, GPU backends: {', '.join(backends) or 'none'}")
    print(f"BLAS: {STATUS.name}" + (f" ({STATUS.path})" if STATUS.path else "") + (f"; {STATUS.note}" if STATUS.note else ""))
    with mx.stream(mx.cpu):
        gflops = measure_sgemm_gflops()
    print(f"sgemm 1024^3 float32 on CPU: {gflops:.1f} GFLOP/s")
    if platform.system() == "Linux":
        cpu_kernels.kernels()
        kernels = cpu_kernels.STATUS
        print(f"CPU kernels (softmax, GELU): {kernels.state}" + (f" ({kernels.path})" if kernels.path else "")
              + (f"; {kernels.note}" if kernels.note else ""))
        print(f"malloc: {MALLOC_STATUS}")
    versions = []
    for package in ("kbert",) + DOCTOR_PACKAGES:
        try:
            versions.append(f"{package} {metadata.version(package)}")
        except metadata.PackageNotFoundError:
            versions.append(f"{package} -")
    print("versions: " + ", ".join(versions))
    folder = next(p for p in (Path.cwd(), *Path.cwd().parents) if p.exists())
    free_gb = shutil.disk_usage(folder).free / 1e9
    print(f"free disk: {free_gb:.1f} GB in {folder}")
    source = credential_source()
    print(f"kaggle credentials: {'found (' + source + ')' if source else 'none (kbert download/submit need a token)'}")
    code = 0
    if free_gb < LOW_DISK_GB:
        print(f"warning: less than {LOW_DISK_GB:.0f} GB free; fold checkpoints and tuning trials need room",
              file=sys.stderr)
    if platform.system() == "Linux" and gflops < SLOW_BLAS_GFLOPS:
        print("warning: MLX is using a slow BLAS; pip install mkl, or apt install libopenblas0-pthread, "
              "or set KBERT_BLAS=/path/to/libblas.so", file=sys.stderr)
        code = 1
    return code


def cmd_validate(args: argparse.Namespace) -> int:
    from pathlib import Path

    from pipeline.config import load_competition
    from pipeline.data import load_competition_data, read_csv
    from pipeline.submission import validate_submission

    competition = load_competition(args.competition)
    data = load_competition_data(competition, args.data_dir)
    test_ids = data.test[competition.id_column]
    validate_submission(read_csv(Path(args.file)), data.sample_submission, competition, source=args.file,
                        test_ids=test_ids)
    print(f"{args.file}: valid {competition.name} submission ({len(test_ids)} rows)")
    return 0


def cmd_init(args: argparse.Namespace) -> int:
    from pipeline.init import init_competition

    path = init_competition(args.name, args.train, args.test, args.sample_submission, args.out, args.id_column,
                            args.target, args.force)
    print(f"wrote {path}; check it, then: kbert run {path}")
    return 0


def cmd_show_text(args: argparse.Namespace) -> int:
    from pipeline.config import load_competition, resolve_run_config
    from pipeline.data import load_competition_data
    from features import add_features
    from pipeline.run import make_serializer

    competition = load_competition(args.competition)
    config = resolve_run_config(competition)
    data = load_competition_data(competition, args.data_dir)
    features, _ = add_features(competition.features, data.train.drop(columns=competition.target_columns), data.test)
    all_texts = make_serializer(config).fit(features).transform(features)
    texts, lengths = all_texts[: args.n], [len(t.split()) for t in all_texts]
    for (_, row), text in zip(data.train.iloc[: args.n].iterrows(), texts):
        target = ", ".join(f"{c}={row[c]}" for c in competition.target_columns)
        print(f"[{row[competition.id_column]}] {target}\n  {text}")
    print(f"{len(features)} training rows; words per row: mean {sum(lengths) / len(lengths):.1f}, max {max(lengths)}")
    return 0


def kaggle_slug(competition: str) -> str:
    """A competition name or YAML path -> its Kaggle slug (the YAML's name); anything else is taken as a slug."""
    from pipeline.config import COMPETITIONS_DIR, load_competition

    if competition.endswith((".yaml", ".yml")) or (COMPETITIONS_DIR / f"{competition}.yaml").is_file():
        return load_competition(competition).name
    return competition


def cmd_pretrain(args: argparse.Namespace) -> int:
    from pipeline.config import load_competition, resolve_run_config
    from pipeline.pretrain import PretrainConfig, pretrain

    overrides = {name: getattr(args, name) for name in ("vocab_size", "max_length", "data_dir", "out_dir")}
    config = resolve_run_config(load_competition(args.competition), overrides)
    settings = PretrainConfig(encoder=args.encoder or args.scratch or "bert", steps=args.steps,
                              batch_size=args.batch_size, learning_rate=args.learning_rate, mask_prob=args.mask_prob,
                              whole_word=args.whole_word, augment=args.augment, holdout=args.holdout,
                              eval_every=args.eval_every, seed=args.seed)
    folder = pretrain(config, settings, run_id=args.run_id, progress=not args.no_progress)
    print(f"encoder: {folder}\nfine-tune it: kbert run {args.competition} --encoder {folder}")
    return 0


def cmd_download(args: argparse.Namespace) -> int:
    from pathlib import Path

    from pipeline.config import COMPETITIONS_DIR, DOWNLOAD_DIR
    from pipeline.kaggle import download_competition

    folder = Path(args.data_dir) if args.data_dir else DOWNLOAD_DIR / args.slug
    files = download_competition(args.slug, folder, force=args.force)
    names = [str(p.relative_to(folder)) for p in files]
    print(f"{folder}: {len(names)} files ({', '.join(names[:6])}{', ...' if len(names) > 6 else ''})")
    if (COMPETITIONS_DIR / f"{args.slug}.yaml").is_file():
        print(f"next: kbert run {args.slug}" + (f" --data-dir {folder}" if args.data_dir else ""))
    else:
        print(f"next: kbert init {args.slug} --train {folder}/train.csv --test {folder}/test.csv "
              f"(check the file names), then kbert run {args.slug}")
    return 0


def cmd_submit(args: argparse.Namespace) -> int:
    from pathlib import Path

    from pipeline.kaggle import submit_file

    cmd_validate(args)
    print(submit_file(kaggle_slug(args.competition), Path(args.file), args.message))
    return 0


def cmd_submissions(args: argparse.Namespace) -> int:
    from pipeline.kaggle import submissions_table

    print(submissions_table(kaggle_slug(args.competition)))
    return 0


def cmd_leaderboard(args: argparse.Namespace) -> int:
    from pipeline.kaggle import leaderboard_table

    print(leaderboard_table(kaggle_slug(args.competition), args.top))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from pipeline.report import write_report

    page = write_report(args.target, args.out_dir, args.output)
    print(f"report: {page}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        commands = {"run": cmd_run, "tune": cmd_tune, "embed": cmd_embed, "doctor": cmd_doctor,
                    "validate": cmd_validate, "show-text": cmd_show_text, "init": cmd_init, "baseline": cmd_baseline,
                    "ensemble": cmd_ensemble, "predict": cmd_predict, "download": cmd_download,
                    "submit": cmd_submit, "submissions": cmd_submissions, "leaderboard": cmd_leaderboard,
                    "report": cmd_report, "pretrain": cmd_pretrain}
        return commands[args.command](args)
    except KbertError as exc:
        print(f"kbert: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("kbert: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
