"""``kbert validate`` (check a submission against the sample submission) and ``kbert init`` (write a competition
YAML for a new CSV pair): their options and handlers."""

from __future__ import annotations

import argparse

from kbert.cli.common import add_command, add_competition, add_data_dir


def add_parser(commands) -> None:
    validate = add_command(commands, "validate", help="check a submission file against the sample submission",
                           description="Check that a submission CSV has the sample submission's columns, "
                                       "row count, ids and dtypes. Exits 0 when it does, 2 otherwise.")
    add_competition(validate)
    validate.add_argument("file", help="the submission CSV to check")
    add_data_dir(validate, help="folder with the competition's CSV files, the sample submission among them "
                                "(default: as kbert run)")
    validate.set_defaults(handler=cmd_validate)

    init = add_command(commands, "init", help="write a competition YAML for a new train/test CSV pair",
                       description="Infer the id, target, task and column types of a CSV pair, what the "
                                   "submission holds (from the sample submission) and a metric that fits it, and "
                                   "write a competition YAML to edit; `kbert run` works on it as is.")
    init.add_argument("name", help="the competition's name")
    init.add_argument("--train", required=True, help="training CSV")
    init.add_argument("--test", required=True, help="test CSV (same folder)")
    init.add_argument("--sample-submission", help="sample submission CSV: names the id and target columns, and its "
                                                  "cells say what to submit (float: probabilities; else labels)")
    init.add_argument("--out", help="where to write the YAML (default: competitions/<name>.yaml in the working folder)")
    init.add_argument("--id", dest="id_column", help="the id column (default: inferred)")
    init.add_argument("--target", help="the target column (default: the training column missing from test)")
    init.add_argument("--force", action="store_true", help="overwrite an existing YAML")
    init.set_defaults(handler=cmd_init)


def cmd_validate(args: argparse.Namespace) -> int:
    """Also the first step of ``kbert submit``: args needs competition, file and data_dir. Reads the files it needs
    alone: the sample submission (else the test file's ids) and, for a task with classes the YAML does not list, the
    training rows."""
    from pathlib import Path

    import pandas as pd

    from kbert.pipeline.config import load_competition
    from kbert.pipeline.data import read_csv, resolve_data_dir, written_labels
    from kbert.pipeline.submission import validate_submission
    from kbert.pipeline.targets import encode_targets
    from kbert.tasks import Task

    competition = load_competition(args.competition)
    folder = resolve_data_dir(competition, args.data_dir)
    targets = competition.target_columns

    def labelled(name: str) -> pd.DataFrame:  # a file with target columns, read as written
        return written_labels(folder / name, read_csv(folder / name), targets)

    if competition.sample_submission_file:
        sample, test_ids = labelled(competition.sample_submission_file), None
    else:
        sample, test_ids = None, read_csv(folder / competition.test_file)[competition.id_column]
    classes = None
    if Task(competition.task).classes:  # multiclass, ordinal
        train = (pd.DataFrame(columns=targets) if competition.classes  # the YAML's classes need no training rows
                 else labelled(competition.train_file))
        classes = encode_targets(train, competition).classes
    submission = read_csv(Path(args.file))
    labels = [c for c in submission.columns if c != competition.id_column]  # a class named NA is a class there too
    validate_submission(written_labels(Path(args.file), submission, labels), sample, competition,
                        source=args.file, test_ids=test_ids, classes=classes)
    rows = len(sample) if sample is not None else len(test_ids)
    print(f"{args.file}: valid {competition.name} submission ({rows} rows)")
    return 0


def cmd_init(args: argparse.Namespace) -> int:
    from kbert.pipeline.init import DataFiles, init_competition

    path = init_competition(args.name, DataFiles(args.train, args.test, args.sample_submission), out=args.out,
                            id_column=args.id_column, target=args.target, force=args.force)
    print(f"wrote {path}; check it, then: kbert run {path}")
    return 0
