"""``kbert pretrain``: masked-language-model pretraining of an encoder on the competition's rows as text (options
and handler)."""

from __future__ import annotations

import argparse

from kbert.cli.common import add_command, add_competition, add_data_dir, add_number, add_out

EPILOG = """examples:
  kbert pretrain titanic --steps 3000 --run-id mlm          from scratch, the size kbert run trains
  kbert run titanic --encoder runs/titanic/pretrain/mlm     fine-tune it on the folds
  kbert pretrain titanic --encoder minilm-l6 --steps 1000   continue pretraining a pretrained encoder

output: runs/<competition>/pretrain/<id>/{config.json, model.safetensors (encoder + MLM head), tokenizer.json,
pretrain.json (held-out masked accuracy, perplexity, history, token counts, time)}"""


def add_parser(commands) -> None:
    pretrain = add_command(commands, "pretrain", help="masked-language-model pretraining on the competition's text",
                           description="Pretrain an encoder with masked-language modelling on every train "
                                       "and test row as text (never a target column), then fine-tune it "
                                       "with kbert run --encoder runs/<competition>/pretrain/<id>.",
                           epilog=EPILOG)
    add_competition(pretrain)
    _add_encoder_source(pretrain)
    _add_masking_options(pretrain)
    add_number(pretrain, "--vocab-size", int, "vocab_size",
               help="from scratch: WordPiece vocabulary size (default: the run's, 1000; never below the corpus's "
                    "distinct characters, each of which WordPiece keeps)")
    add_number(pretrain, "--max-length", int, "max_length",
               help="maximum tokens per row (default: the run's); from scratch, also the encoder's position table, so "
                    "a run fine-tuning it takes at most this many")
    add_number(pretrain, "--seed", int, "seed", default=42)
    pretrain.add_argument("--run-id", help="folder name under runs/<competition>/pretrain/ (default: timestamp)")
    add_data_dir(pretrain, help="folder with the competition's CSV files (default: as kbert run)")
    add_out(pretrain)
    pretrain.add_argument("--no-progress", action="store_true", help="print evaluations instead of a progress bar")
    pretrain.set_defaults(handler=cmd_pretrain)


def _add_encoder_source(pretrain: argparse.ArgumentParser) -> None:
    """--from-scratch SIZE or --encoder NAME, not both."""
    source = pretrain.add_mutually_exclusive_group()
    source.add_argument("--from-scratch", dest="scratch", metavar="SIZE",
                        help="bert (default: the size kbert run trains, with a WordPiece vocabulary learned on the "
                             "corpus) or a preset (bert-mini, modernbert-base, neobert, ...)")
    from kbert.pipeline.config import shipped_names

    source.add_argument("--encoder", help=f"continue pretraining a pretrained encoder: a shipped name "
                                          f"({shipped_names()}), a model folder or a Hugging Face Hub id "
                                          "(org/name[@revision])")


def _add_masking_options(pretrain: argparse.ArgumentParser) -> None:
    add_number(pretrain, "--steps", int, {"at_least": 1}, default=2000, help="optimizer steps (default 2000)")
    add_number(pretrain, "--batch-size", int, "batch_size", default=64, help="texts per step (default 64)")
    add_number(pretrain, "--lr", float, "learning_rate", dest="learning_rate",
               help="peak learning rate (default 5e-4 from scratch, 5e-5 for a pretrained encoder)")
    add_number(pretrain, "--mask-prob", float, {"above": 0, "below": 1}, default=0.15,
               help="share of tokens predicted (default 0.15)")
    pretrain.add_argument("--whole-word", action="store_true", help="mask whole words, not single word pieces")
    add_number(pretrain, "--augment", int, "augment", default=4,
               help="augmented serializations of every row next to the plain one (default 4)")
    add_number(pretrain, "--holdout", float, {"above": 0, "below": 1}, default=0.05,
               help="share of rows held out for masked accuracy and perplexity (default 0.05)")
    add_number(pretrain, "--eval-every", int, {"at_least": 1}, default=200,
               help="steps between held-out evaluations")


def cmd_pretrain(args: argparse.Namespace) -> int:
    from kbert.names import check_name
    from kbert.pipeline.config import load_competition, resolve_run_config
    from kbert.pipeline.pretrain import PretrainConfig, pretrain

    if args.run_id is not None:
        check_name(args.run_id, "--run-id")
    check_encoder_source(args)
    overrides = {name: getattr(args, name) for name in ("vocab_size", "max_length", "data_dir", "out_dir")}
    config = resolve_run_config(load_competition(args.competition), overrides)
    settings = PretrainConfig(encoder=args.encoder or args.scratch or "bert", steps=args.steps,
                              batch_size=args.batch_size, learning_rate=args.learning_rate, mask_prob=args.mask_prob,
                              whole_word=args.whole_word, augment=args.augment, holdout=args.holdout,
                              eval_every=args.eval_every, seed=args.seed)
    folder = pretrain(config, settings, run_id=args.run_id, progress=not args.no_progress)
    length = f" --max-length {args.max_length}" if args.max_length is not None else ""  # (its position table)
    print(f"encoder: {folder}\nfine-tune it: kbert run {args.competition} --encoder {folder}{length}")
    return 0


def check_encoder_source(args: argparse.Namespace) -> None:
    """--from-scratch names a size to train from scratch, --encoder a pretrained one, and --vocab-size (a
    vocabulary learned on the corpus) goes with the first: each the other way round was done silently otherwise."""
    from kbert.errors import KbertError
    from kbert.models.encoders import is_pretrained_name, preset_names, trains_from_scratch
    from kbert.names import did_you_mean

    if args.scratch is not None and not trains_from_scratch(args.scratch):
        if not is_pretrained_name(args.scratch):
            sizes = ["bert", *preset_names()]
            raise KbertError(f"--from-scratch {args.scratch}: not a size to train from scratch"
                             f"{did_you_mean(args.scratch, sizes)}; known: {', '.join(sizes)}")
        raise KbertError(f"--from-scratch {args.scratch}: a pretrained encoder, not a size to train from scratch; "
                         f"continue pretraining it with --encoder {args.scratch}")
    if args.encoder is not None and trains_from_scratch(args.encoder):
        raise KbertError(f"--encoder {args.encoder}: a size trained from scratch; pretrain it with --from-scratch "
                         f"{args.encoder}")
    if args.encoder is not None and args.vocab_size is not None:
        raise KbertError(f"--vocab-size: --encoder {args.encoder} keeps its own vocabulary; a vocabulary is learned "
                         "only --from-scratch")
