"""--fusion concat|gated: the row's raw columns beside the text (features/tabular.py, models/fusion.py).

Fitted on the training rows only, unseen categories on the shared index, every task through `kbert run` and
`kbert predict`, a pretrained encoder with adapters, and a threshold on one number that the text-only model
reads as words but the fusion head learns.
"""

import json

import mlx.core as mx
import numpy as np
import pandas as pd
import pytest
import yaml

from kbert.cli import main
from kbert.errors import KbertError
from kbert.features.tabular import MISSING, UNSEEN, TabularFeatures
from kbert.models.fusion import FUSION_KINDS, Fusion, FusionConfig
from kbert.models.task_model import build_task_model
from kbert.pipeline.config import load_competition
from kbert.pipeline.data import load_competition_data
from tests.tables import write_competition
from tests.test_tasks_end_to_end import HEADS
from tests.tiny import run_tiny

ROWS = pd.DataFrame({
    "Id": range(8),
    "Age": [22.0, 38.0, np.nan, 35.0, 35.0, 54.0, 2.0, 27.0],
    "Port": ["S", "C", "S", "S", None, "S", "C", "Q"],
    "Name": [f"passenger {i}" for i in range(8)],  # an id-like column: never a category
    "Flag": [True, False, True, True, False, True, False, True],
})


def test_columns_are_fitted_on_the_training_rows_only():
    features = TabularFeatures(exclude=("Id",)).fit(ROWS.iloc[:6])
    assert features.numeric_columns_ == ["Age"] and features.categorical_columns_ == ["Port", "Flag"]
    assert features.categories_ == {"Port": ["S"], "Flag": ["False", "True"]}  # "C" once: shares index 0
    before = json.dumps(features.fitted_statistics())
    numeric, categorical = features.transform(ROWS)
    assert json.dumps(features.fitted_statistics()) == before  # transform moves nothing
    assert numeric.dtype == np.float32 and numeric.shape == (8, 2) and categorical.dtype == np.int32
    assert numeric[2].tolist() == [0.0, 1.0]  # missing: 0 with its flag
    assert numeric[[0, 1, 3], 1].tolist() == [0, 0, 0] and numeric[1, 0] > numeric[3, 0] > numeric[0, 0]
    assert categorical[:, 0].tolist() == [2, UNSEEN, 2, 2, MISSING, 2, UNSEEN, UNSEEN]  # C rare, Q unseen
    assert categorical[:, 1].tolist() == [3, 2, 3, 3, 2, 3, 2, 3]
    assert features.cardinalities == [3, 4]

    # Other validation rows, however extreme, give the same fit; other training rows do not.
    extreme = ROWS.copy()
    extreme.loc[6:, "Age"] = 1e9
    extreme.loc[6:, "Port"] = "leak"
    assert json.dumps(TabularFeatures(exclude=("Id",)).fit(extreme.iloc[:6]).fitted_statistics()) == before
    assert json.dumps(TabularFeatures(exclude=("Id",)).fit(extreme).fitted_statistics()) != before


def test_a_numeric_column_missing_on_every_training_row_is_left_out_without_numpy_warnings():
    """Its quantiles would be NaN (numpy warned 'All-NaN slice encountered' through the run's output)."""
    import warnings

    rows = ROWS.assign(Age=np.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        features = TabularFeatures(exclude=("Id",)).fit(rows)
        numeric, _ = features.transform(ROWS)
    assert features.numeric_columns_ == [] and numeric.shape == (8, 0)
    with pytest.raises(KbertError, match=r"among \['Age'\] \(the numeric ones \(Age\) are missing on every training "
                                         r"row, and every other column is id-like or free text\)"):
        TabularFeatures(columns=["Age"]).fit(rows)  # (not 'left to the text by text.numbers: words')


def test_words_only_numbers_and_tables_without_columns():
    assert TabularFeatures(exclude=("Id",), numbers=False).fit(ROWS).numeric_columns_ == []
    with pytest.raises(KbertError, match="fusion: no numeric or categorical columns"):
        TabularFeatures(exclude=("Id", "Age", "Port", "Flag")).fit(ROWS)


@pytest.mark.parametrize("kind", FUSION_KINDS)
def test_fusion_module_sizes_and_gradients(kind):
    config = FusionConfig(kind=kind, numeric=3, cardinalities=[4, 7], hidden=8)
    model = build_task_model({"model_type": "bert", "hidden_size": 16, "num_hidden_layers": 1,
                              "num_attention_heads": 2, "intermediate_size": 32, "vocab_size": 50,
                              "max_position_embeddings": 16}, "binary", "mean", fusion=config)
    assert model.fusion.output_size == {"none": 16, "concat": 24, "gated": 16}[kind]
    ids, mask = mx.array([[2, 5, 6, 3], [2, 7, 3, 0]], dtype=mx.int32), mx.array([[1, 1, 1, 1], [1, 1, 1, 0]])
    numeric = mx.array(np.random.default_rng(0).normal(size=(2, 6)).astype(np.float32))
    categorical = mx.array([[0, 6], [3, 1]], dtype=mx.int32)
    assert model(ids, mask, numeric, categorical).shape == (2,)
    if kind == "none":
        assert model.fusion.parameters() == {}
        return
    # The columns change the output, and every fusion weight gets a gradient.
    other = model(ids, mask, numeric + 1, categorical)
    assert not np.allclose(np.array(model(ids, mask, numeric, categorical)), np.array(other))

    def loss(m):
        return m(ids, mask, numeric, categorical).sum()

    import mlx.nn as nn
    from mlx.utils import tree_flatten

    grads = dict(tree_flatten(nn.value_and_grad(model, loss)(model)[1]["fusion"]))
    assert grads and all(float(mx.abs(g).sum()) > 0 for name, g in grads.items() if "embeddings" not in name)
    used = {0: [0, 3], 1: [1, 6]}  # embedding rows the batch looks up get gradients, the others none
    for j, rows in used.items():
        table = np.array(grads[f"embeddings.{j}.weight"])
        assert (np.abs(table).sum(axis=1) > 0).tolist() == [i in rows for i in range(len(table))]


def test_unknown_fusion_is_refused():
    with pytest.raises(ValueError, match="unknown fusion 'late'"):
        Fusion(FusionConfig(kind="late", numeric=1), 8)


def run(competition, tmp_path, **overrides):
    comp = load_competition(str(competition))
    return comp, run_tiny(comp, tmp_path, limit_rows=80, **overrides).run_dir


@pytest.mark.slow
@pytest.mark.parametrize("competition, fusion, extra", [
    ("titanic", "concat", {"augment": 1, "tta": 2, "epochs": 2}),
    ("house-prices-advanced-regression-techniques", "gated", {"target_transform": "log1p_standardize"}),
    (HEADS / "titanic-pclass.yaml", "gated", {}),
    (HEADS / "spaceship-spending.yaml", "concat", {}),
    (HEADS / "house-prices-overallqual.yaml", "concat", {}),
    (HEADS / "elnino.yaml", "gated", {}),
], ids=["binary", "regression", "multiclass", "multilabel", "ordinal", "timeseries"])
def test_every_task_runs_with_fusion_and_predict_reproduces_its_test_predictions(competition, fusion, extra,
                                                                                 tmp_path):
    comp, run_dir = run(competition, tmp_path, fusion=fusion, **extra)
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["head"]["fusion"] == fusion
    checkpoint = json.loads((run_dir / "folds" / "0" / "config.json").read_text())
    assert checkpoint["fusion"]["kind"] == fusion
    assert (run_dir / "folds" / "0" / "tabular.json").is_file()
    out = tmp_path / "p.csv"
    test_file = tmp_path / "test.csv"
    load_competition_data(comp).test.to_csv(test_file, index=False)
    assert main(["predict", str(run_dir), "--data", str(test_file), "--output", str(out),
                 "--tta", str(extra.get("tta", 1))]) == 0
    ours, theirs = pd.read_csv(out), pd.read_csv(run_dir / "test.csv")
    columns = [c for c in theirs.columns if c != comp.id_column]
    np.testing.assert_allclose(ours[columns].to_numpy(float), theirs[columns].to_numpy(float), rtol=1e-4, atol=1e-5)


def threshold_competition(folder):
    """1000 rows (800 to train) whose target is a sharp threshold on one number (reading > 61.8), with a category
    and a word of noise beside it: trivial for a tree, hard for a model that reads "reading: 57.31" as words."""
    rng = np.random.default_rng(0)
    n = 1000
    frame = pd.DataFrame({"row_id": np.arange(n), "reading": np.round(rng.uniform(0, 100, n), 2),
                          "colour": rng.choice(["red", "green", "blue", "amber"], n),
                          "note": rng.choice([f"w{i}" for i in range(20)], n)})
    frame["above"] = (frame["reading"] > 61.8).astype(int)
    return write_competition(folder, "threshold", frame.iloc[:800], frame.iloc[800:].drop(columns=["above"]), "above",
                             folds={"k": 2, "seed": 42}, training={"epochs": 6})


@pytest.mark.slow
def test_a_sharp_threshold_on_one_number_is_learned_with_fusion(tmp_path, capsys):
    competition = threshold_competition(tmp_path / "threshold")
    cv = {}
    for fusion in ("none", "concat"):
        result = run_tiny(competition, tmp_path, run_id=fusion, fusion=fusion, epochs=6, max_length=32)
        cv[fusion] = json.loads((result.run_dir / "metrics.json").read_text())["cv"]
    with capsys.disabled():
        print(f"\nthreshold on one number, CV accuracy: text only {cv['none']:.4f}, --fusion concat {cv['concat']:.4f}")
    assert cv["concat"] >= 0.95  # text only, printed above: 0.935 when measured
