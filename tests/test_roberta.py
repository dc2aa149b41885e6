"""models/roberta.py against Hugging Face transformers.RobertaModel / XLMRobertaModel / RobertaForMaskedLM.

Random tiny models, saved to disk (safetensors by ``save_pretrained``; a legacy ``pytorch_model.bin`` by
``torch.save`` of the state dict, since transformers 5 ignores ``safe_serialization=False`` and writes
safetensors anyway), read back through ``read_weights`` + ``sanitize`` + the strict loader. Padded batches
mix lengths and include a left-padded row (RoBERTa's position ids skip padding tokens). Every comparison
is on real tokens only, within 1e-4: absolute for outputs, and for gradients relative to the tensor's largest
gradient where that exceeds 1.
"""

import json

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten

from kbert.errors import KbertError
from kbert.models import roberta
from kbert.models.encoders import read_weights
from kbert.models.recompute import set_recompute
from kbert.models.roberta import RobertaConfig, RobertaForMaskedLM, RobertaModel, sanitize
from kbert.models.weights import load_state_strict
from tests.parity import real_diff, relative_errors, save_reference

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

PAD = 1
TINY = dict(vocab_size=99, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=48,
            max_position_embeddings=48, type_vocab_size=1, layer_norm_eps=1e-5, pad_token_id=PAD, hidden_act="gelu",
            attn_implementation="eager")  # eager: the attention probabilities are returned
LENGTHS = (40, 23, 6, -17)  # negative: left-padded
TOL = 1e-4  # absolute


def batch():
    rng = np.random.default_rng(1)
    ids = np.full((len(LENGTHS), max(abs(n) for n in LENGTHS)), PAD, dtype=np.int64)
    mask = np.zeros_like(ids)
    for row, n in enumerate(LENGTHS):
        span = slice(0, n) if n > 0 else slice(ids.shape[1] + n, None)
        ids[row, span] = rng.integers(PAD + 1, TINY["vocab_size"], abs(n))  # real tokens are never PAD
        mask[row, span] = 1
    return ids, mask


def load_ours(folder, cls=RobertaModel):
    values = json.loads((folder / "config.json").read_text())
    model = cls(RobertaConfig.from_dict(values))
    load_state_strict(model, sanitize(read_weights(folder)), str(folder))
    model.eval()
    return model


@pytest.fixture(scope="module")
def reference():
    torch.manual_seed(0)
    return transformers.RobertaModel(transformers.RobertaConfig(**TINY), add_pooling_layer=True).eval()


@pytest.fixture(scope="module", params=["safetensors", "bin"])
def saved(request, reference, tmp_path_factory):
    return save_reference(reference, tmp_path_factory.mktemp("roberta") / request.param, request.param)


def test_every_hidden_state_attention_and_the_pooler_match_transformers(reference, saved):
    ours = load_ours(saved)
    assert ours.config.model_type == "roberta" and ours.config.add_pooling_layer
    ids, mask = batch()
    with torch.no_grad():
        expected = reference(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                             output_hidden_states=True, output_attentions=True)
    hidden, pooled, hidden_states, attentions = ours(mx.array(ids), mx.array(mask), output_hidden_states=True,
                                                     output_attentions=True)
    assert len(hidden_states) == len(expected.hidden_states) == TINY["num_hidden_layers"] + 1
    assert len(attentions) == len(expected.attentions) == TINY["num_hidden_layers"]
    diffs = [real_diff(a, b, mask) for a, b in zip(hidden_states, expected.hidden_states)]
    # Attention probabilities (batch, heads, query, key) on real query rows (padded keys are 0 in both).
    diffs += [real_diff(np.array(a).transpose(0, 2, 1, 3), b.transpose(1, 2), mask)
              for a, b in zip(attentions, expected.attentions)]
    diffs += [real_diff(hidden, expected.last_hidden_state, mask),
              float(np.abs(np.array(pooled) - expected.pooler_output.numpy()).max())]
    assert max(diffs) <= TOL, diffs


def test_inputs_embeds_use_sequential_positions_as_transformers(reference, saved):
    ours = load_ours(saved)
    ids, mask = batch()
    embeds = np.random.default_rng(3).normal(size=(*ids.shape, TINY["hidden_size"])).astype(np.float32)
    with torch.no_grad():
        expected = reference(inputs_embeds=torch.tensor(embeds), attention_mask=torch.tensor(mask))
    hidden, _ = ours(None, mx.array(mask), inputs_embeds=mx.array(embeds))
    assert real_diff(hidden, expected.last_hidden_state, mask) <= TOL


def test_gradients_of_every_weight_match_transformers(reference, saved):
    ours = load_ours(saved)
    ids, mask = batch()
    rng = np.random.default_rng(2)
    probe = rng.normal(size=(*ids.shape, TINY["hidden_size"])).astype(np.float32) * mask[..., None]
    pooled_probe = rng.normal(size=(len(LENGTHS), TINY["hidden_size"])).astype(np.float32)

    reference.zero_grad()
    out = reference(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask))
    ((out.last_hidden_state * torch.tensor(probe)).sum() + (out.pooler_output * torch.tensor(pooled_probe)).sum()
     ).backward()
    expected = sanitize({name: p.grad.numpy() for name, p in reference.named_parameters()})

    def loss(model):
        hidden, pooled = model(mx.array(ids), mx.array(mask))
        return (hidden * mx.array(probe)).sum() + (pooled * mx.array(pooled_probe)).sum()

    _, grads = nn.value_and_grad(ours, loss)(ours)
    grads = dict(tree_flatten(grads))
    assert set(grads) == set(expected)
    # Relative to each tensor's largest gradient where that exceeds 1: the embedding tables' rows sum the
    # gradients of up to 160 tokens (magnitudes in the hundreds), and float32 sums in another order differ by ~1e-4.
    diffs = relative_errors(grads, expected)
    assert max(diffs.values()) <= TOL, sorted(diffs.items(), key=lambda kv: -kv[1])[:3]
    # The left-padded row's pooled state is a padding token's: as torch's padding_idx, its table rows get no gradient.
    assert np.abs(np.array(grads["embeddings.token_type_embeddings.weight"])).max() > 0
    for table in ("word_embeddings", "position_embeddings"):
        assert not np.array(grads[f"embeddings.{table}.weight"])[PAD].any()

    # Gradient checkpointing through BERT's encoder gives the same gradients.
    set_recompute(ours, True)
    assert ours.encoder.recompute_layers
    _, recomputed = nn.value_and_grad(ours, loss)(ours)
    assert max(float(np.abs(np.array(g) - np.array(grads[k])).max()) for k, g in tree_flatten(recomputed)) <= 1e-6


@pytest.mark.parametrize("mistake", ["bert_positions", "ignore_padding"])
def test_position_ids_without_roberta_padding_rules_are_caught(reference, saved, monkeypatch, mistake):
    ids, mask = batch()
    with torch.no_grad():
        expected = reference(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).last_hidden_state
    ours = load_ours(saved)
    hidden, _ = ours(mx.array(ids), mx.array(mask))
    assert real_diff(hidden, expected, mask) <= TOL
    offset = 0 if mistake == "bert_positions" else PAD + 1  # BERT's arange, or counting padding tokens too
    monkeypatch.setattr(roberta, "create_position_ids_from_input_ids",
                        lambda input_ids, padding_idx: mx.broadcast_to(mx.arange(input_ids.shape[1]) + offset,
                                                                       input_ids.shape))
    hidden, _ = ours(mx.array(ids), mx.array(mask))
    assert real_diff(hidden, expected, mask) > 1e-3


def test_position_ids_are_hugging_faces():
    ids = mx.array([[5, 6, 7, PAD, PAD], [PAD, PAD, 8, 9, 10]])
    expected = transformers.models.roberta.modeling_roberta.RobertaEmbeddings.create_position_ids_from_input_ids(
        torch.tensor(np.array(ids), dtype=torch.long), PAD)
    assert np.array_equal(np.array(roberta.create_position_ids_from_input_ids(ids, PAD)), expected.numpy())
    assert np.array(roberta.create_position_ids_from_input_ids(ids, PAD)).tolist() == [[2, 3, 4, 1, 1],
                                                                                       [1, 1, 2, 3, 4]]
    # No parameter holds positions: they are computed per call.
    names = [k for k, _ in tree_flatten(RobertaModel(RobertaConfig.from_dict(TINY)).parameters())]
    assert not any("position_ids" in k for k in names)
    # A sequence whose last position would fall off the table is refused, not silently read out of bounds.
    model = RobertaModel(RobertaConfig.from_dict(TINY))
    with pytest.raises(ValueError, match="max_position_embeddings >= 49"):
        model(mx.full((1, 47), 5))


def test_strict_loading_reports_missing_and_unexpected_keys(reference, saved):
    weights = sanitize(read_weights(saved))
    config = RobertaConfig.from_dict(json.loads((saved / "config.json").read_text()))

    missing = dict(weights)
    missing.pop("encoder.layer.1.attention.self.query.weight")
    with pytest.raises(KbertError, match=r"missing keys: encoder\.layer\.1\.attention\.self\.query\.weight;"):
        load_state_strict(RobertaModel(config), missing, "missing")

    unexpected = {**weights, "encoder.layer.1.attention.self.query.weights": weights["pooler.dense.weight"]}
    with pytest.raises(KbertError, match=r"unexpected keys: encoder\.layer\.1\.attention\.self\.query\.weights"):
        load_state_strict(RobertaModel(config), unexpected, "unexpected")

    # sanitize passes the pooler through: a model built without one refuses it rather than dropping it.
    with pytest.raises(KbertError, match=r"unexpected keys: pooler\.dense\.bias, pooler\.dense\.weight"):
        load_state_strict(RobertaModel(RobertaConfig.from_dict({**config.to_dict(), "add_pooling_layer": False})),
                          weights, "no pooler")


def test_sanitize_handles_task_checkpoints(reference):
    weights = {f"roberta.{k}": mx.array(v.numpy()) for k, v in reference.state_dict().items()}
    weights["roberta.embeddings.position_ids"] = mx.arange(TINY["max_position_embeddings"])[None]
    weights["lm_head.bias"] = mx.zeros((TINY["vocab_size"],))
    weights["lm_head.decoder.weight"] = weights["roberta.embeddings.word_embeddings.weight"]
    weights["classifier.dense.weight"] = mx.zeros((2, TINY["hidden_size"]))
    ours = RobertaModel(RobertaConfig.from_dict(reference.config.to_dict()))
    load_state_strict(ours, sanitize(weights), "task checkpoint")
    # Parameters are exactly the reference's.
    assert sum(v.size for _, v in tree_flatten(ours.trainable_parameters())) == sum(
        p.numel() for p in reference.parameters())


def test_xlm_roberta_config_and_weights_load_into_roberta_model(tmp_path):
    torch.manual_seed(4)
    reference = transformers.XLMRobertaModel(transformers.XLMRobertaConfig(**TINY)).eval()
    reference.save_pretrained(tmp_path)
    values = json.loads((tmp_path / "config.json").read_text())
    assert values["model_type"] == "xlm-roberta"
    ours = load_ours(tmp_path)
    assert ours.config.model_type == "xlm-roberta" and RobertaConfig.from_dict(ours.config.to_dict()) == ours.config
    ids, mask = batch()
    with torch.no_grad():
        expected = reference(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask))
    hidden, pooled = ours(mx.array(ids), mx.array(mask))
    assert real_diff(hidden, expected.last_hidden_state, mask) <= TOL
    assert float(np.abs(np.array(pooled) - expected.pooler_output.numpy()).max()) <= TOL
    with pytest.raises(ValueError, match="model_type 'bert'"):
        RobertaConfig.from_dict({**values, "model_type": "bert"})


@pytest.mark.parametrize("tied", [True, False])
def test_masked_lm_logits_match_transformers(tmp_path, tied):
    torch.manual_seed(5)
    reference = transformers.RobertaForMaskedLM(transformers.RobertaConfig(**TINY, tie_word_embeddings=tied)).eval()
    with torch.no_grad():  # distinct biases: an untied transformers 5 model computes with lm_head.decoder.bias
        reference.lm_head.bias.normal_()
        reference.lm_head.decoder.bias.normal_()
    reference.save_pretrained(tmp_path)
    weights = read_weights(tmp_path)
    head = {k for k in weights if k.startswith("lm_head.")}
    if tied:
        assert head == {"lm_head.bias", "lm_head.dense.weight", "lm_head.dense.bias", "lm_head.layer_norm.weight",
                        "lm_head.layer_norm.bias"}
    else:
        assert {"lm_head.decoder.weight", "lm_head.decoder.bias", "lm_head.bias"} <= head
        weights["lm_head.bias"] = weights.pop("lm_head.decoder.bias")
    config = RobertaConfig.from_dict(json.loads((tmp_path / "config.json").read_text()))
    ours = RobertaForMaskedLM(config)
    assert ours.config.tie_word_embeddings == tied and not ours.config.add_pooling_layer
    load_state_strict(ours, weights, "masked-lm checkpoint")  # Hugging Face's names are ours
    ours.eval()

    ids, mask = batch()
    with torch.no_grad():
        expected = reference(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits
    logits = ours(mx.array(ids), mx.array(mask))
    assert logits.shape == (len(LENGTHS), ids.shape[1], TINY["vocab_size"])
    assert real_diff(logits, expected, mask) <= TOL
    hidden, _ = ours.roberta(mx.array(ids), mx.array(mask))
    assert float(np.abs(np.array(ours.logits(hidden) - logits)).max()) == 0.0

    # The bare encoder loads the same checkpoint through sanitize (the head dropped).
    encoder = RobertaModel(RobertaConfig.from_dict({**config.to_dict(), "add_pooling_layer": False}))
    load_state_strict(encoder, sanitize(read_weights(tmp_path)), "masked-lm checkpoint, encoder only")
    encoder.eval()
    assert float(np.abs(np.array(encoder(mx.array(ids), mx.array(mask))[0] - hidden)).max()) == 0.0
