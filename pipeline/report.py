"""``kbert report <run-id|study|ensemble>``: PNG plots and a small self-contained ``index.html`` beside them.

Targets and what each report draws:

- a run folder or run id (``kbert run``, a tuning trial, ``kbert baseline``): fold_scores.png, curves.png
  (when the folds kept a history.json), and from the OOF predictions against the competition's targets:
  confusion.png + calibration.png (binary, multiclass, multilabel), residuals.png (regression, timeseries),
  confusion.png + residuals.png (ordinal). Written to ``<run>/report/``.
- a study folder (``runs/<competition>/<study>``, holding journal.log): Optuna's history.png, importances.png and
  parallel_coordinate.png plus best.yaml (``pipeline.tune.write_report``), and the best trial's fold_scores.png
  and curves.png. Written to ``<study>/report/``.
- an ensemble sidecar JSON (``kbert ensemble``): weights.png, correlations.png (members' OOF predictions) and
  methods.png (honest CV per method). Written to ``<json stem>-report/`` beside the JSON.

The page links its pictures by relative ``src`` (the folder can be moved or zipped), has inline CSS and no
scripts. matplotlib is an optional extra (``kbert[report]``), imported only here. Every file is written
atomically (pipeline/io.py).
"""

from __future__ import annotations

import html
import json
import math
import shutil
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.errors import KbertError
from pipeline.io import atomic_write, read_json, write_text

REPORT_FOLDER = "report"
ENSEMBLE_KEYS = ("method", "weights", "members")
STUDY_PLOTS = ("history.png", "importances.png", "parallel_coordinate.png")
LOG_METRICS = ("rmse_log", "rmsle")  # regression metrics scored on log1p values: residual plots in log space
MAX_LABELS = 12  # multilabel: labels drawn in the calibration plot


@dataclass
class Page:
    """What index.html shows, top to bottom."""

    title: str
    subtitle: str = ""
    facts: list[tuple[str, str]] = field(default_factory=list)  # (name, value): the key numbers
    notes: list[str] = field(default_factory=list)  # what was skipped, and why
    figures: list[tuple[str, str]] = field(default_factory=list)  # (PNG file name in the report folder, caption)
    tables: list[tuple[str, list[str], list[list[str]]]] = field(default_factory=list)  # (heading, header, rows)
    text: list[tuple[str, str]] = field(default_factory=list)  # (heading, preformatted text)


# ---------------------------------------------------------------- entry point


def write_report(target: str, runs_dir: str = "runs", output: str | None = None) -> Path:
    """Write the plots and index.html for a run, a study or an ensemble; returns the page's path."""
    kind, path = resolve_target(target, runs_dir)
    pyplot()  # fail before anything is written when matplotlib is missing
    if kind == "run":
        out = Path(output) if output else path / REPORT_FOLDER
        page = run_report(path, out)
    elif kind == "study":
        out = Path(output) if output else path / REPORT_FOLDER
        page = study_report(path, out)
    else:
        out = Path(output) if output else path.with_name(f"{path.stem}-report")
        page = ensemble_report(path, out)
    page.notes += [f"{name} was not written" for name, _ in page.figures if not (out / name).is_file()]
    page.figures = [(name, caption) for name, caption in page.figures if (out / name).is_file()]
    return write_text(out / "index.html", render_html(page, source=path))


def resolve_target(target: str, runs_dir: str = "runs") -> tuple[str, Path]:
    """("run" | "study" | "ensemble", path): a run folder or run id, a study folder (journal.log), or an
    ensemble sidecar JSON."""
    path = Path(target)
    if path.is_file():
        if path.suffix != ".json":
            raise KbertError(f"{path}: not a report target; pass a run folder or run id, a study folder "
                             "(runs/<competition>/<study>) or an ensemble sidecar .json")
        try:
            values = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise KbertError(f"{path}: not valid JSON: {exc}") from None
        missing = [k for k in ENSEMBLE_KEYS if not isinstance(values, dict) or k not in values]
        if missing:
            raise KbertError(f"{path}: not an ensemble sidecar JSON (no {', '.join(missing)}); "
                             "kbert ensemble writes one beside its submission")
        return "ensemble", path
    if path.is_dir() and (path / "journal.log").is_file():
        return "study", path
    if path.is_dir() and not (path / "config.yaml").is_file():
        raise KbertError(f"{path}: neither a run folder (config.yaml), a study folder (journal.log) nor an "
                         "ensemble sidecar .json")
    from pipeline.predict import resolve_run_dir  # imports MLX: only when the target may be a run

    return "run", resolve_run_dir(target, runs_dir)


def pyplot():
    """matplotlib.pyplot on the Agg backend (files only, no display)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise KbertError("kbert report needs matplotlib: pip install 'kbert[report]'") from None
    return plt


def save_figure(figure, path: Path) -> Path:
    """Write ``figure`` as a PNG atomically, then close it."""
    plt = pyplot()
    try:
        figure.tight_layout()
        atomic_write(path, lambda p: figure.savefig(p, format="png", dpi=100))
    finally:
        plt.close(figure)
    return path


def format_score(value: float | None) -> str:
    """A metric value as the page shows it: 4 decimals, or thousands for large errors (RMSE in dollars)."""
    if value is None or not math.isfinite(float(value)):
        return "-"
    return f"{value:.4f}" if abs(value) < 1000 else f"{value:,.0f}"


# ---------------------------------------------------------------- run report


def run_report(run_dir: Path, out: Path) -> Page:
    """Fold scores, training curves and the OOF predictions against the truth, for one run folder."""
    metrics = read_json(run_dir / "metrics.json", required=("cv", "metric", "task"))
    task, metric = metrics["task"], metrics["metric"]
    page = Page(title=f"Run {metrics.get('run_id', run_dir.name)}",
                subtitle=f"{run_dir} - {task}, {metric} ({direction(metrics)})")
    page.facts = run_facts(run_dir, metrics)
    records = metrics.get("folds") or []
    if records:
        plot_fold_scores(metrics, out / "fold_scores.png")
        page.figures.append(("fold_scores.png", "Score of each fold's validation rows; the dashed line is the CV "
                                                "over all OOF rows at once, the band the fold mean ± std."))
        page.tables.append(("Folds", ["fold", metric, "best epoch", "train rows", "valid rows", "seconds"],
                            [[fold_label(r, records), format_score(r.get("score")),
                              "-" if r.get("best_epoch") is None else str(r["best_epoch"] + 1),
                              str(r.get("n_train", "-")), str(r.get("n_valid", "-")), str(r.get("seconds", "-"))]
                             for r in records]))
    histories = read_histories(run_dir)
    if histories:
        plot_curves(histories, metrics, out / "curves.png")
        page.figures.append(("curves.png", "Training (dashed) and validation (solid) loss per epoch, and the "
                                           "validation score per epoch; the star marks the epoch each fold kept."))
    else:
        page.notes.append("no folds/<k>/history.json (a baseline run): no training curves")

    oof_path = run_dir / "oof.csv"
    if not oof_path.is_file():
        page.notes.append(f"{oof_path} is missing: no OOF plots")
        return page
    oof = pd.read_csv(oof_path)
    columns = [str(c) for c in oof.columns[1:]]
    predictions = oof.iloc[:, 1:].to_numpy(dtype=np.float64)
    try:
        truth, classes = load_truth(run_dir, task, oof.iloc[:, 0])
    except KbertError as exc:
        page.notes.append(f"truth-based plots skipped: {exc}")
        return page
    page.figures += oof_plots(task, metric, metrics, truth, classes, predictions, columns, out)
    return page


def direction(metrics: dict) -> str:
    return "higher is better" if metrics.get("greater_is_better", True) else "lower is better"


def run_facts(run_dir: Path, metrics: dict) -> list[tuple[str, str]]:
    """The key numbers of a run, for the page's table."""
    records = metrics.get("folds") or []
    facts = [("run", str(metrics.get("run_id", run_dir.name))), ("task", str(metrics["task"])),
             ("metric", f"{metrics['metric']} ({direction(metrics)})"), ("CV (all OOF rows)", format_score(metrics["cv"]))]
    if "fold_mean" in metrics:
        facts.append(("fold mean ± std", f"{format_score(metrics['fold_mean'])} ± "
                                         f"{format_score(metrics.get('fold_std', float('nan')))}"))
    if records:
        facts.append(("folds", str(len(records))))
        facts.append(("OOF rows", str(sum(r.get("n_valid", 0) for r in records if not r.get("repeat")))))
    facts.append(("model", model_description(run_dir, metrics)))
    if records and any(r.get("best_epoch") is not None for r in records):
        facts.append(("best epoch per fold", ", ".join("-" if r.get("best_epoch") is None else str(r["best_epoch"] + 1)
                                                       for r in records)))
    threshold = metrics.get("threshold") or {}
    if threshold.get("tuned_on_oof"):
        facts.append(("threshold tuned on OOF", ", ".join(f"{t:.2f}" for t in threshold["tuned_on_oof"])))
        if "cv_at_tuned_threshold_optimistic" in threshold:
            facts.append(("CV at the tuned threshold (optimistic)",
                          format_score(threshold["cv_at_tuned_threshold_optimistic"])))
    calibration = metrics.get("calibration") or {}
    if "temperature" in calibration:
        facts.append(("temperature (calibration)", f"{calibration['temperature']:.3f}"))
    if "wall_time_s" in metrics:
        facts.append(("wall time", f"{metrics['wall_time_s'] / 60:.1f} min"))
    if metrics.get("submission"):
        facts.append(("submission", str(metrics["submission"])))
    return facts


def model_description(run_dir: Path, metrics: dict) -> str:
    """``baseline hgb``, or the encoder (with its size when trained from scratch) and adapter."""
    import yaml

    if metrics.get("baseline"):
        return f"baseline {metrics['baseline']}"
    path = run_dir / "config.yaml"
    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError):
        return "-"
    model = config.get("model") or {}
    text = str(model.get("encoder", "-"))
    if text == "bert" and "hidden_size" in model:
        text += f" from scratch (hidden {model['hidden_size']}, {model.get('num_hidden_layers', '?')} layers)"
    if model.get("adapter"):
        text += f" + {model['adapter']} adapters"
    return text


def fold_label(record: dict, records: list[dict]) -> str:
    """``3``, or ``r1-3`` when the run repeated its k folds."""
    repeated = any(r.get("repeat") for r in records)
    return f"r{record.get('repeat', 0)}-{record['fold']}" if repeated else str(record["fold"])


def read_histories(run_dir: Path) -> dict[str, list[dict]]:
    """Each fold folder's history.json (epoch, train_loss, valid_loss, valid_score), by folder name."""
    found = {}
    for path in sorted((run_dir / "folds").glob("*/history.json"), key=lambda p: _fold_order(p.parent.name)):
        history = json.loads(path.read_text(encoding="utf-8"))
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
    from pipeline.config import load_competition, read_run_file, run_config_from_file

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
    from pipeline.data import load_competition_data
    from pipeline.targets import encode_targets, raw_targets

    competition, data_dir, limit_rows, permuted = run_source(run_dir)
    if permuted:
        raise KbertError("this run shuffled its targets (permute_target), so its predictions have no truth")
    train = load_competition_data(competition, data_dir).train
    if limit_rows is not None:
        train = train.iloc[:limit_rows].reset_index(drop=True)
    targets = encode_targets(train, competition)
    values = raw_targets(train, competition) if task in ("regression", "timeseries") else targets.values
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


def oof_plots(task: str, metric: str, metrics: dict, truth: np.ndarray, classes: list | None,
              predictions: np.ndarray, columns: list[str], out: Path) -> list[tuple[str, str]]:
    """The task's truth-based plots; returns (file name, caption) for each."""
    figures = []
    tuned = (metrics.get("threshold") or {}).get("tuned_on_oof")
    if task == "binary":
        threshold = float(tuned[0]) if tuned else 0.5
        y, p = truth.astype(int), predictions[:, 0]
        plot_confusion(y, (p >= threshold).astype(int), ["0", "1"], columns[0],
                       f"OOF confusion matrix at threshold {threshold:.2f}", out / "confusion.png")
        plot_binary_calibration(y, p, threshold, columns[0], out / "calibration.png")
        figures += [("confusion.png", f"OOF predictions against the truth, P({columns[0]}) cut at {threshold:.2f}."),
                    ("calibration.png", "Reliability diagram (mean predicted probability against the observed share, "
                                        "per probability bin) and the OOF probabilities of each true class.")]
    elif task == "multiclass":
        plot_confusion(truth.astype(int), predictions.argmax(axis=1), columns, "class",
                       "OOF confusion matrix (most probable class)", out / "confusion.png")
        plot_top_label_calibration(truth.astype(int), predictions, out / "calibration.png")
        figures += [("confusion.png", "OOF predictions (the most probable class) against the truth."),
                    ("calibration.png", "Top-label calibration: the confidence in the predicted class against how "
                                        "often it is right, per confidence bin.")]
    elif task == "ordinal":
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
    elif task == "multilabel":
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


# ---------------------------------------------------------------- run plots


def plot_fold_scores(metrics: dict, path: Path) -> Path:
    """A bar per fold with its score; the CV as a dashed line, the fold mean ± std as a band."""
    plt = pyplot()
    records = metrics["folds"]
    labels = [fold_label(r, records) for r in records]
    scores = np.array([r["score"] for r in records], dtype=np.float64)
    cv, mean = float(metrics["cv"]), float(metrics.get("fold_mean", scores.mean()))
    std = float(metrics.get("fold_std", scores.std()))
    figure, axes = plt.subplots(figsize=(max(6.0, 0.6 * len(records) + 3), 4.5))
    x = np.arange(len(records))
    axes.bar(x, scores, color="#4c78a8", width=0.6, zorder=2)
    axes.axhspan(mean - std, mean + std, color="#f58518", alpha=0.15, label="fold mean ± std", zorder=1)
    axes.axhline(cv, color="#e45756", linestyle="--", linewidth=1.5, label=f"CV {format_score(cv)}", zorder=3)
    for xi, score in zip(x, scores):
        axes.annotate(format_score(score), (xi, score), textcoords="offset points", xytext=(0, 3), ha="center",
                      fontsize=8)
    values = np.concatenate([scores, [cv, mean - std, mean + std]])
    low, high = float(values.min()), float(values.max())
    pad = (high - low) * 0.25 or abs(high) * 0.05 or 0.05
    axes.set_ylim(low - pad, high + 2.2 * pad)  # headroom for the legend
    axes.set_xticks(x, labels)
    axes.set_xlabel("fold")
    axes.set_ylabel(f"{metrics['metric']} ({direction(metrics)})")
    axes.set_title(f"{metrics['metric']} per fold: CV {format_score(cv)}, fold mean {format_score(mean)} "
                   f"± {format_score(std)}")
    axes.grid(axis="y", alpha=0.3, zorder=0)
    axes.legend(loc="upper left", fontsize=8, ncol=2)
    return save_figure(figure, path)


def plot_curves(histories: dict[str, list[dict]], metrics: dict, path: Path) -> Path:
    """Per fold: training and validation loss per epoch (left), validation score per epoch (right); the
    epoch the fold kept is starred."""
    plt = pyplot()
    best = {fold_label(r, metrics.get("folds") or []): r.get("best_epoch") for r in metrics.get("folds") or []}
    colors = plt.get_cmap("tab10" if len(histories) <= 10 else "tab20")
    figure, (loss_axes, score_axes) = plt.subplots(1, 2, figsize=(12, 4.5))
    greater = metrics.get("greater_is_better", True)
    for i, (name, history) in enumerate(histories.items()):
        color = colors(i % colors.N)
        epochs = np.array([h["epoch"] for h in history]) + 1
        scores = np.array([h["valid_score"] for h in history], dtype=np.float64)
        loss_axes.plot(epochs, [h["train_loss"] for h in history], linestyle="--", color=color, alpha=0.8)
        loss_axes.plot(epochs, [h["valid_loss"] for h in history], color=color, label=f"fold {name}")
        score_axes.plot(epochs, scores, color=color, marker=".", label=f"fold {name}")
        kept = best.get(name)
        if kept is None:  # a baseline-style record without best_epoch: the best validation score
            kept = int(history[int(np.argmax(scores) if greater else np.argmin(scores))]["epoch"])
        at = [h for h in history if h["epoch"] == kept]
        if at:
            score_axes.plot(kept + 1, at[0]["valid_score"], marker="*", markersize=14, color=color,
                            markeredgecolor="black", linestyle="none")
            loss_axes.plot(kept + 1, at[0]["valid_loss"], marker="*", markersize=12, color=color,
                           markeredgecolor="black", linestyle="none")
    loss_axes.plot([], [], linestyle="--", color="gray", label="training loss")
    loss_axes.plot([], [], color="gray", label="validation loss")
    loss_axes.set_title("loss per epoch")
    loss_axes.set_xlabel("epoch")
    loss_axes.set_ylabel("loss")
    score_axes.set_title(f"validation {metrics['metric']} per epoch (★ kept)")
    score_axes.set_xlabel("epoch")
    score_axes.set_ylabel(metrics["metric"])
    for axes in (loss_axes, score_axes):
        axes.grid(alpha=0.3)
        axes.xaxis.get_major_locator().set_params(integer=True)
        axes.legend(fontsize=7, ncol=2)
    return save_figure(figure, path)


def plot_confusion(true: np.ndarray, predicted: np.ndarray, labels: list[str], axis_name: str, title: str,
                   path: Path) -> Path:
    """Counts of (true, predicted) classes, shaded by the share of each true class's row."""
    plt = pyplot()
    n = len(labels)
    matrix = np.zeros((n, n), dtype=np.int64)
    np.add.at(matrix, (np.asarray(true, dtype=int), np.asarray(predicted, dtype=int)), 1)
    shares = matrix / np.maximum(matrix.sum(axis=1, keepdims=True), 1)
    size = min(12.0, 3.0 + 0.55 * n)
    figure, axes = plt.subplots(figsize=(size + 1.2, size))
    image = axes.imshow(shares, cmap="Blues", vmin=0, vmax=1)
    font = 11 if n <= 5 else 8 if n <= 12 else 6
    for i in range(n):
        for j in range(n):
            axes.text(j, i, f"{matrix[i, j]}\n{shares[i, j]:.0%}" if n <= 5 else str(matrix[i, j]), ha="center",
                      va="center", fontsize=font, color="white" if shares[i, j] > 0.55 else "black")
    axes.set_xticks(range(n), labels, rotation=45 if n > 6 else 0)
    axes.set_yticks(range(n), labels)
    axes.set_xlabel(f"predicted {axis_name}")
    axes.set_ylabel(f"true {axis_name}")
    accuracy = np.trace(matrix) / max(matrix.sum(), 1)
    axes.set_title(f"{title}\n{matrix.sum()} rows, accuracy {accuracy:.3f}")
    figure.colorbar(image, ax=axes, fraction=0.046, pad=0.04, label="share of the true class's rows")
    return save_figure(figure, path)


def reliability(y: np.ndarray, p: np.ndarray, bins: int = 10) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mean predicted probability, observed share, rows) per quantile bin of ``p`` (sklearn's calibration_curve;
    about 15 rows a bin at least), empty bins dropped."""
    from sklearn.calibration import calibration_curve

    bins = max(2, min(bins, len(p) // 15))
    observed, predicted = calibration_curve(y, p, n_bins=bins, strategy="quantile", pos_label=1)
    edges = np.percentile(p, np.linspace(0, 1, bins + 1) * 100)  # the same bins as calibration_curve's
    counts = np.bincount(np.searchsorted(edges[1:-1], p), minlength=bins)
    return predicted, observed, counts[counts > 0]


def plot_binary_calibration(y: np.ndarray, p: np.ndarray, threshold: float, name: str, path: Path) -> Path:
    """Reliability diagram (left) and the OOF probabilities of each true class (right)."""
    plt = pyplot()
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    left.plot([0, 1], [0, 1], color="gray", linestyle=":", label="perfectly calibrated")
    if len(np.unique(y)) == 2:
        predicted, observed, counts = reliability(y, p)
        left.plot(predicted, observed, color="#4c78a8", marker="o",
                  label=f"OOF, {len(counts)} bins of ~{len(p) // len(counts)} rows")
    left.set_xlim(0, 1)
    left.set_ylim(0, 1)
    left.set_xlabel(f"mean predicted P({name})")
    left.set_ylabel(f"observed share with {name} = 1")
    left.set_title("reliability diagram (quantile bins of the predictions)")
    left.legend(loc="upper left", fontsize=8)
    left.grid(alpha=0.3)
    bins = np.linspace(0, 1, 21)
    for value, color in ((0, "#e45756"), (1, "#4c78a8")):
        right.hist(p[y == value], bins=bins, alpha=0.55, color=color, label=f"true {name} = {value} ({(y == value).sum()})")
    right.axvline(threshold, color="black", linestyle="--", linewidth=1, label=f"threshold {threshold:.2f}")
    right.set_xlabel(f"predicted P({name})")
    right.set_ylabel("rows")
    right.set_title("OOF probabilities by true class")
    right.legend(fontsize=8)
    return save_figure(figure, path)


def plot_top_label_calibration(y: np.ndarray, probabilities: np.ndarray, path: Path) -> Path:
    """Confidence in the predicted class against accuracy per bin (left); the confidence of right and wrong
    predictions (right)."""
    plt = pyplot()
    confidence = probabilities.max(axis=1)
    correct = (probabilities.argmax(axis=1) == y).astype(int)
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    low = 1.0 / probabilities.shape[1]
    left.plot([low, 1], [low, 1], color="gray", linestyle=":", label="perfectly calibrated")
    if 0 < correct.sum() < len(correct):
        predicted, observed, counts = reliability(correct, confidence)
        left.plot(predicted, observed, color="#4c78a8", marker="o",
                  label=f"OOF, {len(counts)} bins of ~{len(confidence) // len(counts)} rows")
    left.set_xlim(0, 1)
    left.set_ylim(0, 1)
    left.set_xlabel("mean confidence in the predicted class")
    left.set_ylabel("accuracy")
    left.set_title(f"top-label reliability (accuracy {correct.mean():.3f})")
    left.legend(loc="upper left", fontsize=8)
    left.grid(alpha=0.3)
    bins = np.linspace(0, 1, 21)
    right.hist(confidence[correct == 1], bins=bins, alpha=0.55, color="#4c78a8", label=f"right ({correct.sum()})")
    right.hist(confidence[correct == 0], bins=bins, alpha=0.55, color="#e45756",
               label=f"wrong ({(correct == 0).sum()})")
    right.set_xlabel("confidence in the predicted class")
    right.set_ylabel("rows")
    right.set_title("OOF confidence of right and wrong predictions")
    right.legend(fontsize=8)
    return save_figure(figure, path)


def plot_label_confusion(y: np.ndarray, probabilities: np.ndarray, thresholds: np.ndarray, labels: list[str],
                         path: Path) -> Path:
    """Multilabel: a row per label with its true negatives, false positives, false negatives and true positives."""
    from sklearn.metrics import f1_score

    plt = pyplot()
    predicted = (probabilities >= thresholds.reshape(1, -1)).astype(int)
    counts = np.stack([((y == t) & (predicted == p)).sum(axis=0) for t, p in ((0, 0), (0, 1), (1, 0), (1, 1))],
                      axis=1)
    shares = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1)
    figure, axes = plt.subplots(figsize=(8, 1.5 + 0.45 * len(labels)))
    axes.imshow(shares, cmap="Blues", vmin=0, vmax=1, aspect="auto")
    for i in range(len(labels)):
        for j in range(4):
            axes.text(j, i, str(counts[i, j]), ha="center", va="center", fontsize=9,
                      color="white" if shares[i, j] > 0.55 else "black")
    f1 = [f1_score(y[:, j], predicted[:, j], zero_division=0) for j in range(len(labels))]
    axes.set_xticks(range(4), ["true neg", "false pos", "false neg", "true pos"])
    axes.set_yticks(range(len(labels)), [f"{name} (F1 {s:.2f}, cut {t:.2f})" for name, s, t in
                                         zip(labels, f1, thresholds)])
    axes.set_title("OOF outcomes per label")
    return save_figure(figure, path)


def plot_label_calibration(y: np.ndarray, probabilities: np.ndarray, labels: list[str], path: Path) -> Path:
    """Multilabel: one reliability curve per label (the first MAX_LABELS)."""
    plt = pyplot()
    figure, axes = plt.subplots(figsize=(7, 6))
    axes.plot([0, 1], [0, 1], color="gray", linestyle=":", label="perfectly calibrated")
    colors = plt.get_cmap("tab20")
    for j, name in enumerate(labels[:MAX_LABELS]):
        if len(np.unique(y[:, j])) == 2:
            predicted, observed, _ = reliability(y[:, j], probabilities[:, j], bins=8)
            axes.plot(predicted, observed, marker="o", markersize=4, color=colors(j % 20), label=name)
    axes.set_xlim(0, 1)
    axes.set_ylim(0, 1)
    axes.set_xlabel("mean predicted probability")
    axes.set_ylabel("observed share")
    shown = "" if len(labels) <= MAX_LABELS else f" (first {MAX_LABELS} of {len(labels)} labels)"
    axes.set_title("reliability per label" + shown)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=7)
    return save_figure(figure, path)


def plot_residuals(true: np.ndarray, predicted: np.ndarray, metric: str, path: Path, what: str) -> Path:
    """Predicted against true with y = x (left), residuals against the prediction (right); log axes and
    log1p residuals for log-error metrics."""
    plt = pyplot()
    log = metric in LOG_METRICS and (true > 0).all() and (predicted > 0).all()
    residuals = np.log1p(predicted) - np.log1p(true) if log else predicted - true
    rmse = float(np.sqrt(np.mean(residuals ** 2)))
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 5))
    alpha = 0.6 if len(true) < 2000 else 0.25
    left.scatter(true, predicted, s=12, alpha=alpha, color="#4c78a8", edgecolors="none")
    low, high = float(min(true.min(), predicted.min())), float(max(true.max(), predicted.max()))
    left.plot([low, high], [low, high], color="#e45756", linestyle="--", linewidth=1, label="y = x")
    if log:
        log_axis(left, "x")
        log_axis(left, "y")
    left.set_xlabel("true value")
    left.set_ylabel(f"OOF {what}")
    left.set_title(f"OOF {what} against the truth ({len(true)} values)")
    left.legend(fontsize=8)
    left.grid(alpha=0.3)
    right.scatter(predicted, residuals, s=12, alpha=alpha, color="#4c78a8", edgecolors="none")
    right.axhline(0, color="#e45756", linestyle="--", linewidth=1)
    if log:
        log_axis(right, "x")
    right.set_xlabel(f"OOF {what}")
    right.set_ylabel("log1p(predicted) - log1p(true)" if log else "predicted - true")
    right.set_title(f"residuals (RMSE{' of log1p' if log else ''} {format_score(rmse)})")
    right.grid(alpha=0.3)
    return save_figure(figure, path)


def log_axis(axes, which: str) -> None:
    """``which`` ("x" or "y") on a log scale labelled 1-2-5 in plain numbers (20k, 50k, 100k)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    getattr(axes, f"set_{which}scale")("log")
    axis = getattr(axes, f"{which}axis")
    axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda value, _: short_number(value)))
    axis.set_minor_formatter(NullFormatter())


def short_number(value: float) -> str:
    """12000 -> 12k, 1500000 -> 1.5M, 0.5 -> 0.5."""
    for size, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= size:
            return f"{value / size:g}{suffix}"
    return f"{value:g}"


# ---------------------------------------------------------------- study report


def study_report(directory: Path, out: Path) -> Page:
    """Optuna's plots and best.yaml via ``pipeline.tune.write_report``, the best trials table, and the best
    trial's fold scores and curves."""
    import optuna
    from optuna.trial import TrialState

    from pipeline.tune import TuneOptions, load_study, ranked_trials, trial_dir, trials_table
    from pipeline.tune import write_report as write_tune_report

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    options = TuneOptions(competition=directory.parent.name, study=directory.name, out_dir=str(directory.parent.parent))
    study, competition, _, _ = load_study(options, create=False)
    tune_dir = directory / REPORT_FOLDER
    for name in STUDY_PLOTS:  # drawn again below; one it skips this time must not linger from an earlier report
        (tune_dir / name).unlink(missing_ok=True)
    write_tune_report(options)
    if out.resolve() != tune_dir.resolve():
        for name in (*STUDY_PLOTS, "best.yaml"):
            if (tune_dir / name).is_file():
                atomic_write(out / name, lambda p, source=tune_dir / name: shutil.copyfile(source, p))

    trials = study.get_trials(deepcopy=False)
    states = {s.name.lower(): sum(t.state == s for t in trials) for s in (TrialState.COMPLETE, TrialState.PRUNED,
                                                                            TrialState.FAIL, TrialState.RUNNING,
                                                                            TrialState.WAITING)}
    best = ranked_trials(study)[0]
    maximize = study.direction.name == "MAXIMIZE"
    default = [t for t in trials if t.state == TrialState.COMPLETE and t.user_attrs.get("default")]
    page = Page(title=f"Study {directory.name} ({competition.name})",
                subtitle=f"{directory} - {competition.task}, {competition.metric} "
                         f"({'higher' if maximize else 'lower'} is better)")
    page.facts = [("study", directory.name), ("competition", competition.name),
                  ("metric", f"{competition.metric} ({'higher' if maximize else 'lower'} is better)"),
                  ("trials", ", ".join(f"{n} {state}" for state, n in states.items() if n)),
                  ("best trial", str(best.number)), ("best mean fold score", format_score(best.value)),
                  ("best trial's CV (all OOF rows)", format_score(best.user_attrs.get("oof_cv")))]
    if default:
        page.facts.append(("default configuration (trial 0)", format_score(default[0].value)))
    page.facts.append(("reproduce", f"kbert run --config {tune_dir / 'best.yaml'}"))
    page.facts.append(("the best trial's confusion/residual plots", f"kbert report {trial_dir(directory, best.number)}"))
    page.figures = [("history.png", "Objective (mean fold score) of every trial and the best so far."),
                    ("importances.png", "How much each parameter explains of the objective (fANOVA)."),
                    ("parallel_coordinate.png", "Each completed trial's parameters and objective.")]
    best_dir = trial_dir(directory, best.number)
    if (best_dir / "metrics.json").is_file():
        metrics = read_json(best_dir / "metrics.json", required=("cv", "metric"))
        if metrics.get("folds"):
            plot_fold_scores(metrics, out / "fold_scores.png")
            page.figures.append(("fold_scores.png", f"Best trial {best.number}: score of each fold."))
        histories = read_histories(best_dir)
        if histories:
            plot_curves(histories, metrics, out / "curves.png")
            page.figures.append(("curves.png", f"Best trial {best.number}: loss and validation score per epoch."))
    else:
        page.notes.append(f"{best_dir / 'metrics.json'} is missing: no fold plots of the best trial")
    page.text.append(("Best trials", trials_table(study)))
    if (out / "best.yaml").is_file():
        page.text.append(("best.yaml (the best trial's run config)", (out / "best.yaml").read_text(encoding="utf-8")))
    return page


# ---------------------------------------------------------------- ensemble report


def ensemble_report(path: Path, out: Path) -> Page:
    """Member weights, the correlations of the members' OOF predictions and the honest CV of each method."""
    sidecar = read_json(path, required=ENSEMBLE_KEYS)
    members = sidecar["members"]
    greater = sidecar.get("greater_is_better", True)
    metric = sidecar.get("metric", "score")
    page = Page(title=f"Ensemble {path.stem}", subtitle=f"{path} - {sidecar.get('competition', '')}, {metric} "
                                                        f"({'higher' if greater else 'lower'} is better)")
    best = (max if greater else min)(members, key=lambda m: m["cv"]) if members else None
    page.facts = [("competition", str(sidecar.get("competition", "-"))), ("metric", metric),
                  ("method", str(sidecar["method"])), ("honest CV (nested)", format_score(sidecar.get("honest_cv"))),
                  ("in-sample CV (optimistic)", format_score(sidecar.get("in_sample_cv"))),
                  ("outer folds × repeats", f"{sidecar.get('outer_folds', '-')} × {sidecar.get('outer_repeats', '-')}"),
                  ("members", str(len(members)))]
    if best is not None:
        page.facts.append(("best single member (its own CV)", f"{best['name']}: {format_score(best['cv'])}"))
    if sidecar.get("best_member_selected_in_nested_cv") is not None:
        page.facts.append(("best member chosen inside the nested CV",
                           format_score(sidecar["best_member_selected_in_nested_cv"])))
    if sidecar.get("submission"):
        page.facts.append(("submission", str(sidecar["submission"])))

    if sidecar["weights"]:
        plot_weights(sidecar["weights"], sidecar["method"], out / "weights.png")
        page.figures.append(("weights.png", "Weight of each member in the submitted blend (members with weight 0 "
                                            "last, in grey)."))
    else:
        page.notes.append(f"method '{sidecar['method']}' has no member weights (stacking: see stack_coefficients)")
    frames, missing = read_member_predictions(members, path)
    if missing:
        page.notes.append("OOF predictions not found for: " + ", ".join(missing))
    log = metric in LOG_METRICS and all((v > -1).all() for v in frames.values())
    if log:  # the metric compares log1p values: so does the heatmap
        frames = {name: np.log1p(values) for name, values in frames.items()}
    if len(frames) >= 2:
        plot_correlations(frames, out / "correlations.png")
        page.figures.append(("correlations.png", "Pearson correlation of the members' OOF predictions"
                                                 + (" (log1p values)" if log else "") + ": members that agree less "
                                                 "have more to add to a blend."))
    else:
        page.notes.append("fewer than two members' OOF predictions could be read: no correlation heatmap")
    if sidecar.get("methods"):
        plot_methods(sidecar, out / "methods.png")
        page.figures.append(("methods.png", "Honest (nested CV) score of each method, its outer splits as dots; the "
                                            "lines are the best single member's own CV (optimistic: chosen on the "
                                            "same rows) and the best member chosen inside the nested CV (honest)."))
        page.tables.append(("Methods", ["method", "honest CV", "in-sample CV", "per outer split"],
                            [[name + (" (submitted)" if name == sidecar["method"] else ""),
                              format_score(r.get("honest_cv")), format_score(r.get("in_sample_cv")),
                              " ".join(format_score(s) for s in r.get("honest_cv_per_split") or [])]
                             for name, r in sidecar["methods"].items()]))
    page.tables.append(("Members", ["member", "CV", "CV, cut-off tuned in nested CV", "weight"],
                        [[m["name"], format_score(m.get("cv")), format_score(m.get("cv_tuned_nested")),
                          "-" if m["name"] not in sidecar["weights"] else f"{sidecar['weights'][m['name']]:.3f}"]
                         for m in members]))
    return page


def member_path(path: str, sidecar: Path) -> Path | None:
    """A member folder as recorded in the sidecar (relative to where kbert ensemble ran); else tried relative to
    the project folder two levels above the sidecar (submissions/<competition>/)."""
    for candidate in (Path(path), sidecar.resolve().parent.parent.parent / path):
        if (candidate / "oof.csv").is_file():
            return candidate
    return None


def read_member_predictions(members: list[dict], sidecar: Path) -> tuple[dict[str, np.ndarray], list[str]]:
    """Each member's OOF predictions as one flat vector, rows aligned on the first member's ids (multi-column
    predictions are flattened row by row); and the names of members whose oof.csv was not found or not aligned."""
    frames: dict[str, np.ndarray] = {}
    missing = []
    ids = None
    for member in members:
        folder = member_path(member.get("path", ""), sidecar)
        if folder is None:
            missing.append(member["name"])
            continue
        oof = pd.read_csv(folder / "oof.csv")
        table = oof.set_index(oof.columns[0])
        if ids is None:
            ids = table.index
        if not table.index.is_unique or len(table) != len(ids) or not table.index.isin(ids).all():
            missing.append(member["name"])
            continue
        frames[member["name"]] = table.loc[ids].to_numpy(dtype=np.float64).ravel()
    return frames, missing


def plot_weights(weights: dict[str, float], method: str, path: Path) -> Path:
    """Horizontal bars of the members' weights, largest first, zero weights last."""
    plt = pyplot()
    ordered = sorted(weights.items(), key=lambda item: (item[1] == 0, -item[1], item[0]))
    names, values = [n for n, _ in ordered], np.array([w for _, w in ordered], dtype=np.float64)
    figure, axes = plt.subplots(figsize=(9, 1.2 + 0.32 * len(names)))
    y = np.arange(len(names))
    axes.barh(y, values, color=["#4c78a8" if w != 0 else "#bbbbbb" for w in values])
    for yi, w in zip(y, values):
        axes.annotate(f"{w:.3f}", (max(w, 0), yi), textcoords="offset points", xytext=(3, 0), va="center", fontsize=8)
    axes.set_yticks(y, names, fontsize=8)
    axes.invert_yaxis()
    axes.set_xlim(min(0.0, values.min() * 1.1), max(values.max() * 1.15, 0.05))
    axes.set_xlabel("weight")
    nonzero = int((values != 0).sum())
    axes.set_title(f"member weights ({method}): {nonzero} of {len(names)} members used")
    axes.grid(axis="x", alpha=0.3)
    return save_figure(figure, path)


def plot_correlations(frames: dict[str, np.ndarray], path: Path) -> Path:
    """Heatmap of the Pearson correlations between the members' OOF predictions, annotated."""
    plt = pyplot()
    names = list(frames)
    with np.errstate(invalid="ignore", divide="ignore"):
        matrix = np.corrcoef(np.stack([frames[n] for n in names]))
    n = len(names)
    size = min(16.0, 3.5 + 0.55 * n)
    figure, axes = plt.subplots(figsize=(size + 1.5, size))
    finite = matrix[np.isfinite(matrix)]
    low = float(min(finite.min(), 0.5)) if finite.size else 0.0
    image = axes.imshow(matrix, cmap="viridis", vmin=low, vmax=1)
    font = 9 if n <= 8 else 7 if n <= 14 else 5
    for i in range(n):
        for j in range(n):
            value = matrix[i, j]
            axes.text(j, i, "-" if not np.isfinite(value) else f"{value:.2f}", ha="center", va="center",
                      fontsize=font, color="black" if np.isfinite(value) and value > low + 0.6 * (1 - low) else "white")
    axes.set_xticks(range(n), names, rotation=60, ha="right", fontsize=8)
    axes.set_yticks(range(n), names, fontsize=8)
    axes.set_title(f"correlation of the members' OOF predictions ({n} members)")
    figure.colorbar(image, ax=axes, fraction=0.046, pad=0.04, label="Pearson r")
    return save_figure(figure, path)


def plot_methods(sidecar: dict, path: Path) -> Path:
    """Honest CV of each method (its outer splits as dots), the submitted one highlighted, with the best single
    member's own CV and the best member chosen inside the nested CV as reference lines."""
    plt = pyplot()
    methods = sidecar["methods"]
    greater = sidecar.get("greater_is_better", True)
    names = list(methods)
    scores = np.array([methods[m]["honest_cv"] for m in names], dtype=np.float64)
    figure, axes = plt.subplots(figsize=(max(7.0, 1.1 * len(names) + 3), 4.8))
    x = np.arange(len(names))
    axes.bar(x, scores, width=0.6, zorder=2,
             color=["#f58518" if m == sidecar["method"] else "#4c78a8" for m in names])
    values = list(scores)
    for xi, name, score in zip(x, names, scores):
        splits = methods[name].get("honest_cv_per_split") or []
        axes.scatter(np.full(len(splits), xi), splits, color="black", s=10, zorder=3)
        values += list(splits)
        axes.annotate(format_score(score), (xi, score), textcoords="offset points", xytext=(0, 4), ha="center",
                      fontsize=8)
    members = [m["cv"] for m in sidecar["members"]]
    if members:
        best = max(members) if greater else min(members)
        axes.axhline(best, color="#e45756", linestyle="--", linewidth=1.2,
                     label=f"best single member's own CV {format_score(best)}")
        values.append(best)
    selected = sidecar.get("best_member_selected_in_nested_cv")
    if selected is not None:
        axes.axhline(selected, color="#54a24b", linestyle=":", linewidth=1.5,
                     label=f"best member chosen in nested CV {format_score(selected)}")
        values.append(selected)
    low, high = float(np.min(values)), float(np.max(values))
    pad = (high - low) * 0.25 or abs(high) * 0.05 or 0.05
    axes.set_ylim(low - pad, high + 2.2 * pad)  # headroom for the legend
    axes.set_xticks(x, names)
    metric = sidecar.get("metric", "score")
    axes.set_ylabel(f"honest {metric} ({'higher' if greater else 'lower'} is better)")
    axes.set_title(f"honest CV per method (submitted: {sidecar['method']} {format_score(sidecar.get('honest_cv'))})")
    axes.grid(axis="y", alpha=0.3, zorder=0)
    axes.legend(fontsize=8, loc="upper left", ncol=2)
    return save_figure(figure, path)


# ---------------------------------------------------------------- the page


CSS = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 2em auto; max-width: 1200px;
       padding: 0 1em; color: #222; line-height: 1.4; }
h1 { margin-bottom: 0.1em; } .subtitle { color: #666; margin-top: 0; font-size: 0.95em; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.92em; }
th, td { border: 1px solid #ddd; padding: 0.3em 0.7em; text-align: left; vertical-align: top; }
th { background: #f3f4f6; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
figure { margin: 1.5em 0; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { color: #555; font-size: 0.9em; margin-top: 0.3em; }
pre { background: #f6f8fa; padding: 0.8em; overflow-x: auto; font-size: 0.82em; }
.notes { background: #fff8e5; border-left: 4px solid #f0b429; padding: 0.5em 1em; }
footer { color: #888; font-size: 0.8em; margin-top: 3em; }
"""


def render_html(page: Page, source: Path) -> str:
    """The page as one self-contained HTML document (inline CSS, no scripts); every text is escaped."""
    e = html.escape
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             f"<title>{e(page.title)}</title>", f"<style>{CSS}</style></head><body>",
             f"<h1>{e(page.title)}</h1>", f'<p class="subtitle">{e(page.subtitle)}</p>']
    if page.facts:
        parts.append("<table>")
        parts += [f"<tr><th>{e(name)}</th><td>{e(value)}</td></tr>" for name, value in page.facts]
        parts.append("</table>")
    if page.notes:
        parts.append('<div class="notes"><ul>' + "".join(f"<li>{e(note)}</li>" for note in page.notes) + "</ul></div>")
    for name, caption in page.figures:
        parts.append(f'<figure><img src="{e(name)}" alt="{e(caption)}"><figcaption>{e(caption)}</figcaption></figure>')
    for heading, header, rows in page.tables:
        parts.append(f"<h2>{e(heading)}</h2><table><tr>" + "".join(f"<th>{e(h)}</th>" for h in header) + "</tr>")
        parts += ["<tr>" + "".join(f'<td class="num">{e(c)}</td>' if _numeric(c) else f"<td>{e(c)}</td>" for c in row)
                  + "</tr>" for row in rows]
        parts.append("</table>")
    for heading, text in page.text:
        parts.append(f"<h2>{e(heading)}</h2><pre>{e(text)}</pre>")
    parts.append(f"<footer>kbert report of {e(str(source))}, {datetime.now():%Y-%m-%d %H:%M}</footer></body></html>")
    return "\n".join(parts) + "\n"


def _numeric(text: str) -> bool:
    try:
        float(text.replace(",", ""))
    except ValueError:
        return False
    return True
