import re
from dataclasses import replace

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
    with pytest.raises(KbertError, match="folds must be an integer >= 2, got 1"):
        resolve_run_config(titanic, {"folds": 1})
    with pytest.raises(KbertError, match="epochs must be an integer >= 1, or null, got 0"):
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
    assert resolve_run_config(titanic, {"encoder": "minilm-l6"}).train.learning_rate == 1e-5


def test_a_size_given_for_an_encoder_it_does_not_size_is_refused():
    """A named size or a pretrained encoder keeps its own sizes: --encoder bert-tiny with hidden_size 100 trained at
    128 and recorded 100. The competition's own training: section may hold sizes for 'bert' (tweets' vocab_size)."""
    titanic, tweets = load_competition("titanic"), load_competition("nlp-getting-started")
    with pytest.raises(KbertError, match=r"^num_attention_heads sizes the BERT that --encoder bert trains from "
                                         r"scratch; encoder 'bert-tiny' has its own: drop it$"):
        resolve_run_config(titanic, {"encoder": "bert-tiny", "num_attention_heads": 3})
    with pytest.raises(KbertError, match=r"^vocab_size is the vocabulary learned for an encoder trained from scratch; "
                                         r"pretrained encoder 'minilm-l6' has its own: drop it$"):
        resolve_run_config(titanic, {"encoder": "minilm-l6", "vocab_size": 500})
    assert resolve_run_config(titanic, {"encoder": "bert-tiny", "vocab_size": 500}).model.vocab_size == 500
    # the YAML's sizes for bert are taken without a word, and recorded as the encoder uses them: not at all (a
    # bert-tiny run's config.yaml held the YAML's hidden_size 64; it trained at 128)
    assert resolve_run_config(tweets, {"encoder": "bert"}).model.vocab_size == 8000
    assert resolve_run_config(tweets, {"encoder": "minilm-l6"}).model.vocab_size == 1000
    small = replace(titanic, training={"hidden_size": 64, "num_hidden_layers": 1})
    assert resolve_run_config(small, {"encoder": "bert-tiny"}).model.hidden_size == 128
    assert resolve_run_config(small).model.hidden_size == 64


def test_epochs_and_rate_default_by_what_trains():
    """Fine-tuning every weight of a pretrained encoder: 4 epochs at 1e-5; from scratch 20 at 1e-3; adapters 20 at
    5e-4; a competition's or the command line's value wins."""
    tweets = load_competition("nlp-getting-started")
    trained = {(name, adapter): resolve_run_config(tweets, {"encoder": name, "adapter": adapter}).train
               for name, adapter in (("minilm-l6", None), ("bert", None), ("minilm-l6", "lora"))}
    assert {key: (t.epochs, t.learning_rate) for key, t in trained.items()} == {
        ("minilm-l6", None): (4, 1e-5), ("bert", None): (20, 1e-3), ("minilm-l6", "lora"): (20, 5e-4)}
    assert resolve_run_config(tweets, {"encoder": "minilm-l6", "epochs": 7}).train.epochs == 7
    assert resolve_run_config(load_competition("titanic"), {"encoder": "minilm-l6"}).train.epochs == 20


def test_a_regression_target_is_standardized_unless_another_transform_is_given(titanic):
    """A head learning raw prices (about 156,000) predicted about 16 after a few epochs: by default a numeric task's
    target is standardized on each fold's training rows; a classification task's has no transform."""
    prices = load_competition("house-prices-advanced-regression-techniques")
    plain = replace(prices, training={}, head={})
    assert resolve_run_config(plain).head.target_transform == "standardize"
    assert resolve_run_config(plain, {"target_transform": "none"}).head.target_transform == "none"
    assert resolve_run_config(prices).head.target_transform == "log1p_standardize"  # the YAML's own
    assert resolve_run_config(titanic).head.target_transform == "none"
    with pytest.raises(KbertError, match="target_transform applies to regression and timeseries tasks, not 'binary'"):
        resolve_run_config(titanic, {"target_transform": "standardize"})


def test_shipped_pretrained_names_are_not_size_presets():
    from kbert.models.encoders import SHIPPED, is_preset

    assert not any(is_preset(name) for name in SHIPPED)


NUMERIC_SECTIONS = {"": ("ModelConfig", "TrainConfig", "HeadOptions"), "folds.": ("FoldConfig",),
                    "text.": ("TextConfig",)}


def numeric_fields():
    """(setting key, is the annotation int) of every int or float field of the run's dataclasses."""
    from dataclasses import fields

    from kbert.models.adapters import AdapterConfig
    from kbert.pipeline import config

    classes = [(prefix, getattr(config, name)) for prefix, names in NUMERIC_SECTIONS.items() for name in names]
    for prefix, cls in classes + [("adapter_options.", AdapterConfig)]:
        for f in fields(cls):
            kinds = {part.strip() for part in str(f.type).replace("list[", "").replace("]", "").split("|")}
            if kinds & {"int", "float"}:
                yield prefix + f.name, "int" in kinds and "float" not in kinds


def test_every_numeric_run_setting_has_a_bound_and_its_defaults_are_inside_it():
    from dataclasses import asdict

    from kbert.models.adapters import AdapterConfig
    from kbert.pipeline.config import (FoldConfig, HeadOptions, ModelConfig, TextConfig, TrainConfig, bound_of,
                                       check_settings)

    for key, integer in numeric_fields():
        assert bound_of(key) is not None, f"{key} has no bound in its declaration (pipeline/config.py)"
        assert bound_of(key).integer == integer, key
    for values, prefix in ((asdict(ModelConfig()), ""), (asdict(TrainConfig()), ""), (asdict(HeadOptions()), ""),
                           (asdict(FoldConfig()), "folds."), (asdict(TextConfig("list")), "text."),
                           (asdict(AdapterConfig()), "adapter_options.")):
        check_settings(values, str, prefix)


def competition_yaml(tmp_path, section: str, key: str, value) -> str:
    """The corpus base competition with ``section: {key: value}`` added; returns its path."""
    from pathlib import Path

    base = Path(__file__).resolve().parent / "bad_inputs" / "base" / "competition.yaml"
    spec = yaml.safe_load(base.read_text())
    spec.setdefault(section, {})[key] = value
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return str(path)


def yaml_place(key: str, value) -> tuple[str, str, object]:
    """Where a numeric setting's key is written in a competition YAML: (section, key in it, value)."""
    from dataclasses import fields

    from kbert.pipeline.config import HeadOptions

    section, _, name = key.partition(".")
    if section in ("folds", "text"):
        return section, name, value
    if section == "adapter_options":
        return "training", "adapter_options", {name: value}
    return ("head" if key in {f.name for f in fields(HeadOptions)} else "training"), key, value


@pytest.mark.parametrize("key", sorted(key for key, _ in numeric_fields()))
def test_nan_and_infinity_are_refused_for_every_numeric_setting_from_yaml(tmp_path, key):
    """YAML's .nan, .inf and -.inf reach no training: the message names the file and the key."""
    for value in (float("nan"), float("inf"), float("-inf")):
        section, name, written = yaml_place(key, value)
        shown = f"{section}.{key}" if section in ("training", "head") else key
        with pytest.raises(KbertError, match=rf"^.*c\.yaml: {re.escape(shown)} must be .*, got {value!r}$"):
            load_competition(competition_yaml(tmp_path, section, name, written))


@pytest.mark.parametrize("overrides,message", [
    ({"learning_rate": 0.0}, "learning_rate must be a finite number > 0, or null, got 0.0"),
    ({"learning_rate": float("nan")}, "learning_rate must be a finite number > 0, or null, got nan"),
    ({"hidden_dropout_prob": 1.0}, r"hidden_dropout_prob must be a finite number in \[0, 1\), got 1.0"),
    ({"warmup_ratio": 1.0}, r"warmup_ratio must be a finite number in \[0, 1\), got 1.0"),
    ({"weight_decay": -0.01}, "weight_decay must be a finite number >= 0, got -0.01"),
    ({"label_smoothing": 1.0}, r"label_smoothing must be a finite number in \[0, 1\), got 1.0"),
    ({"focal_gamma": -1.0}, "focal_gamma must be a finite number >= 0, got -1.0"),
    ({"tta": 0}, "tta must be an integer >= 1, got 0"),
    ({"max_length": 2}, "max_length must be an integer >= 3, got 2"),
    ({"length_bucket": 0}, "length_bucket must be an integer >= 1, got 0"),
    ({"batch_size": 2.5}, "batch_size must be an integer >= 1, got 2.5"),
    ({"epochs": True}, "epochs must be an integer >= 1, or null, got True"),
    ({"augment": -1}, "augment must be an integer >= 0, got -1"),
    ({"layerwise_lr_decay": 0.0}, r"layerwise_lr_decay must be a finite number in \(0, 1\], got 0.0"),
    ({"pos_weight": [1.0, float("inf")]}, r"pos_weight must be .*, got \[1.0, inf\]"),
    ({"threshold": 1.0}, r"threshold must be a finite number in \(0, 1\) or 'tune', got 1.0"),
    ({"seed": -1}, r"seed must be an integer in \[0, 2000000\], got -1"),
    ({"limit_rows": 0}, "limit_rows must be an integer >= 1, or null, got 0"),
    ({"repeats": 0}, "repeats must be an integer >= 1, got 0"),
    ({"adapter_options": {"alpha": float("nan")}}, "adapter_options.alpha must be a finite number > 0, got nan"),
    ({"hidden_size": 100, "num_attention_heads": 3}, "hidden_size 100 is not a multiple of num_attention_heads 3"),
])
def test_out_of_range_overrides_are_refused_naming_the_setting(titanic, overrides, message):
    with pytest.raises(KbertError, match=f"^{message}$"):
        resolve_run_config(titanic, overrides)


def test_an_exponent_yaml_reads_as_text_gets_a_hint(tmp_path):
    path = competition_yaml(tmp_path, "training", "learning_rate", "1e-3")
    with pytest.raises(KbertError, match=r"c\.yaml: training\.learning_rate must be a finite number > 0, or null, "
                                         r"got '1e-3' \(text, not a number: YAML reads 1e-3 as a string; write e.g. "
                                         r"0\.001\)$"):
        load_competition(path)
    path = competition_yaml(tmp_path, "training", "epochs", "1e1")  # an integer setting: write 10, not 10.0
    with pytest.raises(KbertError, match=r"YAML reads 1e1 as a string; write e\.g\. 10\)$"):
        load_competition(path)


def test_a_key_written_twice_is_refused_naming_the_file_line_and_key(tmp_path):
    from kbert.pipeline.config import read_yaml

    path = tmp_path / "twice.yaml"
    path.write_text("name: a\ntraining:\n  epochs: 3\n  batch_size: 8\n  epochs: 5\n")
    with pytest.raises(KbertError, match=r"twice\.yaml: invalid YAML at line 5, column 3: key 'epochs' appears twice "
                                         r"\(first at line 3\)$"):
        read_yaml(path)
    path.write_text("training: {epochs: 3, epochs: 5}\n")
    with pytest.raises(KbertError, match=r"line 1, column 23: key 'epochs' appears twice \(first at line 1\)$"):
        read_yaml(path)
    path.write_text("base: &base {epochs: 3, batch_size: 8}\nrun:\n  <<: *base\n  epochs: 5\nother: {a: 1, b: 2}\n")
    assert read_yaml(path)["run"] == {"epochs": 5, "batch_size": 8}  # a merge key's values may be overridden


def test_libyamls_loader_reads_every_bundled_yaml_as_the_python_loader_does_and_refuses_the_same_files():
    """read_yaml parses on libyaml where PyYAML has it (pipeline/config.py FastUniqueKeyLoader): the same values as
    the pure-Python loader, and the same unique-key check (a refused file gets the pure-Python loader's message)."""
    from pathlib import Path

    from kbert.pipeline.config import FastUniqueKeyLoader, UniqueKeyLoader

    assert FastUniqueKeyLoader.__mro__[2] is getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    root = Path(__file__).resolve().parent.parent
    files = [*root.glob("competitions/*.yaml"), *root.glob("tests/bad_inputs/*/*.yaml"), *root.glob("docs/*.yaml")]
    assert len(files) > 10
    for path in files:
        text = path.read_text(encoding="utf-8")
        try:
            expected = yaml.load(text, Loader=UniqueKeyLoader)
        except yaml.YAMLError:
            with pytest.raises(yaml.YAMLError):
                yaml.load(text, Loader=FastUniqueKeyLoader)
            continue
        assert yaml.load(text, Loader=FastUniqueKeyLoader) == expected, path
    with pytest.raises(yaml.constructor.ConstructorError, match="key 'a' appears twice"):
        yaml.load("x: {a: 1, a: 2}\n", Loader=FastUniqueKeyLoader)


@pytest.mark.parametrize("edit,message", [
    ({"text": {"serializer": "list", "columns": ["Name", "Sex", "Name"]}}, "text.columns lists 'Name' twice"),
    ({"text": {"serializer": "list", "truncate": "priority", "priority": ["Age", "Age"]}},
     "text.priority lists 'Age' twice"),
    ({"task": "multilabel", "target": ["Survived", "Pclass", "Survived"]}, "target lists 'Survived' twice"),
    ({"task": "multiclass", "target": "Pclass", "classes": [1, 2, 2, 3]}, "classes lists 2 twice"),
    ({"training": 5}, "'training' must be a mapping, got 5"),
])
def test_a_column_or_class_listed_twice_is_refused(tmp_path, edit, message):
    from pathlib import Path

    base = Path(__file__).resolve().parent / "bad_inputs" / "base" / "competition.yaml"
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({**yaml.safe_load(base.read_text()), **edit}, sort_keys=False))
    with pytest.raises(KbertError, match=rf"c\.yaml: {message}$"):
        load_competition(str(path))


def test_run_config_files_are_checked_like_yaml_and_flags(titanic, tmp_path):
    """`kbert run --config`: a flat file names its key, a resolved config (config.yaml, best.yaml) its section."""
    from kbert.pipeline.config import run_config_from_file

    flat = tmp_path / "flat.yaml"
    flat.write_text("competition: titanic\nepochs: 2\nlearning_rate: .nan\n")
    with pytest.raises(KbertError, match=r"flat\.yaml: learning_rate must be a finite number > 0, or null, got nan$"):
        run_config_from_file(flat)
    resolved = resolve_run_config(titanic).to_dict()
    resolved["train"]["warmup_ratio"] = float("inf")
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(resolved, sort_keys=False))
    with pytest.raises(KbertError, match=r"config\.yaml: train\.warmup_ratio must be a finite number in \[0, 1\), "
                                         r"got inf$"):
        run_config_from_file(path)
    resolved["train"]["warmup_ratio"] = 0.1
    resolved["competition"]["folds"]["k"] = 1
    path.write_text(yaml.safe_dump(resolved, sort_keys=False))
    with pytest.raises(KbertError, match=r"config\.yaml: competition\.folds\.k must be an integer >= 2, got 1$"):
        run_config_from_file(path)


def test_a_resolved_config_names_its_unknown_keys_and_is_checked_as_its_competition_yaml_is(titanic, tmp_path):
    """A key no section has said 'TrainConfig.__init__() got an unexpected keyword argument'; a competition whose
    YAML would be refused (a column of no dtype, three classes for a binary task) trained; so did a size the named
    encoder never used."""
    from copy import deepcopy

    from kbert.pipeline.config import run_config_from_file

    resolved = resolve_run_config(titanic, {"encoder": "bert-tiny"}).to_dict()
    path = tmp_path / "config.yaml"
    for edit, message in (
            (lambda c: c["train"].update(epochz=3), r"unknown key 'train\.epochz' \(did you mean 'epochs'\?\)"),
            (lambda c: c["competition"]["folds"].update(kk=3), r"unknown key 'competition\.folds\.kk'"),
            (lambda c: c.update(seeed=3), r"unknown key 'seeed' \(did you mean 'seed'\?\)"),
            (lambda c: c.update(model=[1, 2]), r"model must be a mapping, got \[1, 2\]$"),
            (lambda c: c["competition"].update(folds=None), r"competition\.folds must be a mapping, got None$"),
            (lambda c: c.update(baseline="hgb"), r"a baseline's config \(baseline: hgb\); kbert baseline trains one"),
            (lambda c: c["competition"]["columns"].update(Age="complex"),
             r"competition: columns\.Age has dtype 'complex'"),
            (lambda c: c["competition"].update(classes=[0, 1, 2]),
             r"competition: a binary task's classes are \[negative, positive\], got \[0, 1, 2\]$"),
            (lambda c: c["train"].update(epochs=None),  # (a traceback in the first fold, a half-written folder)
             r"train\.epochs is null: a resolved config records the number the run used; give it$"),
            (lambda c: c["head"].update(target_transform="log1p"),  # every check resolve_run_config makes
             r"target_transform applies to regression and timeseries tasks, not 'binary'$"),
            (lambda c: c["head"].update(target_transform="auto"),
             r"head\.target_transform is auto: a resolved config records the transform the run used; give it$"),
            (lambda c: c["train"].update(pseudo_threshold=0.7), r"--pseudo-threshold picks the teacher's confident"),
            (lambda c: c["competition"]["folds"].update(purge=3), r"folds\.purge 3 acts only with time-series folds"),
            (lambda c: c["head"].update(huber_delta=3.0),  # (a binary task: the flags' refusal, now here too)
             r"huber_delta 3\.0 acts only with --loss huber; here it would be ignored: drop it$"),
            (lambda c: c["model"].update(num_attention_heads=3),
             r"model\.num_attention_heads 3: encoder 'bert-tiny' has its own, and a run of it records 4; put that "
             r"back$")):
        edited = deepcopy(resolved)
        edit(edited)
        path.write_text(yaml.safe_dump(edited, sort_keys=False))
        with pytest.raises(KbertError, match=rf"^{path}: {message}"):
            run_config_from_file(path)
    path.write_text(yaml.safe_dump(resolved, sort_keys=False))
    assert run_config_from_file(path).to_dict() == resolved  # the run's own round trip
    with pytest.raises(KbertError, match=r"edit it instead of passing \['--lr'\] \(only --data-dir, --limit-rows, "
                                         r"--out, --permute-target, --seed, --seeds, --submissions-dir may change"):
        run_config_from_file(path, {"learning_rate": 0.1})  # named as typed (it said 'learning_rate')
    (tmp_path / "short.yaml").write_text("competition: titanic\nlr: 0.1\n")
    with pytest.raises(KbertError, match=r"unknown setting\(s\) 'lr' \(did you mean 'learning_rate', the setting of "
                                         r"--lr\?\)"):
        run_config_from_file(tmp_path / "short.yaml")


CHOICES = [("model", "pooling"), ("model", "spm_normalization"), ("model", "adapter_checkpoint"),
           ("head", "target_transform"), ("head", "fusion"), ("train", "precision"), ("train", "device")]


@pytest.mark.parametrize("section,key", CHOICES)
def test_every_choice_setting_refuses_an_unknown_word_wherever_it_is_set(titanic, tmp_path, section, key):
    """Flags (overrides), a flat --config file and a resolved config.yaml all name the setting and the words it
    takes; the default of each is one of them."""
    from kbert.pipeline.config import choices_of, run_config_from_file

    words = choices_of(key)
    assert getattr(getattr(resolve_run_config(titanic), section), key) in words
    known = rf"'bogus' is unknown; known: {', '.join(words)}$"
    with pytest.raises(KbertError, match=rf"^{key} {known}"):
        resolve_run_config(titanic, {key: "bogus"})
    flat = tmp_path / "flat.yaml"
    flat.write_text(f"competition: titanic\n{key}: bogus\n")
    with pytest.raises(KbertError, match=rf"flat\.yaml: {key} {known}"):
        run_config_from_file(flat)
    resolved = resolve_run_config(titanic).to_dict()
    resolved[section][key] = "bogus"
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(resolved, sort_keys=False))
    with pytest.raises(KbertError, match=rf"config\.yaml: {section}\.{key} {known}"):
        run_config_from_file(path)


@pytest.mark.parametrize("key", ["numeric", "truncate", "numbers", "missing"])
def test_text_choices_are_checked_in_the_competition_file_and_in_a_resolved_config(titanic, tmp_path, key):
    from kbert.pipeline.config import choices_of, competition_path, run_config_from_file

    known = rf"'bogus' is unknown; known: {', '.join(choices_of(f'text.{key}'))}$"
    data = yaml.safe_load(competition_path("titanic").read_text())
    data["text"][key] = "bogus"
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(KbertError, match=rf"c\.yaml: text\.{key} {known}"):
        load_competition(str(path))
    resolved = resolve_run_config(titanic).to_dict()
    resolved["competition"]["text"][key] = "bogus"
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(resolved, sort_keys=False))
    with pytest.raises(KbertError, match=rf"config\.yaml: competition\.text\.{key} {known}"):
        run_config_from_file(path)


@pytest.mark.parametrize("section,refusal", [("training", "competition.training: unknown setting(s) 'bogus'"),
                                              ("head", "competition.head: unknown key(s) ['bogus']; known: ")])
def test_unknown_keys_of_a_resolved_configs_competition_sections_are_refused(titanic, tmp_path, section, refusal):
    """As in the competition's own YAML (a run's config.yaml took them, and wrote them into the next run's)."""
    from kbert.pipeline.config import run_config_from_file

    resolved = resolve_run_config(titanic).to_dict()
    resolved["competition"][section]["bogus"] = 1
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(resolved, sort_keys=False))
    with pytest.raises(KbertError, match=re.escape(f"config.yaml: {refusal}")):
        run_config_from_file(path)


SETTINGS_CLASSES = ("TextConfig", "FoldConfig", "ModelConfig", "TrainConfig", "HeadOptions", "RunConfig")


@pytest.mark.parametrize("name", SETTINGS_CLASSES)
def test_every_run_setting_is_declared_once_with_its_help(name):
    """Each field of the run's settings dataclasses is made by ``setting``: help beside its default, a flag only
    where `kbert run` offers one, choices and a bound only where a word or a number is checked."""
    from dataclasses import fields

    from kbert.pipeline import config

    for f in fields(getattr(config, name)):
        if f.name in ("competition", "model", "train", "head"):  # RunConfig's sections
            continue
        meta = f.metadata
        assert meta.get("help"), f"{name}.{f.name} is not declared with setting(help=...)"
        assert not meta["flag"] or meta["flag"].startswith("--"), f.name
        assert not (meta["choices"] and meta["bound"]), f.name


CHOICE_CONSTANTS = [("kbert.models.pooling", "POOLING_KINDS"), ("kbert.models.pooling", "EMBED_POOLINGS"),
                    ("kbert.models.fusion", "FUSION_KINDS"), ("kbert.models.spm", "NORMALIZATIONS"),
                    ("kbert.pipeline.precision", "PRECISIONS"), ("kbert.pipeline.precision", "DEVICES"),
                    ("kbert.features.generic", "NUMERIC_MODES"), ("kbert.features.generic", "MISSING_MODES"),
                    ("kbert.tune.options", "PRUNERS"), ("kbert.auto.plan", "PRESETS")]  # a mapping: its keys


@pytest.mark.parametrize("module,name", CHOICE_CONSTANTS)
def test_choices_read_from_the_owning_module_equal_its_constant(module, name):
    """``words_of`` reads a constant from its module's source (a model module loads MLX on import): the words
    are the module's own, and a name that is not written out there is one line naming the file."""
    import importlib

    from kbert.pipeline.config import words_of

    assert words_of(module, name) == tuple(getattr(importlib.import_module(module), name))
    with pytest.raises(KbertError, match=r"pooling\.py: no NO_SUCH_WORDS = \(\.\.\.\) at the top level$"):
        words_of("kbert.models.pooling", "NO_SUCH_WORDS")


def test_the_settings_reference_is_current():
    """docs/settings.md is generated from the declarations; regenerate it with python docs/make_settings.py."""
    from pathlib import Path

    from kbert.pipeline.config import settings_markdown

    path = Path(__file__).resolve().parent.parent / "docs" / "settings.md"
    assert path.read_text(encoding="utf-8") == settings_markdown(), "run python docs/make_settings.py"
    assert "| `pooling` | `--pooling` | `cls` | `cls`, `mean`, `max`, `attention`, `weighted-layers`, `cls-last4` |" \
        in settings_markdown()


def test_a_competition_value_of_the_wrong_type_is_named_with_the_type_it_needs():
    """check_types' reading of the annotations: what fits, and how the message says what was needed."""
    from typing import Any

    from kbert.pipeline.config import fits, type_words

    for value, hint, ok in ((["a"], list[str] | None, True), (None, list[str] | None, True), ("a", list[str], False),
                            ([1], list[str], False), ({"c": {"x": "y"}}, dict[str, dict], True),
                            ({"c": "y"}, dict[str, dict], False), ({1: 2}, dict[str, Any], False), (True, float, False),
                            (3, float, True), (3.0, int, False), ("x", str | list[str], True)):
        assert fits(value, hint) == ok, (value, hint)
    assert type_words(list[str] | None) == "a list of text, or null"
    assert type_words(dict[str, dict]) == "a mapping from text to a mapping"
    assert type_words(list[Any]) == "a list"


def test_augmentation_is_what_the_serializer_draws():
    """The titanic serializer ignores text.jitter: --augment/--tta on it with shuffling and phrasing off were
    accepted and drew identical texts (kbert pretrain's default 4 variants were copies)."""
    from kbert.pipeline.config import TextConfig, augments

    off = {"shuffle_columns": False, "paraphrase": False}
    assert not augments(TextConfig(serializer="titanic", **off))  # (its jitter default: ignored)
    assert augments(TextConfig(serializer="list", **off))  # numbers jittered
    assert not augments(TextConfig(serializer="list", numeric="bins", **off))
    assert not augments(TextConfig(serializer="list", jitter=0, **off))
    assert augments(TextConfig(serializer="titanic"))
