"""How long a job will take, from the jobs that finished: the scheduler of ``kbert auto``.

Every job has a size in work units that its settings and the data decide before it runs (``Job.work``):
- a tabular baseline: training rows x feature columns;
- an encoder run: the rows each fold-epoch reads (training rows, plus a third for the validation and test rows it
  only predicts) x folds x seeds x epochs x tokens per row x layers x hidden size squared / 1e9.

A job's estimate is its work times a rate in seconds per unit. The rate of a kind ("baseline:hgb",
"run:minilm-l6", ...) is measured from the finished jobs of that kind; before one finishes, the prior below, scaled
by how much slower or faster this machine ran the finished jobs of the same family (other baselines, other
encoders) than their own priors. The priors
were measured on a 2-core x86-64 Linux CPU (2026-11) and rounded up, so that an unmeasured job is overestimated
rather than under. An encoder run's epochs are an upper bound (early stopping often ends it sooner): its measured
rate uses the epochs it ran (``measured_work``), its estimate the epochs it may run.

``fits`` is the rule: a job starts only if its estimate fits in what is left, less what the final ensemble needs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

PRIOR_RATE = {  # seconds per work unit
    "baseline:hgb": 1.5e-4, "baseline:logreg": 1.2e-4, "baseline:lgbm": 6e-4, "baseline:catboost": 1.5e-3,
    "embedding": 2.0e-3,  # a baseline on encoder embeddings: the rows x columns of the baseline, plus embedding
    "run": 3.5,  # any encoder run; an encoder's own measured rate replaces it
    "adversarial": 3e-4,
}
FIXED_SECONDS = 3.0  # start-up of any job: imports, reading the data, writing the artifacts
ENSEMBLE_PRIOR = 90.0  # the final ensemble's seconds before an interim one was timed
SAFETY = 0.03  # the share of the time limit never planned for


@dataclass
class Estimator:
    """Measured (work, seconds) per kind; ``estimate`` and ``fits`` use them."""

    measured: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    ensemble_seconds: float | None = None  # the last interim ensemble, per member

    def record(self, kind: str, work: float, seconds: float) -> None:
        if work > 0 and seconds > 0:
            self.measured.setdefault(kind, []).append((work, seconds))

    def rate(self, kind: str) -> float:
        """Seconds per unit: this kind's own measurements, else its prior (or its family's: ``run:<encoder>`` ->
        ``run``) times the machine's speed against the priors of the kinds measured so far."""
        if kind in self.measured:
            work, seconds = map(sum, zip(*self.measured[kind]))
            return max(seconds - FIXED_SECONDS * len(self.measured[kind]), 0.1 * seconds) / work
        return self.prior(kind) * self.machine_factor(kind)

    def prior(self, kind: str) -> float:
        return PRIOR_RATE.get(kind, PRIOR_RATE.get(kind.split(":")[0], PRIOR_RATE["run"]))

    def machine_factor(self, kind: str) -> float:
        """The geometric mean of measured rate / prior over the measured kinds of the same family (``run:*``,
        ``baseline:*``: a GBM's speed says little about an encoder's); 1 before any."""
        family = kind.split(":")[0]
        ratios = [self.rate(other) / self.prior(other) for other in self.measured if other.split(":")[0] == family]
        return math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else 1.0

    def estimate(self, kind: str, work: float) -> float:
        return FIXED_SECONDS + self.rate(kind) * work

    def ensemble_estimate(self, members: int) -> float:
        """The final ensemble (nested CV of every method and of the choice among them, over 3 outer splits): about
        3x an interim one (the same over 1 split; tests/test_auto_budget.py times both)."""
        if self.ensemble_seconds is None:
            return ENSEMBLE_PRIOR
        return 10.0 + 3.5 * self.ensemble_seconds * max(members, 1)

    def fits(self, kind: str, work: float, left: float, members: int, limit: float) -> bool:
        """A job fits when its estimate, the final ensemble and the safety share all fit in ``left`` seconds."""
        return self.estimate(kind, work) + self.ensemble_estimate(members + 1) + SAFETY * limit <= left


def encoder_work(rows: int, test_rows: int, folds: int, seeds: int, epochs: int, tokens: float, layers: int,
                 hidden: int) -> float:
    """Work units of an encoder run (see the module docstring)."""
    train = rows * (folds - 1) / folds
    predicted = rows / folds + test_rows
    return (train + predicted / 3) * folds * seeds * epochs * tokens * layers * hidden ** 2 / 1e9


def fitting_epochs(estimator: Estimator, kind: str, work_per_epoch: float, epochs: int, left: float, members: int,
                   limit: float, least: int = 3) -> int:
    """The most epochs, from ``epochs`` down to ``least``, whose run fits; 0 when none does."""
    for count in range(epochs, least - 1, -1):
        if estimator.fits(kind, work_per_epoch * count, left, members, limit):
            return count
    return 0
