"""DeBERTa-v2/v3 checkpoints with only ``spm.model``: kbert's conversion (models/spm.py) against transformers and
sentencepiece, its cache beside the model, and damaged files.

The model is tests/data/deberta-v3-spm/spm.model: 2,000 unigram pieces laid out like DeBERTa-v3's 128,000
([PAD] [CLS] [SEP] [UNK] first, nmt_nfkc normalisation, [MASK] added after the last piece), trained on the bundled
Disaster Tweets and Titanic rows by make_fixture.py beside it, leaving out the rows encoded here.

References, on the first 500 tweets and 100 serialised Titanic rows, singly and as pairs:
- transformers' ``DebertaV2Converter`` output inside transformers' DeBERTa tokenizer: the same ids and type ids.
- transformers' own ``AutoTokenizer.from_pretrained`` (``DebertaV2Tokenizer``). From 5.25 it normalises with the
  model's table, as the converter does, and the default's ids equal it on every text. 5.0 to 5.24 dropped the table
  (NFC where sentencepiece does NFKC): there ``spm_normalization="transformers"`` (``--spm-normalization
  transformers``) equals it on every text, and the default only on the texts NFKC leaves alone. Whichever version is
  installed, the two normalisations differ on some texts, and the default gives for each text what "transformers"
  gives for its NFKC form.
- sentencepiece itself (what DeBERTa was pretrained with): equal except where two segmentations tie.
"""

import json
import os
import shutil
import unicodedata
from pathlib import Path

import pandas as pd
import pytest
import yaml
from tokenizers import Regex, Tokenizer, normalizers, pre_tokenizers, processors

import kbert.io
import kbert.models.spm as spm_module
from kbert.errors import KbertError
from kbert.models.encoders import load_tokenizer
from kbert.models.spm import CACHE_PREFIX, model_proto_class
from kbert.pipeline.config import BUNDLED_DATA_DIR
from tests.tiny import tiny_args

FIXTURE = Path(__file__).parent / "data" / "deberta-v3-spm" / "spm.model"
PIECES = 2000
SPECIAL_TOKENS = {"bos_token": "[CLS]", "eos_token": "[SEP]", "unk_token": "[UNK]", "sep_token": "[SEP]",
                  "pad_token": "[PAD]", "cls_token": "[CLS]", "mask_token": "[MASK]"}
VARIANTS = {"cased": {}, "lowercase": {"do_lower_case": True}, "split_by_punct": {"split_by_punct": True}}
EXTRA_TEXTS = ["Paris is the [MASK] of France.", "  leading,  inner   and trailing spaces  ", "tabs\tand\nnew\r\nlines",
               "ﬁ ligature ① Ⅻ ＡＢＣ … ª", "", "   ", "[CLS] typed [SEP] [UNK] [PAD]", "Ünïcödé façade naïve e\u0301"]


def titanic_text(row: pd.Series) -> str:
    """A Titanic row as one line of text, as make_fixture.py serialises it."""
    return " ".join(f"{column}: {value}." for column, value in row.items() if pd.notna(value))


@pytest.fixture(scope="module")
def texts() -> list[str]:
    tweets = pd.read_csv(BUNDLED_DATA_DIR / "nlp-getting-started" / "train.csv")["text"].tolist()[:500]
    titanic = pd.read_csv(BUNDLED_DATA_DIR / "titanic" / "train.csv").iloc[:100]
    return tweets + [titanic_text(row) for _, row in titanic.iterrows()] + EXTRA_TEXTS


def pairs_of(texts: list[str]) -> list[tuple[str, str]]:
    return list(zip(texts[:-1], texts[1:]))


def checkpoint(folder: Path, **config) -> Path:
    """A DeBERTa-v3-like checkpoint folder (tokenizer files only), as on the Hub for microsoft/deberta-v3-base."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(FIXTURE, folder / "spm.model")
    (folder / "config.json").write_text(json.dumps({"model_type": "deberta-v2"}))
    (folder / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False, "vocab_type": "spm", **config}))
    (folder / "special_tokens_map.json").write_text(json.dumps(SPECIAL_TOKENS))
    (folder / "added_tokens.json").write_text(json.dumps({"[MASK]": PIECES}))
    return folder


def caches(folder: Path) -> list[Path]:
    return sorted(folder.glob(f"{CACHE_PREFIX}*.json"))


def encode(tokenizer: Tokenizer, texts: list[str]) -> tuple[list[list[int]], list[tuple[list[int], list[int]]]]:
    """Ids of each text, and ids and type ids of each consecutive pair."""
    singles = [e.ids for e in tokenizer.encode_batch(texts)]
    pairs = [(e.ids, e.type_ids) for e in tokenizer.encode_batch(pairs_of(texts))]
    return singles, pairs


def reference(hf, texts: list[str]) -> tuple[list[list[int]], list[tuple[list[int], list[int]]]]:
    singles = hf(texts)["input_ids"]
    encoded = hf([a for a, _ in pairs_of(texts)], [b for _, b in pairs_of(texts)])
    return singles, list(zip(encoded["input_ids"], encoded["token_type_ids"]))


def own_normalization() -> str:
    """The normalisation the installed transformers' own ``DebertaV2Tokenizer`` applies: NFC up to 5.24 (kbert's
    "transformers"), the model's table from 5.25 (kbert's default)."""
    from packaging.version import Version
    from transformers import __version__

    return "transformers" if Version(__version__) < Version("5.25") else "sentencepiece"


def mismatches(ours, theirs) -> int:
    return sum(a != b for a, b in zip(ours[0], theirs[0])) + sum(a != b for a, b in zip(ours[1], theirs[1]))


@pytest.fixture(scope="module")
def transformers_tokenizers():
    """A function of a checkpoint folder: (transformers' own tokenizer, the one with DebertaV2Converter's backend)."""
    pytest.importorskip("sentencepiece")  # transformers reads spm.model through it
    transformers = pytest.importorskip("transformers")
    from transformers.convert_slow_tokenizer import DebertaV2Converter

    def build(folder: Path):
        own = transformers.AutoTokenizer.from_pretrained(folder)
        assert type(own).__name__ == "DebertaV2Tokenizer" and len(own) == PIECES + 1
        converted = transformers.AutoTokenizer.from_pretrained(
            folder, tokenizer_object=DebertaV2Converter(own).converted())
        return own, converted

    return build


@pytest.mark.parametrize("variant", VARIANTS)
def test_ids_equal_transformers(variant, texts, tmp_path, transformers_tokenizers):
    folder = checkpoint(tmp_path / variant, **VARIANTS[variant])
    own, converted = transformers_tokenizers(folder)
    ours = load_tokenizer(folder)
    assert ours.token_to_id("[MASK]") == own.mask_token_id == PIECES
    assert ours.get_vocab_size() == len(own)
    encoded = encode(ours, texts)
    assert mismatches(encoded, reference(converted, texts)) == 0

    # transformers' own tokenizer normalises as one of the two: equal on every text, singly and in pairs.
    nfc = encode(load_tokenizer(folder, "transformers"), texts)
    matching, other = (encoded, nfc) if own_normalization() == "sentencepiece" else (nfc, encoded)
    own_singles, own_pairs = reference(own, texts)
    assert mismatches(matching, (own_singles, own_pairs)) == 0
    assert sum(a != b for a, b in zip(other[0], own_singles)) > 0  # the difference is real (tweets have "ª")

    # NFC and the model's NFKC table: equal on the texts NFKC leaves alone, and on the NFKC form of every text.
    compatible = [unicodedata.normalize("NFKC", t) == t for t in texts]
    assert [a for a, b, same in zip(encoded[0], nfc[0], compatible) if same and a != b] == []
    pair_compatible = [a and b for a, b in zip(compatible[:-1], compatible[1:])]
    assert [a for a, b, same in zip(encoded[1], nfc[1], pair_compatible) if same and a != b] == []
    normalized = [unicodedata.normalize("NFKC", t) for t in texts]
    assert mismatches(encoded, encode(load_tokenizer(folder, "transformers"), normalized)) == 0


def test_ids_equal_sentencepiece_but_for_ties(texts, tmp_path):
    sentencepiece = pytest.importorskip("sentencepiece")
    from sentencepiece import sentencepiece_model_pb2

    folder = checkpoint(tmp_path / "model")
    reference_proto = sentencepiece_model_pb2.ModelProto.FromString(FIXTURE.read_bytes())
    ours_proto = spm_module.read_spm_model(FIXTURE)
    assert [(p.piece, p.score, p.type) for p in ours_proto.pieces] == [
        (p.piece, p.score, p.type) for p in reference_proto.pieces]
    assert ours_proto.normalizer_spec.precompiled_charsmap == reference_proto.normalizer_spec.precompiled_charsmap

    processor = sentencepiece.SentencePieceProcessor(model_file=str(FIXTURE))
    scores = {p.piece: p.score for p in reference_proto.pieces}
    tokenizer = load_tokenizer(folder)
    plain = [t for t in texts if "[" not in t]  # sentencepiece knows nothing of the added and special tokens
    ties = 0
    for text in plain:
        ours = tokenizer.encode(text)
        theirs = [1, *processor.encode(text), 2]
        if ours.ids != theirs:  # only another segmentation of the same text with the same total score
            pieces = processor.id_to_piece(theirs[1:-1])
            assert "".join(ours.tokens[1:-1]) == "".join(pieces), text
            assert sum(scores[p] for p in ours.tokens[1:-1]) == pytest.approx(sum(scores[p] for p in pieces)), text
            ties += 1
    assert ties <= len(plain) // 100


def test_seeded_mistakes_fail_the_comparison(texts, tmp_path, transformers_tokenizers):
    folder = checkpoint(tmp_path / "model")
    _, converted = transformers_tokenizers(folder)
    expected = reference(converted, texts)
    assert mismatches(encode(load_tokenizer(folder), texts), expected) == 0

    def mutant(change) -> Tokenizer:
        tokenizer = Tokenizer.from_str(load_tokenizer(folder).to_str())
        change(tokenizer)
        return tokenizer

    def no_charsmap(tokenizer):
        tokenizer.normalizer = normalizers.Sequence([normalizers.Strip(), normalizers.Replace(Regex(" {2,}"), " ")])

    seeded = {
        "no Metaspace prepend": lambda t: setattr(t, "pre_tokenizer", pre_tokenizers.Metaspace(prepend_scheme="never")),
        "no post-processor": lambda t: setattr(t, "post_processor", processors.TemplateProcessing(
            single="$A", pair="$A $B:1", special_tokens=[])),
        "pair type ids all 0": lambda t: setattr(t, "post_processor", processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]", special_tokens=[("[CLS]", 1), ("[SEP]", 2)])),
        "no precompiled charsmap": no_charsmap,
    }
    for name, change in seeded.items():
        assert mismatches(encode(mutant(change), texts), expected) > 0, name


@pytest.fixture
def conversions(monkeypatch) -> list[Path]:
    """Records each conversion kbert runs (the spm.model path)."""
    calls = []
    convert = spm_module.convert_spm

    def spy(model_path, settings, normalization="sentencepiece"):
        calls.append(Path(model_path))
        return convert(model_path, settings, normalization)

    monkeypatch.setattr(spm_module, "convert_spm", spy)
    return calls


def test_transformers_normalization_is_refused_where_it_cannot_apply(tmp_path):
    folder = checkpoint(tmp_path / "model")
    load_tokenizer(folder).save(str(folder / "tokenizer.json"))
    with pytest.raises(KbertError, match=r"model: spm normalization 'transformers' applies to checkpoints with "
                                         r"spm\.model and no tokenizer\.json"):
        load_tokenizer(folder, "transformers")
    with pytest.raises(KbertError, match="spm normalization 'nfkc' is unknown; known: sentencepiece, transformers"):
        spm_module.convert_spm(FIXTURE, spm_module.read_settings(folder), "nfkc")


def test_conversion_is_cached_beside_the_model(tmp_path, conversions):
    folder = checkpoint(tmp_path / "model")
    first = load_tokenizer(folder)
    assert len(conversions) == 1 and len(caches(folder)) == 1
    cached = caches(folder)[0]
    assert Tokenizer.from_file(str(cached)).to_str() == first.to_str()
    second = load_tokenizer(folder)
    assert len(conversions) == 1  # read from the cached file
    assert second.to_str() == first.to_str()
    assert second.padding is None and second.truncation is None

    # A changed spm.model is converted again, and its conversion replaces the earlier one.
    proto = model_proto_class()()
    proto.ParseFromString((folder / "spm.model").read_bytes())
    the = next(p for p in proto.pieces if p.piece == "▁the")
    the.score = -1000.0
    (folder / "spm.model").write_bytes(proto.SerializeToString())
    changed = load_tokenizer(folder)
    assert len(conversions) == 2 and caches(folder) != [cached] and len(caches(folder)) == 1
    assert changed.encode("the").ids != first.encode("the").ids
    load_tokenizer(folder)
    assert len(conversions) == 2

    # So are changed settings.
    (folder / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    assert load_tokenizer(folder).encode("THE").ids == changed.encode("the").ids
    assert len(conversions) == 3

    # So is the other normalisation.
    assert load_tokenizer(folder, "transformers").to_str() != load_tokenizer(folder).to_str()
    assert len(conversions) == 5 and len(caches(folder)) == 1  # each conversion replaces the one before

    # A damaged cache file is converted again and replaced.
    cached = caches(folder)[0]
    cached.write_text(cached.read_text()[:1000])
    load_tokenizer(folder)
    assert len(conversions) == 6 and Tokenizer.from_file(str(cached)).get_vocab_size() == PIECES + 1


def test_tokenizer_json_comes_first(tmp_path, conversions):
    folder = checkpoint(tmp_path / "model")
    tokenizer = load_tokenizer(folder)
    tokenizer.save(str(folder / "tokenizer.json"))
    for cache in caches(folder):
        cache.unlink()
    assert load_tokenizer(folder).to_str() == tokenizer.to_str()
    assert len(conversions) == 1 and caches(folder) == []


def test_unwritable_folder_converts_in_memory(tmp_path, monkeypatch, conversions):
    folder = checkpoint(tmp_path / "model")

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(kbert.io.tempfile, "mkstemp", refuse)  # what a read-only folder makes atomic writes meet
    first, second = load_tokenizer(folder), load_tokenizer(folder)
    assert first.to_str() == second.to_str() and first.encode("Forest fire near La Ronge").ids[0] == 1
    assert len(conversions) == 2 and caches(folder) == []


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root writes in read-only folders")
def test_read_only_folder(tmp_path, conversions):
    folder = checkpoint(tmp_path / "model")
    folder.chmod(0o555)
    try:
        load_tokenizer(folder)
        load_tokenizer(folder)
    finally:
        folder.chmod(0o755)
    assert len(conversions) == 2 and caches(folder) == []


def wrong_model_type(data: bytes) -> bytes:
    proto = model_proto_class()()
    proto.ParseFromString(data)
    proto.trainer_spec.model_type = 2  # BPE
    return proto.SerializeToString()


@pytest.mark.parametrize("damage", [
    lambda data: data[: len(data) // 3],  # truncated
    lambda data: b"version https://git-lfs.github.com/spec/v1\noid sha256:0123\nsize 2464616\n",  # an LFS pointer
    lambda data: b"",
    lambda data: b"\x0a\x05\x0a\x03abc" * 3 + b"\xff\xff",  # pieces, then garbage
    wrong_model_type,
], ids=["truncated", "lfs-pointer", "empty", "garbage-tail", "bpe"])
def test_damaged_spm_model_is_one_error(damage, tmp_path):
    folder = checkpoint(tmp_path / "model")
    (folder / "spm.model").write_bytes(damage(FIXTURE.read_bytes()))
    with pytest.raises(KbertError, match=str(folder / "spm.model")):
        load_tokenizer(folder)
    assert caches(folder) == []


def test_added_token_ids_must_follow_the_pieces(tmp_path):
    folder = checkpoint(tmp_path / "model")
    (folder / "added_tokens.json").write_text(json.dumps({"[MASK]": PIECES + 5}))
    with pytest.raises(KbertError, match=r"'\[MASK\]' has id 2005 .* would get 2000"):
        load_tokenizer(folder)


@pytest.mark.slow
def test_a_run_on_an_spm_checkpoint_tokenizes_as_asked_and_predict_follows(tmp_path, capsys):
    """`kbert run --spm-normalization transformers` on a DeBERTa-v3 folder with spm.model only: the run keeps the
    tokenizer it trained with (config.yaml, tokenizer.json) and `kbert predict` reproduces its test predictions."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from kbert.cli import main

    folder = checkpoint(tmp_path / "deberta")
    torch.manual_seed(0)
    config = transformers.DebertaV2Config(vocab_size=PIECES + 1, hidden_size=32, num_hidden_layers=2,
                                          num_attention_heads=4, intermediate_size=64, max_position_embeddings=64,
                                          relative_attention=True, position_buckets=8, norm_rel_ebd="layer_norm",
                                          share_att_key=True, pos_att_type=["p2c", "c2p"],
                                          position_biased_input=False, type_vocab_size=0)
    transformers.DebertaV2Model(config).save_pretrained(folder)
    out, run_dir = tmp_path / "runs", tmp_path / "runs" / "titanic" / "r"
    tiny = [*tiny_args(40), "--out", str(out), "--submissions-dir", str(tmp_path / "subs")]
    assert main(["run", "titanic", "--encoder", str(folder), "--spm-normalization", "transformers", *tiny,
                 "--run-id", "r"]) == 0
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["model"]["spm_normalization"] == "transformers"
    saved = Tokenizer.from_file(str(run_dir / "tokenizer.json"))
    mojibake = "You Can\x89Ûªt Believe Your EYES \x89ÛÒ... ﬁre"
    assert (saved.encode(mojibake).ids == load_tokenizer(folder, "transformers").encode(mojibake).ids
            != load_tokenizer(folder).encode(mojibake).ids)
    assert main(["predict", str(run_dir), "--data", str(BUNDLED_DATA_DIR / "titanic" / "test.csv"),
                 "--output", str(tmp_path / "p.csv")]) == 0
    assert pd.read_csv(tmp_path / "p.csv")["Survived"].tolist() == pytest.approx(
        pd.read_csv(run_dir / "test.csv")["Survived"].tolist(), abs=1e-5)

    # Where the checkpoint has its own tokenizer.json the option has nothing to change: one line, exit 2, no run.
    load_tokenizer(folder).save(str(folder / "tokenizer.json"))
    capsys.readouterr()
    assert main(["run", "titanic", "--encoder", str(folder), "--spm-normalization", "transformers", *tiny,
                 "--run-id", "refused"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"kbert: error: {folder}: spm normalization 'transformers' applies to checkpoints with spm.model and no "
        f"tokenizer.json; this one's tokenizer is used as it is (drop the option)"]
    assert not (out / "titanic" / "refused").exists()
