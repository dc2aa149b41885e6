"""What ``kbert auto`` tries, in order, for a competition and a preset: the job list.

1. The tabular baselines (hgb, logreg, then lgbm and catboost where installed): seconds each, and they set the bar.
2. On a table that is mostly free text, with the pretrained MiniLM (shipped) installed: a baseline on its sentence
   embeddings (cheap, and strong on tweets), then MiniLM fine-tuned where the time allows.
3. A BERT from scratch on the serialized rows, with the gated fusion of the raw columns when the table has numeric
   or categorical columns (``balanced``, ``best``: the concatenating fusion too).
4. A baseline on the best encoder run's embeddings, fold by fold (its fine-tuned fold models).
5. Pseudo-labels (binary and multiclass): the best encoder run again, with confident test rows labelled by the best
   baseline's model of each fold.
6. Extra seeds of the best encoder configuration (``--seeds``), one member.
7. A tuning study (``kbert tune``) in the time left; its best three trials join when they beat the best encoder
   run. ``balanced`` and ``best`` also run more epochs and more trials.
8. In the time left after the study (kbert/auto/driver.py ``more_seeds``): the best encoder configuration with other
   seeds, then the gradient-boosted baselines with other seeds, each while it fits.

Every job is a member folder named ``auto-<job>`` under ``runs/<competition>/``: a job whose folder holds a
metrics.json is done, which is what makes ``kbert auto`` resumable. Sources that depend on results ("the best
baseline", "the best encoder run") are decided when the job starts, from the finished members' CVs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kbert.errors import KbertError

PRESETS = {
    # epochs of the encoder runs (early stopping with this patience), seeds of the extra-seeds member, the most
    # trials of the closing tuning study (which also stops at the time left)
    "fast": {"epochs": 10, "patience": 3, "extra_seeds": 2, "concat": False, "trials": 8},
    "balanced": {"epochs": 20, "patience": 5, "extra_seeds": 2, "concat": True, "trials": 40},
    "best": {"epochs": 30, "patience": 6, "extra_seeds": 3, "concat": True, "trials": 200},
}
BEST_BASELINE, BEST_RUN = "<best baseline>", "<best encoder run>"


@dataclass(frozen=True)
class Job:
    name: str  # the member's run id under runs/<competition>/, auto-...
    action: str  # adversarial | baseline | run | embedding | tune
    settings: dict = field(default_factory=dict)  # run overrides, or {"model": ..., "embeddings": ...}
    needs: tuple[str, ...] = ()  # jobs that must be done first (BEST_* resolve among the done ones)


def plan_jobs(preset: str, task: str, has_columns: bool, free_text: bool, pretrained: bool, installed: set[str],
              seed: int = 42) -> list[Job]:
    """The job list of ``preset`` for a competition: ``has_columns``: numeric or categorical input columns (fusion
    has something to read); ``free_text``: most of a row's words are free text; ``pretrained``: MiniLM is
    installed; ``installed``: the optional baseline libraries present (lightgbm, catboost)."""
    if preset not in PRESETS:
        raise KbertError(f"--preset {preset!r} is unknown; known: {', '.join(PRESETS)}")
    options = PRESETS[preset]
    training = {"epochs": options["epochs"], "patience": options["patience"], "seed": seed}
    jobs = [Job("auto-baseline-hgb", "baseline", {"model": "hgb"}),
            Job("auto-baseline-logreg", "baseline", {"model": "logreg"})]
    jobs += [Job(f"auto-baseline-{model}", "baseline", {"model": model})
             for model, library in (("lgbm", "lightgbm"), ("catboost", "catboost")) if library in installed]
    baselines = tuple(job.name for job in jobs)

    runs = []
    if free_text and pretrained:  # free text: the pretrained MiniLM's embeddings, then MiniLM fine-tuned if it fits
        jobs.append(Job("auto-hgb-minilm", "embedding", {"model": "hgb", "embeddings": "minilm-l6"}))
        runs.append(Job("auto-minilm", "run", {**training, "encoder": "minilm-l6",
                                               "epochs": min(options["epochs"], 4)}))
    fusion = "gated" if has_columns else "none"
    runs.append(Job(f"auto-bert-{fusion}", "run", {**training, "encoder": "bert", "fusion": fusion}))
    if options["concat"] and has_columns:
        runs.append(Job("auto-bert-concat", "run", {**training, "encoder": "bert", "fusion": "concat"}))
    jobs += runs
    names = tuple(job.name for job in runs)
    jobs.append(Job("auto-hgb-emb-best", "embedding", {"model": "hgb", "embeddings": BEST_RUN}, needs=names))
    if task in ("binary", "multiclass"):
        jobs.append(Job("auto-best-pseudo", "run", {"from": BEST_RUN, "pseudo_label": BEST_BASELINE},
                        needs=names + baselines))
        names += ("auto-best-pseudo",)
    jobs.append(Job("auto-best-seeds", "run", {"from": BEST_RUN, "seed": seed + 1, "seeds": options["extra_seeds"]},
                    needs=names))
    jobs.append(Job("auto-study", "tune", {"trials": options["trials"]}))
    return jobs
