"""``kbert tune --report``: the best trials as a table, the best trial's config as ``report/best.yaml`` (ready for
``kbert run --config``), and Optuna's history, importance and parallel-coordinate plots as PNGs in ``report/``.
"""

from __future__ import annotations

import os
import shlex
import sys
import warnings
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from kbert.errors import KbertError
from kbert.io import atomic_write, write_text
from kbert.tune.trial_store import fetch_trials, open_artifact_store
from kbert.tune.options import TuneOptions, format_duration
from kbert.tune.study import load_study, ranked_trials, trial_dir

STATES = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL, TrialState.RUNNING, TrialState.WAITING)


def trials_table(study: optuna.Study, top: int = 10) -> str:
    """The best ``top`` completed trials, then a count of every state."""
    lines = [f"{'trial':>5}  {'mean':>8}  {'OOF':>8}  {'folds':<42} {'time':>7}  params"]
    for t in ranked_trials(study)[:top]:
        folds = " ".join(f"{s:.4f}" for s in t.user_attrs.get("fold_scores", []))
        params = ", ".join(f"{k}={short(v)}" for k, v in t.params.items())
        tag = " [default]" if t.user_attrs.get("default") else ""
        oof = t.user_attrs.get("oof_cv", float("nan"))
        lines.append(f"{t.number:>5}  {t.value:>8.4f}  {oof:>8.4f}  {folds:<42} "
                     f"{format_duration(t.duration.total_seconds()):>7}  {params}{tag}")
    states = [t.state for t in study.get_trials(deepcopy=False)]
    counts = {state.name.lower(): states.count(state) for state in STATES}
    lines.append("trials: " + ", ".join(f"{n} {state}" for state, n in counts.items() if n))
    return "\n".join(lines)


def short(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def best_config(study: optuna.Study, directory: Path) -> dict:
    """The best trial's resolved run config (its config.yaml), ready for ``kbert run --config`` on any machine:
    without the runs folder of the machine that ran it (``kbert run`` writes to this machine's --out), its fold
    processes left to this machine, and with its data folder only when this machine has it."""
    from kbert.pipeline.artifacts import read_run_config

    path = trial_dir(directory, study.best_trial.number) / "config.yaml"
    if not path.is_file():
        raise KbertError(f"{path}: the best trial's config is missing (a trial of another machine: give "
                         f"--artifacts, the study's shared artifact store)")
    config = read_run_config(path)
    config.pop("out_dir", None)
    # how many folds train at once is this machine's to choose (auto); their streams, which the numbers depend
    # on, stay the trial's
    config.get("train", {})["fold_processes"] = 0
    for holder in (config, config.get("competition") or {}):
        if holder.get("data_dir") and not Path(holder["data_dir"]).is_dir():
            holder["data_dir"] = ""
    return config


def write_report(options: TuneOptions, report_dir: Path | None = None) -> Path:
    """Print the best trials; write best.yaml and the history/importance/parallel-coordinate PNGs into
    ``report_dir`` (default: the study's report/). With an artifact store, the best trial's folder (and its
    weights, when kept) is fetched first."""
    study, competition, _, directory = load_study(options, create=False, check=False)
    if options.artifacts and study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        fetch_trials(study, open_artifact_store(options.artifacts), directory, {study.best_trial.number}, weights=True)
    print(trials_table(study))
    completed = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if not completed:
        raise KbertError(f"study '{options.study}' has no completed trial yet")
    report_dir = report_dir or directory / "report"  # made by its first write: a refused report leaves none
    best_yaml = write_best_yaml(study, options, competition.name, competition.metric, directory, report_dir)
    plots = write_plots(study, report_dir, len(completed))
    if plots is not None:
        print("wrote " + ", ".join(str(p) for p in [best_yaml, *plots]))
    return report_dir


def write_best_yaml(study: optuna.Study, options: TuneOptions, competition: str, metric: str, directory: Path,
                    report_dir: Path) -> Path:
    import yaml

    best = study.best_trial
    completed = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    default = [t for t in completed if t.user_attrs.get("default")]
    header = (f"# kbert tune {competition} --study {options.study}: best trial {best.number}, "
              f"mean fold {metric} {best.value:.4f}"
              + (f" (default configuration: {default[0].value:.4f})" if default else "") +
              f"\n# Reproduce: kbert run --config {shlex.quote(str((report_dir / 'best.yaml').resolve()))}\n")
    return write_text(report_dir / "best.yaml", header + yaml.safe_dump(best_config(study, directory), sort_keys=False))


def write_plots(study: optuna.Study, report_dir: Path, completed: int) -> list[Path] | None:
    """Optuna's matplotlib plots as PNGs (None without matplotlib); importances need two completed trials."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("note: pip install matplotlib for the report's plots", file=sys.stderr)
        return None
    from optuna.visualization import matplotlib as optuna_plots

    plots = {"history.png": optuna_plots.plot_optimization_history,
             "importances.png": optuna_plots.plot_param_importances,
             "parallel_coordinate.png": optuna_plots.plot_parallel_coordinate}
    written = []
    for name, plot in plots.items():
        if name == "importances.png" and completed < 2:
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Optuna marks its matplotlib plots experimental
            try:
                axes = plot(study)
            except (ValueError, RuntimeError, TypeError) as exc:  # importances of one distinct trial, of list choices
                print(f"note: {name} skipped: {exc}", file=sys.stderr)
                continue
        figure = axes.figure if hasattr(axes, "figure") else axes.flat[0].figure
        figure.set_size_inches(10, 6)
        figure.tight_layout()
        atomic_write(report_dir / name, lambda path: figure.savefig(path, format="png", dpi=100))
        written.append(report_dir / name)
        plt.close(figure)
    return written


def serve_dashboard(options: TuneOptions, host: str | None = None, port: int | None = None) -> int:
    """``kbert tune --dashboard``: optuna-dashboard on the study's storage (and its artifact folder), until
    Ctrl-C. The storage is read where the workers write it, so the page follows the study live."""
    import shutil
    import signal
    import subprocess

    from kbert.pipeline.config import load_competition
    from kbert.tune.database import rdb_url
    from kbert.tune.storage import journal_path, repair_journal
    from kbert.tune.study import study_dir

    host, port = host or "127.0.0.1", port or 8080  # (--host and --port's defaults)
    program = shutil.which("optuna-dashboard", path=os.pathsep.join([str(Path(sys.executable).parent),
                                                                     os.environ.get("PATH", "")]))
    if program is None:
        raise KbertError('--dashboard: optuna-dashboard is not installed; pip install "kbert[dashboard]"')
    if options.rdb:
        storage = rdb_url(options.storage)
    else:
        journal = journal_path(options, study_dir(options, load_competition(options.competition)))
        if not journal.is_file():
            raise KbertError(f"--dashboard: no study journal at {journal}; start the study first, or give --storage")
        repair_journal(journal)  # a record torn by a kill is cut before the dashboard reads (or writes) the file
        storage = str(journal)
    command = [program, storage, "--host", host, "--port", str(port), "--quiet"]
    if options.artifacts and "://" not in options.artifacts:
        command += ["--artifact-dir", options.artifacts]
    print(f"optuna-dashboard: http://{host}:{port}/dashboard/  (Ctrl-C stops it)", flush=True)
    server = subprocess.Popen(command)

    def on_terminate(signum, frame):  # `kill PID` stops the dashboard too, as Ctrl-C does
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_terminate)
    try:
        return server.wait()
    except KeyboardInterrupt:  # a terminal's Ctrl-C reaches both; a signal to this process alone must stop it too
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)
