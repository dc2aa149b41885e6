"""Each metric against scikit-learn / scipy or a plain reference loop, on seeded random inputs."""

import warnings

import numpy as np
import pytest
from scipy.stats import rankdata, spearmanr
from sklearn import metrics as skm

from kbert.errors import KbertError
from kbert.pipeline.metrics import KINDS, METRIC_NAMES, METRICS, Metric, get_metric
from kbert.pipeline.predictions import score

N = 200


def rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def probabilities(r: np.random.Generator, n: int, c: int) -> np.ndarray:
    logits = r.normal(size=(n, c))
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def binary_case(seed: int):
    r = rng(seed)
    return r.integers(0, 2, N), r.random(N)


def multiclass_case(seed: int, c: int = 5):
    r = rng(seed)
    return r.integers(0, c, N), probabilities(r, N, c)


def multilabel_case(seed: int, labels: int = 4):
    r = rng(seed)
    return r.integers(0, 2, (N, labels)), r.random((N, labels))


def value_case(seed: int, shape, positive: bool = False):
    r = rng(seed)
    if positive:
        targets = r.lognormal(3.0, 1.0, shape)
        return targets, targets * r.lognormal(0.0, 0.3, shape)
    targets = r.normal(2.0, 3.0, shape)
    return targets, targets + r.normal(0.0, 1.5, shape)


def close(a: float, b: float) -> None:
    assert a == pytest.approx(b, rel=1e-12, abs=1e-12)


# --- registry, directions, kinds -------------------------------------------------------------------------------

def test_names_directions_and_kinds():
    assert set(METRIC_NAMES) == {"accuracy", "f1", "f1_macro", "f1_micro", "mcc", "qwk", "roc_auc", "log_loss",
                                 "rmse", "mae", "r2", "rmsle", "rmse_log", "spearman", "map@K",
                                 "top_k_accuracy@K"}
    lower = {"log_loss", "rmse", "mae", "rmsle", "rmse_log"}
    labels = {"accuracy", "f1", "f1_macro", "f1_micro", "mcc", "qwk"}
    values = {"rmse", "mae", "r2", "rmsle", "rmse_log", "spearman"}
    for name, metric in METRICS.items():
        assert metric.name == name and metric.kind in KINDS
        assert metric.greater_is_better == (name not in lower)
        assert metric.kind == ("label" if name in labels else "value" if name in values else "score")
        assert metric.needs_labels == (metric.kind == "label")
    for name in ("map@3", "top_k_accuracy@2"):
        metric = get_metric(name)
        assert (metric.name, metric.kind, metric.greater_is_better, metric.needs_labels) == (name, "score", True,
                                                                                            False)
    assert get_metric("map@3") is get_metric("map@3")


def test_is_better():
    rmse, accuracy = get_metric("rmse"), get_metric("accuracy")
    assert rmse.is_better(1.0, None) and accuracy.is_better(0.0, None)
    assert rmse.is_better(1.0, 2.0) and not rmse.is_better(2.0, 1.0) and not rmse.is_better(1.0, 1.0)
    assert accuracy.is_better(0.9, 0.8) and not accuracy.is_better(0.8, 0.9) and not accuracy.is_better(0.8, 0.8)


@pytest.mark.parametrize("name", ["nope", "map@0", "map@x", "map@", "map@-1", "map@1.5", "top_k_accuracy@0",
                                  "top_k_accuracy@k", "MAP@3", "rmse@2"])
def test_unknown_metric_raises_naming_it(name):
    with pytest.raises(KbertError, match=f"'{name}'"):
        get_metric(name)


def test_unknown_metric_lists_known_names():
    with pytest.raises(KbertError) as info:
        get_metric("nope")
    for name in METRIC_NAMES:
        assert name in str(info.value)
    assert "map@K" in str(info.value) and "top_k_accuracy@K" in str(info.value)


def test_call_returns_python_float():
    y, p = binary_case(0)
    for name in ("accuracy", "roc_auc", "log_loss"):
        value = score(get_metric(name), "binary", y, p)
        assert type(value) is float
    metric = Metric("custom", lambda t, q: np.float32(0.5), greater_is_better=True, kind="value")
    assert type(metric(y, p)) is float


def test_binary_scoring_thresholds_only_label_metrics():
    y, p = binary_case(1)
    close(score(get_metric("accuracy"), "binary", y, p), skm.accuracy_score(y, p >= 0.5))
    close(score(get_metric("accuracy"), "binary", y, p, threshold=0.3), skm.accuracy_score(y, p >= 0.3))
    close(score(get_metric("f1"), "binary", y, p), skm.f1_score(y, (p >= 0.5).astype(int)))
    close(score(get_metric("roc_auc"), "binary", y, p), skm.roc_auc_score(y, p))
    close(score(get_metric("log_loss"), "binary", y, p), skm.log_loss(y, p))


# --- label metrics ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", [0, 1, 2])
def test_accuracy(seed):
    y, p = binary_case(seed)
    close(get_metric("accuracy")(y, p >= 0.5), np.mean(y == (p >= 0.5)))
    y, p = multiclass_case(seed)
    close(get_metric("accuracy")(y, p.argmax(1)), np.mean(y == p.argmax(1)))
    y, p = multilabel_case(seed, labels=2)
    labels = (p >= 0.5).astype(int)
    subset = np.mean((y == labels).all(axis=1))
    assert 0 < subset < 1
    close(get_metric("accuracy")(y, labels), subset)
    close(get_metric("accuracy")(y, labels), skm.accuracy_score(y, labels))


def test_accuracy_and_f1_equal_sklearns_on_every_shape_and_degenerate_case():
    rng = np.random.default_rng(9)
    y = rng.integers(0, 2, 50)
    cases = [(y, rng.integers(0, 2, 50)), (y, np.zeros(50, int)), (np.zeros(50, int), np.zeros(50, int)),
             (y, rng.random(50) >= 0.5), (y.astype(float), rng.integers(0, 2, 50).astype(float)),
             (y[:1], y[:1]), (np.ones(5, int), np.zeros(5, int))]
    for targets, predictions in cases:
        close(get_metric("accuracy")(targets, predictions), skm.accuracy_score(targets, predictions))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # sklearn warns where F1 is 0/0
            close(get_metric("f1")(targets, predictions), skm.f1_score(targets, predictions, average="binary"))
    strings = np.array(["a", "b", "a"])
    close(get_metric("accuracy")(strings, np.array(["a", "a", "a"])), 2 / 3)


def test_binary_roc_auc_and_the_rmses_equal_sklearns_with_ties_and_refuse_what_it_refuses():
    rng = np.random.default_rng(10)
    y = rng.integers(0, 2, 300)
    for p in (rng.random(300), np.round(rng.random(300), 1), np.where(y == 1, 0.7, 0.3), np.full(300, 0.5)):
        close(get_metric("roc_auc")(y, p), skm.roc_auc_score(y, p))
        close(get_metric("roc_auc")(y.astype(bool), p), skm.roc_auc_score(y.astype(bool), p))
    with warnings.catch_warnings():  # one class: undefined, as sklearn says (NaN), without its warning printed
        warnings.simplefilter("error")
        assert np.isnan(get_metric("roc_auc")(np.ones(5, int), rng.random(5)))
    with pytest.raises(ValueError):
        get_metric("roc_auc")(y, np.where(y == 1, np.nan, 0.5))
    t, p = rng.lognormal(size=300), rng.lognormal(size=300)
    close(get_metric("rmse")(t, p), skm.root_mean_squared_error(t, p))
    close(get_metric("rmse_log")(t, p), skm.root_mean_squared_error(np.log(t), np.log(p)))
    close(get_metric("rmsle")(t, p), skm.root_mean_squared_log_error(t, p))
    with pytest.raises(ValueError):
        get_metric("rmse")(t, np.append(p[:-1], np.nan))
    with pytest.raises(ValueError):
        get_metric("rmse")(t, p[:-1])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_f1(seed):
    y, p = binary_case(seed)
    labels = (p >= 0.5).astype(int)
    tp, fp, fn = np.sum((labels == 1) & (y == 1)), np.sum((labels == 1) & (y == 0)), np.sum((labels == 0) & (y == 1))
    close(get_metric("f1")(y, labels), 2 * tp / (2 * tp + fp + fn))
    for average in ("macro", "micro"):
        metric = get_metric(f"f1_{average}")
        y, p = multiclass_case(seed)
        close(metric(y, p.argmax(1)), skm.f1_score(y, p.argmax(1), average=average))
        y, p = multilabel_case(seed)
        labels = (p >= 0.5).astype(int)
        close(metric(y, labels), skm.f1_score(y, labels, average=average))


def test_f1_macro_is_mean_of_per_class_f1():
    y, p = multiclass_case(3)
    labels = p.argmax(1)
    per_class = [skm.f1_score(y == c, labels == c) for c in range(5)]
    close(get_metric("f1_macro")(y, labels), np.mean(per_class))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mcc(seed):
    y, p = binary_case(seed)
    labels = (p >= 0.5).astype(int)
    tp, tn = np.sum((labels == 1) & (y == 1)), np.sum((labels == 0) & (y == 0))
    fp, fn = np.sum((labels == 1) & (y == 0)), np.sum((labels == 0) & (y == 1))
    reference = (tp * tn - fp * fn) / np.sqrt(float((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn)))
    close(get_metric("mcc")(y, labels), reference)
    y, p = multiclass_case(seed)
    close(get_metric("mcc")(y, p.argmax(1)), skm.matthews_corrcoef(y, p.argmax(1)))


def qwk_reference(a: np.ndarray, b: np.ndarray, n: int) -> float:
    observed = np.zeros((n, n))
    for i, j in zip(a, b):
        observed[i, j] += 1
    expected = np.outer(observed.sum(1), observed.sum(0)) / len(a)
    weights = np.array([[(i - j) ** 2 for j in range(n)] for i in range(n)], dtype=float)
    return 1.0 - (weights * observed).sum() / (weights * expected).sum()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_qwk(seed):
    r = rng(seed)
    y = r.integers(0, 6, N)
    pred = np.clip(y + r.integers(-2, 3, N), 0, 5)
    close(get_metric("qwk")(y, pred), qwk_reference(y, pred, 6))
    close(get_metric("qwk")(y, pred), skm.cohen_kappa_score(y, pred, weights="quadratic"))


# --- score metrics ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", [0, 1, 2])
def test_roc_auc_binary(seed):
    y, p = binary_case(seed)
    positives, negatives = p[y == 1], p[y == 0]
    pairs = (positives[:, None] > negatives[None, :]) + 0.5 * (positives[:, None] == negatives[None, :])
    close(get_metric("roc_auc")(y, p), pairs.mean())
    close(get_metric("roc_auc")(y, np.stack([1 - p, p], axis=1)), pairs.mean())


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("c", [3, 5])
def test_roc_auc_multiclass_one_vs_rest(seed, c):
    y, p = multiclass_case(seed, c)
    reference = np.mean([skm.roc_auc_score(y == k, p[:, k]) for k in range(c)])
    close(get_metric("roc_auc")(y, p), reference)
    close(get_metric("roc_auc")(y, p), skm.roc_auc_score(y, p, multi_class="ovr"))


def test_roc_auc_over_classes_or_labels_absent_from_the_targets_is_the_mean_of_the_defined_ones():
    """A fold's validation rows may lack a rare class or label: scikit-learn's macro mean is then NaN (with a
    warning), and a NaN fold score froze early stopping at the first epoch. The mean of the defined columns, each
    scikit-learn's own; NaN only when none is defined."""
    y, p = multiclass_case(4, 5)
    y[y == 4] = 0  # 5 columns, 4 present classes: class 4's one-vs-rest AUC is undefined
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        close(get_metric("roc_auc")(y, p), np.mean([skm.roc_auc_score(y == c, p[:, c]) for c in range(4)]))
        labels, scores = multilabel_case(0)
        labels[:, 1] = 0
        defined = [j for j in range(labels.shape[1]) if j != 1]
        close(get_metric("roc_auc")(labels, scores),
              np.mean([skm.roc_auc_score(labels[:, j], scores[:, j]) for j in defined]))
        assert np.isnan(get_metric("roc_auc")(np.zeros_like(labels), scores))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_roc_auc_multilabel_is_mean_column_wise(seed):
    y, p = multilabel_case(seed)
    reference = np.mean([skm.roc_auc_score(y[:, j], p[:, j]) for j in range(y.shape[1])])
    close(get_metric("roc_auc")(y, p), reference)


def log_loss_reference(y: np.ndarray, p: np.ndarray) -> float:
    eps = np.finfo(np.float64).eps
    p = np.clip(p, eps, 1 - eps)
    return float(-np.mean(np.log(p[np.arange(len(y)), y])))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_log_loss(seed):
    y, p = binary_case(seed)
    close(get_metric("log_loss")(y, p), log_loss_reference(y, np.stack([1 - p, p], axis=1)))
    close(get_metric("log_loss")(y, p), skm.log_loss(y, p))
    y, p = multiclass_case(seed)
    close(get_metric("log_loss")(y, p), log_loss_reference(y, p))


def test_log_loss_single_class_targets_and_clipping():
    y = np.ones(4, dtype=int)
    p = np.array([0.9, 1.0, 0.8, 0.99])
    close(get_metric("log_loss")(y, p), skm.log_loss(y, p, labels=[0, 1]))
    p = np.array([0.0, 1.0, 0.5, 0.5])
    close(get_metric("log_loss")(np.array([1, 1, 0, 1]), p), skm.log_loss([1, 1, 0, 1], p))
    assert np.isfinite(get_metric("log_loss")(np.array([1, 1, 0, 1]), p))
    y = np.array([0, 0, 1])  # 3 columns, class 2 never a target
    p = probabilities(rng(5), 3, 3)
    close(get_metric("log_loss")(y, p), log_loss_reference(y, p))


def apk(actual: list, predicted: list, k: int) -> float:
    """ml_metrics' average precision at k."""
    predicted = predicted[:k]
    score, hits = 0.0, 0.0
    for i, p in enumerate(predicted):
        if p in actual and p not in predicted[:i]:
            hits += 1.0
            score += hits / (i + 1.0)
    return score / min(len(actual), k) if actual else 0.0


def map_reference(y: np.ndarray, scores: np.ndarray, k: int) -> float:
    ranked = [sorted(range(scores.shape[1]), key=lambda c: (-row[c], c)) for row in scores]
    return float(np.mean([apk([int(t)], r, k) for t, r in zip(y, ranked)]))


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("k", [1, 2, 3, 5, 7])
def test_map_at_k(seed, k):
    y, p = multiclass_case(seed, 5)
    close(get_metric(f"map@{k}")(y, p), map_reference(y, p, k))


def test_map_at_k_ties_go_to_the_lower_column():
    scores = np.array([[0.5, 0.5, 0.0], [0.5, 0.5, 0.0], [0.2, 0.2, 0.2], [0.2, 0.2, 0.2]])
    y = np.array([0, 1, 2, 1])
    close(get_metric("map@3")(y, scores), (1 + 1 / 2 + 1 / 3 + 1 / 2) / 4)
    close(get_metric("map@3")(y, scores), map_reference(y, scores, 3))
    close(get_metric("map@1")(y, scores), 1 / 4)


def test_map_at_k_hand_computed():
    scores = np.array([[0.1, 0.7, 0.2], [0.6, 0.3, 0.1], [0.3, 0.3, 0.4]])
    y = np.array([1, 2, 1])  # ranks 1, 3, 3
    close(get_metric("map@3")(y, scores), (1 + 1 / 3 + 1 / 3) / 3)
    close(get_metric("map@2")(y, scores), 1 / 3)


def test_map_at_k_rejects_bad_shapes():
    y, p = binary_case(0)
    with pytest.raises(KbertError, match="map@3"):
        get_metric("map@3")(y, p)
    with pytest.raises(KbertError, match="map@3"):
        get_metric("map@3")(y[:-1], np.stack([1 - p, p], axis=1))


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_top_k_accuracy(seed, k):
    y, p = multiclass_case(seed, 5)
    top = np.argsort(-p, axis=1)[:, :k]
    close(get_metric(f"top_k_accuracy@{k}")(y, p), np.mean((top == y[:, None]).any(axis=1)))
    close(get_metric(f"top_k_accuracy@{k}")(y, p), skm.top_k_accuracy_score(y, p, k=k))


def test_top_k_accuracy_with_a_class_absent_from_targets():
    y, p = multiclass_case(6, 5)
    y[y == 4] = 0
    top = np.argsort(-p, axis=1)[:, :2]
    close(get_metric("top_k_accuracy@2")(y, p), np.mean((top == y[:, None]).any(axis=1)))


def test_top_k_accuracy_and_map_at_1_agree_with_accuracy():
    y, p = multiclass_case(7, 4)
    close(get_metric("top_k_accuracy@1")(y, p), skm.accuracy_score(y, p.argmax(1)))
    close(get_metric("map@1")(y, p), skm.accuracy_score(y, p.argmax(1)))


# --- value metrics ---------------------------------------------------------------------------------------------

SHAPES = [(N,), (N, 3)]


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("shape", SHAPES)
def test_rmse_mae_r2(seed, shape):
    y, p = value_case(seed, shape)
    close(get_metric("rmse")(y, p), np.sqrt(np.mean((y - p) ** 2)))
    close(get_metric("mae")(y, p), np.mean(np.abs(y - p)))
    close(get_metric("r2")(y, p), skm.r2_score(y, p))
    columns = y.reshape(N, -1), p.reshape(N, -1)
    r2_columns = [1 - np.sum((t - q) ** 2) / np.sum((t - t.mean()) ** 2) for t, q in zip(columns[0].T, columns[1].T)]
    close(get_metric("r2")(y, p), np.mean(r2_columns))


def test_rmse_accepts_lists_and_column_vectors():
    y, p = value_case(2, (N,))
    close(get_metric("rmse")(list(y), list(p)), get_metric("rmse")(y[:, None], p[:, None]))


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("shape", SHAPES)
def test_rmsle(seed, shape):
    y, p = value_case(seed, shape, positive=True)
    y.flat[0], p.flat[1] = 0.0, 0.0
    close(get_metric("rmsle")(y, p), np.sqrt(np.mean((np.log1p(y) - np.log1p(p)) ** 2)))
    close(get_metric("rmsle")(y, p), skm.root_mean_squared_log_error(y.ravel(), p.ravel()))


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("shape", SHAPES)
def test_rmse_log(seed, shape):
    y, p = value_case(seed, shape, positive=True)
    close(get_metric("rmse_log")(y, p), np.sqrt(np.mean((np.log(y) - np.log(p)) ** 2)))
    close(get_metric("rmse_log")(y, p), skm.root_mean_squared_error(np.log(y).ravel(), np.log(p).ravel()))


@pytest.mark.parametrize("name,bad", [("rmsle", -0.5), ("rmse_log", 0.0), ("rmse_log", -1.0)])
def test_log_errors_refuse_out_of_domain_values(name, bad):
    y, p = value_case(0, (10,), positive=True)
    for targets, predictions in ((np.r_[y, bad], np.r_[p, 1.0]), (np.r_[y, 1.0], np.r_[p, bad])):
        with pytest.raises(KbertError, match=name):
            get_metric(name)(targets, predictions)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_spearman(seed):
    y, p = value_case(seed, (N,))
    reference = np.corrcoef(rankdata(y), rankdata(p))[0, 1]
    close(get_metric("spearman")(y, p), reference)
    y, p = value_case(seed, (N, 3))
    reference = np.mean([spearmanr(y[:, j], p[:, j]).statistic for j in range(3)])
    close(get_metric("spearman")(y, p), reference)


def test_spearman_with_ties():
    r = rng(8)
    y, p = r.integers(0, 5, N).astype(float), r.integers(0, 5, N).astype(float)
    close(get_metric("spearman")(y, p), np.corrcoef(rankdata(y), rankdata(p))[0, 1])


def test_perfect_predictions():
    y, p = value_case(0, (N,), positive=True)
    for name in ("rmse", "mae", "rmsle", "rmse_log"):
        assert get_metric(name)(y, y) == 0.0
    for name in ("r2", "spearman"):
        close(get_metric(name)(y, y), 1.0)
    y, p = multiclass_case(0)
    one_hot = np.eye(5)[y]
    for name in ("accuracy", "f1_macro", "f1_micro", "mcc", "qwk"):
        close(get_metric(name)(y, y), 1.0)
    for name in ("roc_auc", "map@3", "top_k_accuracy@1"):
        close(get_metric(name)(y, one_hot), 1.0)


def test_cross_fitted_threshold_cuts_each_fold_at_the_other_folds_threshold():
    from kbert.pipeline.predictions import cross_fitted_threshold_score, tune_threshold

    r = rng(7)
    labels = r.integers(0, 2, N)
    probabilities = np.clip(labels * 0.3 + r.random(N) * 0.7, 0, 1)
    fold = np.arange(N) % 3
    f1 = get_metric("f1")
    honest, thresholds = cross_fitted_threshold_score(f1, labels, probabilities, fold)
    expected = np.empty(N, dtype=int)
    for f, cut in zip(range(3), thresholds):
        assert cut == tune_threshold(f1, labels[fold != f], probabilities[fold != f])
        expected[fold == f] = probabilities[fold == f] >= cut
    assert honest == pytest.approx(skm.f1_score(labels, expected))
    assert honest <= f1(labels, (probabilities >= tune_threshold(f1, labels, probabilities)).astype(int)) + 1e-12
