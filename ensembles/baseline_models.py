"""A baseline fold's fitted models on disk, so that the baseline predicts new rows (``kbert predict``).

Per fold, ``folds/<k>/baseline.json`` names the files and what they read (the column kinds, the classes the fold
saw, each file's sha256). scikit-learn pipelines are saved with skops and loaded with an explicit list of the types
they may hold (``TRUSTED``), never ``trusted=True`` or pickle. LightGBM and CatBoost keep their boosters in their
own formats (a LightGBM text model, a CatBoost ``.cbm``), with the pipeline's column steps before them in skops.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import numpy as np

from kbert.ensembles.baseline import Baseline, ColumnKinds, FittedFold
from kbert.errors import KbertError
from kbert.io import atomic_write, file_sha256, read_json, write_json
from kbert.tasks import Task

MODELS_FILE = "baseline.json"
FORMAT = 1
# The types outside skops' own defaults that kbert's baseline pipelines hold: a file naming any other is refused.
TRUSTED = frozenset({
    "functools.partial",  # HistGradientBoosting's TreePredictor binding, with check_array below
    "kbert.ensembles.baseline.SkewedLog1p",
    "kbert.ensembles.baseline.TrimmedRegressor",
    "numpy.dtype",
    "sklearn.ensemble._hist_gradient_boosting.predictor.TreePredictor",
    "sklearn.model_selection._split.KFold",  # the target encoder's cross-fitting splits
    "sklearn.model_selection._split.StratifiedKFold",
    "sklearn.utils.validation.check_array",
})
NATIVE = {"lgbm": "txt", "catboost": "cbm"}  # boosters kept in their library's own format


class NativeModel:
    """A pipeline's fitted column steps (skops) with a booster read back from its native file: predicts as the
    fitted pipeline did (``predict_proba`` of a classifier, ``predict`` of a regressor)."""

    def __init__(self, steps, booster, library: str):
        self.steps, self.booster, self.library = steps, booster, library

    def predict_proba(self, X) -> np.ndarray:
        Xt = self.steps.transform(X)
        if self.library == "catboost":
            return self.booster.predict_proba(Xt)
        p = self.booster.predict(Xt)  # LightGBM: P(positive) for two classes, else one column per class
        return np.vstack((1.0 - p, p)).T if p.ndim == 1 else p

    def predict(self, X) -> np.ndarray:
        return self.booster.predict(self.steps.transform(X))


def save_fold_models(fold_dir: Path, baseline: Baseline, fitted: FittedFold) -> Path:
    """Write the fold's models and then ``baseline.json`` naming them (the record last: a fold with a record has
    its files)."""
    import skops.io as sio

    outputs = []
    for j, pipeline in enumerate(fitted.models):
        files = {}
        if isinstance(pipeline, int):  # an output whose training rows held one class: that class
            outputs.append({"constant": pipeline})
            continue
        if baseline.model in NATIVE:
            files["steps"] = atomic_write(fold_dir / f"steps-{j}.skops", lambda tmp: sio.dump(pipeline[:-1], tmp))
            booster = pipeline[-1].booster_ if baseline.model == "lgbm" else pipeline[-1]  # CatBoost's is itself
            files["booster"] = atomic_write(fold_dir / f"model-{j}.{NATIVE[baseline.model]}",
                                            lambda tmp: booster.save_model(str(tmp)))
        else:
            files["pipeline"] = atomic_write(fold_dir / f"model-{j}.skops", lambda tmp: sio.dump(pipeline, tmp))
        outputs.append({part: {"file": path.name, "sha256": file_sha256(path)} for part, path in files.items()})
    return write_json(fold_dir / MODELS_FILE, {"format": FORMAT, "model": baseline.model, "task": baseline.task,
                                               "kinds": asdict(fitted.kinds), "classes_found": fitted.found,
                                               "outputs": outputs})


def load_fold_models(fold_dir: Path, baseline: Baseline) -> FittedFold:
    """The fold's fitted models, each file checked against the sha256 its record gives; a fold without a record
    (a baseline made before kbert saved them) or with a damaged, swapped or untrusted file is refused in one line."""
    record_path = fold_dir / MODELS_FILE
    if not fold_dir.is_dir():
        raise KbertError(f"{fold_dir}: missing; the baseline keeps a folder of fitted models per fold")
    if not record_path.is_file():
        raise KbertError(f"{fold_dir}: no {MODELS_FILE}: this baseline kept no fitted models (made by a kbert before "
                         "they were saved); run kbert baseline again to predict new rows with it")
    record = read_json(record_path, required=("format", "model", "kinds", "outputs"))
    if record["format"] != FORMAT or record["model"] != baseline.model:
        raise KbertError(f"{record_path}: format {record['format']} of a {record['model']} baseline; this kbert reads "
                         f"format {FORMAT} of its run's model, {baseline.model}")
    try:
        kinds = ColumnKinds(**record["kinds"])
    except TypeError as exc:
        raise KbertError(f"{record_path}: 'kinds' is not a column-kinds record: {exc}") from None
    models = [_load_output(fold_dir, baseline, parts, record_path) for parts in record["outputs"]]
    if not models:
        raise KbertError(f"{record_path}: names no model files")
    return FittedFold(kinds, models, record.get("classes_found"))


def _load_output(fold_dir: Path, baseline: Baseline, parts: dict, record_path: Path):
    model, paths = baseline.model, {}
    if "constant" in parts:
        if parts["constant"] not in (0, 1) or isinstance(parts["constant"], bool) or len(parts) > 1:
            raise KbertError(f"{record_path}: 'constant' must be a class, 0 or 1, alone in its output; found {parts}")
        return int(parts["constant"])
    for part, entry in parts.items():
        path = fold_dir / str(entry.get("file", ""))
        if path.parent != fold_dir or not path.is_file():
            raise KbertError(f"{path}: missing; {record_path.name} names it (the fold's fitted {model} model)")
        if file_sha256(path) != entry.get("sha256"):
            raise KbertError(f"{path}: its sha256 differs from the one {record_path.name} recorded; the file was "
                             "changed or damaged since the baseline wrote it")
        paths[part] = path
    if "pipeline" in paths:
        return load_skops(paths["pipeline"])
    steps = load_skops(paths["steps"])
    try:
        if model == "lgbm":
            import lightgbm

            booster = lightgbm.Booster(model_file=str(paths["booster"]))
        else:
            import catboost

            task = Task(baseline.task)
            kind = catboost.CatBoostClassifier if task.classes or task.probabilities else catboost.CatBoostRegressor
            booster = kind().load_model(str(paths["booster"]))
    except ImportError:
        raise KbertError(f"{paths['booster']}: reading a {model} model needs "
                         f"{'LightGBM' if model == 'lgbm' else 'CatBoost'}: pip install kbert[baselines]") from None
    except Exception as exc:  # each library's own error for an unreadable model file
        raise KbertError(f"{paths['booster']}: not a readable {model} model ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0] if str(exc) else 'no detail'})") from None
    return NativeModel(steps, booster, "catboost" if model == "catboost" else "lightgbm")


def load_skops(path: Path):
    import skops.io as sio

    try:
        untrusted = set(sio.get_untrusted_types(file=path))
        refused = sorted(untrusted - TRUSTED)
        if refused:
            raise KbertError(f"{path}: holds types kbert does not load: {', '.join(refused)}")
        return sio.load(path, trusted=sorted(untrusted))
    except KbertError:
        raise
    except Exception as exc:  # skops' error for a file that is not one of its archives
        raise KbertError(f"{path}: not a readable skops file ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0] if str(exc) else 'no detail'})") from None
