"""models/bert.py against Hugging Face transformers.BertModel (random weights, padded batches)."""

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

from kbert.errors import KbertError
from kbert.models.bert import BertConfig, BertModel, sanitize
from kbert.models.weights import load_state_strict

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TINY = dict(vocab_size=99, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, intermediate_size=96,
            max_position_embeddings=64, type_vocab_size=2, hidden_act="gelu")
LENGTHS = (24, 17, 5)


def reference_and_ours():
    torch.manual_seed(0)
    reference = transformers.BertModel(transformers.BertConfig(**TINY), add_pooling_layer=True).eval()
    ours = BertModel(BertConfig.from_dict(reference.config.to_dict()))
    weights = {k: mx.array(v.numpy()) for k, v in reference.state_dict().items()}
    load_state_strict(ours, sanitize(weights), "reference")
    ours.eval()
    return reference, ours


def batch():
    rng = np.random.default_rng(1)
    ids = np.zeros((len(LENGTHS), max(LENGTHS)), dtype=np.int32)
    mask = np.zeros_like(ids)
    for row, n in enumerate(LENGTHS):
        ids[row, :n] = rng.integers(1, TINY["vocab_size"], n)
        mask[row, :n] = 1
    types = (np.arange(ids.shape[1])[None, :] >= 6).astype(np.int32) * mask
    return ids, mask, types


def test_hidden_states_and_pooler_match_transformers():
    reference, ours = reference_and_ours()
    ids, mask, types = batch()
    with torch.no_grad():
        expected = reference(input_ids=torch.tensor(ids, dtype=torch.long), attention_mask=torch.tensor(mask),
                             token_type_ids=torch.tensor(types, dtype=torch.long))
    hidden, pooled = ours(mx.array(ids), mx.array(mask), mx.array(types))
    real = mask.astype(bool)
    diff = np.abs(np.array(hidden) - expected.last_hidden_state.numpy())[real].max()
    assert diff <= 1e-4, diff
    assert np.abs(np.array(pooled) - expected.pooler_output.numpy()).max() <= 1e-4
    # The comparison can fail: ignoring the padding mask changes the padded rows' outputs a lot.
    unmasked, _ = ours(mx.array(ids), None, mx.array(types))
    assert np.abs(np.array(unmasked) - expected.last_hidden_state.numpy())[real].max() > 1e-2


def test_gradients_wrt_input_embeddings_match_transformers():
    reference, ours = reference_and_ours()
    ids, mask, types = batch()
    rng = np.random.default_rng(2)
    embeds = rng.normal(size=(len(LENGTHS), ids.shape[1], TINY["hidden_size"])).astype(np.float32)
    probe = rng.normal(size=embeds.shape).astype(np.float32) * mask[..., None]

    torch_embeds = torch.tensor(embeds, requires_grad=True)
    out = reference(inputs_embeds=torch_embeds, attention_mask=torch.tensor(mask),
                    token_type_ids=torch.tensor(types, dtype=torch.long)).last_hidden_state
    (out * torch.tensor(probe)).sum().backward()

    def loss(x):
        hidden, _ = ours(None, mx.array(mask), mx.array(types), inputs_embeds=x)
        return (hidden * mx.array(probe)).sum()

    grad = np.array(mx.grad(loss)(mx.array(embeds)))
    assert np.abs(grad - torch_embeds.grad.numpy()).max() <= 1e-4


def test_parameter_count_equals_the_reference_state_dict():
    reference, ours = reference_and_ours()
    ours_count = sum(v.size for _, v in tree_flatten(ours.trainable_parameters()))
    assert ours_count == sum(p.numel() for p in reference.parameters())


def test_sanitize_handles_task_checkpoints_and_a_renamed_key_fails():
    reference, _ = reference_and_ours()
    prefixed = {f"bert.{k}": mx.array(v.numpy()) for k, v in reference.state_dict().items()}
    prefixed["cls.predictions.bias"] = mx.zeros((TINY["vocab_size"],))
    prefixed["bert.embeddings.position_ids"] = mx.arange(64)[None]
    ours = BertModel(BertConfig.from_dict(reference.config.to_dict()))
    load_state_strict(ours, sanitize(prefixed), "masked-lm checkpoint")

    renamed = sanitize(prefixed)
    renamed["encoder.layer.1.attention.self.query.weights"] = renamed.pop("encoder.layer.1.attention.self.query.weight")
    with pytest.raises(KbertError, match=r"missing keys: encoder\.layer\.1\.attention\.self\.query\.weight;"):
        load_state_strict(BertModel(BertConfig.from_dict(reference.config.to_dict())), renamed, "renamed")
