"""Atomic file writes (write to a temp file beside the target, then rename: nothing is half-written), and
reading a JSON file that must exist and hold some keys."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from kbert.errors import KbertError


def atomic_write(path: Path, write: Callable[[Path], None]) -> Path:
    """Call ``write(tmp_path)``, then move the temp file onto ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        write(tmp_path)
        os.chmod(tmp_path, 0o666 & ~UMASK)  # mkstemp creates 0600; give the file the usual mode
        os.replace(tmp_path, path)
    finally:
        tmp_path.unlink(missing_ok=True)
    return path


def _read_umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


UMASK = _read_umask()  # read once: reading it sets it for a moment, which races with threads writing files


def write_text(path: Path, text: str) -> Path:
    return atomic_write(path, lambda p: p.write_text(text, encoding="utf-8"))


def write_json(path: Path, data: Any) -> Path:
    return write_text(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


def write_yaml(path: Path, data: Any) -> Path:
    return write_text(path, yaml.safe_dump(data, sort_keys=False))


def write_csv(path: Path, frame: pd.DataFrame) -> Path:
    return atomic_write(path, lambda p: frame.to_csv(p, index=False))


def write_npz(path: Path, **arrays: np.ndarray) -> Path:
    return _write_numpy(path, lambda handle: np.savez(handle, **arrays))


def write_npy(path: Path, array: np.ndarray) -> Path:
    return _write_numpy(path, lambda handle: np.save(handle, array))


def _write_numpy(path: Path, save: Callable[[Any], None]) -> Path:
    def write(tmp: Path) -> None:
        with open(tmp, "wb") as handle:  # a handle: np.save/np.savez would append a suffix to the temp name
            save(handle)

    return atomic_write(path, write)


def read_json(path: Path, required: tuple[str, ...] = ()) -> dict[str, Any]:
    """A JSON object from ``path``; a missing file or a missing ``required`` key is an error naming the file."""
    path = Path(path)
    if not path.is_file():
        raise KbertError(f"{path}: file not found")
    values = json.loads(path.read_text(encoding="utf-8"))
    for key in required:
        if key not in values:
            raise KbertError(f"{path}: missing key '{key}'")
    return values
