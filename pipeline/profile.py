"""``kbert run --profile``: where a run's wall time goes, by stage and by fold.

The stages: data and text preparation (loading, features, each fold's fitted serializer and vocabulary),
tokenization, batching (padding token lists into each step's arrays), tracing (the first call of a compiled step
or evaluation for each input shape, which traces and compiles it; its compute included), training steps,
evaluation (every epoch's validation pass, the test pass, TTA) and artifact writing. Code marks a stage with
``with stage("training steps"):``; outside ``profiling()`` that costs one context-variable lookup. MLX is lazy,
so a timed stage must evaluate its own results (``mx.eval``) before it ends.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

STAGES = ("data and text preparation", "tokenization", "batching", "tracing", "training steps", "evaluation",
          "artifact writing")


@dataclass
class Profile:
    seconds: dict[str, dict[str, float]] = field(default_factory=dict)  # part ("run", "fold 1/5") -> stage -> s
    counts: dict[str, dict[str, int]] = field(default_factory=dict)  # part -> stage -> times it ran
    part: str = "run"
    shapes: set = field(default_factory=set)  # (kind, shape) already traced in this part
    started: float = field(default_factory=time.perf_counter)
    overlapping: bool = False  # folds trained side by side: their stage times add up to more than the wall time

    def add_part(self, part: str, seconds: dict[str, float]) -> None:
        """A part timed elsewhere: a fold trained in its own process (pipeline/fold_processes.py)."""
        self.seconds[part] = dict(seconds)
        self.overlapping = True

    def add(self, stage_name: str, seconds: float) -> None:
        by_stage = self.seconds.setdefault(self.part, {})
        by_stage[stage_name] = by_stage.get(stage_name, 0.0) + seconds
        counts = self.counts.setdefault(self.part, {})
        counts[stage_name] = counts.get(stage_name, 0) + 1

    def to_dict(self) -> dict:
        wall = time.perf_counter() - self.started
        totals = {name: round(sum(p.get(name, 0.0) for p in self.seconds.values()), 3) for name in STAGES}
        other = None if self.overlapping else round(wall - sum(totals.values()), 3)
        return {"wall_s": round(wall, 3), "stages_s": totals, "other_s": other,
                "parts": {part: {k: round(v, 3) for k, v in stages.items()} for part, stages in self.seconds.items()}}

    def table(self) -> str:
        """One row per part (the run, each fold), one column per stage, seconds; a total row and the rest."""
        summary = self.to_dict()
        short = ["prep", "tokens", "batching", "tracing", "train", "eval", "write"]
        lines = [f"{'profile (s)':16}" + "".join(f"{name:>9}" for name in short)]
        for part, stages in self.seconds.items():
            lines.append(f"{part:16}" + "".join(f"{stages.get(name, 0.0):9.2f}" for name in STAGES))
        lines.append(f"{'total':16}" + "".join(f"{summary['stages_s'][name]:9.2f}" for name in STAGES))
        if self.overlapping:
            lines.append(f"wall {summary['wall_s']:.1f} s; the folds trained side by side, in their own processes "
                         "(their stage times overlap)")
        else:
            lines.append(f"wall {summary['wall_s']:.1f} s; outside these stages (start-up, folds, scoring, "
                         f"post-processing) {summary['other_s']:.1f} s")
        return "\n".join(lines)


_ACTIVE: ContextVar[Profile | None] = ContextVar("kbert_profile", default=None)


@contextmanager
def profiling() -> Iterator[Profile]:
    """Record the stages run inside the block."""
    profile = Profile()
    token = _ACTIVE.set(profile)
    try:
        yield profile
    finally:
        _ACTIVE.reset(token)


def add_part(name: str, seconds: dict[str, float]) -> None:
    """Record ``seconds`` (stage -> s) timed in another process as part ``name``."""
    profile = _ACTIVE.get()
    if profile is not None:
        profile.add_part(name, seconds)


def set_part(name: str) -> None:
    """The stages that follow belong to ``name`` (a fold's description)."""
    profile = _ACTIVE.get()
    if profile is not None:
        profile.part, profile.shapes = name, set()


def step_stage(kind: str, shape: tuple, compiled: bool = True) -> str:
    """``tracing`` for the first ``kind`` call ("training steps", "evaluation") of an input shape in this part
    (compiled steps trace per shape), else ``kind``; always ``kind`` for a step that is not compiled."""
    profile = _ACTIVE.get()
    if profile is None or not compiled or (kind, shape) in profile.shapes:
        return kind
    profile.shapes.add((kind, shape))
    return "tracing"


@contextmanager
def stage(name: str) -> Iterator[None]:
    profile = _ACTIVE.get()
    if profile is None:
        yield
        return
    started = time.perf_counter()
    try:
        yield
    finally:
        profile.add(name, time.perf_counter() - started)
