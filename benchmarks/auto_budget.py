"""`kbert auto` against its time limit: the share of the limit it spent, and every job's estimate against its
actual time (an encoder run: a fold's epoch, estimated by its probe, against the mean over its folds; a
baseline: its time priced from its first fold, against its wall time), the study apart; with each chosen blend's
honest CV and the members with a non-zero weight.

    python benchmarks/auto_budget.py OUT titanic house-prices-advanced-regression-techniques ... [--run 10m]

With ``--run LIMIT`` each competition is first run as ``kbert auto <c> --time-limit LIMIT --preset fast --out
OUT/<name>/runs`` (one after another: they would slow each other), its wall time taken; without it, the tables
are read from OUT/<name>/runs/<name>/auto/state.json of such runs. A competition may be a YAML path (kbert init).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
import figures  # noqa: E402


def within(estimate: float | None, actual: float | None) -> str:
    """The issue's bar: within 1.5x or 10 s of the estimate."""
    if not estimate or not actual:
        return "-"
    ratio = actual / estimate
    return "yes" if 1 / 1.5 <= ratio <= 1.5 or abs(actual - estimate) <= 10 else "NO"


def table(out: Path, competition: str, wall: float | None) -> None:
    name = Path(competition).stem
    folder = next((out / name / "runs").glob("*/auto"))
    state = json.loads((folder / "state.json").read_text())
    board = pd.read_csv(folder / "leaderboard.csv")
    limit = state["time_limit_s"]
    sidecar = next((out / name / "subs").glob("*/auto-ensemble.json"), None)
    honest = json.loads(sidecar.read_text()).get("honest_cv") if sidecar else None
    spent = wall if wall is not None else state["spent_s"]
    print(f"\n## {name}: {spent:.0f} s of {limit:.0f} s ({spent / limit:.0%}); honest CV of the chosen blend "
          f"{honest if honest is None else f'{honest:.4f}'}")
    weighted = board[board["weight"].fillna(0) != 0]
    print("non-zero weights: " + ", ".join(f"{m} {w:.3f}" for m, w in zip(weighted["member"], weighted["weight"])))
    print("| job | status | form | estimate s | actual s | a fold-epoch: estimate s | actual s | within 1.5x / 10 s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for job, record in state["jobs"].items():
        run = record["action"] == "run"
        estimate, actual = ((record.get("epoch_estimate_s"), record.get("epoch_seconds")) if run else
                            (record.get("estimate_s"), record.get("seconds")))

        def cell(value):
            return "-" if value is None else f"{value:.1f}"

        print(f"| {job} | {record['status']} | {record.get('form') or record.get('error') or ''} | "
              f"{cell(record.get('estimate_s'))} | {cell(record.get('seconds'))} | "
              f"{cell(record.get('epoch_estimate_s')) if run else '-'} | {cell(record.get('epoch_seconds')) if run else '-'} "
              f"| {within(estimate, actual) if record['status'] == 'done' else '-'} |")
    trials = board[board["kind"] == "trial"]
    if len(trials):
        print(f"study (runs to its deadline, reported apart): {len(trials)} trials joined, "
              f"{trials['seconds'].sum():.0f} s in all")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("competitions", nargs="+")
    parser.add_argument("--run", metavar="LIMIT", help="run kbert auto first with this --time-limit")
    args = parser.parse_args()
    print(f"# {figures.header()}")
    for competition in args.competitions:
        name, wall = Path(competition).stem, None
        if args.run:
            began = time.perf_counter()
            subprocess.run(["kbert", "auto", competition, "--time-limit", args.run, "--preset", "fast", "--out",
                            str(args.out / name / "runs"), "--submissions-dir", str(args.out / name / "subs"),
                            "--no-progress"], check=True, stdout=subprocess.DEVNULL)
            wall = time.perf_counter() - began
        table(args.out, competition, wall)


if __name__ == "__main__":
    main()
