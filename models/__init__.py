"""Encoders, heads and checkpoints in MLX. Importing this package binds a fast BLAS before MLX loads and, on
Linux, makes glibc keep freed large buffers for reuse (models/blas.py)."""

from models.blas import keep_freed_memory, load_fast_blas

load_fast_blas()
keep_freed_memory()
