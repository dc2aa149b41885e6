"""The six tasks, as one table: what each predicts, its default metric and losses, and its prediction columns.

A competition's ``task:`` is one of these names. Code asks a task what it is (``Task(name).numeric``) instead of
comparing names, so that adding a task means adding one row here. ``Task`` is a ``str`` enum: a member equals
its name, and configs and JSON keep the plain string.

Prediction kinds (the columns of oof.csv and test.csv, see pipeline/predictions.py):
``label`` a class label or 0/1 flag, ``score`` a probability, ``value`` a number on the target's scale.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import StrEnum


@dataclass(frozen=True)
class TaskSpec:
    default_metric: str  # used when a competition YAML names no metric
    losses: tuple[str, ...]  # the head's losses; the first is ``loss: default``
    prediction_kinds: tuple[str, ...]  # what a submission column of this task may hold
    min_outputs: int = 1  # classes (multiclass, ordinal), labels (multilabel), horizons (timeseries)
    probabilities: bool = False  # one probability per output, cut at a threshold into 0/1 labels
    classes: bool = False  # one of K classes, with class probabilities
    numeric: bool = False  # real-valued targets on their own scale; target transforms apply
    several_columns: bool = False  # the target may be a list of columns (one per label or horizon)
    calibratable: bool = False  # temperature scaling of the logits applies


class Task(StrEnum):
    """A task name with its ``TaskSpec`` fields as attributes: ``Task("binary").default_metric == "roc_auc"``."""

    default_metric: str
    losses: tuple[str, ...]
    prediction_kinds: tuple[str, ...]
    min_outputs: int
    probabilities: bool
    classes: bool
    numeric: bool
    several_columns: bool
    calibratable: bool

    def __new__(cls, name: str, spec: TaskSpec) -> "Task":
        member = str.__new__(cls, name)
        member._value_ = name
        for field_name, value in asdict(spec).items():
            setattr(member, field_name, value)
        return member

    BINARY = "binary", TaskSpec("roc_auc", ("bce", "focal", "softmax"), ("label", "score"), probabilities=True,
                                calibratable=True)
    MULTICLASS = "multiclass", TaskSpec("accuracy", ("cross_entropy", "focal"), ("label", "score"), min_outputs=2,
                                        classes=True, calibratable=True)
    MULTILABEL = "multilabel", TaskSpec("roc_auc", ("bce", "focal"), ("label", "score"), probabilities=True,
                                        several_columns=True)
    REGRESSION = "regression", TaskSpec("rmse", ("mse", "mae", "huber", "gaussian_nll"), ("value",), numeric=True)
    ORDINAL = "ordinal", TaskSpec("qwk", ("coral",), ("label", "score", "value"), min_outputs=3, classes=True)
    TIMESERIES = "timeseries", TaskSpec("rmse", ("mse", "mae", "huber"), ("value",), numeric=True,
                                        several_columns=True)


TASKS: tuple[str, ...] = tuple(task.value for task in Task)  # the names, in the order the docs list them


def submission_kind(task: str, value_columns: dict[str, str]) -> str:
    """What a submission's value columns hold, read off their types: ``label`` (int, bool or str: classes),
    ``score`` (float probabilities: one per binary or multilabel output, or one per class) or ``value`` (numbers
    on the target's scale: regression, time series, an ordinal task's expected level in one float column)."""
    if Task(task).numeric:
        return "value"
    if any(dtype != "float" for dtype in value_columns.values()):
        return "label"
    return "value" if task == Task.ORDINAL and len(value_columns) == 1 else "score"
