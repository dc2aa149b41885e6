import json

import numpy as np
import pytest
from sklearn.metrics import accuracy_score, log_loss

from kbert.errors import KbertError
from kbert.pipeline.calibration import apply_temperature, cross_fitted_temperature, fit_temperature, probabilities

N = 20_000


def miscalibrated(num_classes: int, factor: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Labels drawn from calibrated logits z; returned logits are factor * z (factor > 1: overconfident)."""
    rng = np.random.default_rng(seed)
    if num_classes == 2:
        z = 2.0 * rng.standard_normal(N)
        y = (rng.random(N) < 1.0 / (1.0 + np.exp(-z))).astype(np.int64)
    else:
        z = 2.0 * rng.standard_normal((N, num_classes))
        p = np.exp(z - z.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        y = (rng.random(N)[:, None] > np.cumsum(p, axis=1)).sum(axis=1)
    return factor * z, y


def predictions(logits: np.ndarray) -> np.ndarray:
    return (logits > 0).astype(np.int64) if logits.ndim == 1 else logits.argmax(axis=1)


def score(logits: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    probs = probabilities(logits)
    labels = list(range(2 if logits.ndim == 1 else logits.shape[1]))
    return log_loss(y, probs, labels=labels), accuracy_score(y, predictions(logits))


@pytest.mark.parametrize("num_classes", [2, 3])
@pytest.mark.parametrize("factor", [3.0, 0.3])
def test_fitted_temperature_recovers_factor_and_lowers_log_loss(num_classes, factor):
    logits, y = miscalibrated(num_classes, factor)
    temperature = fit_temperature(logits, y)
    assert temperature == pytest.approx(factor, rel=0.05)
    calibrated = apply_temperature(logits, temperature)
    np.testing.assert_allclose(calibrated, logits / temperature)
    loss_before, acc_before = score(logits, y)
    loss_after, acc_after = score(calibrated, y)
    assert loss_after < loss_before
    assert acc_after == acc_before
    np.testing.assert_array_equal(predictions(calibrated), predictions(logits))


@pytest.mark.parametrize("num_classes", [2, 3])
@pytest.mark.parametrize("factor", [3.0, 0.3])
def test_cross_fitted_temperature_lowers_log_loss(num_classes, factor):
    logits, y = miscalibrated(num_classes, factor, seed=1)
    fold = np.random.default_rng(2).integers(0, 5, N)
    calibrated = cross_fitted_temperature(logits, y, fold)
    assert calibrated.shape == logits.shape
    # Each fold is divided by its own scalar, fitted without that fold's rows.
    for f in range(5):
        rows = fold == f
        ratio = logits[rows] / calibrated[rows]
        np.testing.assert_allclose(ratio, ratio.flat[0])
        assert ratio.flat[0] == pytest.approx(fit_temperature(logits[~rows], y[~rows]))
    loss_before, acc_before = score(logits, y)
    loss_after, acc_after = score(calibrated, y)
    assert loss_after < loss_before
    assert acc_after == acc_before


def test_temperature_is_about_one_when_already_calibrated():
    logits, y = miscalibrated(2, 1.0, seed=3)
    assert fit_temperature(logits, y) == pytest.approx(1.0, rel=0.1)


def test_probabilities_are_stable_and_normalised():
    binary = probabilities(np.array([-1000.0, 0.0, 1000.0]))
    np.testing.assert_allclose(binary, [0.0, 0.5, 1.0])
    multi = probabilities(np.array([[1000.0, 0.0, -1000.0], [1.0, 1.0, 1.0]]))
    assert multi.dtype == np.float64 and np.isfinite(multi).all()
    np.testing.assert_allclose(multi.sum(axis=1), 1.0)
    np.testing.assert_allclose(multi[1], 1.0 / 3.0)


def test_bad_inputs_raise():
    with pytest.raises(KbertError):
        apply_temperature(np.zeros(3), 0.0)
    with pytest.raises(KbertError):
        cross_fitted_temperature(np.zeros(4), np.array([0, 1, 0, 1]), np.zeros(4, dtype=int))
    with pytest.raises(KbertError):
        fit_temperature(np.zeros((4, 3)), np.zeros(5, dtype=int))


def test_a_calibrated_run_says_its_cv_is_calibrated_and_gives_the_uncalibrated_one(tmp_path, capsys):
    """The CV of a --calibrate run is of the cross-fitted calibrated OOF, its folds' scores are not: the closing
    line said neither (CV log_loss 1.09 beside folds 1.34 and 1.87); a temperature at its search bound is noted."""
    from types import SimpleNamespace

    from kbert.cli.common import print_run_result
    from kbert.pipeline.calibration import temperature_at_bound

    assert temperature_at_bound(19.99999) and temperature_at_bound(0.05) and not temperature_at_bound(1.3)
    (tmp_path / "metrics.json").write_text(json.dumps({"calibration": {"temperature": 19.99999,
                                                                       "cv_uncalibrated": 1.6048}}))
    result = SimpleNamespace(metric="log_loss", cv_score=1.0919, fold_scores=[1.3413, 1.8684], run_dir=tmp_path,
                             submission_path="s.csv", seconds=3.0)
    print_run_result(result)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("CV log_loss: 1.0919 calibrated (") and \
        lines[0].endswith("), 1.6048 uncalibrated  (folds, uncalibrated: 1.3413, 1.8684)")
    assert lines[1].startswith("note: the temperature 20 is at the end of its search range")
