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


def add_number(parser: argparse.ArgumentParser, flag: str, type: type, bound: str | dict[str, float],
               **kwargs) -> None:
    """A numeric option that ``main`` checks before the handler runs: a finite number (an integer for
    ``type=int``) within ``bound``, the run setting's limits (a name in kbert.pipeline.config.BOUNDS) or
    ``at_least``/``above``/``at_most``/``below``; a refusal is one line naming ``flag``."""
    action = parser.add_argument(flag, type=type, **kwargs)
    numbers = {**(parser.get_default("numbers") or {}), action.dest: (flag, type is int, bound)}
    parser.set_defaults(numbers=numbers)


def check_numbers(args: argparse.Namespace) -> None:
    """The numeric options of ``args`` that were given (see ``add_number``); KbertError on the first bad one.
    argparse's ``type=float`` takes nan and inf, and ``type=int`` takes 0 and negatives: they stop here."""
    from dataclasses import replace

    from kbert.pipeline.config import BOUNDS, Bound, check_number

    for dest, (flag, integer, bound) in (getattr(args, "numbers", None) or {}).items():
        value = getattr(args, dest)
        if value is not None:  # not given, and no default
            limits = replace(BOUNDS[bound], optional=False) if isinstance(bound, str) else Bound(integer, **bound)
            check_number(value, flag, limits)


def check_run_id(value: str, what: str) -> str:
    """A RUN argument that is not a run folder is a run id, looked up under <out>/<competition>/: a plain
    name, never a path that would lead out of --out."""
    from pathlib import Path

    from kbert.errors import KbertError
    from kbert.names import check_name

    path = Path(value)
    if path.is_absolute() or len(path.parts) > 1:
        raise KbertError(f"{what}: no run folder {value} (no config.yaml there)")
    return check_name(value, f"{what} (a run id)")


def print_run_result(result) -> None:
    """The closing lines of `kbert run` and `kbert baseline` (a kbert.pipeline.artifacts.RunResult)."""
    print(f"CV {result.metric}: {result.cv_score:.4f}  (folds: {', '.join(f'{s:.4f}' for s in result.fold_scores)})")
    print(f"run folder: {result.run_dir}")
    print(f"submission: {result.submission_path}")
    print(f"wall time: {result.seconds:.0f}s")

