"""The competition pipeline: data -> folds -> text -> tokens -> training -> OOF/test -> submission.

Composes kbert.models and kbert.features into a run's named stages (run.py; one fold in fold.py) and the other
commands' own stages. It never imports the layers above it: ensembles, tuning, reports, kbert auto and the command
line (tests/test_layers.py).
"""
