"""``kbert predict``: predict new rows with a finished run's saved fold models, averaged over the folds.

Each fold's serializer (and, with fusion, its column features) is refitted on that fold's training rows (the
run's folds.csv and its training data) and must reproduce the fold's saved serializer.json (tabular.json)
exactly, so the text and columns the models read are those they were trained on; the tokenizer, weights and
target transform come from ``folds/<k>/``. Every fold the run's config lists must be there and complete, and
every file is read through a checked reader: a missing fold or a damaged file is refused, naming it, before
anything is written.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import mlx.core as mx
import numpy as np
import pandas as pd
from tokenizers import Tokenizer

from kbert.errors import KbertError
from kbert.features import add_features
from kbert.io import read_json, read_table, write_csv
from kbert.models.checkpoints import CONFIG_FILE, TOKENIZER_FILE, load_checkpoint
from kbert.models.heads import HeadConfig
from kbert.models.task_model import TaskModel
from kbert.models.tokenizer import read_tokenizer
from kbert.pipeline.artifacts import (check_predictions_file, fold_layout, fold_name, input_paths, missing_fold_part,
                                      predictions_path, read_metrics, verify_fold_files)
from kbert.pipeline.calibration import apply_temperature
from kbert.pipeline.config import CompetitionConfig, RunConfig, TrainConfig, run_config_from_file
from kbert.pipeline.data import check_feature_rows, load_competition_data, read_csv
from kbert.pipeline.fold import make_serializer, make_tabular, to_predictions, tokenize
from kbert.pipeline.splits import fold_rows
from kbert.pipeline.predictions import average_folds, predictions_frame
from kbert.pipeline.provenance import check_config, check_fold_files_written, check_inputs, expected_of
from kbert.pipeline.targets import TargetTransform, encode_targets
from kbert.pipeline.precision import resolve_precision, use_device
from kbert.pipeline.train import predict_outputs


def resolve_run_dir(run: str, runs_dir: str = "runs") -> Path:
    """A run folder path, or a run id looked up as ``runs/<competition>/<run-id>``."""
    path = Path(run)
    if (path / "config.yaml").is_file():
        return path
    matches = sorted(p.parent for p in Path(runs_dir).glob(f"*/{run}/config.yaml"))
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        raise KbertError(f"run id '{run}' exists for several competitions: {', '.join(map(str, matches))}; "
                         "pass the run folder")
    raise KbertError(f"no run '{run}': not a run folder and not under {runs_dir}/<competition>/")


def predict_run(run_dir: Path, data_path: Path, tta: int = 1, out: Path | None = None, data_dir: str | None = None,
                log=print) -> Path:
    """Predict the rows of ``data_path`` with every fold model of ``run_dir``; write id + prediction columns.
    ``data_dir``: where the competition's files are now (default: where the run read them)."""
    run_dir = Path(run_dir)
    if (run_dir / "metrics.json").is_file():  # an edited config.yaml is said as such before its content is read
        check_config(run_dir, read_metrics(run_dir / "metrics.json"))
    config = run_config_from_file(run_dir / "config.yaml")
    resolve_precision(config.train.precision, use_device(config.train.device))  # as the run asked, on this machine
    comp = config.competition
    rows = read_csv(Path(data_path))  # the user's file first: its mistakes are the likeliest
    check_feature_rows(rows, comp, Path(data_path))
    metrics = read_metrics(run_dir / "metrics.json")
    fold_models = check_fold_models(run_dir, config)
    check_fold_files_written(run_dir, metrics, str(run_dir))
    out = predictions_path(run_dir, data_path, out)
    data = load_competition_data(comp, data_dir if data_dir is not None else config.data_dir or None)
    check_predictions_file(out, data_path, run_dir.parent, *input_paths(comp, data.data_dir))
    check_inputs(metrics, expected_of(comp, data), str(run_dir), with_test=False)  # what it learnt from: these rows
    train = data.train if config.limit_rows is None else data.train.iloc[: config.limit_rows].reset_index(drop=True)
    features, new_features = new_row_features(comp, train, data.test, rows)
    folds = read_fold_table(run_dir / "folds.csv", comp.id_column, comp.folds.repeats, train[comp.id_column])
    targets = encode_targets(train, comp)

    outputs, predictions = [], []
    for fold_dir, repeat, k in fold_models:
        fold_of_row = folds["fold" if repeat == 0 else f"fold_repeat{repeat}"].to_numpy()
        train_index, valid_index = fold_rows(fold_of_row, k, comp.folds)
        serializer = refitted(make_serializer(config), features.iloc[train_index], fold_dir / "serializer.json")
        tabular = make_tabular(config, train, features)
        columns = ()
        if tabular is not None:
            columns = refitted(tabular, features.iloc[train_index], fold_dir / "tabular.json").transform(new_features)
        model, checkpoint, tokenizer = load_fold_model(fold_dir)
        variants = [predict_outputs(model, tokenize(config, tokenizer, serializer, new_features, fold=(repeat, k),
                                                    variant=variant), as_the_fold_ran(config.train, fold_dir),
                                    columns=columns)
                    for variant in range(max(1, tta))]
        fold_outputs = np.mean(variants, axis=0)
        head = HeadConfig.from_dict(checkpoint["head"])
        transform = saved_target_transform(fold_dir / CONFIG_FILE, checkpoint)
        if not np.isfinite(fold_outputs).all():
            raise KbertError(f"{fold_dir}: its model predicts NaN or infinite values (damaged weights?); nothing "
                             "was written")
        outputs.append(fold_outputs)
        predictions.append(to_predictions(head, fold_outputs, transform))
        del model
        mx.clear_cache()
        log(f"folds/{fold_dir.name}: {len(new_features)} rows predicted")
    mean = average_folds(predictions)
    if "calibration" in metrics:  # a calibrated run: temperature-scale the fold-averaged logits, as the run did
        mean = to_predictions(head, apply_temperature(average_folds(outputs), metrics["calibration"]["temperature"]),
                              None)
    return write_csv(out, predictions_frame(comp, targets.classes, rows[comp.id_column], mean))


def new_row_features(comp: CompetitionConfig, train: pd.DataFrame, test: pd.DataFrame,
                     rows: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The feature rows of the training data and of ``rows``, made as the run made the test's: a feature step may
    read the train and test rows together (Titanic's ticket group sizes), so it runs over the training rows, the
    competition's test rows and those of ``rows`` that are not among them. A test row keeps the features it had in
    the run, in any subset or order; a row the test does not hold (another id, or other values) joins the
    context, as the rows of Kaggle's hidden test do. The training and test rows keep the features they had in the
    run (a new row sharing a ticket with one does not change its group size): the fold's fitted statistics are
    refitted on the training rows and must match the saved ones."""
    columns, id_column = list(comp.columns), comp.id_column
    new, train = rows[columns].reset_index(drop=True), train[columns]  # as input_rows reads them
    if not comp.features:
        return train, new
    known = test[columns].drop_duplicates(id_column).set_index(id_column)
    same = known.reindex(new[id_column]).to_numpy(object)
    values = new.set_index(id_column).to_numpy(object)
    in_test = new[id_column].isin(known.index).to_numpy() & ((same == values) |
                                                              (pd.isna(same) & pd.isna(values))).all(axis=1)
    train_features, pool = add_features(comp.features, train, test[columns])  # as the run made them
    if not in_test.all():  # the rows the test lacks, made with them in the context
        _, context_features = add_features(comp.features, train,
                                           pd.concat([test[columns], new[~in_test]], ignore_index=True))
        pool = pd.concat([pool, context_features.iloc[len(test):]], ignore_index=True)
    first = pd.Series(np.arange(len(test)), index=test[id_column].to_numpy()).groupby(level=0).first()
    positions = np.where(in_test, first.reindex(new[id_column]).fillna(0).to_numpy(int),
                         len(test) + np.cumsum(~in_test) - 1)
    return train_features, pool.iloc[positions].set_index(rows.index)


def refitted(transform, train_rows: pd.DataFrame, saved: Path):
    """``transform`` (a serializer or the fusion's column features) fitted on a fold's training rows, which must
    reproduce the fitted statistics the run saved in ``saved``: the model reads what it was trained on."""
    transform.fit(train_rows)
    if json.loads(json.dumps(transform.fitted_statistics())) != read_json(saved):
        raise KbertError(f"{saved.parent}: the {saved.stem} statistics refitted on this fold's training rows differ "
                         f"from the saved {saved.name}; the training data changed since the run")
    return transform


def check_fold_models(run_dir: Path, config: RunConfig) -> list[tuple[Path, int, int]]:
    """(folder, repeat, fold) of every fold the run's config lists, each complete (``missing_fold_part``); a
    run whose folds keep no weights at all (a tuning trial outside the top-N) is refused as such."""
    listed = [(run_dir / "folds" / fold_name(r, k, config.competition.folds.repeats, s), r, k)
              for s, r, k in fold_layout(config)]
    if not any(any(fold_dir.glob("*.safetensors")) for fold_dir, _, _ in listed):
        raise KbertError(f"{run_dir}: no fold models in folds/ (a tuning trial outside the top-N keeps none)")
    for fold_dir, _, _ in listed:
        missing = missing_fold_part(fold_dir)
        if missing is not None:
            state = "fold missing" if missing == "the folder" else f"fold incomplete (no {missing})"
            raise KbertError(f"{fold_dir}: {state}; the run's config lists {len(listed)} folds and kbert predict "
                             "uses every one")
    return listed


def as_the_fold_ran(train: TrainConfig, fold_dir: Path) -> TrainConfig:
    """``train`` on the CPU streams the fold recorded in its fold.json (read after ``load_fold_model`` checked it):
    a batch sharded over another count rounds otherwise, and the predictions would differ from the run's in their
    last bits. A fold of an older kbert, which recorded none: the config's."""
    streams = read_json(fold_dir / "fold.json")["record"].get("streams")
    return train if streams is None else replace(train, cpu_streams=int(streams))


def load_fold_model(fold_dir: Path) -> tuple[TaskModel, dict, Tokenizer]:
    """A finished fold's model, checkpoint config and tokenizer, read (a damaged file: its own error) and then
    verified against the checksums its fold.json recorded (a swapped or altered one: refused)."""
    model, checkpoint = load_checkpoint(fold_dir)
    tokenizer = read_tokenizer(fold_dir / TOKENIZER_FILE)
    verify_fold_files(fold_dir)
    return model, checkpoint, tokenizer


def read_fold_table(path: Path, id_column: str, repeats: int, train_ids: pd.Series) -> pd.DataFrame:
    """The run's folds.csv (id, fold, fold_repeat<r>), in the order of ``train_ids``."""
    columns = ("fold", *(f"fold_repeat{r}" for r in range(1, repeats)))
    folds = read_table(path, required=(id_column, *columns))
    if folds[id_column].duplicated().any() or not train_ids.isin(folds[id_column]).all():
        raise KbertError(f"{path}: its ids are not the training data's; the training data changed since the run")
    if not all(pd.api.types.is_integer_dtype(folds[c]) for c in columns):
        raise KbertError(f"{path}: fold columns must hold whole numbers")
    return folds.set_index(id_column).loc[train_ids.to_numpy()]


def saved_target_transform(path: Path, checkpoint: dict) -> TargetTransform | None:
    """The fold's target transform as its config.json (``path``) saved it; None for none."""
    values = checkpoint.get("target_transform")
    if not values:
        return None
    try:
        return TargetTransform(**values)
    except TypeError as exc:
        raise KbertError(f"{path}: 'target_transform' is not a target transform: {exc}") from None
