import numpy as np

from kbert.models.tokenizer import encode, load_or_train_tokenizer, train_wordpiece

TEXTS = ["A man with the title mister, travelling in third class.",
         "A woman with the title missus, travelling in first class.",
         "A girl with the title miss, boarded at Cherbourg."] * 5


def test_wordpiece_ids_are_int32_with_special_tokens():
    tokenizer = train_wordpiece(TEXTS, vocab_size=200)
    assert tokenizer.token_to_id("[PAD]") == 0
    ids = encode(tokenizer, ["A woman travelling in first class."], max_length=64)[0]
    assert ids.dtype == np.int32
    assert ids[0] == tokenizer.token_to_id("[CLS]") and ids[-1] == tokenizer.token_to_id("[SEP]")
    assert tokenizer.token_to_id("[UNK]") not in ids.tolist()
    assert len(encode(tokenizer, [TEXTS[0] * 10], max_length=16)[0]) == 16


def test_training_is_deterministic():
    a, b = train_wordpiece(TEXTS, vocab_size=200), train_wordpiece(TEXTS, vocab_size=200)
    assert a.get_vocab() == b.get_vocab()


def test_tokenizer_is_cached_per_corpus(tmp_path):
    first, path = load_or_train_tokenizer(TEXTS, 200, tmp_path)
    assert path.exists()
    again, path_again = load_or_train_tokenizer(TEXTS, 200, tmp_path)
    assert path_again == path and again.get_vocab() == first.get_vocab()
    _, other = load_or_train_tokenizer(TEXTS[:3], 200, tmp_path)
    assert other != path
    # Two entries swapped (each under the other's corpus key): each is read only with its own sha256, so the
    # corpus's own vocabulary is trained again rather than another corpus's used.
    first_bytes, other_bytes = path.read_bytes(), other.read_bytes()
    path.write_bytes(other_bytes)
    other.write_bytes(first_bytes)
    retrained, path_retrained = load_or_train_tokenizer(TEXTS, 200, tmp_path)
    assert retrained.get_vocab() == first.get_vocab() and path_retrained.read_bytes() == first_bytes
    path.write_text('{"model": ')  # damaged (a killed copy, a full disk): not read, trained again
    again, _ = load_or_train_tokenizer(TEXTS, 200, tmp_path)
    assert again.get_vocab() == first.get_vocab() and path.read_bytes() == first_bytes


def test_a_max_length_without_room_for_text_is_refused():
    """At a length no longer than its special tokens the tokenizers library cuts nothing (a row kept all its
    tokens, past the position table: MLX's gather does not check, and the process crashed); refused instead."""
    import pytest

    from kbert.errors import KbertError

    tok = train_wordpiece(TEXTS, vocab_size=200)
    tok.enable_truncation(1)
    assert len(tok.encode(TEXTS[0]).ids) > 2  # what the library does at 1; at 2 a row is [CLS] [SEP], no text
    for length in (1, 2):
        with pytest.raises(KbertError, match=rf"^--max-length {length} .*special tokens of each row; use at least 3"):
            encode(tok, TEXTS, length)
    assert [len(ids) for ids in encode(tok, TEXTS, 3)] == [3] * len(TEXTS)
