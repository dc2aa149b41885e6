"""The stacker's inner choice of regularisation: kbert's loop (ensembles/blend.py ``regularised``) against
scikit-learn's GridSearchCV with a log-loss scorer, on a binary problem of 10 members' logits, 4 values of C and 5
inner folds, as ``fit_stack`` runs them. Both choose the same C and refit the same coefficients.

    python benchmarks/stack_speed.py --rows 160 7000 --reps 10
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
from sklearn.linear_model import LogisticRegression  # noqa: E402
from sklearn.metrics import log_loss, make_scorer  # noqa: E402
from sklearn.model_selection import GridSearchCV, KFold  # noqa: E402

import figures  # noqa: E402  (benchmarks/figures.py)
from kbert.ensembles import blend  # noqa: E402


def timed(fit, reps: int) -> tuple[float, object]:
    started = time.perf_counter()
    for _ in range(reps):
        model = fit()
    return (time.perf_counter() - started) / reps, model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[160, 7000])
    parser.add_argument("--reps", type=int, default=10)
    figures.add_record_option(parser)
    args = parser.parse_args()
    table = []
    print(figures.header())
    for rows in args.rows:
        rng = np.random.default_rng(0)
        X = rng.normal(size=(rows, 10))
        y = (X[:, :3].sum(axis=1) + rng.normal(size=rows) > 0).astype(int)
        splits = list(KFold(5, shuffle=True, random_state=0).split(X))
        scorer = make_scorer(log_loss, greater_is_better=False, response_method="predict_proba", labels=[0, 1])
        grid, theirs = timed(lambda: GridSearchCV(LogisticRegression(max_iter=2000), {"C": blend.LOGISTIC_C},
                                                  cv=splits, scoring=scorer).fit(X, y), args.reps)
        loop, ours = timed(lambda: blend.regularised(lambda c: LogisticRegression(C=c, max_iter=2000),
                                                     blend.LOGISTIC_C, X, y, splits, blend.model_log_loss), args.reps)
        same = ours.C == theirs.best_params_["C"] and np.array_equal(ours.coef_, theirs.best_estimator_.coef_)
        print(f"{rows:>6} rows: GridSearchCV {grid * 1e3:6.1f} ms, kbert {loop * 1e3:6.1f} ms ({grid / loop:.2f}x); "
              f"same C and coefficients: {same}")
        table.append([rows, f"{grid * 1e3:.1f}", f"{loop * 1e3:.1f}", f"{grid / loop:.2f}", "yes" if same else "no"])
    if args.record:
        figures.record(args.record, figures={f"speedup_{row[0]}": [float(row[3]), "x"] for row in table},
                       tables={"rows": {"columns": ["rows", "GridSearchCV ms", "kbert ms", "ratio",
                                                    "same C and coefficients"], "rows": table}})


if __name__ == "__main__":
    main()
