"""Spaceship Titanic: the facts hidden inside Cabin, PassengerId and the five spending columns.

Everything here is a pure function of the feature columns (never the target). Group size counts the
passengers of train and test together that share a travel group; groups never span the two files.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

SPEND_COLUMNS = ("RoomService", "FoodCourt", "ShoppingMall", "Spa", "VRDeck")
SIDE_WORDS = {"P": "port", "S": "starboard"}


def add_features(rows: pd.DataFrame) -> pd.DataFrame:
    """CabinDeck, CabinNumber, CabinSide, GroupSize, TotalSpend and NoSpending."""
    rows = rows.copy()
    cabin = rows["Cabin"].astype(object).str.split("/", expand=True).reindex(columns=range(3))
    rows["CabinDeck"] = cabin[0]
    rows["CabinNumber"] = pd.to_numeric(cabin[1], errors="coerce").astype(float)
    rows["CabinSide"] = cabin[2].map(SIDE_WORDS)
    group = rows["PassengerId"].astype(str).str.split("_").str[0]
    rows["GroupSize"] = group.map(group.value_counts()).astype(int)
    spend = rows[list(SPEND_COLUMNS)]
    rows["TotalSpend"] = spend.sum(axis=1, min_count=1)  # NaN only when every spending column is missing
    rows["NoSpending"] = rows["TotalSpend"].map(lambda total: np.nan if pd.isna(total) else
                                                "yes" if total == 0 else "no").astype(object)
    return rows
