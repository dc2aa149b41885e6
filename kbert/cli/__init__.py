"""The ``kbert`` command line: ``main`` (the console script) and ``build_parser``.

Each command's options and handler sit together in one module of this package, which adds its subparser with
``add_parser`` and names the handler with ``set_defaults(handler=...)``; common.py holds the options several share.
Handlers import MLX, pandas and the pipeline lazily, so ``kbert --help`` stays fast and ``runtime.setup()`` runs
before MLX loads.
"""

from __future__ import annotations

import argparse
import os
import sys

from kbert.cli import (adversarial, auto, baseline, competition, doctor, ensemble, kaggle, predict, pretrain, report, run,
                       show_text, tune)
from kbert.cli.common import check_numbers
from kbert.errors import KbertError, os_error_line

DESCRIPTION = """kbert: fine-tune BERT-family encoders in MLX on Kaggle competitions.

Tabular rows become text, a BERT encoder is trained per fold, and the fold models'
out-of-fold and test predictions are written to runs/ with a submission file."""

# in the order `kbert --help` lists their commands
COMMAND_MODULES = (auto, run, tune, baseline, ensemble, adversarial, predict, doctor, competition, pretrain, kaggle, report,
                   show_text)


class Parser(argparse.ArgumentParser):
    """argparse's parser, whose refusal of an option is one line, like every other refusal (argparse prints the
    whole usage first); the subcommands' parsers are of this class too."""

    def error(self, message: str):
        self.exit(2, f"kbert: error: {message}; `{self.prog} --help` lists the options\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="kbert", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMAND_MODULES:
        module.add_parser(commands)
    return parser


def subcommands(parser: argparse.ArgumentParser) -> argparse._SubParsersAction:
    return next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction))


def cli_markdown() -> str:
    """docs/cli-reference.md: ``kbert --help`` and every command's ``--help``, as the parsers print them at 100
    columns (docs/make_cli.py writes it; tests/test_docs.py checks that it is current)."""
    parser = build_parser()
    commands = subcommands(parser)
    lines = ["# Command-line reference", "", "Every `kbert` command's options, generated from its parser (kbert/cli) by "
             "`python docs/make_cli.py`."]
    for name, command in [("kbert", parser), *((f"kbert {n}", p) for n, p in commands.choices.items())]:
        formatter = command.formatter_class
        command.formatter_class = lambda prog, formatter=formatter: formatter(prog, width=100)
        lines += ["", f"## `{name}`", "", "```text", command.format_help().rstrip(), "```"]
    return "\n".join(lines) + "\n"


def missing_mlx_backend() -> str | None:
    """On Linux, MLX's wheel brings no backend by itself: the cpu or cuda extra installs one (mlx/lib/libmlx.so).
    Checked without importing mlx.core, which must load after the BLAS is bound."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("mlx")
    if sys.platform != "linux" or spec is None or not spec.submodule_search_locations:
        return None
    if any((Path(folder) / "lib" / "libmlx.so").exists() for folder in spec.submodule_search_locations):
        return None
    return ('MLX is installed without a backend; pip install -e ".[cpu]" (or ".[cuda]" for an NVIDIA GPU), or '
            'pip install "mlx[cpu]"')


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # named by the command's parser, whose --help lists its options
        subcommands(parser).choices.get(args.command, parser).error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.command is None:
        parser.print_help()
        return 2
    missing = missing_mlx_backend()
    if missing:
        print(f"kbert: error: {missing}", file=sys.stderr)
        return 2
    from kbert.models import runtime

    blas = runtime.setup().blas  # before any command imports mlx.core
    if blas.slow and args.command != "doctor":  # doctor says it in its own words
        print(f"kbert: warning: {blas.note}", file=sys.stderr)
    if getattr(args, "no_progress", False):  # huggingface_hub's download bars too (models/hub.py imports it late)
        os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    try:
        check_numbers(args)
        return args.handler(args)
    except KbertError as exc:
        print(f"kbert: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("kbert: interrupted", file=sys.stderr)
        return 130
    except OSError as exc:  # from a file no kbert writer names (a library's own: Optuna's journal, a download)
        print(f"kbert: error: {os_error_line(exc)}", file=sys.stderr)
        return 2
