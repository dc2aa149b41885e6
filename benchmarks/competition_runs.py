"""`kbert run` end to end on bundled competitions, as a user runs it: each competition's wall time (the command's,
start to exit), its CV and its output, one competition after another.

    python benchmarks/competition_runs.py titanic spaceship-titanic [--record NAME] [-- EXTRA kbert run FLAGS]

Each run writes to a temporary folder, which its recorded output calls ``runs`` and ``submissions``. The defaults are the competition's YAML and kbert's (5 folds, a from-scratch
encoder), on the CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import figures  # benchmarks/figures.py

ROOT = Path(__file__).resolve().parent.parent


def run(competition: str, extra: list[str], env: dict[str, str] | None = None) -> dict:
    """One ``kbert run`` with ``extra`` flags (and ``env`` added to the environment): its seconds, CV and output."""
    with tempfile.TemporaryDirectory() as out:
        started = time.perf_counter()
        runs, submissions = Path(out) / "runs", Path(out) / "submissions"
        done = subprocess.run([sys.executable, "-m", "kbert.cli", "run", competition, "--no-progress", "--out", runs,
                               "--submissions-dir", submissions, *extra], check=True, cwd=ROOT, capture_output=True,
                              text=True, env={**os.environ, **(env or {})})
        seconds = time.perf_counter() - started
        metrics = json.loads(next(runs.rglob("metrics.json")).read_text())
    output = done.stdout.replace(str(runs), "runs").replace(str(submissions), "submissions")
    return {"competition": competition, "seconds": seconds, "cv": metrics["cv"], "metric": metrics["metric"],
            "folds": len(metrics["folds"]), "output": output}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("competitions", nargs="+")
    figures.add_record_option(parser)
    args, extra = parser.parse_known_args()
    print(figures.header())
    rows = [run(competition, [a for a in extra if a != "--"]) for competition in args.competitions]
    table = []
    for r in rows:
        print(f"{r['competition']:32} {r['seconds']:7.0f} s  {r['metric']} {r['cv']:.4f}  {r['folds']} folds", flush=True)
        table.append([r["competition"], f"{r['seconds']:.0f}", r["metric"], f"{r['cv']:.4f}", r["folds"]])
    if args.record:
        found = {}
        for r in rows:
            key = r["competition"].replace("-", "_")
            found[f"{key}_wall"] = [round(r["seconds"]), "s"]
            found[f"{key}_cv"] = [round(r["cv"], 4), ""]
        figures.record(args.record, figures=found, tables={"runs": {"columns": [
            "competition", "wall s", "metric", "CV", "folds"], "rows": table}},
                       outputs={r["competition"].replace("-", "_"): r["output"] for r in rows})


if __name__ == "__main__":
    main()
