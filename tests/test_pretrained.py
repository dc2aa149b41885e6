"""Real and saved checkpoints through models/encoders.py, checked against torch + transformers."""

import os
import shutil
import subprocess
import sys

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

from kbert.errors import KbertError
from kbert.models.encoders import SHIPPED, load_encoder, resolve_encoder_path, save_encoder
from kbert.pipeline.embed import Embedding, embed_texts

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

SENTENCES = [
    "A woman with the title missus, travelling in first class.",
    "A man with the title mister, travelling in third class.",
    "The weather is lovely today.",
    "Kaggle competitions reward careful cross-validation!",
    "Ünïcode, numbers like 3.14159, and emoji 🚢 are tokenized too.",
]


@pytest.fixture(scope="module")
def minilm_folder():
    try:
        return resolve_encoder_path("minilm-l6")
    except KbertError as exc:
        pytest.skip(str(exc))  # .ci/run installs it; see README


def reference_embeddings(folder, texts, pooling="mean", normalize=True):
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModel.from_pretrained(folder).eval()
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    pooled = hidden[:, 0] if pooling == "cls" else (hidden * mask).sum(1) / mask.sum(1)
    if normalize:
        pooled = torch.nn.functional.normalize(pooled, dim=-1)
    return pooled.numpy(), batch["input_ids"].numpy(), batch["attention_mask"].numpy()


def test_minilm_matches_sentence_transformers_reference(minilm_folder):
    encoder, config, tokenizer = load_encoder("minilm-l6")
    assert (config.hidden_size, config.num_hidden_layers) == (384, 6)
    expected, ids, mask = reference_embeddings(minilm_folder, SENTENCES)
    ours_ids = [e.ids for e in tokenizer.encode_batch(SENTENCES)]
    assert ours_ids == [row[m.astype(bool)].tolist() for row, m in zip(ids, mask)]  # token ids match exactly
    ours = embed_texts(encoder, tokenizer, SENTENCES, Embedding(pooling="mean", normalize=True))
    assert np.abs(ours - expected).max() <= 1e-4
    cosine = ours @ ours.T
    assert cosine[0, 1] > cosine[0, 2]  # the two passengers are closer than passenger vs weather


def test_embeddings_are_the_same_bits_on_one_stream_and_on_every_core(minilm_folder, monkeypatch):
    """A CPU batch runs in fixed chunks (pipeline/embed.py), so the vectors do not depend on the core count."""
    from kbert.pipeline import embed, streams

    encoder, _, tokenizer = load_encoder("minilm-l6")
    texts = [f"{sentence} ({i})" for i in range(12) for sentence in SENTENCES]  # 60 texts: several chunks
    monkeypatch.setattr(embed, "cpu_streams", lambda: streams._streams(3))  # three streams, whatever the cores
    spread = embed_texts(encoder, tokenizer, texts)
    monkeypatch.setattr(embed, "cpu_streams", lambda: ())
    alone = embed_texts(encoder, tokenizer, texts)
    assert spread.tobytes() == alone.tobytes()


def test_a_renamed_key_makes_loading_fail_with_the_key_name(minilm_folder, tmp_path):
    folder = tmp_path / "broken"
    shutil.copytree(minilm_folder, folder)
    weights = mx.load(str(folder / "model.safetensors"))
    weights["encoder.layer.3.output.dense.weight_renamed"] = weights.pop("encoder.layer.3.output.dense.weight")
    mx.save_safetensors(str(folder / "model.safetensors"), weights)
    with pytest.raises(KbertError) as error:
        load_encoder(folder)
    assert "missing keys: encoder.layer.3.output.dense.weight;" in str(error.value)
    assert "unexpected keys: encoder.layer.3.output.dense.weight_renamed" in str(error.value)


def test_save_encoder_reloads_bit_for_bit(minilm_folder, tmp_path):
    encoder, config, tokenizer = load_encoder(minilm_folder)
    save_encoder(encoder, config, tokenizer, tmp_path / "ours")
    again, config_again, tokenizer_again = load_encoder(tmp_path / "ours")
    assert config_again == config
    assert tokenizer_again.get_vocab() == tokenizer.get_vocab()
    for (name, a), (_, b) in zip(tree_flatten(encoder.parameters()), tree_flatten(again.parameters())):
        assert np.array_equal(np.array(a), np.array(b)), name


def test_pytorch_bin_checkpoints_load_without_code_execution(minilm_folder, tmp_path):
    folder = tmp_path / "bin"
    folder.mkdir()
    for name in ("config.json", "vocab.txt", "tokenizer_config.json"):
        shutil.copy(minilm_folder / name, folder / name)  # no tokenizer.json: built from vocab.txt
    model = transformers.AutoModel.from_pretrained(minilm_folder)
    torch.save(model.state_dict(), folder / "pytorch_model.bin")
    encoder, _, tokenizer = load_encoder(folder)
    expected, _, _ = reference_embeddings(minilm_folder, SENTENCES[:3])
    ours = embed_texts(encoder, tokenizer, SENTENCES[:3], Embedding(pooling="mean", normalize=True))
    assert np.abs(ours - expected).max() <= 1e-4


def tiny_tokenizer_folder(folder):
    from kbert.models.tokenizer import train_wordpiece

    tokenizer = train_wordpiece(SENTENCES * 3, vocab_size=120)
    tokenizer.save(str(folder / "tokenizer.json"))
    return tokenizer


def random_reference(kind, vocab_size):
    torch.manual_seed(0)
    if kind == "bert":
        config = transformers.BertConfig(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2,
                                         num_attention_heads=4, intermediate_size=64, max_position_embeddings=64)
        return transformers.BertModel(config).eval()
    config = transformers.ModernBertConfig(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=3,
                                           num_attention_heads=4, intermediate_size=48, max_position_embeddings=64,
                                           global_attn_every_n_layers=2, local_attention=8, pad_token_id=0,
                                           initializer_range=0.2)
    return transformers.ModernBertModel(config).eval()


@pytest.mark.slow
@pytest.mark.parametrize("kind,pooling", [("bert", "cls"), ("bert", "mean"), ("modernbert", "cls"),
                                          ("modernbert", "mean")])
def test_kbert_embed_matches_random_models_saved_by_transformers(tmp_path, kind, pooling):
    folder = tmp_path / kind
    folder.mkdir()
    tokenizer = tiny_tokenizer_folder(folder)
    reference = random_reference(kind, tokenizer.get_vocab_size())
    reference.save_pretrained(folder)
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    out = tmp_path / "emb.npy"
    result = subprocess.run([sys.executable, "-m", "kbert.cli", "embed", str(folder), "--texts", str(texts),
                             "--pooling", pooling, "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    ours = np.load(out)

    encodings = tokenizer.encode_batch(SENTENCES)
    width = max(len(e.ids) for e in encodings)
    assert width > 8  # longer than ModernBERT's local window, so local layers are exercised
    ids = np.array([e.ids + [0] * (width - len(e.ids)) for e in encodings])
    mask = np.array([[1] * len(e.ids) + [0] * (width - len(e.ids)) for e in encodings])
    with torch.no_grad():
        hidden = reference(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).last_hidden_state
    m = torch.tensor(mask).unsqueeze(-1).float()
    expected = hidden[:, 0] if pooling == "cls" else (hidden * m).sum(1) / m.sum(1)
    assert ours.shape == (len(SENTENCES), 32)
    assert np.abs(ours - expected.numpy()).max() <= 1e-4


def test_unknown_encoder_is_a_clear_error(tmp_path):
    with pytest.raises(KbertError, match="neither a shipped name"):
        resolve_encoder_path(tmp_path / "nothing-here")
    assert "minilm-l6" in SHIPPED
