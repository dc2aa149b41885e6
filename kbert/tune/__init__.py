"""Optuna tuning over k folds: ``kbert tune <competition>``.

A study lives in ``runs/<competition>/<study>/``: ``journal.log`` (or an RDB URL), ``journal.log.heartbeats/``,
one ``trial-<NNNN>/`` run folder per completed trial, and ``report/``. Each trial is one ``run_competition`` over
the k folds, reported fold by fold and pruned when clearly worse; a killed or abandoned trial is queued again with
the same parameters, so the same command resumes.

- ``options.py``: one invocation's settings; ``space.py`` + ``search_space.yaml``: the search space;
- ``storage.py``: where trials are kept, and finding a dead worker's trial; ``database.py``: an RDB URL;
  ``trial_store.py``: ``--artifacts``;
- ``study.py``: open or create the study; ``objective.py``: one trial; ``workers.py``: ``tune()`` and its workers;
- ``summary.py``: the trials table, best.yaml and the plots (``kbert tune --report``).

No module here imports MLX when it is imported: a spawned worker calls ``runtime.setup()`` first.
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
