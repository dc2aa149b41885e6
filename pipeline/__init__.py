"""The competition pipeline: data -> folds -> text -> tokens -> training -> OOF/test -> submission.

Composes kbert.models and kbert.features into stages: config.py and data.py (the YAML and the CSVs), splits.py (fold assignment),
fold.py (one fold: fit its transforms, tokenize, train, save), train.py (the MLX training loop), run.py (a whole
run as named stages), artifacts.py (the run folder contract), predictions.py, calibration.py, metrics.py,
submission.py, pseudo.py (pseudo-labels from a teacher on the same folds), and the commands' own stages (new_rows.py for kbert predict,
pretrain.py, embed.py, importance.py, init.py, kaggle.py). It never imports the layers above it: ensembles, tuning,
reports, kbert auto and the command line (tests/test_layers.py).
"""
