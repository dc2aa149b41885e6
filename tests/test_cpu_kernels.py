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

needs_bf16 = pytest.mark.skipif(not (BUILDABLE and " avx512_bf16" in cpu_kernels._cpu_features()),
                                reason="kbert's bf16 GEMM is built for CPUs with AVX512-BF16")


def bf16_rounded(a: mx.array) -> np.ndarray:
    """The float64 values of ``a`` rounded to bf16 (nearest even, MLX's astype)."""
    return np.array(a.astype(mx.bfloat16).astype(mx.float32), dtype=np.float64)


def assert_bf16_product(got: mx.array, want: np.ndarray, bound: np.ndarray) -> None:
    """``got`` is the exact product of bf16 operands, ``want``, up to float32 summation: within 1e-5 of the sum of
    the products' magnitudes, ``bound`` (one bf16 rounding of an operand is 4e-3 of it)."""
    assert got.dtype == mx.float32 and got.shape == want.shape
    assert (np.abs(np.array(got, dtype=np.float64) - want) <= 1e-5 * bound + 1e-30).all()


@needs_bf16
@pytest.mark.parametrize("shape", [(1, 1, 1), (13, 33, 7), (50, 70, 1601)])  # odd K; 1601 > 2 blocks of 768
@pytest.mark.parametrize("with_bias", [False, True])
def test_bf16_linear_is_the_float32_sum_of_bf16_products_and_so_are_its_gradients(shape, with_bias):
    """x W^T + b with x and W rounded to bf16 (summed in float32), and the input, weight and bias gradients
    dy W, dy^T x (both in bf16) and the rows' sum of dy; the same bits on one thread or two, compiled or not."""
    rows, out, inner = shape
    rng = np.random.default_rng(inner)
    x = mx.array(rng.normal(size=(2, rows, inner)).astype(np.float32))
    w = mx.array(rng.normal(size=(out, inner)).astype(np.float32))
    b = mx.array(rng.normal(size=(out,)).astype(np.float32)) if with_bias else None
    dy = mx.array(rng.normal(size=(2, rows, out)).astype(np.float32))
    amx = cpu_kernels.target_arch() == "native" and " amx_bf16" in cpu_kernels._cpu_features()
    assert cpu_kernels.bf16_gemm_isa() == ("amx_bf16" if amx else "avx512_bf16")

    def loss(x, w, b=None):
        return (cpu_kernels.bf16_linear(x, w, b) * dy).sum()

    xs, ws, dys = bf16_rounded(x).reshape(-1, inner), bf16_rounded(w), bf16_rounded(dy).reshape(-1, out)
    y = cpu_kernels.bf16_linear(x, w, b)
    want = (xs @ ws.T + (0 if b is None else np.array(b))).reshape(2, rows, out)
    assert_bf16_product(y, want, (np.abs(xs) @ np.abs(ws).T).reshape(2, rows, out) + 1)
    args = (x, w) if b is None else (x, w, b)
    grads = mx.grad(loss, argnums=tuple(range(len(args))))(*args)
    assert_bf16_product(grads[0], (dys @ ws).reshape(x.shape), (np.abs(dys) @ np.abs(ws)).reshape(x.shape))
    assert_bf16_product(grads[1], dys.T @ xs, np.abs(dys).T @ np.abs(xs))
    if b is not None:
        np.testing.assert_allclose(np.array(grads[2]), np.array(dy).sum((0, 1)), rtol=1e-5, atol=1e-5)
    if inner > 16:  # and it is not the float32 product
        assert not np.allclose(np.array(y), np.array(x @ w.T + (0 if b is None else b)), rtol=1e-4, atol=1e-4)
    for threads in (1, 2):
        cpu_kernels.set_threads(threads)
        try:
            for run in (cpu_kernels.bf16_linear, mx.compile(cpu_kernels.bf16_linear)):
                assert mx.array_equal(run(*args), y).item()
                again = mx.grad(loss, argnums=tuple(range(len(args))))(*args)
                assert all(mx.array_equal(a, g).item() for a, g in zip(again, grads))
        finally:
            cpu_kernels.set_threads(os.cpu_count() or 1)


@needs_bf16
def test_bf16_head_products_are_the_float32_sums_of_bf16_products_and_so_are_their_gradients():
    """Inside ``bf16_matmuls`` attention's in-place head products are bf16 products too: each head's q k^T and p v,
    and their gradients (the Context and ContextT kinds), against numpy on the rounded operands."""
    from kbert.models import runtime

    runtime.setup()
    module = cpu_kernels.kernels()
    rng = np.random.default_rng(4)
    q, k, v = (mx.array(rng.normal(size=(2, n, 3, 40)).astype(np.float32)) for n in (7, 9, 9))
    p = mx.array(rng.uniform(size=(2, 3, 7, 9)).astype(np.float32))
    qs, ks, vs, ps = (bf16_rounded(t) for t in (q, k, v, p))
    scores = module.head_scores(q, k, bf16=True)
    assert_bf16_product(scores, np.einsum("bmhd,bnhd->bhmn", qs, ks), np.einsum("bmhd,bnhd->bhmn", abs(qs), abs(ks)))
    context = module.head_context(p, v, bf16=True)
    assert_bf16_product(context, np.einsum("bhmn,bnhd->bmhd", ps, vs), np.einsum("bhmn,bnhd->bmhd", ps, abs(vs)))
    ds = mx.array(rng.normal(size=scores.shape).astype(np.float32))
    dq, dk = mx.grad(lambda q, k: (module.head_scores(q, k, bf16=True) * ds).sum(), argnums=(0, 1))(q, k)
    dss = bf16_rounded(ds)
    assert_bf16_product(dq, np.einsum("bhmn,bnhd->bmhd", dss, ks), np.einsum("bhmn,bnhd->bmhd", abs(dss), abs(ks)))
    assert_bf16_product(dk, np.einsum("bhmn,bmhd->bnhd", dss, qs), np.einsum("bhmn,bmhd->bnhd", abs(dss), abs(qs)))
    dc = mx.array(rng.normal(size=context.shape).astype(np.float32))
    dp, dv = mx.grad(lambda p, v: (module.head_context(p, v, bf16=True) * dc).sum(), argnums=(0, 1))(p, v)
    dcs = bf16_rounded(dc)
    assert_bf16_product(dp, np.einsum("bmhd,bnhd->bhmn", dcs, vs), np.einsum("bmhd,bnhd->bhmn", abs(dcs), abs(vs)))
    assert_bf16_product(dv, np.einsum("bhmn,bmhd->bnhd", ps, dcs), np.einsum("bhmn,bmhd->bnhd", ps, abs(dcs)))


@needs_bf16
def test_bf16_matmuls_swaps_the_linears_for_the_block_only():
    """The same modules compute in bf16 inside the block (a traced step keeps it) and as nn.Linear after."""
    layer = nn.Sequential(nn.Linear(40, 24), nn.ReLU(), nn.Linear(24, 8))
    x = mx.random.normal((5, 40))
    plain = layer(x)
    with cpu_kernels.bf16_matmuls(layer):
        assert all(type(m) is cpu_kernels.Bf16Linear for m in layer.layers[::2])
        half = layer(x)
    assert all(type(m) is nn.Linear for m in layer.layers[::2]) and mx.array_equal(layer(x), plain).item()
    assert not mx.array_equal(half, plain).item()
    assert mx.allclose(half, plain, rtol=2e-2, atol=2e-2).item()

@needs_kernels
@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
def test_adamw_update_is_mlx_adamw_bit_for_bit(weight_decay):
    """kbert's AdamW (pipeline/train.py: the update one kernel pass) gives MLX's optim.AdamW's parameters and
    state, bit for bit, step after step on a schedule, compiled or not; with bias correction it is MLX's own."""
    import mlx.optimizers as optim

    from kbert.pipeline.train import AdamW

    rng = np.random.default_rng(7)
    start = {"w": mx.array(rng.normal(size=(300, 70)).astype(np.float32)),
             "b": mx.array(rng.normal(size=(5,)).astype(np.float32))}
    schedule = optim.cosine_decay(1e-2, 10)
    one = mx.ones((3,))
    assert cpu_kernels.adamw_update(one, one, one, one, mx.array(0.1), mx.array(1.0), (0.9, 0.999), 1e-8)  # fused
    for bias_correction in (False, True):
        ours = AdamW(learning_rate=schedule, weight_decay=weight_decay, bias_correction=bias_correction)
        theirs = optim.AdamW(learning_rate=schedule, weight_decay=weight_decay, bias_correction=bias_correction)
        ours_params, their_params = dict(start), dict(start)
        step = mx.compile(lambda g, p: ours.apply_gradients(g, p), inputs=[ours.state], outputs=[ours.state])
        for t in range(4):
            grads = {k: mx.array(rng.normal(size=v.shape).astype(np.float32)) for k, v in start.items()}
            ours_params = (step if t % 2 else ours.apply_gradients)(grads, ours_params)
            their_params = theirs.apply_gradients(grads, their_params)
            mx.eval(ours_params, their_params, ours.state, theirs.state)
            for k in start:
                assert mx.array_equal(ours_params[k], their_params[k]).item(), (bias_correction, t, k)
                for moment in ("m", "v"):
                    assert mx.array_equal(ours.state[k][moment], theirs.state[k][moment]).item()
        assert not mx.array_equal(ours_params["w"], start["w"]).item()  # it moved

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
         bf16=cpu_kernels.bf16_gemm_isa() or "none",
         **{k: np.array(v) for k, v in out.items()})
"""


def values_of_two_builds(tmp_path: Path, script: str, arch: str) -> dict:
    """What ``script`` saves (np.savez to its argument) with the kernels built for ``arch`` (KBERT_CPU_ARCH, built
    afresh in a cache under ``tmp_path``) and with this CPU's own build: {arch: ..., "native": ...}."""
    path = tmp_path / "values.py"
    path.write_text(script)
    native_env = {k: v for k, v in os.environ.items() if k != "KBERT_CPU_ARCH"}
    runs = {}
    for name, env in ((arch, {**native_env, "KBERT_CPU_ARCH": arch, "KBERT_CACHE": str(tmp_path)}),
                      ("native", native_env)):
        out = subprocess.run([sys.executable, str(path), str(tmp_path / f"{name}.npz")], capture_output=True,
                             text=True, timeout=600, env=env)
        assert out.returncode == 0, out.stderr[-2000:]
        runs[name] = np.load(tmp_path / f"{name}.npz")
    return runs


@pytest.mark.slow
@needs_avx2
def test_kernels_built_for_avx2_alone_give_the_native_builds_values(tmp_path):
    """What a CPU without AVX-512 runs (KBERT_CPU_ARCH=x86-64-v3, built afresh in its own cache) computes what
    this CPU's own build does: the same dropout mask, the other values within float32 rounding."""
    runs = values_of_two_builds(tmp_path, AVX2_VALUES, "x86-64-v3")
    avx2, native = runs["x86-64-v3"], runs["native"]
    assert str(avx2["state"]) == "loaded" and str(native["state"]) == "loaded"
    assert str(avx2["path"]).startswith(str(tmp_path)) and str(avx2["path"]) != str(native["path"])
    assert str(avx2["bf16"]) == "none"  # no bf16 GEMM without AVX512-BF16: --precision bf16 is MLX's, with its warning
    assert str(native["bf16"]) == next((isa for isa in ("amx_bf16", "avx512_bf16")
                                        if f" {isa}" in cpu_kernels._cpu_features()), "none")
    assert np.array_equal(avx2["dropout"], native["dropout"])
    for name in ("softmax", "softmax_grad", "gelu", "gelu_grad", "layer_norm", "layer_norm_grad"):
        np.testing.assert_allclose(avx2[name], native[name], rtol=2e-5, atol=2e-6, err_msg=name)


BF16_PRODUCTS = """
import sys
import numpy as np
from kbert.models import runtime
runtime.setup()
import mlx.core as mx
from kbert.models import cpu_kernels
cpu_kernels.kernels()
rng = np.random.default_rng(4)
x, w, dy = (mx.array(rng.normal(size=s).astype(np.float32)) for s in ((300, 1601), (70, 1601), (300, 70)))
dx, dw = mx.grad(lambda x, w: (cpu_kernels.bf16_linear(x, w) * dy).sum(), argnums=(0, 1))(x, w)
np.savez(sys.argv[1], isa=cpu_kernels.bf16_gemm_isa() or "none", x=x, w=w, dy=dy, y=cpu_kernels.bf16_linear(x, w),
         dx=dx, dw=dw)
"""


@pytest.mark.slow
@pytest.mark.skipif(not (BUILDABLE and " amx_bf16" in cpu_kernels._cpu_features()), reason="needs a CPU with AMX")
def test_on_a_cpu_with_amx_both_bf16_paths_are_the_float32_sums_of_bf16_products(tmp_path):
    """This CPU's own build runs the bf16 products in AMX tiles; built for Cooper Lake (AVX512-BF16, no AMX:
    KBERT_CPU_ARCH, its own cache) they run in vdpbf16ps tiles. Each path names itself (a run records it) and each
    gives the exact product of the bf16 operands up to float32 summation, forward and both gradients."""
    runs = values_of_two_builds(tmp_path, BF16_PRODUCTS, "cooperlake")
    assert (str(runs["cooperlake"]["isa"]), str(runs["native"]["isa"])) == ("avx512_bf16", "amx_bf16")
    for run in runs.values():
        xs, ws, dys = (bf16_rounded(mx.array(run[name])) for name in ("x", "w", "dy"))
        assert_bf16_product(mx.array(run["y"]), xs @ ws.T, np.abs(xs) @ np.abs(ws).T)
        assert_bf16_product(mx.array(run["dx"]), dys @ ws, np.abs(dys) @ np.abs(ws))
        assert_bf16_product(mx.array(run["dw"]), dys.T @ xs, np.abs(dys).T @ np.abs(xs))
