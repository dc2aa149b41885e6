"""How long a job will take, and whether it fits: the scheduler of ``kbert auto``.

An encoder run is priced by its probe (pipeline/probe.py), corrected by how finished runs compared with theirs; a
baseline by its work (rows x columns) at its kind's measured rate, else at a prior scaled to this machine. ``fits``
starts a job only if its estimate fits in what is left, less the final ensemble's reserve and a safety share.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

PRIOR_RATE = {  # seconds per work unit (rows x columns): measured rates, rounded up (benchmarks/NOTES.md)
    "baseline:hgb": 1.5e-4, "baseline:logreg": 1.2e-4, "baseline:lgbm": 6e-4, "baseline:catboost": 1.5e-3,
    # "embedding:<source>", a baseline on a source's text embeddings (its rows x columns, plus 10 a text embedded):
    # this prior until the source's first is measured
    "embedding": 2.0e-3,
}
FIXED_SECONDS = 3.0  # start-up of a baseline: imports, reading the data, writing the artifacts
ENSEMBLE_PRIOR = 90.0  # the final ensemble's seconds before an interim one was timed
SAFETY = 0.03  # the share of the time limit never planned for


@dataclass
class Estimator:
    """What finished jobs measured; ``estimate``, ``correction`` and ``fits`` use it."""

    measured: dict[str, list[list[float]]] = field(default_factory=dict)  # baselines: [work, seconds] by kind
    corrections: dict[str, list[float]] = field(default_factory=dict)  # encoder runs: actual / probed, by encoder
    ensemble_seconds: float | None = None  # the last interim ensemble, per member

    def record(self, kind: str, work: float, seconds: float) -> None:
        if work > 0 and seconds > 0:
            self.measured.setdefault(kind, []).append([work, seconds])

    def record_run(self, encoder: str, actual: float, probed: float) -> None:
        if actual > 0 and probed > 0:
            self.corrections.setdefault(encoder, []).append(actual / probed)

    def correction(self, encoder: str) -> float:
        """The geometric mean of actual / probed epoch seconds over this encoder's finished runs (else every
        encoder's; 1 before any)."""
        ratios = self.corrections.get(encoder) or [r for rs in self.corrections.values() for r in rs]
        return math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else 1.0

    def rate(self, kind: str) -> float:
        """Seconds per unit: this kind's own measurements, else its prior times the machine's speed against the
        priors of the kinds measured so far."""
        if kind in self.measured:
            work, seconds = map(sum, zip(*self.measured[kind]))
            return max(seconds - FIXED_SECONDS * len(self.measured[kind]), 0.1 * seconds) / work
        return self.prior(kind) * self.machine_factor()

    def prior(self, kind: str) -> float:
        """The kind's prior rate, else its family's ("embedding:minilm-l6": "embedding"), else HGB's."""
        return PRIOR_RATE.get(kind, PRIOR_RATE.get(kind.partition(":")[0], PRIOR_RATE["baseline:hgb"]))

    def machine_factor(self) -> float:
        """The geometric mean of measured rate / prior over the measured kinds; 1 before any."""
        ratios = [self.rate(other) / self.prior(other) for other in self.measured]
        return math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else 1.0

    def estimate(self, kind: str, work: float) -> float:
        return FIXED_SECONDS + self.rate(kind) * work

    def ensemble_estimate(self, members: int) -> float:
        """The final ensemble (nested CV of every method and of the choice among them, over 3 outer splits), priced
        from the last interim one (the same over 1 split; tests/test_auto_budget.py times both). One member is not
        blended (its own submission is the result): nothing to keep back for it."""
        if members <= 1:
            return 0.0
        if self.ensemble_seconds is None:
            return ENSEMBLE_PRIOR
        return 10.0 + 3.5 * self.ensemble_seconds * members

    def free(self, left: float, members: int, limit: float) -> float:
        """What ``left`` seconds hold for one more job: less the final ensemble of ``members`` + 1 members and the
        safety share of the limit."""
        return left - self.ensemble_estimate(members + 1) - SAFETY * limit

    def fits(self, seconds: float, left: float, members: int, limit: float) -> bool:
        return seconds <= self.free(left, members, limit)
