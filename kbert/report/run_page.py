"""The report of one run folder (``kbert run``, a tuning trial, ``kbert baseline``): its key numbers, the fold
plots (also drawn for a study's best trial: ``fold_figures``), its column importance when the run folder has an
importance.json (``kbert report --importance``: ``importance_section``) and the OOF predictions against the
competition's targets, which ``load_truth`` reads again from the run's config.yaml and ``oof_plots`` draws as
the task asks."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd

from kbert.errors import KbertError
from kbert.io import check_field, is_number, read_json, read_predictions
from kbert.report.page import Page, direction, format_score
from kbert.report.plots import (fold_label, plot_binary_calibration, plot_confusion, plot_curves, plot_fold_scores,
                                plot_importance, plot_label_calibration, plot_label_confusion, plot_residuals,
                                plot_top_label_calibration)
from kbert.tasks import Task

RUN_FOLD_CAPTIONS = {
    "fold_scores.png": "Score of each fold's validation rows; the dashed line is the CV over all OOF rows at once, "
                       "the band the fold mean ± std.",
    "curves.png": "Training (dashed) and validation (solid) loss per epoch, and the validation score per epoch; the "
                  "star marks the epoch each fold kept.",
}
IMPORTANCE_CAPTION = ("How much the CV drops when one column's words are removed from the text: the run's fold models "
                      "predict their validation rows again, without retraining. Positive: the column's words helped; "
                      "the CV without them in brackets.")
REMOVALS = {"dropped": "left out of the text", "missing": "written as missing"}


def run_report(run_dir: Path, out: Path) -> Page:
    """Fold scores, training curves and the OOF predictions against the truth, for one run folder. What the plots
    draw is read and checked first: a damaged file is refused before any plot is written."""
    from kbert.pipeline.artifacts import read_metrics
    from kbert.pipeline.provenance import check_predictions_written

    metrics = read_metrics(run_dir / "metrics.json", required=("cv", "metric", "task"))
    task, metric = metrics["task"], metrics["metric"]
    histories = read_histories(run_dir)
    oof_path = run_dir / "oof.csv"
    oof = read_oof(oof_path, task) if oof_path.is_file() else None
    check_predictions_written(run_dir, metrics, str(run_dir))  # (after the cells: a damaged one is named precisely)
    page = Page(title=f"Run {metrics.get('run_id', run_dir.name)}",
                subtitle=f"{run_dir} - {task}, {metric} ({direction(metrics.get('greater_is_better', True))})")
    page.facts = run_facts(run_dir, metrics)
    page.figures = fold_figures(metrics, histories, out, RUN_FOLD_CAPTIONS)
    if metrics.get("folds"):
        page.tables.append(fold_table(metrics))
    if metrics.get("baseline"):
        page.notes.append("a baseline keeps no folds/<k>/history.json: no training curves")
    else:
        lacking = sorted({p.parent.name for p in (run_dir / "folds").glob("*/fold.json")} - set(histories))
        if not histories:
            page.notes.append("no folds/<k>/history.json: no training curves")
        elif lacking:
            page.notes.append(f"no history.json in folds/{', '.join(lacking)}: their curves are not drawn")
    importance_section(run_dir, metrics, out, page)

    if oof is None:
        page.notes.append(f"{oof_path} is missing: no OOF plots")
        return page
    columns = [str(c) for c in oof.columns[1:]]
    predictions = oof.iloc[:, 1:].to_numpy(dtype=np.float64)
    try:
        truth, classes = load_truth(run_dir, task, oof.iloc[:, 0])
    except KbertError as exc:
        page.notes.append(f"truth-based plots skipped: {exc}")
        return page
    covered = ~np.isnan(predictions).all(axis=1)  # time-series folds: the first block has no OOF prediction
    page.figures += oof_plots(metrics, truth[covered], classes, predictions[covered], columns, out)
    return page


def read_oof(path: Path, task: str) -> pd.DataFrame:
    """A run's oof.csv, its cells checked (kbert.io ``read_predictions``) and, where the task predicts them,
    probabilities in [0, 1]: an edited file is one line naming it, not a plotting library's traceback."""
    oof = read_predictions(path, empty_rows=True)
    values = oof.iloc[:, 1:].to_numpy(dtype=np.float64)
    if Task(task).probabilities and (np.any(values < 0) or np.any(values > 1)):
        raise KbertError(f"{path}: holds values outside [0, 1], not probabilities; the file was edited or damaged")
    return oof


def run_facts(run_dir: Path, metrics: dict) -> list[tuple[str, str]]:
    """The key numbers of a run, for the page's table."""
    records = metrics.get("folds") or []
    facts = [("run", str(metrics.get("run_id", run_dir.name))), ("task", str(metrics["task"])),
             ("metric", f"{metrics['metric']} ({direction(metrics.get('greater_is_better', True))})"),
             ("CV (all OOF rows)", format_score(metrics["cv"]))]
    if "fold_mean" in metrics:
        facts.append(("fold mean ± std", f"{format_score(metrics['fold_mean'])} ± "
                                         f"{format_score(metrics.get('fold_std', float('nan')))}"))
    if records:
        facts.append(("folds", str(len(records))))
        first = records[0].get("seed")  # each row is validated once per seed and repeat: count one of them
        facts.append(("OOF rows", str(sum(r.get("n_valid", 0) for r in records
                                          if not r.get("repeat") and r.get("seed") == first))))
    if len(metrics.get("seed_cv") or {}) > 1:
        facts.append(("CV of each seed", ", ".join(f"seed {seed}: {format_score(cv)}"
                                                   for seed, cv in metrics["seed_cv"].items())))
    facts.append(("model", model_description(run_dir, metrics)))
    if records and any(r.get("best_epoch") is not None for r in records):
        facts.append(("best epoch per fold", ", ".join(best_epoch(r) for r in records)))
    threshold = metrics.get("threshold") or {}
    if threshold.get("tuned_on_oof"):
        facts.append(("threshold tuned on OOF", ", ".join(f"{t:.2f}" for t in threshold["tuned_on_oof"])))
        if "cv_at_tuned_threshold_optimistic" in threshold:
            facts.append(("CV at the tuned threshold (optimistic)",
                          format_score(threshold["cv_at_tuned_threshold_optimistic"])))
        if "cv_cross_fitted" in threshold:
            facts.append(("CV at thresholds tuned on the other folds (honest)",
                          format_score(threshold["cv_cross_fitted"])))
    calibration = metrics.get("calibration") or {}
    if "temperature" in calibration:
        facts.append(("temperature (calibration)", f"{calibration['temperature']:.3f}"))
    if "wall_time_s" in metrics:
        facts.append(("wall time", f"{metrics['wall_time_s'] / 60:.1f} min"))
    if metrics.get("submission"):
        facts.append(("submission", str(metrics["submission"])))
    return facts


def importance_section(run_dir: Path, metrics: dict, out: Path, page: Page) -> None:
    """The run's importance.json on ``page``: importance.png, the table of the CV without each column's words,
    one validation row's text with and without them, and what was skipped; for an encoder run without one, a
    note saying how to compute it."""
    path = run_dir / "importance.json"
    if not path.is_file():
        if not metrics.get("baseline") and any((run_dir / "folds").glob("*/*.safetensors")):
            page.notes.append("no importance.json: kbert report RUN --importance computes the CV without each "
                              "column's words")
        return
    try:
        importance = check_importance(path, read_json(path, required=IMPORTANCE_KEYS), metrics)
    except KbertError as exc:
        page.notes.append(f"column importance skipped: {exc}")
        return
    if importance["columns"]:
        page.figures.append((plot_importance(importance, out / "importance.png").name, IMPORTANCE_CAPTION))
    page.tables.append(importance_table(importance))
    if importance.get("example"):
        page.text.append(("One validation row's text, with every column's words and without each column's",
                          importance_examples(importance)))
    page.notes += [f"column importance: {column} skipped, {reason}"
                   for column, reason in (importance.get("skipped") or {}).items()]
    if importance.get("not_in_text"):
        page.notes.append(f"column importance: not in the text: {', '.join(importance['not_in_text'])}")


IMPORTANCE_KEYS = ("metric", "greater_is_better", "baseline_cv", "columns")


def check_importance(path: Path, importance: dict, metrics: dict) -> dict:
    """What the page reads of importance.json, in the shapes pipeline/importance.py writes it, computed for this
    run (its run id and CV, as ``metrics`` records them); else one line naming the key (the page notes it and goes
    on without the section)."""
    check = partial(check_field, path)

    def entry(e) -> bool:
        return isinstance(e, dict) and isinstance(e.get("column"), str) and is_number(e.get("cv")) \
            and is_number(e.get("drop"))

    columns, not_in_text = importance["columns"], importance.get("not_in_text") or []
    check("columns", isinstance(columns, list) and all(map(entry, columns)), "a list of {column, cv, drop} records")
    for key in ("baseline_cv", "run_cv", "run_cv_uncalibrated"):
        check(key, key not in importance or is_number(importance[key]), "a number")
    check("metric", isinstance(importance["metric"], str), "a metric's name")
    check("skipped", isinstance(importance.get("skipped") or {}, dict), "a mapping of columns to reasons")
    check("not_in_text", isinstance(not_in_text, list) and all(isinstance(c, str) for c in not_in_text),
          "a list of column names")
    run = metrics.get("run_id")
    if importance.get("run_id") != run or importance.get("run_cv") != metrics["cv"]:
        raise KbertError(f"{path}: computed for run {importance.get('run_id')!r} (CV {importance.get('run_cv')}), not "
                         f"this run {run!r} (CV {metrics['cv']}); kbert report --importance computes it again")
    return importance


def importance_table(importance: dict) -> tuple[str, list[str], list[list[str]]]:
    """The page's table of importance.json: each column's CV without its words and the drop, largest first."""
    metric = importance["metric"]
    run_cv = (f"the run's CV before calibration {format_score(importance['run_cv_uncalibrated'])}"
              if "run_cv_uncalibrated" in importance else f"the run's CV {format_score(importance.get('run_cv'))}")
    heading = (f"Column importance: {metric} {format_score(importance['baseline_cv'])} with every column's words "
               f"({run_cv}), and without each column's")
    return (heading, ["column", f"{metric} without its words", "drop (positive: the words helped)", "removal"],
            [[str(entry["column"]), format_score(entry["cv"]), signed_score(entry["drop"]),
              REMOVALS.get(entry.get("removal"), str(entry.get("removal", "-")))]
             for entry in importance["columns"]])


def signed_score(value: float) -> str:
    """A drop as the page shows it: signed, 4 decimals or thousands as ``format_score``."""
    text = format_score(abs(value))
    return text if text == "-" else ("-" if value < 0 else "+") + text


def importance_examples(importance: dict) -> str:
    """The example row's text with every column's words, then without each column's (largest drop first)."""
    names = ["every column"] + [f"- {entry['column']}" for entry in importance["columns"]]
    texts = [importance["example"]] + [entry.get("example", "") for entry in importance["columns"]]
    width = max(len(name) for name in names)
    lines = [f"{name:<{width}}  {text}" for name, text in zip(names, texts)]
    return "\n".join(lines)


def model_description(run_dir: Path, metrics: dict) -> str:
    """``baseline hgb``, or the encoder (with its size when trained from scratch) and adapter."""
    from kbert.pipeline.config import read_yaml

    if metrics.get("baseline"):
        return f"baseline {metrics['baseline']}"
    path = run_dir / "config.yaml"
    try:
        config = read_yaml(path) or {}
    except (OSError, KbertError):
        return "-"
    model = config.get("model") if isinstance(config, dict) else None
    if not isinstance(model, dict):  # an edited config.yaml: the report still draws what it can
        return "-"
    text = str(model.get("encoder", "-"))
    if text == "bert" and "hidden_size" in model:
        text += f" from scratch (hidden {model['hidden_size']}, {model.get('num_hidden_layers', '?')} layers)"
    if model.get("adapter") not in (None, "", "none"):
        text += f" + {model['adapter']} adapters"
    return text


def best_epoch(record: dict) -> str:
    """The epoch a fold kept, counted from 1, or ``-``."""
    return "-" if record.get("best_epoch") is None else str(record["best_epoch"] + 1)


def fold_table(metrics: dict) -> tuple[str, list[str], list[list[str]]]:
    """The page's table of the folds: score, best epoch, rows and seconds of each."""
    records = metrics["folds"]
    return ("Folds", ["fold", metrics["metric"], "best epoch", "train rows", "valid rows", "seconds"],
            [[fold_label(r, records), format_score(r.get("score")), best_epoch(r), str(r.get("n_train", "-")),
              str(r.get("n_valid", "-")), str(r.get("seconds", "-"))] for r in records])


def fold_figures(metrics: dict, histories: dict[str, list[dict]], out: Path,
                 captions: dict[str, str]) -> list[tuple[str, str]]:
    """fold_scores.png (when metrics.json has the folds' records) and curves.png (when the folds kept a
    history.json: ``read_histories``) of one run folder, written to ``out``; (file name, caption from
    ``captions``) of each drawn."""
    drawn = []
    if metrics.get("folds"):
        drawn.append(plot_fold_scores(metrics, out / "fold_scores.png").name)
    if histories:
        drawn.append(plot_curves(histories, metrics, out / "curves.png").name)
    return [(name, captions[name]) for name in drawn]


def read_histories(run_dir: Path) -> dict[str, list[dict]]:
    """Each fold folder's history.json (epoch, train_loss, valid_loss, valid_score), by folder name; a damaged one is
    refused, naming it (pipeline/artifacts.py ``read_history``)."""
    from kbert.pipeline.artifacts import read_history, verify_fold_files

    found = {}
    for path in sorted((run_dir / "folds").glob("*/history.json"), key=lambda p: _fold_order(p.parent.name)):
        history = read_history(path)
        if (path.parent / "fold.json").is_file():  # the one the fold was trained with (its sha256; after the cells)
            verify_fold_files(path.parent, ("history.json",))
        if history:
            found[path.parent.name] = history
    return found


def _fold_order(name: str) -> tuple[int, int]:
    if name.isdigit():
        return 0, int(name)
    repeat, _, fold = name[1:].partition("-")
    return (int(repeat), int(fold)) if repeat.isdigit() and fold.isdigit() else (1 << 30, 0)


def run_source(run_dir: Path):
    """(competition config, data_dir or None, limit_rows, permute_target) of a run folder's config.yaml: a resolved
    run config, or a baseline's ``competition: <name>`` with its settings."""
    from kbert.pipeline.config import load_competition, read_run_file, run_config_from_file

    competition, rest = read_run_file(run_dir / "config.yaml")
    if isinstance(competition, str):
        return (load_competition(competition), rest.get("data_dir") or None, rest.get("limit_rows"),
                bool(rest.get("permute_target")))
    config = run_config_from_file(run_dir / "config.yaml", {})
    return config.competition, config.data_dir or None, config.limit_rows, config.permute_target


def load_truth(run_dir: Path, task: str, ids: pd.Series) -> tuple[np.ndarray, list | None]:
    """The training targets in the order of ``ids`` (oof.csv's id column): class indices (binary 0/1,
    multiclass, ordinal), 0/1 labels (n, L) for multilabel, raw values for regression (n,) and timeseries (n, H);
    and the classes. A KbertError says why they cannot be had (a permuted-target run, missing data)."""
    from kbert.pipeline.data import load_competition_data
    from kbert.pipeline.targets import encode_targets, raw_targets

    competition, data_dir, limit_rows, permuted = run_source(run_dir)
    if permuted:
        raise KbertError("this run shuffled its targets (permute_target), so its predictions have no truth")
    train = load_competition_data(competition, data_dir).train
    if limit_rows is not None:
        train = train.iloc[:limit_rows].reset_index(drop=True)
    targets = encode_targets(train, competition)
    values = raw_targets(train, competition) if Task(task).numeric else targets.values
    train_ids = pd.Index(train[competition.id_column])
    if train_ids.is_unique:
        position = train_ids.get_indexer(ids)
        if (position < 0).any():
            raise KbertError(f"{int((position < 0).sum())} oof.csv ids are not in the training data")
    elif len(train_ids) == len(ids):
        position = np.arange(len(ids))
    else:
        raise KbertError("the training data's ids repeat and oof.csv has a different row count")
    return values[position], targets.classes


def oof_plots(metrics: dict, truth: np.ndarray, classes: list | None, predictions: np.ndarray, columns: list[str],
              out: Path) -> list[tuple[str, str]]:
    """The truth-based plots of the task in ``metrics`` (metrics.json); returns (file name, caption) for each."""
    task, metric, figures = metrics["task"], metrics["metric"], []
    tuned = (metrics.get("threshold") or {}).get("tuned_on_oof")
    if task == Task.BINARY:
        threshold = float(tuned[0]) if tuned else 0.5
        y, p = truth.astype(int), predictions[:, 0]
        plot_confusion(y, (p >= threshold).astype(int), ["0", "1"], columns[0],
                       f"OOF confusion matrix at threshold {threshold:.2f}", out / "confusion.png")
        plot_binary_calibration(y, p, threshold, columns[0], out / "calibration.png")
        figures += [("confusion.png", f"OOF predictions against the truth, P({columns[0]}) cut at {threshold:.2f}."),
                    ("calibration.png", "Reliability diagram (mean predicted probability against the observed share, "
                                        "per probability bin) and the OOF probabilities of each true class.")]
    elif task == Task.MULTICLASS:
        plot_confusion(truth.astype(int), predictions.argmax(axis=1), columns, "class",
                       "OOF confusion matrix (most probable class)", out / "confusion.png")
        plot_top_label_calibration(truth.astype(int), predictions, out / "calibration.png")
        figures += [("confusion.png", "OOF predictions (the most probable class) against the truth."),
                    ("calibration.png", "Top-label calibration: the confidence in the predicted class against how "
                                        "often it is right, per confidence bin.")]
    elif task == Task.ORDINAL:
        labels = ordinal_labels_from_probabilities(predictions)
        plot_confusion(truth.astype(int), labels, columns, "class", "OOF confusion matrix (ordinal label)",
                       out / "confusion.png")
        values = np.asarray(classes, dtype=np.float64)
        plot_residuals(values[truth.astype(int)], predictions @ values, metric, out / "residuals.png",
                       "expected value")
        figures += [("confusion.png", "OOF ordinal labels (thresholds cleared with probability over 1/2) against the "
                                      "truth."),
                    ("residuals.png", "Expected value of each OOF prediction against the true class, and the "
                                      "residuals.")]
    elif task == Task.MULTILABEL:
        thresholds = np.asarray(tuned, dtype=np.float64) if tuned else np.full(len(columns), 0.5)
        plot_label_confusion(truth.astype(int), predictions, thresholds, columns, out / "confusion.png")
        plot_label_calibration(truth.astype(int), predictions, columns, out / "calibration.png")
        figures += [("confusion.png", "Per label: true/false positives and negatives of the OOF predictions."),
                    ("calibration.png", "Reliability diagram per label.")]
    else:  # regression, timeseries (every horizon together)
        plot_residuals(np.asarray(truth, dtype=np.float64).ravel(), predictions.ravel(), metric,
                       out / "residuals.png", "prediction")
        figures.append(("residuals.png", "OOF predictions against the truth (the line is y = x), and the residuals "
                                         "against the prediction."))
    return figures


def ordinal_labels_from_probabilities(probabilities: np.ndarray) -> np.ndarray:
    """oof.csv's ordinal class probabilities -> the CORAL label (thresholds cleared with P(y > k) > 1/2)."""
    above = 1.0 - np.cumsum(probabilities, axis=1)[:, :-1]
    return (above > 0.5).sum(axis=1)
