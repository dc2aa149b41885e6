"""`kbert init`: write a competition YAML for a new CSV pair by inferring its id, target, task and column types.

The result is a starting point for the user to read and edit. It goes to the working folder's
``competitions/<name>.yaml`` (``--out`` moves it), never into the installed package, so ``kbert run <name>`` from
that folder finds it (``find_competition`` looks there before the bundled ones), and ``kbert run <path>`` works
from anywhere: ``data_dir`` is relative to the YAML file, not to the working folder.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pandas as pd
import yaml

from kbert.errors import KbertError
from kbert.io import write_text
from kbert.names import check_name
from kbert.pipeline.config import USER_DIR
from kbert.pipeline.data import near_header, read_csv
from kbert.tasks import Task


def column_dtype(values: pd.Series) -> str:
    if pd.api.types.is_bool_dtype(values) or set(values.dropna().astype(str)) <= {"True", "False"} and values.notna().any():
        return "bool"
    if pd.api.types.is_integer_dtype(values):
        return "int"
    if pd.api.types.is_numeric_dtype(values):
        return "float"
    return "str"


def infer_id_column(train: pd.DataFrame, test: pd.DataFrame, sample: pd.DataFrame | None) -> str:
    if sample is not None:
        return str(sample.columns[0])
    shared = [c for c in train.columns if c in test.columns and train[c].is_unique and test[c].is_unique]
    named = [c for c in shared if re.search(r"(^|_|\b)id$", str(c), re.IGNORECASE)]
    if named:
        return named[0]
    if shared and shared[0] == train.columns[0]:
        return shared[0]
    raise KbertError("could not tell the id column (no unique column named like '...id' in both files); pass --id")


def infer_targets(train: pd.DataFrame, test: pd.DataFrame, sample: pd.DataFrame | None) -> list[str]:
    if sample is not None:
        return [str(c) for c in sample.columns[1:]]
    only_train = [c for c in train.columns if c not in test.columns]
    if not only_train:
        raise KbertError("every training column is also in the test file, so the target is unclear; pass --target")
    return only_train


def infer_task(values: pd.DataFrame) -> Task:
    if values.shape[1] > 1:
        binary = all(set(values[c].dropna().unique()) <= {0, 1} for c in values.columns)
        return Task.MULTILABEL if binary else Task.TIMESERIES
    column = values.iloc[:, 0].dropna()
    distinct = column.nunique()
    if distinct == 2 and (pd.api.types.is_bool_dtype(column) or set(column.unique()) <= {0, 1}):
        return Task.BINARY
    if not pd.api.types.is_numeric_dtype(column) or (pd.api.types.is_integer_dtype(column) and distinct <= 10):
        return Task.MULTICLASS
    return Task.REGRESSION


def data_dir_for(data: Path, yaml_path: Path) -> str:
    """The YAML's ``data_dir``: the data folder relative to the YAML's own folder (load_competition resolves it
    from there, so it holds from any working folder, and a project folder moved whole keeps working); absolute
    where no relative path exists (another drive on Windows)."""
    try:
        return Path(os.path.relpath(data, Path(yaml_path).resolve().parent)).as_posix()
    except ValueError:
        return str(data)


def init_competition(name: str, train_path: Path, test_path: Path, sample_path: Path | None = None,
                     out: Path | None = None, id_column: str | None = None, target: str | None = None,
                     force: bool = False) -> Path:
    """Infer and write ``out`` (default: ``competitions/<name>.yaml`` under the working folder); returns its path."""
    check_name(name, "kbert init NAME")
    train_path, test_path = Path(train_path).resolve(), Path(test_path).resolve()
    if train_path.parent != test_path.parent or (sample_path and Path(sample_path).resolve().parent != train_path.parent):
        raise KbertError(f"{train_path.name}, {test_path.name} (and the sample submission) must be in one folder")
    train, test = read_csv(train_path), read_csv(test_path)
    sample = read_csv(Path(sample_path)) if sample_path else None
    id_column = id_column or infer_id_column(train, test, sample)
    targets = [target] if target else infer_targets(train, test, sample)
    for column in [id_column, *targets]:
        if column not in train.columns:
            hint = near_header(column, train.columns)
            raise KbertError(f"{train_path}: no column '{column}'" + (f"; {hint}" if hint else ""))
    task = infer_task(train[targets])
    features = [c for c in train.columns if c in test.columns and c not in targets]
    if task.probabilities:
        target_dtype = "bool" if column_dtype(train[targets[0]]) == "bool" else "int"
    else:
        target_dtype = column_dtype(train[targets[0]]) if task == Task.MULTICLASS else "float"
    out = Path(out) if out else USER_DIR / f"{name}.yaml"
    if out.exists() and not force:
        raise KbertError(f"{out} exists; pass --force to overwrite it")
    data = {
        "name": name,
        "task": task.value,
        "id_column": id_column,
        "target": targets[0] if len(targets) == 1 else targets,
        "data_dir": data_dir_for(train_path.parent, out),
        "files": {"train": train_path.name, "test": test_path.name,
                  **({"sample_submission": Path(sample_path).name} if sample_path else {})},
        "columns": {c: column_dtype(pd.concat([train[c], test[c]])) for c in features},
        "submission": {"columns": {id_column: column_dtype(test[id_column]), **{t: target_dtype for t in targets}}},
        "text": {"serializer": "list", "columns": [c for c in features if c != id_column], "numeric": "raw",
                 "missing": "unknown"},
        "folds": {"k": 5, "seed": 42},
    }
    header = (f"# Written by `kbert init {name}`: inferred task '{task}', id '{id_column}', target {targets}.\n"
              "# Check the task, pick a metric (default: the task's), and trim text.columns; then `kbert run` it.\n")
    write_text(out, header + yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
    return out
