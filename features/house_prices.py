"""House Prices: the sums and differences a valuer would compute, and quality codes as words.

Pure functions of each row's own columns (no statistics, so nothing to fit and nothing to leak).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

# data_description.txt: Ex Excellent, Gd Good, TA Typical/Average, Fa Fair, Po Poor.
QUALITY_CODE_WORDS = {"Ex": "excellent", "Gd": "good", "TA": "typical", "Fa": "fair", "Po": "poor"}
QUALITY_CODE_COLUMNS = ("ExterQual", "ExterCond", "BsmtQual", "BsmtCond", "HeatingQC", "KitchenQual",
                        "FireplaceQu", "GarageQual", "GarageCond", "PoolQC")
# OverallQual / OverallCond: 10 Very Excellent ... 1 Very Poor.
RATING_WORDS = {10: "very excellent", 9: "excellent", 8: "very good", 7: "good", 6: "above average",
                5: "average", 4: "below average", 3: "fair", 2: "poor", 1: "very poor"}


def add_features(rows: pd.DataFrame) -> pd.DataFrame:
    """TotalSF, TotalBaths, AgeAtSale, YearsSinceRemodel, OverallQualWords, OverallCondWords and the
    Ex/Gd/TA/Fa/Po quality columns as words (missing stays missing: "no basement" is not "poor")."""
    rows = rows.copy()
    rows["TotalSF"] = rows[["TotalBsmtSF", "1stFlrSF", "2ndFlrSF"]].fillna(0).sum(axis=1)
    rows["TotalBaths"] = (rows["FullBath"] + 0.5 * rows["HalfBath"]
                          + rows["BsmtFullBath"].fillna(0) + 0.5 * rows["BsmtHalfBath"].fillna(0))
    rows["AgeAtSale"] = (rows["YrSold"] - rows["YearBuilt"]).clip(lower=0)
    rows["YearsSinceRemodel"] = (rows["YrSold"] - rows["YearRemodAdd"]).clip(lower=0)
    rows["OverallQualWords"] = rows["OverallQual"].map(RATING_WORDS).astype(object)
    rows["OverallCondWords"] = rows["OverallCond"].map(RATING_WORDS).astype(object)
    for column in QUALITY_CODE_COLUMNS:
        rows[column] = rows[column].map(QUALITY_CODE_WORDS).where(rows[column].notna(), np.nan).astype(object)
    return rows
