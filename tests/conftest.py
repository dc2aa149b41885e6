from tests.cores import share_the_cores

share_the_cores()  # before the BLAS is bound and MLX starts its threads (tests/cores.py)

from kbert.models import runtime  # noqa: E402

runtime.setup()  # binds the fast BLAS before any test module imports mlx.core

from pathlib import Path  # noqa: E402

import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from kbert.pipeline.config import BUNDLED_DATA_DIR, load_competition  # noqa: E402


def pytest_addoption(parser):
    parser.addoption("--record-durations", metavar="PATH", help="write each test file's seconds to PATH "
                     "(tests/durations.json orders the files: tests/schedule.py)")


def pytest_configure(config):
    from tests import schedule

    if config.getoption("record_durations") and not hasattr(config, "workerinput"):  # (xdist: its controller)
        config.pluginmanager.register(schedule.Recorder(Path(config.getoption("record_durations"))))
    if hasattr(config.option, "loadscopereorder"):  # pytest-xdist: hand the files out in the collection's order
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(items):
    """The longest test files first (tests/schedule.py); tests that start PostgreSQL (tests/postgres.py, through
    a fixture named ``postgres``) carry its marker."""
    from tests import schedule

    items[:] = schedule.longest_first(items, schedule.file_seconds())
    for item in items:
        if "postgres" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.postgres)


@pytest.fixture(scope="session")
def titanic():
    return load_competition("titanic")


@pytest.fixture(scope="session")
def titanic_train() -> pd.DataFrame:
    return pd.read_csv(BUNDLED_DATA_DIR / "titanic" / "train.csv")


@pytest.fixture(scope="session")
def titanic_test() -> pd.DataFrame:
    return pd.read_csv(BUNDLED_DATA_DIR / "titanic" / "test.csv")


@pytest.fixture(autouse=True)
def folds_in_this_process(request, monkeypatch):
    """In-process runs (and tuning trials) train their folds one after another, as ``--fold-processes 1``, so that
    a test may patch what a fold calls; tests/test_fold_processes.py tests the fold processes themselves, and the
    command-line tests (a `kbert` subprocess) run them as users do."""
    if request.module.__name__.endswith("test_fold_processes"):
        return
    from kbert.pipeline import fold_processes, run

    monkeypatch.setattr(run, "plan_folds", lambda requested, *args, **kwargs: fold_processes.plan_folds(
        1, *args, **kwargs))
