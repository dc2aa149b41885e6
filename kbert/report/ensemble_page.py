"""The report of an ensemble sidecar JSON (``kbert ensemble``): its key numbers, the members' weights
(weights.png), the correlations of the members' OOF predictions (correlations.png, read from each member's
oof.csv) and the honest CV of each blending method (methods.png)."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np

from kbert.io import check_field, is_number, is_numbers, read_json, read_predictions
from kbert.report.page import Page, direction, format_score
from kbert.report.plots import LOG_METRICS, fit_ylim, pyplot, save_figure
from kbert.report.resolve import ENSEMBLE_KEYS


def ensemble_report(path: Path, out: Path, runs_dir: str = "runs") -> Page:
    """Member weights, the correlations of the members' OOF predictions and the honest CV of each method; members
    are looked for where the sidecar says, then in ``runs_dir`` (--out, where they moved)."""
    from kbert.ensembles.ensemble import check_record

    sidecar = check_sidecar(path, check_record(path, read_json(path, required=ENSEMBLE_KEYS)))
    runs = Path(runs_dir) / str(sidecar.get("competition", ""))
    frames, missing = read_member_predictions(sidecar["members"], path, runs)  # checked before anything is drawn
    page = Page(title=f"Ensemble {path.stem}",
                subtitle=f"{path} - {sidecar.get('competition', '')}, {sidecar.get('metric', 'score')} "
                         f"({direction(sidecar.get('greater_is_better', True))})")
    page.facts = ensemble_facts(sidecar)
    if sidecar["weights"]:
        plot_weights(sidecar["weights"], sidecar["method"], out / "weights.png")
        page.figures.append(("weights.png", "Weight of each member in the submitted blend (members with weight 0 "
                                            "last, in grey)."))
    else:
        page.notes.append(f"method '{sidecar['method']}' has no member weights (stacking: see stack_coefficients)")
    correlation_figure(page, sidecar, frames, missing, out)
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
                         for m in sidecar["members"]]))
    return page


def check_sidecar(path: Path, sidecar: dict) -> dict:
    """The sidecar's fields that the page reads, in the shapes kbert ensemble writes them: an edited sidecar is one
    line naming the file and the key, not a traceback halfway through the plots."""
    check = partial(check_field, path)

    def member(m) -> bool:
        return isinstance(m, dict) and isinstance(m.get("name"), str) and isinstance(m.get("path", ""), str) \
            and is_number(m.get("cv"))

    def method(r) -> bool:
        return isinstance(r, dict) and is_number(r.get("honest_cv")) and is_numbers(r.get("honest_cv_per_split") or [])

    members, weights, methods = sidecar["members"], sidecar["weights"], sidecar.get("methods") or {}
    check("method", isinstance(sidecar["method"], str), "a method's name")
    check("members", isinstance(members, list) and all(map(member, members)),
          "a list of records with a 'name', a 'path' and a numeric 'cv'")
    check("weights", isinstance(weights, dict) and all(map(is_number, weights.values())),
          "a mapping of member names to numbers")
    check("methods", isinstance(methods, dict) and all(map(method, methods.values())),
          "a mapping of method names to records with a numeric 'honest_cv'")
    for key in ("honest_cv", "in_sample_cv", "best_member_selected_in_nested_cv"):
        check(key, sidecar.get(key) is None or is_number(sidecar[key]), "a number")
    check("chosen_per_outer_fold", isinstance(sidecar.get("chosen_per_outer_fold") or {}, dict),
          "a mapping of method names to counts")
    return sidecar


def ensemble_facts(sidecar: dict) -> list[tuple[str, str]]:
    """The key numbers of an ensemble, for the page's table."""
    best = best_member(sidecar)
    facts = [("competition", str(sidecar.get("competition", "-"))), ("metric", sidecar.get("metric", "score")),
             ("method", str(sidecar["method"])),
             ("honest CV (nested, the method choice too)" if sidecar.get("method_choice_nested")
              else "honest CV (nested)", format_score(sidecar.get("honest_cv"))),
             ("in-sample CV (optimistic)", format_score(sidecar.get("in_sample_cv"))),
             ("outer folds × repeats", f"{sidecar.get('outer_folds', '-')} × {sidecar.get('outer_repeats', '-')}"),
             ("members", str(len(sidecar["members"])))]
    if best is not None:
        facts.append(("best single member (its own CV)", f"{best['name']}: {format_score(best['cv'])}"))
    if sidecar.get("best_member_selected_in_nested_cv") is not None:
        facts.append(("best member chosen inside the nested CV",
                      format_score(sidecar["best_member_selected_in_nested_cv"])))
    if sidecar.get("chosen_per_outer_fold"):
        facts.append(("methods the outer folds chose",
                      ", ".join(f"{m} {n}" for m, n in sidecar["chosen_per_outer_fold"].items())))
    if sidecar.get("submission"):
        facts.append(("submission", str(sidecar["submission"])))
    return facts


def best_member(sidecar: dict) -> dict | None:
    """The member with the best CV of its own (optimistic: chosen on the rows it is scored on), or None."""
    members = sidecar["members"]
    if not members:
        return None
    return (max if sidecar.get("greater_is_better", True) else min)(members, key=lambda m: m["cv"])


def correlation_figure(page: Page, sidecar: dict, frames: dict[str, np.ndarray], missing: list[str],
                       out: Path) -> None:
    """correlations.png of the members' OOF predictions (``read_member_predictions``) on ``page``, or the note why
    it could not be drawn (and which members' OOF predictions are missing)."""
    if missing:
        page.notes.append("OOF predictions not found for: " + ", ".join(missing))
    log = sidecar.get("metric", "score") in LOG_METRICS and all((v > -1).all() for v in frames.values())
    if log:  # the metric compares log1p values: so does the heatmap
        frames = {name: np.log1p(values) for name, values in frames.items()}
    if len(frames) >= 2:
        plot_correlations(frames, out / "correlations.png")
        page.figures.append(("correlations.png", "Pearson correlation of the members' OOF predictions"
                                                 + (" (log1p values)" if log else "") + ": members that agree less "
                                                 "have more to add to a blend."))
    else:
        page.notes.append("fewer than two members' OOF predictions could be read: no correlation heatmap")


def member_path(path: str, sidecar: Path, name: str, runs: Path) -> Path | None:
    """A member folder as recorded in the sidecar (relative to where kbert ensemble ran); else tried relative to
    the project folder two levels above the sidecar (submissions/<competition>/); else ``runs``/``name``."""
    for candidate in (Path(path), sidecar.resolve().parent.parent.parent / path, runs / name):
        if (candidate / "oof.csv").is_file():
            return candidate
    return None


def read_member_predictions(members: list[dict], sidecar: Path, runs: Path) -> tuple[dict[str, np.ndarray], list[str]]:
    """Each member's OOF predictions as one flat vector, rows aligned on the first member's ids (multi-column
    predictions are flattened row by row); and the names of members whose oof.csv was not found or not aligned."""
    from kbert.ensembles.ensemble import check_blended
    from kbert.pipeline.artifacts import read_metrics
    from kbert.pipeline.provenance import check_predictions_written

    frames: dict[str, np.ndarray] = {}
    missing = []
    ids = None
    for member in members:
        folder = member_path(member.get("path", ""), sidecar, member["name"], runs)
        if folder is None:
            missing.append(member["name"])
            continue
        check_blended(sidecar, member, folder)
        oof = read_predictions(folder / "oof.csv", empty_rows=True)
        check_predictions_written(folder, read_metrics(folder / "metrics.json"), f"{sidecar}: member {member['name']}")
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
    stacked = np.stack([frames[n] for n in names])
    stacked = stacked[:, np.isfinite(stacked).all(axis=0)]  # rows every member covers (time series: not the first)
    with np.errstate(invalid="ignore", divide="ignore"):
        matrix = np.corrcoef(stacked)
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
    member's own CV, the best member chosen inside the nested CV and the method chosen inside it as reference
    lines."""
    plt = pyplot()
    methods = sidecar["methods"]
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
    best = best_member(sidecar)
    if best is not None:
        axes.axhline(best["cv"], color="#e45756", linestyle="--", linewidth=1.2,
                     label=f"best single member's own CV {format_score(best['cv'])}")
        values.append(best["cv"])
    selected = sidecar.get("best_member_selected_in_nested_cv")
    if selected is not None:
        axes.axhline(selected, color="#54a24b", linestyle=":", linewidth=1.5,
                     label=f"best member chosen in nested CV {format_score(selected)}")
        values.append(selected)
    if sidecar.get("method_choice_nested"):
        axes.axhline(sidecar["honest_cv"], color="#f58518", linestyle="-.", linewidth=1.2,
                     label=f"method chosen inside the nested CV {format_score(sidecar['honest_cv'])}")
        values.append(sidecar["honest_cv"])
    fit_ylim(axes, values)
    axes.set_xticks(x, names)
    metric = sidecar.get("metric", "score")
    axes.set_ylabel(f"honest {metric} ({direction(sidecar.get('greater_is_better', True))})")
    axes.set_title(f"honest CV per method (submitted: {sidecar['method']}; honest CV "
                   f"{format_score(sidecar.get('honest_cv'))})")
    axes.grid(axis="y", alpha=0.3, zorder=0)
    axes.legend(fontsize=8, loc="upper left", ncol=2)
    return save_figure(figure, path)
