"""Masked-LM heads (models/masked_lm.py and the *ForMaskedLM classes) against transformers and the NeoBERT fixture."""


import json
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten

from kbert.errors import KbertError
from kbert.models.bert import BertForMaskedLM
from kbert.models.encoders import ARCHITECTURES, build_encoder, load_encoder, resolve_encoder_path, save_encoder
from kbert.models.masked_lm import (build_masked_lm, encoder_of, hf_weights, layout_of, load_masked_lm,
                                    load_masked_lm_weights, save_masked_lm)
from kbert.models.modernbert import ModernBertForMaskedLM
from kbert.models.neobert import NeoBertConfig, NeoBertForMaskedLM
from kbert.models.weights import load_state_strict

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TOL = 1e-4
FIXTURE = Path(__file__).parent / "data" / "neobert-tiny"
BERT = dict(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            max_position_embeddings=64, type_vocab_size=2, initializer_range=0.2)
# Layers 0 and 3 global, 1 and 2 local (+-4 tokens), sequences up to 40 long.
MODERNBERT = dict(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                  max_position_embeddings=128, global_attn_every_n_layers=3, local_attention=8,
                  global_rope_theta=500.0, local_rope_theta=30.0, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                  cls_token_id=1, sep_token_id=2, initializer_range=0.2)
LENGTHS = (40, 23, 9)


def padded_batch(vocab_size: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, vocab_size, size=(len(LENGTHS), max(LENGTHS)))
    mask = np.zeros_like(ids)
    for row, n in enumerate(LENGTHS):
        mask[row, :n] = 1
        ids[row, n:] = 0
    return ids, mask


def max_diff_at_real(a: np.ndarray, b: np.ndarray, mask: np.ndarray) -> float:
    return float(np.abs(np.asarray(a) - np.asarray(b))[mask.astype(bool)].max())


def to_mlx(state_dict) -> dict[str, mx.array]:
    return {k: mx.array(v.detach().numpy()) for k, v in state_dict.items()}


def randomise_(module, names) -> None:
    """transformers starts biases at zero and LayerNorm weights at one: make them count."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if any(name.endswith(n) for n in names):
                p.normal_(0.0, 0.5).add_(1.0 if name.endswith("norm.weight") or name.endswith("LayerNorm.weight")
                                         else 0.0)


def hf_logits(reference, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return reference(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()


def ours_from(reference) -> nn.Module:
    model, _ = build_masked_lm(reference.config.to_dict())
    assert load_masked_lm_weights(model, to_mlx(reference.state_dict()), "reference")  # the head is in there
    model.eval()
    return model


def bert_reference(tie: bool):
    torch.manual_seed(0)
    reference = transformers.BertForMaskedLM(transformers.BertConfig(**BERT, tie_word_embeddings=tie)).eval()
    randomise_(reference, ("predictions.bias", "decoder.bias", "transform.LayerNorm.weight",
                           "transform.LayerNorm.bias"))
    return reference


def modernbert_reference(**overrides):
    torch.manual_seed(0)
    config = transformers.ModernBertConfig(**{**MODERNBERT, **overrides}, attn_implementation="eager")
    reference = transformers.ModernBertForMaskedLM(config).eval()
    randomise_(reference, ("decoder.bias", "head.norm.weight", "head.norm.bias", "head.dense.bias"))
    return reference


@pytest.fixture(scope="module")
def tokenizer():
    from kbert.models.tokenizer import train_wordpiece

    return train_wordpiece(["a masked language model predicts the hidden words", "kaggle tabular rows as text"] * 3,
                           vocab_size=60)


# --- parity with transformers ------------------------------------------------------------------------------------


@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
def test_bert_logits_match_transformers(tie):
    reference = bert_reference(tie)
    if not tie:  # transformers 5: an untied decoder has its own bias, and the forward uses it
        assert not torch.equal(reference.cls.predictions.decoder.bias, reference.cls.predictions.bias)
    ours = ours_from(reference)
    assert isinstance(ours, BertForMaskedLM) and ours.config.tie_word_embeddings is tie
    ids, mask = padded_batch(BERT["vocab_size"])
    types = (np.arange(ids.shape[1])[None, :] >= 6).astype(np.int64) * mask
    with torch.no_grad():
        ref = reference(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                        token_type_ids=torch.tensor(types)).logits.numpy()
    got = np.array(ours(mx.array(ids), mx.array(mask), mx.array(types)))
    assert got.shape == (len(LENGTHS), max(LENGTHS), BERT["vocab_size"])
    diff = max_diff_at_real(ref, got, mask)
    print(f"BertForMaskedLM ({'tied' if tie else 'untied'}) max abs logit diff {diff:.2e}")
    assert diff <= TOL
    # The check can fail: dropping the head's LayerNorm, or the bias, moves logits far beyond the tolerance.
    hidden = encoder_of(ours)(mx.array(ids), mx.array(mask), mx.array(types)).last_hidden_state
    assert max_diff_at_real(ref, np.array(ours.logits(hidden) - ours.cls.predictions.bias), mask) > 1e-2


def test_bert_pretraining_checkpoint_loads_without_its_pooler_and_next_sentence_head():
    # bert-base-uncased and friends are BertForPreTraining checkpoints: bert.pooler.* and cls.seq_relationship.*
    # sit beside the MLM head; like transformers' BertForMaskedLM, the MLM model leaves exactly those out.
    torch.manual_seed(0)
    reference = transformers.BertForPreTraining(transformers.BertConfig(**BERT)).eval()
    randomise_(reference, ("predictions.bias", "transform.LayerNorm.weight"))
    weights = to_mlx(reference.state_dict())
    assert any(k.startswith("bert.pooler.") for k in weights) and any(k.startswith("cls.seq_r") for k in weights)
    model, _ = build_masked_lm(reference.config.to_dict())
    assert load_masked_lm_weights(model, weights, "pretraining checkpoint")
    model.eval()
    ids, mask = padded_batch(BERT["vocab_size"])
    with torch.no_grad():
        ref = reference(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).prediction_logits.numpy()
    assert max_diff_at_real(ref, np.array(model(mx.array(ids), mx.array(mask))), mask) <= TOL
    # Any other cls.* name is the head's business, so a misspelt one is reported rather than dropped.
    weights["cls.prediction.transform.dense.bias"] = weights.pop("cls.predictions.transform.dense.bias")
    with pytest.raises(KbertError, match=r"missing keys: cls\.predictions\.transform\.dense\.bias; "
                                         r"unexpected keys: cls\.prediction\.transform\.dense\.bias"):
        load_masked_lm_weights(build_masked_lm(reference.config.to_dict())[0], weights, "misspelt")


@pytest.mark.parametrize("overrides", [{}, {"tie_word_embeddings": False, "classifier_bias": True, "norm_bias": True}],
                         ids=["tied", "untied-with-biases"])
def test_modernbert_logits_match_transformers(overrides):
    reference = modernbert_reference(**overrides)
    ours = ours_from(reference)
    assert isinstance(ours, ModernBertForMaskedLM)
    assert [layer.is_local for layer in ours.model.layers] == [False, True, True, False]
    assert 2 * ours.config.sliding_window + 1 < max(LENGTHS)
    ids, mask = padded_batch(MODERNBERT["vocab_size"])
    diff = max_diff_at_real(hf_logits(reference, ids, mask), np.array(ours(mx.array(ids), mx.array(mask))), mask)
    print(f"ModernBertForMaskedLM ({overrides or 'tied'}) max abs logit diff {diff:.2e}")
    assert diff <= TOL


def neobert_fixture():
    config = json.loads((FIXTURE / "config.json").read_text())
    weights = {f"model.{k}": v for k, v in mx.load(str(FIXTURE / "model.safetensors")).items()}
    return config, weights, dict(np.load(FIXTURE / "inputs.npz")), dict(np.load(FIXTURE / "expected.npz"))


def test_neobert_logits_match_the_reference_fixture():
    values, weights, inputs, expected = neobert_fixture()
    vocab, hidden = weights["model.encoder.weight"].shape
    rng = np.random.default_rng(0)
    decoder_weight = rng.uniform(-0.5, 0.5, (vocab, hidden)).astype(np.float32)
    decoder_bias = rng.standard_normal(vocab).astype(np.float32)
    model, config = build_masked_lm(values)
    assert isinstance(model, NeoBertForMaskedLM) and not config.tie_word_embeddings  # untied, as the reference
    load_state_strict(model, {**weights, "decoder.weight": mx.array(decoder_weight),
                              "decoder.bias": mx.array(decoder_bias)}, "neobert-tiny + decoder")
    model.eval()
    mask = inputs["attention_mask"]
    got = np.array(model(mx.array(inputs["input_ids"]), mx.array(mask)))
    want = expected["last_hidden_state"] @ decoder_weight.T + decoder_bias
    diff = max_diff_at_real(want, got, mask)
    print(f"NeoBertForMaskedLM max abs logit diff {diff:.2e}")
    assert diff <= TOL


def test_neobert_tied_decoder_is_the_token_embedding_table():
    values, weights, inputs, expected = neobert_fixture()
    bias = mx.array(np.random.default_rng(1).standard_normal(values["vocab_size"]).astype(np.float32))
    model, config = build_masked_lm({**values, "tie_word_embeddings": True})
    assert {k for k, _ in tree_flatten(model.parameters()) if k.startswith("decoder")} == {"decoder.bias"}
    # A tied checkpoint that also stores the decoder weight (a copy of the embeddings) loads.
    checkpoint = {**weights, "decoder.weight": weights["model.encoder.weight"], "decoder.bias": bias}
    assert load_masked_lm_weights(model, checkpoint, "tied")
    model.eval()
    mask = inputs["attention_mask"]
    want = expected["last_hidden_state"] @ np.array(weights["model.encoder.weight"]).T + np.array(bias)
    assert max_diff_at_real(want, np.array(model(mx.array(inputs["input_ids"]), mx.array(mask))), mask) <= TOL
    # A stored decoder weight that is not the embedding table contradicts tie_word_embeddings.
    checkpoint["decoder.weight"] = checkpoint["decoder.weight"] + 1
    with pytest.raises(KbertError, match="decoder.weight differs from the token embeddings"):
        load_masked_lm_weights(build_masked_lm({**values, "tie_word_embeddings": True})[0], checkpoint, "bad")


# --- parameters --------------------------------------------------------------------------------------------------


def test_tied_bert_has_no_decoder_matrix_and_matches_transformers_parameter_count():
    reference = bert_reference(tie=True)
    model, config = build_masked_lm(reference.config.to_dict())
    h, v = config.hidden_size, config.vocab_size
    count = sum(x.size for _, x in tree_flatten(model.parameters()))
    encoder = sum(x.size for _, x in tree_flatten(encoder_of(model).parameters()))
    assert count == encoder + (h * h + h) + 2 * h + v
    assert count == sum(p.numel() for p in reference.parameters())  # torch counts the shared matrix once
    assert not any("decoder" in k for k, _ in tree_flatten(model.parameters()))


@pytest.mark.parametrize("kind", ["bert-tied", "bert-untied", "modernbert-tied", "modernbert-untied"])
def test_parameter_names_are_the_names_transformers_loads(kind):
    arch, tie = kind.split("-")
    reference = (bert_reference(tie == "tied") if arch == "bert"
                 else modernbert_reference(tie_word_embeddings=tie == "tied"))
    model, _ = build_masked_lm(reference.config.to_dict())
    # named_parameters lists a tied tensor once; no buffers (position ids, rotary tables) among ours.
    assert set(hf_weights(model)) == {name for name, _ in reference.named_parameters()}
    assert set(dict(tree_flatten(model.trainable_parameters()))) == set(dict(tree_flatten(model.parameters())))


# --- saving and loading ------------------------------------------------------------------------------------------


def random_model(values: dict, seed: int = 0) -> nn.Module:
    """A fresh MLX-initialised model whose zero-initialised biases are randomised, so that they count."""
    mx.random.seed(seed)
    model, _ = build_masked_lm(values)
    flat = dict(tree_flatten(model.parameters()))
    for name in [k for k in flat if k.endswith("bias") and not k.startswith(layout_of(model).encoder + ".")]:
        flat[name] = mx.random.normal(flat[name].shape)
    load_state_strict(model, flat, "randomised")
    model.eval()
    return model


def small_values(model_type: str, vocab_size: int, **extra) -> dict:
    if model_type == "bert":
        return {"model_type": "bert", **BERT, "vocab_size": vocab_size, **extra}
    if model_type == "modernbert":
        return {"model_type": "modernbert", **MODERNBERT, "vocab_size": vocab_size, **extra}
    if model_type == "deberta":  # (kind names have no dash in them)
        return {"model_type": "deberta-v2", **BERT, "vocab_size": vocab_size, "relative_attention": True,
                "position_buckets": 8, "norm_rel_ebd": "layer_norm", "share_att_key": True,
                "pos_att_type": ["p2c", "c2p"], "position_biased_input": False, "type_vocab_size": 0, **extra}
    if model_type in ("roberta", "electra"):  # BERT's sizes; RoBERTa's positions start after its padding id
        values = {**BERT, "max_position_embeddings": BERT.get("max_position_embeddings", 64) + 2}
        return {"model_type": model_type, **values, "vocab_size": vocab_size,
                **({"embedding_size": 16} if model_type == "electra" else {}), **extra}
    return {"model_type": "neobert", "vocab_size": vocab_size, "hidden_size": 32, "num_hidden_layers": 2,
            "num_attention_heads": 4, "intermediate_size": 64, "max_length": 64, **extra}


HF_MASKED_LM = {"bert": "BertForMaskedLM", "modernbert": "ModernBertForMaskedLM", "roberta": "RobertaForMaskedLM",
                "electra": "ElectraForMaskedLM", "deberta": "DebertaV2ForMaskedLM"}


@pytest.mark.parametrize("kind", ["bert", "bert-untied", "modernbert", "roberta", "roberta-untied", "electra",
                                  "electra-untied", "deberta", "deberta-untied"])
def test_saved_folder_loads_in_transformers_with_the_same_logits(kind, tokenizer, tmp_path):
    arch = kind.split("-")[0]
    values = small_values(arch, tokenizer.get_vocab_size(), **({"tie_word_embeddings": False} if "untied" in kind else {}))
    model = random_model(values)
    folder = save_masked_lm(model, model.config, tokenizer, tmp_path / kind)
    hf_class = getattr(transformers, HF_MASKED_LM[arch])
    reference = hf_class.from_pretrained(folder, attn_implementation="eager").eval()
    assert reference.config.tie_word_embeddings is model.config.tie_word_embeddings
    ids, mask = padded_batch(tokenizer.get_vocab_size(), seed=3)
    ours = np.array(model(mx.array(ids), mx.array(mask)))
    diff = max_diff_at_real(hf_logits(reference, ids, mask), ours, mask)
    print(f"{kind}: saved folder in transformers, max abs logit diff {diff:.2e}")
    assert diff <= TOL
    # ... and back in kbert, head included.
    messages = []
    again, config, tokenizer_again = load_masked_lm(folder, log=messages.append)
    assert config == model.config and "head loaded" in messages[0]
    assert tokenizer_again.get_vocab() == tokenizer.get_vocab()
    np.testing.assert_array_equal(np.array(again(mx.array(ids), mx.array(mask))), ours)


@pytest.mark.parametrize("kind", ["bert", "bert-untied", "modernbert", "neobert", "neobert-tied", "roberta", "electra",
                                  "deberta"])
def test_saved_folder_loads_as_a_bare_encoder(kind, tokenizer, tmp_path):
    arch = kind.split("-")[0]
    extra = {"tie_word_embeddings": kind.endswith("-tied")} if arch == "neobert" else (
        {"tie_word_embeddings": False} if kind.endswith("untied") else {})
    model = random_model(small_values(arch, tokenizer.get_vocab_size(), **extra))
    folder = save_masked_lm(model, model.config, tokenizer, tmp_path / kind)
    encoder, config, _ = load_encoder(folder)  # strict: the head's names are dropped, nothing is missing
    ids, mask = padded_batch(tokenizer.get_vocab_size(), seed=4)
    if arch == "neobert":
        ids, mask = ids[:, :32], mask[:, :32]
    want = encoder_of(model)(mx.array(ids), mx.array(mask)).last_hidden_state
    got = encoder(mx.array(ids), mx.array(mask)).last_hidden_state
    np.testing.assert_array_equal(np.array(got), np.array(want))
    assert set(dict(tree_flatten(encoder.parameters()))) == set(dict(tree_flatten(encoder_of(model).parameters())))
    again, _, _ = load_masked_lm(folder, log=None)
    np.testing.assert_array_equal(np.array(again(mx.array(ids), mx.array(mask))),
                                  np.array(model(mx.array(ids), mx.array(mask))))


def fresh_head_is_intact(model: nn.Module) -> None:
    head = {k: v for k, v in tree_flatten(model.parameters()) if k.startswith("cls.")}
    np.testing.assert_array_equal(np.array(head["cls.predictions.bias"]), 0)
    np.testing.assert_array_equal(np.array(head["cls.predictions.transform.LayerNorm.weight"]), 1)


def test_encoder_only_folder_keeps_a_fresh_head(tokenizer, tmp_path):
    values = small_values("bert", tokenizer.get_vocab_size())
    mx.random.seed(5)
    encoder, config = build_encoder(values)  # with a pooler, as sentence-transformers BERT checkpoints have
    assert "pooler" in encoder
    folder = save_encoder(encoder, config, tokenizer, tmp_path / "encoder")
    messages = []
    model, mlm_config, _ = load_masked_lm(folder, log=messages.append)
    assert "freshly initialised" in messages[0] and not mlm_config.add_pooling_layer
    fresh_head_is_intact(model)
    loaded = dict(tree_flatten(encoder_of(model).parameters()))
    saved = {k: v for k, v in tree_flatten(encoder.parameters()) if not k.startswith("pooler.")}
    assert set(loaded) == set(saved)
    for name, value in saved.items():
        np.testing.assert_array_equal(np.array(loaded[name]), np.array(value), err_msg=name)


def test_run_fold_folder_loads_its_encoder(tokenizer, tmp_path):
    from kbert.models.checkpoints import save_checkpoint
    from kbert.models.task_model import build_task_model

    values = small_values("modernbert", tokenizer.get_vocab_size())
    task = build_task_model(values, "binary", "mean")
    (tmp_path / "tokenizer.json").write_text(tokenizer.to_str())
    folder = save_checkpoint(task, tmp_path / "fold0", {"encoder_config": values, "head": {"task": "binary"},
                                                          "pooling": "mean", "source": "scratch"},
                             tokenizer_path=tmp_path / "tokenizer.json")
    model, _, _ = load_masked_lm(folder, log=None)
    ids, mask = padded_batch(tokenizer.get_vocab_size(), seed=6)
    task.eval()
    np.testing.assert_array_equal(np.array(encoder_of(model)(mx.array(ids), mx.array(mask)).last_hidden_state),
                                  np.array(task.encoder(mx.array(ids), mx.array(mask)).last_hidden_state))


def test_shipped_minilm_loads_with_a_fresh_head():
    try:
        resolve_encoder_path("minilm-l6")
    except KbertError as exc:
        pytest.skip(str(exc))
    messages = []
    model, config, tokenizer = load_masked_lm("minilm-l6", log=messages.append)
    assert "freshly initialised" in messages[0] and config.vocab_size == tokenizer.get_vocab_size()
    fresh_head_is_intact(model)
    encoder, _, _ = load_encoder("minilm-l6")
    ids = mx.array([[e for e in tokenizer.encode("a masked language model").ids]])
    np.testing.assert_array_equal(np.array(encoder_of(model)(ids).last_hidden_state),
                                  np.array(encoder(ids).last_hidden_state))
    assert model(ids).shape == (1, ids.shape[1], config.vocab_size)


def test_a_renamed_head_key_is_an_error_naming_it(tokenizer, tmp_path):
    model = random_model(small_values("bert", tokenizer.get_vocab_size()))
    folder = save_masked_lm(model, model.config, tokenizer, tmp_path / "mlm")
    weights = mx.load(str(folder / "model.safetensors"))
    weights["cls.predictions.transform.dense.weights"] = weights.pop("cls.predictions.transform.dense.weight")
    mx.save_safetensors(str(folder / "model.safetensors"), weights)
    with pytest.raises(KbertError) as error:
        load_masked_lm(folder, log=None)
    assert "missing keys: cls.predictions.transform.dense.weight;" in str(error.value)
    assert "unexpected keys: cls.predictions.transform.dense.weights" in str(error.value)


def test_a_half_head_is_an_error_not_an_encoder_only_checkpoint(tokenizer, tmp_path):
    model = random_model(small_values("modernbert", tokenizer.get_vocab_size()))
    weights = {k: v for k, v in hf_weights(model).items() if k != "decoder.bias"}
    with pytest.raises(KbertError, match="missing keys: decoder.bias"):
        load_masked_lm_weights(build_masked_lm(model.config.to_dict())[0], weights, "half")


def test_unknown_model_type_is_a_clear_error():
    with pytest.raises(KbertError, match="unsupported model_type 'gpt2'"):
        build_masked_lm({"model_type": "gpt2"})
    assert all(arch.masked_lm is not None for arch in ARCHITECTURES.values())  # every encoder can be pretrained


# --- training --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["bert", "modernbert", "neobert", "roberta", "electra", "deberta"])
def test_compiled_masked_lm_step_gives_every_parameter_a_gradient(arch):
    model = random_model(small_values(arch, 50, **({"hidden_dropout_prob": 0.1} if arch == "bert" else {})))
    ids, mask = padded_batch(50, seed=7)
    ids, mask = mx.array(ids[:, :32]), mx.array(mask[:, :32])
    labels = mx.where(mask.astype(mx.bool_), ids, -100)

    def loss_fn(ids, mask, labels):
        logits = model(ids, mask)
        keep = labels != -100
        losses = nn.losses.cross_entropy(logits, mx.maximum(labels, 0), reduction="none")
        return (losses * keep).sum() / keep.sum()

    def step(ids, mask, labels):
        return nn.value_and_grad(model, loss_fn)(ids, mask, labels)

    # As pipeline/train.py: parameters and the dropout key are state of the compiled graph.
    state = [model.state, mx.random.state]
    compiled = mx.compile(step, inputs=state, outputs=state)
    eager_loss, _ = step(ids, mask, labels)
    loss, grads = compiled(ids, mask, labels)
    assert abs(loss.item() - eager_loss.item()) <= 1e-5 * abs(eager_loss.item())
    model.train()  # dropout on (BERT): a fresh trace, still finite
    loss, grads = mx.compile(step, inputs=state, outputs=state)(ids, mask, labels)
    assert np.isfinite(loss.item())
    flat = dict(tree_flatten(grads))
    assert set(flat) == set(dict(tree_flatten(model.trainable_parameters())))
    assert all(bool(mx.isfinite(g).all()) for g in flat.values())
    layout = layout_of(model)
    assert float(mx.abs(flat[f"{layout.encoder}.{layout.embeddings}"]).max()) > 0


def test_neobert_config_round_trips_the_tie_flag():
    config = NeoBertConfig.from_dict({"tie_word_embeddings": True, "hidden_size": 64, "num_attention_heads": 4})
    assert NeoBertConfig.from_dict(config.to_dict()) == config and config.tie_word_embeddings
