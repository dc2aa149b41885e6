"""Optuna tuning over k folds: ``kbert tune <competition>``.

A study lives in ``runs/<competition>/<study>/``: ``journal.log`` (Optuna's JournalStorage, safe for several
processes), ``journal.log.heartbeats/`` (one file per running trial), ``trial-<NNNN>/`` per completed trial in
the run artifact layout (so that any trial can be blended; fold weights for the best ``keep_top`` only) and
``report/`` (best.yaml and plots). Each trial is one ``run_competition`` over the k folds, reported fold by fold
and pruned when clearly worse; its value is the mean fold score. Ctrl-C, a crash or a kill loses no finished
trial, and the same command resumes: an abandoned or stale trial is queued again with the same parameters.

What lives where:

- ``options.py``: ``TuneOptions`` (one invocation's settings), ``parse_duration``, ``format_duration``;
- ``space.py`` + ``search_space.yaml``: the search space (YAML format, parsing, sampling, run overrides);
- ``storage.py``: the journal file or RDB URL (drivers, waiting out a lost database), and the heartbeat files
  that find a dead worker's trial;
- ``artifacts.py``: the shared artifact store (--artifacts): upload each trial's folder, fetch what a machine
  lacks;
- ``study.py``: open or create the study (sampler, pruner, trial 0 = the default configuration), trial
  folders, keeping the best fold weights;
- ``objective.py``: one trial: sample, run the folds, report each, prune;
- ``workers.py``: ``tune()``, how many workers (``auto_workers``: one per core on a CPU), worker processes,
  signals, resuming abandoned trials;
- ``report.py``: the trials table, best.yaml and the plots (``kbert tune --report``), the dashboard.

Optuna is used through its public API only. No module here imports MLX when it is imported (a spawned worker
calls ``runtime.setup()`` first; see workers.py).
"""

import warnings

import optuna

from kbert.tune.objective import Abandoned, TrialContext, make_objective
from kbert.tune.options import DEFAULT_STUDY, PRUNERS, TuneOptions, format_duration, parse_duration
from kbert.tune.summary import best_config, serve_dashboard, trials_table, write_report
from kbert.tune.storage import Heartbeats, fail_stale_trials, open_storage
from kbert.tune.study import (FINISHED, keep_top_checkpoints, load_study, make_pruner, ranked_trials,
                              remove_unfinished_folders, resolve_trial_config, study_dir, trial_dir)
from kbert.tune.workers import auto_workers, requeue_abandoned, run_worker, tune

# WilcoxonPruner, TPE's group mode, the retry callback and the matplotlib plots are marked experimental.
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)

__all__ = ["DEFAULT_STUDY", "FINISHED", "PRUNERS", "Abandoned", "Heartbeats", "TrialContext", "TuneOptions",
           "auto_workers", "best_config", "fail_stale_trials", "format_duration", "keep_top_checkpoints",
           "load_study", "make_objective", "make_pruner", "open_storage", "parse_duration", "ranked_trials",
           "remove_unfinished_folders", "requeue_abandoned", "resolve_trial_config", "run_worker", "serve_dashboard",
           "study_dir", "trial_dir", "trials_table", "tune", "write_report"]
