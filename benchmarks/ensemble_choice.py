"""The final ensemble of `kbert auto` on members that already exist: its wall time, the chosen method's own
nested-CV score (the best of several, so optimistic by that choice) and the whole procedure's score (the method
chosen inside each outer fold; kbert after issue 43); and the interim blend's time with the reserve `kbert auto`
keeps for the final ensemble from it (kbert/auto/budget.py), which must cover the final ensemble's seconds.

    python benchmarks/ensemble_choice.py RUNS_DIR titanic spaceship-titanic ...   # members of RUNS_DIR/<c>/auto

Run it under two checkouts' environments on the same members to compare them; a kbert without the nested choice
prints "-" for the procedure's score. Each competition's members are those in its auto leaderboard.csv; the
ensemble is built as `kbert auto` builds it (every method, 5 outer folds x 3 splits, seed 42), without writing.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd

import figures  # benchmarks/figures.py, beside this script


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", help="the runs folder of the kbert auto runs")
    parser.add_argument("competitions", nargs="+")
    args = parser.parse_args()
    from kbert.auto.budget import Estimator
    from kbert.ensembles.ensemble import EnsembleSpec, build_ensemble
    from kbert.pipeline.config import load_competition

    import kbert
    root = Path(kbert.__file__).resolve().parent.parent  # the checkout whose environment runs this
    print(f"# {figures.header(root)} ({root})")
    print("competition | members | chosen | its own nested CV | procedure (choice nested) | outer folds chose | "
          "seconds | interim blend seconds | auto's reserve for it")
    for name in args.competitions:
        members = pd.read_csv(Path(args.runs) / name / "auto" / "leaderboard.csv")["member"].tolist()
        timed = {}
        for repeats in (1, 3):  # kbert auto's interim blend (1 outer split) and its final ensemble (3)
            began = time.perf_counter()
            result = build_ensemble(load_competition(name), EnsembleSpec(",".join(members), seed=42, repeats=repeats),
                                    runs_dir=args.runs, log=lambda _: None)
            timed[repeats] = time.perf_counter() - began
        reserve = Estimator(ensemble_seconds=timed[1] / len(members)).ensemble_estimate(len(members))
        honest = getattr(result, "honest", None)
        chose = "-"
        if honest is not None:
            methods = [blend.method for blend in honest.blends]
            chose = ", ".join(f"{m} {methods.count(m)}" for m in sorted(set(methods)))
        print(f"{name} | {len(members)} | {result.chosen} | {result.results[result.chosen].score:.4f} | "
              f"{'-' if honest is None else f'{honest.score:.4f}'} | {chose} | {timed[3]:.1f} | {timed[1]:.1f} | "
              f"{reserve:.0f}", flush=True)


if __name__ == "__main__":
    main()
