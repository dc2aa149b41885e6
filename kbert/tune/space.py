"""The tuning search space: parsed from YAML (kbert/tune/search_space.yaml, a competition's ``search_space:``,
or ``kbert tune --space FILE``), sampled entry by entry through an Optuna trial, and turned into the
settings that ``resolve_run_config`` takes. See search_space.yaml (beside this file) for the format."""

from __future__ import annotations

import functools
import math
import typing
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import optuna

from kbert.errors import KbertError
from kbert.io import existing_file, write_yaml
from kbert.names import did_you_mean
from kbert.pipeline.config import (RESOLVED_SECTIONS, RUN_FIELDS, SETTINGS, Bound, CompetitionConfig, RunConfig,
                                   check_known, check_number, check_settings, fits, read_yaml, type_words)
from kbert.tasks import Task

DEFAULT_SPACE = Path(__file__).resolve().parent / "search_space.yaml"
SET_PREFIXES = ("adapter_options.", "text.")
ENTRY_KEYS = {"choices", "low", "high", "log", "step", "when", "set", "value"}
KINDS = {"value": ("value",), "choices": ("choices",), "range": ("low", "high", "step", "log")}  # an entry is one


@dataclass
class Param:
    name: str  # the Optuna parameter name
    target: str  # the run setting it sets: a flat name, adapter_options.<field> or text.<field>
    distribution: optuna.distributions.BaseDistribution | None  # None: a fixed value
    value: Any = None  # the fixed value
    when: dict[str, list] | None = None  # entry name -> the values under which this entry is sampled
    source: str = "search space"  # what gave the entry (a file, a competition's search_space), for messages

    @property
    def where(self) -> str:
        return f"{self.source}: '{self.name}'"


SECTIONS = ("params", "cpu", "numeric_columns", "tasks")  # a search space file's top-level keys


def read_space_file(path: Path) -> dict:
    """A search space file: a mapping of ``SECTIONS``, each a mapping of entries (``tasks``: of task names to
    mappings of entries); anything else is one line naming the file and the key."""
    data = read_yaml(existing_file(path, "search space file"))
    if not isinstance(data, dict) or not isinstance(data.get("params", {}), dict):
        raise KbertError(f"{path}: a search space is a mapping with 'params' (and optionally 'tasks')")
    for key, section in data.items():
        if key not in SECTIONS:
            raise KbertError(f"{path}: unknown key '{key}'{did_you_mean(key, SECTIONS)}; a search space has "
                             f"{', '.join(SECTIONS)}")
        if section is not None and not isinstance(section, dict):
            raise KbertError(f"{path}: '{key}' must be a mapping, not {type(section).__name__}")
    for task, section in (data.get("tasks") or {}).items():
        if task not in list(Task):
            raise KbertError(f"{path}: tasks: unknown task '{task}'{did_you_mean(task, list(Task))}")
        if section is not None and not isinstance(section, dict):
            raise KbertError(f"{path}: tasks.{task} must be a mapping, not {type(section).__name__}")
    return data


def has_gpu() -> bool:
    import mlx.core as mx

    return mx.default_device().type == mx.gpu


def write_space_file(path: Path, space: dict) -> Path:
    """Write a search space YAML in the mapping's own order (a sorted dump would still load: see parse_space)."""
    return write_yaml(Path(path), space)


def space_entries(competition: CompetitionConfig, space_file: Path | None = None,
                  gpu: bool | None = None) -> dict[str, Any]:
    """The raw entries for a competition: the file's ``params``, its ``cpu`` replacements when MLX has no GPU,
    its ``numeric_columns`` extras when the competition declares numeric input columns, its task's extras, then
    the competition's ``search_space`` over them (null removes an entry)."""
    data = read_space_file(space_file or DEFAULT_SPACE)
    tasks = data.get("tasks") or {}
    gpu = has_gpu() if gpu is None else gpu
    inputs = {c: dtype for c, dtype in competition.columns.items()
              if c != competition.id_column and c not in competition.target_columns}
    numeric = any(dtype in ("int", "float") for dtype in inputs.values())
    entries = {**(data.get("params") or {}), **({} if gpu else data.get("cpu") or {}),
               **(data.get("numeric_columns") or {} if numeric else {}), **(tasks.get(competition.task) or {})}
    for name, entry in competition.search_space.items():
        if entry is None:
            entries.pop(name, None)
        else:
            entries[name] = entry
    return entries


def parse_space(entries: dict[str, Any], source: str = "search space", *, task: str | None = None,
                origins: dict[str, str] | None = None) -> list[Param]:
    """Validate the entries and build their distributions, in YAML order except that an entry always comes
    after the entries its ``when`` names (so that those are sampled first).

    Args:
        source: names the entries in messages (a file), but those ``origins`` names otherwise.
        task: the competition's task, when known: the losses its entries may take.
    """
    params: dict[str, Param] = {}
    for name, entry in entries.items():
        params[name] = parse_entry(name, entry, (origins or {}).get(name, source), entries, task)
    ordered: list[Param] = []
    placing: list[str] = []

    def place(name: str) -> None:  # depth-first: the entries a `when` names go first
        if any(p.name == name for p in ordered):
            return
        if name in placing:
            raise KbertError(f"{source}: the 'when' conditions of {placing} form a cycle")
        placing.append(name)
        for parent in (params[name].when or {}):
            place(parent)
        placing.remove(name)
        ordered.append(params[name])

    for name in params:
        place(name)
    conditions: dict[str, dict[str, list]] = {}  # entry -> the values of each entry above it under which it is sampled
    for param in ordered:  # (an entry comes after those its `when` names)
        check_when_values(param, params, task)
        conditions[param.name] = sampled_under(param, params, conditions)
    twice = next(((a, b) for i, a in enumerate(ordered) for b in ordered[:i]
                  if a.target == b.target and not exclusive(conditions[a.name], conditions[b.name])), None)
    if twice:  # both may be sampled in one trial: the study would record a value the run never used
        raise KbertError(f"{twice[0].source}: '{twice[1].name}' and '{twice[0].name}' both set {twice[0].target} "
                         "(give one a 'when' that the other's excludes)")
    return ordered


def parse_entry(name: str, entry: Any, source: str, entries: dict[str, Any], task: str | None) -> Param:
    """One entry, whole: its keys name one kind (a value, choices or a range), each value it can give is one its
    setting takes, and its ``when`` names other ``entries``."""
    where = f"{source}: '{name}'"
    if not isinstance(entry, dict):
        entry = {"choices": entry} if isinstance(entry, list) else {"value": entry}
    unknown = set(entry) - ENTRY_KEYS
    if unknown:
        raise KbertError(f"{where}: unknown keys {sorted(unknown)}; known: {', '.join(sorted(ENTRY_KEYS))}")
    check_entry_shape(entry, where)
    when = parse_when(entry.get("when"), name, entries, where)
    target = str(entry.get("set", name))
    check_tunable(target, where)
    sets = where + (f" (sets {target})" if target != name else "")
    check_entry_values(entry, target, sets, task)
    return Param(name, target, make_distribution(entry, target, sets), entry.get("value"), when, source)


def check_entry_shape(entry: dict, where: str) -> None:
    """An entry is a fixed ``value``, ``choices`` (a non-empty list) or a range (``low`` and ``high``, with ``step``
    or ``log``: true or false), one of them: keys of two kinds, or a range's keys beside choices, conflict."""
    given = {kind: [key for key in keys if key in entry] for kind, keys in KINDS.items()}
    kinds = [kind for kind, keys in given.items() if keys]
    if len(kinds) > 1:
        keys = [key for kind in kinds for key in given[kind]]
        raise KbertError(f"{where}: keys {', '.join(map(repr, keys))} conflict: an entry is a 'value', 'choices', or "
                         "'low' and 'high' (with 'step' or 'log'), one of them")
    if not kinds or kinds == ["range"] and not ("low" in entry and "high" in entry):
        raise KbertError(f"{where}: give 'choices', 'low' and 'high', or 'value'")
    if "choices" in entry and (not isinstance(entry["choices"], list) or not entry["choices"]):
        raise KbertError(f"{where}: 'choices' must be a non-empty list, got {entry['choices']!r}")
    if not isinstance(entry.get("log", False), bool):  # bool("false") is true: a log scale
        raise KbertError(f"{where}: 'log' must be true or false, got {entry['log']!r}")


def parse_when(when: Any, name: str, entries: dict[str, Any], where: str) -> dict[str, list] | None:
    """An entry's ``when``: other entries of the space, each with a value or a list of values."""
    if when is None:
        return None
    if not isinstance(when, dict) or not when:
        raise KbertError(f"{where}: 'when' must map other entries to values")
    missing = [key for key in when if key not in entries or key == name]
    if missing:
        raise KbertError(f"{where}: 'when' names {missing}, which are not other entries of the space")
    empty = [key for key, value in when.items() if value == []]
    if empty:  # (no value ever matches: the entry would never be sampled)
        raise KbertError(f"{where}: its 'when' lists no value for {empty[0]!r}")
    return {key: value if isinstance(value, list) else [value] for key, value in when.items()}


def taken(param: Param) -> list | None:
    """The values an entry takes: its choices or its value; None for a range."""
    if param.distribution is None:
        return [param.value]
    if isinstance(param.distribution, optuna.distributions.CategoricalDistribution):
        return list(param.distribution.choices)
    return None


def check_when_values(param: Param, params: dict[str, Param], task: str | None = None) -> None:
    """Each value a ``when`` names is a value of its entry's setting (not a typo, or "32" for 32), and one at least
    is taken by the entry (a choice, a whole number of a range of integers; for the encoder, a kind: pretrained,
    scratch); else the entry is never sampled, silently. A range of real numbers never samples a given value. A
    narrowed entry may leave some values of another's ``when`` untaken (``serializer: [list]`` under an entry for
    ``[list, sentence]``)."""
    for key, values in (param.when or {}).items():
        named = params[key]
        if isinstance(named.distribution, optuna.distributions.FloatDistribution):
            raise KbertError(f"{param.where}: its 'when' names {key} {values!r}, but '{key}' is a range of real "
                             f"numbers, which never samples a given value exactly: give '{key}' 'choices'")
        unknown = [v for v in values if not takes(named, v) and not (key == "encoder" and v in ENCODER_KINDS)]
        invalid = [v for v in unknown if not is_setting_value(named.target, v, task)]
        if invalid or (unknown and len(unknown) == len(values)):
            raise KbertError(f"{param.where}: its 'when' names {key} {(invalid or unknown)!r}, which "
                             f"'{key}' never takes ({described(named)}): it would never be sampled"
                             + ("" if invalid else f"; drop it from the space with '{param.name}: null'"))


def takes(param: Param, value: Any) -> bool:
    """Whether the entry can give ``value``: its fixed value, one of its choices, a point of its range."""
    return value == param.value if param.distribution is None else contains(param.distribution, value)


def described(param: Param) -> str:
    """What an entry takes, for a message: its values, or its range."""
    d = param.distribution
    if d is None or isinstance(d, optuna.distributions.CategoricalDistribution):
        return repr(taken(param))
    return f"{d.low!r} to {d.high!r}" + (f" in steps of {d.step!r}" if d.step not in (None, 1) else "")


def is_setting_value(target: str, value: Any, task: str | None = None) -> bool:
    """Whether setting ``target`` takes ``value`` (as a run's settings are checked)."""
    try:
        check_value(target, value, "", task)
    except KbertError:
        return False
    return True


def sampled_under(param: Param, params: dict[str, Param], conditions: dict[str, dict[str, list]]) -> dict[str, list]:
    """For each entry that decides whether ``param`` is sampled, the values of it under which it is: its own
    ``when`` with each named entry's conditions in turn (an entry under a conditional one is as conditional)."""
    under: dict[str, list] = {}
    for key, values in (param.when or {}).items():
        possible = taken(params[key])
        accepted = values if possible is None else [v for v in possible if matches(key, v, values)]
        for name, allowed in [*conditions[key].items(), (key, accepted)]:
            under[name] = [v for v in under[name] if v in allowed] if name in under else allowed
    return under


def exclusive(a: dict[str, list], b: dict[str, list]) -> bool:
    """Whether no trial samples both entries: one of them never is, or an entry decides both with no value in
    common."""
    return any(not values for values in (*a.values(), *b.values())) or \
        any(not [v for v in a[key] if v in b[key]] for key in a.keys() & b.keys())


def make_distribution(entry: dict, target: str, where: str) -> optuna.distributions.BaseDistribution | None:
    """None for a fixed value; categorical for choices; a range of integers or of real numbers as the setting is
    declared (``weight_decay: {low: 0, high: 1}`` samples real numbers), whatever the bounds' YAML types."""
    if "value" in entry:
        return None
    if "choices" in entry:
        return optuna.distributions.CategoricalDistribution(entry["choices"])
    low, high, log, step = entry["low"], entry["high"], entry.get("log", False), entry.get("step")
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in (low, high)) \
            or low > high:
        raise KbertError(f"{where}: 'low' and 'high' must be finite numbers with low <= high, got {low!r}, {high!r}")
    if log and low <= 0:
        raise KbertError(f"{where}: a log range needs low > 0, got {low!r}")
    integer = not fits(0.5, declared_type(target))
    if step is not None:
        check_number(step, f"{where}: 'step'", Bound(integer=integer, above=0))
        steps = (high - low) / step
        if abs(steps - round(steps)) > 1e-9:  # Optuna would warn and cut the range short
            raise KbertError(f"{where}: 'step' {step!r} does not divide the range {low!r} to {high!r}; choose a "
                             "'high' that low plus a whole number of steps reaches")
    try:
        if integer:
            return optuna.distributions.IntDistribution(low, high, log=log, step=step or 1)
        return optuna.distributions.FloatDistribution(float(low), float(high), log=log,
                                                      step=None if step is None else float(step))
    except ValueError as exc:
        raise KbertError(f"{where}: {exc}") from None


# What every trial of a study shares, so that their scores compare: its folds (--folds), rows (--limit-rows), seed
# and targets, and where its files are; a space may not sample them.
FIXED = (*RUN_FIELDS, "folds", "repeats", *(key for key in SETTINGS if key.startswith("folds.")))


def check_tunable(target: str, where: str) -> None:
    """A space entry sets a run setting that trials may differ in: a known one (``SETTINGS``, ``text.<field>``,
    ``adapter_options.<field>``) and none of ``FIXED``."""
    if target in FIXED:
        raise KbertError(f"{where}: {target} is what every trial of a study shares (its folds, rows, seed and "
                         "files), not a setting to tune; set it with kbert tune's options")
    if declared_type(target) is None:
        tunable = [*(key for key in SETTINGS if key not in FIXED), *(f"adapter_options.{a}" for a in adapter_types())]
        prefix = next((prefix for prefix in SET_PREFIXES if target.startswith(prefix)), "")  # (its fields alike)
        near = did_you_mean(target[len(prefix):], [key[len(prefix):] for key in tunable if key.startswith(prefix)])
        near = near.replace("'", "'" + prefix, 1)
        raise KbertError(f"{where}: '{target}' is not a run setting{near}")


@functools.cache
def declared_type(target: str) -> Any:
    """The type a run setting is declared with (pipeline/config.py's dataclasses; ``adapter_options.<field>``:
    models/adapters.py's AdapterConfig); None for no setting."""
    if target.startswith("adapter_options."):
        return adapter_types().get(target[len("adapter_options."):])
    declaration = SETTINGS.get(target)
    for cls in (*RESOLVED_SECTIONS.values(), RunConfig):
        if any(f is declaration for f in fields(cls)):
            return typing.get_type_hints(cls)[declaration.name]
    return None


@functools.cache
def adapter_types() -> dict[str, Any]:
    """The adapter settings ``adapter_options`` takes, with their types. Loads MLX."""
    from kbert.models.adapters import AdapterConfig

    return typing.get_type_hints(AdapterConfig)


def check_entry_values(entry: dict, target: str, where: str, task: str | None = None) -> None:
    """The values an entry can give its run setting (``low``, ``high``, each choice, the fixed ``value``) are ones
    the run takes (``check_value``): a space never samples a NaN, a zero batch size, a float epoch count or a word
    its setting does not know; it may sample a subset of a setting's choices."""
    given = [(key, entry[key]) for key in ("low", "high", "value") if key in entry]
    given += [(f"choice {i + 1}", choice) for i, choice in enumerate(entry.get("choices") or [])]
    for key, value in given:
        check_value(target, value, f"{where}: {key}", task)


def check_value(target: str, value: Any, what: str, task: str | None = None) -> None:
    """``value`` is one that run setting ``target`` takes, by the checks a run applies to it: its declared type
    and its numbers or words (pipeline/config.py ``check_settings``), then the names that a registry knows (the
    encoder, the adapter, the serializer, the task's losses); ``what`` names it in the message."""
    check_settings({target: value}, lambda _: what)
    declared = declared_type(target)
    if not fits(value, declared):
        raise KbertError(f"{what} must be {type_words(declared)}, got {value!r}")
    if target in NAMED:
        NAMED[target](value, what, task)


def check_serializer_name(name: str, what: str, task: str | None = None) -> None:
    """A name of kbert.features' serializers, or "competition": the competition's own."""
    from kbert.features import SERIALIZERS

    check_known(what, name, [*SERIALIZERS, "competition"])


def check_adapter_name(name: str, what: str, task: str | None = None) -> None:
    """An adapter preset or kind (models/adapters.py PRESETS), or none. Loads MLX."""
    from kbert.models.adapters import PRESETS

    check_known(what, name, ["none", *PRESETS])


def check_loss_name(name: str, what: str, task: str | None = None) -> None:
    """A loss of the task's head (kbert/tasks.py), or default (its first); of any task's where none is known."""
    tasks = [Task(task)] if task else list(Task)
    known = [SETTINGS["loss"].default, *dict.fromkeys(loss for each in tasks for loss in each.losses)]
    if name not in known:
        raise KbertError(f"{what} '{name}' is not a loss of {f'task {task!r}' if task else 'any task'}; choose one of "
                         f"{', '.join(known)}")


def check_encoder_name(name: str, where: str, task: str | None = None) -> None:
    """An encoder a trial can build: a size to train from scratch, a shipped name, a model folder or a Hub id (a
    typo failed every trial that drew it, through the night). Loads MLX: called after ``runtime.setup()``."""
    from kbert.models.encoders import SHIPPED, is_pretrained_name, preset_names, trains_from_scratch

    if not (trains_from_scratch(name) or is_pretrained_name(name)):
        raise KbertError(f"{where} '{name}' is no encoder{did_you_mean(name, ['bert', *SHIPPED, *preset_names()])}: "
                         "give a size to train from scratch (bert, bert-tiny, ...), a shipped name, a model folder or "
                         "a Hugging Face Hub id (org/name)")


# The settings whose words a registry knows (not SETTINGS' choices): their checks, each (value, what, task).
NAMED = {"encoder": check_encoder_name, "adapter": check_adapter_name, "loss": check_loss_name,
         "text.serializer": check_serializer_name}
ENCODER_KINDS = ("pretrained", "scratch")  # `when: {encoder: pretrained}` holds for every pretrained encoder


def matches(key: str, value: Any, values: list) -> bool:
    """Whether the sampled ``value`` of entry ``key`` is one of ``values``; for the encoder, "pretrained" and
    "scratch" stand for every encoder of that kind (a Hub id, a folder, ``minilm-l6``; ``bert``, a size)."""
    if value in values:
        return True
    if key != "encoder" or not isinstance(value, str) or not set(values) & set(ENCODER_KINDS):
        return False
    from kbert.models.encoders import trains_from_scratch

    return ("scratch" if trains_from_scratch(value) else "pretrained") in values


def is_active(param: Param, chosen: dict[str, Any]) -> bool:
    return param.when is None or all(key in chosen and matches(key, chosen[key], values)
                                     for key, values in param.when.items())


def sample(params: list[Param], trial: optuna.Trial) -> dict[str, Any]:
    """The trial's values, by entry name; conditional entries only where their condition holds."""
    chosen: dict[str, Any] = {}
    for param in params:
        if not is_active(param, chosen):
            continue
        if param.distribution is None:
            chosen[param.name] = param.value
        else:
            chosen[param.name] = suggest(trial, param.name, param.distribution)
    return chosen


def suggest(trial: optuna.Trial, name: str, distribution: optuna.distributions.BaseDistribution) -> Any:
    d = distribution
    if isinstance(d, optuna.distributions.CategoricalDistribution):
        return trial.suggest_categorical(name, d.choices)
    if isinstance(d, optuna.distributions.IntDistribution):
        return trial.suggest_int(name, d.low, d.high, step=d.step, log=d.log)
    return trial.suggest_float(name, d.low, d.high, step=d.step, log=d.log)


def to_overrides(params: list[Param], chosen: dict[str, Any]) -> dict[str, Any]:
    """Entry values -> ``resolve_run_config`` overrides (``adapter_options`` and ``text`` as sub-mappings)."""
    overrides: dict[str, Any] = {}
    for param in params:
        if param.name not in chosen:
            continue
        value = chosen[param.name]
        for prefix in SET_PREFIXES:
            if param.target.startswith(prefix):
                overrides.setdefault(prefix[:-1], {})[param.target[len(prefix):]] = value
                break
        else:
            overrides[param.target] = value
    if overrides.get("adapter") == "none":  # a full fine-tune: adapter settings do not apply
        overrides.pop("adapter_options", None)
    return overrides


def setting_of(config: RunConfig, target: str) -> Any:
    """The value of a space target in a resolved run config."""
    if target.startswith("text."):
        field_name = target[len("text."):]
        return "competition" if field_name == "serializer" else getattr(config.competition.text, field_name)
    if target.startswith("adapter_options."):
        return config.model.adapter_options.get(target[len("adapter_options."):], "default")
    for section in (config.model, config.train, config.head):
        if hasattr(section, target):
            return getattr(section, target)
    if hasattr(config, target):
        return getattr(config, target)
    raise KbertError(f"search space: '{target}' is not a run setting{did_you_mean(target, SETTINGS)}")


def default_params(params: list[Param], config: RunConfig) -> tuple[dict[str, Any], list[str]]:
    """The entries that reproduce ``config`` (the competition's default run), for ``enqueue_trial``.
    Returns them and the names whose default value lies outside the entry's range (those are sampled)."""
    chosen: dict[str, Any] = {}
    outside: list[str] = []
    for param in params:
        if not is_active(param, chosen):
            continue
        value = setting_of(config, param.target)
        if param.distribution is None:
            chosen[param.name] = param.value
        elif contains(param.distribution, value):
            chosen[param.name] = value
        else:
            outside.append(param.name)
    return chosen, outside


def contains(distribution: optuna.distributions.BaseDistribution, value: Any) -> bool:
    """Whether ``distribution`` samples ``value``: one of its choices, or a point of its range (on its steps; an
    integer for a range of integers)."""
    if isinstance(distribution, optuna.distributions.CategoricalDistribution):
        return value in distribution.choices
    integer = isinstance(distribution, optuna.distributions.IntDistribution)
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
        return False
    steps = 0 if distribution.step is None else (value - distribution.low) / distribution.step
    return distribution.low <= value <= distribution.high and abs(steps - round(steps)) <= 1e-9
