"""Train every head end to end through `kbert run` on real data and compare each CV with its trivial baseline.

    python benchmarks/heads/make_data.py            # once: builds the derived datasets
    python benchmarks/heads/run_all.py [--only NAME ...] [--out /tmp/heads]

Baselines use the run's own folds, fitted on each training fold: the majority class (binary, multiclass,
ordinal), constant label prevalence (multilabel), the mean of log price (regression on rmse_log) and the
last observed value for every horizon (timeseries).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))

from kbert.pipeline.config import load_competition  # noqa: E402
from kbert.pipeline.data import load_competition_data  # noqa: E402
from kbert.pipeline.splits import fold_rows  # noqa: E402
from kbert.pipeline.metrics import get_metric  # noqa: E402

RUNS = {  # name -> competition (a bundled name or a YAML path)
    "binary": "titanic",
    "multiclass": str(HERE / "titanic-pclass.yaml"),
    "multilabel": str(HERE / "spaceship-spending.yaml"),
    "regression": "house-prices-advanced-regression-techniques",
    "ordinal": str(HERE / "house-prices-overallqual.yaml"),
    "timeseries": str(HERE / "elnino.yaml"),
}


def baseline_predictions(task: str, train: pd.DataFrame, targets: list[str], train_rows: np.ndarray,
                         valid_rows: np.ndarray, metric_name: str) -> tuple[np.ndarray, np.ndarray]:
    """(truth, prediction) for the valid rows, in the form the metric scores."""
    y = train[targets[0]] if len(targets) == 1 else train[targets]
    if task in ("binary", "multiclass", "ordinal"):
        majority = y.iloc[train_rows].mode().iloc[0]
        return y.iloc[valid_rows].to_numpy(), np.full(len(valid_rows), majority)
    if task == "multilabel":
        prevalence = y.iloc[train_rows].mean().to_numpy()
        return y.iloc[valid_rows].to_numpy(), np.tile(prevalence, (len(valid_rows), 1))
    if task == "regression":
        center = np.log(y.iloc[train_rows]).mean() if metric_name == "rmse_log" else y.iloc[train_rows].mean()
        value = np.exp(center) if metric_name == "rmse_log" else center
        return y.iloc[valid_rows].to_numpy(), np.full(len(valid_rows), value)
    last = train["t-1"].to_numpy()[valid_rows]  # timeseries: the last observed value for every horizon
    return y.iloc[valid_rows].to_numpy(), np.repeat(last[:, None], len(targets), axis=1)


def baseline_cv(competition: str, run_dir: Path) -> float:
    comp = load_competition(competition)
    train = load_competition_data(comp).train
    folds = pd.read_csv(run_dir / "folds.csv")["fold"].to_numpy()
    metric = get_metric(comp.metric)
    truth, predicted = [], []
    for k in np.unique(folds[folds >= 0]):  # time series: the first block (-1) is never validated
        t, p = baseline_predictions(comp.task, train, comp.target_columns, *fold_rows(folds, k, comp.folds),
                                    comp.metric)
        truth.append(t)
        predicted.append(p)
    truth, predicted = np.concatenate(truth), np.concatenate(predicted)
    if comp.task == "multilabel" and metric.kind == "label":
        predicted = (predicted >= 0.5).astype(int)
    return metric(truth, predicted)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", choices=sorted(RUNS), help="run only these heads")
    parser.add_argument("--out", default="/tmp/kbert-heads", help="runs and submissions go here")
    parser.add_argument("--skip-existing", action="store_true", help="reuse a finished run in --out")
    args = parser.parse_args()
    out = Path(args.out)
    rows = []
    for head in args.only or list(RUNS):
        competition = RUNS[head]
        comp = load_competition(competition)
        run_dir = out / "runs" / comp.name / f"heads-{head}"
        if not (args.skip_existing and (run_dir / "metrics.json").exists()):
            subprocess.run([sys.executable, "-m", "kbert.cli", "run", competition, "--no-progress",
                            "--run-id", f"heads-{head}", "--out", str(out / "runs"),
                            "--submissions-dir", str(out / "submissions")], check=True, cwd=ROOT)
        metrics = json.loads((run_dir / "metrics.json").read_text())
        rows.append((head, comp.name, comp.metric, metrics["cv"], baseline_cv(competition, run_dir),
                     metrics["greater_is_better"], metrics["wall_time_s"]))
    print(f"\n{'head':11} {'data':45} {'metric':9} {'kbert CV':>9} {'baseline':>9}  beats  seconds")
    for head, name, metric, cv, base, greater, seconds in rows:
        beats = cv > base if greater else cv < base
        print(f"{head:11} {name:45} {metric:9} {cv:9.4f} {base:9.4f}  {'yes' if beats else 'NO':5}  {seconds:7.0f}")


if __name__ == "__main__":
    main()
