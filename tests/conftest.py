from kbert.models import runtime

runtime.setup()  # binds the fast BLAS before any test module imports mlx.core

import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from kbert.pipeline.config import BUNDLED_DATA_DIR, load_competition  # noqa: E402


@pytest.fixture(scope="session")
def titanic():
    return load_competition("titanic")


@pytest.fixture(scope="session")
def titanic_train() -> pd.DataFrame:
    return pd.read_csv(BUNDLED_DATA_DIR / "titanic" / "train.csv")


@pytest.fixture(scope="session")
def titanic_test() -> pd.DataFrame:
    return pd.read_csv(BUNDLED_DATA_DIR / "titanic" / "test.csv")
