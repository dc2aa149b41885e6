"""Encoders, heads, adapters and checkpoints in MLX, one model per file with Hugging Face weight names.

Imports only the bottom layer (kbert.errors, kbert.io, kbert.tasks), never the pipeline above it. Importing
this package has no side effects; ``kbert.models.runtime.setup()`` binds the fast BLAS before MLX loads.
"""
