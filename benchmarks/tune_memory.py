"""Memory over many tuning trials: run N tiny Titanic trials in one process and report the peak and current
RSS after each (recorded by `kbert tune` in every trial's user attributes).

    python benchmarks/tune_memory.py --trials 50 --out /tmp/tune-memory

The done-when of the tuning issue: peak RSS grows by less than 10% from trial 5 to trial 50.
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

from kbert.tune import TuneOptions, tune
from kbert.tune.space import write_space_file

# Tiny trials whose shapes vary (hidden size, layers, length, batch size), so that compile caches, tokenizers
# and buffers of many different sizes come and go.
SPACE = {"params": {
    "encoder": "bert", "epochs": 2, "vocab_size": 300, "intermediate_size": 128, "num_attention_heads": 2,
    "num_hidden_layers": {"low": 1, "high": 2},
    "hidden_size": {"choices": [32, 64, 96]},
    "max_length": {"choices": [48, 64]},
    "batch_size": {"choices": [16, 32]},
    "scratch_learning_rate": {"set": "learning_rate", "low": 3e-4, "high": 3e-3, "log": True},
    "pooling": ["cls", "mean", "max", "attention"],
}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=50)
    parser.add_argument("--out", default="/tmp/kbert-tune-memory")
    args = parser.parse_args()
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    space = write_space_file(out / "space.yaml", SPACE)
    options = TuneOptions(competition="titanic", study="memory", trials=args.trials, space=str(space),
                          pruner="none", keep_top=3, sampler_seed=0, out_dir=str(out / "runs"),
                          overrides={"limit_rows": 120, "folds": 2})
    started = time.perf_counter()
    study, _ = tune(options)
    trials = sorted(study.get_trials(), key=lambda t: t.number)
    print(f"\n{len(trials)} trials in {time.perf_counter() - started:.0f}s")
    print(f"{'trial':>5} {'peak RSS MB':>12} {'RSS MB':>8}")
    for t in trials:
        if t.number < 5 or t.number % 5 == 4:
            print(f"{t.number + 1:>5} {t.user_attrs['peak_rss_mb']:>12.1f} {t.user_attrs.get('rss_mb', float('nan')):>8.1f}")
    at5, last = trials[4].user_attrs, trials[-1].user_attrs
    growth = last["peak_rss_mb"] / at5["peak_rss_mb"] - 1
    print(f"peak RSS: trial 5 {at5['peak_rss_mb']:.1f} MB -> trial {len(trials)} {last['peak_rss_mb']:.1f} MB "
          f"({growth:+.1%})")
    if "rss_mb" in at5:
        print(f"RSS after the trial: trial 5 {at5['rss_mb']:.1f} MB -> trial {len(trials)} {last['rss_mb']:.1f} MB "
              f"({last['rss_mb'] / at5['rss_mb'] - 1:+.1%})")


if __name__ == "__main__":
    main()
