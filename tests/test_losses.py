import mlx.core as mx  # after models.losses: the fast BLAS is bound before MLX loads
import numpy as np
import pytest

from kbert.models.losses import (binary_cross_entropy, binary_focal_loss, coral_loss, cross_entropy, gaussian_nll_loss,
                                 huber_loss, mae_loss, mse_loss, ordinal_levels, softmax_focal_loss)

RNG = np.random.default_rng(0)
N, L, C = 64, 5, 4


def close(value: mx.array, expected: float, tol: float = 1e-5) -> None:
    value = float(value.item())
    assert abs(value - expected) <= tol * max(1.0, abs(expected)), (value, expected)


def randn(*shape: int, scale: float = 2.0) -> np.ndarray:
    return (scale * RNG.standard_normal(shape)).astype(np.float32)


# numpy references
def np_softplus(x):
    return np.logaddexp(0.0, x)


def np_bce(x, y):
    return (1 - y) * x + np_softplus(-x)


def np_log_softmax(x):
    return x - np.logaddexp.reduce(x, axis=-1, keepdims=True)


# ---------------------------------------------------------------- torch references

@pytest.mark.parametrize("shape", [(N,), (N, L)])
@pytest.mark.parametrize("pos_weight", [None, 2.5, "per_label"])
def test_binary_cross_entropy_matches_torch(shape, pos_weight):
    torch = pytest.importorskip("torch")
    x, y = randn(*shape), RNG.integers(0, 2, shape).astype(np.float32)
    if pos_weight == "per_label":
        pw = RNG.uniform(0.5, 4.0, shape[-1]).astype(np.float32)
        ours = binary_cross_entropy(mx.array(x), mx.array(y), pos_weight=mx.array(pw))
        ref = torch.nn.BCEWithLogitsLoss(pos_weight=torch.from_numpy(pw))
    else:
        ours = binary_cross_entropy(mx.array(x), mx.array(y), pos_weight=pos_weight)
        ref = torch.nn.BCEWithLogitsLoss(pos_weight=None if pos_weight is None else torch.tensor(pos_weight))
    close(ours, ref(torch.from_numpy(x), torch.from_numpy(y)).item())


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("weighted", [False, True])
def test_cross_entropy_matches_torch(smoothing, weighted):
    torch = pytest.importorskip("torch")
    x, y = randn(N, C), RNG.integers(0, C, N)
    w = RNG.uniform(0.2, 3.0, C).astype(np.float32) if weighted else None
    ours = cross_entropy(mx.array(x), mx.array(y), label_smoothing=smoothing,
                         class_weights=None if w is None else mx.array(w))
    ref = torch.nn.CrossEntropyLoss(weight=None if w is None else torch.from_numpy(w), label_smoothing=smoothing)
    close(ours, ref(torch.from_numpy(x), torch.from_numpy(y)).item())


@pytest.mark.parametrize("shape", [(N,), (N, 3)])
def test_regression_losses_match_torch(shape):
    torch = pytest.importorskip("torch")
    pred, target = randn(*shape), randn(*shape)
    tp, tt = torch.from_numpy(pred), torch.from_numpy(target)
    p, t = mx.array(pred), mx.array(target)
    close(mse_loss(p, t), torch.nn.MSELoss()(tp, tt).item())
    close(mae_loss(p, t), torch.nn.L1Loss()(tp, tt).item())
    for delta in (1.0, 0.3):
        close(huber_loss(p, t, delta=delta), torch.nn.HuberLoss(delta=delta)(tp, tt).item())


def test_gaussian_nll_matches_torch():
    torch = pytest.importorskip("torch")
    mean, log_var, target = randn(N, 2), randn(N, 2), randn(N, 2)
    log_var[:4] = -30.0  # var below eps: exercises the clamp
    ref = torch.nn.GaussianNLLLoss(full=False, eps=1e-6)(
        torch.from_numpy(mean), torch.from_numpy(target), torch.from_numpy(log_var).exp())
    close(gaussian_nll_loss(mx.array(mean), mx.array(log_var), mx.array(target)), ref.item(), tol=1e-5)


# ---------------------------------------------------------------- numpy references

@pytest.mark.parametrize("gamma,alpha", [(2.0, None), (2.0, 0.25), (0.5, 0.75), (0.0, None)])
def test_binary_focal_loss_matches_numpy(gamma, alpha):
    x, y = randn(N, L).astype(np.float64), RNG.integers(0, 2, (N, L)).astype(np.float64)
    p = 1 / (1 + np.exp(-x))
    p_t = p * y + (1 - p) * (1 - y)
    ref = np_bce(x, y) * (1 - p_t) ** gamma
    if alpha is not None:
        ref = ref * (alpha * y + (1 - alpha) * (1 - y))
    ours = binary_focal_loss(mx.array(x.astype(np.float32)), mx.array(y.astype(np.float32)), gamma=gamma, alpha=alpha)
    close(ours, ref.mean())


def test_binary_focal_loss_with_gamma_zero_is_bce():
    x, y = mx.array(randn(N)), mx.array(RNG.integers(0, 2, N).astype(np.float32))
    close(binary_focal_loss(x, y, gamma=0.0), binary_cross_entropy(x, y).item())


@pytest.mark.parametrize("gamma", [0.0, 2.0])
@pytest.mark.parametrize("weighted", [False, True])
def test_softmax_focal_loss_matches_numpy(gamma, weighted):
    x, y = randn(N, C).astype(np.float64), RNG.integers(0, C, N)
    w = RNG.uniform(0.2, 3.0, C) if weighted else np.ones(C)
    logp_y = np_log_softmax(x)[np.arange(N), y]
    ref = (w[y] * (1 - np.exp(logp_y)) ** gamma * -logp_y).sum() / w[y].sum()
    ours = softmax_focal_loss(mx.array(x.astype(np.float32)), mx.array(y), gamma=gamma,
                              class_weights=mx.array(w.astype(np.float32)) if weighted else None)
    close(ours, ref)


def test_softmax_focal_loss_with_gamma_zero_is_cross_entropy():
    x, y = mx.array(randn(N, C)), mx.array(RNG.integers(0, C, N))
    w = mx.array(RNG.uniform(0.2, 3.0, C).astype(np.float32))
    close(softmax_focal_loss(x, y, gamma=0.0, class_weights=w), cross_entropy(x, y, class_weights=w).item())


def test_ordinal_levels():
    levels = ordinal_levels(mx.array([0, 1, 3]), num_classes=4)
    assert levels.dtype == mx.float32
    np.testing.assert_array_equal(np.array(levels), [[0, 0, 0], [1, 0, 0], [1, 1, 1]])


def test_coral_loss_matches_numpy_and_bce_identity():
    K = 5
    x, labels = randn(N, K - 1).astype(np.float64), RNG.integers(0, K, N)
    levels = (labels[:, None] > np.arange(K - 1)[None, :]).astype(np.float64)
    ref = np_bce(x, levels).sum(axis=1).mean()
    ours = coral_loss(mx.array(x.astype(np.float32)), mx.array(labels))
    close(ours, ref)
    # binary_cross_entropy averages over all n*(K-1) elements; CORAL sums the K-1 tasks then averages rows.
    bce = binary_cross_entropy(mx.array(x.astype(np.float32)), ordinal_levels(mx.array(labels), K))
    close(ours, (K - 1) * bce.item())


# ---------------------------------------------------------------- stability and gradients

def _all_losses(y_bin, y_multi, reg):
    """Each loss as a function of one float array argument (logits, or log-variance for the NLL)."""
    levels_labels = mx.array(RNG.integers(0, C, y_multi.shape[0]))
    w = mx.array([0.5, 1.0, 2.0, 3.0])
    return {
        "bce": lambda z: binary_cross_entropy(z, y_bin),
        "bce_pw": lambda z: binary_cross_entropy(z, y_bin, pos_weight=mx.array([0.5, 2.0, 3.0])),
        "binary_focal": lambda z: binary_focal_loss(z, y_bin, alpha=0.25),
        "cross_entropy": lambda z: cross_entropy(z[:, :C], y_multi, label_smoothing=0.1, class_weights=w),
        "softmax_focal": lambda z: softmax_focal_loss(z[:, :C], y_multi, class_weights=w),
        "coral": lambda z: coral_loss(z[:, :C - 1], levels_labels),
        "mse": lambda z: mse_loss(z, reg),
        "mae": lambda z: mae_loss(z, reg),
        "huber": lambda z: huber_loss(z, reg, delta=0.5),
        "gaussian_nll": lambda z: gaussian_nll_loss(reg, z, reg + 1.0),
    }


def test_losses_and_gradients_are_finite_at_extreme_logits():
    n = 8
    z = mx.array(np.where(RNG.integers(0, 2, (n, L)) == 1, 50.0, -50.0).astype(np.float32))
    y_bin = mx.array(RNG.integers(0, 2, (n, 3)).astype(np.float32))
    y_multi = mx.array(RNG.integers(0, C, n))
    reg = mx.array(randn(n, 3))
    for name, fn in _all_losses(y_bin, y_multi, reg).items():
        arg = z[:, :3] if name in ("bce", "bce_pw", "binary_focal", "mse", "mae", "huber", "gaussian_nll") else z
        value, grad = mx.value_and_grad(fn)(arg)
        assert np.isfinite(value.item()), name
        assert np.isfinite(np.array(grad)).all(), name


def test_extreme_logits_give_expected_values():
    big = mx.array([50.0, -50.0])
    # Confidently right: ~0 loss; confidently wrong: ~|logit|.
    close(binary_cross_entropy(big, mx.array([1.0, 0.0])), 0.0)
    close(binary_cross_entropy(big, mx.array([0.0, 1.0])), 50.0)
    close(cross_entropy(mx.array([[50.0, -50.0]]), mx.array([1])), 100.0)
