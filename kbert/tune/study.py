"""The study and its folder: open or create it (direction, TPE sampler, pruner; trial 0 the competition's default
configuration), each trial's run folder, and the housekeeping between trials (fold weights of the best trials
only, no folders of unfinished ones).

One study lives in ``runs/<competition>/<study>/``: ``journal.log`` (kbert/tune/storage.py), ``trial-<NNNN>/``
per completed trial in the run artifact layout (config.yaml, oof.csv, test.csv, metrics.json, folds/<k>/), so
that any trial can be blended, and ``report/`` (kbert/tune/summary.py).
"""

from __future__ import annotations

import json
import shutil
import sys
import uuid
from dataclasses import asdict, dataclass, replace
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from kbert.errors import KbertError
from kbert.io import removed_on_refusal
from kbert.names import check_run_name
from kbert.pipeline.config import (SETTINGS, CompetitionConfig, RunConfig, competition_path, load_competition,
                                   resolve_run_config)
from kbert.pipeline.fold_processes import usable_cores
from kbert.tune.database import missing_sqlite_file
from kbert.tune.trial_store import open_artifact_store
from kbert.tune.options import DEFAULT_PRUNE_P, DEFAULT_PRUNER, PRUNERS, TuneOptions
from kbert.tune.space import (Param, default_params, is_active, parse_space, sampled_under, space_entries, taken,
                              to_overrides)
from kbert.tune.storage import journal_path, open_storage, storage_label

FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)


def study_dir(options: TuneOptions, competition: CompetitionConfig) -> Path:
    return Path(options.out_dir) / competition.name / options.study


def trial_dir(directory: Path, number: int) -> Path:
    return directory / f"trial-{number:04d}"


def resolve_trial_config(competition: CompetitionConfig, options: TuneOptions, overrides: dict[str, Any]) -> RunConfig:
    """The run config of one trial: the study's fixed overrides, then the trial's (adapter options merged)."""
    merged = {**options.overrides, **overrides, "out_dir": options.out_dir}
    # A trial trains no more folds at once than its worker has cores (one each, with kbert tune's default worker
    # per core), so that the pruner can stop it after its first ones: folds all started at once are all paid for.
    cores = usable_cores()
    merged.setdefault("fold_processes", cores)
    if cores == 1:  # one stream, said in its config.yaml, so best.yaml trains as this trial did on more cores
        merged.setdefault("cpu_streams", 1)
    if options.overrides.get("adapter_options") or overrides.get("adapter_options"):
        merged["adapter_options"] = {**(options.overrides.get("adapter_options") or {}),
                                     **(overrides.get("adapter_options") or {})}
    return resolve_run_config(competition, merged)


def check_values_in_trials(competition: CompetitionConfig, options: TuneOptions, params: list[Param]) -> None:
    """The study's fixed settings resolve, and each value an entry takes (a range: its ends) is one a trial runs
    with: the run's own checks pass (a setting that acts only with another's value, such as huber_delta without
    --loss huber, failed every trial through a night) and, for a ``text.<field>`` entry, the serializer reads this
    competition's rows (a template naming no column, a mapping of another). A value is tried in one trial's
    choices: the entries that decide whether it is sampled at their first value that samples it, every other entry
    sampled with it at its first. The line names the entry whose value is refused (``blamed``)."""
    base = resolve_trial_config(competition, options, {})
    rows = None
    if any(p.target.startswith("text.") and taken(p) for p in params):
        from kbert.pipeline.run import prepare_inputs

        rows = prepare_inputs(base).features
    by_name, conditions = {p.name: p for p in params}, {}
    for param in params:  # (in sampling order: an entry after those its `when` names)
        conditions[param.name] = sampled_under(param, by_name, conditions)

    def refusal(chosen: dict[str, Any]) -> KbertError | None:
        return trial_refusal(competition, options, to_overrides(params, chosen), rows)

    for param in params:
        for value in tried(param):
            chosen: dict[str, Any] = {}
            for other in params:
                values = [value] if other is param else conditions[param.name].get(other.name) or tried(other)
                if values and is_active(other, chosen):
                    chosen[other.name] = values[0]
            if chosen.get(param.name) != value:  # (its conditions are not all met by their first values)
                continue
            refused = refusal(chosen)
            if refused is not None:
                culprit = blamed(param, [p for p in params if p.name not in conditions[param.name]], chosen, refusal)
                raise KbertError(f"{culprit.where} value {chosen[culprit.name]!r}: {refused}")


def tried(param: Param) -> list:
    """The values of an entry a new study tries: its choices or value, a range's two ends."""
    d = param.distribution
    if isinstance(d, (optuna.distributions.IntDistribution, optuna.distributions.FloatDistribution)):
        return [d.low, d.high]
    return taken(param) or []


def trial_refusal(competition: CompetitionConfig, options: TuneOptions, overrides: dict[str, Any],
                  rows: Any) -> KbertError | None:
    """What a trial with these ``overrides`` is refused for: the run's checks, then (``rows`` given: a space with
    text entries) its serializer on the competition's rows; None when it runs."""
    from kbert.pipeline.fold import make_serializer

    try:
        config = resolve_trial_config(competition, options, overrides)
        if rows is not None:
            make_serializer(config).fit(rows).transform(rows.iloc[:2])
    except KbertError as exc:
        return exc
    return None


def blamed(param: Param, others: list[Param], chosen: dict[str, Any],
           refusal: Callable[[dict[str, Any]], KbertError | None]) -> Param:
    """The text entry a refused combination is refused for: another one of ``others`` (not those ``param`` is
    sampled under) without whose value it is not refused, else ``param`` itself."""
    for other in others:
        if other is not param and other.name in chosen and \
                refusal({k: v for k, v in chosen.items() if k != other.name}) is None:
            return other
    return param


def make_sampler(seed: int | None) -> optuna.samplers.BaseSampler:
    # constant_liar: parallel workers do not all propose the neighbourhood of the same running trial.
    return optuna.samplers.TPESampler(multivariate=True, group=True, constant_liar=True, n_startup_trials=10,
                                      seed=seed)


def make_pruner(kind: str, p_threshold: float) -> optuna.pruners.BasePruner:
    if kind == "wilcoxon":
        return optuna.pruners.WilcoxonPruner(p_threshold=p_threshold, n_startup_steps=2)
    if kind == "median":  # a fold's score against the median of the other trials' scores on that fold
        return optuna.pruners.MedianPruner(n_startup_trials=4, n_warmup_steps=1)
    if kind == "none":
        return optuna.pruners.NopPruner()
    raise KbertError(f"unknown pruner '{kind}'; choose one of {', '.join(PRUNERS)}")


def load_study(options: TuneOptions, create: bool, check: bool = True
               ) -> tuple[optuna.Study, CompetitionConfig, list[Param], Path]:
    """Open (or create) the study; on creation, store its settings and queue the competition's default
    configuration first. A worker joining an existing study takes the study's settings that it leaves unset
    (the search space without --space, the pruner, --folds and the other fixed options: ``options`` is filled
    in place) and is refused when one it sets, or its competition, differs (``check``; off for the report,
    which only reads). Returns the study, the competition, the parsed space and the study folder."""
    check_run_name(options.study, "--study")
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # not Optuna's line for every study it opens
    competition = load_competition(options.competition)
    entries = space_entries(competition, Path(options.space) if options.space else None)
    params = parse_space(entries, options.space or f"{competition.name} search space", task=competition.task,
                         origins=space_origins(options, competition))  # before any file is made
    first = None
    if create:  # the space and the fixed settings (--folds, --limit-rows) are checked before any file is made
        first = first_trial(competition, options, params)
    directory = study_dir(options, competition)
    if (directory / "config.yaml").is_file():  # (pipeline.artifacts.CONFIG_FILE: that module loads MLX)
        raise KbertError(f"--study {options.study}: {directory} is a run's folder (it holds config.yaml); choose "
                         "another study name")
    if not create and not options.rdb and not journal_path(options, directory).is_file():  # nothing made for a typo
        raise KbertError(f"no study '{options.study}' for {competition.name}: no {journal_path(options, directory)}")
    missing = missing_sqlite_file(options.storage) if not create and options.rdb else None
    if missing:  # opening it would make the file
        raise KbertError(f"no study '{options.study}' for {competition.name}: no database file {missing}")
    with removed_on_refusal() as created:  # a refusal in it takes back the journal and folders opening it made
        study, params = open_study(options, competition, entries, params, create=create, check=check, first=first)
        created.forget()  # opened: whatever is refused later (in a trial, at the deadline), the study stays
    return study, competition, params, directory


def open_study(options: TuneOptions, competition: CompetitionConfig, entries: dict[str, Any], params: list[Param],
               *, create: bool, check: bool, first: FirstTrial | None = None) -> tuple[optuna.Study, list[Param]]:
    """``load_study`` from the storage on: the study created or loaded (an existing one is only read: loading
    it appends nothing to its journal), its settings adopted or refused, and the parsed space it uses. ``first``:
    what a new study starts with (``first_trial``, given with ``create``), made before the storage was."""
    directory = study_dir(options, competition)
    storage = open_storage(options, directory)
    if create and options.artifacts:  # a bad --artifacts is refused before the study is written, not by a worker
        open_artifact_store(options.artifacts)
    names = optuna.study.get_all_study_names(storage)
    if not create and options.study not in names:
        raise KbertError(f"no study '{options.study}' for {competition.name} in {storage_label(options, directory)}")
    new = create and options.study not in names
    if new:  # load_if_exists: another machine may create it at the same moment
        study = optuna.create_study(study_name=options.study, storage=storage, load_if_exists=True,
                                    direction="maximize" if greater_is_better(competition) else "minimize",
                                    sampler=make_sampler(options.sampler_seed))
    else:
        study = optuna.load_study(study_name=options.study, storage=storage, sampler=make_sampler(options.sampler_seed))
    made_for = study.user_attrs.get("competition")
    if made_for not in (None, competition.name):  # read-only uses too: a report or a blend of it would be another's
        raise KbertError(f"study '{options.study}' in {storage_label(options, directory)} was made for competition "
                         f"'{made_for}', not '{competition.name}'")
    claim_folder(study, directory, options, create)
    stored = None if new else study.user_attrs.get("settings")
    if stored is not None:
        adopt_settings(options, stored)
    options.pruner = options.pruner or DEFAULT_PRUNER
    options.prune_p = DEFAULT_PRUNE_P if options.prune_p is None else options.prune_p
    study.pruner = make_pruner(options.pruner, options.prune_p)
    if stored is not None:
        if check:
            refuse_differences(stored, study_settings(competition, options, entries), options)
        if not options.space:  # the study's space, whatever this machine's default would be (GPU or CPU)
            entries = stored["space"]
            params = parse_space(entries, f"study '{options.study}' search space", task=competition.task)
    if new:
        options.overrides = {**first.encoder, **options.overrides}  # (stored with the study's settings below)
        start_study(study, competition, options, first)
    if stored is None and (new or check):
        study.set_user_attr("settings", study_settings(competition, options, entries))
    return study, params


STUDY_FILE = "study.json"  # in the study folder: which study's trials it holds


def claim_folder(study: optuna.Study, directory: Path, options: TuneOptions, create: bool) -> None:
    """The study folder holds one study's trials: a study (its ``uid``, set when a worker first opens it) of the
    same name in another storage would overwrite them, and its report or blend would read them as its own."""
    from kbert.io import read_json, write_json

    uid = study.user_attrs.get("uid")
    if uid is None and create:  # a new study, or one from before studies were told apart
        study.set_user_attr("uid", uuid.uuid4().hex)
        uid = study.user_attrs["uid"]  # as stored: two workers creating the study at once agree on the last one
    marker = directory / STUDY_FILE
    owner = read_json(marker, required=("uid",))["uid"] if marker.is_file() else None
    if uid is None or owner == uid:
        return
    if owner is not None and any(directory.glob("trial-*")):
        raise KbertError(f"--study {options.study}: {directory} holds the trials of another study of that name (in "
                         f"another storage than {storage_label(options, directory)}); give this one another --study "
                         "name, or another --out")
    if create:  # (a folder with no trial yet is this study's, whoever marked it first)
        write_json(marker, {"study": options.study, "uid": uid})


MACHINE_SETTINGS = ("data_dir", "out_dir")  # where this machine keeps its files: never part of a study


def study_settings(competition: CompetitionConfig, options: TuneOptions, entries: dict[str, Any]) -> dict[str, Any]:
    """What every worker of one study must agree on, as JSON: the competition (its whole config but where its
    data lives), the search space, the pruner and the fixed run options."""
    from kbert.pipeline.artifacts import input_fingerprint
    from kbert.pipeline.data import resolve_data_dir

    settings = {"competition": {k: v for k, v in asdict(competition).items() if k not in MACHINE_SETTINGS},
                "space": entries, "pruner": options.pruner, "prune_p": options.prune_p,
                "artifacts": artifact_kind(options.artifacts),
                "options": {k: v for k, v in options.overrides.items() if k not in MACHINE_SETTINGS},
                "inputs": input_fingerprint(competition, resolve_data_dir(competition,
                                                                          options.overrides.get("data_dir")))}
    return json.loads(json.dumps(settings, sort_keys=True, default=str))


def artifact_kind(spec: str) -> str:
    """Where a study's trials go, as every machine may name it: its bucket, a shared folder (mounted where each
    machine likes), or each machine's own runs folder."""
    return spec if spec.startswith("s3://") else "a shared folder" if spec else "each machine's runs folder"


def adopt_settings(options: TuneOptions, stored: dict[str, Any]) -> None:
    """Fill what this worker left unset from the study's settings."""
    options.pruner = options.pruner or stored["pruner"]
    options.prune_p = stored["prune_p"] if options.prune_p is None else options.prune_p
    options.overrides = {**stored["options"], **options.overrides}


def refuse_differences(stored: dict[str, Any], mine: dict[str, Any], options: TuneOptions) -> None:
    """One line naming every setting where this worker differs from the study (the space only when this worker
    names its own)."""
    from kbert.pipeline.artifacts import config_differences  # loads MLX: in a worker, after runtime.setup()

    if "inputs" in stored:  # (a study made before kbert recorded its data files has none to compare)
        made, now = stored["inputs"], mine["inputs"]
        changed = sorted(name for name in {**made, **now} if made.get(name) != now.get(name))
        if changed:
            raise KbertError(f"study '{options.study}' was made from other data ({', '.join(changed)} differ from "
                             "the files read now): its trials would not compare; use those files, or another --study")
    if stored.get("artifacts", mine["artifacts"]) != mine["artifacts"]:  # (a study from before: not recorded)
        raise KbertError(f"study '{options.study}' keeps its trials in {stored['artifacts']}, this worker in "
                         f"{mine['artifacts']} (--artifacts): give the --artifacts the study's other workers give, or "
                         "another --study")
    stored, mine = {**stored, "inputs": None, "artifacts": None}, {**mine, "inputs": None, "artifacts": None}
    if not options.space:
        stored, mine = {**stored, "space": None}, {**mine, "space": None}
    differ = config_differences(stored, mine)
    if differ:
        more = f" (and {len(differ) - 4} more)" if len(differ) > 4 else ""
        raise KbertError(f"study '{options.study}' was created with other settings (study -> this worker): "
                         f"{'; '.join(differ[:4])}{more}; use the study's competition file and options, or "
                         f"another --study")


@dataclass
class FirstTrial:
    """What a new study starts with, checked before any of its files is made: trial 0's entry values (the
    competition's default run: ``default_params``), the entries whose default lies outside the space, and the
    encoder that `kbert run` chooses for the data where nothing names one ({} or {"encoder": name}), with its line."""

    params: dict[str, Any]
    outside: list[str]
    encoder: dict[str, str]
    reason: str = ""


def first_trial(competition: CompetitionConfig, options: TuneOptions, params: list[Param]) -> FirstTrial:
    """A new study's ``FirstTrial``: the space's values checked in trials (``check_values_in_trials``) and trial 0
    resolved, as its trials will resolve (the data's encoder an override of every trial: `kbert run` chooses it)."""
    fixed_encoder = any(p.target == "encoder" and p.distribution is None for p in params)
    encoder, reason = ({}, "") if fixed_encoder else data_encoder(competition, options)  # (the CPU space's bert)
    planned = replace(options, overrides={**encoder, **options.overrides})
    check_values_in_trials(competition, planned, params)
    fixed, outside = default_params(params, resolve_trial_config(competition, planned, {}))
    resolve_trial_config(competition, planned, to_overrides(params, fixed))  # fail now, not in a worker
    return FirstTrial(fixed, outside, encoder, reason)


def data_encoder(competition: CompetitionConfig, options: TuneOptions) -> tuple[dict[str, str], str]:
    """The encoder `kbert run` chooses where neither the competition nor the options name one (as kbert/cli/run.py
    ``chosen_encoder``: pipeline/data.py ``default_encoder`` on the training rows), and the line that says why."""
    if "encoder" in competition.training or options.overrides.get("encoder") is not None:
        return {}, ""
    from kbert.models.encoders import shipped_available
    from kbert.pipeline.data import default_encoder, load_competition_data

    train = load_competition_data(competition, options.overrides.get("data_dir")).train
    encoder, reason = default_encoder(train, competition, shipped_available("minilm-l6"))
    return ({"encoder": encoder} if encoder != SETTINGS["encoder"].default else {}), reason


def start_study(study: optuna.Study, competition: CompetitionConfig, options: TuneOptions, first: FirstTrial) -> None:
    """A new study: its competition and metric, and trial 0 queued as the default configuration."""
    study.set_user_attr("competition", competition.name)
    study.set_user_attr("metric", competition.metric)
    if first.reason:
        print(first.reason, file=sys.stderr)
    if options.enqueue_default:
        study.enqueue_trial(first.params, user_attrs={"default": True})
        if first.outside:
            print(f"note: the default configuration's {', '.join(first.outside)} lie(s) outside the search space; "
                  f"trial 0 samples them")


def space_origins(options: TuneOptions, competition: CompetitionConfig) -> dict[str, str]:
    """What gave each entry that ``--space FILE`` did not: the competition's ``search_space:``, laid over FILE
    (without --space, the default space and the competition's are one: the competition's search space)."""
    if not options.space:
        return {}
    return {name: f"{competition_path(options.competition)}: search_space" for name in competition.search_space}


def greater_is_better(competition: CompetitionConfig) -> bool:
    from kbert.pipeline.metrics import get_metric

    return get_metric(competition.metric).greater_is_better


def ranked_trials(study: optuna.Study) -> list[FrozenTrial]:
    """Completed trials, best first (ties: the earlier trial)."""
    completed = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    maximize = study.direction == optuna.study.StudyDirection.MAXIMIZE
    return sorted(completed, key=lambda t: (-t.value if maximize else t.value, t.number))


def keep_top_checkpoints(study: optuna.Study, directory: Path, keep: int) -> int:
    """Delete the fold weights of every completed trial outside the best ``keep``; returns bytes freed."""
    freed = 0
    for trial in ranked_trials(study)[keep:]:
        for weights in (trial_dir(directory, trial.number) / "folds").glob("*/*.safetensors"):
            try:
                freed += weights.stat().st_size
                weights.unlink()
            except FileNotFoundError:  # another worker got there first
                pass
    return freed


def remove_unfinished_folders(study: optuna.Study, directory: Path) -> None:
    """Folders of failed or pruned trials (a killed worker leaves a half-written one)."""
    for trial in study.get_trials(deepcopy=False, states=(TrialState.FAIL, TrialState.PRUNED)):
        shutil.rmtree(trial_dir(directory, trial.number), ignore_errors=True)
