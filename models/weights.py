"""Weight files: strict loading into a module, and atomic safetensors writing."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_unflatten

from kbert.errors import KbertError
from kbert.io import atomic_write


def load_state_strict(module: nn.Module, weights: dict[str, mx.array], source: str,
                      trainable_only: bool = False, kind: str = "") -> None:
    """Load flat ``name -> array`` weights into ``module``; any missing, unexpected or mis-shaped name is an error.

    ``trainable_only``: the weights are exactly the trainable parameters (an adapter checkpoint); ``kind``
    prefixes "weights" in the messages. Names are unflattened before ``Module.update`` (which silently
    ignores dotted keys).
    """
    expected = dict(tree_flatten(module.trainable_parameters() if trainable_only else module.parameters()))
    missing = sorted(set(expected) - set(weights))
    unexpected = sorted(set(weights) - set(expected))
    if missing or unexpected:
        raise KbertError(f"{source}: {kind}weights do not match the model; missing keys: {shortened(missing)}; "
                         f"unexpected keys: {shortened(unexpected)}")
    wrong_shape = [f"{k} {tuple(weights[k].shape)} != {tuple(v.shape)}" for k, v in expected.items()
                   if tuple(weights[k].shape) != tuple(v.shape)]
    if wrong_shape:
        raise KbertError(f"{source}: {kind}weight shapes do not match the model: {wrong_shape}")
    module.update(tree_unflatten(list(weights.items())))
    mx.eval(module.parameters())


def shortened(names: list[str], shown: int = 4) -> str:
    """The first few names of a list and how many more there are, for a one-line message."""
    if not names:
        return "none"
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")


def read_safetensors(path: Path) -> dict[str, mx.array]:
    """Every tensor of a safetensors file; a missing, truncated or corrupt file is one clear error."""
    path = Path(path)
    if not path.is_file():
        raise KbertError(f"{path}: file not found")
    try:
        return mx.load(str(path), format="safetensors")
    except (RuntimeError, ValueError, OSError) as exc:
        detail = str(exc).split("] ", 1)[-1].replace(" Perhaps an incomplete download or corrupt file?", "")
        raise KbertError(f"{path}: not a readable safetensors file (truncated or corrupt download?): {detail}") from None


def load_weights_strict(module: nn.Module, path: Path) -> None:
    if not Path(path).is_file():
        raise KbertError(f"{path}: weight file not found")
    load_state_strict(module, read_safetensors(path), str(path))


def save_safetensors(path: Path, weights: dict[str, mx.array], metadata: dict[str, str] | None = None) -> Path:
    """Flat ``name -> array`` weights, written atomically."""

    def save(tmp: Path) -> None:
        # mx.save_safetensors appends ".safetensors" to names without it; write there, then move.
        target = tmp.with_name(tmp.name + ".safetensors")
        try:
            mx.save_safetensors(str(target), weights, metadata={"format": "mlx", **(metadata or {})})
        except RuntimeError as exc:  # MLX says "[write] Unable to write N bytes" and no errno
            target.unlink(missing_ok=True)
            raise OSError(f"{exc} (is the disk full?)") from None
        target.replace(tmp)

    return atomic_write(Path(path), save)


def write_safetensors(path: Path, module: nn.Module) -> Path:
    """All parameters of ``module`` under their dotted names, written atomically."""
    return save_safetensors(path, dict(tree_flatten(module.parameters())))
