"""kbert's test suite: pytest, with torch + transformers and peft as numerical references; tiny models and small
slices of the bundled data, so the whole suite runs in minutes on 2 cores. conftest.py calls
kbert.models.runtime.setup() before any test imports MLX. bad_inputs/: one folder per user mistake, with its exact
error.
"""
