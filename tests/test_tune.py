"""`kbert tune`: the search space, the study on disk, pruning, failures, heartbeats, kill/Ctrl-C and resume,
the report and best.yaml reproducing the best trial."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import mlx.core as mx
import numpy as np
import optuna
import pytest
import yaml
from mlx.utils import tree_flatten
from optuna.trial import TrialState

from kbert.cli import main
from kbert.errors import KbertError
from kbert.io import read_json
from kbert.models.architecture import ARCHITECTURES
from kbert.models.heads import HeadConfig
from kbert.models.task_model import build_task_model
from kbert.pipeline.config import TrainConfig, load_competition, resolve_run_config, run_config_from_file
from kbert.pipeline.train import layer_depth, make_optimizer
from kbert.tune import (Heartbeats, TrialContext, TuneOptions, fail_stale_trials, keep_top_checkpoints, load_study,
                        make_objective, open_storage, parse_duration, resolve_trial_config, tune, write_report)
from kbert.tune.space import default_params, parse_space, sample, space_entries, to_overrides, write_space_file
from tests.cores import machine_environment

REPO = Path(__file__).resolve().parent.parent
COMPETITIONS = ("titanic", "house-prices-advanced-regression-techniques", "nlp-getting-started", "spaceship-titanic")
TINY_SPACE = {
    "params": {
        "encoder": "bert", "epochs": 2, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64,
        "vocab_size": 300, "max_length": 48,
        "hidden_size": {"choices": [32, 64]},
        "scratch_learning_rate": {"set": "learning_rate", "low": 3e-4, "high": 3e-3, "log": True},
        "pooling": ["cls", "mean"],
    }
}


def write_space(path: Path, space: dict) -> str:
    return str(write_space_file(path, space))


def tiny_options(tmp_path: Path, **changes) -> TuneOptions:
    values = dict(competition="titanic", study="t", trials=3, space=write_space(tmp_path / "space.yaml", TINY_SPACE),
                  overrides={"limit_rows": 90, "folds": 2}, out_dir=str(tmp_path / "runs"), sampler_seed=0,
                  heartbeat=1.0)
    return TuneOptions(**{**values, **changes})


# ---------------------------------------------------------------- durations and the space


def test_parse_duration():
    assert parse_duration("8h") == 8 * 3600
    assert parse_duration("1h30m") == 5400
    assert parse_duration("90m") == 5400
    assert parse_duration("45s") == 45
    assert parse_duration("2d") == 2 * 86400
    assert parse_duration("3600") == 3600
    assert parse_duration(None) is None
    assert parse_duration("2d 3h4m5s") == 2 * 86400 + 3 * 3600 + 4 * 60 + 5
    for bad in ("8 hours", "h", "1x", "-3h", "1m1m", "30m1h", ""):  # a unit twice or out of order: a typo; "": unset $T
        with pytest.raises(KbertError, match="duration"):
            parse_duration(bad)


@pytest.mark.parametrize("name", COMPETITIONS)
def test_default_space_samples_valid_conditional_configs(name):
    """Every sampled trial of the default space resolves to a valid run config, and conditional entries
    appear exactly when their condition holds."""
    competition = load_competition(name)
    params = parse_space(space_entries(competition, gpu=True))
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen_encoders, seen_adapters = set(), set()
    numeric_columns = any(dtype in ("int", "float") for c, dtype in competition.columns.items()
                          if c != competition.id_column and c not in competition.target_columns)
    for _ in range(60):
        trial = study.ask()
        chosen = sample(params, trial)
        config = resolve_trial_config(competition, TuneOptions(competition=name), to_overrides(params, chosen))
        seen_encoders.add(chosen["encoder"])
        if chosen["encoder"] == "bert":
            assert "adapter" not in chosen and "num_hidden_layers" in chosen
            assert config.model.num_hidden_layers == chosen["num_hidden_layers"]
            assert config.train.learning_rate == chosen["scratch_learning_rate"]
        else:
            assert "num_hidden_layers" not in chosen and "adapter" in chosen
            seen_adapters.add(chosen["adapter"])
            if chosen["adapter"] == "none":
                assert "lora_rank" not in chosen and config.model.adapter_options == {}
                assert config.train.learning_rate == chosen["full_learning_rate"]
            else:
                assert config.model.adapter_options["rank"] == chosen["lora_rank"]
                assert config.train.learning_rate == chosen["adapter_learning_rate"]
        assert ("numeric" in chosen) == (chosen["serializer"] != "competition")
        if chosen["serializer"] != "competition":
            assert config.competition.text.serializer == chosen["serializer"]
            assert config.competition.text.numeric == chosen["numeric"]
        # Fusion only where the table has numeric columns; text.numbers only with fusion and a generic serializer.
        assert ("fusion" in chosen) == numeric_columns
        assert config.head.fusion == chosen.get("fusion", "none")
        assert ("numbers" in chosen) == (chosen.get("fusion", "none") != "none"
                                         and chosen["serializer"] != "competition")
        assert config.competition.text.numbers == chosen.get("numbers", "both")
        study.tell(trial, 0.0)
    assert seen_encoders == {"bert", "minilm-l6"}
    assert seen_adapters >= {"none", "lora"}


@pytest.mark.parametrize("name", COMPETITIONS)
def test_default_trial_reproduces_the_default_configuration(name):
    competition = load_competition(name)
    params = parse_space(space_entries(competition, gpu=True))
    options = TuneOptions(competition=name)
    default = resolve_trial_config(competition, options, {})
    fixed, outside = default_params(params, default)
    assert outside == []
    assert resolve_trial_config(competition, options, to_overrides(params, fixed)).to_dict() == default.to_dict()


def test_default_space_trains_from_scratch_without_a_gpu():
    competition = load_competition("titanic")
    params = parse_space(space_entries(competition, gpu=False))
    assert [p.value for p in params if p.name == "encoder"] == ["bert"]
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(10):
        chosen = sample(params, study.ask())
        assert chosen["encoder"] == "bert" and "adapter" not in chosen and "num_hidden_layers" in chosen
    competition.search_space = {"encoder": {"choices": ["bert", "minilm-l6"]}}  # the competition brings it back
    assert space_entries(competition, gpu=False)["encoder"] == {"choices": ["bert", "minilm-l6"]}


def test_space_errors_and_competition_overrides(tmp_path):
    with pytest.raises(KbertError, match="not other entries"):
        parse_space({"rank": {"choices": [4], "when": {"adapter": "lora"}}})
    with pytest.raises(KbertError, match="cycle"):
        parse_space({"epochs": {"choices": [1], "when": {"patience": 1}}, "patience": {"choices": [1],
                                                                                    "when": {"epochs": 1}}})
    # A `when` may name a later entry: that one is sampled first (YAML dumps often sort the keys).
    ordered = parse_space({"rank": {"set": "adapter_options.rank", "choices": [4], "when": {"adapter": "lora"}},
                           "adapter": ["lora"], "epochs": 1})
    assert [p.name for p in ordered] == ["adapter", "rank", "epochs"]
    # a space samples only what trials may differ in: not their folds, rows, seed or files; each setting once
    for entries, error in (({"limit_rows": 50}, "limit_rows is what every trial of a study shares"),
                           ({"k": {"set": "folds.k", "choices": [3]}}, "folds.k is what every trial"),
                           ({"e": {"set": "epoch", "value": 2}}, r"'epoch' is not a run setting \(did you mean"),
                           ({"epochs": 2, "e": {"set": "epochs", "value": 3}}, "'epochs' and 'e' both set epochs"),
                           ({"epochs": {"low": 1, "high": 3, "step": 5}}, "'step' 5 does not divide the range 1 to 3")):
        with pytest.raises(KbertError, match=error):
            parse_space(entries)
    # Two entries may set one setting only where no trial samples both (else the study records a value the run
    # never used), traced through the entries above them; and a `when` names values its entry takes.
    pooling = {"pooling": ["cls", "mean"], "encoder": {"choices": ["bert", "minilm-l6"]}}
    for entries, error in (
            ({**pooling, "a": {"set": "max_length", "choices": [16], "when": {"encoder": "bert"}}, "max_length": 40},
             "'a' and 'max_length' both set max_length"),
            ({**pooling, "a": {"set": "max_length", "choices": [16], "when": {"pooling": "cls"}},
              "b": {"set": "max_length", "choices": [32], "when": {"encoder": "bert"}}}, "'a' and 'b' both set"),
            ({**pooling, "lr": {"set": "learning_rate", "low": 1e-4, "high": 1e-3, "when": {"encoder": "bertt"}}},
             r"'lr': its 'when' names encoder \['bertt'\], which 'encoder' never takes"),
            ({"max_length": [32, 48], "batch_size": {"choices": [8], "when": {"max_length": "32"}}},
             r"its 'when' names max_length \['32'\], which 'max_length' never takes \(\[32, 48\]\)")):
        with pytest.raises(KbertError, match=error):
            parse_space(entries)
    exclusive = parse_space({**pooling, "adapter": {"choices": ["none", "lora"], "when": {"encoder": "pretrained"}},
                             "a": {"set": "learning_rate", "low": 1e-5, "high": 1e-4, "when": {"adapter": "none"}},
                             "b": {"set": "learning_rate", "low": 1e-3, "high": 1e-2, "when": {"encoder": "bert"}}})
    assert {p.name for p in exclusive if p.target == "learning_rate"} == {"a", "b"}  # 'a' only under minilm-l6
    with pytest.raises(KbertError, match="unknown keys"):
        parse_space({"epochs": {"lo": 1, "high": 3}})
    with pytest.raises(KbertError, match="low <= high"):
        parse_space({"epochs": {"low": 5, "high": 3}})
    with pytest.raises(KbertError, match="^space: 'pooling': choice 2 'nonsense' is unknown; known: cls, mean, max, "
                                         "attention, weighted-layers, cls-last4$"):
        parse_space({"pooling": ["cls", "nonsense"]}, "space")
    with pytest.raises(KbertError, match=r"^space: 'numbers' \(sets text\.numbers\): value 'digits' is unknown"):
        parse_space({"numbers": {"set": "text.numbers", "value": "digits"}}, "space")
    # narrowing an entry leaves part of another's `when` untaken: still sampled under the rest (it was refused,
    # blaming the built-in entry); a `when` wholly untaken says how to drop its entry
    narrowed = parse_space({"serializer": {"set": "text.serializer", "choices": ["competition", "list"]},
                            "numeric": {"set": "text.numeric", "choices": ["raw"],
                                        "when": {"serializer": ["list", "sentence"]}}})
    assert [p.name for p in narrowed] == ["serializer", "numeric"]
    with pytest.raises(KbertError, match=r"'full': its 'when' names adapter \['none'\], which 'adapter' never takes "
                                         r"\(\['lora'\]\): it would never be sampled; drop it from the space with "
                                         r"'full: null'$"):
        parse_space({"adapter": ["lora"], "full": {"set": "learning_rate", "value": 1e-5, "when": {"adapter": "none"}}})
    with pytest.raises(KbertError, match=r"^space: 'encoder': choice 2 'bert-huge' is no encoder \(did you mean "
                                         r"'bert-base'\?\)"):
        parse_space({"encoder": ["bert-tiny", "bert-huge"]}, "space")  # (only the trials drawing it failed)
    # true/false settings and serializer names were checked trial by trial: every trial of the night failed
    with pytest.raises(KbertError, match=r"^space: 'calibrate': choice 1 must be true or false, got 'no'$"):
        parse_space({"calibrate": ["no", "off"]}, "space")
    with pytest.raises(KbertError, match=r"^space: 's' \(sets text\.serializer\): choice 1 'bogus' is unknown"):
        parse_space({"s": {"set": "text.serializer", "choices": ["bogus", "list"]}}, "space")
    assert [p.distribution.choices for p in parse_space({"pooling": ["mean", "cls"]})] == [("mean", "cls")]  # a subset
    competition = load_competition("titanic")
    competition.search_space = {"pooling": None, "epochs": {"low": 2, "high": 4}}
    entries = space_entries(competition)
    assert "pooling" not in entries and entries["epochs"] == {"low": 2, "high": 4}
    assert "focal_gamma" in entries  # the binary task's extras
    (tmp_path / "bad.yaml").write_text("params: [1, 2]\n")
    with pytest.raises(KbertError, match="bad.yaml"):
        space_entries(competition, tmp_path / "bad.yaml")
    # each section a mapping, each key and task known (a section of another shape was a traceback, a misspelt key
    # or task was ignored); a folder is named as one
    refused = {"tasks: 5": "'tasks' must be a mapping, not int", "cpu: [1]": "'cpu' must be a mapping, not list",
               "tasks:\n  binary: [1]": "tasks.binary must be a mapping, not list",
               "task:\n  binary: {}": r"unknown key 'task' \(did you mean 'tasks'\?\)",
               "tasks:\n  binery: {}": r"tasks: unknown task 'binery' \(did you mean 'binary'\?\)"}
    for text, error in refused.items():
        (tmp_path / "bad.yaml").write_text(f"params:\n  epochs: 1\n{text}\n")
        with pytest.raises(KbertError, match=f"^{tmp_path / 'bad.yaml'}: {error}"):
            space_entries(competition, tmp_path / "bad.yaml")
    with pytest.raises(KbertError, match=f"^{tmp_path}: a folder, not a search space file$"):
        space_entries(competition, tmp_path)


def test_text_overrides_and_their_errors():
    competition = load_competition("titanic")
    config = resolve_run_config(competition, {"text": {"serializer": "sentence", "numeric": "bins"}})
    assert (config.competition.text.serializer, config.competition.text.numeric) == ("sentence", "bins")
    assert resolve_run_config(competition, {"text": {"serializer": "competition"}}).competition.text.serializer == "titanic"
    with pytest.raises(KbertError, match="numeric"):
        resolve_run_config(competition, {"text": {"serializer": "list", "numeric": "words"}})


# ---------------------------------------------------------------- layer-wise learning-rate decay


def test_layerwise_lr_decay_scales_each_depth():
    """With the same constant gradient everywhere, AdamW moves every weight by its group's learning rate times
    one common factor: relative to the head, the embeddings move d^(L+1) and block i d^(L-i)."""
    config = {"model_type": "bert", "vocab_size": 50, "hidden_size": 16, "num_hidden_layers": 3,
              "num_attention_heads": 2, "intermediate_size": 32, "max_position_embeddings": 32}
    model = build_task_model(config, HeadConfig(task="binary", num_outputs=1), "cls")
    train = TrainConfig(learning_rate=1e-2, layerwise_lr_decay=0.5, weight_decay=0.0, warmup_ratio=0.0,
                        min_lr_ratio=1.0)
    optimizer = make_optimizer(model, train, total_steps=10)
    before = dict(tree_flatten(model.trainable_parameters()))
    grads = {k: mx.ones_like(v) for k, v in before.items()}
    from mlx.utils import tree_unflatten

    for _ in range(2):
        optimizer.update(model, tree_unflatten(list(grads.items())))
        mx.eval(model.parameters())
    after = dict(tree_flatten(model.trainable_parameters()))
    depths = {}
    for name in before:
        step = float(mx.abs(before[name] - after[name]).max())
        depths.setdefault(layer_depth(name, 3, ARCHITECTURES["bert"]), []).append(step)
    assert set(depths) == {0, 1, 2, 3, 4}
    assert all(max(steps) == pytest.approx(min(steps), rel=1e-3) for steps in depths.values())
    top = depths[4][0]
    assert top > 1e-3
    for depth in range(4):
        assert depths[depth][0] / top == pytest.approx(0.5 ** (4 - depth), rel=1e-3)
    modernbert, neobert = ARCHITECTURES["modernbert"], ARCHITECTURES["neobert"]
    assert layer_depth("encoder.embeddings.tok_embeddings.weight", 3, modernbert) == 0
    assert layer_depth("encoder.layers.2.attn.Wqkv.weight", 3, modernbert) == 3
    assert layer_depth("encoder.transformer_encoder.0.qkv.weight", 3, neobert) == 1
    assert layer_depth("encoder.encoder.weight", 3, neobert) == 0  # NeoBERT's token table
    assert layer_depth("encoder.final_norm.weight", 3, modernbert) == 4
    assert layer_depth("head.classifier.weight", 3, modernbert) == 4


def test_layerwise_lr_decay_must_be_in_range():
    with pytest.raises(KbertError, match="layerwise_lr_decay"):
        resolve_run_config(load_competition("titanic"), {"layerwise_lr_decay": 1.5})


# ---------------------------------------------------------------- a study in process


@pytest.mark.slow
def test_study_artifacts_top_checkpoints_report_and_best_yaml_reproduce(tmp_path, capsys, monkeypatch):
    options = tiny_options(tmp_path, keep_top=1)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # as a worker of `kbert tune`'s default (one per core) has
    study, _ = tune(options)
    monkeypatch.delenv("OMP_NUM_THREADS")  # best.yaml reruns on a machine with more cores
    trials = study.get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 3
    assert trials[0].user_attrs["default"] is True
    directory = tmp_path / "runs" / "titanic" / "t"
    ranked = sorted(trials, key=lambda t: (-t.value, t.number))
    for trial in trials:
        folder = directory / f"trial-{trial.number:04d}"
        for name in ("config.yaml", "oof.csv", "test.csv", "metrics.json", "submission.csv"):
            assert (folder / name).is_file()
        assert len(trial.user_attrs["fold_scores"]) == 2 and trial.intermediate_values.keys() == {0, 1}
        weights = list((folder / "folds").glob("*/*.safetensors"))
        assert len(weights) == (2 if trial.number == ranked[0].number else 0)
    assert list((directory / "journal.log.heartbeats").iterdir()) == []  # finished trials leave no heartbeat
    out = capsys.readouterr().out
    assert "trial    0 [default] w0: folds" in out and "| mean " in out and "(OOF " in out

    report = write_report(options)
    for name in ("best.yaml", "history.png", "importances.png", "parallel_coordinate.png"):
        assert (report / name).stat().st_size > 0
    rerun = run_config_from_file(report / "best.yaml", {"out_dir": str(tmp_path / "rerun")})
    assert rerun.train.cpu_streams == 1 and rerun.train.fold_processes == 0  # the trial's stream, folds auto
    from kbert.pipeline.run import run_competition

    result = run_competition(rerun, run_id="repro", progress=False, log=lambda _: None,
                             submission_path=tmp_path / "sub.csv")
    assert abs(np.mean(result.fold_scores) - study.best_value) <= 0.005
    assert abs(result.cv_score - study.best_trial.user_attrs["oof_cv"]) <= 0.005
    assert result.fold_scores == pytest.approx(study.best_trial.user_attrs["fold_scores"], abs=1e-6)


@pytest.mark.slow
def test_failing_trials_are_recorded_and_the_study_goes_on(tmp_path):
    # A rate of 1e30 diverges in training: a failure no check of the space foresees (those refuse the study first)
    space = {"params": {**TINY_SPACE["params"], "scratch_learning_rate": {"set": "learning_rate",
                                                                          "choices": [1e-3, 1e30]}}}
    options = tiny_options(tmp_path, trials=3, space=write_space(tmp_path / "fail.yaml", space))
    study, _, _, _ = load_study(options, create=True)  # queues trial 0, the default configuration
    study.enqueue_trial({"scratch_learning_rate": 1e30})  # trial 1 fails
    study.enqueue_trial({"scratch_learning_rate": 1e-3})
    study, code = tune(options)
    assert code == 0
    assert [t.state for t in study.get_trials()] == [TrialState.COMPLETE, TrialState.FAIL, TrialState.COMPLETE]
    failed = study.get_trials(states=(TrialState.FAIL,))  # ... and counted: --trials 3 ran 3 trials
    assert all("the validation loss became" in t.user_attrs["error"] for t in failed)
    assert not any((tmp_path / "runs" / "titanic" / "t" / f"trial-{t.number:04d}").exists() for t in failed)


@pytest.mark.slow
def test_a_study_whose_every_trial_fails_runs_its_trials_once_and_exits_with_the_reason(tmp_path):
    """--trials 2 runs two trials, failed ones included (failures once did not count: the study trained on and on),
    and a study with no completed trial is no result."""
    space = {"params": {**TINY_SPACE["params"], "scratch_learning_rate": {"set": "learning_rate", "value": 1e30}}}
    # (every trial diverges in training: a failure no check of the space foresees)
    options = tiny_options(tmp_path, trials=2, space=write_space(tmp_path / "none.yaml", space), enqueue_default=False)
    with pytest.raises(KbertError, match=r"^study 't': no trial completed; trial 0: KbertError: .*the validation loss "
                                         r"became"):
        tune(options)
    assert [t.state for t in load_study(options, create=False)[0].get_trials()] == [TrialState.FAIL] * 2


def test_more_workers_than_the_machine_runs_are_refused_with_the_limit(tmp_path, monkeypatch):
    import kbert.tune.workers as workers

    monkeypatch.setattr(workers, "usable_cores", lambda: 2)
    monkeypatch.setattr(workers, "available_memory", lambda: None)
    with pytest.raises(KbertError, match=r"^--workers 1000: this machine runs at most 2 \(one per core: 2 cores\)$"):
        tune(tiny_options(tmp_path, workers=1000))
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_pruned_trial_is_recorded_and_its_folder_removed_but_never_after_the_last_fold(tmp_path):
    class PruneAfterFirstFold(optuna.pruners.BasePruner):  # trial 1 after fold 1; trial 2 at its last fold
        def prune(self, study, trial):
            return len(trial.intermediate_values) >= {0: 99, 1: 1, 2: 2}[trial.number]

    options = tiny_options(tmp_path)
    study, competition, params, directory = load_study(options, create=True)
    study.pruner = PruneAfterFirstFold()
    context = TrialContext(options, competition, params, directory, 0, time.perf_counter(), log=lambda _: None)
    study.optimize(make_objective(context), n_trials=3)
    first, second, third = study.get_trials()
    assert first.state == TrialState.COMPLETE and second.state == TrialState.PRUNED
    assert list(second.intermediate_values) == [0]
    assert third.state == TrialState.COMPLETE  # never pruned after its last fold: the work is done
    assert (directory / "trial-0000").is_dir() and not (directory / "trial-0001").exists()


def journal_study(path: Path, name: str = "s") -> optuna.Study:
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(path)))
    return optuna.create_study(storage=storage, study_name=name, load_if_exists=True)


def test_stale_trial_is_failed_and_retried_by_optunas_callback(tmp_path):
    study = journal_study(tmp_path / "journal.log")
    heartbeats = Heartbeats(tmp_path / "journal.log.heartbeats", interval=0.05, grace=0.2, max_retry=2)
    trial = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
    heartbeats.beat(trial.number)
    assert fail_stale_trials(study, heartbeats) == []
    assert study.get_trials()[0].state == TrialState.RUNNING  # a fresh heartbeat: not stale
    time.sleep(0.3)
    assert fail_stale_trials(study, heartbeats) == [trial.number]
    original, retry = study.get_trials()
    assert original.state == TrialState.FAIL
    assert retry.state == TrialState.WAITING and retry.system_attrs["failed_trial"] == original.number
    assert retry.params == original.params
    assert not heartbeats.path(trial.number).exists()
    # Another process that opens the same journal later finds nothing stale: the trial is failed and retried once.
    assert fail_stale_trials(journal_study(tmp_path / "journal.log"), heartbeats) == []
    assert len(study.get_trials()) == 2


def test_a_trial_that_never_beat_goes_stale_after_the_grace_period_from_its_start(tmp_path):
    study = journal_study(tmp_path / "journal.log")
    heartbeats = Heartbeats(tmp_path / "beats", interval=0.05, grace=0.3, max_retry=0)
    trial = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})  # its worker died before the first beat
    assert fail_stale_trials(study, heartbeats) == []
    time.sleep(0.4)
    assert fail_stale_trials(study, heartbeats) == [trial.number]
    assert [t.state for t in study.get_trials()] == [TrialState.FAIL]  # max_retry=0: failed, not queued again


def test_keep_top_checkpoints_deletes_weights_outside_the_best(tmp_path):
    study = optuna.create_study(direction="minimize")
    for number, value in enumerate([0.3, 0.1, 0.2]):
        folder = tmp_path / f"trial-{number:04d}" / "folds" / "0"
        folder.mkdir(parents=True)
        (folder / "model.safetensors").write_bytes(b"x" * 10)
        (folder / "test.csv").write_text("id\n")
        study.add_trial(optuna.create_trial(value=value))
    assert keep_top_checkpoints(study, tmp_path, keep=2) == 10
    assert [(tmp_path / f"trial-{n:04d}/folds/0/model.safetensors").exists() for n in range(3)] == [False, True, True]
    assert (tmp_path / "trial-0000/folds/0/test.csv").exists()


# ---------------------------------------------------------------- processes: kill, Ctrl-C, resume


def tune_command(options: TuneOptions, trials: int, workers: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "kbert.cli", "tune", "titanic", "--study", options.study, "--trials",
            str(trials), "--workers", str(workers), "--space", options.space, "--limit-rows", "90", "--folds", "3",
            "--heartbeat", "1", "--out", options.out_dir, "--seed", "0", *extra]


def wait_for(condition, timeout: float, what: str):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def study_trials(options: TuneOptions) -> list[optuna.trial.FrozenTrial]:
    path = Path(options.out_dir) / "titanic" / options.study / "journal.log"
    if not path.exists():
        return []
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(path)))
    try:
        return optuna.load_study(study_name=options.study, storage=storage).get_trials()
    except KeyError:
        return []


def running_trial_mid_fold(options: TuneOptions, folds_done: int | None = None):
    """A running trial with a worker pid and at least one fold reported (exactly ``folds_done``, if given:
    with 3 folds and 1 done, a signal sent now lands in a fold that is not the last), once another trial
    completed."""
    trials = study_trials(options)
    if not any(t.state == TrialState.COMPLETE for t in trials):
        return None
    running = [t for t in trials if t.state == TrialState.RUNNING and "pid" in t.user_attrs and t.intermediate_values
               and (folds_done is None or len(t.intermediate_values) == folds_done)]
    return running[0] if running else None


@pytest.mark.slow
def test_sigkill_one_of_two_workers_then_resume(tmp_path):
    space = {"params": {**TINY_SPACE["params"], "epochs": 5}}
    options = tiny_options(tmp_path, space=write_space(tmp_path / "space.yaml", space))
    env = machine_environment(PYTHONUNBUFFERED="1")  # two workers: the machine's cores, not this worker's share
    first = subprocess.Popen(tune_command(options, 6, workers=2), cwd=REPO, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    pid = wait_for(lambda: running_trial_mid_fold(options), 240, "a running trial mid-fold").user_attrs["pid"]
    os.kill(pid, signal.SIGKILL)
    completed_then = {t.number: t.value for t in study_trials(options) if t.state == TrialState.COMPLETE}
    output, _ = first.communicate(timeout=300)
    assert f"ended with exit code {-signal.SIGKILL}" in output, output
    assert first.returncode == 1

    second = subprocess.run(tune_command(options, 8, workers=2), cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=300)
    assert second.returncode == 0, second.stdout + second.stderr
    trials = study_trials(options)
    by_number = {t.number: t for t in trials}
    for number, value in completed_then.items():  # nothing completed was lost or changed
        assert by_number[number].state == TrialState.COMPLETE and by_number[number].value == value
    killed = [t for t in trials if t.user_attrs.get("pid") == pid and t.state == TrialState.FAIL]
    assert len(killed) == 1  # the trial the killed worker was running went stale and failed ...
    retries = [t for t in trials if t.system_attrs.get("failed_trial") == killed[0].number]
    assert len(retries) == 1 and retries[0].params == killed[0].params  # ... and was retried once
    assert retries[0].state in (TrialState.COMPLETE, TrialState.PRUNED)
    finished = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    assert 8 <= len(finished) <= 9  # two workers may each finish one trial past the target
    assert not any(t.state in (TrialState.RUNNING, TrialState.WAITING) for t in trials)
    directory = Path(options.out_dir) / "titanic" / options.study
    for trial in trials:
        assert (directory / f"trial-{trial.number:04d}").is_dir() == (trial.state == TrialState.COMPLETE)
    if sys.platform == "linux":  # a spawned worker binds the fast BLAS before MLX loads
        blas = {read_json(directory / f"trial-{t.number:04d}" / "metrics.json")["blas"]["library"] for t in trials
                if t.state == TrialState.COMPLETE}
        assert blas and not blas & {"reference", "unbound"}, blas


# A tiny model learns nothing on 60 rows and early stopping would end a fold after 7 epochs. Folds of about 2 s on 2
# cores let the signal tests see a trial between two folds and land their signal inside the next one (at 20 epochs a
# fold took 0.2 s, and under load a kill sent after the first fold could land after the trial had completed).
SLOW_FOLDS = {"epochs": 200, "patience": 1000}


@pytest.mark.slow
def test_ctrl_c_abandons_the_trial_and_the_next_run_resumes(tmp_path):
    space = {"params": {**TINY_SPACE["params"], **SLOW_FOLDS}}
    options = tiny_options(tmp_path, space=write_space(tmp_path / "space.yaml", space))
    # A test run started in the background (nohup, CI runners) passes SIGINT on as ignored, and Python then
    # installs no KeyboardInterrupt handler: give the child the default disposition, as a terminal would.
    process = subprocess.Popen(tune_command(options, 50, 1, "--pruner", "none"), cwd=REPO, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    wait_for(lambda: running_trial_mid_fold(options), 240, "a running trial mid-fold")
    process.send_signal(signal.SIGINT)
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 130, output
    assert "abandoned and queued again" in output
    trials = study_trials(options)
    abandoned = [t for t in trials if t.state == TrialState.FAIL]
    assert len(abandoned) == 1 and "interrupted" in abandoned[0].user_attrs["error"]
    queued = [t for t in trials if t.state == TrialState.WAITING]
    assert len(queued) == 1 and queued[0].system_attrs["failed_trial"] == abandoned[0].number
    finished = sum(t.state == TrialState.COMPLETE for t in trials)

    assert main(["tune", "titanic", "--study", options.study, "--trials", str(finished + 1), "--space", options.space,
                 "--limit-rows", "90", "--folds", "3", "--out", options.out_dir, "--seed", "0", "--workers", "1"]) == 0
    trials = study_trials(options)
    assert sum(t.state == TrialState.COMPLETE for t in trials) == finished + 1
    resumed = [t for t in trials if t.system_attrs.get("failed_trial") == abandoned[0].number]
    assert len(resumed) == 1 and resumed[0].state == TrialState.COMPLETE  # the queued trial ran first
    assert resumed[0].params == abandoned[0].params


@pytest.mark.slow
def test_heartbeats_beat_while_the_trial_runs_and_a_thread_never_stopped_cannot_keep_the_process_alive(tmp_path):
    """A trial's heartbeat file is rewritten while it runs and no more after; a Ctrl-C that lands between the
    heartbeat thread's start and the code that stops it skips the stop, and the process must still end."""
    heartbeats = Heartbeats(tmp_path / "journal.log.heartbeats", interval=0.1, grace=0.4, max_retry=2)
    beat = heartbeats.path(7)
    with heartbeats.beating(7):
        first = beat.read_text()
        time.sleep(0.35)
        assert beat.read_text() != first  # rewritten at least once
    last = beat.read_text()
    time.sleep(0.25)
    assert beat.read_text() == last  # the thread stopped with the trial
    beating = heartbeats.start(8)
    assert beating.thread.is_alive() and beating.thread.daemon
    beating.stop()
    assert not beating.thread.is_alive()
    never_stopped = ("import time; from pathlib import Path; from kbert.tune.storage import Heartbeats\n"
                     f"Heartbeats(Path({str(tmp_path / 'other')!r}), 0.1, 0.4, 2).start(9)  # never stopped\n"
                     "time.sleep(0.3)\n")
    done = subprocess.run([sys.executable, "-c", never_stopped], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "other" / "9").exists()


@pytest.mark.slow
def test_cli_report_and_run_config(tmp_path, capsys):
    options = tiny_options(tmp_path, trials=2)
    tune(options)
    assert main(["tune", "titanic", "--study", "t", "--out", options.out_dir, "--report"]) == 0
    out = capsys.readouterr().out
    assert "trials: 2 complete" in out and "best.yaml" in out
    best = Path(options.out_dir) / "titanic" / "t" / "report" / "best.yaml"
    assert main(["run", "--config", str(best), "--epochs", "3"]) == 2  # a resolved config is edited, not flagged
    assert "edit it instead" in capsys.readouterr().err
    simple = tmp_path / "simple.yaml"
    simple.write_text("competition: titanic\nepochs: 1\nfolds: 2\nlimit_rows: 60\nhidden_size: 32\n"
                      "num_attention_heads: 2\n")
    assert main(["run", "--config", str(simple), "--no-progress", "--out", str(tmp_path / "r"), "--submissions-dir",
                 str(tmp_path / "s"), "--run-id", "x"]) == 0
    assert "CV accuracy" in capsys.readouterr().out
    assert main(["tune", "titanic", "--study", "missing", "--out", options.out_dir, "--report"]) == 2
    assert main(["tune", "titanic", "--timeout", "soon", "--out", options.out_dir]) == 2


@pytest.mark.slow
def test_timeout_stops_the_running_trial_after_its_fold_and_queues_it_again(tmp_path, monkeypatch, capsys):
    import kbert.pipeline.fold

    real_train_fold = kbert.pipeline.fold.train_fold

    def slow_train_fold(*args, **kwargs):  # the deadline falls inside fold 1, however loaded the machine is
        time.sleep(4)
        return real_train_fold(*args, **kwargs)

    monkeypatch.setattr(kbert.pipeline.fold, "train_fold", slow_train_fold)
    options = tiny_options(tmp_path, trials=None, timeout=3)
    with pytest.raises(KbertError, match=r"^study 't': no trial completed; trial 0: stopped at the --timeout "
                                         r"deadline after fold 1; queued again$"):  # a study of nothing fails
        tune(options)
    assert optuna.logging.get_verbosity() == optuna.logging.ERROR  # not Optuna's warning and traceback as well
    first, retry = load_study(options, create=False)[0].get_trials()
    assert first.state == TrialState.FAIL and "deadline after fold 1" in first.user_attrs["error"]
    assert retry.state == TrialState.WAITING and retry.system_attrs["failed_trial"] == 0
    assert retry.params == first.params and retry.user_attrs["default"] is True
    assert not (tmp_path / "runs" / "titanic" / "t" / "trial-0000").exists()
    assert "trial    0 w0: stopped at the --timeout deadline after fold 1; queued again" in capsys.readouterr().out


@pytest.mark.slow
def test_rdb_storage_url_with_heartbeats(tmp_path):
    """--storage takes an RDB URL (here SQLite; PostgreSQL or MySQL for several machines)."""
    options = tiny_options(tmp_path, trials=2, storage=f"sqlite:///{tmp_path / 'study.db'}")
    study, code = tune(options)
    assert code == 0 and len(study.get_trials(states=(TrialState.COMPLETE,))) == 2
    storage = optuna.storages.RDBStorage(options.storage)
    assert optuna.load_study(study_name="t", storage=storage).best_value == study.best_value
    opened = open_storage(options, tmp_path / "runs" / "titanic" / "t")  # what load_study gave the study
    assert isinstance(opened.database, optuna.storages.RDBStorage) and opened.get_heartbeat_interval() == 1
    assert not (tmp_path / "runs" / "titanic" / "t" / "journal.log").exists()  # Optuna's heartbeats, no journal


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/status")
    return not (status.exists() and "State:\tZ" in status.read_text())


def workers_frozen_mid_fold(options: TuneOptions) -> tuple[set[int], list[optuna.trial.FrozenTrial]] | None:
    """Once a trial is between its first and last fold, stop (SIGSTOP) the workers that ran trials and read the
    study again: it is then what they find when they go on, however late the test process is scheduled (a kill
    sent a fold after the trial was seen mid-fold found every trial done). None, the workers going on, when the
    trial reached its last fold before they stopped."""
    if running_trial_mid_fold(options, folds_done=1) is None:
        return None
    workers = {t.user_attrs["pid"] for t in study_trials(options) if "pid" in t.user_attrs}
    for pid in workers:
        os.kill(pid, signal.SIGSTOP)
    trials = study_trials(options)
    if any(t.state == TrialState.RUNNING and len(t.intermediate_values) == 1 for t in trials):
        return workers, trials
    for pid in workers:
        os.kill(pid, signal.SIGCONT)
    return None


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_workers_do_not_outlive_a_killed_tune_process(tmp_path):
    space = {"params": {**TINY_SPACE["params"], **SLOW_FOLDS}}
    options = tiny_options(tmp_path, space=write_space(tmp_path / "space.yaml", space))
    main_process = subprocess.Popen(tune_command(options, 50, 2, "--pruner", "none"), cwd=REPO,
                                    env=machine_environment(),  # two workers: the machine's cores
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    workers, at_kill = wait_for(lambda: workers_frozen_mid_fold(options), 240, "a running trial after its first fold")
    main_process.kill()
    main_process.wait()
    for pid in workers:
        os.kill(pid, signal.SIGCONT)
    wait_for(lambda: not any(pid_alive(pid) for pid in workers), 120, "the orphaned workers to stop")
    trials = study_trials(options)
    abandoned = [t for t in trials if t.state == TrialState.FAIL]
    assert all("the kbert tune process is gone" in t.user_attrs["error"] for t in abandoned)
    # each trial that had a fold left after the one it was in stopped after that fold (3 folds)
    mid_run = {t.number for t in at_kill if t.state == TrialState.RUNNING and len(t.intermediate_values) < 2}
    assert mid_run and mid_run <= {t.number for t in abandoned}
    queued = {t.system_attrs.get("failed_trial") for t in trials if t.state == TrialState.WAITING}
    assert queued == {t.number for t in abandoned}
    assert not any(t.state == TrialState.RUNNING for t in trials)


def test_when_encoder_pretrained_holds_for_every_pretrained_encoder(tmp_path):
    space = parse_space({
        "encoder": {"choices": ["bert", "bert-mini", "minilm-l6", "org/model@v1", str(tmp_path)]},
        "lr": {"set": "learning_rate", "low": 1e-5, "high": 1e-4, "when": {"encoder": "pretrained"}},
        "layers": {"set": "num_hidden_layers", "low": 1, "high": 2, "when": {"encoder": "scratch"}},
        "only_bert": {"set": "hidden_size", "choices": [32], "when": {"encoder": "bert"}},
    }, "space")
    from kbert.tune.space import is_active

    by_name = {p.name: p for p in space}
    active = {encoder: sorted(n for n in ("lr", "layers", "only_bert") if is_active(by_name[n], {"encoder": encoder}))
              for encoder in ("bert", "bert-mini", "minilm-l6", "org/model@v1", str(tmp_path))}
    assert active == {"bert": ["layers", "only_bert"], "bert-mini": ["layers"], "minilm-l6": ["lr"],
                      "org/model@v1": ["lr"], str(tmp_path): ["lr"]}


@pytest.mark.slow
def test_a_study_samples_fusion_and_its_trials_blend(tmp_path):
    """A fusion trial completes like any other and keeps what `kbert predict` and `kbert ensemble` read."""
    space = {"params": {**TINY_SPACE["params"], "fusion": {"choices": ["none", "concat", "gated"]}}}
    options = tiny_options(tmp_path, space=write_space(tmp_path / "fusion.yaml", space), trials=4)
    study, _ = tune(options)
    trials = study.get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 4 and trials[0].params["fusion"] == "none"
    fused = [t for t in trials if t.params["fusion"] != "none"]
    assert fused
    folder = tmp_path / "runs" / "titanic" / "t" / f"trial-{fused[0].number:04d}"
    assert yaml.safe_load((folder / "config.yaml").read_text())["head"]["fusion"] == fused[0].params["fusion"]
    assert all((folder / name).is_file() for name in ("oof.csv", "test.csv", "folds/0/tabular.json"))


def test_spawned_workers_share_the_cores_unless_the_user_chose(monkeypatch):
    from kbert.pipeline.fold_processes import THREAD_VARIABLES
    from kbert.tune.workers import cores_shared

    for name in THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MKL_NUM_THREADS", "3")
    with cores_shared(2):
        share = str(max(1, len(os.sched_getaffinity(0)) // 2))
        assert os.environ["OMP_NUM_THREADS"] == os.environ["OPENBLAS_NUM_THREADS"] == share
        assert os.environ["MKL_NUM_THREADS"] == "3"
    assert "OMP_NUM_THREADS" not in os.environ and os.environ["MKL_NUM_THREADS"] == "3"


def test_without_workers_a_cpu_gets_one_per_core_as_memory_holds_and_a_gpu_one(monkeypatch):
    from kbert.pipeline import precision
    from kbert.tune import workers

    monkeypatch.setenv("OMP_NUM_THREADS", "6")  # usable_cores() reads it: six cores here
    monkeypatch.setattr(precision, "gpu_available", lambda: False)
    monkeypatch.setattr(workers, "available_memory", lambda: 64 * 2**30)
    assert workers.auto_workers(None) == 6
    assert workers.auto_workers(4) == 4  # no more workers than trials
    monkeypatch.setattr(workers, "available_memory", lambda: 3 * workers.WORKER_MEMORY + 1)
    assert workers.auto_workers(None) == 3
    monkeypatch.setattr(workers, "available_memory", lambda: 2**20)
    assert workers.auto_workers(None) == 1
    monkeypatch.setattr(precision, "gpu_available", lambda: True)
    monkeypatch.setattr(workers, "available_memory", lambda: 64 * 2**30)
    assert workers.auto_workers(None) == 1


@pytest.mark.slow
def test_the_command_without_workers_starts_one_per_core(tmp_path, capsys, monkeypatch):
    """`kbert tune` with no --workers on a CPU: a worker per core (two here), each trial on its own core."""
    from kbert.pipeline import precision

    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    monkeypatch.setattr(precision, "gpu_available", lambda: False)
    options = tiny_options(tmp_path)
    assert main(["tune", "titanic", "--study", "per-core", "--trials", "2", "--space", options.space, "--limit-rows",
                 "90", "--folds", "2", "--out", options.out_dir, "--seed", "0", "--pruner", "none"]) == 0
    assert "; 2 worker(s), pruner none" in capsys.readouterr().out
    trials = study_trials(replace(options, study="per-core"))
    assert sum(t.state == TrialState.COMPLETE for t in trials) == 2
    assert os.getpid() not in {t.user_attrs["pid"] for t in trials}  # spawned workers ran them


def test_a_study_made_from_other_data_is_refused(tmp_path):
    """A study records the sha256 of the data files it was made from; a worker reading changed files is refused
    (its trials would be ranked beside trials of other data), and a report, which only reads, is not."""
    import shutil

    from kbert.pipeline.config import BUNDLED_DATA_DIR
    from kbert.tune.study import load_study

    data = tmp_path / "data"
    shutil.copytree(BUNDLED_DATA_DIR / "titanic", data)
    options = tiny_options(tmp_path, overrides={"limit_rows": 90, "folds": 2, "data_dir": str(data)})
    load_study(replace(options), create=True)
    load_study(replace(options), create=True)  # the same files: joined
    train = data / "train.csv"
    train.write_text(train.read_text().replace(",22,", ",23,", 1))
    with pytest.raises(KbertError, match="^study 't' was made from other data \\(train.csv differ from the files "
                                         "read now\\): its trials would not compare"):
        load_study(replace(options), create=True)
    load_study(replace(options), create=False, check=False)


def test_a_study_folder_holds_one_studys_trials_and_a_study_serves_its_own_competition(tmp_path):
    """Two journals with one study name would share runs/<competition>/<study>/: the second overwrote the first's
    trial folders, and the first's best.yaml then held the second's settings. A study of one competition is not
    reported or blended as another's, even by the commands that only read it."""
    from kbert.tune.study import STUDY_FILE, load_study

    options = tiny_options(tmp_path, storage=str(tmp_path / "a.log"))
    _, _, _, directory = load_study(replace(options), create=True)
    assert (directory / STUDY_FILE).is_file()
    other = replace(options, storage=str(tmp_path / "b.log"))
    load_study(replace(other), create=True)  # no trial in the folder yet: nothing to mix up
    (directory / "trial-0000").mkdir()
    load_study(replace(other), create=True)  # it is the folder's study now
    with pytest.raises(KbertError, match=f"^--study t: {directory} holds the trials of another study of that name"):
        load_study(replace(options), create=True)
    with pytest.raises(KbertError, match="holds the trials of another study"):
        load_study(replace(options), create=False, check=False)  # --report, kbert ensemble --study
    with pytest.raises(KbertError, match="^study 't' in .*b.log was made for competition 'titanic', not "
                                         "'spaceship-titanic'$"):
        load_study(replace(other, competition="spaceship-titanic"), create=False, check=False)


def test_a_report_is_not_refused_for_the_limit_rows_of_the_environment(monkeypatch):
    """KBERT_LIMIT_ROWS, set for quick runs, gives --limit-rows its default: --report was refused as if the flag had
    been given ('drop --limit-rows'); the flag itself still is."""
    from kbert.cli import build_parser
    from kbert.cli.tune import check_mode

    monkeypatch.setenv("KBERT_LIMIT_ROWS", "100")
    check_mode(build_parser().parse_args(["tune", "titanic", "--report"]))
    with pytest.raises(KbertError, match="does not tune: drop --limit-rows$"):
        check_mode(build_parser().parse_args(["tune", "titanic", "--report", "--limit-rows", "50"]))


def test_plots_of_a_space_with_list_choices_are_skipped_with_a_note(tmp_path, capsys):
    """Optuna's importance and parallel-coordinate plots hash each choice: a text.columns entry's lists raised
    TypeError, a traceback after best.yaml and history.png were written."""
    import warnings

    from kbert.tune.summary import write_plots

    study = optuna.create_study()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Optuna warns of choices that are not None, bool, int, float or str
        study.optimize(lambda t: len(t.suggest_categorical("cols", [["a", "b"], ["c"]])) + t.suggest_float("x", 0, 1),
                       n_trials=4)
    assert write_plots(study, tmp_path, 4) == [tmp_path / "history.png"]
    assert "note: importances.png skipped: unhashable type: 'list'" in capsys.readouterr().err


def test_a_trial_queued_after_another_does_not_make_it_unneeded_and_an_unneeded_one_is_not_counted():
    """A --timeout stop queues its trials again (the default first); a rerun with --trials 1 failed the queued
    default as 'not needed', counting the retry queued after it, and that failure then made the study 'done' with
    no completed trial."""
    from kbert.tune.objective import NotNeeded, check_needed
    from kbert.tune.workers import counted

    study = optuna.create_study()
    for x in (0.0, 1.0):
        study.enqueue_trial({"x": x})
    first = study.ask()  # the queued default; the other stays queued after it
    check_needed(first, 1)
    second = study.ask()
    with pytest.raises(NotNeeded, match="^not needed: the trials before it make --trials 1$"):
        check_needed(second, 1)  # the race the check is for: the trial before it makes the target
    second.set_user_attr("not_needed", True)
    study.tell(second, state=TrialState.FAIL)
    assert counted(study.get_trials()) == 0
    study.tell(first, 0.5)
    assert counted(study.get_trials()) == 1


def test_a_finished_trials_line_gives_the_fold_scores_in_fold_order(monkeypatch):
    """Folds side by side finish in any order: the live line listed them so, the study's table in fold order."""
    from types import SimpleNamespace

    from kbert.tune import objective

    logged = []
    monkeypatch.setattr(objective, "log_trial", lambda trial, context, scores, *rest, **kw: logged.append(scores))
    trial = optuna.create_study().ask()
    result = SimpleNamespace(fold_scores=[0.82, 0.80], cv_score=0.81, run_dir="r", seconds=1.0)
    assert objective.record_result(trial, None, result, 1.0) == pytest.approx(0.81)
    assert logged == [[0.82, 0.80]] and trial.user_attrs["fold_scores"] == [0.82, 0.8]


def test_each_worker_and_each_rerun_draws_with_its_own_sampler_seed():
    """--seed S seeded every rerun's sampler alike: a resumed study proposed its first run's trials again."""
    from kbert.tune.workers import sampler_seed

    seeds = {sampler_seed(1, worker, trials) for worker in range(3) for trials in (0, 1, 4)}
    assert len(seeds) == 9 and sampler_seed(1, 0, 4) == sampler_seed(1, 0, 4) != sampler_seed(2, 0, 4)
