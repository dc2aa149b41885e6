"""``kbert run``: train k fold models and write OOF, test predictions and a submission (its options and handler)."""

from __future__ import annotations

import argparse
import sys

from kbert.cli.common import (add_command, add_competition, add_data_dir, add_number, add_out, add_submissions_dir,
                              print_run_result)
from kbert.errors import KbertError

EPILOG = """examples:
  kbert run titanic                          bundled Titanic data, 5 folds, seed 42
  kbert run titanic --epochs 5 --folds 3     a quicker run
  kbert run titanic --encoder minilm-l6      fine-tune pretrained all-MiniLM-L6-v2
  kbert run titanic --seeds 3                seeds 42, 43, 44 on the same folds, averaged into one member
  kbert run titanic --data-dir ~/kaggle/titanic --out /tmp/runs
  kbert run path/to/my_competition.yaml

artifacts: <out>/<competition>/<run-id>/{config.yaml, folds.csv, oof.csv, test.csv, metrics.json, folds/<k>/}
submission: <submissions-dir>/<competition>/<run-id>.csv
resume: after Ctrl-C or a crash, rerun the same command with --run-id <run-id> (printed first): finished folds
are kept, the others are trained"""

# RunConfig fields set by the flag of the same name (None: the config's or competition's value)
OVERRIDES = ("folds", "seed", "seeds", "encoder", "epochs", "batch_size", "learning_rate", "max_length", "data_dir",
             "out_dir", "submissions_dir", "limit_rows", "compile", "gradient_checkpointing", "dynamic_padding", "pooling", "loss",
             "label_smoothing", "focal_gamma", "head_dropout", "target_transform", "calibrate", "permute_target",
             "repeats", "augment", "tta", "adapter", "adapter_checkpoint", "spm_normalization", "fusion",
             "pseudo_label", "pseudo_threshold", "precision", "device", "grad_accum", "cpu_streams",
             "fold_processes", "group_by_length")


def add_parser(commands) -> None:
    run = add_command(commands, "run", help="train k fold models and write OOF, test predictions and a submission",
                      description="Run the whole pipeline for one competition: folds -> text -> tokens -> "
                                  "MLX training per fold -> OOF/test predictions -> submission.",
                      epilog=EPILOG)
    add_competition(run, help="a name under competitions/ (e.g. titanic) or a path to a competition YAML",
                    optional=True)
    _add_data_options(run)
    _add_encoder_options(run)
    _add_training_options(run)
    _add_output_options(run)
    _add_head_options(run)
    _add_speed_options(run)
    run.set_defaults(handler=cmd_run)


def _add_data_options(run: argparse.ArgumentParser) -> None:
    run.add_argument("--config", help="a run config YAML: a run's config.yaml, `kbert tune --report`'s best.yaml, "
                     "or `competition: <name>` with settings (flags override them)")
    add_number(run, "--folds", int, "folds", help="number of CV folds (default: the competition's, 5 for titanic)")
    add_number(run, "--repeats", int, "repeats", help="repeated k-fold: this many different splits, OOF averaged")
    add_number(run, "--augment", int, "augment", help="augmented serializations of the training rows (column shuffle, "
               "paraphrase, numeric jitter); epochs cycle through them (default 0: off)")
    add_number(run, "--tta", int, "tta", help="test-time augmentation: average over this many serializations "
               "(default 1: off)")
    add_number(run, "--seed", int, "seed", help="training seed: initialisation, dropout, batch order (default 42)")
    run.add_argument("--pseudo-label", metavar="RUN",
                     help="add confidently predicted test rows to each fold's training rows, labelled by RUN's model "
                          "of that fold (a finished run, trial or baseline on the same folds), so the OOF stays honest")
    add_number(run, "--pseudo-threshold", float, "pseudo_threshold",
               help="...the test rows whose predicted class has at least this probability (default 0.95)")
    add_number(run, "--seeds", int, "seeds", help="train every fold with seeds S, S+1, ... on the same folds and "
               "average their predictions into one member (default 1)")


def _add_encoder_options(run: argparse.ArgumentParser) -> None:
    run.add_argument("--encoder", help="bert (a small BERT trained from scratch; the default, except minilm-l6 "
                                       "where the text is mostly free text), a size to train from scratch (bert-tiny, "
                                       "modernbert-base, deberta-v3-xsmall, ...), a shipped pretrained name "
                                       "(minilm-l6), a local Hugging Face model folder, or a Hugging Face Hub id "
                                       "(org/name[@revision], downloaded once into the Hugging Face cache)")
    run.add_argument("--spm-normalization", choices=("sentencepiece", "transformers"),
                     help="DeBERTa-v2/v3 checkpoints with spm.model and no tokenizer.json: normalise text with the "
                          "model's own table as in pretraining (sentencepiece, the default) or as transformers 5's "
                          "tokenizer does (NFC; ids equal to a transformers 5 notebook's)")
    run.add_argument("--adapter", help="train adapters on a pretrained encoder instead of all its weights: a preset "
                     "(efficient r=4, balanced r=8, expressive r=16, qlora_memory: 4-bit base r=8) or a kind "
                     "(lora, rslora, dora, qlora)")
    add_number(run, "--lora-rank", int, "adapter_options.rank", help="adapter rank (overrides the preset's)")
    add_number(run, "--lora-alpha", float, "adapter_options.alpha",
               help="adapter alpha: the update is scaled by alpha / rank")
    add_number(run, "--lora-dropout", float, "adapter_options.dropout", help="dropout on the adapters' input")
    run.add_argument("--lora-targets", help="encoder layers to adapt: a set named in each architecture's own "
                     "layer names (default: every linear layer of the blocks; attention: the q/k/v projections; "
                     "query-value), or comma-separated name patterns (e.g. query,value or attention.* or Wqkv,Wo,Wi)")
    run.add_argument("--adapter-checkpoint", choices=("adapter", "merged"),
                     help="fold checkpoints hold the adapter weights only (default) or the merged full model")


def _add_training_options(run: argparse.ArgumentParser) -> None:
    add_number(run, "--epochs", int, "epochs", help="maximum epochs per fold (early stopping may end sooner)")
    add_number(run, "--batch-size", int, "batch_size", help="training batch size")
    add_number(run, "--lr", float, "learning_rate", dest="learning_rate", help="peak learning rate")
    add_number(run, "--max-length", int, "max_length", help="maximum tokens per row")


def _add_output_options(run: argparse.ArgumentParser) -> None:
    add_data_dir(run)
    add_out(run)
    add_submissions_dir(run)
    run.add_argument("--run-id", help="name of the run folder (default: <timestamp>-seed<S>)")
    add_number(run, "--limit-rows", int, "limit_rows", help="use only the first N training rows (quick smoke runs)")
    run.add_argument("--no-progress", action="store_true", help="hide the per-fold progress bars")


def _add_head_options(run: argparse.ArgumentParser) -> None:
    run.add_argument("--pooling", choices=("cls", "mean", "max", "attention", "weighted-layers", "cls-last4"),
                     help="how token states are pooled: weighted-layers is a learned mix of the last 4 layers, "
                          "then the mean; cls-last4 joins the CLS vectors of the last 4 layers")
    run.add_argument("--fusion", choices=("none", "concat", "gated"),
                     help="join the pooled text with a learned vector of the row's raw columns (numbers quantile-"
                          "transformed, categories embedded, fitted per fold): concat or gated (default none)")
    run.add_argument("--loss", help="the head's loss (e.g. focal, huber, gaussian_nll; see models/heads.py)")
    add_number(run, "--label-smoothing", float, "label_smoothing", help="multiclass cross-entropy label smoothing")
    add_number(run, "--focal-gamma", float, "focal_gamma", help="focal loss gamma")
    add_number(run, "--head-dropout", float, "head_dropout", help="dropout before the head")
    run.add_argument("--target-transform", choices=("none", "log1p", "standardize", "log1p_standardize"),
                     help="regression/timeseries target transform, fitted per fold")
    run.add_argument("--threshold", help="binary/multilabel cut-off for label submissions: a probability or 'tune'")
    run.add_argument("--calibrate", action="store_const", const=True,
                     help="temperature-scale binary/multiclass probabilities on OOF logits")
    run.add_argument("--permute-target", action="store_const", const=True,
                     help="sanity check: shuffle the training targets; the CV should fall to the trivial baseline")


def _add_speed_options(run: argparse.ArgumentParser) -> None:
    run.add_argument("--gradient-checkpointing", action="store_const", const=True,
                     help="recompute encoder layers in the backward pass: much less memory, about 1/3 more time")
    run.add_argument("--no-compile", dest="compile", action="store_const", const=False,
                     help="run the train and eval steps eagerly instead of with mx.compile")
    run.add_argument("--no-dynamic-padding", dest="dynamic_padding", action="store_const", const=False,
                     help="pad every batch to --max-length instead of to its own longest row")
    run.add_argument("--precision", choices=("auto", "fp32", "bf16", "fp16"),
                     help="compute precision with float32 master weights (default auto: bf16 on a GPU, fp32 on a "
                          "CPU, where MLX's half precision is about 15x slower)")
    run.add_argument("--device", choices=("auto", "cpu", "gpu"),
                     help="where MLX trains (default auto: the GPU when this MLX build has one)")
    add_number(run, "--grad-accum", int, "grad_accum",
               help="accumulate gradients over N batches of --batch-size per optimizer step (a batch N times "
                    "larger in less memory)")
    add_number(run, "--cpu-streams", int, "cpu_streams",
               help="on a CPU, split each batch over N MLX streams, one per core (default 0: one per usable core; "
                    "1: off)")
    add_number(run, "--group-by-length", int, "group_by_length",
               help="sort each epoch's shuffled rows by length in groups of N batches before batching, so that a "
                    "batch pads less (default 1: plain shuffled batches; batches of like-length table rows are batches of "
                    "like rows)")
    add_number(run, "--fold-processes", int, "fold_processes",
               help="on a CPU, train the folds side by side in N processes (default 0: every fold at once, each on "
                    "cores/folds streams; 1: one after another, each batch split over the cores)")
    run.add_argument("--profile", action="store_true",
                     help="print where the wall time went (preparation, tokenization, tracing, training steps, "
                          "evaluation, writing) per fold, and write it to the run folder's profile.json")


def cmd_run(args: argparse.Namespace) -> int:
    from contextlib import nullcontext
    from pathlib import Path

    from kbert.io import write_json
    from kbert.names import check_name
    from kbert.pipeline.profile import profiling
    from kbert.pipeline.run import new_run_id, run_competition

    if args.run_id is not None:
        check_name(args.run_id, "--run-id")
    config = _run_config(args, _overrides(args))
    run_id = args.run_id or new_run_id(config.seed)
    try:
        with profiling() if args.profile else nullcontext() as profile:
            result = run_competition(config, run_id=run_id, progress=not args.no_progress)
    except KeyboardInterrupt:
        kept = Path(config.out_dir) / config.competition.name / run_id
        print(f"kbert: interrupted; finished folds are kept in {kept}; resume with the same command and --run-id "
              f"{run_id}", file=sys.stderr)
        return 130
    print_run_result(result)
    if profile is not None:
        print(profile.table())
        write_json(result.run_dir / "profile.json", profile.to_dict())
    return 0


def _overrides(args: argparse.Namespace) -> dict:
    """The flags as RunConfig overrides: OVERRIDES, the --lora-* adapter options and a parsed --threshold."""
    overrides = {name: getattr(args, name) for name in OVERRIDES}
    adapter_options = {name: getattr(args, f"lora_{name}") for name in ("rank", "alpha", "dropout", "targets")
                       if getattr(args, f"lora_{name}") is not None}
    if adapter_options:
        overrides["adapter_options"] = adapter_options
    if args.threshold is not None:
        from kbert.pipeline.config import BOUNDS, check_number

        threshold = args.threshold if args.threshold == "tune" else _probability(args.threshold)
        overrides["threshold"] = check_number(threshold, "--threshold", BOUNDS["threshold"])
    return overrides


def _run_config(args: argparse.Namespace, overrides: dict):
    """The RunConfig from --config or the competition (exactly one of them), with the flags laid over it."""
    from kbert.pipeline.config import load_competition, resolve_run_config, run_config_from_file

    if args.config:
        if args.competition:
            raise KbertError("give a competition or --config, not both")
        return run_config_from_file(args.config, overrides)
    if not args.competition:
        raise KbertError("name a competition (e.g. kbert run titanic) or pass --config FILE")
    competition = load_competition(args.competition)
    if overrides.get("encoder") is None and "encoder" not in competition.training:
        overrides = {**overrides, "encoder": chosen_encoder(competition, overrides.get("data_dir"))}
    return resolve_run_config(competition, overrides)


def chosen_encoder(competition, data_dir: str | None) -> str:
    """The default encoder for this competition's data (pipeline/data.py ``default_encoder``), said on stderr."""
    from kbert.models.encoders import shipped_available
    from kbert.pipeline.data import default_encoder, load_competition_data

    train = load_competition_data(competition, data_dir).train
    encoder, reason = default_encoder(train, competition, shipped_available("minilm-l6"))
    if reason:
        print(reason, file=sys.stderr)
    return encoder


def _probability(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise KbertError(f"--threshold must be a probability or 'tune', got {text!r}") from None
