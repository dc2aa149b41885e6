"""`kbert run --profile` (pipeline/profile.py): the run's wall time split by stage and fold, printed and saved."""

import json
import time

import pytest

from kbert.pipeline.profile import STAGES, profiling, set_part, stage, step_stage
from tests.test_cli import SMOKE, kbert


def test_stages_add_up_per_part_and_the_first_call_of_a_shape_is_tracing():
    with profiling() as profile:
        with stage("data and text preparation"):
            time.sleep(0.02)
        set_part("fold 1/2")
        kinds = [step_stage("training steps", shape) for shape in [(32, 64), (32, 64), (32, 80), (32, 64)]]
        for name in kinds:
            with stage(name):
                time.sleep(0.005)
        set_part("fold 2/2")  # a new fold compiles its steps again
        assert step_stage("training steps", (32, 64)) == "tracing"
    assert kinds == ["tracing", "training steps", "tracing", "training steps"]
    summary = profile.to_dict()
    assert summary["parts"]["run"]["data and text preparation"] >= 0.02
    fold = summary["parts"]["fold 1/2"]
    assert fold["tracing"] >= 0.01 and fold["training steps"] >= 0.01
    assert summary["wall_s"] >= sum(summary["stages_s"].values()) >= 0.04
    with stage("training steps"):  # outside profiling(): nothing recorded, nothing raised
        pass
    assert step_stage("evaluation", (1, 2)) == "evaluation"


@pytest.mark.slow
@pytest.mark.parametrize("processes", ["1", "0"])  # one after another; side by side in fold processes
def test_kbert_run_profile_prints_and_writes_every_stage_per_fold(tmp_path, processes):
    result = kbert("run", "titanic", *SMOKE, "--run-id", "p", "--out", "runs", "--profile", "--fold-processes",
                   processes, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "profile (s)" in result.stdout and "fold 2/2" in result.stdout.split("profile (s)")[1]
    saved = json.loads((tmp_path / "runs" / "titanic" / "p" / "profile.json").read_text())
    assert set(saved["stages_s"]) == set(STAGES)
    for fold in ("fold 1/2", "fold 2/2"):
        stages = saved["parts"][fold]
        for name in ("data and text preparation", "tokenization", "batching", "tracing", "training steps",
                     "evaluation", "artifact writing"):
            assert stages.get(name, 0) > 0, (fold, name)
    if processes == "1":
        assert 0 <= saved["other_s"] < saved["wall_s"]
    else:  # the folds' stage times overlap: no time is left "outside" them
        assert saved["other_s"] is None and "side by side" in result.stdout
