"""models/electra.py against Hugging Face transformers.ElectraModel / ElectraForPreTraining / ElectraForMaskedLM.

Random tiny models with embedding_size equal to hidden_size (no ``embeddings_project``) and smaller (with
it), saved to disk (safetensors by ``save_pretrained``; a legacy ``pytorch_model.bin`` by ``torch.save`` of
the state dict, since transformers 5 ignores ``safe_serialization=False``), read back through
``read_weights`` + ``sanitize`` + the strict loader. Padded batches of mixed lengths, one of them left-padded.
Every comparison is on real tokens only, within 1e-4: absolute for outputs, and for gradients relative to the
tensor's largest gradient where that exceeds 1.
"""

import json

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten

from kbert.errors import KbertError
from kbert.models.electra import ElectraConfig, ElectraForMaskedLM, ElectraModel, sanitize
from kbert.models.encoders import read_weights
from kbert.models.recompute import set_recompute
from kbert.models.weights import load_state_strict
from tests.parity import real_diff, relative_errors, save_reference

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

PAD = 0
TINY = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
            max_position_embeddings=48, type_vocab_size=2, pad_token_id=PAD, hidden_act="gelu",
            attn_implementation="eager")  # eager: the attention probabilities are returned
EMBEDDING_SIZES = {"same": 32, "projected": 16}
LENGTHS = (40, 23, 6, -17)  # negative: left-padded
TOL = 1e-4


def batch():
    rng = np.random.default_rng(1)
    ids = np.full((len(LENGTHS), max(abs(n) for n in LENGTHS)), PAD, dtype=np.int64)
    mask = np.zeros_like(ids)
    for row, n in enumerate(LENGTHS):
        span = slice(0, n) if n > 0 else slice(ids.shape[1] + n, None)
        ids[row, span] = rng.integers(PAD + 1, TINY["vocab_size"], abs(n))
        mask[row, span] = 1
    types = (np.arange(ids.shape[1])[None, :] >= 12).astype(np.int64) * mask
    return ids, mask, types


def inputs(ids, mask, types):
    return dict(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), token_type_ids=torch.tensor(types))


def load_ours(folder, cls=ElectraModel):
    model = cls(ElectraConfig.from_dict(json.loads((folder / "config.json").read_text())))
    load_state_strict(model, sanitize(read_weights(folder)), str(folder))
    model.eval()
    return model


@pytest.fixture(scope="module", params=list(EMBEDDING_SIZES))
def reference(request):
    torch.manual_seed(0)
    config = transformers.ElectraConfig(**TINY, embedding_size=EMBEDDING_SIZES[request.param])
    return transformers.ElectraModel(config).eval()


@pytest.fixture(scope="module", params=["safetensors", "bin"])
def saved(request, reference, tmp_path_factory):
    return save_reference(reference, tmp_path_factory.mktemp("electra") / request.param, request.param)


def test_every_hidden_state_and_attention_match_transformers(reference, saved):
    ours = load_ours(saved)
    projected = reference.config.embedding_size != reference.config.hidden_size
    names = [k for k, _ in tree_flatten(ours.parameters())]
    assert ("embeddings_project" in ours) == projected == any(k.startswith("embeddings_project.") for k in names)
    ids, mask, types = batch()
    with torch.no_grad():
        expected = reference(**inputs(ids, mask, types), output_hidden_states=True, output_attentions=True)
    hidden, pooled, hidden_states, attentions = ours(mx.array(ids), mx.array(mask), mx.array(types),
                                                     output_hidden_states=True, output_attentions=True)
    assert pooled is None
    assert len(hidden_states) == len(expected.hidden_states) == TINY["num_hidden_layers"] + 1
    assert len(attentions) == len(expected.attentions) == TINY["num_hidden_layers"]
    diffs = [real_diff(a, b, mask) for a, b in zip(hidden_states, expected.hidden_states)]
    diffs += [real_diff(np.array(a).transpose(0, 2, 1, 3), b.transpose(1, 2), mask)
              for a, b in zip(attentions, expected.attentions)]
    diffs.append(real_diff(hidden, expected.last_hidden_state, mask))
    assert max(diffs) <= TOL, diffs


def test_gradients_of_every_weight_match_transformers(reference, saved):
    ours = load_ours(saved)
    ids, mask, types = batch()
    rng = np.random.default_rng(2)
    probe = rng.normal(size=(*ids.shape, TINY["hidden_size"])).astype(np.float32) * mask[..., None]
    first = np.zeros_like(probe)
    first[:, 0] = rng.normal(size=(len(LENGTHS), TINY["hidden_size"]))  # position 0, a padding token in the last row

    reference.zero_grad()
    out = reference(**inputs(ids, mask, types)).last_hidden_state
    (out * torch.tensor(probe + first)).sum().backward()
    expected = sanitize({name: p.grad.numpy() for name, p in reference.named_parameters()})

    def loss(model):
        hidden, _ = model(mx.array(ids), mx.array(mask), mx.array(types))
        return (hidden * mx.array(probe + first)).sum()

    _, grads = nn.value_and_grad(ours, loss)(ours)
    grads = dict(tree_flatten(grads))
    assert set(grads) == set(expected)
    diffs = relative_errors(grads, expected)
    assert max(diffs.values()) <= TOL, sorted(diffs.items(), key=lambda kv: -kv[1])[:3]
    # As torch's padding_idx: the word table's padding row gets no gradient (the position table has no padding row).
    assert not np.array(grads["embeddings.word_embeddings.weight"])[PAD].any()
    assert np.array(grads["embeddings.position_embeddings.weight"])[0].any()

    set_recompute(ours, True)  # gradient checkpointing through BERT's encoder: the same gradients
    _, recomputed = nn.value_and_grad(ours, loss)(ours)
    assert max(float(np.abs(np.array(g) - np.array(grads[k])).max()) for k, g in tree_flatten(recomputed)) <= 1e-6


def test_a_model_without_the_projection_does_not_load_projected_weights(tmp_path):
    torch.manual_seed(0)
    reference = transformers.ElectraModel(transformers.ElectraConfig(**TINY, embedding_size=16))
    saved = save_reference(reference, tmp_path / "projected", "safetensors")
    weights = sanitize(read_weights(saved))
    assert {"embeddings_project.weight", "embeddings_project.bias"} <= set(weights)
    unprojected = ElectraModel(ElectraConfig.from_dict({**reference.config.to_dict(), "embedding_size": 32}))
    assert "embeddings_project" not in unprojected
    with pytest.raises(KbertError, match=r"unexpected keys: embeddings_project\.bias, embeddings_project\.weight"):
        load_state_strict(unprojected, weights, "projected checkpoint")


def test_strict_loading_reports_missing_and_unexpected_keys(reference, saved):
    weights = sanitize(read_weights(saved))
    config = ElectraConfig.from_dict(json.loads((saved / "config.json").read_text()))
    missing = dict(weights)
    missing.pop("encoder.layer.1.attention.self.query.weight")
    with pytest.raises(KbertError, match=r"missing keys: encoder\.layer\.1\.attention\.self\.query\.weight;"):
        load_state_strict(ElectraModel(config), missing, "missing")
    unexpected = {**weights, "pooler.dense.weight": weights["encoder.layer.1.attention.self.query.weight"]}
    with pytest.raises(KbertError, match=r"unexpected keys: pooler\.dense\.weight"):
        load_state_strict(ElectraModel(config), unexpected, "unexpected")


def test_discriminator_checkpoint_loads_through_sanitize(tmp_path):
    torch.manual_seed(3)
    reference = transformers.ElectraForPreTraining(transformers.ElectraConfig(**TINY, embedding_size=16)).eval()
    saved = save_reference(reference, tmp_path / "discriminator", "bin")
    weights = torch.load(saved / "pytorch_model.bin", weights_only=True)
    assert any(k.startswith("discriminator_predictions.") for k in weights)
    weights = {k: mx.array(v.numpy()) for k, v in weights.items()}
    weights["electra.embeddings.position_ids"] = mx.arange(TINY["max_position_embeddings"])[None]
    weights["classifier.out_proj.weight"] = mx.zeros((2, TINY["hidden_size"]))
    ours = ElectraModel(ElectraConfig.from_dict(reference.config.to_dict()))
    load_state_strict(ours, sanitize(weights), "discriminator checkpoint")
    ours.eval()
    assert sum(v.size for _, v in tree_flatten(ours.parameters())) == sum(
        p.numel() for p in reference.electra.parameters())
    ids, mask, types = batch()
    with torch.no_grad():
        expected = reference.electra(**inputs(ids, mask, types)).last_hidden_state
    assert real_diff(ours(mx.array(ids), mx.array(mask), mx.array(types))[0], expected, mask) <= TOL


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("size", list(EMBEDDING_SIZES))
def test_masked_lm_logits_match_transformers(tmp_path, tied, size):
    torch.manual_seed(5)
    config = transformers.ElectraConfig(**TINY, embedding_size=EMBEDDING_SIZES[size], tie_word_embeddings=tied)
    reference = transformers.ElectraForMaskedLM(config).eval()
    with torch.no_grad():
        reference.generator_lm_head.bias.normal_()
    reference.save_pretrained(tmp_path)
    weights = read_weights(tmp_path)
    assert ("generator_lm_head.weight" in weights) == (not tied) and "generator_lm_head.bias" in weights
    ours = ElectraForMaskedLM(ElectraConfig.from_dict(json.loads((tmp_path / "config.json").read_text())))
    assert ours.config.tie_word_embeddings == tied
    load_state_strict(ours, weights, "masked-lm checkpoint")  # Hugging Face's names are ours
    ours.eval()

    ids, mask, types = batch()
    with torch.no_grad():
        expected = reference(**inputs(ids, mask, types)).logits
    logits = ours(mx.array(ids), mx.array(mask), mx.array(types))
    assert logits.shape == (len(LENGTHS), ids.shape[1], TINY["vocab_size"])
    assert real_diff(logits, expected, mask) <= TOL
    hidden, _ = ours.electra(mx.array(ids), mx.array(mask), mx.array(types))
    assert float(np.abs(np.array(ours.logits(hidden) - logits)).max()) == 0.0

    encoder = load_ours(tmp_path)  # the bare encoder from the same checkpoint, the head dropped by sanitize
    assert float(np.abs(np.array(encoder(mx.array(ids), mx.array(mask), mx.array(types))[0] - hidden)).max()) == 0.0
