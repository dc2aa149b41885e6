"""Rebuild ``spm.model`` here: a small SentencePiece unigram model laid out like DeBERTa-v3's.

DeBERTa-v3's ``spm.model`` (microsoft/deberta-v3-*) is a unigram model with 128,000 pieces whose ids 0-3 are
[PAD], [CLS], [SEP] (control pieces: pad, bos, eos) and [UNK] (the unknown piece), normalised with sentencepiece's
``nmt_nfkc`` rule; [MASK] is not in the model: the checkpoint adds it after the last piece (added_tokens.json
``{"[MASK]": 128000}``). This model has the same layout with 2,000 pieces, trained on the bundled Disaster Tweets
texts and serialised Titanic rows, leaving out the rows the parity test encodes (the first 500 tweets and 100
Titanic rows), so those have unseen words and characters. Deterministic: one thread, no sampling or shuffling.

    .venv/bin/pip install sentencepiece
    .venv/bin/python tests/data/deberta-v3-spm/make_fixture.py
"""

from __future__ import annotations

import io
from pathlib import Path

import pandas as pd
import sentencepiece as spm

HERE = Path(__file__).resolve().parent
DATA = HERE.parents[2] / "competitions" / "data"
TEST_TWEETS, TEST_TITANIC = 500, 100  # rows tests/test_spm_tokenizer.py encodes


def titanic_text(row: pd.Series) -> str:
    """A Titanic row as one line of text (tests/test_spm_tokenizer.py serialises the same way)."""
    return " ".join(f"{column}: {value}." for column, value in row.items() if pd.notna(value))


def corpus() -> list[str]:
    tweets = pd.read_csv(DATA / "nlp-getting-started" / "train.csv")["text"].tolist()[TEST_TWEETS:]
    titanic = pd.read_csv(DATA / "titanic" / "train.csv").iloc[TEST_TITANIC:]
    return tweets + [titanic_text(row) for _, row in titanic.iterrows()]


def main() -> None:
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus()), model_writer=model, model_type="unigram", vocab_size=2000,
        normalization_rule_name="nmt_nfkc", character_coverage=0.9995,
        pad_id=0, bos_id=1, eos_id=2, unk_id=3, pad_piece="[PAD]", bos_piece="[CLS]", eos_piece="[SEP]",
        unk_piece="[UNK]", num_threads=1, shuffle_input_sentence=False, input_sentence_size=0, minloglevel=2,
    )
    (HERE / "spm.model").write_bytes(model.getvalue())


if __name__ == "__main__":
    main()
