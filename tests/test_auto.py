"""`kbert auto` end to end on a small slice of Titanic: every member, the leaderboard, a valid submission; and a
SIGKILL in the middle followed by the same command ends as an uninterrupted run does."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from kbert.auto import AutoOptions, run_auto
from kbert.pipeline.config import BUNDLED_DATA_DIR
from tests.tiny import TINY

pytestmark = pytest.mark.slow  # trains every member of kbert auto twice
OVERRIDES = {**TINY, "epochs": 2}


def small_titanic(folder: Path) -> Path:
    """The first 200 training rows and 100 test rows of Titanic."""
    folder.mkdir(parents=True)
    pd.read_csv(BUNDLED_DATA_DIR / "titanic" / "train.csv").iloc[:200].to_csv(folder / "train.csv", index=False)
    test = pd.read_csv(BUNDLED_DATA_DIR / "titanic" / "test.csv").iloc[:100]
    test.to_csv(folder / "test.csv", index=False)
    sample = pd.read_csv(BUNDLED_DATA_DIR / "titanic" / "gender_submission.csv")
    sample[sample["PassengerId"].isin(test["PassengerId"])].to_csv(folder / "gender_submission.csv", index=False)
    return folder


def options(data: Path, out: Path) -> AutoOptions:
    return AutoOptions("titanic", 1800, data_dir=str(data), out_dir=str(out / "runs"),
                       submissions_dir=str(out / "subs"), progress=False, overrides=OVERRIDES, study_trials=2)


SCRIPT = """
from kbert.models import runtime
runtime.setup()  # as the kbert command does: the same BLAS as this process (the reference BLAS rounds differently)
import sys
from pathlib import Path
from kbert.auto import AutoOptions, run_auto
from tests.test_auto import options
from kbert.pipeline import fold_processes, run
# folds one after another, as tests/conftest.py has the uninterrupted run in the test process train them
run.plan_folds = lambda requested, *args, **kwargs: fold_processes.plan_folds(1, *args, **kwargs)
import kbert.auto.driver
kbert.auto.driver.SEEDED, kbert.auto.driver.MORE_SEEDS = (), 1  # as in the test process
run_auto(options(Path(sys.argv[1]), Path(sys.argv[2])))
"""


def test_auto_runs_every_member_and_resumes_after_sigkill(tmp_path, monkeypatch):
    import kbert.auto.driver

    # Not the seeded baselines that fill a 30-minute limit's time left (tests/test_auto_budget.py has them), and
    # one extra seed of the best encoder run, not three: each costs a member and a blend, twice.
    monkeypatch.setattr(kbert.auto.driver, "SEEDED", ())
    monkeypatch.setattr(kbert.auto.driver, "MORE_SEEDS", 1)
    data = small_titanic(tmp_path / "data")
    said = []
    whole = run_auto(options(data, tmp_path / "whole"), log=said.append)
    board = pd.read_csv(whole.leaderboard)
    assert {"auto-baseline-hgb", "auto-baseline-logreg", "auto-bert-gated", "auto-hgb-emb-best",
            "auto-best-pseudo", "auto-best-seeds", "auto-study/trial-0000", "auto-study/trial-0001"} <= set(
        board["member"])
    assert list(board.columns) == ["member", "kind", "cv", "honest", "seconds", "weight"]
    runs = tmp_path / "whole" / "runs" / "titanic"
    for twin in board.loc[board["honest"].isna(), "member"]:  # a member the blend skipped: another's predictions
        assert any((runs / twin / "oof.csv").read_bytes() == (runs / other / "oof.csv").read_bytes()
                   for other in board["member"] if other != twin), twin
    assert board["honest"].notna().sum() >= len(board) - 1 and whole.report.is_file()
    submission = pd.read_csv(whole.submission)
    assert len(submission) == 100 and set(submission["Survived"]) <= {0, 1}
    # The final blend's record; the submission is its own, or the best member's where picking it scored better.
    final = tmp_path / "whole" / "subs" / "titanic" / f"{kbert.auto.driver.FINAL_BLEND}.json"
    sidecar = json.loads(final.read_text())
    if whole.chosen == sidecar["method"]:
        assert whole.submission.name == f"{kbert.auto.driver.FINAL_BLEND}.csv"
        assert abs(sidecar["honest_cv"] - whole.honest) < 1e-12
    else:
        assert whole.chosen == f"best member ({sidecar['best_member']})" and whole.submission.name == \
            f"{sidecar['best_member']}.csv"
        assert abs(sidecar["best_member_selected_in_nested_cv"] - whole.honest) < 1e-12
    # The pseudo-labelled run's teacher is the best baseline; the extra seeds are of the best encoder run.
    state = json.loads((tmp_path / "whole" / "runs" / "titanic" / "auto" / "state.json").read_text())
    assert state["jobs"]["auto-best-pseudo"]["settings"]["pseudo_label"].startswith("auto-baseline-")
    assert state["jobs"]["auto-best-seeds"]["settings"]["seeds"] == 2
    # A baseline priced again from its first fold keeps the estimate it started on, and says both when done.
    started = next(line for line in said if line.startswith("start auto-baseline-hgb:"))
    estimate = re.match(r"start auto-baseline-hgb: ~(\d+)s estimated", started).group(1)
    assert f"{state['jobs']['auto-baseline-hgb']['estimate_s']:.0f}" == estimate
    assert any(re.match(rf"done auto-baseline-hgb: CV [0-9.]+ in \d+s \(~{estimate}s estimated, ~\d+s from its "
                        r"first fold's [0-9.]+s\)$", line) for line in said), said

    # The same, killed with SIGKILL once the first encoder run has finished a fold, then run again.
    out = tmp_path / "killed"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    process = subprocess.Popen([sys.executable, "-c", SCRIPT, str(data), str(out)], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    marker = out / "runs" / "titanic" / "auto-bert-gated" / "folds" / "0" / "fold.json"
    deadline = time.time() + 600
    while not marker.is_file() and process.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert process.poll() is None, "kbert auto ended before it could be killed"
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert not (out / "runs" / "titanic" / "auto-bert-gated" / "metrics.json").is_file()
    resumed = run_auto(options(data, out), log=lambda _: None)
    again = pd.read_csv(resumed.leaderboard)
    pd.testing.assert_frame_equal(again.drop(columns="seconds"), board.drop(columns="seconds"))
    assert resumed.submission.read_bytes() == whole.submission.read_bytes()

    # Run again once every job is done: the final blend of the same members is kept, not built again; without its
    # record it is built again, to the same bytes.
    record = out / "subs" / "titanic" / final.name
    written = record.stat().st_mtime_ns
    said = []
    kept = run_auto(options(data, out), log=said.append)
    assert any(line.startswith(f"the final blend of these {len(board)} members is kept") for line in said), said
    assert record.stat().st_mtime_ns == written and (kept.chosen, kept.honest) == (resumed.chosen, resumed.honest)
    pd.testing.assert_frame_equal(pd.read_csv(kept.leaderboard).drop(columns="seconds"), board.drop(columns="seconds"))
    record.unlink()
    said = []
    built = run_auto(options(data, out), log=said.append)
    assert not any("is kept" in line for line in said) and built.submission.read_bytes() == whole.submission.read_bytes()
    assert (built.chosen, built.honest) == (whole.chosen, whole.honest)
