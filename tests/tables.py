"""A small CSV competition for a test: the train and test frames written as CSV files and a competition YAML
beside them (the list serializer; column types read off the training frame). Returns the YAML's path."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import yaml

KINDS = {"i": "int", "u": "int", "f": "float", "O": "str"}  # numpy dtype kind -> competition column type


def write_competition(folder: Path, name: str, train: pd.DataFrame, test: pd.DataFrame, target: str,
                      task: str = "binary", target_type: str = "int", data_dir: str = ".", **settings) -> Path:
    """``train``'s first column is the id; ``settings`` (folds, training, ...) are added to the YAML as given."""
    data = folder / data_dir
    data.mkdir(parents=True, exist_ok=True)
    train.to_csv(data / "train.csv", index=False)
    test.to_csv(data / "test.csv", index=False)
    id_column = train.columns[0]
    spec = {"name": name, "task": task, "metric": "accuracy", "id_column": id_column, "target": target,
            "data_dir": data_dir, "files": {"train": "train.csv", "test": "test.csv"},
            "columns": {c: KINDS[train[c].dtype.kind] for c in train.columns if c != target},
            "submission": {"columns": {id_column: "int", target: target_type}}, "text": {"serializer": "list"},
            **settings}
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    return path
