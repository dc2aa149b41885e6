"""Every pretrained architecture through the whole product: `kbert run` (layer pooling, LoRA, gradient
checkpointing), `kbert predict`, `kbert embed` and `kbert pretrain`, from a tiny checkpoint folder that
transformers' ``save_pretrained`` wrote with random weights."""

import json

import mlx.core as mx
import numpy as np
import pandas as pd
import pytest

from kbert.cli import main
from kbert.models.encoders import ARCHITECTURES, load_encoder
from kbert.models.tokenizer import train_wordpiece
from kbert.pipeline.config import BUNDLED_DATA_DIR
from tests.tiny import tiny_args

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SIZE = dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=64)
CONFIGS = {
    "bert": dict(max_position_embeddings=64),
    "roberta": dict(max_position_embeddings=66, pad_token_id=0, type_vocab_size=1),
    "xlm-roberta": dict(max_position_embeddings=66, pad_token_id=0, type_vocab_size=1),
    "electra": dict(max_position_embeddings=64, embedding_size=16),
    "deberta-v2": dict(max_position_embeddings=64, relative_attention=True, position_buckets=8,
                       norm_rel_ebd="layer_norm", share_att_key=True, pos_att_type=["p2c", "c2p"],
                       position_biased_input=False, type_vocab_size=0, max_relative_positions=-1),
    "mpnet": dict(max_position_embeddings=66),
    "modernbert": dict(max_position_embeddings=64, global_attn_every_n_layers=2, local_attention=8, pad_token_id=0,
                       bos_token_id=2, eos_token_id=3, cls_token_id=2, sep_token_id=3),
}


def checkpoint_folder(model_type, folder):
    """A random transformers model of ``model_type`` saved with a WordPiece tokenizer.json on Titanic's names."""
    names = pd.read_csv(BUNDLED_DATA_DIR / "titanic" / "train.csv")["Name"].tolist()
    tokenizer = train_wordpiece(names, vocab_size=300)
    folder.mkdir(parents=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model(model_type, vocab_size=tokenizer.get_vocab_size(), **SIZE,
                                               **CONFIGS[model_type])
    model = transformers.AutoModel.from_config(config).eval()
    model.save_pretrained(folder)
    return model, tokenizer


def test_every_architecture_is_covered():
    assert set(CONFIGS) | {"neobert"} == set(ARCHITECTURES)  # NeoBERT's reference is not in transformers


@pytest.mark.slow
@pytest.mark.parametrize("model_type", sorted(set(CONFIGS) - {"bert", "modernbert"}))
def test_a_pretrained_folder_runs_predicts_embeds_and_pretrains(model_type, tmp_path, capsys):
    folder = tmp_path / model_type
    reference, tokenizer = checkpoint_folder(model_type, folder)
    out, subs = tmp_path / "runs", tmp_path / "subs"

    # kbert run: layer pooling over every layer's output, LoRA in the architecture's own projection names,
    # recomputed layers, the raw columns fused in (their weights train beside the adapters).
    run = ["run", "titanic", "--encoder", str(folder), *tiny_args(60, max_length=60), "--pooling", "weighted-layers",
           "--adapter", "lora", "--lora-targets", "attention", "--gradient-checkpointing", "--fusion", "gated",
           "--out", str(out), "--submissions-dir", str(subs), "--run-id", "r"]
    assert main(run) == 0
    run_dir = out / "titanic" / "r"
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert 0 <= metrics["cv"] <= 1
    saved = mx.load(str(run_dir / "folds" / "0" / "adapter.safetensors"))
    assert any(k.startswith("fusion.tabular_in.") for k in saved) and any("lora_a" in k for k in saved)

    # kbert predict reloads the adapter folds on the same base and reproduces the run's test predictions.
    assert main(["predict", str(run_dir), "--data", str(BUNDLED_DATA_DIR / "titanic" / "test.csv"),
                 "--output", str(tmp_path / "p.csv")]) == 0
    np.testing.assert_allclose(pd.read_csv(tmp_path / "p.csv")["Survived"],
                               pd.read_csv(run_dir / "test.csv")["Survived"], atol=1e-5)

    # The folder's weights changed since the run started: its resume is refused (its folds would mix two bases).
    weights = folder / "model.safetensors"
    original = weights.read_bytes()
    tensors = mx.load(str(weights))
    name = sorted(tensors)[0]
    mx.save_safetensors(str(weights), {**tensors, name: tensors[name] + 1})
    capsys.readouterr()
    assert main(run) == 2
    assert capsys.readouterr().err.strip().endswith("was started on other data: encoder weights changed; pick "
                                                    "another --run-id")
    weights.write_bytes(original)

    # kbert embed: mean-pooled states equal the reference's.
    texts = ["Braund, Mr. Owen Harris", "Cumings, Mrs. John Bradley (Florence Briggs Thayer)", "Heikkinen, Miss. Laina"]
    (tmp_path / "texts.txt").write_text("\n".join(texts) + "\n")
    assert main(["embed", str(folder), "--texts", str(tmp_path / "texts.txt"), "--out", str(tmp_path / "e.npy")]) == 0
    encodings = tokenizer.encode_batch(texts)
    width = max(len(e.ids) for e in encodings)
    ids = np.array([e.ids + [0] * (width - len(e.ids)) for e in encodings])
    mask = np.array([[1] * len(e.ids) + [0] * (width - len(e.ids)) for e in encodings])
    with torch.no_grad():
        hidden = reference(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).last_hidden_state.numpy()
    expected = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
    assert np.abs(np.load(tmp_path / "e.npy") - expected).max() <= 1e-4

    # kbert pretrain continues the masked-LM training of the same encoder, and the result loads as an encoder.
    assert main(["pretrain", "titanic", "--encoder", str(folder), "--steps", "4", "--batch-size", "16",
                 "--eval-every", "2", "--augment", "0", "--max-length", "48", "--out", str(out), "--run-id", "m",
                 "--no-progress"]) == 0
    encoder, config, _ = load_encoder(out / "titanic" / "pretrain" / "m")
    assert config.model_type == model_type
    assert encoder(mx.array(ids), mx.array(mask)).last_hidden_state.shape == (3, width, 32)
