"""How long an encoder run takes on this machine, measured before it starts: ``kbert auto``'s estimates.

``probe_run`` times the run's first folds on a sample, in the fold layout ``plan_folds`` gives here, so that
``RunProbe.run_seconds`` can price any number of epochs. Probes are cached in ``<KBERT_CACHE>/probes.json`` under a
key of the machine, kbert's version, the data and every setting that changes a step's cost.
"""

from __future__ import annotations

import hashlib
import json
import math
import platform
import time
from dataclasses import asdict, dataclass, replace
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import numpy as np

from kbert.errors import KbertError
from kbert.io import read_json, write_json
from kbert.pipeline.config import RunConfig

PROBE_STEPS = 6  # training steps in each of the probe's two epochs
PACE_FREE = ("seed", "epochs", "patience", "learning_rate", "weight_decay", "warmup_ratio", "min_lr_ratio",
             "max_grad_norm", "layerwise_lr_decay", "pseudo_threshold", "hidden_dropout_prob",
             "attention_probs_dropout_prob", "head_dropout", "reinit_layers", "adversarial_epsilon", "adversarial_lr",
             "out_dir", "submissions_dir", "data_dir", "search_space")


@dataclass(frozen=True)
class RunProbe:
    at_once: int  # folds training side by side
    folds: int  # the run's folds (seeds x repeats x k)
    startup_s: float  # the run's own start: data, encoder, fold processes
    prep_s: float  # a fold's fit and tokens
    train_step_s: float  # a steady training step, with the other folds beside it
    eval_batch_s: float  # a steady evaluation batch
    trace_s: float  # tracing one new shape, beyond its step
    steps_per_epoch: int
    valid_batches: int
    test_batches: int
    shapes: int  # distinct padded shapes a fold traces
    lengths: dict  # the training rows' token lengths: p50, p75, p90, p95, max; kept_p75, kept_p90 (kept_tokens)
    seconds: float  # the probe's own wall time
    states_s: float = 0.0  # --train-top-layers on kept states: one distinct token sequence's frozen-block states
    sequences: int = 0  # ... and the run's distinct token sequences (pipeline/frozen_states.py)
    cached: bool = False

    def epoch_seconds(self) -> float:
        """One fold's epoch: its training steps and its validation pass."""
        return self.steps_per_epoch * self.train_step_s + self.valid_batches * self.eval_batch_s

    def states_seconds(self) -> float:
        """The kept frozen-block states' wall time: computed once, by the first folds side by side, each its share."""
        return self.sequences * self.states_s / min(self.at_once, self.folds)

    def run_seconds(self, epochs: int) -> float:
        """The run's wall time with ``epochs`` epochs in every fold (an upper bound: early stopping ends sooner)."""
        fold = (self.prep_s + self.shapes * self.trace_s + epochs * self.epoch_seconds()
                + self.test_batches * self.eval_batch_s)
        return self.startup_s + self.states_seconds() + math.ceil(self.folds / self.at_once) * fold


def probe_run(config: RunConfig, steps: int = PROBE_STEPS, log=lambda _: None) -> RunProbe:
    """``config``'s run, probed on this machine (or read from the cache)."""
    from kbert.pipeline.artifacts import fold_layout
    from kbert.pipeline.fold import load_encoder_source, probe_fold
    from kbert.pipeline.fold_processes import FoldJob, train_folds, with_streams
    from kbert.pipeline.precision import use_device
    from kbert.pipeline.run import fold_plan, prepare_inputs, run_splits  # the plan kbert run follows

    started = time.perf_counter()
    use_device(config.train.device)
    inputs = prepare_inputs(config)
    source = load_encoder_source(config)
    total = len(fold_layout(config))
    plan = fold_plan(config, source, total, total)
    key = probe_key(config, inputs.inputs, plan.processes, plan.streams)
    cached = read_cache().get(key)
    if cached is not None:
        return RunProbe(**{**cached, "cached": True})
    comp_dir = Path(config.out_dir) / config.competition.name
    _, splits, _ = run_splits(config, inputs, comp_dir)  # after the cache: pseudo-labels read their teacher
    fold_inputs = with_streams(inputs, plan.streams)
    jobs = [FoldJob(fold_inputs, split, comp_dir, comp_dir / "cache", None, probe_steps=steps)
            for split in splits[: plan.processes]]

    def here(job: FoldJob) -> dict:
        return probe_fold(job, source)

    folds = [fold for _, fold, _ in train_folds(jobs, plan, False, log, here)]
    wall = time.perf_counter() - started
    probe = summarize(folds, config, plan.processes, total, wall)
    write_cache(key, probe)
    return probe


def summarize(folds: list[dict], config: RunConfig, at_once: int, total: int, wall: float) -> RunProbe:
    """The probed folds' figures, averaged, as a ``RunProbe``."""
    train = config.train

    def mean(name: str) -> float:
        return float(np.mean([fold[name] for fold in folds]))

    step = sum(f["train_s"] for f in folds) / max(sum(f["train_steps"] for f in folds), 1)
    batch = sum(f["eval_s"] for f in folds) / max(sum(f["eval_batches"] for f in folds), 1)
    traced = sum(f["train_traced"] + f["eval_traced"] for f in folds)
    beyond = sum(f["tracing_s"] - f["train_traced"] * step - f["eval_traced"] * batch for f in folds)
    trace = max(beyond, 0.0) / max(traced, 1)
    own = max(f["prep_s"] + f.get("kept_s", 0.0) + f["tracing_s"] + f["train_s"] + f["eval_s"] for f in folds)
    lengths = np.array(folds[0]["train_lengths"])
    rows_per_step = train.batch_size * train.grad_accum
    return RunProbe(
        at_once=at_once, folds=total, startup_s=round(max(wall - own, 0.0), 3), prep_s=round(mean("prep_s"), 3),
        train_step_s=step, eval_batch_s=batch, trace_s=trace,
        steps_per_epoch=math.ceil(mean("train_rows") / rows_per_step),
        valid_batches=math.ceil(mean("valid_rows") / train.eval_batch_size),
        test_batches=math.ceil(mean("test_rows") / train.eval_batch_size),
        shapes=widths(folds[0]["train_lengths"], train) + widths(folds[0]["eval_lengths"], train),
        lengths={**{name: int(np.percentile(lengths, q)) for name, q in (("p50", 50), ("p75", 75), ("p90", 90),
                                                                         ("p95", 95), ("max", 100))},
                 **{f"kept_p{q}": kept_tokens(lengths, int(np.percentile(lengths, q)), train.max_length)
                    for q in (75, 90)}},
        seconds=round(wall, 3), states_s=mean("states_s") if "states_s" in folds[0] else 0.0,
        sequences=folds[0].get("sequences", 0))


def kept_tokens(lengths: np.ndarray, shorter: int, max_length: int) -> float:
    """The share of the training tokens a max length of ``shorter`` keeps of what ``max_length`` keeps: what a
    step at that length costs against one at ``max_length``, about (rows are padded to their batch's longest)."""
    return round(float(np.minimum(lengths, shorter).sum() / np.minimum(lengths, max_length).sum()), 4)


def widths(lengths: list[int], train) -> int:
    """Distinct padded widths among ``lengths`` (each a shape a compiled step traces once)."""
    from kbert.pipeline.train import batch_width

    if batch_width(train) is not None or not lengths:
        return 1
    bucket = train.length_bucket
    return len({-(-min(n, train.max_length) // bucket) for n in lengths})


def probe_key(config: RunConfig, inputs: dict[str, str], at_once: int, streams: int) -> str:
    """What a probe's figures depend on: the machine, kbert, the data, the pace-setting settings, the layout."""
    from kbert.models import runtime
    from kbert.pipeline.fold_processes import usable_cores

    settings = config.to_dict()
    for group in settings.values():
        if isinstance(group, dict):
            for name in PACE_FREE:
                group.pop(name, None)
    for name in PACE_FREE:
        settings.pop(name, None)
    try:
        kbert = version("kbert")
    except PackageNotFoundError:
        kbert = "unknown"
    machine = {"cpu": cpu_model(), "cores": usable_cores(), "blas": runtime.status().blas.name, "kbert": kbert,
               "mlx": version("mlx")}
    text = json.dumps({"machine": machine, "inputs": inputs, "settings": settings, "layout": [at_once, streams]},
                      sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cache_path() -> Path:
    from kbert.models.blas import cache_root

    return cache_root() / "probes.json"


def read_cache() -> dict:
    """The cached probes by key; an unreadable cache is an empty one (it is only a cache)."""
    try:
        found = read_json(cache_path())
    except (KbertError, OSError, ValueError):  # missing, damaged or unreadable: probe again
        return {}
    names = set(RunProbe.__dataclass_fields__) - {"cached"}
    return {key: value for key, value in found.items() if isinstance(value, dict) and set(value) == names} \
        if isinstance(found, dict) else {}


def write_cache(key: str, probe: RunProbe) -> None:
    """Add ``probe`` to the cache; a cache that cannot be written is skipped (the probe is still used)."""
    found = read_cache()
    found[key] = {k: v for k, v in asdict(replace(probe, cached=False)).items() if k != "cached"}
    try:
        write_json(cache_path(), found)
    except OSError:
        pass
