"""The plots of a run's results (fold scores, curves, OOF predictions against the truth, column importance), and the
matplotlib plumbing every report uses: ``pyplot()`` (imported only when a report is drawn) and ``save_figure``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kbert.errors import KbertError
from kbert.io import atomic_write
from kbert.report.page import direction, format_score

LOG_METRICS = ("rmse_log", "rmsle")  # regression metrics scored on log1p values: residual plots in log space
MAX_LABELS = 12  # multilabel: labels drawn in the calibration plot
MAX_COLUMNS = 30  # column importance: the columns drawn, largest drops first


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


def fit_ylim(axes, values) -> None:
    """The y range around ``values`` (bars, lines, dots), with headroom at the top for the legend."""
    low, high = float(np.min(values)), float(np.max(values))
    pad = (high - low) * 0.25 or abs(high) * 0.05 or 0.05
    axes.set_ylim(low - pad, high + 2.2 * pad)


# ---------------------------------------------------------------- folds (a run, a study's best trial)


def fold_label(record: dict, records: list[dict]) -> str:
    """``3``, or ``r1-3`` when the run repeated its k folds; `` s43`` added when it trained several seeds."""
    repeated = any(r.get("repeat") for r in records)
    label = f"r{record.get('repeat', 0)}-{record['fold']}" if repeated else str(record["fold"])
    return label + (f" s{record.get('seed')}" if len({r.get("seed") for r in records}) > 1 else "")


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
    fit_ylim(axes, np.concatenate([scores, [cv, mean - std, mean + std]]))
    axes.set_xticks(x, labels)
    axes.set_xlabel("fold")
    axes.set_ylabel(f"{metrics['metric']} ({direction(metrics.get('greater_is_better', True))})")
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


# ---------------------------------------------------------------- column importance (a run)


def plot_importance(importance: dict, path: Path) -> Path:
    """A horizontal bar per column (largest drop on top): how much the CV drops without the column's words, in the
    metric's better direction (importance.json of pipeline/importance.py); the first MAX_COLUMNS columns."""
    plt = pyplot()
    entries = importance["columns"][:MAX_COLUMNS][::-1]  # barh draws bottom-up
    drops = np.array([entry["drop"] for entry in entries], dtype=np.float64)
    figure, axes = plt.subplots(figsize=(8, 1.5 + 0.35 * max(len(entries), 1)))
    y = np.arange(len(entries))
    axes.barh(y, drops, color=["#4c78a8" if d >= 0 else "#e45756" for d in drops], height=0.6, zorder=2)
    axes.axvline(0, color="black", linewidth=0.8, zorder=3)
    for yi, entry in zip(y, entries):
        axes.annotate(f"{entry['drop']:+.4f} ({format_score(entry['cv'])})", (entry["drop"], yi),
                      textcoords="offset points", xytext=(4 if entry["drop"] >= 0 else -4, 0),
                      ha="left" if entry["drop"] >= 0 else "right", va="center", fontsize=8)
    low, high = float(drops.min(initial=0.0)), float(drops.max(initial=0.0))
    pad = (high - low) * 0.35 or 0.01  # room for the labels beside the bars
    axes.set_xlim(low - (pad if low < 0 else 0.1 * pad), high + pad)
    axes.set_yticks(y, [entry["column"] for entry in entries])
    shown = "" if len(importance["columns"]) <= MAX_COLUMNS else f", top {MAX_COLUMNS} of {len(importance['columns'])}"
    axes.set_xlabel(f"drop in {importance['metric']} without the column's words "
                    f"(positive: the words helped; {direction(importance['greater_is_better'])})")
    axes.set_title(f"column importance{shown}: CV {format_score(importance['baseline_cv'])} with every column's words")
    axes.grid(axis="x", alpha=0.3, zorder=0)
    return save_figure(figure, path)


# ---------------------------------------------------------------- OOF predictions against the truth


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
    reliability_panel(left, y, p, 0, (f"mean predicted P({name})", f"observed share with {name} = 1",
                                       "reliability diagram (quantile bins of the predictions)"))
    histogram_panel(right, [(p[y == value], color, f"true {name} = {value} ({(y == value).sum()})")
                            for value, color in ((0, "#e45756"), (1, "#4c78a8"))],
                    f"predicted P({name})", "OOF probabilities by true class", threshold)
    return save_figure(figure, path)


def plot_top_label_calibration(y: np.ndarray, probabilities: np.ndarray, path: Path) -> Path:
    """Confidence in the predicted class against accuracy per bin (left); the confidence of right and wrong
    predictions (right)."""
    plt = pyplot()
    confidence = probabilities.max(axis=1)
    correct = (probabilities.argmax(axis=1) == y).astype(int)
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    reliability_panel(left, correct, confidence, 1.0 / probabilities.shape[1],
                      ("mean confidence in the predicted class", "accuracy",
                       f"top-label reliability (accuracy {correct.mean():.3f})"))
    histogram_panel(right, [(confidence[correct == 1], "#4c78a8", f"right ({correct.sum()})"),
                            (confidence[correct == 0], "#e45756", f"wrong ({(correct == 0).sum()})")],
                    "confidence in the predicted class", "OOF confidence of right and wrong predictions")
    return save_figure(figure, path)


def reliability_panel(axes, y: np.ndarray, p: np.ndarray, low: float, text: tuple[str, str, str]) -> None:
    """A reliability diagram of 0/1 outcomes ``y`` against probabilities ``p`` (the curve only when both outcomes
    occur), with the diagonal from (low, low) to (1, 1); ``text``: its x label, y label and title."""
    xlabel, ylabel, title = text
    axes.plot([low, 1], [low, 1], color="gray", linestyle=":", label="perfectly calibrated")
    if len(np.unique(y)) == 2:
        predicted, observed, counts = reliability(y, p)
        axes.plot(predicted, observed, color="#4c78a8", marker="o",
                  label=f"OOF, {len(counts)} bins of ~{len(p) // len(counts)} rows")
    axes.set_xlim(0, 1)
    axes.set_ylim(0, 1)
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.set_title(title)
    axes.legend(loc="upper left", fontsize=8)
    axes.grid(alpha=0.3)


def histogram_panel(axes, groups: list[tuple[np.ndarray, str, str]], xlabel: str, title: str,
                    threshold: float | None = None) -> None:
    """Overlaid histograms of probabilities on 20 bins, one per (values, color, label) group; ``threshold`` as a
    dashed line."""
    bins = np.linspace(0, 1, 21)
    for values, color, label in groups:
        axes.hist(values, bins=bins, alpha=0.55, color=color, label=label)
    if threshold is not None:
        axes.axvline(threshold, color="black", linestyle="--", linewidth=1, label=f"threshold {threshold:.2f}")
    axes.set_xlabel(xlabel)
    axes.set_ylabel("rows")
    axes.set_title(title)
    axes.legend(fontsize=8)


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
