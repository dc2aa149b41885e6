"""The report of an Optuna study folder (``runs/<competition>/<study>``, holding journal.log): Optuna's plots and
best.yaml as ``kbert.tune.write_report`` writes them, the trials' key numbers and table, and the best trial's
fold plots. Optuna is imported only when a study is reported."""

from __future__ import annotations

from pathlib import Path

from kbert.report.page import Page, direction, format_score
from kbert.report.run_page import fold_figures, read_histories

STUDY_PLOTS = ("history.png", "importances.png", "parallel_coordinate.png")  # drawn by kbert.tune.write_report


def study_report(directory: Path, out: Path) -> Page:
    """Optuna's plots and best.yaml via ``kbert.tune.write_report``, the best trials table, and the best
    trial's fold scores and curves."""
    import optuna
    from optuna.trial import TrialState

    from kbert.tune import TuneOptions, load_study, ranked_trials, trial_dir, trials_table

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    options = TuneOptions(competition=directory.parent.name, study=directory.name, out_dir=str(directory.parent.parent))
    study, competition, _, _ = load_study(options, create=False, check=False)
    ranked = ranked_trials(study)
    best_run = read_best_trial(trial_dir(directory, ranked[0].number)) if ranked else None  # before any drawing
    write_tune_plots(options, out)  # refuses a study without a completed trial
    best = ranked[0]
    best_dir = trial_dir(directory, best.number)

    trials = study.get_trials(deepcopy=False)
    default = [t for t in trials if t.state == TrialState.COMPLETE and t.user_attrs.get("default")]
    metric = f"{competition.metric} ({direction(study.direction.name == 'MAXIMIZE')})"
    page = Page(title=f"Study {directory.name} ({competition.name})",
                subtitle=f"{directory} - {competition.task}, {metric}")
    page.facts = [("study", directory.name), ("competition", competition.name), ("metric", metric),
                  ("trials", ", ".join(f"{n} {state}" for state, n in trial_states(trials).items() if n)),
                  ("best trial", str(best.number)), ("best mean fold score", format_score(best.value)),
                  ("best trial's CV (all OOF rows)", format_score(best.user_attrs.get("oof_cv")))]
    if default:
        page.facts.append(("default configuration (trial 0)", format_score(default[0].value)))
    page.facts.append(("reproduce", f"kbert run --config {out / 'best.yaml'}"))
    page.facts.append(("the best trial's confusion/residual plots", f"kbert report {best_dir}"))
    page.figures = [("history.png", "Objective (mean fold score) of every trial and the best so far."),
                    ("importances.png", "How much each parameter explains of the objective (fANOVA)."),
                    ("parallel_coordinate.png", "Each completed trial's parameters and objective.")]
    if best_run is not None:
        page.figures += fold_figures(*best_run, out, {
            "fold_scores.png": f"Best trial {best.number}: score of each fold.",
            "curves.png": f"Best trial {best.number}: loss and validation score per epoch."})
    else:
        page.notes.append(f"{best_dir / 'metrics.json'} is missing: no fold plots of the best trial")
    page.text.append(("Best trials", trials_table(study)))
    if (out / "best.yaml").is_file():
        page.text.append(("best.yaml (the best trial's run config)", (out / "best.yaml").read_text(encoding="utf-8")))
    return page


def read_best_trial(best_dir: Path) -> tuple[dict, dict[str, list[dict]]] | None:
    """The best trial's metrics.json and its folds' histories, checked; None when it kept no metrics.json."""
    from kbert.pipeline.artifacts import read_metrics

    if not (best_dir / "metrics.json").is_file():
        return None
    return read_metrics(best_dir / "metrics.json", required=("cv", "metric")), read_histories(best_dir)


def write_tune_plots(options, out: Path) -> None:
    """Optuna's plots and best.yaml, drawn afresh by ``kbert.tune.write_report`` into ``out`` (nothing is written
    outside the folder the report goes to)."""
    from kbert.tune import write_report as write_tune_report

    for name in STUDY_PLOTS:  # drawn again below; one it skips this time must not linger from an earlier report
        (out / name).unlink(missing_ok=True)
    write_tune_report(options, out)


def trial_states(trials: list) -> dict[str, int]:
    """How many trials are complete, pruned, failed, running and waiting."""
    from optuna.trial import TrialState

    return {s.name.lower(): sum(t.state == s for t in trials)
            for s in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL, TrialState.RUNNING, TrialState.WAITING)}
