"""Build the derived datasets the head benchmarks train on, from real data only.

- titanic-pclass (multiclass) and house-prices-overallqual (ordinal) read the bundled Kaggle files directly.
- spaceship-spending (multilabel): from the bundled Spaceship Titanic rows, five labels "spent anything on
  RoomService / FoodCourt / ShoppingMall / Spa / VRDeck", predicted from the passenger's other columns.
  Rows with an unknown amount are dropped; the first 3000 labelled rows are kept (to keep the run short).
- elnino (timeseries): monthly Nino 1+2 sea surface temperature 1950-2010 (NOAA ERSST.V3B, public domain,
  shipped with statsmodels as datasets/elnino/elnino.csv). Each row is a 12-month history window and the name
  of the next month; the targets are the next 3 months. The last 24 windows are the test set.

    python benchmarks/heads/make_data.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SPENDING = ["RoomService", "FoodCourt", "ShoppingMall", "Spa", "VRDeck"]
MONTHS = ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"]
WINDOW, HORIZON, TEST_WINDOWS = 12, 3, 24


def spaceship_spending(source: Path, out: Path) -> None:
    features = ["PassengerId", "HomePlanet", "CryoSleep", "Cabin", "Destination", "Age", "VIP"]
    train = pd.read_csv(source / "train.csv")
    train = train.dropna(subset=SPENDING).iloc[:3000]
    labels = {f"spent_{c}": (train[c] > 0).astype(int) for c in SPENDING}
    out.mkdir(parents=True, exist_ok=True)
    pd.concat([train[features], pd.DataFrame(labels)], axis=1).to_csv(out / "train.csv", index=False)
    pd.read_csv(source / "test.csv")[features].to_csv(out / "test.csv", index=False)


def elnino_windows(raw: Path, out: Path) -> None:
    table = pd.read_csv(raw)
    series = table[MONTHS].to_numpy(dtype=float).reshape(-1)
    month_of = np.tile(np.arange(12), len(table))
    rows = []
    for start in range(len(series) - WINDOW - HORIZON + 1):
        history = series[start : start + WINDOW]
        future = series[start + WINDOW : start + WINDOW + HORIZON]
        row = {"id": start, "next_month": MONTHS[month_of[start + WINDOW]]}
        row.update({f"t-{WINDOW - i}": round(v, 2) for i, v in enumerate(history)})
        row.update({f"h{h + 1}": round(v, 2) for h, v in enumerate(future)})
        rows.append(row)
    frame = pd.DataFrame(rows)
    targets = [f"h{h + 1}" for h in range(HORIZON)]
    out.mkdir(parents=True, exist_ok=True)
    frame.iloc[:-TEST_WINDOWS].to_csv(out / "train.csv", index=False)
    frame.iloc[-TEST_WINDOWS:].drop(columns=targets).to_csv(out / "test.csv", index=False)
    frame.iloc[-TEST_WINDOWS:][["id"] + targets].to_csv(out / "test_truth.csv", index=False)


def main() -> None:
    spaceship_spending(ROOT.parent / "shared" / "datasets" / "spaceship-titanic"
                       if not (ROOT / "competitions" / "data" / "spaceship-titanic").is_dir()
                       else ROOT / "competitions" / "data" / "spaceship-titanic", HERE / "data" / "spaceship-spending")
    elnino_windows(HERE / "data" / "elnino" / "elnino.csv", HERE / "data" / "elnino")
    print("wrote", ", ".join(str(p.relative_to(ROOT)) for p in sorted((HERE / "data").glob("*/*.csv"))))


if __name__ == "__main__":
    main()
