"""The search space refuses, in one line naming the entry, what its trials would refuse (or silently ignore), and a
refused space leaves no study behind. The command-line cases are tests/bad_inputs/s_space_*."""

from __future__ import annotations

import optuna
import pytest
import yaml

from kbert.errors import KbertError
from kbert.tune import TuneOptions, load_study
from kbert.tune.space import contains, parse_space


def refused(entries: dict, error: str, **kwargs) -> None:
    with pytest.raises(KbertError, match=error):
        parse_space(entries, "space", **kwargs)


def test_an_entry_setting_no_field_or_of_the_wrong_shape_is_one_line():
    refused({"foo": {"set": "text.foo", "choices": [1, 2]}}, r"^space: 'foo': 'text\.foo' is not a run setting$")
    refused({"r": {"set": "adapter_options.rnk", "value": 4}},
            r"'adapter_options\.rnk' is not a run setting \(did you mean 'adapter_options\.rank'\?\)$")
    refused({"batch_size": {"choices": 16}}, r"^space: 'batch_size': 'choices' must be a non-empty list, got 16$")
    refused({"batch_size": {"choices": []}}, "'choices' must be a non-empty list")


def test_every_value_is_one_the_run_takes():
    refused({"epochs": {"low": 1, "high": 2, "step": 0.5}},
            r"^space: 'epochs': 'step' must be an integer > 0, got 0\.5$")
    refused({"loss": ["default", "mse"]}, r"^space: 'loss': choice 2 'mse' is not a loss of task 'binary'; choose one "
                                          r"of default, bce, focal, softmax$", task="binary")
    parse_space({"loss": ["default", "mse"]}, "space", task="regression")
    refused({"loss": ["default", "msee"]}, "'msee' is not a loss of any task")  # the task unknown: any task's
    refused({"adapter": ["none", "foo"]}, r"^space: 'adapter': choice 2 'foo' is unknown; known: ")
    refused({"p": {"set": "text.paraphrases", "value": "x"}},
            r"^space: 'p' \(sets text\.paraphrases\): value must be a list of text, got 'x'$")
    refused({"x": {"set": "text.columns", "value": "Name"}}, "value must be a list of text, or null, got 'Name'$")
    refused({"t": {"set": "adapter_options.targets", "choices": ["default", 3]}}, "choice 2 must be text, got 3$")


def test_a_when_naming_a_range_is_checked_against_it():
    layers = {"layers": {"set": "num_hidden_layers", "low": 1, "high": 3, "step": 2}}
    for value in (7, "abc", 2, 1.0):  # outside, no integer, between the steps, a float
        refused({**layers, "head_dropout": {"low": 0.0, "high": 0.3, "when": {"layers": value}}},
                r"^space: 'head_dropout': its 'when' names layers \[.*\], which 'layers' never takes \(1 to 3 in "
                r"steps of 2\): it would never be sampled")
    ordered = parse_space({**layers, "head_dropout": {"low": 0.0, "high": 0.3, "when": {"layers": 3}}})
    assert [p.name for p in ordered] == ["layers", "head_dropout"]
    refused({"wd": {"set": "weight_decay", "low": 0.0, "high": 0.1},
             "head_dropout": {"value": 0.1, "when": {"wd": 0.05}}},
            r"'wd' is a range of real numbers, which never samples a given value exactly: give 'wd' 'choices'$")


def test_keys_that_conflict_are_refused_and_the_setting_decides_the_range():
    conflicts = {"'value', 'choices'": {"choices": [16, 32], "value": 64},
                 "'value', 'low', 'high'": {"low": 8, "high": 64, "value": 5},
                 "'choices', 'step'": {"choices": [16, 32], "step": 2},
                 "'choices', 'log'": {"choices": [16, 32], "log": True}}
    for keys, entry in conflicts.items():
        refused({"batch_size": entry}, f"^space: 'batch_size': keys {keys} conflict")
    refused({"batch_size": {"low": 8}}, "give 'choices', 'low' and 'high', or 'value'")
    refused({"weight_decay": {"low": 1e-3, "high": 0.1, "log": "false"}}, "'log' must be true or false, got 'false'$")
    decay = parse_space({"weight_decay": {"low": 0, "high": 1}})[0].distribution  # a float setting: real numbers
    assert isinstance(decay, optuna.distributions.FloatDistribution) and (decay.low, decay.high) == (0.0, 1.0)
    epochs = parse_space({"epochs": {"low": 1, "high": 9, "step": 2}})[0].distribution
    assert isinstance(epochs, optuna.distributions.IntDistribution)
    assert [v for v in range(11) if contains(epochs, v)] == [1, 3, 5, 7, 9] and not contains(epochs, 3.0)


def test_an_entry_is_named_with_what_gave_it():
    entries = {"epochs": 1, "vocab_size": {"choices": [500], "when": {"encoder": "bert"}}}
    refused(entries, r"^comp\.yaml: search_space: 'vocab_size': 'when' names \['encoder'\]",
            origins={"vocab_size": "comp.yaml: search_space"})


@pytest.fixture
def study_options(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "space.yaml").write_text(yaml.safe_dump({"params": {"epochs": 1, "batch_size": [16, 32]}}))
    return lambda: TuneOptions(competition="titanic", space="space.yaml", study="s", out_dir="runs",
                               overrides={"folds": 2, "limit_rows": 40})


def test_any_failure_while_checking_a_space_leaves_no_study(study_options, tmp_path, monkeypatch):
    """Not only a refusal: an exception of any kind while the space is checked comes before any file is made, so a
    rerun creates the study whole (trial 0 the default one, the competition recorded)."""
    import kbert.tune.study as study_module

    def broken(*args, **kwargs):
        raise AttributeError("a bug in the space's checks")

    with monkeypatch.context() as patch:
        patch.setattr(study_module, "default_params", broken)
        with pytest.raises(AttributeError):
            load_study(study_options(), create=True)
    assert not (tmp_path / "runs").exists()
    study = load_study(study_options(), create=True)[0]
    assert study.user_attrs["competition"] == "titanic" and study.get_trials()[0].user_attrs == {"default": True}


def test_trial_0_trains_the_encoder_kbert_run_chooses(study_options, tmp_path):
    """On mostly free text `kbert run` chooses minilm-l6 where it is installed: trial 0 (the default configuration)
    does too, and so does every trial of a space that does not sample the encoder."""
    from kbert.cli.run import chosen_encoder
    from kbert.pipeline.config import load_competition

    expected = chosen_encoder(load_competition("nlp-getting-started"), None)
    (tmp_path / "space.yaml").write_text(yaml.safe_dump({"params": {"epochs": 1,
                                                                    "encoder": ["bert", "minilm-l6"]}}))
    options = TuneOptions(**{**study_options().__dict__, "competition": "nlp-getting-started"})
    study = load_study(options, create=True)[0]
    assert study.get_trials()[0].system_attrs["fixed_params"]["encoder"] == expected
    assert study.user_attrs["settings"]["options"].get("encoder", "bert") == expected


def test_a_when_that_lists_no_value_is_refused():
    """`when: {pooling: []}` matched nothing: the entry was never sampled, silently."""
    with pytest.raises(KbertError, match=r"^space: 'hidden_size': its 'when' lists no value for 'pooling'$"):
        parse_space({"pooling": ["cls", "mean"], "hidden_size": {"choices": [64, 128], "when": {"pooling": []}}},
                     "space")


def test_a_value_every_trial_would_refuse_is_refused_before_the_study_and_names_its_entry(study_options, tmp_path):
    """huber_delta on a binary task (it acts only with --loss huber) failed every trial, and the study was left
    behind; pos_weight beside a loss it does not act with fails the trials that sample both, until its `when` says
    under which loss it is sampled."""
    spaces = [({"epochs": 1, "huber_delta": {"choices": [1.5, 2.0]}},
               "space.yaml: 'huber_delta' value 1.5: huber_delta 1.5 acts only with --loss huber"),
              ({"epochs": 1, "loss": ["bce", "focal"], "pos_weight": {"low": 1.0, "high": 3.0}},
               "space.yaml: 'pos_weight' value 1.0: pos_weight 1.0 acts only with a binary or multilabel task's bce")]
    for entries, message in spaces:
        (tmp_path / "space.yaml").write_text(yaml.safe_dump({"params": entries}))
        with pytest.raises(KbertError) as error:
            load_study(study_options(), create=True)
        assert str(error.value).startswith(message)
        assert not (tmp_path / "runs").exists()
    (tmp_path / "space.yaml").write_text(yaml.safe_dump({"params": {
        "epochs": 1, "loss": ["bce", "focal"], "pos_weight": {"low": 1.0, "high": 3.0, "when": {"loss": "bce"}}}}))
    assert load_study(study_options(), create=True)[0].user_attrs["competition"] == "titanic"
