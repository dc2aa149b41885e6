"""Where artifacts meet (pipeline/provenance.py): a member is blended, resumed, taught from or embedded with only if
it was made for this competition, task and data, and its files say what its metrics.json says."""

import json
import shutil

import numpy as np
import pandas as pd
import pytest

from kbert.auto import driver as driver
from kbert.auto.driver import AutoOptions, run_auto
from kbert.auto.state import JobState, Status
from kbert.ensembles.members import select_members
from kbert.errors import KbertError
from kbert.pipeline.config import BUNDLED_DATA_DIR, load_competition, resolve_run_config
from tests.test_ensembles import expected_for, write_member


def members(tmp_path, expected, count=2):
    rng = np.random.default_rng(0)
    for i in range(count):
        oof = np.clip(0.5 + (expected.truth - 0.5) * 0.4 + rng.normal(scale=0.3, size=len(expected.truth)), 0, 1)
        write_member(tmp_path / f"m{i}", expected, oof, rng.random(len(expected.test_ids)))


def made_with(folder, edit) -> None:
    """The member in ``folder`` as if kbert had made it with its config.yaml changed by ``edit`` (its sha256 in
    metrics.json too)."""
    import yaml

    from kbert.pipeline.artifacts import mapping_fingerprint

    config = yaml.safe_load((folder / "config.yaml").read_text())
    edit(config)
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    metrics = json.loads((folder / "metrics.json").read_text())
    (folder / "metrics.json").write_text(json.dumps({**metrics, "config_sha256": mapping_fingerprint(config)}))


def kept_auto_baseline(competition: str, tmp_path) -> AutoOptions:
    """kbert auto's options for ``competition``, whose state says its member auto-baseline-hgb finished before."""
    options = AutoOptions(competition, 600, out_dir=str(tmp_path), submissions_dir=str(tmp_path / "subs"),
                          progress=False)
    auto = driver.Auto(options, log=lambda _: None)
    auto.folder.mkdir(parents=True)
    auto.load_state()
    auto.state.jobs["auto-baseline-hgb"] = JobState("baseline", {"model": "hgb"}, Status.DONE)
    auto.save()
    return options


def test_a_member_of_another_competition_or_with_edited_predictions_is_refused_naming_it(tmp_path):
    titanic = expected_for("titanic")
    members(tmp_path, titanic)
    assert [m.name for m in select_members(tmp_path, "all", titanic, True)] == ["m0", "m1"]

    write_member(tmp_path / "other", expected_for("spaceship-titanic"), np.full(8693, 0.5), np.full(4277, 0.5))
    with pytest.raises(KbertError, match=r"^member other: made for competition 'spaceship-titanic', not 'titanic'$"):
        select_members(tmp_path, "all", titanic, True)
    shutil.rmtree(tmp_path / "other")

    oof = pd.read_csv(tmp_path / "m1" / "oof.csv")
    oof["Survived"] = 1 - oof["Survived"]  # every prediction turned around: the recorded CV no longer holds
    oof.to_csv(tmp_path / "m1" / "oof.csv", index=False)
    with pytest.raises(KbertError, match=r"^member m1: its oof.csv scores accuracy 0\.\d+, its metrics.json records "
                                         r"0\.\d+; the files do not belong together$"):
        select_members(tmp_path, "m0,m1", titanic, True)

    metrics = json.loads((tmp_path / "m0" / "metrics.json").read_text())
    (tmp_path / "m0" / "metrics.json").write_text(json.dumps({**metrics, "schema": None}))
    with pytest.raises(KbertError, match=r"^member m0: written by another kbert \(artifact schema None, this kbert "
                                         r"reads 2\); rerun it$"):
        select_members(tmp_path, "m0", titanic, True)


def test_members_split_into_other_folds_are_not_blended_together(tmp_path):
    titanic = expected_for("titanic")
    members(tmp_path, titanic)
    folds = pd.read_csv(tmp_path / "m1" / "folds.csv")
    folds["fold"] = (folds["fold"] + 1) % 5
    folds.to_csv(tmp_path / "m1" / "folds.csv", index=False)
    with pytest.raises(KbertError, match=r"^member m1: split into other folds than m0 \(891 training rows in another "
                                         r"fold\); blend members trained on the same folds$"):
        select_members(tmp_path, "all", titanic, True)


@pytest.mark.slow
def test_a_resume_on_changed_training_labels_is_refused_naming_the_member(tmp_path):
    from kbert.ensembles.baseline import run_baseline

    data = tmp_path / "data"
    shutil.copytree(BUNDLED_DATA_DIR / "titanic", data)
    options = AutoOptions("titanic", 600, data_dir=str(data), out_dir=str(tmp_path / "runs"),
                          submissions_dir=str(tmp_path / "subs"), progress=False)
    auto = driver.Auto(options, log=lambda _: None)
    auto.folder.mkdir(parents=True)
    auto.load_state()
    run_baseline(auto.run_config({}), "logreg", run_id="auto-baseline-logreg", log=lambda _: None)
    auto.state.jobs["auto-baseline-logreg"] = JobState("baseline", {"model": "logreg"}, Status.DONE)
    auto.save()
    driver.check_kept_members(auto)  # the data as it was: kept

    train = pd.read_csv(data / "train.csv")
    train["Survived"] = 1 - train["Survived"]
    train.to_csv(data / "train.csv", index=False)
    with pytest.raises(KbertError, match=r"^kbert auto titanic: member auto-baseline-logreg: trained on other data "
                                         r"\(train.csv differ from the files read now in .*data\); rerun it on these "
                                         r"files; or "
                                         r"pass another --out to start over$"):
        run_auto(options, log=lambda _: None)


@pytest.mark.slow
def test_an_encoder_runs_oof_is_the_mean_of_its_folds_own_predictions(tmp_path):
    """A change too small to move the recorded CV (one probability nudged) is still caught: the run's oof.csv must
    be its folds' outputs.npz predictions."""
    from tests.tiny import run_tiny

    run_dir = run_tiny("titanic", tmp_path, run_id="x", out_dir=str(tmp_path)).run_dir
    titanic = expected_for("titanic")
    assert select_members(tmp_path / "titanic", "x", titanic, True)[0].name == "x"
    test = pd.read_csv(run_dir / "test.csv")  # the submission's: every prediction flipped (1 - p)
    (run_dir / "test.csv").write_text(test.assign(Survived=1 - test["Survived"]).to_csv(index=False))
    with pytest.raises(KbertError, match=r"^member x: its test.csv is not the mean of its folds' test predictions "
                                         r"\(folds/\*/outputs.npz\); the files do not belong together$"):
        select_members(tmp_path / "titanic", "x", titanic, True)
    test.to_csv(run_dir / "test.csv", index=False)
    assert select_members(tmp_path / "titanic", "x", titanic, True)[0].name == "x"
    from kbert.ensembles.baseline import run_baseline  # a baseline's: the mean of its folds' test.csv

    config = resolve_run_config(load_competition("titanic"), {"out_dir": str(tmp_path), "submissions_dir":
                                                              str(tmp_path / "subs")})
    baseline = run_baseline(config, "logreg", run_id="b", log=lambda _: None).run_dir
    (baseline / "test.csv").write_text(test.assign(Survived=1 - test["Survived"]).to_csv(index=False))
    with pytest.raises(KbertError, match=r"^member b: its test.csv is not the mean of its folds' test predictions "
                                         r"\(folds/\*/test.csv\)"):
        select_members(tmp_path / "titanic", "b", titanic, True)
    oof = pd.read_csv(run_dir / "oof.csv")
    row = oof.index[(oof["Survived"] > 0.02) & (oof["Survived"] < 0.48)][0]
    oof.loc[row, "Survived"] *= 0.99  # still below the 0.5 cut-off: the accuracy is the same
    oof.to_csv(run_dir / "oof.csv", index=False)
    with pytest.raises(KbertError, match=r"^member x: its oof.csv is not the mean of its folds' predictions "
                                         r"\(folds/\*/outputs.npz\); the files do not belong together$"):
        select_members(tmp_path / "titanic", "x", titanic, True)


def test_a_teacher_an_embedding_source_and_a_kept_auto_member_of_another_competition_are_refused(tmp_path):
    """The other three places members meet, each with a member of another competition in this one's folder."""
    from kbert.ensembles.embedding_features import open_embedding_source
    from kbert.pipeline.config import load_competition, resolve_run_config
    from kbert.pipeline.pseudo import pseudo_labels

    titanic = expected_for("titanic")
    houses = expected_for("house-prices-advanced-regression-techniques")
    folder = tmp_path / "titanic" / "auto-baseline-hgb"
    write_member(folder, houses, np.full(len(houses.train_ids), 1e5), np.full(len(houses.test_ids), 1e5))
    (folder / "config.yaml").write_text("baseline: hgb\nlimit_rows: null\n")
    refusal = "made for competition 'house-prices-advanced-regression-techniques', not 'titanic'"
    config = resolve_run_config(load_competition("titanic"), {"out_dir": str(tmp_path),
                                                             "pseudo_label": "auto-baseline-hgb"})
    folds = [np.arange(len(titanic.train_ids)) % 5]
    with pytest.raises(KbertError, match=rf"^--pseudo-label auto-baseline-hgb: {refusal}$"):
        pseudo_labels(config, tmp_path / "titanic", titanic, folds)
    (folder / "config.yaml").write_text("seed: 1\nlimit_rows: null\n")  # as a run's: embedded with
    with pytest.raises(KbertError, match=rf"^--embeddings auto-baseline-hgb: {refusal}$"):
        open_embedding_source("auto-baseline-hgb", config, tmp_path / "titanic", titanic, folds[0])

    options = kept_auto_baseline("titanic", tmp_path)
    with pytest.raises(KbertError, match=rf"^kbert auto titanic: member auto-baseline-hgb: {refusal}; or pass "
                                         "another --out to start over$"):
        run_auto(options, log=lambda _: None)


def test_a_permute_target_run_is_no_member_or_teacher(tmp_path):
    """Its CV was scored on shuffled targets (the sanity check's point): it was refused as 'the files do not belong
    together', which they do. Named, it is refused; ``all`` leaves it out with a note (one sanity run in the
    runs folder refused every default ensemble)."""
    titanic = expected_for("titanic")
    members(tmp_path, titanic)
    made_with(tmp_path / "m1", lambda config: config.update(permute_target=True))
    with pytest.raises(KbertError, match=r"^member m1: trained with --permute-target, a sanity check on shuffled "
                                         "targets; it is no member or teacher$"):
        select_members(tmp_path, "m0,m1", titanic, True)
    notes = []
    assert "m1" not in [m.name for m in select_members(tmp_path, "all", titanic, True, log=notes.append)]
    assert "skipped 1 run(s) trained with --permute-target (sanity checks on shuffled targets): m1" in notes


def test_a_kept_auto_member_on_other_folds_than_the_competitions_now_is_refused_before_any_job(tmp_path):
    """The YAML's folds changed since the member was trained: refused at the start of the resume, not by the blend
    after the next job (which then stayed in the folder, and failed every later resume)."""
    from kbert.pipeline.config import BUNDLED_DIR

    titanic = expected_for("titanic")
    rng = np.random.default_rng(0)
    write_member(tmp_path / "titanic" / "auto-baseline-hgb", titanic, rng.random(len(titanic.train_ids)),
                 rng.random(len(titanic.test_ids)))
    four = tmp_path / "titanic.yaml"
    four.write_text((BUNDLED_DIR / "titanic.yaml").read_text().replace("  k: 5\n", "  k: 4\n", 1))
    options = kept_auto_baseline(str(four), tmp_path)
    with pytest.raises(KbertError, match=r"^kbert auto titanic: member auto-baseline-hgb: trained on other folds "
                                         r"than the competition's now \(k: 5 -> 4\): put them back; or pass another "
                                         "--out to start over$"):
        run_auto(options, log=lambda _: None)
    assert sorted(p.name for p in (tmp_path / "titanic").iterdir()) == ["auto", "auto-baseline-hgb"]  # no job ran


def test_a_copied_member_is_blended_once_and_one_missing_its_predictions_is_named(tmp_path, capsys):
    """A copy of a member's folder weighed its model twice; a finished member whose test.csv was deleted was left out
    of --members all without a word."""
    titanic = expected_for("titanic")
    members(tmp_path, titanic)
    shutil.copytree(tmp_path / "m1", tmp_path / "m1-copy")
    assert [m.name for m in select_members(tmp_path, "all", titanic, True, log=print)] == ["m0", "m1"]
    assert "skipped 1 member(s) with the predictions of another: m1-copy" in capsys.readouterr().out
    assert [m.name for m in select_members(tmp_path, "m0,m1-copy,m1", titanic, True, log=print)] == ["m0", "m1-copy"]
    assert "skipped 1 member(s) with the predictions of another: m1" in capsys.readouterr().out
    shutil.rmtree(tmp_path / "m1-copy")
    (tmp_path / "m1" / "test.csv").unlink()
    with pytest.raises(KbertError, match=r"m1/test.csv: file not found$"):
        select_members(tmp_path, "all", titanic, True)


def test_a_members_predictions_are_the_files_it_was_written_with(tmp_path):
    """metrics.json records the sha256 of oof.csv and test.csv: an edit that keeps the recorded CV (probabilities
    pushed to 0.001 and 0.999 keep every label) changed a blend's weights silently."""
    from kbert.io import file_sha256

    titanic = expected_for("titanic")
    members(tmp_path, titanic)
    metrics = json.loads((tmp_path / "m1" / "metrics.json").read_text())
    recorded = {name: file_sha256(tmp_path / "m1" / name) for name in ("oof.csv", "test.csv")}
    (tmp_path / "m1" / "metrics.json").write_text(json.dumps({**metrics, "predictions_sha256": recorded}))
    assert [m.name for m in select_members(tmp_path, "all", titanic, True)] == ["m0", "m1"]
    oof = pd.read_csv(tmp_path / "m1" / "oof.csv")
    oof["Survived"] = np.where(oof["Survived"] >= 0.5, 0.999, 0.001)  # the same labels: the same accuracy
    oof.to_csv(tmp_path / "m1" / "oof.csv", index=False)
    with pytest.raises(KbertError, match=r"^member m1: its oof.csv is not the one it was written with \(metrics.json "
                                         "records another sha256: edited, or of another training\\)"):
        select_members(tmp_path, "all", titanic, True)


def test_a_member_made_with_other_fold_groups_than_the_competitions_is_refused(tmp_path):
    """Members made with group_column: Ticket blended under a YAML without groups: the outer folds that score the
    blend would split their groups (honest CV 0.81 where the grouped outer folds give 0.77)."""
    titanic = expected_for("titanic")
    members(tmp_path, titanic)
    made_with(tmp_path / "m1", lambda config: config["competition"]["folds"].update(group_column="Ticket"))
    with pytest.raises(KbertError, match=r"^member m1: made with other folds than this competition's \(folds."
                                         r"group_column: 'Ticket' -> ''\); use the competition file it was made with$"):
        select_members(tmp_path, "all", titanic, True)
