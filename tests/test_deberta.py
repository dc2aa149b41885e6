"""models/deberta_v2.py against Hugging Face transformers' DebertaV2Model / DebertaV2ForMaskedLM.

Random tiny configs with position_buckets (8) far below the longest sequence (40), so log buckets and the
clipping of relative positions are exercised; padded batches of mixed lengths; checkpoints read from
``save_pretrained`` folders (safetensors and .bin) through ``sanitize`` and the strict loader.
"""

import json

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten

from kbert.errors import KbertError
from kbert.models import deberta_v2
from kbert.models.deberta_v2 import (PRESETS, DebertaV2Config, DebertaV2ForMaskedLM, DebertaV2Model,
                                     build_relative_position, relative_indices, sanitize)
from kbert.models.encoders import read_weights
from kbert.models.recompute import set_recompute
from kbert.models.weights import load_state_strict
from tests.parity import relative_errors, save_reference

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
hf_deberta = pytest.importorskip("transformers.models.deberta_v2.modeling_deberta_v2")

NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
# DeBERTa-v3: log-bucketed relative positions, shared Q/K projections, LayerNorm on the relative embeddings,
# no absolute positions, no token types.
V3 = dict(vocab_size=99, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, intermediate_size=96,
          max_position_embeddings=64, relative_attention=True, position_buckets=8, norm_rel_ebd="layer_norm",
          share_att_key=True, pos_att_type="p2c|c2p", position_biased_input=False, type_vocab_size=0,
          max_relative_positions=-1, hidden_act="gelu")
# DeBERTa-v2 / v1-like: separate pos_key_proj/pos_query_proj, plain relative positions clipped at 12, absolute
# positions and token types, a factorised embedding (24 -> 48), and the v2-xlarge convolution.
V2 = dict(vocab_size=99, hidden_size=48, num_hidden_layers=2, num_attention_heads=4, intermediate_size=80,
          max_position_embeddings=64, relative_attention=True, position_buckets=-1, max_relative_positions=12,
          norm_rel_ebd="none", share_att_key=False, pos_att_type=["c2p", "p2c"], position_biased_input=True,
          type_vocab_size=2, embedding_size=24, conv_kernel_size=3, conv_act="tanh", hidden_act="gelu")
CONFIGS = {"v3": V3, "v2": V2}
# Forward only: c2p alone with its own pos_key_proj and log buckets clipped at 20; and no relative attention at
# all (Hugging Face still scales by sqrt(head_dim * (1 + len(pos_att_type))) there).
MORE = {"c2p only": {**V3, "share_att_key": False, "pos_att_type": ["c2p"], "max_relative_positions": 20},
        "absolute": {**V2, "relative_attention": False, "pos_att_type": "c2p", "conv_kernel_size": 0,
                     "norm_rel_ebd": "layer_norm"}}
LENGTHS = (40, 23, 6)
TOL = 1e-4


def batch(vocab=99):
    rng = np.random.default_rng(1)
    ids = np.zeros((len(LENGTHS), max(LENGTHS)), dtype=np.int32)
    mask = np.zeros_like(ids)
    for row, n in enumerate(LENGTHS):
        ids[row, :n] = rng.integers(1, vocab, n)
        mask[row, :n] = 1
    types = (np.arange(ids.shape[1])[None, :] >= 10).astype(np.int32) * mask
    return ids, mask, types


def torch_inputs(ids, mask, types):
    return dict(input_ids=torch.tensor(ids, dtype=torch.long), attention_mask=torch.tensor(mask),
                token_type_ids=torch.tensor(types, dtype=torch.long))


def saved_pair(values, folder, safe=True, cls="DebertaV2Model", ours_cls=DebertaV2Model, **extra):
    """A seeded random transformers model saved with save_pretrained, and ours loaded from that folder."""
    torch.manual_seed(0)
    reference = getattr(transformers, cls)(transformers.DebertaV2Config(**values, **NO_DROPOUT, **extra)).eval()
    with torch.no_grad():  # weights larger than the 0.02 init, so that attention is peaked and every term matters
        for name, p in reference.named_parameters():
            p.copy_(1 + 0.2 * torch.randn_like(p) if name.endswith("LayerNorm.weight") else 0.2 * torch.randn_like(p))
    save_reference(reference, folder, "safetensors" if safe else "bin")
    assert (folder / ("model.safetensors" if safe else "pytorch_model.bin")).is_file()
    config = DebertaV2Config.from_dict(json.loads((folder / "config.json").read_text()))
    ours = ours_cls(config)
    weights = read_weights(folder)
    load_state_strict(ours, sanitize(weights) if ours_cls is DebertaV2Model else weights, str(folder))
    ours.eval()
    return reference, ours


def max_diff(ours, expected, real=None):
    diff = np.abs(np.array(ours) - expected.detach().numpy())
    return float((diff if real is None else diff[real]).max())


@pytest.fixture
def clean_position_cache():
    relative_indices.cache_clear()
    yield
    relative_indices.cache_clear()


@pytest.mark.parametrize(("name", "safe"), [("v3", True), ("v3", False), ("v2", True), ("v2", False),
                                           ("c2p only", True), ("absolute", True)])
def test_every_hidden_state_and_attention_matches_transformers(name, safe, tmp_path):
    values = {**CONFIGS, **MORE}[name]
    reference, ours = saved_pair(values, tmp_path, safe)
    ids, mask, types = batch()
    with torch.no_grad():
        expected = reference(**torch_inputs(ids, mask, types), output_hidden_states=True, output_attentions=True)
    out = ours(mx.array(ids), mx.array(mask), mx.array(types), output_hidden_states=True, output_attentions=True)
    hidden, pooled, hidden_states, attentions = out
    assert pooled is None and len(hidden_states) == values["num_hidden_layers"] + 1
    real = mask.astype(bool)
    diffs = [max_diff(a, b, real) for a, b in zip(hidden_states, expected.hidden_states, strict=True)]
    assert max(diffs) <= TOL, diffs
    # Hugging Face's pairwise mask: even padded rows agree (uniform attention there).
    assert max(max_diff(a, b) for a, b in zip(hidden_states, expected.hidden_states)) <= TOL
    assert max(max_diff(a, b) for a, b in zip(attentions, expected.attentions, strict=True)) <= TOL
    assert attentions[0].shape == (len(LENGTHS), 4, max(LENGTHS), max(LENGTHS))
    # The plain call (no outputs asked for) is the same computation.
    plain = ours(mx.array(ids), mx.array(mask), mx.array(types))
    assert len(plain) == 2 and np.array_equal(np.array(plain[0]), np.array(hidden))
    assert max_diff(hidden, expected.last_hidden_state, real) <= TOL


def test_inputs_embeds_and_a_missing_mask(tmp_path):
    reference, ours = saved_pair(V3, tmp_path)
    ids = batch()[0][:1]  # the unpadded row
    with torch.no_grad():
        expected = reference(input_ids=torch.tensor(ids, dtype=torch.long)).last_hidden_state
    hidden = ours(mx.array(ids))[0]
    assert max_diff(hidden, expected) <= TOL
    embeds = ours.embeddings.word_embeddings(mx.array(ids))
    assert np.abs(np.array(ours(inputs_embeds=embeds)[0]) - np.array(hidden)).max() <= 1e-6


def gradients(reference, ours, recompute=False):
    """d/dweights of sum(probe * last_hidden_state) over real tokens, torch and ours, by parameter name."""
    ids, mask, types = batch()
    probe = np.random.default_rng(2).normal(size=(*ids.shape, ours.hidden_size)).astype(np.float32) * mask[..., None]
    reference.zero_grad()
    (reference(**torch_inputs(ids, mask, types)).last_hidden_state * torch.tensor(probe)).sum().backward()
    expected = {k: p.grad.numpy() for k, p in reference.named_parameters()}
    set_recompute(ours, recompute)

    def loss(model):
        return (model(mx.array(ids), mx.array(mask), mx.array(types))[0] * mx.array(probe)).sum()

    _, grads = nn.value_and_grad(ours, loss)(ours)
    return expected, {k: np.array(v) for k, v in tree_flatten(grads)}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_gradients_of_every_weight_match_transformers_with_and_without_recompute(name, tmp_path):
    reference, ours = saved_pair(CONFIGS[name], tmp_path)
    expected, grads = gradients(reference, ours)
    assert set(grads) == set(expected)
    # Absolute 1e-4, relative to the tensor's largest gradient where that exceeds 1.
    worst = relative_errors(grads, expected)
    assert max(worst.values()) <= TOL, sorted(worst.items(), key=lambda kv: -kv[1])[:3]
    assert np.abs(expected["encoder.rel_embeddings.weight"]).max() > 1e-3  # the relative table is trained

    _, recomputed = gradients(reference, ours, recompute=True)
    assert max(relative_errors(recomputed, grads).values()) <= 1e-5
    assert np.abs(recomputed["encoder.rel_embeddings.weight"]).max() > 1e-3


def test_recompute_that_captured_the_relative_embeddings_would_lose_their_gradient(tmp_path, monkeypatch):
    """Seeded mistake for call_layer's extra inputs: closed over instead of passed, rel_embeddings get no gradient."""
    reference, ours = saved_pair(V3, tmp_path)
    expected, _ = gradients(reference, ours)

    def closure_call_layer(layer, x, mask, recompute, *extra):
        def run(params, x, mask):
            layer.update(params)
            return layer(x, mask, *extra)
        return mx.checkpoint(run)(layer.trainable_parameters(), x, mask)

    monkeypatch.setattr(deberta_v2, "call_layer", closure_call_layer)
    _, wrong = gradients(reference, ours, recompute=True)
    assert relative_errors(wrong, expected)["encoder.rel_embeddings.weight"] > 1e-3


def test_recomputation_redraws_the_same_dropout_masks(monkeypatch):
    """Every dropout inside a layer draws from the recomputed layer's key (models/recompute.Dropout)."""
    ids, mask, _ = batch()

    def grads(seed=5):
        mx.random.seed(0)
        model = DebertaV2Model(DebertaV2Config.from_dict({**V3, "hidden_dropout_prob": 0.3,
                                                          "attention_probs_dropout_prob": 0.3}))
        set_recompute(model, True)
        model.train()
        mx.random.seed(seed)
        _, g = nn.value_and_grad(model, lambda m: m(mx.array(ids), mx.array(mask))[0].sum())(model)
        return {k: np.array(v) for k, v in tree_flatten(g)}

    recomputed = grads()
    monkeypatch.setattr(mx, "checkpoint", lambda fn: fn)  # the same code path, nothing recomputed
    kept = grads()
    assert max(np.abs(kept[k] - recomputed[k]).max() for k in kept) <= 1e-5
    other_seed = grads(seed=6)
    assert max(np.abs(kept[k] - other_seed[k]).max() for k in kept) > 1e-4  # dropout is really on


def _wrong_buckets(relative_pos, bucket_size, max_position):  # floor instead of ceil
    rel = np.asarray(relative_pos, dtype=np.int64)
    mid = bucket_size // 2
    abs_pos = np.where((rel < mid) & (rel > -mid), mid - 1, np.abs(rel))
    log_pos = np.floor(np.log(abs_pos / mid) / np.log((max_position - 1) / mid) * (mid - 1)) + mid
    return np.where(abs_pos <= mid, rel, log_pos * np.sign(rel)).astype(np.int64)


def _drop(kind):
    def apply(model, monkeypatch):
        for layer in model.encoder.layer:
            monkeypatch.setattr(layer.attention.self, kind, False)
    return apply


MISTAKES = {
    "bucket floor": lambda model, mp: mp.setattr(deberta_v2, "make_log_bucket_position", _wrong_buckets),
    "no c2p": _drop("c2p"),
    "no p2c": _drop("p2c"),
    "scale without the relative terms": lambda model, mp: [
        mp.setattr(layer.attention.self, "scale", layer.attention.self.head_dim ** -0.5)
        for layer in model.encoder.layer],
    "key-only padding mask": lambda model, mp: mp.setattr(
        deberta_v2, "pairwise_padding_mask",
        lambda m, dtype: ((1 - m.astype(dtype)) * mx.finfo(dtype).min)[None, :, None, :]),
}


@pytest.mark.parametrize("mistake", list(MISTAKES))
def test_seeded_mistakes_fail_the_comparison(mistake, tmp_path, monkeypatch, clean_position_cache):
    reference, ours = saved_pair(V3, tmp_path)
    ids, mask, types = batch()
    with torch.no_grad():
        expected = reference(**torch_inputs(ids, mask, types)).last_hidden_state
    assert max_diff(ours(mx.array(ids), mx.array(mask))[0], expected, mask.astype(bool)) <= TOL
    relative_indices.cache_clear()
    MISTAKES[mistake](ours, monkeypatch)
    hidden = ours(mx.array(ids), mx.array(mask))[0]
    # The padding mistake only shows on padded rows (real tokens never see padded ones); the rest on real tokens.
    real = None if mistake.startswith("key-only") else mask.astype(bool)
    assert max_diff(hidden, expected, real) > 1e-3


def test_log_buckets_equal_transformers_at_released_sizes():
    for buckets, max_position, length in [(256, 512, 1100), (8, 64, 200), (64, 128, 400)]:
        ours = build_relative_position(length, length, buckets, max_position)
        query = torch.zeros(1, length, 1)
        expected = hf_deberta.build_relative_position(query, query, buckets, max_position)[0].numpy()
        assert np.array_equal(ours, expected), (buckets, max_position)
    assert not np.array_equal(_wrong_buckets(ours, 64, 128), ours)


MLM_CASES = {"v3 legacy (cls.predictions)": (V3, {}), "v3 lm_predictions": (V3, {"legacy": False}),
             "v2 legacy, embedding_size 24": (V2, {})}


@pytest.mark.parametrize("case", list(MLM_CASES))
def test_masked_lm_logits_match_transformers(case, tmp_path):
    values, extra = MLM_CASES[case]
    reference, ours = saved_pair(values, tmp_path, cls="DebertaV2ForMaskedLM", ours_cls=DebertaV2ForMaskedLM, **extra)
    ids, mask, types = batch()
    with torch.no_grad():
        expected = reference(**torch_inputs(ids, mask, types)).logits
    logits = ours(mx.array(ids), mx.array(mask), mx.array(types))
    assert logits.shape == (*ids.shape, values["vocab_size"])
    assert max_diff(logits, expected, mask.astype(bool)) <= TOL
    assert np.abs(np.array(ours.logits(ours.deberta(mx.array(ids), mx.array(mask), mx.array(types))[0]))
                  - np.array(logits)).max() == 0
    # Names are exactly those transformers saved (the tied decoder is not stored).
    saved = set(read_weights(tmp_path))
    assert saved == {k for k, _ in tree_flatten(ours.parameters())}
    assert ("cls.predictions.bias" in saved) == (extra.get("legacy", True))

    weights = read_weights(tmp_path)
    head_bias = "cls.predictions.bias" if extra.get("legacy", True) else "lm_predictions.lm_head.bias"
    missing = {k: v for k, v in weights.items() if k != head_bias}
    with pytest.raises(KbertError, match=rf"missing keys: {head_bias.replace('.', '[.]')};"):
        load_state_strict(DebertaV2ForMaskedLM(ours.config), missing, "missing")
    unexpected = {**weights, "cls.predictions.decoder.weight": weights["deberta.embeddings.word_embeddings.weight"]}
    with pytest.raises(KbertError, match=r"unexpected keys: cls[.]predictions[.]decoder[.]weight"):
        load_state_strict(DebertaV2ForMaskedLM(ours.config), unexpected, "unexpected")


def test_sanitize_loads_task_checkpoints_and_a_renamed_key_fails(tmp_path):
    reference, ours = saved_pair(V3, tmp_path / "cls", cls="DebertaV2ForSequenceClassification")
    ids, mask, types = batch()
    with torch.no_grad():
        expected = reference.deberta(**torch_inputs(ids, mask, types)).last_hidden_state
    assert max_diff(ours(mx.array(ids), mx.array(mask))[0], expected, mask.astype(bool)) <= TOL
    weights = read_weights(tmp_path / "cls")
    assert any(k.startswith(("pooler.", "classifier.")) for k in weights)
    # A masked-LM checkpoint with both heads and the discriminator head of the released v3 models.
    lm = {**{f"deberta.{k}": v for k, v in sanitize(weights).items()}, "cls.predictions.bias": mx.zeros((99,)),
          "lm_predictions.lm_head.bias": mx.zeros((99,)), "mask_predictions.classifier.weight": mx.zeros((1, 64)),
          "deberta.embeddings.position_ids": mx.arange(64)[None]}
    load_state_strict(DebertaV2Model(ours.config), sanitize(lm), "masked-lm checkpoint")

    renamed = sanitize(weights)
    renamed["encoder.rel_embedding.weight"] = renamed.pop("encoder.rel_embeddings.weight")
    with pytest.raises(KbertError, match=r"missing keys: encoder[.]rel_embeddings[.]weight;"):
        load_state_strict(DebertaV2Model(ours.config), renamed, "renamed")


@pytest.mark.parametrize("name", list(PRESETS))
def test_presets_have_transformers_parameter_names_and_shapes(name):
    values = PRESETS[name]
    assert values["model_type"] == "deberta-v2"
    with torch.device("meta"):
        reference = transformers.DebertaV2Model(transformers.DebertaV2Config(**values))
    expected = {k: tuple(v.shape) for k, v in reference.state_dict().items() if not k.endswith("position_ids")}
    ours = {k: tuple(v.shape) for k, v in tree_flatten(DebertaV2Model(DebertaV2Config.from_dict(values)).parameters())}
    assert ours == expected


def test_config_round_trip_and_bad_configs():
    config = DebertaV2Config.from_dict({**V3, "unknown_key": 1, "architectures": ["DebertaV2ForMaskedLM"]})
    assert config.pos_att_type == ["p2c", "c2p"] and config.embedding_size == 64
    assert DebertaV2Config.from_dict(config.to_dict()) == config
    # What we write back builds the same model in transformers.
    with torch.device("meta"):
        reference = transformers.DebertaV2Model(transformers.DebertaV2Config(**config.to_dict()))
    assert set(reference.state_dict()) - {"embeddings.position_ids"} == \
        {k for k, _ in tree_flatten(DebertaV2Model(config).parameters())}
    with pytest.raises(ValueError, match="hidden_size 64 is not divisible by num_attention_heads 5"):
        DebertaV2Config.from_dict({**V3, "num_attention_heads": 5})
    with pytest.raises(ValueError, match="conv_kernel_size 4 must be odd"):
        DebertaV2Config.from_dict({**V2, "conv_kernel_size": 4})
    with pytest.raises(ValueError, match="unsupported conv_act 'swish2'"):
        DebertaV2Config.from_dict({**V2, "conv_act": "swish2"})
    with pytest.raises(ValueError, match="unsupported hidden_act 'gelu_fast'"):
        DebertaV2Config.from_dict({**V3, "hidden_act": "gelu_fast"})
    with pytest.raises(ValueError, match="position_buckets 8, max_relative_positions 5"):
        DebertaV2Config.from_dict({**V3, "max_relative_positions": 5})
    with pytest.raises(ValueError, match="needs embedding_size == hidden_size"):
        DebertaV2ForMaskedLM(DebertaV2Config.from_dict({**V2, "legacy": False}))
