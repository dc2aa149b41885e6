"""NeoBERT in MLX against the PyTorch reference fixture in tests/data/neobert-tiny (see its README.md)."""


import json
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

from kbert.errors import KbertError
from kbert.models.neobert import PRESETS, NeoBertConfig, NeoBertModel, apply_rope, sanitize
from kbert.models.weights import load_state_strict

FIXTURE = Path(__file__).parent / "data" / "neobert-tiny"
TOL = 1e-4  # the README's suggested float32 tolerance; measured max abs error is ~7e-7


@pytest.fixture(scope="module")
def config() -> NeoBertConfig:
    return NeoBertConfig.from_dict(json.loads((FIXTURE / "config.json").read_text()))


@pytest.fixture(scope="module")
def weights() -> dict[str, mx.array]:
    return mx.load(str(FIXTURE / "model.safetensors"))


@pytest.fixture(scope="module")
def inputs() -> dict[str, np.ndarray]:
    return dict(np.load(FIXTURE / "inputs.npz"))


@pytest.fixture(scope="module")
def expected() -> dict[str, np.ndarray]:
    return dict(np.load(FIXTURE / "expected.npz"))


def load_model(config: NeoBertConfig, weights: dict[str, mx.array]) -> NeoBertModel:
    model = NeoBertModel(config)
    load_state_strict(model, sanitize(weights), "neobert-tiny")
    model.eval()
    return model


@pytest.fixture(scope="module")
def model(config, weights) -> NeoBertModel:
    return load_model(config, weights)


def run(model: NeoBertModel, input_ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    hidden, pooled = model(mx.array(input_ids), mx.array(mask))
    assert pooled is None
    return np.array(hidden)


def mean_pool(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    m = mask.astype(hidden.dtype)[..., None]
    return (hidden * m).sum(1) / m.sum(1)


def real_diff(a: np.ndarray, b: np.ndarray, mask: np.ndarray) -> float:
    """Max abs difference over real (mask == 1) positions only."""
    return float(np.abs(a - b)[mask.astype(bool)].max())


def test_config_reads_fixture_and_round_trips(config):
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads) == (64, 3, 4)
    assert config.norm_eps == 1e-6 and config.max_length == 64 and config.dim_head == 16
    assert config.ffn_inner_size == 88
    assert NeoBertConfig.from_dict(config.to_dict()) == config
    base = NeoBertConfig.from_dict(PRESETS["neobert"])
    assert base.ffn_inner_size == 2048 and base.norm_eps == 1e-5 and base.max_length == 4096
    with pytest.raises(ValueError, match="dim_head"):
        NeoBertConfig.from_dict({**config.to_dict(), "dim_head": 32})
    with pytest.raises(ValueError, match="released NeoBERT"):
        NeoBertConfig.from_dict({"rope": False})


def test_fixture_parity(model, inputs, expected):
    mask = inputs["attention_mask"]
    hidden = run(model, inputs["input_ids"], mask)
    hidden_err = real_diff(hidden, expected["last_hidden_state"], mask)
    pooled_err = float(np.abs(mean_pool(hidden, mask) - expected["mean_pooled"]).max())
    print(f"neobert-tiny parity: last_hidden_state {hidden_err:.2e}, mean_pooled {pooled_err:.2e}")
    assert hidden_err <= TOL
    assert pooled_err <= TOL


def test_parity_without_padding(model, inputs, expected):
    """Each sequence alone, unpadded, matches the padded batch's reference outputs."""
    for row, length in enumerate(inputs["attention_mask"].sum(1)):
        ids = inputs["input_ids"][row : row + 1, :length]
        hidden = run(model, ids, np.ones_like(ids))
        assert np.abs(hidden[0] - expected["last_hidden_state"][row, :length]).max() <= TOL


def test_token_order_matters(model, inputs, expected):
    """RoPE is active: reversing the real tokens changes the aligned outputs well beyond the tolerance."""
    ids, mask = inputs["input_ids"].copy(), inputs["attention_mask"]
    for row, length in enumerate(mask.sum(1)):
        ids[row, :length] = ids[row, :length][::-1]
    hidden = run(model, ids, mask)
    aligned = hidden.copy()
    for row, length in enumerate(mask.sum(1)):
        aligned[row, :length] = hidden[row, :length][::-1]
    assert real_diff(aligned, expected["last_hidden_state"], mask) > 1e-3


def test_rope_matches_reference_float32_table_to_max_length():
    """Adjacent-pair rotation with the reference's float32 angles t * (1 / 10000 ** (2i / d)), to position 4095."""
    d, length = 16, 4096
    x = np.random.default_rng(0).standard_normal((1, 2, length, d)).astype(np.float32)
    inv_freq = (np.float32(1.0) / np.float32(10000.0) ** (np.arange(0, d, 2, dtype=np.float32) / np.float32(d)))
    angle = (np.arange(length, dtype=np.float32)[:, None] * inv_freq[None, :]).astype(np.float64)
    cos, sin = np.cos(angle), np.sin(angle)
    x0, x1 = x[..., 0::2].astype(np.float64), x[..., 1::2].astype(np.float64)
    want = np.empty(x.shape)
    want[..., 0::2], want[..., 1::2] = x0 * cos - x1 * sin, x0 * sin + x1 * cos
    got = np.array(apply_rope(mx.array(x)))
    assert np.abs(got - want).max() < 1e-5
    # The half-split (NeoX) layout is a different function.
    neox = np.array(mx.fast.rope(mx.array(x), d, traditional=False, base=10000.0, scale=1.0, offset=0))
    assert np.abs(neox - want).max() > 1e-2


@pytest.mark.parametrize("name", ["transformer_encoder.1.attention_norm.weight", "layer_norm.weight"])
def test_norm_weights_matter(config, weights, inputs, expected, name):
    changed = dict(weights)
    changed[name] = mx.ones_like(weights[name])
    hidden = run(load_model(config, changed), inputs["input_ids"], inputs["attention_mask"])
    assert real_diff(hidden, expected["last_hidden_state"], inputs["attention_mask"]) > 1e-2


def test_padding_mask_matters(model, inputs, expected):
    mask = inputs["attention_mask"]
    hidden = run(model, inputs["input_ids"], np.ones_like(mask))
    assert real_diff(hidden, expected["last_hidden_state"], mask) > 1e-2


def test_all_padding_row_is_finite(model):
    ids = np.array([[5, 6, 7, 0], [0, 0, 0, 0]], dtype=np.int32)
    mask = np.array([[1, 1, 1, 0], [0, 0, 0, 0]], dtype=np.int32)
    assert np.isfinite(run(model, ids, mask)).all()


def test_masked_lm_checkpoint_loads_identically(config, weights, inputs, expected):
    vocab, hidden = weights["encoder.weight"].shape
    lm = {f"model.{k}": v for k, v in weights.items()}
    lm["decoder.weight"] = mx.zeros((vocab, hidden))
    lm["decoder.bias"] = mx.zeros((vocab,))
    out = run(load_model(config, lm), inputs["input_ids"], inputs["attention_mask"])
    ref = run(load_model(config, weights), inputs["input_ids"], inputs["attention_mask"])
    assert np.array_equal(out, ref)


def test_renamed_key_is_reported(config, weights):
    broken = dict(weights)
    broken["transformer_encoder.2.wo.weights"] = broken.pop("transformer_encoder.2.wo.weight")
    with pytest.raises(KbertError, match=r"transformer_encoder\.2\.wo\.weights") as info:
        load_state_strict(NeoBertModel(config), sanitize(broken), "broken")
    assert "missing keys: transformer_encoder.2.wo.weight;" in str(info.value)  # also listed as missing


def test_split_swiglu_checkpoint_loads_identically(config, weights, inputs):
    split = {}
    for name, value in weights.items():
        if name.endswith("ffn.w12.weight"):
            gate, up = mx.split(value, 2, axis=0)
            split[name.replace("w12", "w1")], split[name.replace("w12", "w2")] = gate, up
        else:
            split[name] = value
    assert not any("w12" in k for k in split)
    restored = sanitize({f"model.{k}": v for k, v in split.items()})
    assert set(restored) == set(weights)
    for name in weights:
        assert np.array_equal(np.array(restored[name]), np.array(weights[name])), name
    out = run(load_model(config, split), inputs["input_ids"], inputs["attention_mask"])
    ref = run(load_model(config, weights), inputs["input_ids"], inputs["attention_mask"])
    assert np.array_equal(out, ref)


def test_sanitize_keeps_unknown_names():
    weights = {"model.pooler.weight": mx.zeros((2,)), "decoder.weight": mx.zeros((2,)), "freqs_cis": mx.zeros((2,))}
    assert set(sanitize(weights)) == {"pooler.weight"}


def test_inputs_embeds_equals_lookup_and_token_types_are_ignored(model, inputs):
    ids, mask = mx.array(inputs["input_ids"]), mx.array(inputs["attention_mask"])
    by_ids, _ = model(ids, mask)
    by_embeds, _ = model(attention_mask=mask, inputs_embeds=model.encoder(ids), token_type_ids=mx.ones_like(ids))
    assert np.array_equal(np.array(by_ids), np.array(by_embeds))
    assert model.hidden_size == 64


def test_too_long_sequence_is_rejected(model):
    with pytest.raises(ValueError, match="max_length"):
        model(mx.zeros((1, 65), dtype=mx.int32))


def test_gradients_wrt_inputs_embeds(model, inputs):
    ids, mask = mx.array(inputs["input_ids"]), mx.array(inputs["attention_mask"])
    embeds = model.encoder(ids)
    weights = mx.array(np.random.default_rng(1).standard_normal((3, 32, 64)).astype(np.float32))

    def loss(x: mx.array) -> mx.array:
        hidden, _ = model(attention_mask=mask, inputs_embeds=x)
        return (hidden * weights * mask[..., None]).sum()

    grad = mx.grad(loss)(embeds)
    assert grad.shape == embeds.shape and bool(mx.isfinite(grad).all()) and float(mx.abs(grad).max()) > 0
    # Directional derivative against a central finite difference.
    direction = mx.array(np.random.default_rng(2).standard_normal(embeds.shape).astype(np.float32))
    eps = 1e-3
    numeric = (loss(embeds + eps * direction) - loss(embeds - eps * direction)).item() / (2 * eps)
    analytic = (grad * direction).sum().item()
    assert abs(numeric - analytic) <= 2e-2 * abs(analytic) + 1e-2


def test_trainable_parameters_are_exactly_the_checkpoint(config, weights):
    model = NeoBertModel(config)
    params = dict(tree_flatten(model.trainable_parameters()))
    assert set(params) == set(weights)
    assert sum(v.size for v in params.values()) == sum(v.size for v in weights.values())


def test_fresh_init_follows_reference(config):
    model = NeoBertModel(config)
    assert float(mx.abs(model.encoder.weight).max()) <= config.embedding_init_range
    assert float(mx.abs(model.transformer_encoder[0].qkv.weight).max()) <= config.decoder_init_range
    assert np.array_equal(np.array(model.layer_norm.weight), np.ones(config.hidden_size, dtype=np.float32))
