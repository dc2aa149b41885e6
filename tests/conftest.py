import pandas as pd
import pytest

import models  # noqa: F401  (binds the fast BLAS before mlx.core loads)
from pipeline.config import BUNDLED_DATA_DIR, load_competition


@pytest.fixture(scope="session")
def titanic():
    return load_competition("titanic")


@pytest.fixture(scope="session")
def titanic_train() -> pd.DataFrame:
    return pd.read_csv(BUNDLED_DATA_DIR / "titanic" / "train.csv")


@pytest.fixture(scope="session")
def titanic_test() -> pd.DataFrame:
    return pd.read_csv(BUNDLED_DATA_DIR / "titanic" / "test.csv")
