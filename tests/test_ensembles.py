"""Ensembles: blending methods, their nested CV, members on disk, baselines and `kbert ensemble` submissions."""

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest
import yaml

from kbert.ensembles.baseline import Baseline, column_kinds, fit_predict_fold, make_pipeline, prepare
from kbert.ensembles.blend import (BlendOptions, Problem, apply_blend, fit_blend, hill_climb, metric_loss, nested_cv,
                                   paired_bootstrap, score_table)
from kbert.ensembles.members import select_members
from kbert.errors import KbertError
from kbert.pipeline.artifacts import SCHEMA, config_fingerprint
from kbert.pipeline.config import BUNDLED_DATA_DIR, BUNDLED_DIR, load_competition, resolve_run_config
from kbert.pipeline.data import load_competition_data
from kbert.pipeline.metrics import get_metric
from kbert.pipeline.predictions import native, score
from kbert.pipeline.provenance import Expected, expected_of


def regression_problem(y: np.ndarray, metric: str = "rmse") -> Problem:
    return Problem("regression", get_metric(metric), y, None)


def binary_problem(y: np.ndarray, metric: str = "roc_auc") -> Problem:
    return Problem("binary", get_metric(metric), y.astype(int), y.astype(int), [0, 1])


# --- hill climbing -------------------------------------------------------------------------------------------------

def test_hill_climbing_reproduces_a_hand_computed_selection():
    # y = (1, 1); A errs by 0.4, B by 0.2, C by 1 on each row. MSE alone: A 0.16, B 0.04, C 1.0.
    # Start {B} (0.04). Step 1: +A -> mean 1.1 (0.01); +B -> 0.04; +C -> 0.26: add A.
    # Step 2: +A -> 1.2 (0.04); +B -> 1.0 (0.0); +C -> 0.1156: add B. Step 3: nothing beats 0.0: stop.
    y = np.array([1.0, 1.0])
    P = np.array([[[1.4], [1.4]], [[0.8], [0.8]], [[0.0], [2.0]]])
    problem = regression_problem(y, "rmse")
    rows = np.arange(2)
    counts = hill_climb(P, metric_loss(problem), rows, init=1)
    assert counts.tolist() == [1, 2, 0]
    assert hill_climb(P, metric_loss(problem), rows, init=2).tolist() == [1, 2, 0]  # sorted init {B, A}: same
    assert hill_climb(P, metric_loss(problem), rows, init=1, steps=1).tolist() == [1, 1, 0]
    blend = fit_blend("hill", P, problem, rows, BlendOptions(hill_init=1, hill_bags=1, hill_bag_fraction=1.0))
    np.testing.assert_allclose(blend.weights, [1 / 3, 2 / 3, 0.0])
    np.testing.assert_allclose(apply_blend(blend, P, "regression")[:, 0], [1.0, 1.0])


def test_bagged_hill_climbing_averages_selection_shares_over_bags():
    rng = np.random.default_rng(0)
    y = rng.normal(size=300)
    P = np.stack([y + rng.normal(scale=s, size=300) for s in (0.3, 0.5, 2.0, 3.0)])[:, :, None]
    blend = fit_blend("hill", P, regression_problem(y), np.arange(300), BlendOptions(hill_init=1, hill_bags=10,
                                                                                         hill_bag_fraction=0.75))
    assert blend.weights.sum() == pytest.approx(1.0)
    assert blend.weights[0] > blend.weights[2] and blend.weights[0] > blend.weights[3]
    assert (blend.weights >= 0).all()


def test_bagged_hill_climbing_of_two_members_weighs_them_by_score_in_either_order():
    """Two members: a bag of round(0.7 * 2) = 1 would weigh each by how often it was drawn; bags hold both."""
    rng = np.random.default_rng(3)
    y = rng.normal(size=300)
    P = np.stack([y + rng.normal(scale=s, size=300) for s in (0.3, 2.0)])[:, :, None]
    weights = [fit_blend("hill", Q, regression_problem(y), np.arange(300), BlendOptions()).weights
               for Q in (P, P[::-1])]
    assert weights[0][0] > 0.5
    np.testing.assert_allclose(weights[0], weights[1][::-1])


# --- weighted blend ------------------------------------------------------------------------------------------------

def test_weighted_blend_recovers_known_weights():
    rng = np.random.default_rng(1)
    members = rng.normal(size=(4, 2000))
    y = 0.2 * members[0] + 0.5 * members[1] + 0.3 * members[2]  # member 3 is noise
    blend = fit_blend("weighted", members[:, :, None], regression_problem(y), np.arange(2000))
    np.testing.assert_allclose(blend.weights, [0.2, 0.5, 0.3, 0.0], atol=1e-3)


def test_weighted_blend_recovers_probability_weights():
    rng = np.random.default_rng(2)
    logits = rng.normal(scale=2.0, size=(3, 20000))
    members = 1 / (1 + np.exp(-logits))
    truth = 0.7 * members[0] + 0.3 * members[1]  # the labels are drawn from this mixture
    y = (rng.random(20000) < truth).astype(int)
    blend = fit_blend("weighted", members[:, :, None], binary_problem(y, "log_loss"), np.arange(20000))
    np.testing.assert_allclose(blend.weights, [0.7, 0.3, 0.0], atol=0.05)


def test_log_error_metrics_blend_in_log_space():
    y = np.array([100.0, 1000.0])
    P = np.array([[[10.0], [100.0]], [[1000.0], [10000.0]]])
    blend = fit_blend("mean", P, regression_problem(y, "rmse_log"), np.arange(2))
    np.testing.assert_allclose(apply_blend(blend, P, "regression")[:, 0], [100.0, 1000.0])  # geometric mean


# --- rank averaging and thresholds ---------------------------------------------------------------------------------

def test_rank_average_is_comparable_between_fitting_rows_and_new_rows():
    rng = np.random.default_rng(3)
    y = rng.integers(0, 2, 400)
    # Two equally good members with independent noise, on scales 1 and 100: a raw mean is the second alone.
    P = np.stack([y * 0.3 + rng.random(400) * 0.7, (y * 0.3 + rng.random(400) * 0.7) * 100])[:, :, None]
    problem = binary_problem(y, "roc_auc")
    blend = fit_blend("rank", P, problem, np.arange(400))
    ranks = apply_blend(blend, P, "binary")
    assert ranks.min() >= 0 and ranks.max() <= 1
    singles = [score_table(problem, np.clip(P[j] / P[j].max(), 0, 1)) for j in range(2)]
    assert score_table(problem, ranks) > max(singles) + 0.01
    # A new row equal to a member's largest fitted prediction ranks near 1 under that member.
    new = np.array([[[P[0].max()]], [[P[1].max()]]])
    assert apply_blend(blend, new, "binary")[0, 0] > 0.99


def test_f1_cut_off_is_tuned_on_the_fitting_rows_only():
    rng = np.random.default_rng(4)
    y = (rng.random(600) < 0.2).astype(int)
    P = (y * 0.15 + rng.random(600) * 0.4)[None, :, None]  # every probability is below 0.55: 0.5 is a poor cut
    problem = binary_problem(y, "f1")
    blend = fit_blend("mean", P, problem, np.arange(300))
    assert blend.decision.threshold != 0.5
    moved = y.copy()
    moved[300:] = 1 - moved[300:]  # rows outside the fitting rows cannot move the cut-off
    again = fit_blend("mean", P, binary_problem(moved, "f1"), np.arange(300))
    assert again.decision.threshold == blend.decision.threshold


def calibrated_members(n: int = 600, rate: float = 0.25, seed: int = 11) -> tuple[np.ndarray, np.ndarray]:
    """Three members' calibrated probabilities (P(y=1 | the member's score) as they say) of a rare positive class."""
    rng = np.random.default_rng(seed)
    y = (rng.random(n) < rate).astype(int)
    members = []
    for strength in (2.0, 2.5, 3.0):  # score ~ N(strength * y, 1): its posterior log-odds are exact
        score = strength * y + rng.normal(size=n)
        members.append(1 / (1 + np.exp(-(np.log(rate / (1 - rate)) + strength * score - strength ** 2 / 2))))
    return np.stack(members)[:, :, None], y


@pytest.mark.parametrize("method", ["mean", "top-k", "weighted", "rank", "hill",
                                    pytest.param("stack", marks=pytest.mark.slow)])  # a grid search of meta-models
@pytest.mark.parametrize("setup", ["accuracy", "f1", "roc_auc, label submission", "roc_auc, probability submission"])
def test_labels_are_cut_where_the_blends_own_fitting_rows_say(method, setup):
    """Every blend method under every metric kind: a label submission is cut at a cut-off fitted on the blend's
    own fitting rows for its label metric (accuracy for a ranking metric), never at 0.5 on ranks; only a
    calibrated blend scored by accuracy keeps 0.5; a probability submission is not cut."""
    from kbert.ensembles.blend import Decision
    from kbert.pipeline.predictions import submission_values, tune_threshold

    P, y = calibrated_members()
    metric, _, submits = setup.partition(", ")
    problem = Problem("binary", get_metric(metric), y, y, [0, 1],
                      submits="score" if "probability" in submits else "label")
    rows = np.arange(400)  # the fitting rows; the cut-off must not read the others
    blend = fit_blend(method, P, problem, rows)
    blended = apply_blend(blend, P, "binary")[:, 0]
    if submits == "probability submission":
        assert blend.decision == Decision() and problem.cut_metric is None
        written = submission_values("binary", blended, {"y": "float"}, ["y"], [0, 1], blend.decision.threshold)
        np.testing.assert_array_equal(written["y"], blended)  # probabilities, as blended
        return
    cut_metric = get_metric("accuracy" if metric == "roc_auc" else metric)
    assert problem.cut_metric == cut_metric
    if method != "rank" and metric == "accuracy":  # calibrated probabilities: 0.5 is accuracy's best cut-off
        assert blend.decision.threshold == 0.5
    else:
        assert blend.decision.threshold == tune_threshold(cut_metric, y[rows], blended[rows])
    if method == "rank":  # ranks are uniform in (0, 1): a cut at 0.5 would label half the rows positive
        assert blend.decision.threshold != 0.5
    labels = submission_values("binary", blended, {"y": "int"}, ["y"], [0, 1], blend.decision.threshold)["y"]
    assert abs(labels[rows].mean() - y[rows].mean()) <= 0.1
    # Nested: the cut-off of each outer fold's blend is fitted on that fold's fitting rows only.
    folds = np.arange(len(y)) % 4
    result = nested_cv(method, P, problem, folds)
    for (fit_rows, _), fold_blend in zip(result.splits, result.blends):
        table = apply_blend(fold_blend, P, "binary")[:, 0]
        if method == "rank" or metric != "accuracy":
            assert fold_blend.decision.threshold == tune_threshold(cut_metric, y[fit_rows], table[fit_rows])


def test_multilabel_ranks_get_a_cut_off_per_label_for_accuracy_under_a_ranking_metric():
    from kbert.pipeline.predictions import tune_label_thresholds

    P, y = calibrated_members()
    P2, y2 = calibrated_members(seed=12, rate=0.4)
    both, truth = np.concatenate([P, P2], axis=2), np.stack([y, y2], axis=1)
    problem = Problem("multilabel", get_metric("roc_auc"), truth, truth, None, submits="label")
    blend = fit_blend("rank", both, problem, np.arange(400))
    table = apply_blend(blend, both, "multilabel")
    expected = tune_label_thresholds(truth[:400], table[:400], get_metric("accuracy"))
    np.testing.assert_array_equal(blend.decision.threshold, expected)
    assert (np.asarray(blend.decision.threshold) != 0.5).all()


# --- stacking and nested CV ----------------------------------------------------------------------------------------

def test_stacking_nested_cv_never_trains_on_the_fold_it_scores():
    rng = np.random.default_rng(5)
    n = 250
    y = rng.integers(0, 2, n)
    P = np.stack([np.clip(0.5 + (y - 0.5) * s + rng.normal(scale=0.25, size=n), 0.01, 0.99) for s in (0.4, 0.2, 0.1)])
    P = P[:, :, None]
    folds = np.arange(n) % 5
    problem = binary_problem(y, "roc_auc")
    result = nested_cv("stack", P, problem, folds, BlendOptions(inner_folds=3))
    scored = np.concatenate([score_rows for _, score_rows in result.splits])
    assert sorted(scored.tolist()) == list(range(n))  # every row scored exactly once
    for (fit_rows, score_rows), blend, f in zip(result.splits, result.blends, range(5)):
        assert set(score_rows) == set(np.flatnonzero(folds == f))
        assert not set(fit_rows) & set(score_rows)
        assert set(blend.fitted_rows) == set(fit_rows)
        assert len(blend.inner_splits) == 3
        for inner_train, inner_valid in blend.inner_splits:  # the inner CV stays inside the outer training part
            assert set(inner_train) <= set(fit_rows) and set(inner_valid) <= set(fit_rows)
            assert not set(inner_train) & set(inner_valid)
        assert blend.meta[0].n_features_in_ == 3
    # Flipping the labels of fold 0 changes nothing that was fitted for fold 0's blend.
    flipped = y.copy()
    flipped[folds == 0] = 1 - flipped[folds == 0]
    again = nested_cv("stack", P, binary_problem(flipped, "roc_auc"), folds, BlendOptions(inner_folds=3))
    def coefficients(r, f):
        return r.blends[f].meta[0].coef_

    np.testing.assert_array_equal(coefficients(again, 0), coefficients(result, 0))
    assert not np.array_equal(coefficients(again, 1), coefficients(result, 1))
    assert 0.5 < result.score <= 1.0 and result.in_sample >= result.score - 0.05


@pytest.mark.slow
def test_every_method_runs_for_each_task():
    rng = np.random.default_rng(6)
    n = 200
    folds = np.arange(n) % 4
    y = rng.integers(0, 3, n)
    probs = rng.dirichlet(np.ones(3), size=(3, n))
    probs[:, np.arange(n), y] += 1.0
    probs /= probs.sum(axis=2, keepdims=True)
    multiclass = Problem("multiclass", get_metric("accuracy"), y, y, [0, 1, 2])
    values = rng.lognormal(10, 0.5, n)
    regression = regression_problem(values, "rmse_log")
    members = np.stack([values * rng.lognormal(0, s, n) for s in (0.1, 0.2, 0.3)])[:, :, None]
    for problem, P, methods in ((multiclass, probs, ["mean", "top-k", "weighted", "hill", "stack"]),
                                (regression, members, ["mean", "top-k", "weighted", "hill", "stack"])):
        for method in methods:
            result = nested_cv(method, P, problem, folds)
            assert np.isfinite(result.score)
    with pytest.raises(KbertError, match="method 'rank' does not apply to a regression task"):
        fit_blend("rank", members, regression, np.arange(n))


# --- members on disk and kbert ensemble ----------------------------------------------------------------------------

def expected_for(name: str) -> Expected:
    """What a member of a bundled (or benchmark) competition must match."""
    comp = load_competition(name)
    return expected_of(comp, load_competition_data(comp))


def write_member(folder, expected: Expected, oof, test, rows: int | None = None, **settings) -> None:
    """A member as kbert writes one: oof.csv and test.csv, folds.csv (one split shared by every member written
    here), config.yaml and a metrics.json recording the competition, its data files and the CV its oof.csv scores.
    ``rows``: the first rows only, as a ``--limit-rows`` run; ``settings``: its config's others."""
    comp, rows = expected.competition, rows or len(expected.train_ids)
    ids, columns = expected.train_ids[:rows], expected.columns
    oof, test = np.asarray(oof, float).reshape(rows, -1), np.asarray(test, float).reshape(len(expected.test_ids), -1)
    folder.mkdir(parents=True)
    for name, frame_ids, table in (("oof.csv", ids, oof), ("test.csv", expected.test_ids, test)):
        frame = pd.concat([pd.DataFrame({comp.id_column: frame_ids.to_numpy()}), pd.DataFrame(table, columns=columns)],
                          axis=1)
        frame.to_csv(folder / name, index=False)
    pd.DataFrame({comp.id_column: ids.to_numpy(), "fold": np.arange(rows) % 5}).to_csv(folder / "folds.csv",
                                                                                       index=False)
    covered = ~np.isnan(oof).all(axis=1)
    cv = (score(get_metric(comp.metric), comp.task, expected.truth[:rows][covered], native(comp.task, oof[covered]),
                0.5, expected.classes) if np.isfinite(oof[covered]).all() else 0.0)  # (a damaged file's)
    config = resolve_run_config(comp, {"seed": 1, "limit_rows": rows if rows < len(expected.train_ids) else None,
                                       **settings})
    (folder / "metrics.json").write_text(json.dumps({
        "schema": SCHEMA, "competition": comp.name, "task": comp.task, "metric": comp.metric, "cv": cv,
        "cv_threshold": 0.5, "inputs": expected.inputs, "config_sha256": config_fingerprint(config)}))
    (folder / "config.yaml").write_text(yaml.safe_dump(config.to_dict()))


@pytest.fixture
def spaceship_members(tmp_path):
    expected = expected_for("spaceship-titanic")
    rng = np.random.default_rng(7)
    y = expected.truth.astype(float)
    runs = tmp_path / "runs" / "spaceship-titanic"
    for i, noise in enumerate((0.3, 0.4, 0.5)):
        oof = np.clip(0.5 + (y - 0.5) * 0.4 + rng.normal(scale=noise, size=len(y)), 0.01, 0.99)
        write_member(runs / (f"run-{i}" if i < 2 else "study/trial-0004"), expected, oof,
                     rng.random(len(expected.test_ids)))
    # A --limit-rows run covers fewer rows: skipped by `all`, an error when named.
    write_member(runs / "partial", expected, np.full(100, 0.5), np.full(len(expected.test_ids), 0.5), rows=100)
    # A --permute-target sanity run: skipped by `all` (it refused every default ensemble), an error when named.
    write_member(runs / "shuffled", expected, rng.random(len(y)), rng.random(len(expected.test_ids)),
                 permute_target=True)
    return tmp_path


def test_member_selection(spaceship_members):
    expected = expected_for("spaceship-titanic")
    runs = spaceship_members / "runs" / "spaceship-titanic"
    notes = []
    members = select_members(runs, "all", expected, True, log=notes.append)
    assert [m.name for m in members] == ["run-0", "run-1", "study/trial-0004"]
    assert notes == ["skipped 1 run(s) that do not cover every training and test row: partial",
                     "skipped 1 run(s) trained with --permute-target (sanity checks on shuffled targets): shuffled"]
    with pytest.raises(KbertError, match=r"^member shuffled: trained with --permute-target"):
        select_members(runs, "shuffled,run-0", expected, True)
    assert [m.name for m in select_members(runs, "top:2", expected, True)] == ["run-0", "run-1"]
    assert [m.name for m in select_members(runs, "study/trial-0004,run-1", expected, True)] == \
        ["study/trial-0004", "run-1"]
    with pytest.raises(KbertError, match=r"^member partial: a --limit-rows 100 run: its 100 training rows are not the 8693 "
                                         r"read now$"):
        select_members(runs, "partial", expected, True)
    with pytest.raises(KbertError, match="no finished run 'nope'"):
        select_members(runs, "nope", expected, True)
    with pytest.raises(KbertError, match="^--members: 'run-1' is named twice; name each member once$"):
        select_members(runs, "run-1,run-0, run-1", expected, True)  # (its weights recorded once, summing below 1)
    with pytest.raises(KbertError, match="^--members ',': names no member"):
        select_members(runs, " , ", expected, True)
    with pytest.raises(KbertError, match="K in top:K must be an integer"):
        select_members(runs, "top:x", expected, True)


@pytest.mark.slow
def test_spaceship_ensemble_submission_has_true_false_and_the_sample_ids(spaceship_members, capsys):
    from kbert.cli import main

    out = spaceship_members
    code = main(["ensemble", "spaceship-titanic", "--out", str(out / "runs"), "--submissions-dir", str(out / "subs"),
                 "--method", "mean,weighted,hill"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "ensemble: weighted" in printed and "<- submission" in printed
    (path,) = (out / "subs" / "spaceship-titanic").glob("ensemble-*.csv")
    lines = path.read_text().splitlines()
    assert lines[0] == "PassengerId,Transported"
    assert {line.split(",")[1] for line in lines[1:]} == {"True", "False"}
    sample = pd.read_csv(BUNDLED_DATA_DIR / "spaceship-titanic" / "sample_submission.csv")
    assert [line.split(",")[0] for line in lines[1:]] == sample["PassengerId"].tolist()
    sidecar = json.loads(path.with_suffix(".json").read_text())
    assert sidecar["method"] in ("mean", "weighted", "hill")
    assert [m["name"] for m in sidecar["members"]] == ["run-0", "run-1", "study/trial-0004"]
    assert sum(sidecar["weights"].values()) == pytest.approx(1.0, abs=1e-5)
    assert set(sidecar["methods"]) == {"mean", "weighted", "hill"}
    # The honest score is the procedure's, the choice among the three methods made inside each of the 5 x 3 outer
    # folds (tests/test_ensembles.py::test_the_method_choice_is_nested_inside_each_outer_fold).
    assert sidecar["method_choice_nested"] and sum(sidecar["chosen_per_outer_fold"].values()) == 15
    assert set(sidecar["chosen_per_outer_fold"]) <= {"mean", "weighted", "hill"}
    assert sidecar["honest_cv"] == pytest.approx(np.mean(sidecar["honest_cv_per_split"]))
    best_cv = max(m["cv"] for m in sidecar["members"])
    against = sidecar["honest_cv_minus_best_member"]
    assert against["difference"] == pytest.approx(sidecar["honest_cv"] - best_cv)
    assert against["low_95"] <= against["difference"] <= against["high_95"]
    assert "honest - best member" in printed and "the method chosen inside the nested CV" in printed
    assert main(["validate", "spaceship-titanic", str(path)]) == 0


# --- baselines -----------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_baseline_transforms_fit_on_the_training_rows_only(titanic_train, titanic_test):
    from kbert.features import add_features

    train, test = add_features("titanic", titanic_train.drop(columns=["Survived"]), titanic_test)
    y = titanic_train["Survived"].to_numpy()
    fit_rows, other_rows = train.iloc[:600], train.iloc[600:]
    kinds = column_kinds(fit_rows, exclude=("PassengerId",))
    assert "Name" in kinds.text and "Sex" in kinds.categorical and "Age" in kinds.numeric
    for model in ("hgb", "logreg"):  # tickets and cabins, mostly one-offs, are target-encoded
        parts = {name: columns for name, _, columns in
                 make_pipeline(model, kinds, True, 0, prepare(fit_rows, kinds))[0].transformers}
        assert parts["target-encoded"] == ["Ticket", "Cabin"] and "Sex" in parts["categorical"]
        baseline = Baseline(model, "binary", exclude=("PassengerId",))
        before = fit_predict_fold(baseline, fit_rows, y[:600], [test], 0)[0]
        # Rewriting every non-training row (new names, unseen categories) cannot move a fitted transform.
        scrambled = other_rows.assign(Name="Zzyzx, Mr. Qwerty", Sex="unknown", Ticket="NEW-1", Cabin="Z99")
        fit_predict_fold(baseline, fit_rows, y[:600], [scrambled], 0)
        after = fit_predict_fold(baseline, fit_rows, y[:600], [test, scrambled], 0)
        np.testing.assert_array_equal(before, after[0])
        assert before.shape == (len(test), 1) and ((before > 0) & (before < 1)).all()


def test_identifiers_are_dropped_and_trees_skip_short_text():
    rows = pd.DataFrame({
        "Id": np.arange(200),
        "Code": [f"C{i:03d}" for i in range(200)],  # one distinct value per row: an identifier
        "Ticket": [f"T{i // 2}" for i in range(200)],  # shared by two rows: target-encoded
        "Name": [f"Smith{i}, Mr. John Q" for i in range(200)],  # four words: short text
        "Review": [f"word{i % 97} word{i % 89} and {i} more words about it" for i in range(200)],  # long text
    })
    kinds = column_kinds(rows, exclude=("Id",))
    assert kinds.identifiers == ["Code"] and kinds.categorical == ["Ticket"]
    assert kinds.text == ["Name", "Review"]
    for model, expected in (("hgb", ["text:Review"]), ("logreg", ["text:Name", "text:Review"])):
        parts = make_pipeline(model, kinds, True, 0, prepare(rows, kinds))[0].transformers
        used = {column for _, _, columns in parts for column in ([columns] if isinstance(columns, str) else columns)}
        assert "Code" not in used and "Ticket" in used
        assert [name for name, _, _ in parts if name.startswith("text:")] == expected


@pytest.mark.slow
def test_kbert_baseline_writes_a_member_on_the_run_folds(tmp_path, capsys, monkeypatch):
    from kbert.cli import main

    args = ["--out", str(tmp_path / "runs"), "--submissions-dir", str(tmp_path / "subs")]
    assert main(["baseline", "titanic", "--folds", "3", *args]) == 0
    member = tmp_path / "runs" / "titanic" / "baseline-hgb-seed42"
    metrics = json.loads((member / "metrics.json").read_text())
    assert metrics["baseline"] == "hgb" and 0.75 < metrics["cv"] < 0.9 and len(metrics["folds"]) == 3
    folds = pd.read_csv(member / "folds.csv")
    shared = pd.read_csv(next((tmp_path / "runs" / "titanic" / "folds").glob("*.csv")))
    pd.testing.assert_frame_equal(folds, shared)  # the same split file as kbert run uses
    oof = pd.read_csv(member / "oof.csv")
    assert list(oof.columns) == ["PassengerId", "Survived"] and len(oof) == 891
    assert main(["validate", "titanic", str(tmp_path / "subs" / "titanic" / "baseline-hgb-seed42.csv")]) == 0
    assert main(["baseline", "titanic", "--folds", "3", *args]) == 2  # the folder exists: no overwrite
    assert "already exists" in capsys.readouterr().err
    # KBERT_LIMIT_ROWS as for kbert run; one split of repeated folds, and its config.yaml says so
    yaml_path = tmp_path / "titanic.yaml"
    yaml_path.write_text((BUNDLED_DIR / "titanic.yaml").read_text().replace("folds:\n", "folds:\n  repeats: 2\n", 1))
    monkeypatch.setenv("KBERT_LIMIT_ROWS", "120")
    assert main(["baseline", str(yaml_path), "--folds", "3", "--run-id", "r", *args]) == 0
    assert "note: a baseline trains one split of the folds; folds.repeats 2 is for kbert run" in capsys.readouterr().out
    repeated = tmp_path / "runs" / "titanic" / "r"
    assert len(pd.read_csv(repeated / "oof.csv")) == 120 and list(pd.read_csv(repeated / "folds.csv").columns) == [
        "PassengerId", "fold"]
    assert yaml.safe_load((repeated / "config.yaml").read_text())["run_config"]["competition"]["folds"]["repeats"] == 1


@pytest.mark.slow
def test_house_prices_baseline_predicts_prices_in_log_space(tmp_path):
    from kbert.ensembles.baseline import run_baseline
    from kbert.pipeline.config import resolve_run_config

    houses = load_competition("house-prices-advanced-regression-techniques")
    config = resolve_run_config(houses, {"folds": 3, "out_dir": str(tmp_path / "runs"),
                                         "submissions_dir": str(tmp_path / "subs")})
    result = run_baseline(config, "logreg", log=lambda line: None)
    assert 0.09 < result.cv_score < 0.14, result.cv_score  # RMSE of log prices: trimmed lasso, 0.128 on 5 folds
    test = pd.read_csv(result.run_dir / "test.csv")
    assert test["SalePrice"].between(20_000, 1_000_000).mean() > 0.99


def test_trimmed_regressor_drops_planted_outliers_and_recovers_the_line():
    from sklearn.linear_model import LinearRegression

    from kbert.ensembles.baseline import TrimmedRegressor

    rng = np.random.default_rng(0)
    x = rng.uniform(0, 10, 200)
    y = 2.0 * x + 1.0 + rng.uniform(-0.1, 0.1, 200)  # bounded noise: no clean row is anywhere near the cut-off
    x[:2], y[:2] = [30.0, 32.0], [5.0, 4.0]  # two huge, cheap houses: far out in x, far below the line
    X = x[:, None]
    plain = LinearRegression().fit(X, y)
    trimmed = TrimmedRegressor(LinearRegression()).fit(X, y)
    assert abs(plain.coef_[0] - 2.0) > 0.3  # the two rows pull the plain fit's slope
    assert trimmed.dropped_ == 2
    np.testing.assert_allclose([trimmed.estimator_.coef_[0], trimmed.estimator_.intercept_], [2.0, 1.0], atol=0.02)
    np.testing.assert_allclose(trimmed.predict(np.array([[5.0]])), [11.0], atol=0.02)
    clean = TrimmedRegressor(LinearRegression()).fit(X[2:], y[2:])
    assert clean.dropped_ == 0


def test_skewed_log1p_picks_its_columns_on_the_fitting_rows():
    from kbert.ensembles.baseline import SkewedLog1p

    rng = np.random.default_rng(0)
    fit_rows = np.column_stack([rng.lognormal(3, 1, 500),  # skewed, non-negative: logged
                                rng.normal(50, 5, 500),  # symmetric: kept
                                -rng.lognormal(3, 1, 500)])  # skewed but negative: kept
    transform = SkewedLog1p().fit(fit_rows)
    assert transform.columns_ == [0]
    other_rows = np.column_stack([rng.normal(50, 5, 10), rng.lognormal(3, 1, 10), rng.normal(0, 1, 10)])
    out = transform.transform(other_rows)  # other rows' skew does not matter: column 0 only
    np.testing.assert_allclose(out[:, 0], np.log1p(np.clip(other_rows[:, 0], 0, None)))
    np.testing.assert_array_equal(out[:, 1:], other_rows[:, 1:])


@pytest.mark.slow
@pytest.mark.parametrize("model", ["lgbm", "catboost"])
def test_optional_gradient_boosting_baselines(model, titanic_train, titanic_test):
    pytest.importorskip("lightgbm" if model == "lgbm" else "catboost")
    from kbert.features import add_features

    train, test = add_features("titanic", titanic_train.drop(columns=["Survived"]), titanic_test)
    y = titanic_train["Survived"].to_numpy()
    valid, predicted = fit_predict_fold(Baseline(model, "binary", exclude=("PassengerId",)), train.iloc[:600], y[:600],
                                        [train.iloc[600:], test], 0)
    assert predicted.shape == (len(test), 1) and ((predicted > 0) & (predicted < 1)).all()
    assert get_metric("roc_auc")(y[600:], valid[:, 0]) > 0.8


def test_the_method_choice_is_nested_inside_each_outer_fold():
    """Each outer fold chooses its method by the other outer folds (fitted without it): changing the truth of fold 0
    changes neither what fold 0 chose nor what it predicted, though it changes the other folds' blends."""
    from kbert.ensembles.blend import nested_choice

    rng = np.random.default_rng(13)
    n = 200
    y = rng.normal(size=n)
    a, b = y + rng.normal(scale=0.1, size=n), y + rng.normal(scale=1.0, size=n)
    P = np.stack([a, b])[:, :, None]
    folds = np.stack([np.arange(n) % 4, rng.permutation(n) % 4])
    options = BlendOptions(top_k=1)
    changed = y.copy()
    changed[folds[0] == 0] = b[folds[0] == 0]  # on fold 0 of the first split, member b is right and a is not

    def procedure(truth):
        problem = regression_problem(truth)
        results = {m: nested_cv(m, P, problem, folds, options) for m in ("mean", "top-k", "weighted")}
        return results, nested_choice(results, P, problem, options)

    (results, before), (results_changed, after) = procedure(y), procedure(changed)
    assert before.blends[0].method in ("top-k", "weighted")  # a alone, or nearly: the mean is far worse
    assert min(results_changed.values(), key=lambda r: r.score).method == "mean"  # on every row, fold 0 included
    assert after.blends[0].method == before.blends[0].method
    fold0 = np.flatnonzero(folds[0] == 0)
    np.testing.assert_array_equal(after.predictions[0][fold0], before.predictions[0][fold0])
    assert not np.array_equal(results_changed["weighted"].predictions[0], results["weighted"].predictions[0])
    # The procedure's score is the metric of what the chosen methods predicted, each on its own fold.
    for split, predictions in enumerate(before.predictions):
        assert before.repeat_scores[split] == pytest.approx(regression_problem(y).metric(y, predictions))
        for f in range(4):
            rows = np.flatnonzero(folds[split] == f)
            chosen = before.blends[4 * split + f].method
            np.testing.assert_array_equal(predictions[rows], results[chosen].predictions[split][rows])


def test_repeated_outer_splits_average_their_nested_cv_scores():
    rng = np.random.default_rng(8)
    y = rng.normal(size=120)
    P = np.stack([y + rng.normal(scale=s, size=120) for s in (0.5, 0.7, 1.0)])[:, :, None]
    problem = regression_problem(y)
    splits = np.stack([rng.permutation(120) % 4 for _ in range(3)])
    repeated = nested_cv("weighted", P, problem, splits)
    singles = [nested_cv("weighted", P, problem, folds).score for folds in splits]
    np.testing.assert_allclose(repeated.repeat_scores, singles)
    assert repeated.score == pytest.approx(np.mean(singles)) and len(repeated.blends) == 12


def test_nested_cv_keeps_the_predictions_it_scored():
    rng = np.random.default_rng(3)
    y = rng.normal(size=90)
    P = np.stack([y + rng.normal(scale=s, size=90) for s in (0.4, 0.8)])[:, :, None]
    problem = regression_problem(y)
    result = nested_cv("weighted", P, problem, np.stack([rng.permutation(90) % 3 for _ in range(2)]))
    assert len(result.predictions) == 2
    for predictions, split_score in zip(result.predictions, result.repeat_scores):
        assert problem.metric(y, predictions) == pytest.approx(split_score)


def test_paired_bootstrap_of_a_blend_against_the_best_member():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 400)
    problem = binary_problem(y, "accuracy")
    member = np.where(rng.random(400) < 0.7, y, 1 - y)  # right on about 70% of rows
    same = paired_bootstrap(problem, [member, member], member)
    assert same == (0.0, 0.0, 0.0)  # identical predictions: every resample differs by exactly 0
    better = np.where(rng.random(400) < 0.95, y, 1 - y)
    difference, low, high = paired_bootstrap(problem, [better], member, samples=500, seed=1)
    assert difference == pytest.approx((better == y).mean() - (member == y).mean())
    assert 0 < low < difference < high  # a 25-point gain on 400 rows is far outside the noise
    assert paired_bootstrap(problem, [better], member, samples=500, seed=1) == (difference, low, high)  # seeded
    # Another member right on about 70% of rows: no real difference, so the interval straddles 0.
    coin = np.where(rng.random(400) < 0.7, y, 1 - y)
    _, low, high = paired_bootstrap(problem, [coin], member, samples=500)
    assert low < 0 < high


# --- time-series members: OOF predictions that leave the first block empty ----------------------------------------

def test_forward_chaining_nested_cv_fits_each_blend_on_earlier_rows_only():
    from kbert.pipeline.config import FoldConfig
    from kbert.pipeline.splits import make_folds

    rng = np.random.default_rng(9)
    n, purge = 120, 5
    y = np.linspace(0, 10, n) + rng.normal(scale=0.3, size=n)  # a trend
    P = np.stack([y + rng.normal(scale=s, size=n) for s in (0.5, 1.0)])[:, :, None]
    outer = FoldConfig(k=4, shuffle=False, purge=purge)
    folds = make_folds(pd.Series(np.arange(n), name="id"), None, outer)["fold"].to_numpy()
    result = nested_cv("weighted", P, regression_problem(y), folds, outer=outer)
    first = np.flatnonzero(folds == -1)
    assert len(result.splits) == 4
    for fit_rows, score_rows in result.splits:
        assert fit_rows.max() == score_rows.min() - purge - 1 and fit_rows.min() == 0  # the past, less the purge
    np.testing.assert_array_equal(result.scored_rows, np.arange(len(first), n))  # the first block is never scored
    (predictions,) = result.predictions
    assert len(predictions) == n - len(first)
    assert result.score == pytest.approx(get_metric("rmse")(y[len(first):], predictions))


def test_a_forward_chaining_first_block_of_a_few_rows_still_stacks_and_a_method_that_cannot_fit_is_named():
    """A block of 3 rows holds fewer rows than the stack's 5 inner folds (scikit-learn: 'Cannot have number of
    splits n_splits=5 greater than the number of samples'): the stack takes as many inner folds as rows."""
    from types import SimpleNamespace

    from kbert.ensembles.ensemble import EnsembleSpec, score_methods
    from kbert.pipeline.config import FoldConfig
    from kbert.pipeline.splits import make_folds

    rng = np.random.default_rng(4)
    y = np.array([0, 1, 0, 1, 1, 0, 1, 0, 0, 1, 1, 0])
    P = np.clip(y + rng.normal(scale=0.4, size=(2, 12)), 0.01, 0.99)[:, :, None]
    outer = FoldConfig(k=3, shuffle=False)
    folds = make_folds(pd.Series(np.arange(12), name="id"), None, outer)["fold"].to_numpy()
    result = nested_cv("stack", P, binary_problem(y, "accuracy"), folds, outer=outer)
    assert min(len(fit) for fit, _ in result.splits) == 3 and np.isfinite(result.score)

    # Its first block of one class: the stack's logistic model cannot be fitted there. Of every method it is left
    # out with a note; named alone, it is refused in one line naming it.
    y = np.array([0, 0, 0, 1, 1, 0, 1, 0, 0, 1, 1, 0])
    pool = SimpleNamespace(members=["a", "b"], problem=binary_problem(y, "accuracy"), P=P, fold_of_row=folds[None],
                           outer=outer)  # what score_methods reads of a Pool
    notes = []
    scores = score_methods(pool, EnsembleSpec("a,b", methods="all", folds=3), notes.append)
    assert "stack" not in scores.results and "mean" in scores.results
    (note,) = notes
    assert note.startswith("note: method stack left out: it cannot be fitted on every outer fold's rows (This solver "
                           "needs samples of at least 2 classes")
    with pytest.raises(KbertError, match="^--method stack cannot be fitted on every outer fold's rows "):
        score_methods(pool, EnsembleSpec("a,b", methods="stack", folds=3), notes.append)
    notes.clear()  # top-k of at least as many members as there are is the mean: said (the record kept top_k: 5)
    score_methods(pool, EnsembleSpec("a,b", methods="top-k", folds=3, options=BlendOptions(top_k=5)), notes.append)
    assert notes == ["note: top-k takes the 5 best of 2 members: it is the plain mean here"]


def test_kbert_ensemble_blends_time_series_members_on_the_rows_both_cover(tmp_path, capsys):
    from pathlib import Path

    from kbert.cli import main

    heads = Path(__file__).resolve().parent.parent / "benchmarks" / "heads"
    expected = expected_for(str(heads / "elnino.yaml"))
    train = pd.read_csv(heads / "data" / "elnino" / "train.csv")
    test_ids = expected.test_ids
    truth = train[["h1", "h2", "h3"]].to_numpy()
    rng = np.random.default_rng(10)
    runs = tmp_path / "runs" / "elnino"
    for name, empty, noise in (("series-a", 116, 0.4), ("series-b", 140, 0.6)):  # forward-chaining: no OOF at first
        oof = truth + rng.normal(scale=noise, size=truth.shape)
        oof[:empty] = np.nan
        write_member(runs / name, expected, oof, rng.normal(25, 1, (len(test_ids), 3)))
    lines = (runs / "series-a" / "oof.csv").read_text().splitlines()
    assert lines[1] == "0,,," and lines[117].count(",,") == 0  # empty cells, then predictions

    code = main(["ensemble", str(heads / "elnino.yaml"), "--out", str(tmp_path / "runs"), "--submissions-dir",
                 str(tmp_path / "subs"), "--method", "mean,weighted,stack"])
    printed = capsys.readouterr().out
    assert code == 0
    assert f"blending on the {len(train) - 140} of {len(train)} training rows" in printed
    (path,) = (tmp_path / "subs" / "elnino").glob("ensemble-*.csv")
    sidecar = json.loads(path.with_suffix(".json").read_text())
    assert sidecar["rows_blended"] == len(train) - 140 and sidecar["outer_repeats"] == 1
    assert np.isfinite(sidecar["honest_cv"]) and set(sidecar["methods"]) == {"mean", "weighted", "stack"}
    assert sidecar["weights"]["series-a"] > sidecar["weights"]["series-b"]  # the less noisy member
    submission = pd.read_csv(path)
    assert list(submission.columns) == ["id", "h1", "h2", "h3"] and submission.notna().all().all()


def test_a_member_row_with_some_empty_cells_is_refused(tmp_path):
    from pathlib import Path

    from kbert.ensembles.members import load_member

    heads = Path(__file__).resolve().parent.parent / "benchmarks" / "heads"
    expected = dataclasses.replace(expected_for(str(heads / "elnino.yaml")), train_ids=pd.Series(np.arange(6)),
                                   test_ids=pd.Series(np.arange(2)), truth=np.ones((6, 3)))
    oof = np.ones((6, 3))
    oof[:2] = np.nan  # no OOF prediction for rows 0 and 1: fine
    write_member(tmp_path / "m", expected, oof, np.ones((2, 3)))
    member = load_member(tmp_path / "m", tmp_path, expected)
    assert member.covered.tolist() == [False, False, True, True, True, True]
    oof[3, 1] = np.nan  # one cell of a predicted row missing: corrupt
    write_member(tmp_path / "n", expected, oof, np.ones((2, 3)))
    with pytest.raises(KbertError, match=r"n/oof.csv: column 'h2' must hold finite numbers, found an empty or NaN cell \(row 5\)"):
        load_member(tmp_path / "n", tmp_path, expected)
    write_member(tmp_path / "t", expected, np.ones((6, 3)), np.full((2, 3), np.nan))
    with pytest.raises(KbertError, match=r"t/test.csv: column 'h1' must hold finite numbers, found an empty or NaN cell \(row 2\)"):
        load_member(tmp_path / "t", tmp_path, expected)


@pytest.mark.parametrize("kind", ["binary", "multiclass", "regression"])
def test_stack_regularisation_is_grid_search_cv(kind):
    """The stack's inner choice of C (alpha) and its refit equal scikit-learn's GridSearchCV scored by log-loss
    (squared error), and its log-loss equals scikit-learn's, a class unseen in training included."""
    from sklearn.linear_model import LogisticRegression, Ridge
    from sklearn.metrics import log_loss, make_scorer
    from sklearn.model_selection import GridSearchCV, KFold

    from kbert.ensembles import blend

    rng = np.random.default_rng(3)
    X = rng.normal(size=(150, 4))
    signal = X[:, 0] + 0.5 * X[:, 1] + rng.normal(scale=1.5, size=150)
    splits = list(KFold(5, shuffle=True, random_state=0).split(X))
    if kind == "regression":
        ours = blend.regularised(lambda a: Ridge(alpha=a), blend.RIDGE_ALPHA, X, signal, splits,
                                 blend.model_squared_error)
        theirs = GridSearchCV(Ridge(), {"alpha": blend.RIDGE_ALPHA}, cv=splits, scoring="neg_mean_squared_error")
        y = signal
    else:
        y = (signal > 0).astype(int) if kind == "binary" else np.digitize(signal, [-1.0, 1.0])
        ours = blend.regularised(lambda c: LogisticRegression(C=c, max_iter=2000), blend.LOGISTIC_C, X, y, splits,
                                 blend.model_log_loss)
        scorer = make_scorer(log_loss, greater_is_better=False, response_method="predict_proba",
                             labels=sorted(set(y)))
        theirs = GridSearchCV(LogisticRegression(max_iter=2000), {"C": blend.LOGISTIC_C}, cv=splits, scoring=scorer)
        np.testing.assert_allclose(blend.model_log_loss(ours, X, y), log_loss(y, ours.predict_proba(X)), rtol=1e-12)
    if kind == "multiclass":  # a model that never saw the top class: that class's rows score at epsilon
        seen = y != y.max()
        partial = LogisticRegression().fit(X[seen], y[seen])
        expected = log_loss(y, np.column_stack([partial.predict_proba(X), np.zeros(len(y))]), labels=sorted(set(y)))
        np.testing.assert_allclose(blend.model_log_loss(partial, X, y), expected, rtol=1e-12)
    theirs.fit(X, y)
    assert (ours.C if kind != "regression" else ours.alpha) == next(iter(theirs.best_params_.values()))
    np.testing.assert_array_equal(ours.coef_, theirs.best_estimator_.coef_)


def test_trees_fit_a_text_column_of_words_each_seen_once():
    """A free-text column of part codes (many distinct words, few in two rows): the trees' TF-IDF keeps too few
    words for its 32 SVD components and the fit stopped ('n_components(32) must be <= n_features'); such a column
    is left to the linear model."""
    rng = np.random.default_rng(0)
    rows = pd.DataFrame({"x": rng.normal(size=200),
                         "parts": [" ".join(f"P{v}" for v in rng.integers(0, 100000, 8)) for _ in range(200)]})
    y = (rows["x"] > 0).astype(int).to_numpy()
    kinds = column_kinds(rows, exclude=())
    assert kinds.text == ["parts"]
    for model in ("hgb", "logreg"):
        make_pipeline(model, kinds, True, 0, rows).fit(prepare(rows, kinds), y)


def test_trees_fit_a_class_held_by_a_single_row():
    """The trees' early stopping holds out a stratified share of the rows, which a class of one row cannot give
    ('The least populated class in y has only 1 member'): that fold trains its full rounds instead."""
    rng = np.random.default_rng(0)
    rows = pd.DataFrame({"x": rng.normal(size=80)})
    y = np.where(rows["x"] > 0, 1, 0)
    y[0] = 2  # 'pink car': one row
    baseline = Baseline("hgb", "multiclass", classes=3)
    valid, = fit_predict_fold(baseline, rows, y, [rows.iloc[:5]], 0)
    assert valid.shape == (5, 3) and np.allclose(valid.sum(axis=1), 1.0)
    assert make_pipeline("hgb", column_kinds(rows, ()), True, 0, rows)[-1].early_stopping is True  # otherwise kept
    # Six rows of two classes: a holdout of ceil(0.15 * 6) = 1 row cannot hold both ('The test_size = 1 should be
    # greater or equal to the number of classes = 2'), a fold of a tiny table.
    few = rows.iloc[:6]
    valid, = fit_predict_fold(Baseline("hgb", "binary"), few, np.array([0, 1, 0, 1, 0, 1]), [few], 0)
    assert valid.shape == (6, 1)


def test_the_linear_model_fits_a_text_column_whose_words_are_each_in_one_row():
    """Its TF-IDF keeps words seen in two rows or more; with none (a tiny fold), scikit-learn refused the fit ('After
    pruning, no terms remain'): the column is left out, as it gives the model no word to read."""
    rows = pd.DataFrame({"x": np.arange(8.0), "words": [f"alpha{i} beta{i} gamma{i} delta{i}" for i in range(8)]})
    kinds = column_kinds(rows, exclude=())
    assert kinds.text == ["words"]
    valid, = fit_predict_fold(Baseline("logreg", "binary"), rows, np.array([0, 1] * 4), [rows], 0)
    assert valid.shape == (8, 1)


@pytest.mark.parametrize("model", ["hgb", "logreg", "lgbm"])
def test_a_column_missing_on_every_training_row_is_left_out(model):
    """An all-empty column (numeric or text) reads as nothing: the trees' binning failed on it ('window shape
    cannot be larger than input array shape', reported as the fold's rows being too few)."""
    rng = np.random.default_rng(0)
    rows = pd.DataFrame({"x": rng.normal(size=60), "empty": np.nan, "blank": pd.Series([None] * 60, dtype=object)})
    kinds = column_kinds(rows, exclude=())
    assert kinds.numeric == ["x"] and kinds.categorical == kinds.text == kinds.identifiers == []
    valid, = fit_predict_fold(Baseline(model, "binary"), rows, (rows["x"] > 0).astype(int).to_numpy(), [rows], 0)
    assert valid.shape == (60, 1)


def test_a_choice_among_methods_needs_three_outer_folds(tmp_path):
    """With two outer folds, each one's inner folds are the other fold, which it scores: no rows to fit a method on,
    so every fold 'chose' the first method, and the nested choice was reported as honest."""
    from kbert.ensembles.ensemble import EnsembleSpec, build_ensemble

    expected = expected_for("titanic")
    rng = np.random.default_rng(3)
    for name in ("a", "b"):
        oof = np.clip(expected.truth * 0.6 + rng.random(len(expected.truth)) * 0.4, 0, 1)
        write_member(tmp_path / "titanic" / name, expected, oof, rng.random(len(expected.test_ids)))
    with pytest.raises(KbertError, match=r"^--outer-folds 2: choosing among 2 methods needs 3 or more"):
        build_ensemble(load_competition("titanic"), EnsembleSpec(methods="mean,rank", folds=2, repeats=1),
                       runs_dir=str(tmp_path), log=lambda _: None)
    one = build_ensemble(load_competition("titanic"), EnsembleSpec(methods="mean", folds=2, repeats=1),
                         runs_dir=str(tmp_path), log=lambda _: None)
    assert one.chosen == "mean"
