"""kbert: Kaggle competitions with BERT-family encoders in MLX.

One import name, in layers that point one way (tests/test_layers.py checks it):

- the bottom, here: ``kbert.errors`` (the one user-facing error), ``kbert.io`` (atomic file writes and
  checked reads), ``kbert.names`` (names that become paths) and ``kbert.tasks`` (each task's metric, loss
  and prediction columns); they import only each other;
- ``kbert.models`` (repository folder ``models/``: encoders, heads, adapters, checkpoints in MLX) and
  ``kbert.features`` (``features/``: table -> text serializers, feature functions), on the bottom only;
  ``kbert.competitions`` (``competitions/``) holds the bundled YAMLs and data, no code;
- ``kbert.pipeline`` (``pipeline/``): config, data, folds, the stages of a fold, training, the run, predict;
- on top: ``kbert.ensembles`` (``ensembles/``: baselines and blends), ``kbert.tune`` (Optuna studies),
  ``kbert.report`` (plots and HTML) and ``kbert.cli`` (the ``kbert`` command).

Importing ``kbert`` loads nothing else; call ``kbert.models.runtime.setup()`` before MLX loads.
"""
