
import json

import mlx.core as mx
import numpy as np
import pytest
import torch
import transformers
from mlx.utils import tree_flatten

from kbert.errors import KbertError
from kbert.models.modernbert import PRESETS, ModernBertConfig, ModernBertModel, sanitize
from kbert.models.weights import load_state_strict

# 4 layers, global every 3rd: layers 0 and 3 global, 1 and 2 local with a window of +-4 tokens.
# Distinct, small rope thetas so that swapping or ignoring them shows at sequence length 40.
TINY = {"vocab_size": 100, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4,
        "num_attention_heads": 4, "max_position_embeddings": 128, "global_attn_every_n_layers": 3,
        "local_attention": 8, "global_rope_theta": 500.0, "local_rope_theta": 30.0, "pad_token_id": 0,
        "bos_token_id": 1, "eos_token_id": 2, "cls_token_id": 1, "sep_token_id": 2,
        "initializer_range": 0.2}  # 10x the default, so that attention and positions weigh in the outputs
SEQ_LEN, LENGTHS = 40, (40, 23, 9)
TOL = 1e-4


def hf_config(attn_implementation="eager", **overrides):
    return transformers.ModernBertConfig(**{**TINY, **overrides}, attn_implementation=attn_implementation)


def hf_model(attn_implementation="eager", **overrides):
    torch.manual_seed(0)
    return transformers.ModernBertModel(hf_config(attn_implementation, **overrides)).eval()


def to_mlx(state_dict):
    return {k: mx.array(v.detach().numpy()) for k, v in state_dict.items()}


def ours_from(hf):
    model = ModernBertModel(ModernBertConfig.from_dict(hf.config.to_dict()))
    load_state_strict(model, sanitize(to_mlx(hf.state_dict())), "hf")
    model.eval()
    return model


@pytest.fixture(scope="module")
def pair():
    hf = hf_model()
    return hf, ours_from(hf)


def padded_batch(seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, TINY["vocab_size"], size=(len(LENGTHS), SEQ_LEN))
    mask = np.zeros_like(ids)
    for row, n in enumerate(LENGTHS):
        mask[row, :n] = 1
        ids[row, n:] = TINY["pad_token_id"]
    return ids, mask


def max_diff_at_real(ref, got, mask):
    return float(np.abs(ref - got)[mask.astype(bool)].max())


def test_tiny_config_mixes_global_and_local_layers_shorter_than_the_sequence(pair):
    hf, ours = pair
    assert hf.config.layer_types == ["full_attention", "sliding_attention", "sliding_attention", "full_attention"]
    assert [layer.is_local for layer in ours.layers] == [False, True, True, False]
    assert 2 * ours.config.sliding_window + 1 < SEQ_LEN


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_hidden_states_match_transformers(attn_implementation):
    # Dropout rates are set so that the check also covers eval mode switching every dropout off.
    hf = hf_model(attn_implementation, attention_dropout=0.1, mlp_dropout=0.1, embedding_dropout=0.1)
    ours = ours_from(hf)
    ids, mask = padded_batch()
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).last_hidden_state.numpy()
    hidden, second = ours(mx.array(ids), mx.array(mask))
    assert second is None
    got = np.array(hidden)
    assert np.isfinite(got).all()
    assert max_diff_at_real(ref, got, mask) <= TOL


def test_no_mask_matches_transformers(pair):
    hf, ours = pair
    ids, _ = padded_batch(1)
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor(ids)).last_hidden_state.numpy()
    np.testing.assert_allclose(np.array(ours(mx.array(ids))[0]), ref, atol=TOL, rtol=0)


def test_input_embedding_gradients_match_transformers(pair):
    hf, ours = pair
    _, mask = padded_batch()
    rng = np.random.default_rng(1)
    embeds = rng.standard_normal((len(LENGTHS), SEQ_LEN, TINY["hidden_size"])).astype(np.float32)
    weights = rng.standard_normal(embeds.shape).astype(np.float32)

    torch_embeds = torch.tensor(embeds).requires_grad_()
    out = hf(inputs_embeds=torch_embeds, attention_mask=torch.tensor(mask)).last_hidden_state
    (out * torch.tensor(weights) * torch.tensor(mask)[..., None]).sum().backward()
    ref = torch_embeds.grad.numpy()

    mask_mx, weights_mx = mx.array(mask), mx.array(weights)

    def loss(x):
        return (ours(inputs_embeds=x, attention_mask=mask_mx)[0] * weights_mx * mask_mx[..., None]).sum()

    got = np.array(mx.grad(loss)(mx.array(embeds)))
    assert np.abs(ref).max() > 1e-3
    assert float(np.abs(ref - got).max()) <= TOL


def test_token_order_matters():
    # Without positions the encoder (symmetric window included) is reversal-equivariant to ~1e-6: RoPE breaks it.
    # MLX's default init rather than transformers' small one, so attention weighs enough to show it.
    mx.random.seed(0)
    model = ModernBertModel(ModernBertConfig.from_dict(TINY))
    model.eval()
    ids, _ = padded_batch()
    row = mx.array(ids[:1])
    forward = np.array(model(row)[0])[0]
    backward = np.array(model(row[:, ::-1])[0])[0, ::-1]
    assert np.abs(forward - backward).max() > 1e-2


def test_local_layers_see_only_their_window():
    # Two local layers of +-4 tokens: position p sees tokens within 8 of it, and nothing farther.
    config = ModernBertConfig.from_dict({**TINY, "num_hidden_layers": 2, "layer_types": ["sliding_attention"] * 2})
    mx.random.seed(0)
    model = ModernBertModel(config)
    model.eval()
    ids, _ = padded_batch()
    changed = ids[:1].copy()
    changed[0, 30] = (changed[0, 30] + 1) % TINY["vocab_size"]
    base, moved = (np.array(model(mx.array(x))[0])[0] for x in (ids[:1], changed))
    delta = np.abs(base - moved).max(axis=-1)
    assert delta[:22].max() == 0 and delta[39] == 0
    assert delta[22:39].min() > 0


def test_dropout_only_in_training():
    hf = hf_model(attention_dropout=0.2, mlp_dropout=0.2, embedding_dropout=0.2)
    ours = ours_from(hf)
    ids, mask = padded_batch()
    ids, mask = mx.array(ids), mx.array(mask)
    evaluated = [np.array(ours(ids, mask)[0]) for _ in range(2)]
    np.testing.assert_array_equal(*evaluated)
    ours.train()
    trained = [np.array(ours(ids, mask)[0]) for _ in range(2)]
    assert np.isfinite(trained[0]).all() and np.abs(trained[0] - trained[1]).max() > 1e-3


def test_parameters_are_exactly_the_transformers_weights(pair):
    hf, ours = pair
    ours_params = dict(tree_flatten(ours.trainable_parameters()))
    assert set(ours_params) == set(hf.state_dict())
    n_ours = sum(v.size for v in ours_params.values())
    assert n_ours == sum(p.numel() for p in hf.parameters()) == sum(v.numel() for v in hf.state_dict().values())
    assert "layers.0.attn_norm.weight" not in ours_params and "layers.1.attn_norm.weight" in ours_params


def test_masked_lm_checkpoint_loads_into_the_encoder(pair):
    hf, ours = pair
    torch.manual_seed(1)
    mlm = transformers.ModernBertForMaskedLM(hf.config)
    weights = to_mlx(mlm.state_dict())
    assert any(k.startswith(("head.", "decoder.")) for k in weights)
    model = ModernBertModel(ours.config)
    load_state_strict(model, sanitize(weights), "mlm")
    np.testing.assert_array_equal(np.array(model.layers[1].mlp.Wi.weight),
                                  mlm.model.layers[1].mlp.Wi.weight.detach().numpy())


def test_renamed_key_is_reported(pair):
    hf, ours = pair
    weights = to_mlx(hf.state_dict())
    weights["layers.1.attn.Wqkv_renamed.weight"] = weights.pop("layers.1.attn.Wqkv.weight")
    with pytest.raises(KbertError, match="layers.1.attn.Wqkv_renamed.weight"):
        load_state_strict(ModernBertModel(ours.config), sanitize(weights), "renamed")
    weights = to_mlx(hf.state_dict())
    weights["model.mystery"] = weights["final_norm.weight"]
    with pytest.raises(KbertError, match="mystery"):
        load_state_strict(ModernBertModel(ours.config), sanitize(weights), "unknown")


USED_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
               "hidden_activation", "norm_eps", "norm_bias", "attention_bias", "attention_dropout", "mlp_bias",
               "mlp_dropout", "embedding_dropout", "local_attention", "pad_token_id", "classifier_pooling")


def assert_same_as_hf(ours: ModernBertConfig, hf: transformers.ModernBertConfig):
    for name in USED_FIELDS:
        assert getattr(ours, name) == getattr(hf, name), name
    assert [ours.layer_type(i) for i in range(ours.num_hidden_layers)] == hf.layer_types
    assert ours.global_rope_theta == hf.rope_parameters["full_attention"]["rope_theta"]
    assert ours.local_rope_theta == hf.rope_parameters["sliding_attention"]["rope_theta"]
    assert ours.sliding_window == hf.sliding_window


def test_config_reads_transformers_configs(tmp_path):
    hf = hf_config(norm_bias=True, mlp_bias=True, attention_dropout=0.1, classifier_pooling="mean")
    assert_same_as_hf(ModernBertConfig.from_dict(hf.to_dict()), hf)
    hf.save_pretrained(tmp_path)  # transformers 5 writes layer_types and rope_parameters
    saved = json.loads((tmp_path / "config.json").read_text())
    assert "rope_parameters" in saved and "layer_types" in saved
    assert_same_as_hf(ModernBertConfig.from_dict(saved), hf)
    # Our own dict round-trips and is one transformers understands.
    ours = ModernBertConfig.from_dict(saved)
    assert ModernBertConfig.from_dict(ours.to_dict()) == ours
    assert_same_as_hf(ours, transformers.ModernBertConfig(**ours.to_dict()))


def test_config_reads_old_flat_hub_keys():
    # The shape of answerdotai/ModernBERT-base's config.json (written by transformers 4.48).
    old = {**PRESETS["modernbert-base"], "num_hidden_layers": 5, "global_attn_every_n_layers": 2,
           "global_rope_theta": 1000.0, "local_rope_theta": 20.0, "reference_compile": True,
           "architectures": ["ModernBertForMaskedLM"], "model_type": "modernbert"}
    assert_same_as_hf(ModernBertConfig.from_dict(old), transformers.ModernBertConfig(**old))


def test_presets():
    base = ModernBertConfig.from_dict(PRESETS["modernbert-base"])
    assert_same_as_hf(base, transformers.ModernBertConfig())  # transformers' defaults are ModernBERT-base
    large = ModernBertConfig.from_dict(PRESETS["modernbert-large"])
    assert (large.num_hidden_layers, large.hidden_size, large.num_attention_heads, large.intermediate_size) == (
        28, 1024, 16, 2624)
    assert large.layer_type(27) == "full_attention" and large.layer_type(28 - 2) == "sliding_attention"


def test_unsupported_rope_is_rejected():
    values = hf_config().to_dict()
    values["rope_parameters"]["full_attention"] = {"rope_type": "linear", "rope_theta": 10.0, "factor": 2.0}
    with pytest.raises(ValueError, match="linear"):
        ModernBertConfig.from_dict(values)
