import pytest
import yaml

from kbert.errors import KbertError
from kbert.pipeline.config import load_competition, resolve_run_config, run_config_from_dict


def test_titanic_yaml_is_complete(titanic):
    assert (titanic.id_column, titanic.target, titanic.task, titanic.metric) == ("PassengerId", "Survived", "binary",
                                                                                  "accuracy")
    assert titanic.submission_columns == {"PassengerId": "int", "Survived": "int"}
    assert titanic.folds.k == 5 and titanic.folds.stratify
    assert "{person}" in titanic.text.template


def test_cli_overrides_win_and_the_config_round_trips(titanic):
    config = resolve_run_config(titanic, {"epochs": 3, "folds": 3, "seed": 9, "learning_rate": 5e-4, "data_dir": None})
    assert (config.train.epochs, config.competition.folds.k, config.seed) == (3, 3, 9)
    assert config.train.learning_rate == 5e-4
    assert config.competition.folds.seed == titanic.folds.seed  # the split keeps the competition's seed
    assert run_config_from_dict(yaml.safe_load(yaml.safe_dump(config.to_dict()))) == config


def test_bad_settings_are_rejected(titanic, tmp_path):
    with pytest.raises(KbertError, match="unknown setting"):
        resolve_run_config(titanic, {"epocs": 3})
    with pytest.raises(KbertError, match="folds must be at least 2"):
        resolve_run_config(titanic, {"folds": 1})
    with pytest.raises(KbertError, match="epochs must be at least 1, got 0"):
        resolve_run_config(titanic, {"epochs": 0})
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: broken\ntask: binary\n")
    with pytest.raises(KbertError, match=r"broken\.yaml: missing required key 'id_column'"):
        load_competition(str(broken))
    from kbert.pipeline.config import competition_path

    broken.write_text(competition_path("titanic").read_text().replace("task: binary", "task: sorting"))
    with pytest.raises(KbertError, match="task 'sorting' is not supported"):
        load_competition(str(broken))


def test_every_named_size_resolves_to_a_buildable_config(titanic):
    from kbert.models.encoders import ARCHITECTURES, architecture
    from kbert.pipeline.fold import scratch_encoder_config

    names = [name for arch in ARCHITECTURES.values() for name in arch.presets]
    assert {"bert-tiny", "bert-mini", "bert-small", "bert-base", "modernbert-base", "modernbert-large",
            "neobert"} <= set(names)
    for name in names:
        config = resolve_run_config(titanic, {"encoder": name})
        assert config.train.learning_rate == 1e-3  # from scratch
        values = scratch_encoder_config(config, vocab_size=251)
        parsed = architecture(values["model_type"]).config.from_dict(values)
        assert parsed.vocab_size == 251
    assert resolve_run_config(titanic, {"encoder": "minilm-l6"}).train.learning_rate == 5e-5


def test_shipped_pretrained_names_are_not_size_presets():
    from kbert.models.encoders import SHIPPED, is_preset

    assert not any(is_preset(name) for name in SHIPPED)
