"""kbert auto's scheduler (kbert/auto/budget.py, kbert/auto/run.py) with fake job durations: estimates come from
the finished jobs, and no job starts that cannot finish inside the limit; and the final ensemble's reserve, timed."""

import json

import numpy as np
import pandas as pd
import pytest

from kbert.auto import run as driver
from kbert.auto.budget import FIXED_SECONDS, PRIOR_RATE, Estimator, encoder_work, fitting_epochs
from kbert.auto.run import AutoOptions, run_auto


def test_rates_come_from_the_finished_jobs_of_the_same_kind_then_family():
    estimator = Estimator()
    assert estimator.estimate("run:bert", 10) == pytest.approx(FIXED_SECONDS + 10 * PRIOR_RATE["run"])
    estimator.record("baseline:hgb", 100_000, FIXED_SECONDS + 5)  # baselines 3x faster than their priors here
    assert estimator.rate("baseline:hgb") == pytest.approx(5 / 100_000)
    assert estimator.rate("baseline:catboost") == pytest.approx(PRIOR_RATE["baseline:catboost"] / 3)
    assert estimator.rate("run:bert") == PRIOR_RATE["run"]  # a GBM's speed says nothing of an encoder's
    estimator.record("run:bert", 10, FIXED_SECONDS + 70)
    assert estimator.rate("run:bert") == pytest.approx(7.0)
    assert estimator.rate("run:minilm-l6") == pytest.approx(7.0)  # 2x the prior, like the measured encoder
    assert estimator.estimate("run:bert", 20) == pytest.approx(FIXED_SECONDS + 140)


def test_epochs_are_lowered_until_the_run_fits_and_a_run_that_cannot_is_skipped():
    estimator = Estimator(ensemble_seconds=1.0)  # the final ensemble: 10 + 3.5 s a member
    estimator.record("run:bert", 1, FIXED_SECONDS + 10)  # 10 s an epoch
    # 400 s left, 2 members: 3% of a 1000 s limit and 20.5 s of ensemble leave 349.5 s: 34 epochs fit, not 35.
    assert fitting_epochs(estimator, "run:bert", 1.0, 50, 400, 2, 1000) == 34
    assert fitting_epochs(estimator, "run:bert", 1.0, 20, 400, 2, 1000) == 20
    assert fitting_epochs(estimator, "run:bert", 1.0, 20, 80, 2, 1000) == 0  # 3 epochs need 33 s + 20.5 + 30


def test_encoder_work_counts_rows_folds_seeds_epochs_tokens_and_size():
    one = encoder_work(rows=1000, test_rows=500, folds=5, seeds=1, epochs=1, tokens=50, layers=2, hidden=128)
    assert one == pytest.approx((800 + (200 + 500) / 3) * 5 * 50 * 2 * 128 ** 2 / 1e9)
    assert encoder_work(1000, 500, 5, 3, 10, 50, 2, 128) == pytest.approx(30 * one)


def test_the_driver_never_starts_a_job_that_cannot_finish(tmp_path, monkeypatch):
    """The real driver on titanic's plan, with a fake clock: every job takes 'true' seconds proportional to its
    work, at rates unknown to the estimator (3x its priors for encoders), and records a metrics.json."""
    clock = {"now": 0.0}
    monkeypatch.setattr(driver.time, "perf_counter", lambda: clock["now"])
    started = []

    def execute(auto, job, settings, work):
        kind, _ = driver.job_work(auto, job, settings)
        true_rate = 3 * PRIOR_RATE["run"] if kind.startswith("run") else PRIOR_RATE.get(kind, 1e-3) / 2
        seconds = FIXED_SECONDS + true_rate * work
        started.append((job.name, clock["now"], seconds, auto.left()))
        clock["now"] += seconds
        folder = auto.comp_dir / job.name
        folder.mkdir(parents=True)
        (folder / "metrics.json").write_text(json.dumps({"cv": 0.8 - 0.01 * len(started), "wall_time_s": seconds,
                                                         "folds": [{"seconds": seconds / 5}] * 5}))
        return work

    monkeypatch.setattr(driver, "execute", execute)
    monkeypatch.setattr(driver, "adversarial", lambda auto: None)
    monkeypatch.setattr(driver, "interim_blend", lambda auto, members: setattr(auto.estimator, "ensemble_seconds",
                                                                              2.0))
    monkeypatch.setattr(driver, "final_ensemble", lambda auto, members: members)
    limit = 900.0
    members = run_auto(AutoOptions("titanic", limit, out_dir=str(tmp_path), submissions_dir=str(tmp_path / "s"),
                                   study_trials=0), log=lambda _: None)
    assert [name for name, *_ in started] == members
    assert members[:2] == ["auto-baseline-hgb", "auto-baseline-logreg"]
    assert "auto-bert-gated" in members  # the first encoder run fits, with its epochs lowered if need be
    for name, at, seconds, left in started:
        assert at + seconds <= limit, name  # each started job finished inside the limit
    # The encoder runs after the first are estimated from it (3x the prior): none was started that could not finish.
    state = json.loads((tmp_path / "titanic" / "auto" / "state.json").read_text())
    assert state["measured"]["run:bert"]
    skipped = [job for job in state["jobs"] if job not in members]
    assert not skipped  # a job is recorded in the state only once it starts
    assert clock["now"] <= limit


def test_the_reserve_from_an_interim_blend_covers_the_final_ensemble(tmp_path):
    """kbert auto keeps, for its final ensemble (3 outer splits, the method choice nested), what its interim blends
    (1 split) measured: 10 s + 3.5 x their seconds a member."""
    import time

    from kbert.ensembles.ensemble import build_ensemble
    from kbert.pipeline.config import BUNDLED_DATA_DIR, load_competition
    from tests.test_ensembles import write_member

    train = pd.read_csv(BUNDLED_DATA_DIR / "titanic" / "train.csv", usecols=["PassengerId", "Survived"])
    test = pd.read_csv(BUNDLED_DATA_DIR / "titanic" / "test.csv", usecols=["PassengerId"])
    rng = np.random.default_rng(3)
    y = train["Survived"].to_numpy()
    for i, noise in enumerate((0.3, 0.35, 0.4, 0.5)):
        oof = np.clip(0.5 + (y - 0.5) * 0.5 + rng.normal(scale=noise, size=len(y)), 0.01, 0.99)
        write_member(tmp_path / "titanic" / f"m{i}", "PassengerId", train["PassengerId"], test["PassengerId"],
                     "Survived", oof, rng.random(len(test)), cv=0.7)
    seconds = {}
    for repeats in (1, 3):
        began = time.perf_counter()
        result = build_ensemble(load_competition("titanic"), "all", "all", str(tmp_path), write=False,
                                repeats=repeats, log=lambda _: None)
        seconds[repeats] = time.perf_counter() - began
    assert len(result.honest.blends) == 15  # the final ensemble chose a method in each of its 15 outer folds
    assert seconds[3] <= Estimator(ensemble_seconds=seconds[1] / 4).ensemble_estimate(4)


def fake_jobs(monkeypatch, seconds_per_job: float) -> None:
    """Every job 'takes' ``seconds_per_job`` on a fake clock and writes a metrics.json; no blend, no drift check."""
    clock = {"now": 0.0}
    monkeypatch.setattr(driver.time, "perf_counter", lambda: clock["now"])

    def execute(auto, job, settings, work):
        clock["now"] += seconds_per_job
        folder = auto.comp_dir / job.name
        folder.mkdir(parents=True)
        (folder / "metrics.json").write_text(json.dumps({"cv": 0.8, "wall_time_s": seconds_per_job}))
        return work

    monkeypatch.setattr(driver, "execute", execute)
    monkeypatch.setattr(driver, "adversarial", lambda auto: None)
    monkeypatch.setattr(driver, "interim_blend", lambda auto, members: None)
    monkeypatch.setattr(driver, "final_ensemble", lambda auto, members: members)


def test_every_skip_names_what_was_tried_and_what_is_kept_back_and_no_message_prints_inf(tmp_path, monkeypatch):
    fake_jobs(monkeypatch, 40.0)
    said = []
    run_auto(AutoOptions("titanic", 150, out_dir=str(tmp_path), submissions_dir=str(tmp_path / "s"), study_trials=2),
             log=said.append)
    skips = [line for line in said if line.startswith("skip ")]
    assert skips and not any("inf" in line for line in said)
    for line in skips:
        if "no encoder fold has been timed" in line or "no finished" in line:
            continue
        assert "final ensemble's reserve ~" in line and "safety margin" in line, line
    assert any(line.startswith("skip auto-bert-gated: even 3 epochs would take") for line in skips)
    assert "skip auto-study: no encoder fold has been timed, so no trial can be estimated" in said


def test_a_state_that_is_not_what_kbert_auto_wrote_is_refused_and_one_auto_runs_per_folder(tmp_path, monkeypatch):
    from kbert.errors import KbertError
    from kbert.io import exclusive_lock

    fake_jobs(monkeypatch, 1.0)
    options = AutoOptions("titanic", 60, out_dir=str(tmp_path), submissions_dir=str(tmp_path / "s"), study_trials=0)
    folder = tmp_path / "titanic" / "auto"
    folder.mkdir(parents=True)
    state = {"competition": "titanic", "preset": "fast", "seed": 42, "spent_s": -3000.0, "jobs": {}, "measured": {}}
    bad = {"spent_s": -3000.0, "measured": {"run:bert": [[1.0, -2.0]]}, "jobs": [], "competition": "house-prices"}
    for key, value in bad.items():
        (folder / "state.json").write_text(json.dumps({**state, "spent_s": 10.0, key: value}))
        with pytest.raises(KbertError, match=f"state.json: .*; delete .* to start this competition's kbert auto over"):
            run_auto(options, log=lambda _: None)
    (folder / "state.json").unlink()
    with exclusive_lock(folder / ".lock", "held by the test"):
        with pytest.raises(KbertError, match="another kbert auto is running on this folder"):
            run_auto(options, log=lambda _: None)
    assert run_auto(options, log=lambda _: None) == []  # the lock went with its holder (and 60 s fit no job)


def test_folds_side_by_side_finish_in_waves():
    from kbert.auto.run import remaining_seconds

    # One at a time: each remaining fold as long as the mean so far (as before).
    assert remaining_seconds(100.0, 2, 3, 1) == pytest.approx(150.0)
    # Five at a time: the first fold done after 47 s leaves one wave for the other four, then one for folds 6-9.
    assert remaining_seconds(47.0, 1, 8, 5) == pytest.approx(94.0)
    assert remaining_seconds(50.0, 5, 4, 5) == pytest.approx(50.0)
    assert remaining_seconds(50.0, 5, 0, 5) == 0.0


@pytest.mark.parametrize("limit,stops", [(230.0, False), (160.0, True)])
def test_a_run_stops_between_folds_only_when_its_remaining_waves_would_not_fit(limit, stops, tmp_path, monkeypatch):
    """Ten folds (5 x 2 seeds) trained five at a time, each 47 s on a fake clock: after the first, the other nine
    need two waves (~94 s), not nine folds' time. With the final ensemble's reserve (10 s + 3.5 x 1 s x 8 members)
    that fits in 230 s and not in 160 s."""
    import types

    import kbert.pipeline.run as pipeline_run
    from kbert.pipeline import fold_processes

    clock = {"now": 0.0}
    monkeypatch.setattr(driver.time, "perf_counter", lambda: clock["now"])
    monkeypatch.setattr(fold_processes, "usable_cores", lambda: 2)  # as kbert run lays out 10 folds on 2 cores
    monkeypatch.setattr(fold_processes, "available_memory", lambda: None)
    finished = []

    def run_competition(config, run_id, progress, log, on_fold):
        for wave in range(2):
            clock["now"] += 47.0
            for step in range(5 * wave, 5 * wave + 5):
                on_fold(step, 0.8)
                finished.append(step)
        return types.SimpleNamespace(run_dir=tmp_path / "none")

    monkeypatch.setattr(pipeline_run, "run_competition", run_competition)
    auto = driver.Auto(AutoOptions("titanic", limit, out_dir=str(tmp_path), submissions_dir=str(tmp_path / "s"),
                                   progress=False), log=lambda _: None)
    auto.load_state()
    auto.estimator.ensemble_seconds = 1.0
    config = auto.run_config({"seeds": 2, "epochs": 1, "fold_processes": 0})
    if stops:
        with pytest.raises(driver.OutOfTime, match=r"9 folds \(5 at a time, ~94s\) would not finish"):
            driver.run_with_deadline(auto, config, "auto-bert", 1.0)
        assert finished == []  # stopped at the first fold's report, between folds
    else:
        driver.run_with_deadline(auto, config, "auto-bert", 1.0)
        assert len(finished) == 10


def test_a_study_counts_the_encoder_folds_at_one_core_each(tmp_path, monkeypatch):
    """Five folds that trained side by side on 2 cores took 56 s each: 22.4 s of one core, as a study's worker
    trains its trial's folds (one after another on its core), not 56 s."""
    from kbert.pipeline import fold_processes

    monkeypatch.setattr(fold_processes, "usable_cores", lambda: 2)
    monkeypatch.setattr(fold_processes, "available_memory", lambda: None)
    auto = driver.Auto(AutoOptions("titanic", 600, out_dir=str(tmp_path), submissions_dir=str(tmp_path / "s"),
                                   progress=False), log=lambda _: None)
    auto.load_state()
    auto.state["jobs"]["auto-bert-gated"] = {"action": "run", "settings": {"epochs": 3}}
    for k in range(5):
        fold = tmp_path / "titanic" / "auto-bert-gated" / "folds" / str(k)
        fold.mkdir(parents=True)
        (fold / "fold.json").write_text(json.dumps({"record": {"seconds": 56.0}}))
    assert driver.one_core_fold_seconds(auto) == pytest.approx([22.4] * 5)
