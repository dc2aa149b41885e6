"""``kbert auto``'s leaderboard: one row per member (CV, honest CV, seconds, weight in the current best blend), the
blends below them; printed after every finished member, written as leaderboard.csv, and drawn as a PNG in an HTML
page at the end (like AutoGluon's ``leaderboard()``: what helped?)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from kbert.io import write_csv, write_text
from kbert.report.page import Page, format_score, render_html


@dataclass
class Row:
    member: str
    kind: str  # baseline | encoder | embedding | trial
    cv: float
    honest: float | None  # alone, its cut-off tuned inside the same nested CV as the blends
    seconds: float
    weight: float | None  # in the current best blend (None: not a weight method, or no blend yet)


def leaderboard_frame(rows: list[Row], greater_is_better: bool) -> pd.DataFrame:
    frame = pd.DataFrame([vars(row) for row in rows], columns=["member", "kind", "cv", "honest", "seconds", "weight"])
    return frame.sort_values("cv", ascending=not greater_is_better, kind="stable").reset_index(drop=True)


def leaderboard_text(frame: pd.DataFrame, blends: dict[str, float], chosen: str, metric: str,
                     best_single: float | None, honest: float | None = None) -> str:
    """The members, then each blend's nested-CV score and, with ``honest``, the score of choosing the blend inside
    the nested CV (what the chosen blend's own score is not: it was picked as the best of several)."""
    lines = [f"{'member':<36} {'kind':<10} {metric + ' CV':>12} {'honest':>8} {'seconds':>8} {'weight':>7}"]
    for row in frame.itertuples():
        lines.append(f"{row.member[:36]:<36} {row.kind:<10} {row.cv:>12.4f} {format_score(row.honest):>8} "
                     f"{row.seconds:>8.0f} {'' if pd.isna(row.weight) else f'{row.weight:.3f}':>7}")
    if blends:
        lines.append("-" * 86)
        if best_single is not None:
            lines.append(f"{'best member, chosen inside the nested CV':<60} {best_single:>8.4f}")
        for name, value in blends.items():
            mark = "  <- chosen" if name == chosen else ""
            lines.append(f"{'blend: ' + name:<60} {value:>8.4f}{mark}")
        if honest is not None:
            lines.append(f"{'the blend chosen inside the nested CV (honest)':<60} {honest:>8.4f}")
    return "\n".join(lines)


def write_leaderboard(folder: Path, frame: pd.DataFrame) -> Path:
    return write_csv(folder / "leaderboard.csv", frame)


def write_leaderboard_report(folder: Path, frame: pd.DataFrame, text: str, facts: list[tuple[str, str]],
                             metric: str, greater_is_better: bool) -> Path:
    """``report/index.html`` with a bar chart of each member's CV (its weight written on the bar) and the table;
    without matplotlib, the page without the chart."""
    out = folder / "report"
    page = Page(title="kbert auto: leaderboard", subtitle=f"{metric} ({'higher' if greater_is_better else 'lower'} "
                                                            "is better)", facts=facts)
    try:
        plot_leaderboard(frame, metric, out / "leaderboard.png")
        page.figures.append(("leaderboard.png", "Each member's CV (bars) and its weight in the chosen blend."))
    except Exception as exc:  # noqa: BLE001 - matplotlib missing or failing: the table still tells it
        page.notes.append(f"no chart: {exc}")
    page.text.append(("Leaderboard", text))
    return write_text(out / "index.html", render_html(page, source=folder))


def plot_leaderboard(frame: pd.DataFrame, metric: str, path: Path) -> Path:
    from kbert.report.plots import pyplot, save_figure

    plt = pyplot()
    figure, axis = plt.subplots(figsize=(8, 0.45 * len(frame) + 1.2))
    colors = ["#2b6cb0" if kind == "encoder" else "#718096" if kind == "baseline" else "#38a169"
              for kind in frame["kind"]]
    axis.barh(frame["member"], frame["cv"], color=colors)
    low, high = frame["cv"].min(), frame["cv"].max()
    axis.set_xlim(low - 0.1 * (high - low + 1e-9), high + 0.35 * (high - low + 1e-9))  # room for the labels
    for y, (cv, weight) in enumerate(zip(frame["cv"], frame["weight"])):
        axis.text(cv, y, f" {cv:.4f}" + ("" if pd.isna(weight) else f"  w={weight:.2f}"), va="center", fontsize=8)
    axis.invert_yaxis()
    axis.set_xlabel(f"{metric} CV")
    figure.tight_layout()
    return save_figure(figure, path)
