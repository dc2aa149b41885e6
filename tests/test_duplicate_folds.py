"""Rows whose free text repeats share a fold (folds.duplicates, pipeline/splits.py): a synthetic table of repeated
tweets, some with conflicting labels, and the bundled Disaster Tweets; no model is trained."""

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from sklearn.model_selection import StratifiedKFold

from kbert.errors import KbertError
from kbert.pipeline.artifacts import check_resumable, write_folds_table, write_run_config
from kbert.pipeline.config import load_competition, resolve_run_config
from kbert.pipeline.data import (Duplicates, count_duplicates, duplicate_groups, duplicate_report,
                                 load_competition_data, normalised_text)
from kbert.pipeline.splits import folds_path, make_fold_sets, make_folds, row_groups
from kbert.pipeline.targets import encode_targets

ROOT = Path(__file__).resolve().parent.parent
WORDS = "fire flood storm crash road city night people house river smoke wind power train bridge sky".split()


def tweets() -> pd.DataFrame:
    """80 tweets of a mention, 10 words and a link; rows 80..104 repeat tweets 0..19 in another case, with another
    mention and link, other spaces and end punctuation: tweets 0..4 twice (groups of 3 rows), tweets 0..9 once with
    the other label. So 20 groups of 2+ (45 rows), 10 of them with conflicting labels."""
    rng = np.random.default_rng(0)
    words = [" ".join(rng.choice(WORDS, 10)) for _ in range(80)]
    labels = [i % 2 for i in range(80)]
    texts, targets = [f"@a{i} {w} http://t.co/a{i}" for i, w in enumerate(words)], list(labels)
    for i in range(20):
        texts.append(f"  @B{i} {words[i].upper()}\thttps://t.co/b{i} !!")
        targets.append(1 - labels[i] if i < 10 else labels[i])
    for i in range(5):
        texts.append(f"@c {words[i].replace(' ', '  ')} www.c.org/{i}...")
        targets.append(labels[i])
    return pd.DataFrame({"id": range(len(texts)), "keyword": "fire", "location": np.nan, "text": texts,
                         "target": targets})


@pytest.fixture(scope="module")
def competition():
    return load_competition("nlp-getting-started")


def with_folds(competition, **folds):
    return replace(competition, folds=replace(competition.folds, **folds))


def test_normalised_text_is_lower_case_with_links_mentions_spaces_and_end_punctuation_collapsed():
    rows = pd.DataFrame({"a": ["  Fire!! http://t.co/x ", "RT @Bob:\tFIRE!!   www.x.org", "...", np.nan],
                         "b": ["#Help.", "#help", "x", "y"]})
    assert normalised_text(rows, ["a"]).tolist() == ["fire!! url", "rt @user: fire!! url", "", ""]
    assert normalised_text(rows, ["a", "b"]).tolist() == ["fire!! url\thelp", "rt @user: fire!! url\thelp", "\tx",
                                                          "\ty"]
    groups = duplicate_groups(pd.Series(["b", "a", "b", "", " \t", "a"]))
    assert groups.tolist() == [0, 1, 0, 2, 3, 1]  # empty texts are groups of their own


def test_counts_of_duplicates_and_conflicting_labels():
    table = tweets()
    groups = duplicate_groups(normalised_text(table, ["text"]))
    assert len(np.unique(groups)) == 80
    assert count_duplicates(groups, table[["target"]]) == Duplicates(rows=45, groups=20, conflicting=10)
    assert count_duplicates(groups, table[["target", "keyword"]]).conflicting == 10
    assert count_duplicates(groups, table[["target"]].assign(target=0)).conflicting == 0
    assert count_duplicates(np.arange(3), table[["target"]].head(3)) == Duplicates(0, 0, 0)
    line = duplicate_report(table, ["keyword", "location", "text"], ["target"])
    assert line.startswith("duplicated text (text, normalised): 45 rows in 20 groups of 2+, 10 of them with "
                           "conflicting targets")
    titanic = load_competition("titanic")
    assert duplicate_report(load_competition_data(titanic).train, ["Name", "Sex"], ["Survived"]) == ""
    unique = table.drop_duplicates("text").assign(text=lambda t: t["text"] + [f" #{i}" for i in range(len(t))])
    assert count_duplicates(duplicate_groups(normalised_text(unique, ["text"])), unique[["target"]]).rows == 0
    assert duplicate_report(unique, ["keyword", "location", "text"], ["target"]) == ""  # not "0 rows in 0 groups"


@pytest.mark.parametrize("mode", ["auto", "group"])
def test_every_group_of_repeated_text_lands_in_one_fold(competition, mode):
    table = tweets()
    grouping = row_groups(table, with_folds(competition, k=4, duplicates=mode))
    assert grouping.config.duplicates == "group"
    folds = make_folds(table["id"], table["target"], grouping.config, grouping.groups)["fold"].to_numpy()
    per_text = pd.Series(folds).groupby(normalised_text(table, ["text"]).to_numpy()).nunique()
    assert len(per_text) == 80 and (per_text == 1).all()
    assert np.bincount(folds).min() >= 20 and all(0.3 < table["target"][folds == k].mean() < 0.7 for k in range(4))
    again = row_groups(table, with_folds(competition, k=4, duplicates=mode))
    assert np.array_equal(make_folds(table["id"], table["target"], again.config, again.groups)["fold"], folds)
    other = replace(grouping.config, seed=7)
    assert not np.array_equal(make_folds(table["id"], table["target"], other, grouping.groups)["fold"], folds)


def test_ignore_and_tables_that_are_not_free_text_keep_the_stratified_split_and_its_file(competition, tmp_path):
    def stratified(y, k=5, seed=42):
        fold = np.zeros(len(y), dtype=int)
        for i, (_, valid) in enumerate(StratifiedKFold(k, shuffle=True, random_state=seed).split(np.zeros(len(y)), y)):
            fold[valid] = i
        return fold

    table = tweets()
    grouping = row_groups(table, with_folds(competition, duplicates="ignore"))
    assert grouping.groups is None and grouping.config == with_folds(competition, duplicates="ignore").folds
    assert np.array_equal(make_folds(table["id"], table["target"], grouping.config)["fold"], stratified(table["target"]))
    no_repeats = table.head(80)  # free text without a repeated tweet: the split it had before
    assert row_groups(no_repeats, competition).config.duplicates == "ignore"

    titanic = load_competition("titanic")
    config = resolve_run_config(titanic, {"out_dir": str(tmp_path)})
    train = load_competition_data(titanic).train
    fold = make_fold_sets(config, train, encode_targets(train, titanic), tmp_path / "titanic")[0]
    assert np.array_equal(fold, stratified(train["Survived"]))
    assert [p.name for p in (tmp_path / "titanic" / "folds").iterdir()] == ["stratified-k5-seed42.csv"]


def test_group_column_and_repeated_text_unite(competition):
    table = tweets().assign(user=[f"u{i // 2}" for i in range(105)])  # rows 2j and 2j+1 share a user
    grouping = row_groups(table, with_folds(competition, k=4, group_column="user"))
    assert grouping.config.duplicates == "group"
    folds = make_folds(table["id"], table["target"], grouping.config, grouping.groups)["fold"].to_numpy()
    for key in (table["user"].to_numpy(), normalised_text(table, ["text"]).to_numpy()):
        assert (pd.Series(folds).groupby(key).nunique() == 1).all()
    # Rows 0 and 81 share neither a user (u0, u40) nor a text (tweets 0 and 1), but row 80 links them: it repeats
    # tweet 0 and is user u40. The union of both groupings, not either alone.
    assert len({grouping.groups[i] for i in (0, 1, 80, 81)}) == 1
    assert folds_path(Path("c"), grouping.config).name == "stratified_group-by-user-duplicates-k4-seed42.csv"


def test_duplicates_group_needs_shuffled_folds_and_free_text(competition):
    with pytest.raises(KbertError, match=r"^folds.duplicates: group needs folds.shuffle: true"):
        row_groups(tweets(), with_folds(competition, duplicates="group", shuffle=False))
    assert row_groups(tweets(), with_folds(competition, shuffle=False)).config.duplicates == "ignore"
    short = tweets().assign(text="a b c")
    with pytest.raises(KbertError, match=r"^train.csv: folds.duplicates: group, but no text column is free text"):
        row_groups(short, with_folds(competition, duplicates="group"))
    with pytest.raises(KbertError, match=r"^folds.duplicates 'always' is unknown; known: auto, group, ignore$"):
        resolve_run_config(with_folds(competition, duplicates="always"))


@pytest.fixture(scope="module")
def disaster_tweets(competition, tmp_path_factory):
    """The bundled Disaster Tweets' training rows and their folds by ``make_fold_sets`` (default k 5, seed 42) with
    folds.duplicates auto and ignore, made in one competition folder: (train, {mode: fold of each row}, folder)."""
    train = load_competition_data(competition).train
    folder = tmp_path_factory.mktemp("tweets")
    folds = {}
    for mode in ("auto", "ignore"):
        config = resolve_run_config(with_folds(competition, duplicates=mode), {"out_dir": str(folder)})
        folds[mode] = make_fold_sets(config, train, encode_targets(train, competition), folder)[0]
    return train, folds, folder


def test_disaster_tweets_duplicates_stay_in_one_fold(competition, disaster_tweets):
    train, folds, folder = disaster_tweets
    texts = normalised_text(train, ["text"])
    assert count_duplicates(duplicate_groups(texts), train[["target"]]) == Duplicates(rows=995, groups=310,
                                                                                      conflicting=72)
    assert sorted(p.name for p in (folder / "folds").iterdir()) == ["stratified-k5-seed42.csv",  # as before
                                                                    "stratified_group-duplicates-k5-seed42.csv"]
    fold = folds["auto"]
    assert (pd.Series(fold).groupby(texts.to_numpy()).nunique() == 1).all()  # no text in two folds
    assert np.bincount(fold).min() >= 1520 and np.ptp([train["target"][fold == k].mean() for k in range(5)]) < 0.01
    # Resumed: the fold file is read back, the same folds.
    config = resolve_run_config(competition, {"out_dir": str(folder)})
    assert np.array_equal(make_fold_sets(config, train, encode_targets(train, competition), folder)[0], fold)
    # The split of every earlier version: 271 normalised texts were in two folds or more.
    assert (pd.Series(folds["ignore"]).groupby(texts.to_numpy()).nunique() > 1).sum() == 271


def test_folds_are_the_same_in_another_process(competition):
    """No hash order leaks into the split: another interpreter (another hash seed) makes the same folds."""
    code = ("import sys; sys.path.insert(0, '.'); from tests.test_duplicate_folds import folds_of; "
            "print(folds_of())")
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                           env={**os.environ, "PYTHONHASHSEED": "123"}, check=True).stdout.strip()
    assert found == folds_of()


def folds_of() -> str:
    table = tweets().assign(user=[f"u{i // 3}" for i in range(105)])
    competition = with_folds(load_competition("nlp-getting-started"), k=4, group_column="user")
    grouping = row_groups(table, competition)
    return "".join(map(str, make_folds(table["id"], table["target"], grouping.config, grouping.groups)["fold"]))


def test_a_resumed_run_keeps_its_folds_and_an_old_config_reads_the_default(competition, tmp_path):
    config = resolve_run_config(competition, {"folds": 2})
    ids = pd.Series(np.arange(6), name="id")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    write_folds_table(run_dir, competition, ids, [np.array([0, 1, 0, 1, 0, 1])])
    write_folds_table(run_dir, competition, ids, [np.array([0, 1, 0, 1, 0, 1])])  # resumed on the same folds
    with pytest.raises(KbertError, match=r"run 'run' was split into other folds than its settings make now"):
        write_folds_table(run_dir, competition, ids, [np.array([1, 1, 0, 1, 0, 0])])
    # A config.yaml from before folds.duplicates: read as the default (auto), not as another setting.
    saved = config.to_dict()
    del saved["competition"]["folds"]["duplicates"]
    write_run_config(run_dir, {"run_id": "run", **saved}, {})
    check_resumable(run_dir, config)
    with pytest.raises(KbertError, match=r"competition.folds.duplicates: 'auto' -> 'ignore'"):
        check_resumable(run_dir, replace(config, competition=with_folds(config.competition, duplicates="ignore")))


def test_members_on_the_old_and_the_new_split_are_not_blended(competition, disaster_tweets, tmp_path):
    from kbert.ensembles.members import select_members
    from tests.test_ensembles import expected_for, write_member

    expected = expected_for("nlp-getting-started")
    train, folds, _ = disaster_tweets
    rng = np.random.default_rng(0)
    for name, mode in (("new", "auto"), ("same", "auto"), ("old", "ignore")):
        write_member(tmp_path / name, expected, rng.random(len(train)), rng.random(len(expected.test_ids)))
        (tmp_path / name / "folds.csv").unlink()  # write_member's own split, replaced by the competition's
        write_folds_table(tmp_path / name, competition, train["id"], [folds[mode]])
    assert [m.name for m in select_members(tmp_path, "new,same", expected, True)] == ["new", "same"]
    with pytest.raises(KbertError, match=r"^member old: split into other folds than new \(\d+ training rows"):
        select_members(tmp_path, "new,old", expected, True)
