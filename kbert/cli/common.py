"""What several ``kbert`` command modules share: adding a subcommand, the options they repeat (competition,
--data-dir, --out, --submissions-dir), a run setting's option as pipeline/config.py declares it, and the closing
lines of a run.

The option helpers take the help text and default where commands differ, so each command's ``--help`` reads as
it always has."""

from __future__ import annotations

import argparse
import os
from typing import Any

COMPETITION_HELP = "a name under competitions/ or a path to a competition YAML"


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


def add_data_dir(parser: argparse.ArgumentParser, help: str | None = None) -> None:
    add_setting(parser, "data_dir", help=help)


def add_out(parser: argparse.ArgumentParser, default: str | None = None, help: str | None = None) -> None:
    """``--out``: the runs folder, as ``args.out_dir``."""
    add_setting(parser, "out_dir", help=help, default=default)


def add_submissions_dir(parser: argparse.ArgumentParser, default: str | None = None, help: str | None = None) -> None:
    add_setting(parser, "submissions_dir", help=help, default=default)


def add_setting(parser: argparse.ArgumentParser, key: str, help: str | None = None, default: Any = None) -> None:
    """The option of run setting ``key`` (kbert.pipeline.config.SETTINGS) as its declaration gives it: its flag,
    help, the words it takes, a number ``check_numbers`` checks, or a switch away from a bool's default; its value
    is ``args.<key>``. ``help`` and ``default`` where a command words or uses it its own way; a setting declared
    with ``env`` takes that environment variable's value when it is set and the flag is not given."""
    from kbert.pipeline.config import SETTINGS, Bound

    declared = SETTINGS[key]
    meta, bound = declared.metadata, declared.metadata["bound"]
    env = meta["env"]
    if env:  # (check_numbers reads it, naming the variable: argparse's own refusal named the flag)
        parser.set_defaults(environment={**(parser.get_default("environment") or {}), key: env})
    options = {"dest": key, "default": default, "help": (help or meta["help"]) +
               (f" (default: ${env} when set)" if env else "")}
    if meta["metavar"]:
        options["metavar"] = meta["metavar"]
    if isinstance(declared.default, bool):
        parser.add_argument(meta["flag"], action="store_const", const=not declared.default, **options)
    elif isinstance(bound, Bound) and not bound.words:
        add_number(parser, meta["flag"], int if bound.integer else float, key, **options)
    else:
        parser.add_argument(meta["flag"], choices=meta["choices"] or None, **options)


def add_number(parser: argparse.ArgumentParser, flag: str, type: type, bound: str | dict[str, float],
               **kwargs) -> None:
    """A numeric option that ``main`` checks before the handler runs: a finite number (an integer for
    ``type=int``) within ``bound``, the run setting's limits (a key of kbert.pipeline.config.SETTINGS) or
    ``at_least``/``above``/``at_most``/``below``; a refusal is one line naming ``flag``."""
    action = parser.add_argument(flag, type=type, **kwargs)
    numbers = {**(parser.get_default("numbers") or {}), action.dest: (flag, type is int, bound)}
    parser.set_defaults(numbers=numbers)


def check_numbers(args: argparse.Namespace) -> None:
    """The numeric options of ``args`` that were given (see ``add_number``); KbertError on the first bad one.
    argparse's ``type=float`` takes nan and inf, and ``type=int`` takes 0 and negatives: they stop here."""
    from dataclasses import replace

    from kbert.pipeline.config import Bound, bound_of, check_number

    for dest, env in (getattr(args, "environment", None) or {}).items():  # a setting's variable, where no flag
        text = os.environ.get(env)
        if getattr(args, dest) is None and text:
            limits = replace(bound_of(dest), optional=False)
            value = text
            for read in ((int, float) if limits.integer else (float,)):  # (120.0 is then said not to be an integer)
                try:
                    value = read(text)
                    break
                except ValueError:
                    pass
            setattr(args, dest, check_number(value, f"the environment's {env}", limits))
    for dest, (flag, integer, bound) in (getattr(args, "numbers", None) or {}).items():
        value = getattr(args, dest)
        if value is not None:  # not given, and no default
            limits = replace(bound_of(bound), optional=False) if isinstance(bound, str) else Bound(integer, **bound)
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
    from kbert.io import read_json

    metrics = read_json(result.run_dir / "metrics.json")
    folds = ", ".join(f"{s:.4f}" for s in result.fold_scores)
    calibration = metrics.get("calibration")
    if calibration:  # the CV is of the cross-fitted calibrated OOF; each fold's score is its model's own
        print(f"CV {result.metric}: {result.cv_score:.4f} calibrated (each fold's rows by a temperature fitted on the "
              f"other folds), {calibration['cv_uncalibrated']:.4f} uncalibrated  (folds, uncalibrated: {folds})")
        from kbert.pipeline.calibration import temperature_at_bound

        if temperature_at_bound(calibration["temperature"]):
            print(f"note: the temperature {calibration['temperature']:.4g} is at the end of its search range: the "
                  "calibrated probabilities are nearly constant, the model's outputs carry little signal")
    else:
        print(f"CV {result.metric}: {result.cv_score:.4f}  (folds: {folds})")
    threshold = metrics.get("threshold") or {}
    if "cv_cross_fitted" in threshold:
        print(f"CV {result.metric} at a threshold tuned on the other folds: {threshold['cv_cross_fitted']:.4f}")
    print(f"run folder: {result.run_dir}")
    print(f"submission: {result.submission_path}")
    print(f"wall time: {result.seconds:.0f}s")

