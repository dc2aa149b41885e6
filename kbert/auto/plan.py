"""What ``kbert auto`` tries, in order, for a competition and a preset: the job list.

Tabular baselines first, then (where text dominates) MiniLM embeddings, the strongest pretrained encoder that
fits fine-tuned with the recipe and MPNet's top blocks fine-tuned on its frozen blocks' states, a BERT from scratch
with fusion, a baseline on its embeddings, pseudo-labels, extra seeds and a tuning study. Every job is a member
folder ``runs/<competition>/auto-<job>``, done when it holds a metrics.json; a source such as "the best baseline" is
chosen when the job starts, from the finished members' CVs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kbert.auto.state import Action
from kbert.errors import KbertError


@dataclass(frozen=True)
class Preset:
    """What a preset sets: the encoder runs' epochs (early stopping with this patience), the seeds of the
    extra-seeds member, whether the concatenating fusion runs too, and the most trials of the closing tuning study
    (which also stops at the time left)."""

    epochs: int
    patience: int
    extra_seeds: int
    concat: bool
    trials: int


PRESETS = {
    "fast": Preset(epochs=10, patience=3, extra_seeds=2, concat=False, trials=8),
    "balanced": Preset(epochs=20, patience=5, extra_seeds=2, concat=True, trials=40),
    "best": Preset(epochs=30, patience=6, extra_seeds=3, concat=True, trials=200),
}
BEST_BASELINE, BEST_RUN = "<best baseline>", "<best encoder run>"
STRONGEST_FITTING = "<the strongest pretrained encoder that fits>"

# The shipped pretrained encoders kbert auto fine-tunes on free text, by their measured strength: the mean fold F1
# of the recipe's base fine-tuned on Disaster Tweets under one protocol (benchmarks/recipe_ablation.py; NOTES.md).
# It fine-tunes the strongest whose run fits the time left. An encoder joins once it has been measured, and only if
# it is stronger than every faster one: mpnet-base is not (0.6957 against MiniLM-L6's 0.7649 in a GPU run of that
# protocol, at 9 times the cost), so its probe would never pay.
ENCODER_STRENGTH = {"minilm-l6": 0.7661}
# The recipe's parts that helped in that measurement (none did: benchmarks/NOTES.md), set on the fine-tuned run.
RECIPE: dict = {}
# A second fine-tuned member, unlike the first: MPNet-base with its top 4 blocks trained on the kept states of the
# frozen 8 below (--train-top-layers). Alone about as strong as MiniLM-L6 fine-tuned whole; beside it, the blend's
# honest F1 on Disaster Tweets rose by about 0.01 (benchmarks/NOTES.md). It runs where the time left holds it.
TOP_LAYERS_MEMBER = ("mpnet-base", {"train_top_layers": 4, "epochs": 3, "learning_rate": 5e-5, "pooling": "mean"})


@dataclass(frozen=True)
class Facts:
    """What the job list depends on: the task; whether the table has numeric or categorical input columns (fusion
    has something to read); whether most of a row's words are free text; the shipped pretrained encoders installed;
    the optional baseline libraries present (lightgbm, catboost)."""

    task: str
    has_columns: bool
    free_text: bool
    pretrained: frozenset[str] = frozenset()
    installed: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Job:
    name: str  # the member's run id under runs/<competition>/, auto-...
    action: Action
    settings: dict = field(default_factory=dict)  # run overrides, or {"model": ..., "embeddings": ...}
    needs: tuple[str, ...] = ()  # jobs that must be done first (BEST_* resolve among the done ones)
    encoders: tuple[str, ...] = ()  # encoder STRONGEST_FITTING: the candidates, strongest first
    why: str = ""  # an encoder run's reason, in the leaderboard's words before its form


def plan_jobs(preset: str, facts: Facts, seed: int = 42) -> list[Job]:
    """The job list of ``preset`` for a competition with these ``facts``."""
    if preset not in PRESETS:
        raise KbertError(f"--preset {preset!r} is unknown; known: {', '.join(PRESETS)}")
    options = PRESETS[preset]
    training = {"epochs": options.epochs, "patience": options.patience, "seed": seed}
    jobs = [Job("auto-baseline-hgb", Action.BASELINE, {"model": "hgb"}),
            Job("auto-baseline-logreg", Action.BASELINE, {"model": "logreg"})]
    jobs += [Job(f"auto-baseline-{model}", Action.BASELINE, {"model": model})
             for model, library in (("lgbm", "lightgbm"), ("catboost", "catboost")) if library in facts.installed]
    baselines = tuple(job.name for job in jobs)

    runs = []
    if facts.free_text and "minilm-l6" in facts.pretrained:  # the pretrained MiniLM's sentence embeddings
        jobs.append(Job("auto-hgb-minilm", Action.EMBEDDING, {"model": "hgb", "embeddings": "minilm-l6"}))
    candidates = tuple(sorted(facts.pretrained & set(ENCODER_STRENGTH), key=lambda n: (-ENCODER_STRENGTH[n], n)))
    if facts.free_text and candidates:  # the strongest pretrained encoder that fits, fine-tuned with the recipe
        recipe = {**{k: v for k, v in training.items() if k != "epochs"}, **RECIPE}  # the fine-tuning default
        runs.append(Job("auto-finetune", Action.RUN, {**recipe, "encoder": STRONGEST_FITTING}, encoders=candidates))
    encoder, settings = TOP_LAYERS_MEMBER
    if facts.free_text and encoder in facts.pretrained:
        runs.append(Job("auto-finetune-top", Action.RUN, {**training, **settings, "encoder": encoder},
                        why=f"{encoder}'s top {settings['train_top_layers']} blocks on its frozen blocks' states, a "
                            "second fine-tuned member"))
    fusion = "gated" if facts.has_columns else "none"
    runs.append(Job(f"auto-bert-{fusion}", Action.RUN, {**training, "encoder": "bert", "fusion": fusion}))
    if options.concat and facts.has_columns:
        runs.append(Job("auto-bert-concat", Action.RUN, {**training, "encoder": "bert", "fusion": "concat"}))
    jobs += runs
    names = tuple(job.name for job in runs)
    jobs.append(Job("auto-hgb-emb-best", Action.EMBEDDING, {"model": "hgb", "embeddings": BEST_RUN}, needs=names))
    if facts.task in ("binary", "multiclass"):
        jobs.append(Job("auto-best-pseudo", Action.RUN, {"from": BEST_RUN, "pseudo_label": BEST_BASELINE},
                        needs=names + baselines))
        names += ("auto-best-pseudo",)
    jobs.append(Job("auto-best-seeds", Action.RUN, {"from": BEST_RUN, "seed": seed + 1, "seeds": options.extra_seeds},
                    needs=names))
    jobs.append(Job("auto-study", Action.TUNE, {"trials": options.trials}))
    return jobs
