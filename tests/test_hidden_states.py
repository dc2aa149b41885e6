"""Every layer's output, attention probabilities and the gradients of every weight, against transformers.

BERT and ModernBERT here (the other architectures in their own parity files); NeoBERT, whose reference is
not on PyPI, against its own last hidden state and attention-free path.
"""

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten

from kbert.models.bert import BertConfig, BertModel
from kbert.models.bert import sanitize as bert_sanitize
from kbert.models.modernbert import ModernBertConfig, ModernBertModel
from kbert.models.modernbert import sanitize as modernbert_sanitize
from kbert.models.outputs import Recording
from kbert.models.recompute import set_recompute
from kbert.models.weights import load_state_strict
from tests.parity import relative_errors

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

LENGTHS, SEQ_LEN, VOCAB = (40, 23, 6), 40, 99
TOL = 1e-4
BERT = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, intermediate_size=96,
            max_position_embeddings=64, hidden_act="gelu", attn_implementation="eager")
MODERNBERT = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                  max_position_embeddings=128, global_attn_every_n_layers=2, local_attention=8,
                  global_rope_theta=500.0, local_rope_theta=30.0, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                  cls_token_id=1, sep_token_id=2, initializer_range=0.2,
                  attn_implementation="eager")


def batch():
    rng = np.random.default_rng(1)
    ids = np.zeros((len(LENGTHS), SEQ_LEN), dtype=np.int32)
    mask = np.zeros_like(ids)
    for row, n in enumerate(LENGTHS):
        ids[row, :n] = rng.integers(3, VOCAB, n)
        mask[row, :n] = 1
    return ids, mask


def pair(kind):
    torch.manual_seed(0)
    if kind == "bert":
        reference = transformers.BertModel(transformers.BertConfig(**BERT), add_pooling_layer=False)
        ours, sanitize = BertModel(BertConfig.from_dict({**BERT, "add_pooling_layer": False})), bert_sanitize
    else:
        reference = transformers.ModernBertModel(transformers.ModernBertConfig(**MODERNBERT))
        ours, sanitize = ModernBertModel(ModernBertConfig.from_dict(MODERNBERT)), modernbert_sanitize
    reference.eval()
    load_state_strict(ours, sanitize({k: mx.array(v.numpy()) for k, v in reference.state_dict().items()}), kind)
    ours.eval()
    return reference, ours


@pytest.mark.parametrize("kind", ["bert", "modernbert"])
def test_every_hidden_state_and_attention_match_transformers(kind):
    reference, ours = pair(kind)
    ids, mask = batch()
    with torch.no_grad():
        expected = reference(input_ids=torch.tensor(ids, dtype=torch.long), attention_mask=torch.tensor(mask),
                             output_hidden_states=True, output_attentions=True)
    out = ours(mx.array(ids), mx.array(mask), output_hidden_states=True, output_attentions=True)
    last, hidden_states, attentions = out.last_hidden_state, out.hidden_states, out.attentions
    real = mask.astype(bool)
    assert len(hidden_states) == len(expected.hidden_states) == reference.config.num_hidden_layers + 1
    for got, want in zip(hidden_states, expected.hidden_states, strict=True):
        assert np.abs(np.array(got) - want.numpy())[real].max() <= TOL
    np.testing.assert_array_equal(np.array(hidden_states[-1]), np.array(last))
    assert len(attentions) == len(expected.attentions) == reference.config.num_hidden_layers
    for got, want in zip(attentions, expected.attentions, strict=True):
        # probabilities of real queries over every key (padded keys get ~0 in both)
        assert np.abs(np.array(got) - want.numpy()).transpose(0, 2, 1, 3)[real].max() <= TOL
    # Asking for them changes nothing else, and the comparison can fail: one layer off shifts the states.
    plain = ours(mx.array(ids), mx.array(mask)).last_hidden_state
    np.testing.assert_allclose(np.array(plain), np.array(last), atol=1e-5)  # fused vs explicit softmax
    assert np.abs(np.array(hidden_states[1]) - expected.hidden_states[2].numpy())[real].max() > 1e-2


def weight_gradients(kind, recompute=False, masked=True, first_token_only=False):
    """d(loss)/d(weight) of every weight, ours and the reference's, for loss = sum(last_hidden * P) over real
    tokens with a fixed random P; in training mode with dropout off, so both sides see the same function.
    ``first_token_only``: the loss reads the first token alone, and ours computes it alone (BERT)."""
    reference, ours = pair(kind)
    ids, mask = batch()
    projection = np.random.default_rng(3).standard_normal((SEQ_LEN, reference.config.hidden_size)).astype(np.float32)
    weight = projection[None] * mask[..., None]
    if first_token_only:
        weight[:, 1:] = 0.0

    reference_out = reference(input_ids=torch.tensor(ids, dtype=torch.long), attention_mask=torch.tensor(mask))
    (reference_out.last_hidden_state * torch.tensor(weight)).sum().backward()
    expected = {name: p.grad.numpy() for name, p in reference.named_parameters()}

    if recompute:
        set_recompute(ours, True)

    def loss(model):
        record = Recording(first_token=first_token_only)
        hidden = model.encode(mx.array(ids), mx.array(mask) if masked else None, None, None, record).last_hidden_state
        return (hidden * mx.array(weight[:, :hidden.shape[1]])).sum()

    _, grads = nn.value_and_grad(ours, loss)(ours)
    return expected, dict(tree_flatten(grads))


@pytest.mark.parametrize("kind", ["bert", "modernbert"])
def test_gradients_of_every_weight_match_transformers(kind):
    expected, got = weight_gradients(kind)
    assert set(got) == set(expected), set(got) ^ set(expected)
    assert max(relative_errors(got, expected).values()) <= TOL
    # The check can fail: the same gradients without the padding mask (a seeded mistake) are far off.
    _, unmasked = weight_gradients(kind, masked=False)
    assert max(relative_errors(unmasked, expected).values()) > 1e-2


@pytest.mark.parametrize("kind", ["bert", "modernbert"])
def test_recomputed_layers_give_the_same_weight_gradients(kind):
    _, plain = weight_gradients(kind)
    _, recomputed = weight_gradients(kind, recompute=True)
    for name, value in plain.items():
        np.testing.assert_allclose(np.array(recomputed[name]), np.array(value), atol=1e-5, err_msg=name)


def test_the_first_token_alone_matches_transformers_with_its_weight_gradients():
    """What a CLS pooler reads: the last layer computes the first token alone (the other tokens' queries, output
    projection and feed-forward skipped), and its state and every weight's gradient are transformers' full model's."""
    reference, ours = pair("bert")
    ids, mask = batch()
    with torch.no_grad():
        expected = reference(input_ids=torch.tensor(ids, dtype=torch.long), attention_mask=torch.tensor(mask))
    first = ours.encode(mx.array(ids), mx.array(mask), None, None, Recording(first_token=True)).last_hidden_state
    assert first.shape == (len(LENGTHS), 1, BERT["hidden_size"])
    assert np.abs(np.array(first[:, 0]) - expected.last_hidden_state[:, 0].numpy()).max() <= TOL
    for recompute in (False, True):
        wanted, got = weight_gradients("bert", recompute=recompute, first_token_only=True)
        assert set(got) == set(wanted), set(got) ^ set(wanted)
        assert max(relative_errors(got, wanted).values()) <= TOL
    # The last layer's query weight has a gradient from the first token's query alone: the check can fail.
    _, every_token = weight_gradients("bert")
    assert max(relative_errors(every_token, wanted).values()) > 1e-2
