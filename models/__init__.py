"""Encoders, heads and checkpoints in MLX. Importing this package binds a fast BLAS before MLX loads."""

from models.blas import load_fast_blas

load_fast_blas()
