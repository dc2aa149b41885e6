"""Does pruning pay? Run a pruned study on Titanic, then replay every pruned trial unpruned (same parameters,
same seed, so a completed trial would run identically) and compare the time spent.

    python benchmarks/tune_pruning.py --trials 30 --workers 2 --out /tmp/tune-pruning

Prints the pruned fraction, the time the pruned trials took against their unpruned replays, the time saved,
and whether any pruned trial would have beaten the study's best (a pruning mistake).
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

from optuna.trial import TrialState

from kbert.io import read_json
from kbert.tune import TuneOptions, load_study, trial_dir, tune
from kbert.tune.space import write_space_file

# A quick from-scratch space: small encoders, few epochs, so that 30+ five-fold trials fit in minutes.
SPACE = {"params": {
    "encoder": "bert",
    "num_hidden_layers": {"low": 1, "high": 2},
    "hidden_size": {"choices": [64, 128]},
    "num_attention_heads": {"choices": [2, 4]},
    "intermediate_size": {"choices": [256, 512]},
    "hidden_dropout_prob": {"low": 0.0, "high": 0.3},
    "vocab_size": {"choices": [500, 1000]},
    "scratch_learning_rate": {"set": "learning_rate", "low": 1.0e-4, "high": 5.0e-3, "log": True},
    "epochs": {"low": 3, "high": 6},
    "batch_size": {"choices": [32, 64]},
    "warmup_ratio": {"low": 0.0, "high": 0.2},
    "pooling": ["cls", "mean", "max", "attention"],
    "head_dropout": {"low": 0.0, "high": 0.3},
    "serializer": {"set": "text.serializer", "choices": ["competition", "list", "sentence"]},
    "numeric": {"set": "text.numeric", "choices": ["raw", "round", "bins"], "when": {"serializer": ["list", "sentence"]}},
}}


def seconds(trial) -> float:
    return trial.duration.total_seconds()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--pruner", default="wilcoxon")
    parser.add_argument("--prune-p", type=float, default=0.2)
    parser.add_argument("--out", default="/tmp/kbert-tune-pruning")
    args = parser.parse_args()
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    space = write_space_file(out / "space.yaml", SPACE)
    common = dict(competition="titanic", space=str(space), workers=args.workers, sampler_seed=0,
                  out_dir=str(out / "runs"), keep_top=1)

    started = time.perf_counter()
    pruned_study, _ = tune(TuneOptions(study="pruned", trials=args.trials, pruner=args.pruner, prune_p=args.prune_p,
                                       **common))
    pruned_wall = time.perf_counter() - started
    trials = [t for t in pruned_study.get_trials() if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    pruned = [t for t in trials if t.state == TrialState.PRUNED]
    if not pruned:
        print(f"no trial of {len(trials)} was pruned; nothing to replay")
        return

    replay_options = TuneOptions(study="replay", trials=len(pruned), pruner="none", enqueue_default=False, **common)
    replay_study, _, _, _ = load_study(replay_options, create=True)
    for trial in pruned:
        replay_study.enqueue_trial(trial.params, user_attrs={"replay_of": trial.number})
    started = time.perf_counter()
    replay_study, _ = tune(replay_options)
    replay_wall = time.perf_counter() - started
    replays = {t.user_attrs["replay_of"]: t for t in replay_study.get_trials(states=(TrialState.COMPLETE,))
               if "replay_of" in t.user_attrs}  # a second worker may run one sampled trial past the queue

    best = pruned_study.best_value
    spent_pruned = sum(seconds(t) for t in pruned)
    spent_full = sum(seconds(replays[t.number]) for t in pruned)
    spent_all = sum(seconds(t) for t in trials)
    print(f"\npruned study: {len(trials)} finished trials, {len(pruned)} pruned ({len(pruned) / len(trials):.0%}), "
          f"best CV {best:.4f}, wall {pruned_wall:.0f}s, trial time {spent_all:.0f}s")
    print(f"{'trial':>5} {'folds run':>9} {'pruned s':>9} {'replay s':>9} {'replay CV':>10}")
    for t in pruned:
        r = replays[t.number]
        print(f"{t.number:>5} {len(t.intermediate_values):>9} {seconds(t):>9.0f} {seconds(r):>9.0f} {r.value:>10.4f}")
    saved = spent_full - spent_pruned
    print(f"pruned trials: {spent_pruned:.0f}s as run, {spent_full:.0f}s unpruned (replay wall {replay_wall:.0f}s)")
    print(f"time saved: {saved:.0f}s = {saved / (spent_all + saved):.0%} of the same {len(trials)} trials unpruned "
          f"({spent_all + saved:.0f}s of trial time)")
    # The same saving from the replays alone: the seconds their unpruned runs spent on the folds that pruning
    # skipped (fold times from each replay's metrics.json), immune to load that differed between the phases.
    replay_dir = out / "runs" / "titanic" / "replay"
    skipped = sum(fold["seconds"] for t in pruned
                  for fold in read_json(trial_dir(replay_dir, replays[t.number].number) / "metrics.json")["folds"]
                  if fold["fold"] >= len(t.intermediate_values))
    print(f"folds skipped by pruning took {skipped:.0f}s in the replays = "
          f"{skipped / (spent_all + saved):.0%} of the trial time")
    mistakes = [t.number for t in pruned if replays[t.number].value > best]
    print(f"pruned trials that would have beaten the best ({best:.4f}): {mistakes or 'none'}")


if __name__ == "__main__":
    main()
