"""WordPiece tokenizers (Hugging Face ``tokenizers``): train on competition text, cache, encode to int32; and the
checked reader of every ``tokenizer.json`` kbert reads (``read_tokenizer``)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import WordPiece
from tokenizers.trainers import WordPieceTrainer

from kbert.errors import KbertError
from kbert.io import file_sha256, read_text, write_text

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
# How pretrained tokenizers spell them: BERT, ELECTRA and DeBERTa in brackets, RoBERTa and XLM-R in angles.
SPELLINGS = {"pad": ("[PAD]", "<pad>"), "unk": ("[UNK]", "<unk>"), "cls": ("[CLS]", "<s>"), "sep": ("[SEP]", "</s>"),
             "mask": ("[MASK]", "<mask>")}


def special_token_id(tokenizer: Tokenizer, kind: str) -> int | None:
    """The id of the tokenizer's ``kind`` token (pad, unk, cls, sep, mask) in either spelling; None if it has none."""
    return next((i for i in map(tokenizer.token_to_id, SPELLINGS[kind]) if i is not None), None)


def special_ids(tokenizer: Tokenizer) -> set[int]:
    """Every special token's id: the five kinds in either spelling, and any other token added as special."""
    spelled = {special_token_id(tokenizer, kind) for kind in SPELLINGS} - {None}
    return spelled | {i for i, token in tokenizer.get_added_tokens_decoder().items() if token.special}
TOKENIZER_VERSION = "wordpiece-v2"  # bump when training settings change, to invalidate caches


def _bare_tokenizer(model: WordPiece) -> Tokenizer:
    tokenizer = Tokenizer(model)
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    return tokenizer


def continuation_tokens(tokenizer: Tokenizer, texts: list[str]) -> list[str]:
    """Sorted ``##c`` tokens for every character that follows another inside a word."""
    chars: set[str] = set()
    for text in texts:
        for word, _ in tokenizer.pre_tokenizer.pre_tokenize_str(tokenizer.normalizer.normalize_str(text)):
            chars.update(word[1:])
    return [f"##{c}" for c in sorted(chars)]


def train_wordpiece(texts: list[str], vocab_size: int) -> Tokenizer:
    """A lowercasing BERT-style WordPiece tokenizer trained on ``texts`` ([PAD] is id 0). Deterministic.

    The trainer creates ``##c`` continuation tokens in hash-map order, and their ids break ties between
    merges, so plain training differs from run to run (huggingface/tokenizers#1794). Registering them up
    front, sorted, fixes every id; the learned vocabulary is then rebuilt into a clean tokenizer.
    """
    trainer_tokenizer = _bare_tokenizer(WordPiece(unk_token="[UNK]"))
    continuation = continuation_tokens(trainer_tokenizer, texts)
    trainer = WordPieceTrainer(vocab_size=max(vocab_size, len(SPECIAL_TOKENS) + 2 * len(continuation)),
                               special_tokens=SPECIAL_TOKENS + continuation, min_frequency=1, show_progress=False)
    trainer_tokenizer.train_from_iterator(texts, trainer=trainer, length=len(texts))

    tokenizer = _bare_tokenizer(WordPiece(trainer_tokenizer.get_vocab(), unk_token="[UNK]"))
    tokenizer.add_special_tokens(SPECIAL_TOKENS)
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", tokenizer.token_to_id("[CLS]")), ("[SEP]", tokenizer.token_to_id("[SEP]"))],
    )
    return tokenizer


def corpus_key(texts: list[str], vocab_size: int) -> str:
    digest = hashlib.sha256(f"{TOKENIZER_VERSION}|{vocab_size}|".encode())
    for text in texts:
        digest.update(text.encode("utf-8"))
        digest.update(b"\n")
    return digest.hexdigest()[:16]


def read_tokenizer(path: Path) -> Tokenizer:
    """A ``tokenizer.json``; a missing, truncated or invalid file is one error naming it."""
    text = read_text(path)
    try:
        return Tokenizer.from_str(text)
    except Exception as exc:  # the tokenizers library raises plain Exception for a parse error
        raise KbertError(f"{path}: not a readable tokenizer file (truncated or edited?): {exc}") from None


def load_or_train_tokenizer(texts: list[str], vocab_size: int, cache_dir: Path) -> tuple[Tokenizer, Path]:
    """Train once per distinct corpus and vocabulary size; later runs load the cached ``tokenizer.json``. An entry is
    named by its corpus's key and its own sha256, and read only when it has that sha256: the shared cache was
    trusted by name, and an entry swapped in (a vocabulary learnt on other rows, a fold's validation rows among
    them) was used as this corpus's."""
    key = corpus_key(texts, vocab_size)
    for path in sorted(Path(cache_dir).glob(f"tokenizer-{key}-*.json")):
        if path.stem.rsplit("-", 1)[1] == file_sha256(path)[:16]:
            return read_tokenizer(path), path
    tokenizer = train_wordpiece(texts, vocab_size)
    text = tokenizer.to_str()
    path = Path(cache_dir) / f"tokenizer-{key}-{hashlib.sha256(text.encode('utf-8')).hexdigest()[:16]}.json"
    write_text(path, text)
    return tokenizer, path


def truncate_to(tokenizer: Tokenizer, max_length: int) -> None:
    """Cut each text's tokens to ``max_length``, padding none. A length that leaves no room beside the special
    tokens is refused: the tokenizers library then cuts nothing, and the longer rows would index past the
    position table."""
    specials = tokenizer.num_special_tokens_to_add(False)
    if max_length <= specials:
        raise KbertError(f"--max-length {max_length} (training.max_length) leaves no room for text beside the "
                         f"{specials} special tokens of each row; use at least {specials + 1}")
    tokenizer.enable_truncation(max_length)
    tokenizer.no_padding()


def encode(tokenizer: Tokenizer, texts: list[str], max_length: int) -> list[np.ndarray]:
    """Token ids per text (with [CLS]/[SEP]), truncated to ``max_length``, as int32 arrays."""
    truncate_to(tokenizer, max_length)
    return [np.asarray(e.ids, dtype=np.int32) for e in tokenizer.encode_batch(texts)]


def token_lengths(tokenizer: Tokenizer, texts: list[str]) -> np.ndarray:
    """Untruncated token counts per text (with [CLS]/[SEP]), for the token-budget check."""
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return np.asarray([len(e.ids) for e in tokenizer.encode_batch(texts)], dtype=np.int64)


def fits_in(tokenizer: Tokenizer, max_length: int) -> Callable[[str], bool]:
    """A check that a text's untruncated token count (with [CLS]/[SEP]) is at most ``max_length``."""

    def fits(text: str) -> bool:
        tokenizer.no_truncation()
        return len(tokenizer.encode(text).ids) <= max_length

    return fits
