"""Mixed precision and gradient accumulation on the CPU (pipeline/precision.py, pipeline/train.py): half-precision
forward passes of every architecture against float32, a bf16 fine-tune against the float32 loss curve, fp16's loss
scaling recovering from an overflow, and --grad-accum against one large batch. bf16 is tested both ways a CPU runs
it: kbert's bf16 GEMM (where the CPU has AVX512-BF16) and MLX's own bf16 ops."""

from __future__ import annotations

from dataclasses import replace

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

import kbert.pipeline.train as train_module
from kbert.models import cpu_kernels
from kbert.models.encoders import ARCHITECTURES, build_encoder
from kbert.models.heads import HeadConfig
from kbert.models.task_model import build_task_model
from kbert.pipeline.config import TrainConfig
from kbert.pipeline.precision import DTYPES, LossScaler, cast_floats, compute_path, in_precision, resolve_precision
from kbert.pipeline.train import FoldData, Progress, Validation, train_fold

SIZE = {"vocab_size": 300, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "intermediate_size": 128, "max_position_embeddings": 64}
EXTRA = {"electra": {"embedding_size": 32},
         "deberta-v2": {"relative_attention": True, "position_buckets": 8, "norm_rel_ebd": "layer_norm",
                        "share_att_key": True, "pos_att_type": ["p2c", "c2p"], "position_biased_input": False,
                        "type_vocab_size": 0, "max_relative_positions": -1},
         "modernbert": {"global_attn_every_n_layers": 2, "local_attention": 8, "pad_token_id": 0},
         "roberta": {"pad_token_id": 1, "max_position_embeddings": 66},
         "xlm-roberta": {"pad_token_id": 1, "max_position_embeddings": 66},
         "neobert": {"max_length": 64}}
# Tolerances, as the largest error over the largest |value| of the float32 output (two layers, 64 features).
# One bfloat16 rounding is 2^-8 = 0.4% relative, one float16 rounding 2^-11 = 0.05%; embeddings, two layers of
# matmuls, GELU, residual sums and norms compound a few of them. Measured: bf16 0.6-1.0%, fp16 0.09-0.12% on
# every architecture. The bounds, 2.5% and 0.3%, leave room for the seed and no more: a norm or a softmax taken
# in half precision, or a float16 overflow, lands far above them. kbert's bf16 GEMM rounds only the products'
# operands: 0.09-0.32% measured.
TOLERANCE = {"bf16": 2.5e-2, "fp16": 3e-3}
HAS_BF16_GEMM = mx.default_device() == mx.cpu and cpu_kernels.bf16_gemm_isa() is not None  # a CPU kernel


def take_half_path(path: str, monkeypatch) -> str:
    """Half precision on this CPU through kbert's bf16 GEMM (skipped without AVX512-BF16), or through MLX's ops
    (the GEMM hidden)."""
    if path == "bf16 gemm" and not HAS_BF16_GEMM:
        pytest.skip("kbert's bf16 GEMM runs on CPUs with AVX512-BF16 (this one lacks it, or MLX runs on a GPU)")
    if path == "mlx ops":
        monkeypatch.setattr(cpu_kernels, "bf16_gemm_isa", lambda: None)
    return path


@pytest.fixture(params=["bf16 gemm", "mlx ops"])
def half_path(request, monkeypatch) -> str:
    return take_half_path(request.param, monkeypatch)


def batch(rng: np.random.Generator, rows: int = 4, length: int = 12) -> tuple[mx.array, mx.array]:
    ids = rng.integers(4, 300, size=(rows, length)).astype(np.int32)
    mask = np.ones((rows, length), dtype=np.int32)
    mask[1, 8:] = 0
    mask[3, 5:] = 0
    ids[0, 0] = 2
    return mx.array(ids), mx.array(mask)


@pytest.mark.parametrize("precision, path", [("bf16", "bf16 gemm"), ("bf16", "mlx ops"), ("fp16", "mlx ops")])
@pytest.mark.parametrize("model_type", sorted(ARCHITECTURES))
def test_half_precision_forward_of_every_architecture_is_within_tolerance(model_type, precision, path, monkeypatch):
    take_half_path(path, monkeypatch)
    mx.random.seed(0)
    encoder, _ = build_encoder({"model_type": model_type, **SIZE, **EXTRA.get(model_type, {})})
    encoder.eval()
    ids, mask = batch(np.random.default_rng(0))
    reference = encoder(ids, mask).last_hidden_state
    half = in_precision(lambda model, *inputs: model(*inputs).last_hidden_state, DTYPES[precision])(encoder, ids, mask)
    assert half.dtype == mx.float32  # returned in float32 ...
    assert all(a.dtype == mx.float32 for _, a in tree_flatten(encoder.parameters()))  # ... masters untouched
    rows = np.array(mask, dtype=bool)  # padded positions carry no meaning
    error = np.abs(np.array(half) - np.array(reference))[rows].max() / np.abs(np.array(reference))[rows].max()
    assert error < TOLERANCE[precision], f"{model_type} {precision}: {error:.2e}"
    assert error > 0  # the forward really ran in half precision


def tiny_fold(seed: int = 0, rows: int = 96) -> tuple[FoldData, dict]:
    rng = np.random.default_rng(seed)
    tokens = [rng.integers(4, 300, size=rng.integers(5, 20)).astype(np.int32) for _ in range(rows)]
    targets = np.array([float(t[0] % 2) for t in tokens], dtype=np.float32)  # learnable from the first token
    data = FoldData(train_tokens=tokens[:64], train_targets=targets[:64], valid_tokens=tokens[64:],
                    valid_targets=targets[64:], test_tokens=tokens[64:72])
    values = {"model_type": "bert", **SIZE, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    return data, values


def train(config: TrainConfig, values: dict, data: FoldData, seed: int = 0):
    from kbert.pipeline.train import seed_everything

    seed_everything(seed)
    model = build_task_model(values, HeadConfig(task="binary", num_outputs=1, dropout=0.0), "cls")
    result = train_fold(model, data, config, Validation(lambda outputs: 0.0, True), seed=seed,
                        progress=Progress(bar=False))
    return model, result


BASE = TrainConfig(epochs=1, batch_size=32, learning_rate=1e-3, warmup_ratio=0.0, patience=100, max_length=32,
                   compile=False)


@pytest.mark.slow
def test_grad_accum_4_at_batch_8_equals_batch_32_in_float32():
    data, values = tiny_fold()
    big_model, big = train(replace(BASE, epochs=2, batch_size=32, precision="fp32"), values, data)
    small_model, small = train(replace(BASE, epochs=2, batch_size=8, grad_accum=4, precision="fp32"), values, data)
    for (name, a), (_, b) in zip(tree_flatten(big_model.parameters()), tree_flatten(small_model.parameters())):
        np.testing.assert_allclose(np.array(a), np.array(b), atol=1e-5, rtol=0, err_msg=name)
    assert [h["train_loss"] for h in small.history] == pytest.approx([h["train_loss"] for h in big.history],
                                                                     abs=1e-5)
    np.testing.assert_allclose(small.valid_outputs, big.valid_outputs, atol=1e-5)
    # and it is a real difference from training at batch 8 without accumulating
    _, plain = train(replace(BASE, epochs=2, batch_size=8, precision="fp32"), values, data)
    assert abs(plain.history[-1]["train_loss"] - big.history[-1]["train_loss"]) > 1e-3


@pytest.mark.slow
def test_a_bf16_fine_tune_follows_the_float32_loss_curve(half_path):
    """30 steps (15 epochs of 2 batches): bf16's per-epoch training loss within 0.015 of float32's (measured: at most
    0.005, where the loss is near 1; a bf16 rounding of the logits alone moves a loss near 0.7 by about 0.003),
    and it learns as float32 does."""
    data, values = tiny_fold()
    _, fp32 = train(replace(BASE, epochs=15, precision="fp32", compile=True), values, data)
    _, bf16 = train(replace(BASE, epochs=15, precision="bf16", compile=True), values, data)
    fp32_curve = np.array([h["train_loss"] for h in fp32.history])
    bf16_curve = np.array([h["train_loss"] for h in bf16.history])
    assert len(fp32_curve) == len(bf16_curve) == 15
    assert np.abs(bf16_curve - fp32_curve).max() < 0.015, (fp32_curve, bf16_curve)
    assert bf16_curve[-1] < bf16_curve[0] - 0.05  # it trained
    assert bf16_curve.tolist() != fp32_curve.tolist()  # and not in float32


@pytest.mark.slow
def test_fp16_loss_scaling_recovers_from_an_overflow(monkeypatch):
    """A loss scale of 2^40 overflows float16 (max 65504): the first steps are skipped and the scale halves until
    the gradients are finite; training then goes on, and history.json counts the skipped steps."""
    monkeypatch.setattr(train_module, "LossScaler", lambda: LossScaler(scale=2.0 ** 40))
    data, values = tiny_fold()
    _, result = train(replace(BASE, epochs=15, batch_size=8, precision="fp16"), values, data)
    skipped = result.history[-1]["skipped_steps"]
    assert 20 <= skipped <= 40  # 2^40 down to a scale whose scaled gradients fit float16
    assert result.history[-1]["loss_scale"] < 2.0 ** 16
    losses = [h["train_loss"] for h in result.history]
    assert np.isfinite(losses[-1]) and losses[-1] < 0.69  # trained after recovering
    assert np.isfinite(result.valid_outputs).all()


def test_loss_scaler_halves_on_overflow_and_grows_after_good_steps():
    scaler = LossScaler(scale=8.0, growth_interval=2)
    assert scaler.update(False) is False and scaler.scale == 4.0 and scaler.skipped == 1
    assert scaler.update(True) and scaler.scale == 4.0
    assert scaler.update(True) and scaler.scale == 8.0


def test_defaults_and_the_cpu_warning(capsys, half_path):
    """Half precision on a CPU warns where it is MLX's own (slow) ops; bf16 on kbert's GEMM does not."""
    assert resolve_precision("auto", "gpu") == "bf16" and resolve_precision("auto", "cpu") == "fp32"
    assert resolve_precision("bf16", "cpu") == "bf16"
    assert ("about 15x slower" in capsys.readouterr().err) == (half_path == "mlx ops")
    assert compute_path("bf16", "cpu") == (f"bf16 {cpu_kernels.bf16_gemm_isa()}" if half_path == "bf16 gemm"
                                           else "bf16 cpu")
    assert resolve_precision("fp16", "cpu") == "fp16" and "about 15x slower" in capsys.readouterr().err
    assert compute_path("fp32", "cpu") == "fp32" and compute_path("bf16", "gpu") == "bf16 gpu"
    quantized = {"w": mx.zeros((2, 2), dtype=mx.uint32), "scales": mx.ones((2,))}
    cast = cast_floats(quantized, mx.bfloat16)
    assert cast["w"].dtype == mx.uint32 and cast["scales"].dtype == mx.bfloat16  # packed 4-bit weights kept


def test_out_of_memory_names_the_batch_size_and_the_remedies(monkeypatch):
    from kbert.errors import KbertError

    def no_room(*args, **kwargs):
        raise RuntimeError("[malloc] Unable to allocate 17179869184 bytes")

    monkeypatch.setattr(train_module, "make_train_step", lambda *a, **k: no_room)
    data, values = tiny_fold()
    with pytest.raises(KbertError) as error:
        train(replace(BASE, batch_size=16), values, data)
    message = str(error.value)
    assert "out of memory at --batch-size 16" in message and "--batch-size 8 --grad-accum 2" in message
    assert "--gradient-checkpointing" in message and "\n" not in message


@pytest.mark.parametrize("model_type", sorted(ARCHITECTURES))
def test_gradient_checkpointing_gives_the_same_gradients_on_every_architecture(model_type):
    import mlx.nn as nn

    from kbert.models.recompute import set_recompute

    mx.random.seed(0)
    encoder, _ = build_encoder({"model_type": model_type, **SIZE, **EXTRA.get(model_type, {}),
                                "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0})
    ids, mask = batch(np.random.default_rng(1))

    def loss(model, ids, mask):
        return (model(ids, mask).last_hidden_state ** 2).mean()

    plain = nn.value_and_grad(encoder, loss)(encoder, ids, mask)[1]
    set_recompute(encoder, True)
    recomputed = nn.value_and_grad(encoder, loss)(encoder, ids, mask)[1]
    for (name, a), (_, b) in zip(tree_flatten(plain), tree_flatten(recomputed)):
        np.testing.assert_allclose(np.array(a), np.array(b), atol=1e-6, err_msg=name)


def test_precision_device_and_grad_accum_are_run_settings_in_yaml_and_the_space(titanic):
    from kbert.errors import KbertError
    from kbert.pipeline.config import resolve_run_config

    config = resolve_run_config(titanic, {"precision": "bf16", "device": "cpu", "grad_accum": 4})
    assert (config.train.precision, config.train.device, config.train.grad_accum) == ("bf16", "cpu", 4)
    with pytest.raises(KbertError, match="precision"):
        resolve_run_config(titanic, {"precision": "fp8"})
    with pytest.raises(KbertError, match="grad_accum"):
        resolve_run_config(titanic, {"grad_accum": 0})
    from kbert.tune.space import parse_space, to_overrides

    params = parse_space({"precision": {"choices": ["fp32", "bf16"]}}, "space")
    assert to_overrides(params, {"precision": "bf16"}) == {"precision": "bf16"}


def test_a_linux_mlx_without_backend_is_named(monkeypatch, tmp_path, capsys):
    import importlib.util
    import sys as system

    from kbert.cli import main

    (tmp_path / "mlx").mkdir()
    real = importlib.util.find_spec

    def fake(name, *args):
        if name == "mlx":
            return importlib.util.spec_from_file_location("mlx", tmp_path / "mlx" / "__init__.py",
                                                          submodule_search_locations=[str(tmp_path / "mlx")])
        return real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", fake)
    monkeypatch.setattr(system, "platform", "linux")
    assert main(["doctor"]) == 2
    assert 'MLX is installed without a backend; pip install -e ".[cpu]"' in capsys.readouterr().err


def test_qlora_base_weights_stay_packed_and_compute_in_bf16(half_path):
    from kbert.models.adapters import apply_adapters, resolve_adapter

    mx.random.seed(0)
    model = build_task_model({"model_type": "bert", **SIZE}, HeadConfig(task="binary", num_outputs=1), "cls")
    apply_adapters(model, resolve_adapter("qlora"))
    model.eval()
    ids, mask = batch(np.random.default_rng(2))
    reference = model(ids, mask)
    half = in_precision(lambda m, *inputs: m(*inputs), mx.bfloat16)(model, ids, mask)
    packed = [a.dtype for name, a in tree_flatten(model.parameters()) if name.endswith(".weight") and
              a.dtype == mx.uint32]
    assert packed  # the 4-bit base weights, untouched by the cast
    error = np.abs(np.array(half) - np.array(reference)).max() / np.abs(np.array(reference)).max()
    assert 0 < error < TOLERANCE["bf16"]


def test_doctor_reports_the_device_and_how_to_reach_an_nvidia_gpu(monkeypatch, capsys):
    import kbert.cli.doctor as doctor
    from kbert.cli import main

    monkeypatch.setattr(doctor, "nvidia_driver", lambda: True)
    main(["doctor"])
    captured = capsys.readouterr()
    assert "device: cpu (CPU backend" in captured.out and "in fp32 by default" in captured.out
    assert 'pip uninstall -y mlx-cpu mlx && pip install -e ".[cuda]"' in captured.err
