"""Files: atomic writes, checked reads, output folders checked before use, locks, and taking back what a refused
command created.

Every write goes to a temp file and is renamed; a missing, truncated or edited artifact, or an OS error while
writing, is one KbertError line naming the file. ``written_together()`` publishes several files at once,
``removed_on_refusal()`` removes what a refused command created, and ``exclusive_lock`` holds a lock file.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import os
import shutil
import tempfile
import zipfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from kbert.errors import KbertError, WriteError, os_error_line

try:
    import fcntl
except ImportError:  # not POSIX: runs are not locked
    fcntl = None


@dataclass
class Created:
    """What the writes of one ``removed_on_refusal`` block created, in order."""

    files: list[Path] = field(default_factory=list)
    folders: list[Path] = field(default_factory=list)  # made on the way to a file: removed only when empty again
    trees: list[Path] = field(default_factory=list)  # folders owned whole (a new run folder): removed with their files

    def remove(self) -> None:
        """Remove the files, the owned folders, then the other new folders that are empty, deepest first."""
        for path in reversed(self.files):
            try:
                path.unlink(missing_ok=True)
            except OSError:  # the refusal that triggered this is what the user must see
                pass
        for tree in reversed(self.trees):
            shutil.rmtree(tree, ignore_errors=True)
        for folder in sorted(self.folders, key=lambda p: len(p.parts), reverse=True):
            try:
                folder.rmdir()
            except OSError:  # not empty: something else was put there too
                pass

    def forget(self) -> None:
        """Keep what was created so far (a run folder with a finished fold can be resumed)."""
        self.files, self.folders, self.trees = [], [], []

    def add(self, other: Created) -> None:
        self.files += other.files
        self.folders += other.folders
        self.trees += other.trees


_CREATED: ContextVar[Created | None] = ContextVar("kbert_created", default=None)


@contextmanager
def removed_on_refusal() -> Iterator[Created]:
    """Record what the writes in the block create; on a KbertError remove it (unless ``forget()`` was called).
    Other exceptions (Ctrl-C, a crash) keep everything: an interrupted run is resumed from what it wrote."""
    created = Created()
    token = _CREATED.set(created)
    try:
        yield created
    except KbertError:
        created.remove()
        raise
    finally:
        _CREATED.reset(token)
    outer = _CREATED.get()
    if outer is not None:  # a block inside another: the outer one takes it back if it is refused later
        outer.add(created)


def _missing_folders(folder: Path) -> list[Path]:
    """``folder`` and its parents that do not exist, outermost first."""
    missing = []
    for path in (folder, *folder.parents):
        if path.exists():
            break
        missing.append(path)
    return missing[::-1]


def _make_folders(folder: Path, path: Path) -> None:
    """Create ``folder`` and its missing parents for writing ``path``; recorded when a block is active."""
    missing = _missing_folders(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise WriteError(f"cannot write {path}: {exc.strerror or exc} ({exc.filename or folder})") from None
    created = _CREATED.get()
    if created is not None:
        created.folders += missing


def make_folders(folder: Path) -> Path:
    """Create ``folder`` and its missing parents, as for a file in it: in a ``removed_on_refusal`` block, the new
    ones are removed again on a refusal, when they are empty."""
    _make_folders(Path(folder), Path(folder))
    return Path(folder)


def make_folder(folder: Path) -> Path:
    """Create ``folder`` (and its missing parents); FileExistsError when it exists. Recorded as owned whole: a
    refusal removes it with everything in it."""
    folder = Path(folder)
    _make_folders(folder.parent, folder)
    try:
        folder.mkdir()
    except FileExistsError:
        raise
    except OSError as exc:
        raise WriteError(os_error_line(exc, folder)) from None
    created = _CREATED.get()
    if created is not None:
        created.trees.append(folder)
    return folder


@dataclass
class Pending:
    """A temp file written in a ``written_together`` block, moved onto its target when the block ends."""

    tmp: Path
    path: Path
    existed: bool


_TOGETHER: ContextVar[list[Pending] | None] = ContextVar("kbert_together", default=None)


@contextmanager
def written_together() -> Iterator[None]:
    """The files that the block's writes produce appear together: each write fills its temp file as usual, and
    only when the whole block has succeeded are they moved into place, in the order written. A full disk (or any
    error) in the block leaves every target as it was: a record (metrics.json, a submission's .json) and the file
    it describes are published together or not at all. Renames need no space, so the moves do not fail for it; the
    targets' old files are removed before the first move, so that a process killed between two moves leaves a new
    record beside no old file it does not describe (an ensemble's new .json beside the previous blend's .csv)."""
    pending: list[Pending] = []
    token = _TOGETHER.set(pending)
    try:
        yield
    except BaseException:
        for item in pending:
            item.tmp.unlink(missing_ok=True)
        raise
    finally:
        _TOGETHER.reset(token)
    for item in pending:  # the old files go first: a kill between two moves leaves no old file beside a new record
        try:
            if item.path.is_file():
                item.path.unlink()
        except OSError:  # (the move below says why it cannot replace it)
            pass
    for index, item in enumerate(pending):
        try:
            _publish(item)
        except KbertError:  # a folder in the way of one: the others' temp files go too
            for rest in pending[index + 1:]:
                rest.tmp.unlink(missing_ok=True)
            raise


def _fill(tmp: Path, write: Callable[[Path], None]) -> None:
    """Where the bytes of every kbert file are written (the fault tests inject their OS errors here)."""
    write(tmp)


def atomic_write(path: Path, write: Callable[[Path], None]) -> Path:
    """Call ``write(tmp_path)``, then move the temp file onto ``path`` (in a ``written_together`` block: when the
    block ends). An OS error (no space, read-only, quota) is a KbertError naming ``path``; the target is untouched."""
    path = Path(path)
    _make_folders(path.parent, path)
    existed = path.exists()
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise WriteError(os_error_line(exc, path)) from None
    os.close(fd)
    item = Pending(Path(tmp), path, existed)
    together = _TOGETHER.get()
    try:
        _fill(item.tmp, write)
        os.chmod(item.tmp, 0o666 & ~UMASK)  # mkstemp creates 0600; give the file the usual mode
    except OSError as exc:
        item.tmp.unlink(missing_ok=True)
        raise WriteError(os_error_line(exc, path)) from None
    except BaseException:
        item.tmp.unlink(missing_ok=True)
        raise
    if together is not None:
        together.append(item)
    else:
        _publish(item)
    return path


def _publish(item: Pending) -> None:
    """Move a written temp file onto its target; record it when it is new and a ``removed_on_refusal`` block is
    active."""
    try:
        os.replace(item.tmp, item.path)
    except OSError as exc:  # e.g. a folder of that name is in the way
        item.tmp.unlink(missing_ok=True)
        raise WriteError(os_error_line(exc, item.path)) from None
    created = _CREATED.get()
    if created is not None and not item.existed:
        created.files.append(item.path)


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


def write_npz(path: Path, arrays: Mapping[str, np.ndarray]) -> Path:
    return _write_numpy(path, lambda handle: np.savez(handle, **arrays))


def write_npy(path: Path, array: np.ndarray) -> Path:
    return _write_numpy(path, lambda handle: np.save(handle, array))


def _write_numpy(path: Path, save: Callable[[Any], None]) -> Path:
    def write(tmp: Path) -> None:
        with open(tmp, "wb") as handle:  # a handle: np.save/np.savez would append a suffix to the temp name
            save(handle)

    return atomic_write(path, write)


def existing_file(path: Path, what: str = "file") -> Path:
    """``path``, a file; a folder there, or nothing, is one line naming it (``what``: the kind of file)."""
    path = Path(path)
    if path.is_dir():
        raise KbertError(f"{path}: a folder, not a {what}")
    if not path.is_file():
        raise KbertError(f"{path}: {what} not found")
    return path


def read_text(path: Path) -> str:
    """A UTF-8 text file; missing or not UTF-8 is an error naming the file."""
    path = existing_file(path)
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise KbertError(f"{path}: not valid UTF-8 (byte {exc.start}); the file is damaged") from None


def read_json_value(path: Path) -> Any:
    """Any JSON value from ``path`` (history.json holds a list); a missing, empty, truncated or invalid file is
    an error naming the file. The caller checks the value's shape."""
    text = read_text(path)
    if not text.strip():
        raise KbertError(f"{path}: file is empty")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise KbertError(f"{path}: not valid JSON (truncated or edited?): {exc}") from None


def is_number(value: Any) -> bool:
    """A JSON number (NaN included), not a boolean: what the checks of kbert's own JSON files accept as one."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def is_seconds(value: Any) -> bool:
    """A finite number of seconds, at least 0 (``is_number``): a duration kbert recorded."""
    return is_number(value) and math.isfinite(value) and value >= 0


def is_numbers(value: Any) -> bool:
    """A JSON list of numbers (``is_number``)."""
    return isinstance(value, list) and all(map(is_number, value))


def check_field(path: Path, key: str, fits: bool, shape: str, found: str = "") -> None:
    """A field of a JSON file kbert wrote, in the shape kbert writes it (``fits``); else one line naming the file
    and the key (``found``: what was there, as the message shows it)."""
    if not fits:
        raise KbertError(f"{path}: '{key}' must be {shape}{found}; the file was edited or damaged")


def read_json(path: Path, required: tuple[str, ...] = ()) -> dict[str, Any]:
    """A JSON object from ``path``; a missing, empty, truncated or invalid file, another JSON value than an
    object, or a missing ``required`` key is an error naming the file."""
    values = read_json_value(path)
    if not isinstance(values, dict):
        raise KbertError(f"{path}: expected a JSON object, found {type(values).__name__}")
    for key in required:
        if key not in values:
            raise KbertError(f"{path}: missing key '{key}'")
    return values


def read_npz(path: Path, required: tuple[str, ...] = ()) -> dict[str, np.ndarray]:
    """Every array of an .npz file (no pickled objects); missing, truncated or corrupt is an error naming it."""
    path = existing_file(path)
    try:
        loaded = np.load(path, allow_pickle=False)
        if not isinstance(loaded, np.lib.npyio.NpzFile):
            raise ValueError("a single array, not an archive of named arrays")
        with loaded as arrays:
            values = {name: arrays[name] for name in arrays.files}
    except (ValueError, OSError, EOFError, KeyError, zipfile.BadZipFile) as exc:
        raise KbertError(f"{path}: not a readable .npz file (truncated or corrupt?): {exc}") from None
    for name in required:
        if name not in values:
            raise KbertError(f"{path}: missing array '{name}'")
    return values


def parse_csv(path: Path, utf8_remedy: str, encoding: str = "utf-8") -> pd.DataFrame:
    """``pd.read_csv(path, encoding=encoding)``, an empty, non-UTF-8 or unparsable file being one line naming it
    (``utf8_remedy`` says what to do about bad bytes). Used for the user's data and kbert's own tables.

    A column of whole numbers is read as numbers only when each one is written as Python writes it: ids such as
    ``0061`` (or ``+7``) stay the text they are, in every file that holds them, so a submission gives them back as
    the sample submission has them."""
    try:
        frame = pd.read_csv(path, encoding=encoding)
        integers = [c for c in frame.columns if pd.api.types.is_integer_dtype(frame[c])]
        if integers:
            text = pd.read_csv(path, encoding=encoding, usecols=integers, dtype=str, keep_default_na=False)
            for column in integers:
                if not text[column].equals(frame[column].astype(str)):
                    frame[column] = text[column]
        return frame
    except pd.errors.EmptyDataError:
        raise KbertError(f"{path}: file is empty") from None
    except UnicodeDecodeError as exc:
        raise KbertError(f"{path}: not valid UTF-8 (byte {exc.start}); {utf8_remedy}") from None
    except pd.errors.ParserError as exc:
        raise KbertError(f"{path}: could not parse CSV: {' '.join(str(exc).split())}") from None
    except (ValueError, EOFError, zipfile.BadZipFile, gzip.BadGzipFile) as exc:  # a damaged .gz, a .zip of several
        raise KbertError(f"{path}: could not read it as CSV ({type(exc).__name__}: {exc})") from None


def check_fields(path: Path, frame: pd.DataFrame) -> None:
    """Every row of ``frame`` (read from ``path``) has the fields its header names: with one more, pandas takes the
    first column as the rows' labels and shifts every column by one (a comma at the end of each row)."""
    if not frame.index.equals(pd.RangeIndex(len(frame))):
        raise KbertError(f"{path}: its rows hold more fields than its header names (a comma at the end of each row?)")


def read_table(path: Path, required: tuple[str, ...] = ()) -> pd.DataFrame:
    """A CSV file that kbert wrote (folds.csv, oof.csv, test.csv): missing, empty, unparsable, with more fields than
    its header or lacking a ``required`` column is an error naming the file."""
    frame = parse_csv(existing_file(path), "the file is damaged")
    check_fields(path, frame)
    missing = [c for c in required if c not in frame.columns]
    if missing:
        raise KbertError(f"{path}: missing column(s) {', '.join(map(repr, missing))}")
    return frame


def read_predictions(path: Path, id_column: str | None = None, empty_rows: bool = False) -> pd.DataFrame:
    """A prediction table kbert wrote (a run's oof.csv or test.csv, a fold's test.csv): the id column (``None``:
    the first), then prediction columns of finite numbers, as floats. A text, infinite or empty cell (an edited
    or damaged file) is an error naming the file, the column and the row, before any caller does arithmetic on
    it. ``empty_rows``: rows whose predictions are all empty (a time-series run's first block has no OOF
    prediction) are kept as NaN."""
    frame = read_table(path, required=() if id_column is None else (id_column,))
    id_column = frame.columns[0] if id_column is None else id_column
    columns = [c for c in frame.columns if c != id_column]
    values = frame[columns].apply(pd.to_numeric, errors="coerce").astype(np.float64)  # text: NaN, found below
    empty = frame[columns].isna().all(axis=1).to_numpy() & empty_rows
    bad = np.argwhere(~np.isfinite(values.to_numpy()) & ~empty[:, None])
    if len(bad):
        row, column = int(bad[0][0]), columns[bad[0][1]]  # the first in the file's order
        found = shown_cell(frame[column].iloc[row])
        raise KbertError(f"{path}: column {column!r} must hold finite numbers, found {found} (row {row + 2}); the "
                         "file was edited or damaged")
    return pd.concat([frame[[id_column]], values], axis=1)


def shown_cell(value: Any) -> str:
    """A CSV cell as an error message shows it: text quoted, a number as written, an empty cell in words."""
    if pd.isna(value):
        return "an empty or NaN cell"
    return repr(value) if isinstance(value, str) else str(value)


def file_sha256(path: Path) -> str:
    """The sha256 of a file's bytes, read in blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def check_writable_folder(folder: Path, what: str) -> None:
    """Refuse a folder that could not be made or written in: a file (or anything but a folder) where it or one of
    its parents should be, or an existing folder without write permission. ``what`` names where it comes from
    (``--out runs``). Nothing is created."""
    folder = Path(folder)
    for path in (folder, *folder.parents):
        if path.exists() or path.is_symlink():
            if not path.is_dir():
                raise KbertError(f"{what}: '{path}' is not a folder")
            if not os.access(path, os.W_OK | os.X_OK):
                raise KbertError(f"{what}: '{path}' is not writable")
            return


@contextmanager
def exclusive_lock(path: Path, held_elsewhere: str) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created when missing; the file stays) for the block. The lock goes
    when the block ends or the process dies, however. Held by another process: a KbertError with the message
    ``held_elsewhere``. Without fcntl (not POSIX) nothing is locked."""
    if fcntl is None:
        yield
        return
    path = Path(path)
    existed = path.exists()
    handle = open(path, "a")
    created = _CREATED.get()
    if created is not None and not existed:
        created.files.append(path)
    try:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise KbertError(held_elsewhere) from None
        yield
    finally:
        handle.close()
