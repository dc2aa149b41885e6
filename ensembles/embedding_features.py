"""Encoder embeddings as features of a tabular baseline (``kbert baseline --embeddings SOURCE``).

SOURCE is a finished kbert run on the same folds (fold k's baseline reads fold k's model, so no validation row is
embedded by a model that trained on it) or a pretrained encoder (mean-pooled, the same for every fold). Per fold a
PCA of at most ``COMPONENTS`` components, fitted on the training rows' vectors only, gives ``emb_0..`` columns.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pandas as pd
from sklearn.decomposition import PCA

from kbert.errors import KbertError
from kbert.io import atomic_write, file_sha256, write_json
from kbert.models.encoders import load_encoder, max_tokens, trains_from_scratch
from kbert.models.pooling import Pooler
from kbert.models.tokenizer import special_token_id
from kbert.pipeline.artifacts import is_the_run
from kbert.pipeline.config import RunConfig, read_yaml, run_config_from_file
from kbert.pipeline.embed import pooled_vectors
from kbert.pipeline.fold import make_serializer, tokenize
from kbert.pipeline.new_rows import check_fold_models, load_fold_model, refitted
from kbert.pipeline.provenance import Expected, check_member

COMPONENTS = 32  # PCA components kept per fold: enough for the text signal, few enough for trees on 1-10k rows
PREFIX = "emb_"
REDUCER_FILE = "embedding_reducer.json"  # its statistics, to read
REDUCER_MODEL = "embedding_reducer.skops"  # the fitted PCA itself, to apply
BATCH_SIZE = 64


@dataclass
class EmbeddingSource:
    """Where fold k's embeddings come from: a run's fine-tuned fold models (``fold_dirs``) or one pretrained
    ``encoder``. ``cache`` maps token ids to the fixed encoder's vectors (unused with fold models)."""

    spec: str  # as the user gave it
    name: str  # the run's folder name or the encoder's name, as the default run id shows it
    run_dir: Path | None = None
    run_config: RunConfig | None = None  # the source run's: its serializer and tokenization
    fold_dirs: list[Path] = field(default_factory=list)
    encoder: nn.Module | None = None
    tokenizer: object = None
    max_length: int = 0
    cache: dict[bytes, np.ndarray] = field(default_factory=dict)

    def describe(self) -> dict:
        """What config.yaml records."""
        if self.run_dir is not None:  # (its metrics.json's sha256: which run, for predict and package to check)
            return {"source": self.spec, "kind": "fine-tuned run", "run_dir": str(self.run_dir),
                    "pooling": self.run_config.model.pooling, "components": COMPONENTS,
                    "metrics_sha256": file_sha256(self.run_dir / "metrics.json")}
        return {"source": self.spec, "kind": "pretrained encoder", "pooling": "mean, L2-normalised",
                "max_length": self.max_length, "components": COMPONENTS}


def source_name(spec: str) -> str:
    """The plain name the default run id uses: a folder's last part, anything but letters, digits, '.', '_', '-'
    replaced ("runs/titanic/fusion-none" -> "fusion-none", "org/model@rev" -> "model-rev")."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", Path(spec).name or spec).strip(".-")
    return name or "source"


def run_folder(spec: str, comp_dir: Path) -> Path | None:
    """The run folder ``spec`` names (a folder path, or a run id under ``<out>/<competition>/``); None if neither."""
    for path in (Path(spec), comp_dir / spec):
        if (path / "config.yaml").is_file():
            return path
    return None


def open_embedding_source(spec: str, config: RunConfig, comp_dir: Path, expected: Expected,
                          fold_of_row: np.ndarray, with_test: bool = True, made_with: dict | None = None
                          ) -> EmbeddingSource:
    """The checked source, before the baseline writes anything: a run must be a finished kbert run made for this
    competition and these data files (pipeline/provenance.py; without ``with_test``, predicting new rows, its
    training file only), on these folds, with every fold model; an encoder must load. ``made_with``: what the
    baseline's config.yaml recorded of its source, which a run must still be (``check_source_run``)."""
    run_dir = run_folder(spec, comp_dir)
    if run_dir is not None:
        check_source_run(run_dir, made_with or {})
        return open_run_source(spec, run_dir, config, expected, fold_of_row, with_test)
    if trains_from_scratch(spec):
        raise KbertError(f"--embeddings {spec}: a from-scratch encoder has no trained weights; pass a finished run "
                         "(its folder, or its id under --out) or a pretrained encoder such as minilm-l6")
    try:
        encoder, encoder_config, tokenizer = load_encoder(spec)
    except KbertError as exc:
        raise KbertError(f"--embeddings {spec}: not a finished run (no {comp_dir / spec}/config.yaml), and {exc}") \
            from None
    limit = max_tokens(encoder_config.to_dict())
    max_length = min(config.train.max_length, limit) if limit is not None else config.train.max_length
    return EmbeddingSource(spec=spec, name=source_name(spec), encoder=encoder, tokenizer=tokenizer,
                           max_length=max_length)


def check_source_run(run_dir: Path, made_with: dict) -> None:
    """The source run is the one the baseline was made with: its metrics.json (which seals its predictions) has the
    sha256 the baseline recorded. A run trained again under its name fed its new embeddings to PCA and models
    fitted on the old ones (every row predicted 1.0). A baseline of an older kbert recorded none."""
    if not is_the_run(run_dir, made_with.get("metrics_sha256")):
        raise KbertError(f"{run_dir}: not the run this embedding baseline was made with (its metrics.json changed "
                         "since: trained again, or replaced); put that run back, or train the baseline again")


def open_run_source(spec: str, run_dir: Path, config: RunConfig, expected: Expected,
                    fold_of_row: np.ndarray, with_test: bool = True) -> EmbeddingSource:
    comp = config.competition
    saved = read_yaml(run_dir / "config.yaml")
    if isinstance(saved, dict) and "baseline" in saved:
        raise KbertError(f"--embeddings {run_dir}: a baseline has no fold models to embed with; pass a kbert run")
    if not (run_dir / "metrics.json").is_file():
        raise KbertError(f"--embeddings {run_dir}: an unfinished run (no metrics.json); finish it first")
    checked = check_member(run_dir, expected, f"--embeddings {spec}", with_test)
    if not np.array_equal(checked.folds, np.asarray(fold_of_row)):
        raise KbertError(f"--embeddings: the source run's folds ({run_dir / 'folds.csv'}) differ from this "
                         f"baseline's ({comp.folds.k} folds of {len(fold_of_row)} rows, fold seed {comp.folds.seed}, "
                         f"under {Path(config.out_dir) / comp.name / 'folds'}); fold k's model would have trained on "
                         "fold k's validation rows: give the baseline the run's --folds and --limit-rows, or use a "
                         "run on these folds")
    source_config = run_config_from_file(run_dir / "config.yaml")
    fold_dirs = [fold_dir for fold_dir, repeat, _ in check_fold_models(run_dir, source_config) if repeat == 0]
    return EmbeddingSource(spec=spec, name=source_name(run_dir.name), run_dir=run_dir, run_config=source_config,
                           fold_dirs=fold_dirs)


def cached_vectors(cache: dict[bytes, np.ndarray], tokens: list[np.ndarray],
                   embed: Callable[[list[np.ndarray]], np.ndarray]) -> np.ndarray:
    """Vectors of ``tokens`` in order, each distinct token sequence embedded once (``embed`` gets the missing ones)."""
    keys = [t.astype(np.int32).tobytes() for t in tokens]
    missing = list(dict.fromkeys(key for key in keys if key not in cache))
    if missing:
        cache.update(zip(missing, embed([np.frombuffer(key, dtype=np.int32) for key in missing])))
    return np.stack([cache[key] for key in keys])


def fold_embeddings(source: EmbeddingSource, config: RunConfig, k: int, train_rows: pd.DataFrame,
                    others: list[pd.DataFrame], with_training: bool = True) -> list[np.ndarray]:
    """Raw vectors of the fold's training rows (unless ``with_training`` is false: new rows to predict need only
    the serializer they fit), then of each frame in ``others``; the training rows first, in a call of their own."""
    if source.run_dir is not None:  # fold k's fine-tuned model, its serializer and tokenizer as the run used them
        fold_dir, run_config = source.fold_dirs[k], source.run_config
        serializer = refitted(make_serializer(run_config), train_rows, fold_dir / "serializer.json")
        model, _, tokenizer = load_fold_model(fold_dir)
        encoder, pooler, normalize, cache = model.encoder, model.pooler, False, {}
    else:  # the fixed encoder on the competition's text, serialized as this fold's training rows fit it
        run_config = replace(config, train=replace(config.train, max_length=source.max_length))
        serializer = make_serializer(run_config).fit(train_rows)
        tokenizer, encoder, normalize, cache = source.tokenizer, source.encoder, True, source.cache
        pooler = Pooler("mean", encoder.hidden_size)
    pad_id = special_token_id(tokenizer, "pad") or 0

    def vectors(ids: mx.array, mask: mx.array) -> mx.array:
        out = encoder(ids, mask, output_hidden_states=pooler.uses_layers)
        return pooler(out.last_hidden_state, mask, out.hidden_states)

    def embed(tokens: list[np.ndarray]) -> np.ndarray:
        encoder.eval()
        return pooled_vectors(vectors, tokens, pad_id, normalize, BATCH_SIZE)

    train_vectors = (cached_vectors(cache, tokenize(run_config, tokenizer, serializer, train_rows, fold=(0, k)), embed)
                     if with_training else None)
    other_tokens = [tokenize(run_config, tokenizer, serializer, rows, fold=(0, k)) for rows in others]
    together = cached_vectors(cache, [t for tokens in other_tokens for t in tokens], embed)
    bounds = np.cumsum([0] + [len(tokens) for tokens in other_tokens])
    mx.clear_cache()
    return [train_vectors, *(together[start:end] for start, end in zip(bounds[:-1], bounds[1:]))]


def fit_reducer(train_vectors: np.ndarray, seed: int) -> PCA:
    """A PCA of at most ``COMPONENTS`` components, fitted on the fold's training rows' vectors only (the full SVD:
    the same rows give the same components)."""
    components = min(COMPONENTS, train_vectors.shape[0], train_vectors.shape[1])
    return PCA(n_components=components, svd_solver="full", random_state=seed).fit(train_vectors)


def reducer_statistics(reducer: PCA, source: EmbeddingSource) -> dict:
    """The fitted reducer as saved in ``folds/<k>/embedding_reducer.json``: enough to apply it again."""
    return {"source": source.spec, "rows": int(reducer.n_samples_), "width": int(reducer.n_features_in_),
            "mean": reducer.mean_.tolist(), "components": reducer.components_.tolist(),
            "explained_variance_ratio": reducer.explained_variance_ratio_.tolist()}


def with_embeddings(source: EmbeddingSource, config: RunConfig, k: int, frames: list[pd.DataFrame], fold_dir: Path,
                    log=print) -> list[pd.DataFrame]:
    """Each of ``frames`` (fold ``k``'s training rows, then the rows it predicts) with the columns ``emb_0..``
    appended: the fold's embeddings, reduced by a PCA fitted on the training rows alone and saved in ``fold_dir``."""
    train_rows, others = frames[0], frames[1:]
    taken = [c for c in train_rows.columns if str(c).startswith(PREFIX)]
    if taken:
        raise KbertError(f"--embeddings: the features already hold column(s) {', '.join(map(str, taken[:3]))}; "
                         f"the embedding columns are named {PREFIX}0, {PREFIX}1, ...")
    vectors = fold_embeddings(source, config, k, train_rows, others)
    reducer = fit_reducer(vectors[0], config.seed + k)
    import skops.io as sio  # here: it imports torch where installed

    atomic_write(fold_dir / REDUCER_MODEL, lambda tmp: sio.dump(reducer, tmp))  # kbert predict applies it
    write_json(fold_dir / REDUCER_FILE, reducer_statistics(reducer, source))
    log(f"fold {k + 1}/{config.competition.folds.k}: {vectors[0].shape[1]}-d embeddings from {source.name}, "
        f"{reducer.n_components_} components ({reducer.explained_variance_ratio_.sum():.1%} of the variance)")
    return [with_components(rows, reducer, table) for rows, table in zip([train_rows, *others], vectors)]


def with_components(rows: pd.DataFrame, reducer: PCA, vectors: np.ndarray) -> pd.DataFrame:
    """``rows`` with the columns ``emb_0..``: ``vectors`` reduced."""
    columns = [f"{PREFIX}{i}" for i in range(reducer.n_components_)]
    return pd.concat([rows, pd.DataFrame(reducer.transform(vectors), index=rows.index, columns=columns)], axis=1)


def new_rows_with_embeddings(source: EmbeddingSource, config: RunConfig, k: int, train_rows: pd.DataFrame,
                             rows: pd.DataFrame, fold_dir: Path) -> pd.DataFrame:
    """New ``rows`` with fold ``k``'s embedding columns, as the baseline's fold made them: the source's vectors
    (its serializer refitted on the fold's training rows), reduced by the PCA the fold saved."""
    from kbert.ensembles.baseline_models import load_skops

    path = fold_dir / REDUCER_MODEL
    if not path.is_file():
        raise KbertError(f"{path}: missing; the fold's embedding reducer (a baseline made before kbert saved it: "
                         "run kbert baseline again to predict new rows with it)")
    reducer = load_skops(path)
    vectors = fold_embeddings(source, config, k, train_rows, [rows], with_training=False)[1]
    return with_components(rows, reducer, vectors)
