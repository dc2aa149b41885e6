"""``kbert init``: write a competition YAML for a new CSV pair by inferring its id, target, task and column types.

The result, a starting point to read and edit, goes to the working folder's ``competitions/<name>.yaml``, never
into the installed package; its ``data_dir`` is relative to the YAML file. The metric follows what the sample
submission holds, and the YAML says why in a comment above ``metric:``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from kbert.errors import KbertError
from kbert.io import write_text
from kbert.names import check_name
from kbert.pipeline.artifacts import check_output_file
from kbert.pipeline.config import USER_DIR, CompetitionConfig, parse_competition
from kbert.pipeline.data import (check_competition_frames, duplicate_report, near_header, plain, read_csv,
                                 written_labels)
from kbert.pipeline.metrics import check_metric_fits, get_metric
from kbert.tasks import Task, submission_kind

RARE_POSITIVE = 0.2  # a label submission whose positive class is rarer than this is scored by F1, not accuracy
MAX_INTEGER_CLASSES = 10  # a target of at most this many distinct integers is classes; of more, a regression
FEW_TEXT_CELLS = 0.1  # a numeric target's cells of text (a '?') are at most this share of its cells
THOUSANDS = r"[+-]?\d{1,3}(,\d{3})+(\.\d+)?"  # a number written with thousands separators: 104,811 or -1,234.5


@dataclass(frozen=True)
class DataFiles:
    """A new competition's CSV files, all in one folder: train, test and (optionally) the sample submission."""

    train: Path
    test: Path
    sample: Path | None = None


def column_dtype(values: pd.Series) -> str:
    words = set(values.dropna().astype(str)) <= {"True", "False"} and values.notna().any()
    if pd.api.types.is_bool_dtype(values) or words:
        return "bool"
    if pd.api.types.is_integer_dtype(values):
        return "int"
    if pd.api.types.is_numeric_dtype(values):
        return "float"
    return "str"


def sample_id(sample: pd.DataFrame, test: pd.DataFrame, given: str | None = None) -> str:
    """The sample submission's id column: ``given`` (--id), else the one of its columns the test file holds with
    values (where one does; a test file may carry the target as an empty column), else its first; it may come
    after the values (``y,id``)."""
    if given is not None:
        return given
    shared = [str(c) for c in sample.columns if c in test.columns and test[c].notna().any()]
    return shared[0] if len(shared) == 1 else str(sample.columns[0])


def sample_values(sample: pd.DataFrame, test: pd.DataFrame, given: str | None = None) -> list:
    """The sample submission's value columns, in its order: every column but the id (``given``: --id)."""
    identifier = sample_id(sample, test, given)
    return [c for c in sample.columns if str(c) != identifier]


def infer_id_column(train: pd.DataFrame, test: pd.DataFrame, sample: pd.DataFrame | None) -> str:
    if sample is not None:
        return sample_id(sample, test)
    shared = [c for c in train.columns if c in test.columns and train[c].is_unique and test[c].is_unique]
    named = [c for c in shared if re.search(r"(^|_|\b)id$", str(c), re.IGNORECASE)]
    if named:
        return named[0]
    first = shared[0] if shared and shared[0] == train.columns[0] else None
    if first is not None and not pd.api.types.is_float_dtype(train[first]):  # a float column is a measurement
        return first
    raise KbertError("could not tell the id column (no unique column named like '...id' in both files); pass --id")


def target_candidates(train: pd.DataFrame, test: pd.DataFrame) -> list[str]:
    """The training columns the test file lacks, else those it carries empty (as some test files carry the
    target): where the target is."""
    only_train = [str(c) for c in train.columns if c not in test.columns]
    return only_train or [str(c) for c in train.columns if test[c].isna().all() and train[c].notna().any()]


def classes_of(target: pd.Series) -> set[str]:
    """A target's classes as a sample submission names its per-class columns."""
    return {str(plain(v)) for v in target.dropna().unique()}


def is_per_class(names: list, target: pd.Series) -> bool:
    """Whether the sample's value columns ``names`` are one probability column per class of ``target``: a column
    for each of its (two or more) classes; a column for a class no training row has is one the model never
    predicts (``unseen_class_notes``)."""
    classes = classes_of(target)
    return len(classes) >= 2 and classes <= {str(c) for c in names}


def class_columns_problem(names: list, column: str, target: pd.Series) -> str:
    """Why the sample's value columns ``names``, two or more of them classes of ``column``, are not one column per
    class of it: classes that training rows hold and the sample has no column for; "" where there are none."""
    classes, named = classes_of(target), [str(c) for c in names]
    absent = sorted(classes - set(named))
    if len(classes & set(named)) < 2 or not absent or column in named:
        return ""
    shown = ", ".join(map(repr, absent))
    return (f"columns {named} are classes of '{column}', but not {shown}, which training rows hold: kbert writes one "
            f"probability column per class of the target; remove the training rows of {shown} if the competition "
            "never scores them")


def class_of(name: str, target: pd.Series) -> object:
    """The class a per-class column ``name`` stands for: the target's own value written so, else (a class no
    training row has) ``name`` as a number where the target holds numbers, else as the text it is."""
    by_name = {str(plain(v)): plain(v) for v in target.dropna().unique()}
    number = pd.to_numeric(pd.Series([name]), errors="coerce").iloc[0]
    if name in by_name or not pd.api.types.is_numeric_dtype(target) or pd.isna(number):
        return by_name.get(name, name)
    return int(number) if float(number).is_integer() else float(number)


def per_class_classes(train: pd.DataFrame, names: list[str], targets: list[str], path: Path | None) -> list | None:
    """The classes of a sample whose value columns ``names`` are one per class of the one target, in its column
    order (the submission's); None for any other sample. Refused where they are some of its classes, not all."""
    if len(targets) != 1:
        return None
    problem = class_columns_problem(names, targets[0], train[targets[0]])
    if problem:
        raise KbertError(f"{path}: {problem}")
    if targets[0] in names or not is_per_class(names, train[targets[0]]):
        return None
    return [class_of(c, train[targets[0]]) for c in names]


def per_class_target(train: pd.DataFrame, test: pd.DataFrame, sample: pd.DataFrame,
                     id_column: str | None = None) -> str | None:
    """The target of a sample submission with one probability column per class (``is_per_class``): the one
    training column missing from the test file (or empty there) whose classes the sample's columns name."""
    names = sample_values(sample, test, id_column)
    found = [c for c in target_candidates(train, test) if is_per_class(names, train[c])]
    return found[0] if len(found) == 1 else None


def header_hints(names: list[str], columns, file: str) -> str:
    """``file``'s columns that ``names`` nearly are (other spaces or case: ``near_header``), as one clause."""
    hints = [near_header(name, columns).removeprefix("the file has ") for name in names]
    return f"{file} has {', '.join(h for h in hints if h)}" if any(hints) else ""


def unknown_sample_columns(train: pd.DataFrame, test: pd.DataFrame, sample: pd.DataFrame, files: DataFiles,
                           id_column: str | None) -> KbertError:
    """The error for a sample whose value columns are neither training columns nor one per class of one: the
    columns they nearly are (another spelling, some of the classes of a column), else --target."""
    values = [str(c) for c in sample_values(sample, test, id_column)]
    others = [c for c in values if c not in train.columns]
    train_name = Path(files.train).name
    near = header_hints(others, train.columns, train_name)
    if near:
        return KbertError(f"{files.sample}: column(s) {others} are not in {train_name}, but {near}: correct the "
                          f"header of {Path(files.sample).name}")
    problems = [class_columns_problem(values, c, train[c]) for c in target_candidates(train, test)]
    if any(problems):
        return KbertError(f"{files.sample}: {next(p for p in problems if p)}")
    return KbertError(f"{files.sample}: column(s) {others} are neither training columns nor the classes of one; "
                      "pass --target")


def infer_targets(train: pd.DataFrame, test: pd.DataFrame, sample: pd.DataFrame | None, files: DataFiles,
                  id_column: str | None = None) -> list[str]:
    if sample is not None:
        values = sample_values(sample, test, id_column)
        if all(c in train.columns for c in values):
            return [str(c) for c in values]
        target = per_class_target(train, test, sample, id_column)
        if target is None:
            raise unknown_sample_columns(train, test, sample, files, id_column)
        return [target]
    only_train = target_candidates(train, test)
    if not only_train:
        raise KbertError("every training column is also in the test file, so the target is unclear; pass --target")
    if len(only_train) > 1 and not all(pd.api.types.is_numeric_dtype(train[c]) for c in only_train):
        raise KbertError(f"the training file's columns {only_train} are not in the test file, so the target is "
                         "unclear; pass --target (several numeric targets are read as multilabel or time series)")
    return only_train


def infer_task(values: pd.DataFrame, per_class: bool = False) -> Task:
    """Several columns: multilabel (all 0/1) or time series; one column: binary when it holds two values (of any
    type), multiclass for text, few integers or one probability column per class, else regression."""
    if values.shape[1] > 1:
        binary = all(set(values[c].dropna().unique()) <= {0, 1} for c in values.columns)
        return Task.MULTILABEL if binary else Task.TIMESERIES
    column = values.iloc[:, 0].dropna()
    distinct = column.nunique()
    if distinct == 2 and not per_class:
        return Task.BINARY
    if per_class or not pd.api.types.is_numeric_dtype(column) or (pd.api.types.is_integer_dtype(column)
                                                                  and distinct <= MAX_INTEGER_CLASSES):
        return Task.MULTICLASS
    return Task.REGRESSION


def whole_numbers(values: pd.Series) -> pd.Series:
    """Numbers as integers where each is one (what reading them from a file gives)."""
    return values.astype("int64") if len(values) and (values == values.round()).all() else values


def numbers_as_text(values: pd.Series) -> str:
    """Why a text target is a numeric one written as text: numbers with thousands separators, or numbers but for a
    few cells of text with no digit in them (a '?'); "" where it is neither (text classes, numbers)."""
    given = values.dropna()
    if pd.api.types.is_numeric_dtype(given) or given.empty:
        return ""
    text = given.astype(str).str.strip()
    grouped = text.str.fullmatch(THOUSANDS)
    numbers = pd.to_numeric(text.where(~grouped, text.str.replace(",", "", regex=False)), errors="coerce")
    words = given[numbers.isna()]
    found = whole_numbers(numbers.dropna())
    if len(words) > FEW_TEXT_CELLS * len(given) or words.astype(str).str.contains(r"\d").any() \
            or found.nunique() < 2 or not infer_task(found.to_frame()).numeric:
        return ""
    if grouped.any():
        shown = ", ".join(repr(v) for v in text[grouped].head(3))
        plain_number = text[grouped].iloc[0].replace(",", "")
        return (f"holds numbers written with thousands separators ({shown}, ...), which kbert reads as text, each "
                f"value a class: re-save them without the separators ({plain_number})")
    rows = ", ".join(str(i + 2) for i in words.index[:5]) + (", ..." if len(words) > 5 else "")
    return (f"holds numbers but for {len(words)} cell(s) of text ({', '.join(map(repr, sorted(set(words))[:3]))} at "
            f"row(s) {rows}), which make kbert read every value as text, each a class: remove those rows or give them "
            "numbers")


def spaced_labels(values: pd.Series) -> str:
    """Labels of a text target that differ only in spaces around them ('yes' and 'yes '); "" where none do."""
    given = values.dropna()
    if pd.api.types.is_numeric_dtype(given):
        return ""
    distinct = pd.Series(sorted(given.astype(str).unique()))
    clashes = distinct.groupby(distinct.str.strip()).agg(list)
    clashes = clashes[clashes.str.len() > 1]
    if clashes.empty:
        return ""
    shown = "; ".join(" and ".join(map(repr, group)) for group in clashes.head(3))
    return (f"has labels that differ only in spaces around them ({shown}), which kbert reads as {len(distinct)} "
            "classes: strip the spaces in the file")


def check_target_cells(train: pd.DataFrame, targets: list[str], path: Path) -> None:
    """Each target's cells, as written, hold what kbert can learn: numbers written as numbers, labels spelt one way
    (``numbers_as_text``, ``spaced_labels``)."""
    for column in targets:
        problem = numbers_as_text(train[column]) or spaced_labels(train[column])
        if problem:
            raise KbertError(f"{path}: target '{column}' {problem}")


def binary_classes(target: pd.Series) -> list | None:
    """[negative, positive] for a two-valued target that is not 0/1 or True/False: the rarer value is positive
    (what F1 and pseudo-labels look for; on a tie, the later in sorted order). None for 0/1 and True/False."""
    values = [plain(v) for v in target.dropna().unique()]
    if set(values) <= {0, 1}:
        return None
    counts = target.value_counts()
    negative, positive = sorted(values, key=lambda v: (-counts[v], str(v)))
    return [negative, positive]


def label_dtype(target: pd.Series) -> str:
    """The submission type of a label column written from the target's own values."""
    dtype = column_dtype(target)
    integral = dtype == "float" and bool((target.dropna() == target.dropna().round()).all())
    return "int" if integral else "str" if dtype == "float" else dtype


def sample_dtype(column: pd.Series, target: pd.Series, *, probabilities: bool) -> str:
    """A sample submission column's type: float cells are probabilities (where the task predicts one per column:
    ``probabilities``) or values; other cells are labels, written as the sample writes them (0/1, True/False), or as
    the target's strings."""
    if column.isna().all():
        return label_dtype(target)
    dtype = column_dtype(column)
    if dtype == "float" and not (probabilities and column.dropna().between(0, 1).all()):  # the target's values
        return label_dtype(target)
    if dtype == "float" or label_dtype(target) != "str":
        return dtype
    return "str"


def date_order(train: pd.DataFrame, test: pd.DataFrame, columns: list[str]) -> str | None:
    """A column of dates that orders the training rows, every test date after them: a time series, whose shuffled
    folds would validate on the past of the rows they train on (a leaky, optimistic CV); None when none does."""
    import warnings

    for column in columns:
        if pd.api.types.is_numeric_dtype(train[column]) or train[column].isna().any() or test[column].isna().any():
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # pandas guessing a format per element
            before = pd.to_datetime(train[column], errors="coerce")
            after = pd.to_datetime(test[column], errors="coerce")
        if before.notna().all() and after.notna().all() and before.is_monotonic_increasing \
                and before.nunique() > 1 and after.min() >= before.max():
            return str(column)
    return None


def submission_order(columns: dict[str, str], sample: pd.DataFrame | None) -> dict[str, str]:
    """The submission's columns in the sample submission's order (its id may come last), else the id first."""
    if sample is None or {str(c) for c in sample.columns} != set(columns):
        return columns
    return {str(c): columns[str(c)] for c in sample.columns}


def submission_types(task: Task, train: pd.DataFrame, targets: list[str], sample: pd.DataFrame | None,
                     classes: list | None) -> dict[str, str]:
    """Each submission value column's type: from the sample submission where there is one (probabilities or
    labels, one column per class), else labels of the target's type (values for a numeric task)."""
    if task.numeric:
        return {t: "float" for t in targets}
    if task == Task.MULTICLASS and classes is not None:
        return {str(c): "float" for c in classes}
    return {t: label_dtype(train[t]) if sample is None or t not in sample.columns
            else sample_dtype(sample[t], train[t], probabilities=task.probabilities) for t in targets}


def choose_metric(task: Task, train: pd.DataFrame, targets: list[str], kind: str, classes: list | None
                  ) -> tuple[str, str]:
    """The default metric for what the submission holds, and why, for the YAML's comment."""
    if task.numeric:
        return task.default_metric, "the task's default; write the competition's own metric here (e.g. rmse_log)"
    if kind == "score":
        metric = "log_loss" if task == Task.MULTICLASS else "roc_auc"
        return metric, f"{metric}: the sample submission holds probabilities"
    if task == Task.MULTICLASS:
        return "accuracy", "accuracy: the submission holds one label per row"
    booleans = all(column_dtype(train[t]) == "bool" for t in targets)
    positive = classes[1] if classes is not None else True if booleans else 1
    share = float(np.mean([(train[t] == positive).mean() for t in targets]))
    if share < RARE_POSITIVE:
        metric = "f1" if task == Task.BINARY else "f1_micro"
        return metric, (f"{metric}: the submission holds labels and the positive class {positive!r} is {share:.0%} of "
                        "the training rows; accuracy would reward predicting the majority")
    return "accuracy", (f"accuracy: the submission holds labels and the positive class {positive!r} is {share:.0%} "
                        f"of the training rows (below {RARE_POSITIVE:.0%} init picks f1)")


def data_dir_for(data: Path, yaml_path: Path) -> str:
    """The YAML's ``data_dir``: the data folder relative to the YAML's own folder (load_competition resolves it
    from there, so it holds from any working folder, and a project folder moved whole keeps working); absolute
    where no relative path exists (another drive on Windows)."""
    try:
        return Path(os.path.relpath(data, Path(yaml_path).resolve().parent)).as_posix()
    except ValueError:
        return str(data)


def check_sample_shape(sample: pd.DataFrame, test: pd.DataFrame, path: Path, id_column: str | None) -> None:
    """A sample submission holds an id and the columns to predict, never the test's input columns (a training or
    test file given as --sample-submission by mistake)."""
    identifier = sample_id(sample, test, id_column)
    inputs = [str(c) for c in sample.columns if c in test.columns and c != identifier and test[c].notna().any()]
    if inputs:
        raise KbertError(f"{path}: holds the test file's input columns {inputs[:4]}: not a sample submission (the id "
                         "and the columns to predict)")


def check_writable_submission(competition: CompetitionConfig, train: pd.DataFrame, test: pd.DataFrame,
                              sample: pd.DataFrame | None) -> None:
    """A run of the YAML can write its submission (the sample's columns, ids and their types): the check `kbert
    run` makes before training (``check_submittable``), made before the YAML is written, so that init never writes
    one that every run refuses."""
    from kbert.pipeline.provenance import Expected
    from kbert.pipeline.submission import placeholder_submission
    from kbert.pipeline.targets import encode_targets

    classes = encode_targets(train, competition).classes  # (as a run's: a binary task's two, or None)
    expected = Expected(competition=competition, inputs={}, train_ids=train[competition.id_column],
                        test_ids=test[competition.id_column], truth=np.zeros(len(train)), classes=classes)
    try:
        placeholder_submission(expected, sample, Path(f"the submission of {competition.name}"))
    except KbertError as exc:
        raise KbertError(f"{exc}: no YAML kbert init can infer writes this competition's submission; write the "
                         "YAML by hand (kbert init --target and --id name the columns it cannot tell)") from None


def label_text(value: object) -> str:
    """A label as text, a whole float as the integer it is (a sample's 5.0 is the target's 5)."""
    value = plain(value)
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def sample_label_notes(competition: CompetitionConfig, train: pd.DataFrame, sample: pd.DataFrame | None,
                       path: Path | None) -> list[str]:
    """A line for each label column of the sample whose values are not the target's (0 for yes/no, No for no): a
    placeholder, or another spelling the competition wants; the submission writes the target's values."""
    if sample is None or submission_kind(competition.task, competition.value_columns) != "label":
        return []
    lines = []
    for column, dtype in competition.value_columns.items():
        if column not in train.columns or dtype == "bool":  # (True/False: written as the sample writes them)
            continue
        targets = {label_text(v) for v in train[column].dropna().unique()}
        found = sorted({str(plain(v)) for v in sample[column].dropna().unique() if label_text(v) not in targets})
        if found:
            lines.append(f"note: {path.name} column '{column}' holds {', '.join(found[:3])}, not the target's values "
                         f"({', '.join(sorted(targets)[:5])}); the submission writes the target's values: if the "
                         "competition wants the sample's, map them in the training file")
    return lines


def unseen_class_notes(competition: CompetitionConfig, train: pd.DataFrame, path: Path | None) -> list[str]:
    """A line for the sample's per-class columns that no training row has (``is_per_class``): never predicted."""
    if competition.task != Task.MULTICLASS or competition.classes is None:
        return []
    target = competition.target_columns[0]
    unseen = [c for c in competition.classes if str(c) not in classes_of(train[target])]
    return [f"note: {path.name} has a column for class(es) {', '.join(map(repr, unseen))} of '{target}', which no "
            "training row has: the model never learns it, so the submission gives it a probability near 0"] if unseen \
        else []


def integer_regression_notes(competition: CompetitionConfig, train: pd.DataFrame, sample: pd.DataFrame | None,
                             path: Path | None) -> list[str]:
    """A line for an integer target that init reads as a regression (more than ``MAX_INTEGER_CLASSES`` values, each
    on two rows or more) where the sample writes integers: its submission writes decimals; the line says how to get
    integers."""
    if competition.task != Task.REGRESSION or sample is None:
        return []
    return [f"note: target '{t}' holds {train[t].nunique()} distinct integers and {path.name} writes integers: init "
            f"chose task regression (metric {competition.metric}), whose submission writes decimals; if '{t}' is "
            "levels or classes, set task: ordinal (metric: qwk) or task: multiclass (metric: accuracy), and "
            f"'{t}: int' under submission.columns"
            for t in competition.target_columns
            if t in sample.columns and column_dtype(train[t]) == "int" and column_dtype(sample[t]) == "int"
            and 2 * train[t].nunique() <= len(train)]  # (levels repeat; a price or a count of its own does not)


def init_competition(name: str, files: DataFiles, *, out: Path | None = None, id_column: str | None = None,
                     target: str | None = None, force: bool = False, log: Callable[[str], None] = print) -> Path:
    """Infer and write ``out`` (default: ``competitions/<name>.yaml`` under the working folder); returns its path.
    ``id_column`` and ``target``: given instead of inferred. ``log`` gets the line on repeated free text, if any
    (``duplicate_report``)."""
    check_name(name, "kbert init NAME")
    out = Path(out) if out else USER_DIR / f"{name}.yaml"
    if out.suffix not in (".yaml", ".yml"):
        raise KbertError(f"--out {out}: a competition YAML's name ends in .yaml or .yml (kbert reads any other "
                         "word as a competition's name)")
    if out.exists() and not force:
        raise KbertError(f"{out} exists; pass --force to overwrite it")
    check_output_file(out, f"--out {out}")
    for flag, given in (("--train", files.train), ("--test", files.test), ("--sample-submission", files.sample)):
        if given is not None and Path(given).is_dir():
            raise KbertError(f"{flag} {given}: a folder; give the CSV file in it")
    train_path, test_path, sample_path = Path(files.train).resolve(), Path(files.test).resolve(), files.sample
    folders = {train_path.parent, test_path.parent, *([Path(sample_path).resolve().parent] if sample_path else [])}
    if len(folders) > 1:
        raise KbertError(f"{train_path.name}, {test_path.name} (and the sample submission) must be in one folder")
    train, test = read_csv(train_path), read_csv(test_path)
    sample = read_csv(Path(sample_path)) if sample_path else None
    if sample is not None:
        check_sample_shape(sample, test, Path(sample_path), id_column)
    inferred_id = id_column is None
    id_column = id_column or infer_id_column(train, test, sample)
    targets = [target] if target else infer_targets(train, test, sample, files, id_column)
    for column in [id_column, *targets]:
        if column not in train.columns:
            hint = f"; {near_header(column, train.columns)}" if near_header(column, train.columns) else ""
            if inferred_id and sample is not None and column == id_column:  # the sample's, not the user's
                raise KbertError(f"{sample_path}: its id column '{column}' is not in {train_path.name}{hint}")
            raise KbertError(f"{train_path}: no column '{column}'{hint}")
    train = written_labels(train_path, train, targets)  # a class named NA is a class, as kbert run reads it
    sample = written_labels(Path(sample_path), sample, targets) if sample is not None else None
    check_target_cells(train, targets, train_path)
    for column in targets:
        if train[column].nunique() < 2:
            raise KbertError(f"{train_path}: target '{column}' holds the single value {plain(train[column].iloc[0])!r}"
                             " (or none): nothing to learn")
    names = [str(c) for c in sample_values(sample, test, id_column)] if sample is not None else []
    classes = per_class_classes(train, names, targets, sample_path)
    task = infer_task(train[targets], classes is not None)
    if task == Task.BINARY:
        classes = binary_classes(train[targets[0]])
    value_columns = submission_types(task, train, targets, sample, classes)
    metric, why = choose_metric(task, train, targets, submission_kind(task, value_columns), classes)
    check_metric_fits(get_metric(metric), task, value_columns)
    features = [c for c in train.columns if c in test.columns and c not in targets]
    if not [c for c in features if c != id_column]:
        raise KbertError(f"{train_path.name} and {test_path.name} share no column besides the id '{id_column}': "
                         "nothing to predict from")
    dated = date_order(train, test, features)
    data = {
        "name": name,
        "task": task.value,
        "metric": metric,
        "id_column": id_column,
        "target": targets[0] if len(targets) == 1 else targets,
        **({"classes": classes} if classes is not None else {}),
        "data_dir": data_dir_for(train_path.parent, out),
        "files": {"train": train_path.name, "test": test_path.name,
                  **({"sample_submission": Path(sample_path).name} if sample_path else {})},
        "columns": {c: column_dtype(pd.concat([train[c], test[c]])) for c in features},
        "submission": {"columns": submission_order({id_column: column_dtype((test if sample is None else sample)
                                                                            [id_column]), **value_columns}, sample)},
        "text": {"serializer": "list", "columns": [c for c in features if c != id_column], "numeric": "raw",
                 "missing": "unknown"},
        # A time series validates each block on the rows before it, in the file's order (never on shuffled rows)
        "folds": {"k": 5, "seed": 42, **({"shuffle": False} if task == Task.TIMESERIES or dated else {})},
    }
    header = (f"# Written by `kbert init {name}`: inferred task '{task}', id '{id_column}', target {targets}.\n"
              "# Check the task and the metric, and trim text.columns; then `kbert run` it.\n")
    text = yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
    text = text.replace("\nmetric: ", f"\n# {why}\nmetric: ", 1)
    if classes is not None and task == Task.BINARY:
        text = text.replace("\nclasses:", f"\n# [negative, positive]: {classes[1]!r} is the rarer value; swap them to "
                                           "predict the other\nclasses:", 1)
    competition = parse_competition(yaml.safe_load(text), out)
    check_competition_frames(competition, train, test, sample,  # as `kbert run` would
                             (train_path, test_path, Path(sample_path) if sample_path else None))
    check_writable_submission(competition, train, test, sample)
    write_text(out, header + text)
    sample_file = Path(sample_path) if sample_path else None
    for line in [*sample_label_notes(competition, train, sample, sample_file),
                 *unseen_class_notes(competition, train, sample_file),
                 *integer_regression_notes(competition, train, sample, sample_file)]:
        log(line)
    if dated:
        log(f"folds in the files' order (folds.shuffle: false): the training rows follow '{dated}', and the test "
            "rows come after them; each fold validates on later rows than it trains on")
    elif task == Task.TIMESERIES:
        log("several numeric targets: task timeseries, folds in the files' order (folds.shuffle: false), whose first "
            "block is never validated; if the rows are in no time order, set folds.shuffle: true")
    duplicates = duplicate_report(train, data["text"]["columns"], targets)
    if duplicates:
        log(duplicates)
    return out
