"""``kbert pretrain``: masked-language-model pretraining on a competition's own text, before fine-tuning.

The corpus is every training and test row serialized as ``kbert run`` does, targets dropped first. Masking
follows BERT (15% predicted: 80% [MASK], 10% random, 10% kept). Output: ``runs/<competition>/pretrain/<id>/``
(config.json, model.safetensors, tokenizer.json, pretrain.json), written to a temp folder and renamed.
"""

from __future__ import annotations

import math
import shutil
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pandas as pd
from tokenizers import Tokenizer
from tqdm import tqdm

from kbert.errors import KbertError
from kbert.io import removed_on_refusal, write_json
from kbert.models.encoders import max_tokens, trains_from_scratch
from kbert.models.masked_lm import build_masked_lm, load_masked_lm, save_masked_lm
from kbert.models.tokenizer import (load_or_train_tokenizer, special_ids, special_token_id, token_lengths,
                                    truncate_to)
from kbert.pipeline.artifacts import check_output_folder, new_run_id
from kbert.pipeline.config import RunConfig, TrainConfig, augments
from kbert.pipeline.data import input_rows, load_competition_data
from kbert.pipeline.fold import make_serializer, max_length_advice, scratch_encoder_config, token_budget
from kbert.pipeline.streams import cpu_streams
from kbert.pipeline.train import Execution, make_optimizer, make_train_step, seed_everything


@dataclass
class PretrainConfig:
    encoder: str = "bert"  # "bert" or a preset trains from scratch; a shipped name or folder continues pretraining
    steps: int = 2000
    batch_size: int = 64
    learning_rate: float | None = None  # None: 5e-4 from scratch, 5e-5 for a pretrained encoder
    mask_prob: float = 0.15
    whole_word: bool = False
    augment: int = 4  # augmented serializations of each row, next to the plain one
    holdout: float = 0.05  # share of rows held out for masked accuracy and perplexity
    eval_every: int = 200
    seed: int = 42


NO_VARIANTS = " (the text section draws no augmentation)"


@dataclass
class Corpus:
    train_texts: list[str]  # the training slice: plain and augmented texts of the non-held-out rows
    eval_texts: list[str]  # the held-out rows' plain texts
    rows: int  # rows in all (train + test)
    variants: int  # augmented variants of each training row: --augment, or 0 where the text section draws nothing


def build_corpus(config: RunConfig, settings: PretrainConfig) -> Corpus:
    """Every train and test row as text, with augmented variants; the target columns never enter."""
    comp = config.competition
    data = load_competition_data(comp, config.data_dir or None)
    train = data.train if config.limit_rows is None else data.train.iloc[: config.limit_rows]
    features, test_features = input_rows(comp, train, data.test)
    rows = pd.concat([features, test_features], ignore_index=True)
    serializer = make_serializer(config).fit(rows)  # label-free statistics (bins) of all rows
    rng = np.random.default_rng(settings.seed)
    held_out = rng.random(len(rows)) < settings.holdout
    kept, held = rows[~held_out], rows[held_out]
    if len(held) == 0 or len(kept) == 0:
        raise KbertError(f"--holdout {settings.holdout} leaves no held-out or no training rows of {len(rows)}")
    texts = serializer.transform(kept)
    variants = settings.augment if augments(comp.text) else 0  # (else copies of the plain texts)
    for variant in range(1, variants + 1):
        texts += serializer.transform(kept, rng=np.random.default_rng([settings.seed, variant]))
    return Corpus(train_texts=texts, eval_texts=serializer.transform(held), rows=len(rows), variants=variants)


@dataclass
class Encoded:
    ids: list[np.ndarray]  # int32 token ids with [CLS]/[SEP]
    words: list[np.ndarray]  # int32 word index per token; -1 for special tokens


def encode_with_words(tokenizer: Tokenizer, texts: list[str], max_length: int) -> Encoded:
    truncate_to(tokenizer, max_length)
    encodings = tokenizer.encode_batch(texts)
    return Encoded(ids=[np.asarray(e.ids, dtype=np.int32) for e in encodings],
                   words=[np.asarray([-1 if w is None else w for w in e.word_ids], dtype=np.int32)
                          for e in encodings])


@dataclass(frozen=True)
class Masking:
    """How tokens are masked: the [MASK] and [PAD] ids, the ids a random replacement draws, the share of tokens (or
    with ``whole_word`` of words) predicted."""

    mask_id: int
    pad_id: int
    replacement_ids: np.ndarray  # every non-special token id
    mask_prob: float = 0.15
    whole_word: bool = False

    @classmethod
    def of(cls, tokenizer: Tokenizer, settings: PretrainConfig) -> "Masking":
        mask_id = special_token_id(tokenizer, "mask")
        if mask_id is None:
            raise KbertError(f"encoder '{settings.encoder}': its tokenizer has no [MASK] (or <mask>) token")
        specials = special_ids(tokenizer)
        replacement = np.asarray([i for i in range(tokenizer.get_vocab_size()) if i not in specials], dtype=np.int32)
        return cls(mask_id=mask_id, pad_id=special_token_id(tokenizer, "pad") or 0, replacement_ids=replacement,
                   mask_prob=settings.mask_prob, whole_word=settings.whole_word)

    def apply(self, ids: np.ndarray, words: np.ndarray, rng: np.random.Generator):
        return mask_tokens(ids, words, rng, self)


def mask_tokens(ids: np.ndarray, words: np.ndarray, rng: np.random.Generator,
                masking: Masking) -> tuple[np.ndarray, np.ndarray]:
    """BERT masking of a padded (batch, length) id array; ``words`` is -1 at special and padding positions.

    Returns (inputs, labels): labels hold the original id where a token is to be predicted and -100
    elsewhere; of the predicted tokens 80% become ``mask_id``, 10% a random id from ``replacement_ids`` and
    10% stay. ``whole_word``: words are chosen with ``mask_prob`` and all their tokens are predicted.
    """
    mask_prob, mask_id, replacement_ids = masking.mask_prob, masking.mask_id, masking.replacement_ids
    candidates = words >= 0
    if masking.whole_word:
        chosen_words = rng.random((ids.shape[0], int(words.max(initial=0)) + 1)) < mask_prob
        selected = candidates & np.take_along_axis(chosen_words, np.maximum(words, 0), axis=1)
    else:
        selected = candidates & (rng.random(ids.shape) < mask_prob)
    labels = np.where(selected, ids, -100).astype(np.int32)
    roll = rng.random(ids.shape)
    inputs = ids.copy()
    inputs[selected & (roll < 0.8)] = mask_id
    randomized = selected & (roll >= 0.8) & (roll < 0.9)
    inputs[randomized] = rng.choice(replacement_ids, size=int(randomized.sum()))
    return inputs, labels


def padded_batch(data: Encoded, index: np.ndarray, pad_id: int, bucket: int
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ids, words, attention mask) of rows ``index``, padded to their longest rounded up to ``bucket``."""
    lengths = [len(data.ids[i]) for i in index]
    width = -(-max(lengths) // bucket) * bucket
    ids = np.full((len(index), width), pad_id, dtype=np.int32)
    words = np.full((len(index), width), -1, dtype=np.int32)
    attention = np.zeros((len(index), width), dtype=np.int32)
    for row, (i, length) in enumerate(zip(index, lengths)):
        ids[row, :length], words[row, :length], attention[row, :length] = data.ids[i], data.words[i], 1
    return ids, words, attention


def masked_lm_loss(model: nn.Module, ids: mx.array, mask: mx.array, labels: mx.array) -> mx.array:
    """Mean cross-entropy over the predicted (label >= 0) positions."""
    logits = model(ids, mask)
    predicted = labels >= 0
    losses = nn.losses.cross_entropy(logits, mx.maximum(labels, 0), reduction="none")
    return (losses * predicted).sum() / mx.maximum(predicted.sum(), 1)


def evaluate_masked_lm(model: nn.Module, batches: list[tuple[np.ndarray, np.ndarray, np.ndarray]]
                       ) -> dict[str, float]:
    """Masked-token accuracy and perplexity over fixed, pre-masked held-out batches (eval mode)."""
    was_training = model.training
    model.eval()
    correct = total = 0
    loss_sum = 0.0
    for inputs, mask, labels in batches:
        logits = model(mx.array(inputs), mx.array(mask))
        target = mx.array(labels)
        predicted = target >= 0
        losses = nn.losses.cross_entropy(logits, mx.maximum(target, 0), reduction="none")
        hits = (mx.argmax(logits, axis=-1) == target) & predicted
        loss_batch, hits_batch, count = mx.sum(losses * predicted), mx.sum(hits), mx.sum(predicted)
        mx.eval(loss_batch, hits_batch, count)
        loss_sum += loss_batch.item()
        correct += hits_batch.item()
        total += count.item()
    model.train(was_training)
    mean_loss = loss_sum / max(total, 1)
    return {"masked_accuracy": correct / max(total, 1), "perplexity": float(np.exp(mean_loss)), "loss": mean_loss,
            "masked_tokens": int(total)}


@dataclass(frozen=True)
class Pretraining:
    """One ``kbert pretrain``: the run's settings, the pretraining settings, the corpus, the output folder and when
    it started."""

    config: RunConfig
    settings: PretrainConfig
    corpus: Corpus
    folder: Path
    started: float


@dataclass(frozen=True)
class MaskedLMData:
    """The corpus as the masked LM trains on it: the training texts' tokens, the held-out batches (masked once)
    and how fresh batches are masked."""

    train: Encoded
    held_out: list[tuple[np.ndarray, np.ndarray, np.ndarray]]
    masking: Masking


def pretrain(config: RunConfig, settings: PretrainConfig, run_id: str | None = None, progress: bool = True,
             log=print) -> Path:
    """Pretrain, then write the encoder + MLM head folder; returns its path. The output folder is checked first,
    and a refusal at any stage removes what the command created (a cached vocabulary, a half-written folder)."""
    started = time.perf_counter()
    if not 0 < settings.mask_prob < 1:
        raise KbertError(f"--mask-prob must be in (0, 1), got {settings.mask_prob}")
    if settings.steps < 1 or settings.batch_size < 1:
        raise KbertError("--steps and --batch-size must be at least 1")
    folder = pretrain_folder(config, run_id or new_run_id(settings.seed))
    corpus = build_corpus(config, settings)
    with removed_on_refusal():
        return pretrain_corpus(Pretraining(config, settings, corpus, folder, started), progress=progress, log=log)


def pretrain_folder(config: RunConfig, run_id: str) -> Path:
    """``runs/<competition>/pretrain/<id>``, refused when it exists or cannot be written (nothing is created)."""
    folder = Path(config.out_dir) / config.competition.name / "pretrain" / run_id
    if folder.exists():
        raise KbertError(f"pretrain folder already exists: {folder}; pick another --run-id")
    check_output_folder(folder, f"--out {config.out_dir}")
    check_output_folder(Path(config.out_dir) / config.competition.name / "cache", f"--out {config.out_dir}")
    return folder


def pretrain_corpus(job: Pretraining, *, progress: bool, log) -> Path:
    """Train the masked LM on the job's corpus, then write it to its folder."""
    config, settings, corpus, started = job.config, job.settings, job.corpus, job.started
    seed_everything(settings.seed)
    model, model_config, tokenizer = masked_lm_to_train(config, settings, corpus)
    masking = Masking.of(tokenizer, settings)
    positions = None if trains_from_scratch(settings.encoder) else max_tokens(model_config.to_dict())
    budget = report_truncation(tokenizer, corpus.train_texts + corpus.eval_texts, config.train.max_length, positions,
                               log)
    train_data = encode_with_words(tokenizer, corpus.train_texts, config.train.max_length)
    eval_batches = held_out_batches(encode_with_words(tokenizer, corpus.eval_texts, config.train.max_length),
                                    masking, settings, config.train.length_bucket)
    learning_rate = settings.learning_rate or (5e-4 if trains_from_scratch(settings.encoder) else 5e-5)
    history = [{"step": 0, **evaluate_masked_lm(model, eval_batches)}]
    log(f"{config.competition.name}: pretraining on {len(corpus.train_texts)} texts ({corpus.rows} rows, "
        f"{corpus.variants} augmented variants each{'' if corpus.variants == settings.augment else NO_VARIANTS}; "
        f"{len(corpus.eval_texts)} rows held out), vocabulary "
        f"{tokenizer.get_vocab_size()}, step 0 masked accuracy {history[0]['masked_accuracy']:.3f}")
    history += train_masked_lm(model, MaskedLMData(train_data, eval_batches, masking), settings,
                               replace(config.train, learning_rate=learning_rate), progress=progress, log=log)
    write_pretrained(job, model, model_config, tokenizer, history, learning_rate, budget)
    final = history[-1]
    log(f"held-out masked accuracy {final['masked_accuracy']:.3f} (start {history[0]['masked_accuracy']:.3f}), "
        f"perplexity {final['perplexity']:.2f}; {time.perf_counter() - started:.0f}s")
    return job.folder


def report_truncation(tokenizer: Tokenizer, texts: list[str], max_length: int, longest: int | None, log) -> dict:
    """How the corpus's texts fit ``max_length`` (``token_budget``), with a warning when some are cut: masked-LM
    pretraining sees only a text's first ``max_length`` tokens. ``longest``: a pretrained encoder's position table,
    past which --max-length cannot be raised."""
    budget = token_budget(token_lengths(tokenizer, texts), max_length)
    if budget["truncated_rows"]:
        log(f"warning: {budget['truncated_rows']} of {len(texts)} texts ({budget['truncated_share']:.1%}) exceed "
            f"--max-length {max_length} tokens (longest {budget['max_tokens']}): pretraining sees only their first "
            f"{max_length}; {max_length_advice(max_length, longest)}choose fewer text.columns")
    return budget


def masked_lm_to_train(config: RunConfig, settings: PretrainConfig, corpus: Corpus):
    """(model, its config.json values, tokenizer): from scratch, sized as ``kbert run`` sizes it with a
    vocabulary trained on the corpus; else the pretrained encoder with its MLM head and tokenizer."""
    if not trains_from_scratch(settings.encoder):
        return load_masked_lm(settings.encoder, max_length=config.train.max_length)
    cache_dir = Path(config.out_dir) / config.competition.name / "cache"
    tokenizer, _ = load_or_train_tokenizer(corpus.train_texts, config.model.vocab_size, cache_dir)
    config = replace(config, model=replace(config.model, encoder=settings.encoder))
    model, model_config = build_masked_lm(scratch_encoder_config(config, tokenizer.get_vocab_size()))
    return model, model_config, tokenizer


def held_out_batches(data: Encoded, masking: Masking, settings: PretrainConfig, bucket: int, size: int = 128
                     ) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Held-out batches masked once, with their own seed: every evaluation scores the same positions."""
    rng = np.random.default_rng([settings.seed, 1])
    batches = []
    for start in range(0, len(data.ids), size):
        ids, words, attention = padded_batch(data, np.arange(start, min(start + size, len(data.ids))),
                                             masking.pad_id, bucket)
        inputs, labels = masking.apply(ids, words, rng)
        batches.append((inputs, attention, labels))
    return batches


def train_masked_lm(model: nn.Module, corpus: MaskedLMData, settings: PretrainConfig, train_config: TrainConfig, *,
                    progress: bool, log) -> list[dict]:
    """``settings.steps`` optimizer steps over freshly masked batches; the held-out record every
    ``eval_every`` steps and at the end."""
    data, eval_batches, masking = corpus.train, corpus.held_out, corpus.masking
    optimizer = make_optimizer(model, train_config, settings.steps)
    step = make_train_step(model, optimizer, train_config.max_grad_norm,
                           execution=Execution(train_config.compile, streams=cpu_streams(train_config.cpu_streams)),
                           loss=masked_lm_loss,
                           weight=lambda labels: (labels >= 0).sum())  # the loss is a mean over predicted tokens
    rng = np.random.default_rng(settings.seed)
    order = rng.permutation(len(data.ids))
    position, running, history = 0, [], []
    bar = tqdm(range(1, settings.steps + 1), desc="pretrain", unit="step", disable=not progress, leave=False)
    for number in bar:
        if position + settings.batch_size > len(order):
            order, position = rng.permutation(len(data.ids)), 0
        index = order[position : position + settings.batch_size]
        position += settings.batch_size
        ids, words, attention = padded_batch(data, index, masking.pad_id, train_config.length_bucket)
        inputs, labels = masking.apply(ids, words, rng)
        loss = step(mx.array(inputs), mx.array(attention), mx.array(labels))
        mx.eval(loss, model.parameters(), optimizer.state)
        running.append(loss.item())
        if not math.isfinite(running[-1]):
            raise KbertError(f"pretraining: the training loss became {running[-1]} at step {number}; lower --lr")
        if number % settings.eval_every == 0 or number == settings.steps:
            record = {"step": number, "train_loss": float(np.mean(running)), **evaluate_masked_lm(model, eval_batches)}
            history.append(record)
            running = []
            bar.set_postfix(loss=f"{record['train_loss']:.3f}", acc=f"{record['masked_accuracy']:.3f}")
            if not progress:
                log(f"step {number}: train loss {record['train_loss']:.3f}, held-out masked accuracy "
                    f"{record['masked_accuracy']:.3f}, perplexity {record['perplexity']:.2f}")
    bar.close()
    return history


def write_pretrained(job: Pretraining, model: nn.Module, model_config: dict, tokenizer: Tokenizer,
                     history: list[dict], learning_rate: float, tokens: dict) -> Path:
    """The encoder + MLM head folder, written to a temp folder and renamed when complete."""
    config, settings, corpus, folder = job.config, job.settings, job.corpus, job.folder
    comp = config.competition
    if folder.exists():  # made by another process since ``pretrain_folder`` checked
        raise KbertError(f"pretrain folder already exists: {folder}; pick another --run-id")
    tmp = folder.with_name(f".{folder.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tokenizer.no_truncation()  # saved as trained: kbert run sets its own truncation
    save_masked_lm(model, model_config, tokenizer, tmp)
    final = history[-1]
    write_json(tmp / "pretrain.json", {
        "competition": comp.name, "settings": asdict(settings), "from_scratch": trains_from_scratch(settings.encoder),
        "learning_rate": learning_rate,
        "max_length": config.train.max_length, "tokens": tokens, "vocab_size": tokenizer.get_vocab_size(),
        "rows": corpus.rows,
        "train_texts": len(corpus.train_texts), "held_out_rows": len(corpus.eval_texts),
        "masked_accuracy": final["masked_accuracy"], "perplexity": final["perplexity"],
        "masked_accuracy_at_start": history[0]["masked_accuracy"], "history": history,
        "wall_time_s": round(time.perf_counter() - job.started, 2),
    })
    tmp.rename(folder)
    return folder
