"""kbert auto's scheduler (kbert/auto/budget.py, kbert/auto/driver.py) with fake job durations and fake probes:
estimates come from probes and finished jobs, a run is shrunk before it is skipped, and no job starts that cannot
finish inside the limit; the final ensemble's reserve, timed; the state, checked when read."""

import dataclasses
import json
import time
from pathlib import Path

import numpy as np
import pytest

from kbert.auto import driver as driver
from kbert.auto.budget import FIXED_SECONDS, PRIOR_RATE, Estimator
from kbert.auto.driver import AutoOptions, run_auto
from kbert.auto.state import JobState, Status
from kbert.pipeline import artifacts
from kbert.pipeline.artifacts import CLOCK_FILE
from kbert.pipeline.probe import RunProbe


def fake_probe(epoch_seconds: float, max_length: int = 64, startup: float = 5.0) -> RunProbe:
    """A probe whose run takes ``startup`` + epochs x ``epoch_seconds`` (five folds side by side, one wave)."""
    return RunProbe(at_once=5, folds=5, startup_s=startup, prep_s=0.0, train_step_s=epoch_seconds / 10,
                    eval_batch_s=0.0, trace_s=0.0, steps_per_epoch=10, valid_batches=0, test_batches=0, shapes=0,
                    lengths={"p50": max_length // 4, "p75": max_length // 2, "p90": 3 * max_length // 4,
                             "p95": max_length - 1, "max": max_length, "kept_p75": 0.5, "kept_p90": 0.75},
                    seconds=1.0)


def probe_by_length(monkeypatch, seconds_per_token: float) -> list[int]:
    """Probes priced by max length (an epoch: ``seconds_per_token`` x max length); the lengths probed, in order."""
    import kbert.pipeline.probe as probe

    probed = []

    def probe_run(config, log=None):
        probed.append(config.train.max_length)
        return fake_probe(seconds_per_token * config.train.max_length, max_length=64)

    monkeypatch.setattr(probe, "probe_run", probe_run)
    return probed


def test_baseline_rates_come_from_the_finished_baselines_and_runs_are_corrected_by_their_own():
    estimator = Estimator()
    assert estimator.estimate("baseline:hgb", 10) == pytest.approx(FIXED_SECONDS + 10 * PRIOR_RATE["baseline:hgb"])
    estimator.record("baseline:hgb", 100_000, FIXED_SECONDS + 5)  # baselines 3x faster than their priors here
    assert estimator.rate("baseline:hgb") == pytest.approx(5 / 100_000)
    assert estimator.rate("baseline:catboost") == pytest.approx(PRIOR_RATE["baseline:catboost"] / 3)
    assert estimator.correction("bert") == 1.0  # no encoder run measured: the probe as it is
    estimator.record_run("bert", 20.0, 10.0)
    estimator.record_run("bert", 5.0, 10.0)
    assert estimator.correction("bert") == pytest.approx(1.0)  # the geometric mean of 2 and 1/2
    estimator.record_run("minilm-l6", 30.0, 10.0)
    assert estimator.correction("minilm-l6") == pytest.approx(3.0)
    assert estimator.correction("electra") == pytest.approx((2 * 0.5 * 3) ** (1 / 3))  # every encoder's


def test_a_run_is_shrunk_epochs_first_then_max_length_and_skipped_only_when_no_form_fits(tmp_path, monkeypatch):
    probed = probe_by_length(monkeypatch, 0.5)  # an epoch: 32 s at max length 64, 24 s at 48, 16 s at 32
    said = []
    auto = driver.Auto(AutoOptions("titanic", 1000, out_dir=str(tmp_path), submissions_dir=str(tmp_path / "s"),
                                   progress=False), log=said.append)
    auto.load_state()
    auto.estimator.ensemble_seconds = 1.0  # the final ensemble: 10 + 3.5 s a member
    job = driver.Job("auto-bert", "run", {"epochs": 10, "patience": 3, "max_length": 64})
    auto.started -= 1000 - 400  # 400 s left: 3% of 1000 s and 20.5 s of ensemble (2 members) leave 349.5 s
    form = driver.plan_run(auto, job, job.settings, 2)
    assert form.settings["epochs"] == 10 and form.estimate_s == pytest.approx(5 + 320)
    auto.started -= 150  # 250 s left, 199.5 s free: 6 epochs of 32 s (197 s)
    form = driver.plan_run(auto, job, job.settings, 2)
    assert form.settings["epochs"] == 6 and "shrunk to fit" in form.words
    # 86.5 s left, 36 s free: 2 epochs need 69 s at 64 tokens; scaled by the tokens they keep, ~52 s at 48 (the
    # 90th percentile: not probed) and ~34.5 s at 32 (the 75th: probed, 37 s).
    auto.started -= 163.5
    assert probed[-1] == 64
    said.clear()
    assert driver.plan_run(auto, job, job.settings, 2) is None
    assert probed[-2:] == [64, 32]
    skip = said[-1]
    assert skip.startswith("skip auto-bert: no form fits (2 epochs at max length 64 ~69s; 2 epochs at max length "
                           "32 ~37s)"), skip
    assert "final ensemble's reserve ~20s" in skip and "safety margin" in skip
    assert auto.state.jobs["auto-bert"].status is Status.SKIPPED
    # Under half the least form probed so far (37 s) free: not even probed.
    auto.started -= 20
    assert driver.plan_run(auto, job, job.settings, 2) is None and probed[-2:] == [64, 32]
    assert said[-1].startswith("skip auto-bert: no form fits (not probed: the least form of bert probed so far "
                               "needs ~37s)"), said[-1]


def test_the_strongest_pretrained_encoder_that_fits_is_fine_tuned_and_the_words_say_why(tmp_path, monkeypatch):
    import kbert.pipeline.probe as probe
    from kbert.auto.plan import ENCODER_STRENGTH, STRONGEST_FITTING, Facts, plan_jobs

    facts = Facts("binary", has_columns=False, free_text=True, pretrained=frozenset(ENCODER_STRENGTH))
    job = next(job for job in plan_jobs("fast", facts) if job.settings.get("encoder") == STRONGEST_FITTING)
    strengths = [ENCODER_STRENGTH[name] for name in job.encoders]
    assert set(job.encoders) == set(ENCODER_STRENGTH) and strengths == sorted(strengths, reverse=True)
    assert not any(j.settings.get("encoder") == STRONGEST_FITTING
                   for j in plan_jobs("fast", dataclasses.replace(facts, free_text=False)))
    job = dataclasses.replace(job, encoders=("big", "small"))  # "big" is 10x slower than "small"
    probed = []

    def probe_run(config, log=None):
        probed.append(config.model.encoder)
        return fake_probe(100.0 if config.model.encoder == "big" else 10.0)

    from kbert.pipeline.config import load_competition, resolve_run_config

    base = resolve_run_config(load_competition("titanic"), {"max_length": 64})
    monkeypatch.setattr(probe, "probe_run", probe_run)
    monkeypatch.setattr(driver.Auto, "run_config", lambda auto, settings: dataclasses.replace(  # names, not folders
        base, model=dataclasses.replace(base.model, encoder=settings["encoder"]),
        train=dataclasses.replace(base.train, epochs=settings["epochs"], max_length=settings.get("max_length", 64))))
    said = []
    auto = driver.Auto(AutoOptions("titanic", 1000, out_dir=str(tmp_path), submissions_dir=str(tmp_path / "s"),
                                   progress=False), log=said.append)
    auto.load_state()
    auto.estimator.ensemble_seconds = 1.0
    settings = {**job.settings, "epochs": 4}
    auto.started -= 1000 - 400  # 349.5 s free: "big" needs 205 s for 2 epochs: it fits at 3 epochs
    form = driver.plan_run(auto, job, settings, 2)
    assert form.settings["encoder"] == "big" and form.settings["epochs"] == 3
    assert form.words.startswith("big, the strongest pretrained encoder that fits: 3 epochs"), form.words
    auto.started -= 200  # 149.5 s free: "big" fits in no form, "small" in 4 epochs (45 s)
    form = driver.plan_run(auto, job, settings, 2)
    assert form.settings["encoder"] == "small" and form.settings["epochs"] == 4
    assert form.words.startswith("small, the strongest pretrained encoder that fits (big: 2 epochs at max length "
                                 "64 ~205s"), form.words
    assert probed == ["big", "big", "big", "small"]  # at 64 tokens, then its 90th and 75th percentiles' lengths
    auto.started -= 145  # 4.5 s free: neither is probed again, and the skip names both
    assert driver.plan_run(auto, job, settings, 2) is None
    assert said[-1].startswith("skip auto-finetune: no form fits (big: not probed"), said[-1]
    assert "; small: " in said[-1]


def test_mpnets_top_blocks_are_a_second_fine_tuned_member_on_free_text_where_its_package_is_installed(
        tmp_path, monkeypatch):
    from kbert.auto.plan import TOP_LAYERS_MEMBER, Facts, plan_jobs

    encoder, settings = TOP_LAYERS_MEMBER
    facts = Facts("binary", has_columns=False, free_text=True, pretrained=frozenset({"minilm-l6", encoder}))
    names = [job.name for job in plan_jobs("fast", facts)]
    assert names.index("auto-finetune-top") == names.index("auto-finetune") + 1  # after the stronger-per-second one
    job = next(job for job in plan_jobs("fast", facts) if job.name == "auto-finetune-top")
    assert job.settings == {"patience": 3, "seed": 42, **settings, "encoder": encoder} and settings["train_top_layers"]
    assert job.why == "mpnet-base's top 4 blocks on its frozen blocks' states, a second fine-tuned member"
    from kbert.pipeline.config import load_competition, resolve_run_config

    config = resolve_run_config(load_competition("nlp-getting-started"), job.settings)  # settings a run accepts
    assert config.model.frozen_states and config.model.train_top_layers == 4
    for other in (dataclasses.replace(facts, free_text=False), dataclasses.replace(facts, pretrained=frozenset())):
        assert "auto-finetune-top" not in [job.name for job in plan_jobs("fast", other)]
    probe_by_length(monkeypatch, 0.5)
    auto = driver.Auto(AutoOptions("titanic", 1000, out_dir=str(tmp_path), submissions_dir=str(tmp_path / "s"),
                                   progress=False), log=lambda _: None)
    auto.load_state()
    auto.estimator.ensemble_seconds = 1.0
    base = resolve_run_config(load_competition("titanic"), {"max_length": 64})  # (priced by a fake probe)
    monkeypatch.setattr(driver.Auto, "run_config", lambda auto, settings: dataclasses.replace(
        base, train=dataclasses.replace(base.train, epochs=settings["epochs"])))
    form = driver.plan_run(auto, job, job.settings, 2)
    assert form.words == f"{job.why}: 3 epochs, max length 64", form.words


def test_shorter_lengths_are_probed_only_when_they_cut_enough_and_a_refused_probe_fails_that_job_alone(
        tmp_path, monkeypatch):
    import kbert.pipeline.probe as probe
    from kbert.errors import KbertError
    from kbert.pipeline.probe import kept_tokens

    assert kept_tokens(np.array([10, 20, 100]), 20, 100) == pytest.approx(50 / 130, abs=1e-4)
    probed, said = [], []

    def probe_run(config, log=None):  # the 90th and 75th percentiles keep 95% and 90% of the tokens: not worth it
        probed.append(config.train.max_length)
        found = fake_probe(40.0)
        return dataclasses.replace(found, lengths={**found.lengths, "kept_p90": 0.95, "kept_p75": 0.9})

    monkeypatch.setattr(probe, "probe_run", probe_run)
    auto = driver.Auto(AutoOptions("titanic", 180, out_dir=str(tmp_path), submissions_dir=str(tmp_path / "s"),
                                   progress=False), log=said.append)
    auto.load_state()
    job = driver.Job("auto-bert", "run", {"epochs": 10, "patience": 3})
    assert driver.plan_run(auto, job, job.settings, 2) is None and len(probed) == 1
    assert said[-1].startswith("skip auto-bert: no form fits (2 epochs at max length 96 ~85s)"), said[-1]

    def refused(config, log=None):
        raise KbertError("fold 1/5: too few rows")

    monkeypatch.setattr(probe, "probe_run", refused)
    assert not driver.run_job(auto, driver.Job("auto-bert-2", "run", job.settings), job.settings, 2)
    assert said[-1] == "failed auto-bert-2: fold 1/5: too few rows"
    assert auto.state.jobs["auto-bert-2"].status is Status.FAILED


def fake_execute(clock: dict, started: list, true_epoch: float, true_baseline: float):
    """Every job 'takes' its time on the fake clock: an encoder run ``true_epoch`` a fold-epoch, a baseline
    ``true_baseline``; each writes a metrics.json (and a run, its folds' records)."""
    def execute(auto, job, record, members):
        epochs = record.settings.get("epochs", 0)
        seconds = 5 + epochs * true_epoch if job.action == "run" else true_baseline
        started.append((job.name, clock["now"], seconds, auto.left()))
        clock["now"] += seconds
        folder = auto.comp_dir / job.name
        folder.mkdir(parents=True)
        (folder / "metrics.json").write_text(json.dumps({"cv": 0.8 - 0.01 * len(started), "wall_time_s": seconds}))
        for k in range(5 if job.action == "run" else 0):
            (folder / "folds" / str(k)).mkdir(parents=True)
            (folder / "folds" / str(k) / "fold.json").write_text(json.dumps({"record": {"seconds": epochs * true_epoch}}))
            (folder / "folds" / str(k) / "history.json").write_text(json.dumps([{}] * epochs))
    return execute


def test_the_driver_never_starts_a_job_that_cannot_finish(tmp_path, monkeypatch):
    """The real driver on titanic's plan, with a fake clock: encoder runs take 1.5x what their probes say (the
    first run's correction prices the later ones), baselines what the priors say."""
    clock = {"now": 0.0}
    monkeypatch.setattr(driver.time, "perf_counter", lambda: clock["now"])
    probe_by_length(monkeypatch, 0.5)  # 32 s a fold-epoch at the default max length 64
    started = []
    monkeypatch.setattr(driver, "execute", fake_execute(clock, started, true_epoch=48.0, true_baseline=4.0))
    monkeypatch.setattr(driver, "adversarial", lambda auto: None)
    monkeypatch.setattr(driver, "interim_blend", lambda auto, members: setattr(auto.estimator, "ensemble_seconds",
                                                                              2.0))
    monkeypatch.setattr(driver, "final_ensemble", lambda auto, members: members)
    limit = 1500.0
    members = run_auto(AutoOptions("titanic", limit, out_dir=str(tmp_path), submissions_dir=str(tmp_path / "s"),
                                   study_trials=0, overrides={"max_length": 64}), log=lambda _: None)
    assert [name for name, *_ in started] == members
    assert members[:2] == ["auto-baseline-hgb", "auto-baseline-logreg"]
    assert "auto-bert-gated" in members
    for name, at, seconds, left in started:
        assert at + seconds <= limit, name  # each started job finished inside the limit
    state = json.loads((tmp_path / "titanic" / "auto" / "state.json").read_text())
    assert state["corrections"]["bert"][0] == pytest.approx(1.5)
    later = [state["jobs"][name] for name in members[members.index("auto-bert-gated") + 1:]
             if state["jobs"][name]["action"] == "run"]
    assert later and all(job["epoch_estimate_s"] == pytest.approx(48.0) for job in later)  # corrected by 1.5
    assert all(job["epoch_seconds"] == pytest.approx(48.0) for job in later)
    assert clock["now"] <= limit


@pytest.mark.slow
def test_the_reserve_from_an_interim_blend_covers_the_final_ensemble(tmp_path):
    """kbert auto keeps, for its final ensemble (3 outer splits, the method choice nested), what its interim blends
    (1 split) measured: 10 s + 3.5 x their seconds a member."""
    import time

    from kbert.ensembles.ensemble import EnsembleSpec, build_ensemble
    from kbert.pipeline.config import load_competition
    from tests.test_ensembles import expected_for, write_member

    expected = expected_for("titanic")
    rng = np.random.default_rng(3)
    y = expected.truth
    for i, noise in enumerate((0.3, 0.35, 0.4, 0.5)):
        oof = np.clip(0.5 + (y - 0.5) * 0.5 + rng.normal(scale=noise, size=len(y)), 0.01, 0.99)
        write_member(tmp_path / "titanic" / f"m{i}", expected, oof, rng.random(len(expected.test_ids)))
    seconds = {}
    for repeats in (1, 3):
        began = time.perf_counter()
        result = build_ensemble(load_competition("titanic"), EnsembleSpec(repeats=repeats), runs_dir=str(tmp_path),
                                log=lambda _: None)
        seconds[repeats] = time.perf_counter() - began
    assert len(result.honest.blends) == 15  # the final ensemble chose a method in each of its 15 outer folds
    assert seconds[3] <= Estimator(ensemble_seconds=seconds[1] / 4).ensemble_estimate(4)


def fake_jobs(monkeypatch, seconds_per_job: float) -> None:
    """Every job 'takes' ``seconds_per_job`` on a fake clock and writes a metrics.json; every probe says 40 s a
    fold-epoch; no blend, no drift check."""
    clock = {"now": 0.0}
    monkeypatch.setattr(driver.time, "perf_counter", lambda: clock["now"])
    import kbert.pipeline.probe as probe

    monkeypatch.setattr(probe, "probe_run", lambda config, log=None: fake_probe(40.0))

    def execute(auto, job, record, members):
        clock["now"] += seconds_per_job
        folder = auto.comp_dir / job.name
        folder.mkdir(parents=True)
        (folder / "metrics.json").write_text(json.dumps({"cv": 0.8, "wall_time_s": seconds_per_job}))

    monkeypatch.setattr(driver, "execute", execute)
    monkeypatch.setattr(driver, "adversarial", lambda auto: None)
    monkeypatch.setattr(driver, "interim_blend", lambda auto, members: None)
    monkeypatch.setattr(driver, "final_ensemble", lambda auto, members: members)
    monkeypatch.setattr(driver, "check_kept_members", lambda auto: None)  # its members are no more than a CV


def test_every_skip_names_what_was_tried_and_what_is_kept_back_and_no_message_prints_inf(tmp_path, monkeypatch):
    fake_jobs(monkeypatch, 40.0)
    said = []
    options = AutoOptions("titanic", 150, out_dir=str(tmp_path), submissions_dir=str(tmp_path / "s"), study_trials=2)
    run_auto(options, log=said.append)
    skips = [line for line in said if line.startswith("skip ")]
    assert skips and not any("inf" in line for line in said)
    for line in skips:
        if "no encoder fold has been timed" in line or "no finished" in line:
            continue
        assert "final ensemble's reserve ~" in line and "safety margin" in line, line
    assert any(line.startswith("skip auto-bert-gated: no form fits (2 epochs at max length") for line in skips)
    assert "skip auto-study: no encoder fold has been timed, so no trial can be estimated" in said
    # The plan's decisions are kept: a rerun under the same limit does not try the skipped run again.
    said.clear()
    run_auto(options, log=said.append)
    assert any(line.startswith("skip auto-bert-gated: skipped before under this time limit (no form fits")
               for line in said), said


def test_a_limit_shorter_than_the_ensembles_reserve_still_runs_the_first_member(tmp_path, monkeypatch):
    """One member is not blended, so nothing is kept back for it: under a limit shorter than the final ensemble's
    prior the first job that fits runs (the result is its submission), and the next waits for a timed blend."""
    assert Estimator().ensemble_estimate(1) == 0.0 < Estimator().ensemble_estimate(2)
    fake_jobs(monkeypatch, 3.0)
    said = []
    members = run_auto(AutoOptions("titanic", 60, out_dir=str(tmp_path), submissions_dir=str(tmp_path / "s")),
                       log=said.append)
    assert members == ["auto-baseline-hgb"], said


def test_the_time_no_encoder_run_fits_goes_to_the_seeded_baselines_best_first_while_one_fits(tmp_path, monkeypatch):
    """After the study: the best encoder configuration's least form (2 epochs of 60 s) does not fit in the 58 s
    free, so the time goes to CatBoost and HGB again with other seeds, the better CV first, round by round, each
    10 s, until none fits; logistic regression (no randomness) gets none."""
    fake_jobs(monkeypatch, 10.0)
    import kbert.pipeline.probe as probe

    monkeypatch.setattr(probe, "probe_run", lambda config, log=None: fake_probe(60.0))
    said = []
    auto = driver.Auto(AutoOptions("titanic", 70, out_dir=str(tmp_path), submissions_dir=str(tmp_path / "s")),
                       log=said.append)
    auto.load_state()
    auto.estimator.ensemble_seconds = 0.0  # the final ensemble's reserve: 10 s
    members = {"auto-baseline-hgb": 0.80, "auto-baseline-logreg": 0.84, "auto-baseline-catboost": 0.83,
               "auto-bert-gated": 0.79}
    for name, cv in members.items():
        action, settings = (("run", {"encoder": "bert", "fusion": "gated", "epochs": 10}) if "bert" in name else
                            ("baseline", {"model": name.rsplit("-", 1)[1]}))
        auto.state.jobs[name] = JobState(action, settings, Status.DONE)
        (tmp_path / "titanic" / name).mkdir(parents=True)
        (tmp_path / "titanic" / name / "metrics.json").write_text(json.dumps({"cv": cv}))
        if action == "baseline":  # each measured at 10 s
            auto.estimator.record(*driver.baseline_work(auto, driver.Job(name, action, settings)), 10.0)
    added = driver.more_seeds(auto, list(members))
    assert added == ["auto-baseline-catboost-seed142", "auto-baseline-hgb-seed142", "auto-baseline-catboost-seed242",
                     "auto-baseline-hgb-seed242", "auto-baseline-catboost-seed342"]
    assert any(line.startswith("skip auto-more-seeds-1: no form fits (2 epochs at max length 96 ~125s)")
               for line in said), said
    assert any(line.startswith("skip auto-baseline-hgb-seed342: ~10s estimated; 8s of the 20s left are free")
               for line in said), said
    assert auto.state.jobs["auto-baseline-hgb-seed242"].settings == {"model": "hgb", "seed": 242}


def test_embeddings_of_a_pretrained_encoder_and_of_a_run_are_priced_apart(tmp_path):
    """A run's fold models embed each fold's rows again, a pretrained encoder every text once: on Disaster Tweets
    70 s against 300 s for the same work. Priced as one kind, the run's seeded copy was estimated at 186 s, started,
    and stopped after its first fold (benchmarks/NOTES.md, 2026-11-27)."""
    from kbert.auto.plan import BEST_RUN

    auto = driver.Auto(AutoOptions("nlp-getting-started", 600, out_dir=str(tmp_path)), log=lambda _: None)
    auto.load_state()
    auto.state.jobs["auto-finetune"] = JobState("run", {"encoder": "minilm-l6"}, Status.DONE)
    pretrained = driver.Job("auto-hgb-minilm", "embedding", {"model": "hgb", "embeddings": "minilm-l6"})
    best = driver.Job("auto-hgb-emb-best", "embedding", {"model": "hgb", "embeddings": BEST_RUN})
    seeded = driver.Job("auto-hgb-emb-best-seed142", "embedding",
                        {"model": "hgb", "embeddings": "auto-finetune", "seed": 142})  # resolved, as more_seeds has it
    (kind, work), (run_kind, run_work) = driver.baseline_work(auto, pretrained), driver.baseline_work(auto, best)
    assert (kind, run_kind, driver.baseline_work(auto, seeded)[0]) == ("embedding:minilm-l6", "embedding:run",
                                                                       "embedding:run")
    assert work == run_work
    auto.estimator.record(kind, work, 70.0)
    auto.estimator.record(run_kind, run_work, 300.0)
    assert auto.estimator.estimate(*driver.baseline_work(auto, seeded)) == pytest.approx(300.0)
    assert auto.estimator.estimate(kind, work) == pytest.approx(70.0)
    assert Estimator().estimate("embedding:mpnet-base", 1000) == pytest.approx(FIXED_SECONDS + 2.0)  # the prior


def test_a_state_that_is_not_what_kbert_auto_wrote_is_refused_and_one_auto_runs_per_folder(tmp_path, monkeypatch):
    from kbert.errors import KbertError
    from kbert.io import exclusive_lock

    fake_jobs(monkeypatch, 1.0)
    options = AutoOptions("titanic", 60, out_dir=str(tmp_path), submissions_dir=str(tmp_path / "s"), study_trials=0)
    folder = tmp_path / "titanic" / "auto"
    folder.mkdir(parents=True)
    state = {"competition": "titanic", "preset": "fast", "seed": 42, "spent_s": 10.0, "jobs": {}, "measured": {}}
    job = {"action": "run", "settings": {}, "status": "done"}
    bad = {"spent_s": -3000.0, "measured": {"baseline:hgb": [[1.0, -2.0]]}, "jobs": [], "competition": "house-prices",
           "corrections": {"bert": [0.0]}, "precision": "bf32", "surprise": 1}
    bad_jobs = [{**job, "status": "finished"}, {**job, "seconds": -1.0}, {"action": "run"}, {**job, "settings": []}]
    changes = [{key: value} for key, value in bad.items()] + [{"jobs": {"auto-bert": j}} for j in bad_jobs]
    for change in changes + [{"jobs": None}]:  # None: the key left out (its members then read as encoder runs)
        edited = {key: value for key, value in {**state, **change}.items() if value is not None}
        (folder / "state.json").write_text(json.dumps(edited))
        with pytest.raises(KbertError, match="state.json: .*; delete .* to start this competition's kbert auto over"):
            run_auto(options, log=lambda _: None)
    (folder / "state.json").unlink()
    with exclusive_lock(folder / ".lock", "held by the test"):
        with pytest.raises(KbertError, match="another kbert auto is running on this folder"):
            run_auto(options, log=lambda _: None)
    assert run_auto(options, log=lambda _: None) == ["auto-baseline-hgb"]  # the lock went with its holder
    assert json.loads((folder / "state.json").read_text())["jobs"]["auto-baseline-hgb"]["status"] == "done"


def test_the_clock_keeps_the_time_of_a_job_killed_mid_way(tmp_path, monkeypatch):
    """state.json records the time spent when a job starts or ends: after a kill -9 mid-job, the next invocation
    started from the job's start and the limit was overrun by the job's time (280 s for 4 minutes). The clock file,
    written every few seconds while jobs run, keeps it."""
    options = AutoOptions("titanic", 600, out_dir=str(tmp_path), submissions_dir=str(tmp_path / "s"))
    auto = driver.Auto(options, log=lambda _: None)
    auto.folder.mkdir(parents=True)
    auto.load_state()
    auto.save()  # a job starts: state.json records the time until then
    monkeypatch.setattr(artifacts, "CLOCK_EVERY_S", 0.05)
    with artifacts.ticking(auto.folder, auto.spent):
        time.sleep(0.5)  # the job runs, then the process is killed: state.json is not written again
    clock = driver.read_clock(auto.folder)
    recorded = json.loads(auto.state_path.read_text())["spent_s"]
    assert clock >= recorded + 0.3
    again = driver.Auto(options, log=lambda _: None)
    again.load_state()
    assert again.spent_before == clock and again.left() <= 600 - clock
    (auto.folder / CLOCK_FILE).write_text("{damaged")  # then the state's own figure stands
    again.load_state()
    assert again.spent_before == recorded


@pytest.mark.parametrize("blend,single,submitted", [(0.80, 0.81, "m2"), (0.82, 0.81, "auto-ensemble")])
def test_the_submission_is_the_best_member_when_picking_it_scored_better_than_the_blend(tmp_path, monkeypatch,
                                                                                       blend, single, submitted):
    """The nested CV scores the blend and, on the same outer splits, picking the best member: a blend significantly
    below it was still submitted."""
    options = AutoOptions("titanic", 600, out_dir=str(tmp_path), submissions_dir=str(tmp_path / "s"))
    auto = driver.Auto(options, log=lambda _: None)
    auto.folder.mkdir(parents=True)
    auto.load_state()
    for name in ("m1", "m2"):
        (auto.comp_dir / name).mkdir()
        (auto.comp_dir / name / "metrics.json").write_text(json.dumps({"submission": f"s/titanic/{name}.csv"}))
    standing = driver.Standing("mean", blend, {"mean": blend, "rank": blend - 0.01}, single, "m2",
                               submission=Path("s/auto-ensemble.csv"))
    monkeypatch.setattr(driver, "final_standing", lambda auto, members: standing)
    monkeypatch.setattr(driver, "print_leaderboard", lambda *args, **kwargs: (None, "", None))
    monkeypatch.setattr(driver, "write_leaderboard_report", lambda *args: tmp_path / "report.html")
    final = driver.final_ensemble(auto, ["m1", "m2"])
    assert submitted in str(final.submission) and final.honest == max(blend, single)


def test_the_precision_reaches_every_encoder_run_and_its_probe_and_a_rerun_must_keep_it(tmp_path, monkeypatch):
    from kbert.errors import KbertError
    import kbert.pipeline.probe as probe

    fake_jobs(monkeypatch, 1.0)
    seen = []
    monkeypatch.setattr(probe, "probe_run", lambda config, log=None: seen.append(("probe", config.train.precision))
                        or fake_probe(1.0))
    fake = driver.execute

    def execute(auto, job, record, members):
        if job.action is driver.Action.RUN:
            seen.append((job.name, auto.run_config(record.settings).train.precision))
        fake(auto, job, record, members)

    monkeypatch.setattr(driver, "execute", execute)
    options = AutoOptions("titanic", 600, precision="bf16", out_dir=str(tmp_path),
                          submissions_dir=str(tmp_path / "s"), study_trials=0)
    run_auto(options, log=lambda _: None)
    assert ("probe", "bf16") in seen and ("auto-bert-gated", "bf16") in seen
    assert {precision for _, precision in seen} == {"bf16"}
    assert json.loads((tmp_path / "titanic" / "auto" / "state.json").read_text())["precision"] == "bf16"
    with pytest.raises(KbertError, match="started with --preset fast --seed 42 --precision bf16; rerun with those"):
        run_auto(dataclasses.replace(options, precision="fp32"), log=lambda _: None)


def test_folds_side_by_side_finish_in_waves():
    from kbert.auto.driver import remaining_seconds

    # One at a time: each remaining fold as long as the mean so far (as before).
    assert remaining_seconds(100.0, 2, 3, 1) == pytest.approx(150.0)
    # Five at a time: the first fold done after 47 s leaves a fifth of a wave for the other four of its wave
    # (they have run as long), then one wave for folds 6-9; the last of a wave, a twentieth.
    assert remaining_seconds(47.0, 1, 8, 5) == pytest.approx(1.2 * 47.0)
    assert remaining_seconds(190.0, 4, 1, 5) == pytest.approx(190.0 / 20)
    assert remaining_seconds(50.0, 5, 4, 5) == pytest.approx(50.0)
    assert remaining_seconds(50.0, 5, 0, 5) == 0.0


@pytest.mark.parametrize("limit,stops", [(230.0, False), (130.0, True)])
def test_a_run_stops_between_folds_only_when_its_remaining_waves_would_not_fit(limit, stops, tmp_path, monkeypatch):
    """Ten folds (5 x 2 seeds) trained five at a time, each 47 s on a fake clock: after the first, the other nine
    need the rest of its wave and one more (~56 s), not nine folds' time. With the final ensemble's reserve (10 s +
    3.5 x 1 s x 8 members) that fits in 230 s and not in 130 s."""
    import types

    import kbert.pipeline.run as pipeline_run
    from kbert.pipeline import fold_processes

    clock = {"now": 0.0}
    monkeypatch.setattr(driver.time, "perf_counter", lambda: clock["now"])
    monkeypatch.setattr(pipeline_run, "plan_folds", fold_processes.plan_folds)  # not one at a time (conftest)
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
        with pytest.raises(driver.OutOfTime, match=r"9 folds \(5 at a time, ~56s\) would not finish"):
            driver.run_with_deadline(auto, config, "auto-bert", 7)
        assert finished == []  # stopped at the first fold's report, between folds
    else:
        driver.run_with_deadline(auto, config, "auto-bert", 7)
        assert len(finished) == 10


def test_a_study_counts_the_encoder_folds_at_one_core_each(tmp_path, monkeypatch):
    """Five folds that trained side by side on 2 cores took 56 s each: 22.4 s of one core, as a study's worker
    trains its trial's folds (one after another on its core), not 56 s."""
    import kbert.pipeline.run as pipeline_run
    from kbert.pipeline import fold_processes

    monkeypatch.setattr(pipeline_run, "plan_folds", fold_processes.plan_folds)  # not one at a time (conftest)
    monkeypatch.setattr(fold_processes, "usable_cores", lambda: 2)
    monkeypatch.setattr(fold_processes, "available_memory", lambda: None)
    auto = driver.Auto(AutoOptions("titanic", 600, out_dir=str(tmp_path), submissions_dir=str(tmp_path / "s"),
                                   progress=False), log=lambda _: None)
    auto.load_state()
    auto.state.jobs["auto-bert-gated"] = JobState("run", {"epochs": 3}, Status.DONE)
    for k in range(5):
        fold = tmp_path / "titanic" / "auto-bert-gated" / "folds" / str(k)
        fold.mkdir(parents=True)
        (fold / "fold.json").write_text(json.dumps({"record": {"seconds": 56.0}}))
    assert driver.one_core_fold_seconds(auto) == pytest.approx([22.4] * 5)


@pytest.mark.slow
def test_a_deadline_on_the_real_clock_stops_a_run_between_folds_and_a_resume_ends_it_as_if_never_stopped(
        tmp_path, monkeypatch):
    """Real training, real clock. The run's probe is made too optimistic (0.5 s for the whole run, whatever this
    machine's speed), so it starts with its 30 epochs and 1 s free; its first fold (30 epochs: over a second)
    shows the other four will not fit (they would if it took under 0.44 s), and it stops between folds: kbert auto
    then ends inside its limit with the baseline as its member. A rerun with a larger limit finishes the run from
    its kept fold, and its OOF file is byte for byte an uninterrupted run's."""
    import time

    import kbert.pipeline.probe as probe
    from kbert.auto.budget import SAFETY
    from kbert.pipeline.run import run_competition
    from tests.test_auto import small_titanic
    from tests.tiny import TINY

    data = small_titanic(tmp_path / "data")
    overrides = {**TINY, "folds": 5, "epochs": 30, "patience": 30}
    real_probe, planning = probe.probe_run, {}

    def leave_free(auto, members: int, seconds: float) -> None:  # a final ensemble's reserve that leaves them
        auto.estimator.ensemble_seconds = (auto.left() - seconds - 10 - SAFETY * limit) / (3.5 * (members + 1))

    def probe_run(config, log=None):  # the real probe takes real time: the 1 s free is counted after it
        probed = optimistic(real_probe(config))
        leave_free(*planning["auto"], 1.0)
        return probed

    monkeypatch.setattr(probe, "probe_run", probe_run)
    monkeypatch.setattr(driver, "plan", lambda auto: [driver.Job("auto-baseline-hgb", "baseline", {"model": "hgb"}),
                                                      driver.Job("auto-bert", "run", {"epochs": 30})])
    monkeypatch.setattr(driver, "MORE_SEEDS", 0)
    limit = 40.0

    def interim_blend(auto, members):  # a reserve that leaves 1 s free once the run is probed (3 s to probe it)
        planning["auto"] = (auto, len(members))
        leave_free(auto, len(members), 4.0)

    monkeypatch.setattr(driver, "interim_blend", interim_blend)
    folder = tmp_path / "runs" / "titanic" / "auto"
    folder.mkdir(parents=True)
    (folder / "state.json").write_text(json.dumps({"competition": "titanic", "preset": "fast", "seed": 42,
                                                   "spent_s": 0.0, "jobs": {},
                                                   "ensemble_s_per_member": 0.1,  # the baseline's reserve ~11 s
                                                   "adversarial": {"auc": 0.5, "verdict": "none", "seconds": 0}}))

    def options(limit: float) -> AutoOptions:
        return AutoOptions("titanic", limit, data_dir=str(data), out_dir=str(tmp_path / "runs"),
                           submissions_dir=str(tmp_path / "subs"), progress=False, overrides=overrides,
                           study_trials=0)

    said = []
    began = time.perf_counter()
    run_auto(options(limit), log=said.append)
    wall = time.perf_counter() - began
    state = json.loads((folder / "state.json").read_text())
    assert state["jobs"]["auto-bert"]["status"] == "stopped", said
    assert any(line.startswith("stopped auto-bert: 4 folds (1 at a time") for line in said), said
    run_dir = tmp_path / "runs" / "titanic" / "auto-bert"
    assert len(list(run_dir.glob("folds/*/fold.json"))) == 1 and not (run_dir / "metrics.json").exists()
    assert wall <= limit + 5 and state["spent_s"] <= limit + 5

    monkeypatch.setattr(driver, "interim_blend", lambda auto, members: None)
    said.clear()
    run_auto(options(limit + 600), log=said.append)
    assert any(line.startswith("start auto-bert (30 epochs, max length 64, resumed)") for line in said), said
    assert json.loads((folder / "state.json").read_text())["jobs"]["auto-bert"]["status"] == "done"
    config = driver.Auto(options(limit), log=lambda _: None).run_config({"epochs": 30})
    whole = run_competition(dataclasses.replace(config, out_dir=str(tmp_path / "whole")), run_id="auto-bert",
                            progress=False, log=lambda _: None)
    assert (run_dir / "oof.csv").read_bytes() == (whole.run_dir / "oof.csv").read_bytes()


def optimistic(probe: RunProbe, epochs: int = 30, seconds: float = 0.5) -> RunProbe:
    """``probe`` with every measured time scaled so that the run of ``epochs`` epochs is priced at ``seconds``: a
    fixed price, not a fixed share of this machine's speed (a 20x cut still priced 30 epochs over the 1 s free on a
    slower CPU, and the run was shrunk)."""
    share = seconds / probe.run_seconds(epochs)
    return dataclasses.replace(probe, startup_s=probe.startup_s * share, prep_s=probe.prep_s * share,
                               train_step_s=probe.train_step_s * share, eval_batch_s=probe.eval_batch_s * share,
                               trace_s=probe.trace_s * share)


def test_no_probe_starts_when_the_longest_probe_so_far_does_not_fit_and_an_interrupt_is_charged(
        tmp_path, monkeypatch):
    """A probe started with 43 s free took 73 s and ate the final ensemble's reserve (the hour ran past its limit):
    a probe starts only when more time is free than the longest probe so far took. And Ctrl-C in a job charged
    nothing of the job's time: the state's spent time counts it."""
    import time

    import kbert.pipeline.probe as probe
    from kbert.auto.state import Action, read_state
    from kbert.pipeline.config import load_competition, resolve_run_config

    probed = []
    monkeypatch.setattr(probe, "probe_run", lambda config, log=None: probed.append(config) or fake_probe(10.0))
    base = resolve_run_config(load_competition("titanic"), {"max_length": 64})
    monkeypatch.setattr(driver.Auto, "run_config", lambda auto, settings: base)
    options = AutoOptions("titanic", 1000, out_dir=str(tmp_path), submissions_dir=str(tmp_path / "s"), progress=False)
    auto = driver.Auto(options, log=lambda _: None)
    auto.load_state()
    auto.estimator.ensemble_seconds = 1.0
    auto.state.jobs["auto-bert"] = JobState(Action.RUN, {}, Status.DONE, probe_s=100.0)
    auto.started -= 1000 - 80  # about 75 s free, less than the 100 s probe before
    form, tried = driver.fitting_form(auto, None, {}, 1)
    assert form is None and not probed
    assert tried == ["not probed: a probe took up to 100s, more than the time free"]
    del auto.state.jobs["auto-bert"]  # no probe timed yet: a pretrained encoder's first is priced at FIRST_PROBE_S
    pretrained = resolve_run_config(load_competition("titanic"), {"encoder": "minilm-l6"})
    monkeypatch.setattr(driver.Auto, "run_config", lambda auto, settings: pretrained)
    # about 33 s free, as above (one started with 24 s free took 199 s: 80 s over the limit)
    form, tried = driver.fitting_form(auto, None, {}, 1)
    assert form is None and not probed
    assert tried == [f"not probed: a first probe of a pretrained encoder is priced at {driver.FIRST_PROBE_S:.0f}s, "
                     "more than the time free"]
    monkeypatch.setattr(driver.Auto, "run_config", lambda auto, settings: base)

    def interrupted(auto):
        time.sleep(0.3)
        raise KeyboardInterrupt

    monkeypatch.setattr(driver, "auto_jobs", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_auto(options, log=lambda _: None)
    assert read_state(tmp_path / "titanic" / "auto" / "state.json", "titanic").spent_s >= 0.3
