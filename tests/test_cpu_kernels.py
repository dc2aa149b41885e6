"""The vectorized CPU kernels (models/cpu_kernels.py) agree with MLX's own ops, forward and backward, and fall
back to them where they do not apply."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from kbert.models import cpu_kernels
from kbert.models.activations import gelu, gelu_mlx

ON_LINUX_CPU = sys.platform == "linux" and mx.default_device() == mx.cpu
BUILDABLE = ON_LINUX_CPU and shutil.which(os.environ.get("CXX", "g++")) is not None
needs_kernels = pytest.mark.skipif(not BUILDABLE, reason="the kernels are built on Linux CPUs with a C++ compiler")

NEG = float(mx.finfo(mx.float32).min)


def reference_softmax(x, mask, scale):
    return mx.softmax(x * scale + (0 if mask is None else mask), axis=-1, precise=True)


@needs_kernels
def test_kernels_build_and_load_here():
    assert cpu_kernels.kernels() is not None, cpu_kernels.STATUS.note
    assert cpu_kernels.STATUS.state == "loaded"
    assert cpu_kernels.applies(mx.zeros((2, 3)))


@needs_kernels
@pytest.mark.parametrize("mask_shape", [None, (3, 1, 1, 37), (3, 1, 19, 37), (1, 1, 1, 37)])
def test_softmax_with_scale_and_mask_matches_mlx(mask_shape):
    mx.random.seed(0)
    x = mx.random.normal((3, 4, 19, 37)) * 4
    mask = None
    if mask_shape is not None:  # additive padding mask as the encoders build it: 0 or the float32 minimum
        mask = mx.where(mx.random.uniform(shape=mask_shape) > 0.3, 0.0, NEG)
        mask[..., 0] = 0.0  # every row keeps one key
    got = cpu_kernels.softmax(x, mask, 0.125)
    assert mx.allclose(got, reference_softmax(x, mask, 0.125), atol=1e-6, rtol=1e-5).item()
    if mask is not None:  # masked keys get exactly zero probability
        blocked = mx.broadcast_to(mask < 0, x.shape)
        assert mx.all(mx.where(blocked, got, 0.0) == 0).item()
    assert mx.allclose(got.sum(-1), mx.ones(got.shape[:-1]), atol=1e-5).item()


@needs_kernels
def test_softmax_gradient_matches_mlx():
    mx.random.seed(1)
    x = mx.random.normal((2, 3, 8, 16)) * 3
    weights = mx.random.normal(x.shape)
    mask = mx.where(mx.random.uniform(shape=(2, 1, 1, 16)) > 0.5, 0.0, -1e4)
    got = mx.grad(lambda a: (cpu_kernels.softmax(a, mask, 0.3) * weights).sum())(x)
    want = mx.grad(lambda a: (reference_softmax(a, mask, 0.3) * weights).sum())(x)
    assert mx.allclose(got, want, atol=1e-6, rtol=1e-5).item()


@needs_kernels
def test_softmax_takes_non_contiguous_input():
    x = mx.random.normal((5, 7, 9)).transpose(0, 2, 1)
    assert mx.allclose(cpu_kernels.softmax(x), mx.softmax(x, axis=-1), atol=1e-6).item()


@needs_kernels
def test_gelu_and_its_gradient_match_exact_gelu():
    x = mx.linspace(-8, 8, 100_000).reshape(-1, 8)
    fast = cpu_kernels.gelu(x)
    assert fast is not None
    assert mx.abs(fast - nn.gelu(x)).max().item() < 2e-6  # nn.gelu uses MLX's own erf
    assert mx.array_equal(gelu(x), fast)  # the models' gelu takes the kernel here
    weights = mx.random.normal(x.shape)
    got = mx.grad(lambda a: (gelu(a) * weights).sum())(x)
    want = mx.grad(lambda a: (nn.gelu(a) * weights).sum())(x)
    assert mx.abs(got - want).max().item() < 1e-5


@needs_kernels
def test_kernels_inside_compiled_functions_and_attention():
    mx.random.seed(2)
    q, k, v = (mx.random.normal((2, 4, 10, 8)) for _ in range(3))
    mask = mx.where(mx.arange(10) < 7, 0.0, NEG)[None, None, None, :]

    def attend(q, k, v):
        return cpu_kernels.attention(q, k, v, 8 ** -0.5, mask)

    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=8 ** -0.5, mask=mask)
    assert mx.allclose(attend(q, k, v), want, atol=1e-5).item()
    assert mx.allclose(mx.compile(attend)(q, k, v), want, atol=1e-5).item()
    loss = lambda q: (mx.compile(attend)(q, k, v) ** 2).sum()  # noqa: E731
    reference = lambda q: (mx.fast.scaled_dot_product_attention(q, k, v, scale=8 ** -0.5, mask=mask) ** 2).sum()  # noqa: E731
    assert mx.allclose(mx.grad(loss)(q), mx.grad(reference)(q), atol=1e-4).item()



@needs_kernels
@pytest.mark.parametrize("queries", [1, 6])  # 1: the first-token last layer
@pytest.mark.parametrize("p", [0.0, 0.2])
def test_heads_read_in_place_give_the_transposed_paths_values_and_gradients(queries, p):
    """head_attention on the projections' (batch, seq, heads, head_dim) layout equals attention on transposed copies
    bit for bit, and so do the gradients of queries, keys and values (the same BLAS products, the same dropout
    mask); compiled too. Each product against numpy's."""
    from kbert.models import runtime

    runtime.setup()
    assert cpu_kernels.kernels().has_head_products(), "no cblas_sgemm in the global scope"
    rng = np.random.default_rng(queries)
    q, k, v = (mx.array(rng.normal(size=(3, n, 4, 8)).astype(np.float32)) for n in (queries, 9, 9))
    mask = mx.where(mx.arange(9) < 7, 0.0, NEG)[None, None, None, :]
    dropout = (lambda x: cpu_kernels.dropout(x, p, key=mx.random.key(5))) if p else None

    def transposed(q, k, v):
        heads = [t.transpose(0, 2, 1, 3) for t in (q, k, v)]
        return cpu_kernels.attention(*heads, 8 ** -0.5, mask, dropout).transpose(0, 2, 1, 3)

    def in_place(q, k, v):
        return cpu_kernels.head_attention(q, k, v, 8 ** -0.5, mask, dropout)

    weights = mx.arange(8, dtype=mx.float32)
    for attend in (in_place, mx.compile(in_place)):
        assert mx.array_equal(attend(q, k, v), transposed(q, k, v)).item()
        ours = mx.grad(lambda *a: (attend(*a) * weights).sum(), argnums=(0, 1, 2))(q, k, v)
        theirs = mx.grad(lambda *a: (transposed(*a) * weights).sum(), argnums=(0, 1, 2))(q, k, v)
        assert all(mx.array_equal(a, b).item() for a, b in zip(ours, theirs))
    module = cpu_kernels.kernels()
    scores = np.einsum("bmhd,bnhd->bhmn", np.array(q), np.array(k))
    np.testing.assert_allclose(np.array(module.head_scores(q, k)), scores, rtol=1e-5, atol=1e-5)
    context = np.einsum("bhmn,bnhd->bmhd", scores, np.array(v))
    np.testing.assert_allclose(np.array(module.head_context(mx.array(scores), v)), context, rtol=1e-5, atol=1e-4)
    with pytest.raises(ValueError, match="shapes do not match"):
        module.head_scores(q, v[:, :, :2])

@needs_kernels
@pytest.mark.parametrize("p", [0.1, 0.5])
def test_dropout_keeps_1_minus_p_scales_by_its_inverse_and_its_gradient_uses_the_same_mask(p):
    mx.random.seed(4)
    x = mx.random.normal((64, 33, 129))  # 272k elements: split over threads, and not a multiple of a SIMD width
    key = mx.random.key(7)
    y = cpu_kernels.dropout(x, p, key)
    kept = y != 0
    share = kept.mean().item()
    assert abs(share - (1 - p)) < 4 * (p * (1 - p) / x.size) ** 0.5 + 1e-4  # four standard errors
    assert mx.allclose(mx.where(kept, x / (1 - p), 0), y, rtol=1e-6, atol=0).item()  # nn.Dropout's scaling
    assert mx.array_equal(cpu_kernels.dropout(x, p, key), y)  # one key, one mask
    assert not mx.array_equal(cpu_kernels.dropout(x, p, mx.random.key(8)) != 0, kept)
    # masks are not correlated along the last axis or across rows (the hash mixes the element index)
    assert abs(mx.mean(kept[:, :, 1:] == kept[:, :, :-1]).item() - (p * p + (1 - p) ** 2)) < 0.01
    weights = mx.random.normal(x.shape)
    grad = mx.grad(lambda a: (cpu_kernels.dropout(a, p, key) * weights).sum())(x)
    assert mx.allclose(grad, mx.where(kept, weights / (1 - p), 0), rtol=1e-6, atol=0).item()


@needs_kernels
def test_encoder_dropout_draws_its_seed_from_the_global_generator():
    from kbert.models.recompute import Dropout

    drop = Dropout(0.3)
    x = mx.ones((8, 100))
    mx.random.seed(11)
    first = drop(x)
    mx.random.seed(11)
    assert mx.array_equal(drop(x), first)  # reproducible from the seed
    assert not mx.array_equal(drop(x), first)  # and a new mask on the next call
    assert mx.array_equal(drop.eval()(x), x)


@needs_kernels
@pytest.mark.parametrize("bias", [True, False])  # ModernBERT's norms have no bias
def test_layer_norm_and_its_gradients_match_mlx_fast_layer_norm(bias):
    from kbert.models.layers import LayerNorm

    mx.random.seed(5)
    ours, reference = LayerNorm(96, eps=1e-7, bias=bias), nn.LayerNorm(96, eps=1e-7, bias=bias)
    ours.update({k: mx.random.normal(v.shape) for k, v in ours.parameters().items()})
    reference.update(ours.parameters())
    x = mx.random.normal((6, 77, 96)) * 5 + 2  # offset and spread: the statistics matter
    assert mx.abs(ours(x) - reference(x)).max().item() < 1e-5
    weights = mx.random.normal(x.shape)

    def loss(model, x):
        return (model(x) * weights).sum()

    def gradients(model):  # with respect to the input, and to the weight and bias
        return mx.grad(lambda x: loss(model, x))(x), nn.value_and_grad(model, loss)(model, x)[1]

    (got_x, got), (want_x, want) = gradients(ours), gradients(reference)
    assert mx.abs(got_x - want_x).max().item() < 1e-5 * mx.abs(want_x).max().item() + 1e-6
    for name in want:
        assert mx.allclose(got[name], want[name], rtol=1e-4, atol=1e-4).item(), name
    assert mx.array_equal(ours(x.astype(mx.float16)), reference(x.astype(mx.float16)))  # other dtypes: MLX's op


def test_other_dtypes_fall_back_to_mlx_ops():
    x = mx.random.normal((4, 6)).astype(mx.float16)
    assert not cpu_kernels.applies(x)
    assert cpu_kernels.gelu(x) is None
    assert mx.allclose(gelu(x), gelu_mlx(x)).item()
    assert mx.allclose(cpu_kernels.softmax(x, None, 0.5), mx.softmax(x * 0.5, axis=-1, precise=True)).item()


@pytest.mark.skipif(sys.platform != "linux", reason="the kernels are Linux-only")
def test_kernels_can_be_switched_off_and_the_encoder_still_runs():
    code = ("from kbert.models import runtime; runtime.setup(); import mlx.core as mx; "
            "from kbert.models import cpu_kernels; from kbert.models.bert import BertConfig, BertModel; "
            "m = BertModel(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, "
            "intermediate_size=32)); h = m(mx.array([[1, 2, 3]])).last_hidden_state; mx.eval(h); "
            "print(cpu_kernels.STATUS.state, cpu_kernels.STATUS.note, h.shape)")
    env = {**os.environ, "KBERT_CPU_KERNELS": "0"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "disabled KBERT_CPU_KERNELS=0 (1, 3, 16)"


@pytest.mark.skipif(sys.platform != "linux", reason="glibc's mallopt is Linux-only")
def test_glibc_keeps_large_buffers_unless_told_not_to():
    code = "from kbert.models import runtime; print(runtime.setup().malloc)"
    kept = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert kept.stdout.strip() == "large buffers kept for reuse"
    off = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "KBERT_MALLOC": "default"})
    assert off.stdout.strip() == "default (KBERT_MALLOC=default)"


needs_avx2 = pytest.mark.skipif(not (BUILDABLE and "avx2" in cpu_kernels._cpu_features().split()),
                                reason="needs an x86-64 CPU with AVX2")


def vectorizer_report(folder, march: str) -> tuple[set[int], set[int]]:
    """Compiling the kernels' source for ``march``: the lines where GCC vectorized a loop with 32-byte (or wider)
    vectors, and those where it reports a loop it could not vectorize."""
    report = folder / f"{march}.txt"
    command = cpu_kernels.build_command(os.environ.get("CXX", "g++"), folder / f"{march}.o")
    command = [c for c in command if "nb_combined" not in c and not c.startswith(("-L", "-l", "-Wl", "-march="))]
    command = ["-c" if c == "-shared" else c for c in command]
    out = subprocess.run(command + [f"-march={march}", f"-fopt-info-vec-all={report}"], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]

    text = report.read_text().splitlines()

    def lines(phrase: str) -> set[int]:
        return {int(line.split(":")[1]) for line in text
                if phrase in line and Path(line.split(":")[0]).name == cpu_kernels.SOURCE.name}

    return lines("using 32 byte vectors") | lines("using 64 byte vectors"), lines("couldn't vectorize loop")


@pytest.mark.slow
@needs_avx2
def test_every_simd_loop_vectorizes_at_full_width_with_avx2_alone(tmp_path):
    """Built for x86-64-v3 (AVX2, no AVX-512), each ``#pragma omp simd`` loop is vectorized with 32-byte vectors
    and misses nothing that this CPU's own build does not. Without -fno-trapping-math GCC kept the loops with a
    select (softmax's exp, GELU, dropout) scalar there, and AVX-512's masked operations hid it on the machines
    where the kernels were tuned."""
    source = cpu_kernels.SOURCE.read_text().splitlines()
    pragmas = [n + 1 for n, line in enumerate(source) if line.strip().startswith("#pragma omp simd")]
    assert len(pragmas) >= 10
    # GCC names a loop by its header or a statement in its body: the lines after its pragma, up to the next
    loops = {p: set(range(p, min(p + 6, q))) for p, q in zip(pragmas, pragmas[1:] + [len(source) + 1])}
    avx2_wide, avx2_missed = vectorizer_report(tmp_path, "x86-64-v3")
    _, native_missed = vectorizer_report(tmp_path, "native")
    assert [p for p, body in loops.items() if not body & avx2_wide] == []
    assert [p for p, body in loops.items() if body & (avx2_missed - native_missed)] == []


AVX2_VALUES = """
import sys
import numpy as np
from kbert.models import runtime
runtime.setup()
import mlx.core as mx
from kbert.models import cpu_kernels
mx.random.seed(3)
scores = mx.random.normal((4, 3, 17, 37)) * 4
mask = mx.where(mx.random.uniform(shape=(4, 1, 1, 37)) < 0.3, -1e30, 0.0)
x = mx.random.normal((61, 129)) * 3
dy = mx.random.normal(x.shape)
out = {
    "softmax": cpu_kernels.softmax(scores, mask, 0.3),
    "softmax_grad": mx.grad(lambda s: (cpu_kernels.softmax(s, mask, 0.3) * scores).sum())(scores),
    "gelu": cpu_kernels.gelu(x),
    "gelu_grad": mx.grad(lambda a: (cpu_kernels.gelu(a) * dy).sum())(x),
    "dropout": cpu_kernels.dropout(x, 0.3, mx.random.key(5)),
    "layer_norm": cpu_kernels.layer_norm(x, None, None, 1e-12),
    "layer_norm_grad": mx.grad(lambda a: (cpu_kernels.layer_norm(a, None, None, 1e-12) * dy).sum())(x),
}
np.savez(sys.argv[1], state=cpu_kernels.STATUS.state, path=cpu_kernels.STATUS.path,
         **{k: np.array(v) for k, v in out.items()})
"""


@pytest.mark.slow
@needs_avx2
def test_kernels_built_for_avx2_alone_give_the_native_builds_values(tmp_path):
    """What a CPU without AVX-512 runs (KBERT_CPU_ARCH=x86-64-v3, built afresh in its own cache) computes what
    this CPU's own build does: the same dropout mask, the other values within float32 rounding."""
    script = tmp_path / "values.py"
    script.write_text(AVX2_VALUES)
    native_env = {k: v for k, v in os.environ.items() if k != "KBERT_CPU_ARCH"}
    runs = {}
    for arch, env in (("x86-64-v3", {**native_env, "KBERT_CPU_ARCH": "x86-64-v3", "KBERT_CACHE": str(tmp_path)}),
                      ("native", native_env)):
        out = subprocess.run([sys.executable, str(script), str(tmp_path / f"{arch}.npz")], capture_output=True,
                             text=True, timeout=600, env=env)
        assert out.returncode == 0, out.stderr[-2000:]
        runs[arch] = np.load(tmp_path / f"{arch}.npz")
        assert str(runs[arch]["state"]) == "loaded"
    avx2, native = runs["x86-64-v3"], runs["native"]
    assert str(avx2["path"]).startswith(str(tmp_path)) and str(avx2["path"]) != str(native["path"])
    assert np.array_equal(avx2["dropout"], native["dropout"])
    for name in ("softmax", "softmax_grad", "gelu", "gelu_grad", "layer_norm", "layer_norm_grad"):
        np.testing.assert_allclose(avx2[name], native[name], rtol=2e-5, atol=2e-6, err_msg=name)
