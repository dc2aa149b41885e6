"""`kbert run --seeds N`: N training seeds on the same folds, averaged into one member."""

import json

import numpy as np
import pandas as pd
import pytest

from kbert.cli import main
from kbert.pipeline.artifacts import fold_names
from kbert.pipeline.data import load_competition_data
from kbert.pipeline.run import run_competition
from tests.tiny import tiny_config


def run(tmp_path, run_id: str, **overrides):
    config = tiny_config("titanic", tmp_path, epochs=2, limit_rows=120, **overrides)
    return config, run_competition(config, run_id=run_id, progress=False, log=lambda _: None)


def fold_outputs(run_dir, name: str) -> dict:
    return dict(np.load(run_dir / "folds" / name / "outputs.npz"))


@pytest.mark.slow
def test_three_seeds_share_the_folds_and_average_into_one_member(tmp_path):
    config, result = run(tmp_path, "three", seeds=3)
    run_dir = result.run_dir
    assert fold_names(config) == ["0", "1", "0-s1", "1-s1", "0-s2", "1-s2"]
    assert sorted(p.name for p in (run_dir / "folds").iterdir()) == sorted(fold_names(config))

    # Each seed's fold k predicts the same validation rows; the OOF of a row is their mean over the seeds.
    folds = pd.read_csv(run_dir / "folds.csv")["fold"].to_numpy()
    oof = pd.read_csv(run_dir / "oof.csv")["Survived"].to_numpy()
    test = pd.read_csv(run_dir / "test.csv")["Survived"].to_numpy()
    test_sum = np.zeros_like(test)
    for k in range(2):
        seeds = [fold_outputs(run_dir, name) for name in (f"{k}", f"{k}-s1", f"{k}-s2")]
        valid = np.mean([s["valid_predictions"] for s in seeds], axis=0)
        np.testing.assert_allclose(oof[folds == k], valid.reshape(-1), rtol=1e-6)
        test_sum += np.sum([s["test_predictions"].reshape(-1) for s in seeds], axis=0)
        assert not np.allclose(seeds[0]["valid_predictions"], seeds[1]["valid_predictions"])  # other seeds
    np.testing.assert_allclose(test, test_sum / 6, rtol=1e-6)

    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert sorted(metrics["seed_cv"]) == ["42", "43", "44"]
    assert [r["seed"] for r in metrics["folds"]] == [42, 42, 43, 43, 44, 44]

    # The first seed's folds are exactly a one-seed run's, and seed 43 alone is a one-seed run with --seed 43.
    _, one = run(tmp_path, "one", seeds=1)
    _, other = run(tmp_path, "other", seed=43)
    for k in range(2):
        np.testing.assert_array_equal(fold_outputs(run_dir, str(k))["valid_outputs"],
                                      fold_outputs(one.run_dir, str(k))["valid_outputs"])
        np.testing.assert_array_equal(fold_outputs(run_dir, f"{k}-s1")["valid_outputs"],
                                      fold_outputs(other.run_dir, str(k))["valid_outputs"])
    assert abs(metrics["seed_cv"]["42"] - one.cv_score) < 1e-12
    assert abs(metrics["seed_cv"]["43"] - other.cv_score) < 1e-12

    # kbert predict uses every seed's fold models: it reproduces the run's test.csv.
    test_file = tmp_path / "test.csv"
    load_competition_data(config.competition).test.to_csv(test_file, index=False)
    out = tmp_path / "predicted.csv"
    assert main(["predict", str(run_dir), "--data", str(test_file), "--output", str(out)]) == 0
    np.testing.assert_allclose(pd.read_csv(out)["Survived"].to_numpy(), test, rtol=1e-4, atol=1e-6)


def test_seeds_must_be_a_positive_whole_number(capsys):
    assert main(["run", "titanic", "--seeds", "0"]) == 2
    assert "--seeds" in capsys.readouterr().err
