"""Tabular baselines as ensemble members: gradient-boosted trees or a linear model on the competition's raw columns
plus its engineered features, trained on ``kbert run``'s folds and written in the same run-artifact format.

Models: ``hgb`` (the default), ``logreg``, and ``lgbm`` and ``catboost`` where installed. Every transform (category
codes, target means, TF-IDF, scaling, imputation) is part of a scikit-learn pipeline fitted on the fold's training
rows only; ``--embeddings`` adds an encoder's reduced text embeddings (ensembles/embedding_features.py).
"""

from __future__ import annotations

import inspect
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
from sklearn.base import BaseEstimator, RegressorMixin, TransformerMixin, clone
from sklearn.compose import ColumnTransformer
from sklearn.decomposition import TruncatedSVD
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.impute import SimpleImputer
from sklearn.linear_model import LassoCV, LogisticRegression
from sklearn.model_selection import KFold, StratifiedKFold
from sklearn.pipeline import make_pipeline as chain
from sklearn.preprocessing import OneHotEncoder, OrdinalEncoder, StandardScaler, TargetEncoder

from kbert.ensembles.embedding_features import open_embedding_source, source_name, with_embeddings
from kbert.errors import KbertError
from kbert.io import make_folder, removed_on_refusal, write_csv, write_json, written_together
from kbert.pipeline.artifacts import (RunResult, check_run_outputs, config_fingerprint, fold_files_sha256,
                                      input_fingerprint, lock_message, lock_run_folder, score_summary, sealed,
                                      write_folds_table, write_predictions, write_run_config)
from kbert.pipeline.config import RunConfig
from kbert.pipeline.data import data_warnings, input_rows, load_competition_data
from kbert.pipeline.fold import fold_warnings, split_folds
from kbert.pipeline.splits import fold_rows
from kbert.pipeline.metrics import check_metric_fits, get_metric
from kbert.pipeline.predictions import average_folds, metric_targets, native, predictions_frame, score
from kbert.pipeline.provenance import Expected
from kbert.pipeline.submission import check_submittable, write_predictions_submission
from kbert.pipeline.targets import encode_targets, raw_targets
from kbert.tasks import Task

MODELS = ("hgb", "logreg", "lgbm", "catboost")
TEXT_MIN_WORDS = 3.0  # a string column whose training values average more words than this is free text
TREE_TEXT_MIN_WORDS = 5.0  # ...and trees use it only when it averages more words than this
MAX_CATEGORIES = 64  # categorical columns with more distinct values are target-encoded
IDENTIFIER_SHARE = 0.95  # ...unless this share of their values is distinct: names, ids; dropped as identifiers
SKEW_TO_LOG = 0.75  # non-negative numeric columns more skewed than this (on the training rows) get log1p
OUTLIER_Z = 3.5  # Iglewicz and Hoaglin's cut-off for a residual's modified z-score, 0.6745 (r - median) / MAD
HOLDOUT = 0.15  # the hgb trees' early-stopping holdout: its share of a fold's training rows


class SkewedLog1p(TransformerMixin, BaseEstimator):
    """log1p of the non-negative columns whose skewness on the fitting rows exceeds ``SKEW_TO_LOG``."""

    def fit(self, X, y=None):
        from scipy.stats import skew

        X = np.asarray(X, dtype=np.float64)
        self.columns_ = [j for j in range(X.shape[1])
                         if np.nanmin(X[:, j]) >= 0 and abs(skew(X[:, j], nan_policy="omit")) > SKEW_TO_LOG]
        return self

    def transform(self, X):
        X = np.array(X, dtype=np.float64)
        X[:, self.columns_] = np.log1p(np.clip(X[:, self.columns_], 0, None))  # an unseen negative value -> 0
        return X


class TrimmedRegressor(RegressorMixin, BaseEstimator):
    """Fit, drop the training rows whose residual's modified z-score exceeds ``OUTLIER_Z``, fit again.

    A linear model's few extreme training rows (House Prices' two huge, cheap houses) pull every prediction;
    trees do not need this. Only the fitting rows are looked at, so nothing leaks from the scored rows."""

    def __init__(self, estimator=None):
        self.estimator = estimator

    def fit(self, X, y):
        first = clone(self.estimator).fit(X, y)
        residuals = y - first.predict(X)
        deviation = np.abs(residuals - np.median(residuals))
        mad = np.median(deviation)
        keep = 0.6745 * deviation <= OUTLIER_Z * mad if mad > 0 else np.ones(len(y), dtype=bool)
        self.dropped_ = int((~keep).sum())
        self.estimator_ = clone(self.estimator).fit(X[keep], y[keep]) if self.dropped_ else first
        return self

    def predict(self, X):
        return self.estimator_.predict(X)


@dataclass
class ColumnKinds:
    numeric: list[str]
    categorical: list[str]
    text: list[str]
    identifiers: list[str]  # not used: one distinct value per row names a row, it says nothing about it


def column_kinds(rows: pd.DataFrame, exclude: tuple[str, ...]) -> ColumnKinds:
    """Numbers, categories, free text and identifiers, decided from the (training) rows given; a column missing on
    every one of them is none of these, and left out."""
    numeric, categorical, text, identifiers = [], [], [], []
    for column in rows.columns:
        if column in exclude:
            continue
        values = rows[column]
        if values.isna().all():  # missing on every training row: nothing to read (the trees' binning failed on it)
            continue
        if pd.api.types.is_bool_dtype(values) or pd.api.types.is_numeric_dtype(values):
            numeric.append(column)
            continue
        present = values.dropna().astype(str)
        distinct = present.nunique()
        if present.str.split().str.len().mean() > TEXT_MIN_WORDS:
            text.append(column)
        elif distinct > MAX_CATEGORIES and distinct >= IDENTIFIER_SHARE * len(present):
            # Spaceship's passenger names: target means of values seen once are noise.
            identifiers.append(column)
        else:
            categorical.append(column)
    return ColumnKinds(numeric, categorical, text, identifiers)


def prepare(rows: pd.DataFrame, kinds: ColumnKinds) -> pd.DataFrame:
    """Numbers as float (booleans 0/1), categories as strings with NaN kept, text with NaN as ''."""
    out = {column: pd.to_numeric(rows[column].astype("float64"), errors="raise") for column in kinds.numeric}
    for column in kinds.categorical:
        values = rows[column]
        out[column] = values.where(values.isna(), values.astype(str)).astype(object)
    for column in kinds.text:
        out[column] = rows[column].fillna("").astype(str)
    return pd.DataFrame(out, index=rows.index)  # at once: one column at a time fragments a wide frame


def missing_as_category() -> SimpleImputer:
    """Missing category values become the category "missing"."""
    return SimpleImputer(strategy="constant", fill_value="missing")


def target_encoder(classify: bool, seed: int):
    """scikit-learn's TargetEncoder: each training row is encoded by a model of the other 4/5 of the training
    rows (cross-fitting), the rows it predicts by all of them; a seeded split, so runs repeat."""
    if inspect.signature(TargetEncoder).parameters["random_state"].default == "deprecated":  # scikit-learn >= 1.9
        splitter = StratifiedKFold if classify else KFold
        encoder = TargetEncoder(cv=splitter(5, shuffle=True, random_state=seed))
    else:
        encoder = TargetEncoder(shuffle=True, random_state=seed)
    return chain(missing_as_category(), encoder)


def kept_words(texts: pd.Series) -> int:
    """How many words a TF-IDF keeps from ``texts`` (those in two rows or more): the trees' SVD needs more than its
    32 components (a column of words each seen once, such as part codes, kept too few and stopped the fit); the
    linear model's TF-IDF none ('After pruning, no terms remain' on a tiny fold)."""
    from sklearn.feature_extraction.text import CountVectorizer

    try:
        return len(CountVectorizer(min_df=2).fit(texts).vocabulary_)
    except ValueError:  # no word in two rows
        return 0


def make_pipeline(model: str, kinds: ColumnKinds, classify: bool, seed: int, train_rows: pd.DataFrame):
    """The scikit-learn pipeline for ``model``; unfitted."""
    # Categories with more distinct training values than MAX_CATEGORIES (ticket numbers, cabins) are mostly
    # one-offs that codes or one-hot columns cannot use: they become cross-fitted target means instead.
    many = [c for c in kinds.categorical if train_rows[c].nunique() > MAX_CATEGORIES]
    few = [c for c in kinds.categorical if c not in many]
    if model == "logreg":
        # Sizes, prices and spending are skewed: their logs are what a linear model can use.
        parts = [("numeric", chain(SimpleImputer(strategy="median", add_indicator=True), SkewedLog1p(),
                                   StandardScaler()), kinds.numeric),
                 ("categorical", chain(missing_as_category(),
                                       OneHotEncoder(handle_unknown="infrequent_if_exist", min_frequency=3)), few)]
        if many:
            parts.append(("target-encoded", chain(target_encoder(classify, seed), StandardScaler()), many))
        parts += [(f"text:{c}", TfidfVectorizer(ngram_range=(1, 2), min_df=2, sublinear_tf=True), c)
                  for c in kinds.text if kept_words(train_rows[c].fillna("").astype(str))]  # (none: no word to read)
        if classify:
            estimator = LogisticRegression(C=1.0, max_iter=3000)
        else:  # the lasso's penalty is picked by a 5-fold CV on the fold's training rows
            estimator = TrimmedRegressor(LassoCV(alphas=np.logspace(-4.5, -1, 15), cv=5, max_iter=20000))
        # Dense without text: the lasso's coordinate descent is faster on a dense matrix.
        return chain(ColumnTransformer(parts, sparse_threshold=0.3 if kinds.text else 0.0), estimator)

    # Trees: numbers as they are, categories as integer codes (or target means), text as TF-IDF SVD components.
    parts = [("numeric", "passthrough", kinds.numeric),
             ("categorical", OrdinalEncoder(handle_unknown="use_encoded_value", unknown_value=np.nan,
                                            encoded_missing_value=np.nan), few)]
    if many:
        parts.append(("target-encoded", target_encoder(classify, seed), many))
    text_components = 0
    for c in kinds.text:
        # Short strings (passenger names) as SVD components are noise to trees (benchmarks/NOTES.md); the linear
        # model still reads their words.
        words = train_rows[c].fillna("").astype(str)
        if words.str.split().str.len().mean() > TREE_TEXT_MIN_WORDS and kept_words(words) > 64:
            parts.append((f"text:{c}", chain(TfidfVectorizer(min_df=2, sublinear_tf=True, max_features=5000),
                                             TruncatedSVD(n_components=32, random_state=seed)), c))
            text_components += 32
    categorical_columns = list(range(len(kinds.numeric), len(kinds.numeric) + len(few)))
    transformer = ColumnTransformer(parts, sparse_threshold=0.0)
    if model == "hgb":
        from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor

        options = dict(learning_rate=0.05, max_iter=500, max_leaf_nodes=15, min_samples_leaf=20, l2_regularization=1.0,
                       early_stopping=True, validation_fraction=HOLDOUT, n_iter_no_change=30,
                       categorical_features=categorical_columns or None, random_state=seed)
        estimator = HistGradientBoostingClassifier(**options) if classify else HistGradientBoostingRegressor(**options)
    elif model == "lgbm":
        try:
            import lightgbm
        except ImportError:
            raise KbertError("--model lgbm needs LightGBM: pip install lightgbm (or kbert[baselines])") from None
        options = dict(n_estimators=400, learning_rate=0.03, num_leaves=15, min_child_samples=20, subsample=0.8,
                       subsample_freq=1, colsample_bytree=0.8, reg_lambda=1.0, random_state=seed, verbose=-1)
        estimator = lightgbm.LGBMClassifier(**options) if classify else lightgbm.LGBMRegressor(**options)
    elif model == "catboost":
        try:
            import catboost
        except ImportError:
            raise KbertError("--model catboost needs CatBoost: pip install catboost (or kbert[baselines])") from None
        # CatBoost encodes categories itself (ordered target statistics on the training rows): pass strings.
        transformer = ColumnTransformer([p for p in parts if p[0] not in ("categorical", "target-encoded")] +
                                        [("categorical", missing_as_category(),
                                          kinds.categorical)], sparse_threshold=0.0)
        first_categorical = len(kinds.numeric) + text_components
        options = dict(iterations=800, learning_rate=0.05, depth=6, random_seed=seed, verbose=0, thread_count=-1,
                       allow_writing_files=False,  # else CatBoost writes catboost_info/ into the working folder
                       cat_features=list(range(first_categorical, first_categorical + len(kinds.categorical))))
        estimator = catboost.CatBoostClassifier(**options) if classify else catboost.CatBoostRegressor(**options)
    else:
        raise KbertError(f"unknown baseline model '{model}'; known: {', '.join(MODELS)}")
    return chain(transformer, estimator)


@dataclass(frozen=True)
class Baseline:
    """What every fold of a baseline fits: the model (``MODELS``), the task, its number of classes (0 without),
    whether a numeric target is learnt as log1p, and the columns never read (the id)."""

    model: str
    task: str
    classes: int = 0
    log_target: bool = False
    exclude: tuple[str, ...] = ()


@dataclass
class FittedFold:
    """A fold's fitted baseline: the column kinds it read (decided on its training rows), one fitted pipeline per
    output (one for a class task; a label whose training rows held one class: that class, an int), and the classes
    its training rows held (a class task; the others get probability 0)."""

    kinds: ColumnKinds
    models: list
    found: list[int] | None = None


def classifier(model: str, kinds: ColumnKinds, seed: int, X: pd.DataFrame, y: np.ndarray):
    """``model``'s classifier fitted on X, y. Where the trees' stratified early-stopping split cannot hold every
    class on both sides (a class of one row; a holdout of fewer rows than classes, on a tiny table), they train
    their full rounds instead."""
    pipeline = make_pipeline(model, kinds, True, seed, X)
    counts = np.unique(y, return_counts=True)[1]
    if model == "hgb" and (counts.min() < 2 or math.ceil(HOLDOUT * len(y)) < len(counts)):
        pipeline[-1].set_params(early_stopping=False)
    return pipeline.fit(X, y)


def fit_fold(baseline: Baseline, train_rows: pd.DataFrame, train_targets: np.ndarray, seed: int) -> FittedFold:
    """Fit on ``train_rows`` alone: a class task one pipeline, otherwise one per output column (with
    ``log_target`` the model learns log1p(y))."""
    kinds = column_kinds(train_rows, baseline.exclude)
    X = prepare(train_rows, kinds)
    if Task(baseline.task).classes:
        pipeline = classifier(baseline.model, kinds, seed, X, train_targets.astype(int))
        return FittedFold(kinds, [pipeline], pipeline.classes_.astype(int).tolist())
    targets = np.asarray(train_targets, dtype=np.float64).reshape(len(train_targets), -1)
    models = []
    for j in range(targets.shape[1]):
        if Task(baseline.task).probabilities:
            y = targets[:, j].astype(int)
            single = len(np.unique(y)) < 2  # (fold_warnings said so): that class, as an encoder run predicts it
            models.append(int(y[0]) if single else classifier(baseline.model, kinds, seed, X, y))
        else:
            y = np.log1p(targets[:, j]) if baseline.log_target else targets[:, j]
            models.append(make_pipeline(baseline.model, kinds, False, seed, X).fit(X, y))
    return FittedFold(kinds, models)


def predict_fold(baseline: Baseline, fitted: FittedFold, frames: list[pd.DataFrame]) -> list[np.ndarray]:
    """Prediction tables (rows, columns) of each frame as in ensembles/blend.py (binary P(positive), class
    probabilities, label probabilities or values)."""
    tables = []
    for rows in frames:
        X = prepare(rows, fitted.kinds)
        if Task(baseline.task).classes:
            table = np.zeros((len(X), baseline.classes))
            table[:, fitted.found] = fitted.models[0].predict_proba(X)
        elif Task(baseline.task).probabilities:
            table = np.stack([np.full(len(X), float(model)) if isinstance(model, int) else model.predict_proba(X)[:, 1]
                              for model in fitted.models], axis=1)
        else:
            inverse = np.expm1 if baseline.log_target else np.asarray
            table = np.stack([inverse(model.predict(X)) for model in fitted.models], axis=1)
        tables.append(table)
    return tables


def fit_predict_fold(baseline: Baseline, train_rows: pd.DataFrame, train_targets: np.ndarray,
                     others: list[pd.DataFrame], seed: int) -> list[np.ndarray]:
    """Fit on ``train_rows`` alone, then predict each frame in ``others``."""
    return predict_fold(baseline, fit_fold(baseline, train_rows, train_targets, seed), others)


def run_baseline(config: RunConfig, model: str = "hgb", run_id: str | None = None, log=print,
                 embeddings: str | None = None, on_fold: Callable[[int, float], None] | None = None) -> RunResult:
    """Train ``model`` on the competition's folds; write a member in the run-artifact format. ``embeddings``: a
    finished run on the same folds, or a pretrained encoder, whose text embeddings join the raw columns.
    ``on_fold(k, seconds)`` is called after each fold's fit; it may raise to stop the baseline (kbert auto)."""
    from kbert.ensembles.baseline_models import save_fold_models  # it reads this module's types

    if model not in MODELS:
        raise KbertError(f"unknown baseline model '{model}'; known: {', '.join(MODELS)}")
    started = time.perf_counter()
    if config.competition.folds.repeats > 1:  # what its config.yaml records is what it did
        log(f"note: a baseline trains one split of the folds; folds.repeats {config.competition.folds.repeats} is "
            "for kbert run")
        config = replace(config, competition=replace(config.competition,
                                                     folds=replace(config.competition.folds, repeats=1)))
    comp = config.competition
    task = comp.task
    metric = get_metric(comp.metric)
    check_metric_fits(metric, task, comp.value_columns)
    data = load_competition_data(comp, config.data_dir or None)
    train = data.train if config.limit_rows is None else data.train.iloc[: config.limit_rows].reset_index(drop=True)
    features, test_features = input_rows(comp, train, data.test)
    targets = encode_targets(train, comp)
    raw = raw_targets(train, comp)
    fit_targets = raw if raw is not None else targets.values
    truth = metric_targets(task, targets.values, raw, metric.kind, targets.classes)
    log_target = Task(task).numeric and (metric.name in ("rmse_log", "rmsle") or
                                                           config.head.target_transform.startswith("log1p"))
    tag = f"-emb-{source_name(embeddings)}" if embeddings else ""
    run_id = run_id or f"baseline-{model}{tag}-seed{config.seed}"
    comp_dir = Path(config.out_dir) / comp.name
    run_dir = comp_dir / run_id
    if run_dir.exists() and not (run_dir / "metrics.json").is_file():  # stopped (Ctrl-C, killed) before its end
        raise KbertError(f"{run_dir}: an unfinished baseline (no metrics.json); a baseline is not resumed: delete the "
                         "folder to train it again, or pick another --run-id")
    if run_dir.exists():
        raise KbertError(f"run folder already exists: {run_dir}; pick another --run-id")
    submission_path = Path(config.submissions_dir) / comp.name / f"{run_id}.csv"
    check_run_outputs(config, run_dir, submission_path)
    warnings = data_warnings(train, data.test, comp)
    with removed_on_refusal():  # a refusal at any stage leaves nothing behind (a baseline is never resumed)
        fold_of_row = split_folds(config, train, targets, comp_dir)[0]
        rows = [fold_rows(fold_of_row, k, comp.folds) for k in range(comp.folds.k)]
        warnings += fold_warnings(comp, targets, [(f"fold {k + 1}/{comp.folds.k}", rows[k][0])
                                                  for k in range(comp.folds.k)])
        expected = Expected(comp, input_fingerprint(comp, data.data_dir), train[comp.id_column],
                            data.test[comp.id_column], truth, targets.classes)
        check_submittable(expected, data.sample_submission, submission_path)
        source = None if not embeddings else open_embedding_source(embeddings, config, comp_dir, expected,
                                                                   fold_of_row)
        try:
            make_folder(run_dir)
        except FileExistsError:  # another process made it after the check above
            raise KbertError(lock_message(run_dir)) from None
        with lock_run_folder(run_dir):
            write_run_config(run_dir, {"run_id": run_id, "baseline": model, "competition": comp.name,
                                       "seed": config.seed, "folds": comp.folds.k, "data_dir": config.data_dir,
                                       "limit_rows": config.limit_rows, "log_target": log_target,
                                       "run_config": config.to_dict(),  # what kbert predict reads it with
                                       **({"embeddings": source.describe()} if source is not None else {})},
                             expected.inputs)
            write_folds_table(run_dir, comp, train[comp.id_column], [fold_of_row])
            for warning in warnings:
                log(f"warning: {warning}")
            identifiers = column_kinds(features, exclude=(comp.id_column,)).identifiers
            if identifiers:
                log(f"not used, a distinct value per row: {', '.join(identifiers)}")
            baseline = Baseline(model, task, len(targets.classes) if targets.classes is not None else 0, log_target,
                                exclude=(comp.id_column,))
            oof: np.ndarray | None = None
            test_tables, fold_scores, fold_records = [], [], []
            for k in range(comp.folds.k):
                fold_started = time.perf_counter()
                train_index, valid_index = rows[k]
                frames = [features.iloc[train_index], features.iloc[valid_index], test_features]
                if source is not None:
                    frames = with_embeddings(source, config, k, frames, run_dir / "folds" / str(k), log)
                try:
                    fitted = fit_fold(baseline, frames[0], fit_targets[train_index], config.seed + k)
                    valid_table, test_table = predict_fold(baseline, fitted, frames[1:])
                except ValueError as exc:  # scikit-learn's refusal of too few rows (its early-stopping split, ...)
                    raise KbertError(f"fold {k + 1}/{comp.folds.k}: the {model} baseline cannot be fitted on its "
                                     f"{len(train_index)} training rows: {exc}") from None
                if oof is None:
                    oof = np.full((len(train), valid_table.shape[1]), np.nan)  # time series: no first block
                oof[valid_index] = valid_table
                test_tables.append(test_table)
                save_fold_models(run_dir / "folds" / str(k), baseline, fitted)  # kbert predict reads them
                # Fold k's own test predictions: a teacher for --pseudo-label, which must not see the other folds'.
                write_csv(run_dir / "folds" / str(k) / "test.csv", predictions_frame(
                    comp, targets.classes, data.test[comp.id_column], native(task, test_table)))
                fold_score = score(metric, task, truth[valid_index], native(task, valid_table), 0.5, targets.classes)
                fold_scores.append(fold_score)
                fold_records.append({"fold": k, "repeat": 0, "score": fold_score, "n_train": len(train_index),
                                     "n_valid": len(valid_index),
                                     "seconds": round(time.perf_counter() - fold_started, 2)})
                log(f"fold {k + 1}/{comp.folds.k}: {comp.metric} {fold_score:.4f}")
                if on_fold is not None:
                    on_fold(k, fold_records[-1]["seconds"])
            oof_predictions, test_predictions = native(task, oof), native(task, average_folds(test_tables))
            covered = fold_of_row >= 0
            cv = score(metric, task, truth[covered], oof_predictions[covered], 0.5, targets.classes)
            seconds = time.perf_counter() - started
            with written_together():  # the predictions, the submission and metrics.json appear together, or none
                predictions_sha256 = write_predictions(run_dir, expected, oof_predictions, test_predictions)
                submission_path = write_predictions_submission(expected, test_predictions, 0.5,
                                                               data.sample_submission, submission_path)
                write_json(run_dir / "metrics.json", sealed({
                    **score_summary(run_id, comp, metric, cv, 0.5, fold_records), "baseline": model,
                    "wall_time_s": round(seconds, 2), "submission": str(submission_path),
                    "inputs": expected.inputs, "config_sha256": config_fingerprint(config),
                    "predictions_sha256": predictions_sha256, "fold_files_sha256": fold_files_sha256(run_dir),
                    **({"cv_rows": int(covered.sum())} if not covered.all() else {}), "warnings": warnings}))
    return RunResult(run_id=run_id, run_dir=run_dir, fold_scores=fold_scores, cv_score=cv, metric=comp.metric,
                          submission_path=submission_path, seconds=seconds)
