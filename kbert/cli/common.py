"""What several ``kbert`` command modules share: adding a subcommand, the options they repeat (competition,
--data-dir, --out, --submissions-dir) and the closing lines of a run.

The option helpers take the help text and default where commands differ, so each command's ``--help`` reads as
it always has; the ``*_HELP`` constants are the wordings most commands use."""

from __future__ import annotations

import argparse

COMPETITION_HELP = "a name under competitions/ or a path to a competition YAML"
DATA_DIR_HELP = "folder with the competition's CSV files (default: the bundled copy)"
OUT_HELP = "runs folder (default: runs)"
SUBMISSIONS_DIR_HELP = "submissions folder (default: submissions)"


def add_command(commands, name: str, help: str, description: str | None = None,
                epilog: str | None = None) -> argparse.ArgumentParser:
    """A subcommand's parser; with an epilog (examples, layouts), description and epilog are printed as written."""
    if epilog is None:
        return commands.add_parser(name, help=help, description=description)
    return commands.add_parser(name, help=help, description=description, epilog=epilog,
                               formatter_class=argparse.RawDescriptionHelpFormatter)


def add_competition(parser: argparse.ArgumentParser, help: str = COMPETITION_HELP, optional: bool = False) -> None:
    """The ``competition`` positional; optional where another option (``--config``) can name it instead."""
    if optional:
        parser.add_argument("competition", nargs="?", help=help)
    else:
        parser.add_argument("competition", help=help)


def add_data_dir(parser: argparse.ArgumentParser, help: str = DATA_DIR_HELP) -> None:
    parser.add_argument("--data-dir", help=help)


def add_out(parser: argparse.ArgumentParser, default: str | None = None, help: str = OUT_HELP) -> None:
    """``--out``: the runs folder, as ``args.out_dir``."""
    parser.add_argument("--out", dest="out_dir", default=default, help=help)


def add_submissions_dir(parser: argparse.ArgumentParser, default: str | None = None,
                        help: str = SUBMISSIONS_DIR_HELP) -> None:
    parser.add_argument("--submissions-dir", default=default, help=help)


def print_run_result(result) -> None:
    """The closing lines of `kbert run` and `kbert baseline` (a kbert.pipeline.artifacts.RunResult)."""
    print(f"CV {result.metric}: {result.cv_score:.4f}  (folds: {', '.join(f'{s:.4f}' for s in result.fold_scores)})")
    print(f"run folder: {result.run_dir}")
    print(f"submission: {result.submission_path}")
    print(f"wall time: {result.seconds:.0f}s")

