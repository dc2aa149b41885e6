"""``kbert predict`` beyond an encoder run (pipeline/new_rows.py): a baseline's saved fold models on new rows, a run's
or baseline's submission for them, and an ensemble's.

A baseline's new rows get the features its folds read: the competition's feature step with the test rows as
context (``new_row_features``), and with ``--embeddings`` fold k's embedding columns from the same source, reduced
by the PCA fold k saved. An ensemble predicts with every member, then refits its blend on the members' stored OOF
predictions (it must come out as its JSON records it) and applies it. Every file is read and checked before
anything is written.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from kbert.ensembles.baseline import Baseline, predict_fold
from kbert.ensembles.baseline_models import MODELS_FILE, load_fold_models
from kbert.ensembles.blend import Blend, BlendOptions, apply_blend, apply_decision, fit_blend
from kbert.ensembles.embedding_features import new_rows_with_embeddings, open_embedding_source
from kbert.ensembles.ensemble import check_blended, check_record, load_problem
from kbert.ensembles.members import Member, common_rows
from kbert.errors import KbertError
from kbert.io import read_json, read_predictions, write_csv
from kbert.names import check_name
from kbert.pipeline.artifacts import check_predictions_file, input_paths, is_the_run, predictions_path, read_metrics
from kbert.pipeline.config import CompetitionConfig, RunConfig, competition_from_dict, read_yaml
from kbert.pipeline.data import CompetitionData, check_feature_rows, load_competition_data, read_csv
from kbert.pipeline.new_rows import new_row_features, predict_run, read_fold_table
from kbert.pipeline.predictions import average_folds, native, predictions_frame
from kbert.pipeline.provenance import Expected, check_member, expected_of, member_config
from kbert.pipeline.splits import fold_rows
from kbert.pipeline.submission import write_predictions_submission


def is_baseline(run_dir: Path) -> bool:
    saved = read_yaml(Path(run_dir) / "config.yaml")
    return isinstance(saved, dict) and "baseline" in saved


def check_all_rows(run_dir: Path, config: RunConfig) -> None:
    """A baseline predicts new rows only when it was trained on every row (its column kinds and fitted transforms
    are read again from the training file)."""
    if config.limit_rows is not None:
        raise KbertError(f"{run_dir}: a --limit-rows {config.limit_rows} baseline; kbert predict reads baselines "
                         "trained on every row")


def predict_baseline(run_dir: Path, data_path: Path, out: Path | None = None, data_dir: str | None = None,
                     log=print) -> Path:
    """Predict the rows of ``data_path`` with every fold model of the baseline in ``run_dir``, averaged as its
    test predictions were; write id + prediction columns. ``data_dir``: where the competition's files are now
    (default: where the baseline read them)."""
    run_dir = Path(run_dir)
    saved = read_yaml(run_dir / "config.yaml")
    config = member_config(run_dir)
    comp = config.competition
    rows = read_csv(Path(data_path))  # the user's file first: its mistakes are the likeliest
    check_feature_rows(rows, comp, Path(data_path))
    out = predictions_path(run_dir, data_path, out)
    data = load_competition_data(comp, data_dir if data_dir is not None else config.data_dir or None)
    check_predictions_file(out, data_path, run_dir.parent, *input_paths(comp, data.data_dir))
    check_all_rows(run_dir, config)
    expected = expected_of(comp, data)
    check_member(run_dir, expected, str(run_dir), with_test=False)  # this competition, its files
    train = data.train
    baseline = Baseline(saved["baseline"], comp.task, len(expected.classes) if expected.classes is not None else 0,
                        bool(saved.get("log_target")), exclude=(comp.id_column,))
    features, new_features = new_row_features(comp, train, data.test, rows)
    folds = read_fold_table(run_dir / "folds.csv", comp.id_column, 1, train[comp.id_column])["fold"].to_numpy()
    fold_dirs = [run_dir / "folds" / str(k) for k in range(comp.folds.k)]
    fitted = [load_fold_models(fold_dir, baseline) for fold_dir in fold_dirs]  # all of them, before any work
    source = None
    if saved.get("embeddings"):
        source = open_embedding_source(embedding_spec(run_dir, saved["embeddings"]), config, run_dir.parent,
                                       expected, folds, with_test=False, made_with=saved["embeddings"])
    tables = []
    for k, (fold_dir, models) in enumerate(zip(fold_dirs, fitted)):
        frame = new_features
        if source is not None:
            train_index = fold_rows(folds, k, comp.folds)[0]
            frame = new_rows_with_embeddings(source, config, k, features.iloc[train_index], new_features, fold_dir)
        kinds = models.kinds
        lacking = [c for c in (*kinds.numeric, *kinds.categorical, *kinds.text) if c not in frame.columns]
        if lacking:
            named = ", ".join(map(repr, lacking[:3])) + (f" and {len(lacking) - 3} more" if len(lacking) > 3 else "")
            raise KbertError(f"{fold_dir / MODELS_FILE}: its model reads column(s) {named} that this "
                             "competition's rows lack (a fold of another run, or an edited file)")
        table = predict_fold(baseline, models, [frame])[0]
        if not np.isfinite(table).all():
            raise KbertError(f"{fold_dir}: its model predicts NaN or infinite values; nothing was written")
        tables.append(table)
        log(f"folds/{fold_dir.name}: {len(rows)} rows predicted")
    predictions = native(comp.task, average_folds(tables))
    return write_csv(out, predictions_frame(comp, expected.classes, rows[comp.id_column], predictions))


def embedding_spec(run_dir: Path, embeddings: dict) -> str:
    """An embedding baseline's source as it reads it now: the run it was made with (its metrics.json's sha256),
    beside the baseline (where a package puts it) or where it was when the baseline was made, in that order (an
    unrelated run of the same name beside it was taken first); a pretrained encoder by its name."""
    if not embeddings.get("run_dir"):
        return str(embeddings["source"])
    found = [folder for folder in (run_dir.parent / Path(embeddings["run_dir"]).name, Path(embeddings["run_dir"]))
             if (folder / "config.yaml").is_file()]
    return str(next((folder for folder in found if is_the_run(folder, embeddings.get("metrics_sha256"))),
                    found[0] if found else embeddings["run_dir"]))


def member_table(folder: Path, data_path: Path, scratch: Path, columns: list[str], ids: pd.Series,
                 data_dir: str | None, log) -> np.ndarray:
    """A member's predictions of the new rows (rows, columns), written and read back as its test.csv was: what a
    blend of its test predictions read, to the last bit."""
    out = scratch / f"{len(list(scratch.iterdir()))}.csv"
    if is_baseline(folder):
        predict_baseline(folder, data_path, out, data_dir=data_dir, log=log)
    else:
        predict_run(folder, data_path, member_config(folder).train.tta, out, data_dir=data_dir, log=log)
    frame = read_predictions(out)
    return frame.set_index(frame.columns[0]).loc[ids.to_numpy(), columns].to_numpy(dtype=np.float64)


MOVED = "pass --out, the runs folder, if they moved or kbert ran elsewhere"  # (kbert predict's)


@dataclass
class CheckedEnsemble:
    """An ensemble record whose members are the runs it blended and whose blend, refitted, is the one it records."""

    record: dict
    competition: CompetitionConfig
    data: CompetitionData
    expected: Expected
    members: list[Member]
    final: Blend
    data_dir: str | None


def checked_ensemble(record_path: Path, runs_dir: str | None = None, data_dir: str | None = None,
                     moved: str = MOVED) -> CheckedEnsemble:
    """The ensemble ``record_path`` (the JSON beside its submission), read for predicting: each member is checked
    against the competition and its training file, and is the run the ensemble blended (its metrics.json, which
    seals its OOF and test predictions, has the sha256 the record holds); the chosen blend is refitted on the
    members' stored OOF predictions exactly as ``kbert ensemble`` fitted it and must give the weights and cut-off
    the record holds. ``kbert predict`` and ``kbert package`` read an ensemble through this."""
    record_path = Path(record_path)
    record = check_record(record_path, read_json(record_path, required=("competition", "method", "members",
                                                                         "decision")))
    missing = [key for key in ("competition_config", "options", "runs_dir") if key not in record]
    if missing:
        raise KbertError(f"{record_path}: made by a kbert that did not record {', '.join(missing)}; run kbert "
                         "ensemble again to predict new rows with it")
    try:
        comp = competition_from_dict(record["competition_config"])
        names = [member["name"] for member in record["members"]]
        options = BlendOptions(**record["options"])
    except (TypeError, KeyError) as exc:
        raise KbertError(f"{record_path}: not an ensemble record kbert wrote ({type(exc).__name__}: {exc})") from None
    data_dir = data_dir if data_dir is not None else record.get("data_dir")
    runs_dir = runs_dir if runs_dir is not None else record["runs_dir"]
    data, _, problem = load_problem(comp, data_dir)
    expected = expected_of(comp, data)
    members = [trained_member(Path(runs_dir) / comp.name, name, expected, moved) for name in names]
    for member, recorded in zip(members, record["members"]):
        check_blended(record_path, recorded, member.path)
    rows = common_rows(members)
    final = fit_blend(record["method"], np.stack([m.oof[rows] for m in members]), problem.on_rows(rows),
                      np.arange(len(rows)), options)
    check_refitted(record_path, record, final, members)
    return CheckedEnsemble(record, comp, data, expected, members, final, data_dir)


def predict_ensemble(record_path: Path, data_path: Path, out: Path, runs_dir: str | None = None,
                     data_dir: str | None = None, log=print) -> Path:
    """The ensemble ``record_path`` on new rows (``checked_ensemble``): every member predicts them from its own fold
    models, and the refitted blend is applied; the file has the submission's format."""
    new_rows = read_csv(Path(data_path))
    ensemble = checked_ensemble(Path(record_path), runs_dir, data_dir)
    comp, data, expected = ensemble.competition, ensemble.data, ensemble.expected
    check_feature_rows(new_rows, comp, Path(data_path))
    check_predictions_file(Path(out), data_path, ensemble.members[0].path.parent, Path(record_path),
                           *input_paths(comp, data.data_dir))
    ids = new_rows[comp.id_column]
    with tempfile.TemporaryDirectory() as scratch:
        T = np.stack([member_table(member.path, Path(data_path), Path(scratch), expected.columns, ids,
                                   ensemble.data_dir, log) for member in ensemble.members])
    final = ensemble.final
    table = apply_decision(comp.task, apply_blend(final, T, comp.task), final.decision)
    return write_new_submission(expected, data, ids, table, final.decision.threshold, Path(out))


def predict_submission(run_dir: Path, data_path: Path, out: Path, data_dir: str | None = None, log=print) -> Path:
    """A run's or baseline's submission for new rows: its predictions (with its own test-time augmentation) at the
    cut-off its submission used, in the submission's format."""
    run_dir = Path(run_dir)
    config = member_config(run_dir)
    comp = config.competition
    rows = read_csv(Path(data_path))
    check_feature_rows(rows, comp, Path(data_path))
    ids = rows[comp.id_column]
    data = load_competition_data(comp, data_dir if data_dir is not None else config.data_dir or None)
    check_predictions_file(Path(out), data_path, run_dir.parent, *input_paths(comp, data.data_dir))
    expected = expected_of(comp, data)
    with tempfile.TemporaryDirectory() as scratch:
        table = member_table(run_dir, Path(data_path), Path(scratch), expected.columns, ids, data_dir, log)
    metrics = read_metrics(run_dir / "metrics.json", required=("cv_threshold",))
    tuned = (metrics.get("threshold") or {}).get("tuned_on_oof")  # what the run's own submission was cut at
    threshold = np.asarray(tuned if tuned is not None else metrics["cv_threshold"], dtype=float)
    threshold = threshold.item() if comp.task == "binary" and threshold.size == 1 else threshold  # a number, or [it]
    return write_new_submission(expected, data, ids, table, threshold, Path(out))


def write_new_submission(expected: Expected, data, ids: pd.Series, table: np.ndarray, threshold, out: Path) -> Path:
    """New rows' prediction table in the submission's format, ordered as the sample submission when it holds
    exactly these rows (the competition's own test file), else as given."""
    comp = expected.competition
    sample = data.sample_submission
    same_rows = sample is not None and set(sample[comp.id_column]) == set(ids) and len(sample) == len(ids)
    return write_predictions_submission(replace(expected, test_ids=ids), native(comp.task, table), threshold,
                                        sample if same_rows else None, out)


def trained_member(competition_dir: Path, name: str, expected: Expected, moved: str = MOVED) -> Member:
    """A member as the ensemble blended it: checked against the competition and its training file (not its test
    file: the rows to predict may come with another one, as on Kaggle's rerun), its OOF predictions. ``moved``:
    what to do when the runs folder is not there."""
    for part in name.split("/"):  # a run id or <study>/trial-NNNN, never a path out of the runs folder
        check_name(part, f"member {name!r}:")
    folder = competition_dir / name
    if not (folder / "metrics.json").is_file():
        hint = "" if competition_dir.is_dir() else f"; {moved}"
        raise KbertError(f"member {name}: no finished run in {competition_dir} (no metrics.json){hint}")
    checked = check_member(folder, expected, f"member {name}", with_test=False)
    return Member(name=name, path=folder, cv=float(checked.metrics["cv"]), oof=checked.oof, test=checked.test,
                  columns=expected.columns, folds=checked.folds)


def check_refitted(record_path: Path, record: dict, final, members: list[Member]) -> None:
    """The blend refitted on the stored OOF predictions is the one the record describes: its weights and its
    cut-off or class weights (a member file changed since, or another kbert, would differ)."""
    weights = ({} if final.weights is None else
               {m.name: round(float(w), 6) for m, w in zip(members, final.weights)})
    if weights != record.get("weights", {}) or final.decision.to_dict() != record["decision"]:
        raise KbertError(f"{record_path}: its blend, refitted on the members' OOF predictions, is not the one it "
                         "records (weights or cut-off differ): a member changed since kbert ensemble wrote it; run "
                         "kbert ensemble again")
