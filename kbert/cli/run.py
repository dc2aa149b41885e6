"""``kbert run``: train k fold models and write OOF, test predictions and a submission (its options and handler)."""

from __future__ import annotations

import argparse
import sys

from kbert.cli.common import add_command, add_competition, add_number, add_setting, print_run_result
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

def add_parser(commands) -> None:
    run = add_command(commands, "run", help="train k fold models and write OOF, test predictions and a submission",
                      description="Run the whole pipeline for one competition: folds -> text -> tokens -> "
                                  "MLX training per fold -> OOF/test predictions -> submission.",
                      epilog=EPILOG)
    add_competition(run, help="a name under competitions/ (e.g. titanic) or a path to a competition YAML",
                    optional=True)
    run.add_argument("--config", help="a run config YAML: a run's config.yaml, `kbert tune --report`'s best.yaml, "
                     "or `competition: <name>` with settings (flags override them)")
    run.add_argument("--run-id", help="name of the run folder (default: <timestamp>-seed<S>)")
    run.add_argument("--no-progress", action="store_true", help="hide the per-fold progress bars")
    run.add_argument("--profile", action="store_true",
                     help="print where the wall time went (preparation, tokenization, tracing, training steps, "
                          "evaluation, writing) per fold, and write it to the run folder's profile.json")
    from kbert.pipeline.config import FLAG_SECTIONS, flags

    for section, settings in FLAG_SECTIONS.items():
        group = run.add_argument_group(f"{section} settings")
        for key in flags(settings):
            add_setting(group, key)
        if section == "model":
            _add_adapter_options(group)
    run.set_defaults(handler=cmd_run)


def _add_adapter_options(group) -> None:
    """The --lora-* flags: models/adapters.py AdapterConfig settings under the model's adapter_options."""
    add_number(group, "--lora-rank", int, "adapter_options.rank", help="adapter rank (overrides the preset's)")
    add_number(group, "--lora-alpha", float, "adapter_options.alpha",
               help="adapter alpha: the update is scaled by alpha / rank")
    add_number(group, "--lora-dropout", float, "adapter_options.dropout", help="dropout on the adapters' input")
    group.add_argument("--lora-targets", help="encoder layers to adapt: a set named in each architecture's own "
                       "layer names (default: every linear layer of the blocks; attention: the q/k/v projections; "
                       "query-value), or comma-separated name patterns (e.g. query,value or attention.* or Wqkv,Wo,Wi)")


def cmd_run(args: argparse.Namespace) -> int:
    from contextlib import nullcontext
    from pathlib import Path

    from kbert.io import write_json
    from kbert.names import check_run_name
    from kbert.pipeline.profile import profiling
    from kbert.pipeline.run import new_run_id, run_competition

    if args.run_id is not None:
        check_run_name(args.run_id, "--run-id")
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
    """The flags as RunConfig overrides: the flagged settings, the --lora-* adapter options, a parsed --threshold."""
    from kbert.pipeline.config import FLAG_SECTIONS, flags

    overrides = {name: getattr(args, name) for settings in FLAG_SECTIONS.values() for name in flags(settings)}
    adapter_options = {name: getattr(args, f"lora_{name}") for name in ("rank", "alpha", "dropout", "targets")
                       if getattr(args, f"lora_{name}") is not None}
    if adapter_options:
        overrides["adapter_options"] = adapter_options
    if args.threshold is not None:
        from kbert.pipeline.config import bound_of, check_number

        threshold = args.threshold if args.threshold == "tune" else _probability(args.threshold)
        overrides["threshold"] = check_number(threshold, "--threshold", bound_of("threshold"))
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
