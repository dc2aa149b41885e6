"""Every task through the whole pipeline on small slices of real data: artifacts, submissions, no leakage."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kbert.pipeline.config import load_competition
from kbert.pipeline.data import load_competition_data
from kbert.pipeline.run import run_competition
from tests.tiny import run_tiny, tiny_config

HEADS = Path(__file__).resolve().parent.parent / "benchmarks" / "heads"


def run(competition: str, tmp_path, limit_rows: int = 80, **overrides):
    comp = load_competition(competition)
    result = run_tiny(comp, tmp_path, limit_rows=limit_rows, **overrides)
    return comp, result, json.loads((result.run_dir / "metrics.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize("competition, prediction_columns", [
    (str(HEADS / "titanic-pclass.yaml"), ["1", "2", "3"]),
    (str(HEADS / "spaceship-spending.yaml"), ["spent_RoomService", "spent_FoodCourt", "spent_ShoppingMall",
                                              "spent_Spa", "spent_VRDeck"]),
    (str(HEADS / "house-prices-overallqual.yaml"), [str(q) for q in range(1, 11)]),
    (str(HEADS / "elnino.yaml"), ["h1", "h2", "h3"]),
])
def test_each_task_writes_predictions_and_a_submission(competition, prediction_columns, tmp_path):
    comp, result, metrics = run(competition, tmp_path)
    assert np.isfinite(metrics["cv"]) and metrics["task"] == comp.task
    oof = pd.read_csv(result.run_dir / "oof.csv")
    assert list(oof.columns) == [comp.id_column, *prediction_columns] and len(oof) == 80
    covered = pd.read_csv(result.run_dir / "folds.csv")["fold"].to_numpy() >= 0  # time series: not the first block
    assert oof.loc[covered, prediction_columns].notna().all().all()
    assert oof.loc[~covered, prediction_columns].isna().all().all()
    if comp.task in ("multiclass", "ordinal"):
        np.testing.assert_allclose(oof[prediction_columns].sum(axis=1), 1.0, atol=1e-6)
    test = load_competition_data(comp).test
    submission = pd.read_csv(result.submission_path)
    assert list(submission.columns) == list(comp.submission_columns)
    assert submission[comp.id_column].tolist() == test[comp.id_column].tolist()
    if comp.task == "multiclass":
        assert set(submission["Pclass"]) <= {1, 2, 3}
    if comp.task == "ordinal":
        assert set(submission["OverallQual"]) <= set(range(1, 11))
    assert np.load(result.run_dir / "outputs.npz")["oof"].shape[0] == 80


@pytest.mark.slow
def test_house_prices_submission_is_on_the_price_scale_and_transform_is_fitted_per_fold(tmp_path):
    comp, result, metrics = run("house-prices-advanced-regression-techniques", tmp_path, limit_rows=120)
    assert metrics["metric"] == "rmse_log" and metrics["greater_is_better"] is False
    submission = pd.read_csv(result.submission_path)
    assert len(submission) == 1459 and list(submission.columns) == ["Id", "SalePrice"]
    assert submission["SalePrice"].between(1e4, 1e6).all()  # original scale, not log or standardized
    train = load_competition_data(comp).train.iloc[:120]
    folds = pd.read_csv(result.run_dir / "folds.csv")["fold"].to_numpy()
    log_price = np.log1p(train["SalePrice"].to_numpy())
    for k in (0, 1):
        saved = json.loads((result.run_dir / "folds" / str(k) / "config.json").read_text())["target_transform"]
        assert saved["kind"] == "log1p_standardize"
        assert saved["center"][0] == pytest.approx(log_price[folds != k].mean())  # training rows of the fold only
        assert saved["center"][0] != pytest.approx(log_price.mean())
        assert saved["floor"] == [train["SalePrice"].to_numpy()[folds != k].min()]  # rmse_log: the training floor


@pytest.mark.slow
def test_calibration_and_a_tuned_threshold_leave_accuracy_honest(tmp_path):
    _, result, metrics = run("titanic", tmp_path, limit_rows=120, calibrate=True, threshold="tune")
    calibration = metrics["calibration"]
    assert calibration["temperature"] > 0
    assert metrics["cv"] == pytest.approx(calibration["cv_uncalibrated"])  # scaling logits keeps accuracy
    assert 0.05 <= metrics["threshold"]["tuned_on_oof"][0] <= 0.95
    assert metrics["threshold"]["cv_at_tuned_threshold_optimistic"] >= metrics["cv"] - 1e-12
    per_fold = metrics["threshold"]["cross_fitted_per_fold"]
    assert len(per_fold) == 2 and all(0.05 <= t <= 0.95 for t in per_fold)
    assert metrics["threshold"]["cv_cross_fitted"] <= metrics["threshold"]["cv_at_tuned_threshold_optimistic"] + 1e-12
    assert set(pd.read_csv(result.submission_path)["Survived"]) <= {0, 1}


def test_metric_that_does_not_fit_the_task_is_refused(tmp_path):
    import yaml

    from kbert.errors import KbertError

    data = yaml.safe_load((HEADS / "elnino.yaml").read_text())
    data["metric"] = "accuracy"
    data["data_dir"] = str(HEADS / "data" / "elnino")
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(KbertError, match="metric 'accuracy' scores labels"):
        run(str(path), tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("competition, target, values", [
    ("spaceship-titanic", "Transported", {True, False}),
    ("nlp-getting-started", "target", {0, 1}),
])
def test_bundled_binary_competitions_run_from_yaml_alone(competition, target, values, tmp_path):
    comp, result, metrics = run(competition, tmp_path, limit_rows=100)
    submission = pd.read_csv(result.submission_path)
    assert list(submission.columns) == list(comp.submission_columns)
    assert len(submission) == len(load_competition_data(comp).test)
    assert set(submission[target]) <= values
    if competition == "nlp-getting-started":
        assert "tuned_on_oof" in metrics["threshold"]  # F1 with threshold: tune


@pytest.mark.slow
def test_show_text_prints_examples_with_their_targets():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "kbert.cli", "show-text", "titanic", "--n", "2"],
                         capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parent.parent)
    assert out.returncode == 0, out.stderr
    assert "[1] Survived=0" in out.stdout and "A man with the title mister" in out.stdout
    assert "891 training rows" in out.stdout


@pytest.mark.slow
def test_token_budget_is_reported_and_overflow_warned(tmp_path):
    comp = load_competition("house-prices-advanced-regression-techniques")
    config = tiny_config(comp, tmp_path, limit_rows=60, max_length=32)
    lines = []
    result = run_competition(config, run_id="t", progress=False, log=lines.append)
    tokens = json.loads((result.run_dir / "metrics.json").read_text())["tokens"]
    assert tokens["max_length"] == 32 and tokens["mean_tokens"] > 32 and tokens["truncated_rows"] == 60
    assert any(line.startswith("warning: 60 of 60 rows (100.0%) exceed --max-length 32") for line in lines)


@pytest.mark.slow
def test_permute_target_shuffles_labels_but_keeps_their_distribution(tmp_path, monkeypatch):
    import kbert.pipeline.run as run_module

    seen = {}
    original = run_module.encode_targets

    def spy(train, comp):
        seen["targets"] = train[comp.target].to_numpy().copy()
        return original(train, comp)

    monkeypatch.setattr(run_module, "encode_targets", spy)
    _, result, _ = run("titanic", tmp_path, limit_rows=120, permute_target=True)
    real = load_competition_data(load_competition("titanic")).train["Survived"].to_numpy()[:120]
    assert sorted(seen["targets"]) == sorted(real) and not np.array_equal(seen["targets"], real)
    assert "permute_target: true" in (result.run_dir / "config.yaml").read_text()


@pytest.mark.slow
def test_priority_truncation_drops_whole_low_priority_columns(tmp_path, monkeypatch):
    from dataclasses import replace

    import kbert.pipeline.fold as fold_module
    from kbert.models.tokenizer import token_lengths

    encoded = []
    original = fold_module.encode
    monkeypatch.setattr(fold_module, "encode",
                        lambda tok, texts, n: encoded.append((tok, texts)) or original(tok, texts, n))
    comp = load_competition("house-prices-advanced-regression-techniques")
    comp = replace(comp, text=replace(comp.text, truncate="priority"))
    config = tiny_config(comp, tmp_path, limit_rows=60, max_length=32)
    lines = []
    run_competition(config, run_id="t", progress=False, log=lines.append)
    assert any("lowest-priority columns are dropped" in line for line in lines)
    assert len(encoded) == 6  # train, valid, test for each of 2 folds
    for tokenizer, texts in encoded:
        assert token_lengths(tokenizer, texts).max() <= 32  # nothing is cut mid-column by the tokenizer
        assert all(t.startswith("OverallQualWords: ") and "OverallCondWords" not in t for t in texts)


@pytest.mark.slow
def test_repeated_folds_augmentation_and_tta(tmp_path, monkeypatch):
    import kbert.pipeline.fold as fold_module

    seen = []
    original = fold_module.train_fold
    monkeypatch.setattr(fold_module, "train_fold", lambda model, data, *a, **k: seen.append(data) or
                        original(model, data, *a, **k))
    comp, result, metrics = run("titanic", tmp_path, limit_rows=80, repeats=2, augment=2, tta=3, epochs=3)
    folds = pd.read_csv(result.run_dir / "folds.csv")
    assert list(folds.columns) == ["PassengerId", "fold", "fold_repeat1"]
    assert (folds["fold"] != folds["fold_repeat1"]).any()  # a second, different split
    assert [(f["repeat"], f["fold"]) for f in metrics["folds"]] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert sorted(p.name for p in (result.run_dir / "folds").iterdir()) == ["r0-0", "r0-1", "r1-0", "r1-1"]
    assert pd.read_csv(result.run_dir / "oof.csv")["Survived"].notna().all()
    assert len(seen) == 4
    for data in seen:
        assert len(data.train_variants) == 2 and len(data.valid_tta) == 2 and len(data.test_tta) == 2
        changed = np.mean([not np.array_equal(a, b) for a, b in zip(data.train_tokens, data.train_variants[0])])
        assert changed > 0.5  # augmented text differs from the plain text for most rows
        assert len(data.train_variants[0]) == len(data.train_tokens)
