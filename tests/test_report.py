"""`kbert report`: PNG plots and a self-contained index.html for a run, a baseline, a study and an ensemble,
built from tiny real artifacts; wrong targets and a missing matplotlib are clear errors."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from kbert.cli import main
from kbert.errors import KbertError
from kbert.pipeline.config import load_competition, resolve_run_config
from kbert.report import format_score, write_report
from tests.tiny import run_tiny

REPO = Path(__file__).resolve().parent.parent
HEADS = REPO / "benchmarks" / "heads"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def titanic_runs(tmp_path_factory) -> Path:
    """runs/titanic/: a tiny MLX run (120 rows, 3 folds, 2 epochs, OOF-tuned threshold) and two baselines on
    every row; the baselines make an ensemble."""
    from kbert.ensembles.baseline import run_baseline

    out = tmp_path_factory.mktemp("report")
    run_tiny("titanic", out, "tiny", limit_rows=120, folds=3, epochs=2, threshold="tune")
    for model in ("logreg", "hgb"):
        config = resolve_run_config(load_competition("titanic"), {"folds": 3, "out_dir": str(out / "runs"),
                                                                  "submissions_dir": str(out / "subs")})
        run_baseline(config, model, log=lambda _: None)
    return out


@pytest.fixture(scope="module")
def ensemble_sidecar(titanic_runs) -> Path:
    from kbert.ensembles.ensemble import EnsembleSpec, build_ensemble, write_ensemble

    result = build_ensemble(load_competition("titanic"), EnsembleSpec(methods="mean,weighted,hill", folds=3, repeats=1),
                            runs_dir=str(titanic_runs / "runs"), log=lambda _: None)
    return write_ensemble(result, str(titanic_runs / "subs")).sidecar_path


@pytest.fixture(scope="module")
def study_dir(tmp_path_factory) -> Path:
    from kbert.tune import tune
    from tests.test_tune import tiny_options

    options = tiny_options(tmp_path_factory.mktemp("study"), trials=2)
    tune(options)
    return Path(options.out_dir) / "titanic" / options.study


def assert_png(path: Path) -> None:
    """A real PNG that decodes to a picture larger than 100 x 100 pixels."""
    from matplotlib.image import imread

    assert path.is_file(), path
    assert path.read_bytes()[:8] == PNG_SIGNATURE, path
    image = imread(path)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100, (path, image.shape)


def assert_report(page: Path, expected: set[str]) -> str:
    """index.html references every PNG of its folder by a relative src, every src exists and is a PNG, the
    ``expected`` ones among them; no temp file is left; no script or remote resource. Returns the HTML."""
    assert page.name == "index.html" and page.is_file()
    text = page.read_text(encoding="utf-8")
    sources = re.findall(r'<img src="([^"]+)"', text)
    folder = page.parent
    pngs = {p.name for p in folder.glob("*.png")}
    assert expected <= pngs, expected - pngs
    assert set(sources) == pngs
    for source in sources:
        assert "/" not in source and ":" not in source  # relative, beside the page
        assert_png(folder / source)
    assert [p.name for p in folder.iterdir() if p.name.startswith(".") or p.name.endswith(".tmp")] == []
    assert "<script" not in text and "http://" not in text and "https://" not in text
    return text


# ---------------------------------------------------------------- runs


@pytest.mark.slow
def test_titanic_run_report(titanic_runs):
    run_dir = titanic_runs / "runs" / "titanic" / "tiny"
    page = write_report(str(run_dir))
    assert page == run_dir / "report" / "index.html"
    text = assert_report(page, {"fold_scores.png", "curves.png", "confusion.png", "calibration.png"})
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert f"<td>{format_score(metrics['cv'])}</td>" in text
    assert format_score(metrics["cv"]) == f"{metrics['cv']:.4f}"
    assert "threshold tuned on OOF" in text
    for record in metrics["folds"]:
        assert format_score(record["score"]) in text


@pytest.mark.slow
def test_run_id_is_looked_up_and_output_goes_where_asked(titanic_runs, tmp_path):
    page = write_report("tiny", str(titanic_runs / "runs"), str(tmp_path / "elsewhere"))
    assert page == tmp_path / "elsewhere" / "index.html"
    assert_report(page, {"fold_scores.png", "curves.png", "confusion.png", "calibration.png"})
    assert write_report("tiny", str(titanic_runs / "runs"), str(tmp_path / "elsewhere")) == page  # rewrites in place
    # A report over another keeps none of the plots it does not draw: a baseline's has no curves.png
    baseline = next((titanic_runs / "runs" / "titanic").glob("baseline-hgb*"))
    write_report(str(baseline), output=str(tmp_path / "elsewhere"))
    assert_report(page, {"fold_scores.png", "confusion.png", "calibration.png"})
    assert not (tmp_path / "elsewhere" / "curves.png").exists()
    # but never over a page it did not write, nor among a member's files (its PNGs would land beside them)
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "index.html").write_text("<html>my page</html>")
    with pytest.raises(KbertError, match=f"^--output {tmp_path / 'site'}: {tmp_path / 'site' / 'index.html'} is a "
                                         "page kbert did not write"):
        write_report("tiny", str(titanic_runs / "runs"), str(tmp_path / "site"))
    assert sorted(p.name for p in (tmp_path / "site").iterdir()) == ["index.html"]
    baseline = next((titanic_runs / "runs" / "titanic").glob("baseline-logreg*"))
    with pytest.raises(KbertError, match=f"^--output {baseline}: '{baseline / 'index.html'}' is inside the member "):
        write_report("tiny", str(titanic_runs / "runs"), str(baseline))


@pytest.mark.slow
def test_baseline_report_has_no_curves_and_says_why(titanic_runs):
    run_dir = titanic_runs / "runs" / "titanic" / "baseline-hgb-seed42"
    text = assert_report(write_report(str(run_dir)), {"fold_scores.png", "confusion.png", "calibration.png"})
    assert not (run_dir / "report" / "curves.png").exists()
    assert "history.json" in text and "baseline hgb" in text
    cv = json.loads((run_dir / "metrics.json").read_text())["cv"]
    assert format_score(cv) in text


@pytest.mark.slow
def test_permuted_target_run_skips_the_truth_plots_with_a_note(titanic_runs, tmp_path):
    copy = tmp_path / "permuted"
    shutil.copytree(titanic_runs / "runs" / "titanic" / "tiny", copy, ignore=shutil.ignore_patterns("report"))
    config = yaml.safe_load((copy / "config.yaml").read_text())
    config["permute_target"] = True
    (copy / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    text = assert_report(write_report(str(copy)), {"fold_scores.png", "curves.png"})
    assert not (copy / "report" / "confusion.png").exists()
    assert "permute_target" in text


@pytest.mark.slow
def test_regression_run_report_draws_residuals(tmp_path):
    run_dir = run_tiny("house-prices-advanced-regression-techniques", tmp_path, "houses", limit_rows=120).run_dir
    text = assert_report(write_report(str(run_dir)), {"fold_scores.png", "curves.png", "residuals.png"})
    assert not (run_dir / "report" / "confusion.png").exists()
    assert "rmse_log (lower is better)" in text


@pytest.mark.slow
@pytest.mark.parametrize("competition, expected", [
    (HEADS / "titanic-pclass.yaml", {"confusion.png", "calibration.png"}),  # multiclass
    (HEADS / "house-prices-overallqual.yaml", {"confusion.png", "residuals.png"}),  # ordinal
    (HEADS / "spaceship-spending.yaml", {"confusion.png", "calibration.png"}),  # multilabel
])
def test_other_tasks_get_their_plots(competition, expected, tmp_path):
    run_dir = run_tiny(str(competition), tmp_path, limit_rows=90).run_dir
    assert_report(write_report(str(run_dir)), {"fold_scores.png", "curves.png", *expected})


# ---------------------------------------------------------------- study and ensemble


@pytest.mark.slow
def test_study_report(study_dir, capsys):
    page = write_report(str(study_dir))
    assert page == study_dir / "report" / "index.html"
    text = assert_report(page, {"history.png", "parallel_coordinate.png", "fold_scores.png", "curves.png"})
    assert (study_dir / "report" / "best.yaml").is_file()
    assert "trials: 2 complete" in text and "Best trials" in text
    assert "trials: 2 complete" in capsys.readouterr().out  # kbert.tune.write_report printed its table


@pytest.mark.slow
def test_a_study_report_links_only_the_plots_optuna_drew(study_dir, tmp_path, monkeypatch, capsys):
    """A plot Optuna cannot draw is skipped with a note; the page linked it anyway (a broken image)."""
    from optuna.visualization import matplotlib as optuna_plots

    def refuse(study):
        raise ValueError("cannot draw")

    monkeypatch.setattr(optuna_plots, "plot_parallel_coordinate", refuse)
    before = {p.name: p.stat().st_mtime_ns for p in (study_dir / "report").glob("*")}
    page = write_report(str(study_dir), output=str(tmp_path / "elsewhere"))
    assert_report(page, {"history.png", "fold_scores.png"})
    # only where the report goes: the study's own report/ was rewritten, and best.yaml named that copy
    assert {p.name: p.stat().st_mtime_ns for p in (study_dir / "report").glob("*")} == before
    assert f"kbert run --config {(tmp_path / 'elsewhere' / 'best.yaml').resolve()}" in \
        (tmp_path / "elsewhere" / "best.yaml").read_text()
    assert not (tmp_path / "elsewhere" / "parallel_coordinate.png").exists()
    assert "note: parallel_coordinate.png skipped: cannot draw" in capsys.readouterr().err


@pytest.mark.slow
def test_ensemble_report(ensemble_sidecar):
    sidecar = json.loads(ensemble_sidecar.read_text())
    page = write_report(str(ensemble_sidecar))
    assert page == ensemble_sidecar.with_name(f"{ensemble_sidecar.stem}-report") / "index.html"
    text = assert_report(page, {"weights.png", "correlations.png", "methods.png"})
    assert [m["name"] for m in sidecar["members"]] == ["baseline-hgb-seed42", "baseline-logreg-seed42"]
    assert format_score(sidecar["honest_cv"]) in text
    for member in sidecar["members"]:
        assert member["name"] in text and format_score(member["cv"]) in text
    assert f"<td>{sidecar['method']}</td>" in text


@pytest.mark.slow
def test_an_ensemble_report_finds_moved_members_under_out_and_refuses_a_replaced_one(ensemble_sidecar, tmp_path):
    """Members moved: --out was ignored ('OOF predictions not found'); a member trained again under its name was
    drawn from its new predictions beside the recorded CV."""
    import shutil

    from kbert.pipeline.artifacts import sealed

    sidecar = json.loads(ensemble_sidecar.read_text())
    moved = tmp_path / "moved"
    for member in sidecar["members"]:
        shutil.copytree(member["path"], moved / "titanic" / member["name"])
    record = tmp_path / "e.json"
    shutil.copy(ensemble_sidecar, record)
    for member in sidecar["members"]:
        shutil.move(member["path"], tmp_path / "gone" / member["name"])
    try:
        text = assert_report(write_report(str(record), runs_dir=str(moved)), {"correlations.png"})
        assert "not found" not in text
        first = moved / "titanic" / sidecar["members"][0]["name"] / "metrics.json"
        first.write_text(json.dumps(sealed({**json.loads(first.read_text()), "wall_time_s": 1.0})))  # trained again
        with pytest.raises(KbertError, match=rf"member {sidecar['members'][0]['name']} is not the run the ensemble "
                                             r"blended"):
            write_report(str(record), runs_dir=str(moved), output=str(tmp_path / "again"))
    finally:
        for member in sidecar["members"]:
            shutil.move(tmp_path / "gone" / member["name"], member["path"])


# ---------------------------------------------------------------- the CLI and errors


@pytest.mark.slow
def test_cli_prints_the_page_path(titanic_runs, tmp_path, capsys):
    run_dir = titanic_runs / "runs" / "titanic" / "tiny"
    assert main(["report", str(run_dir), "--output", str(tmp_path / "r")]) == 0
    assert capsys.readouterr().out.strip() == f"report: {tmp_path / 'r' / 'index.html'}"
    assert main(["report", "tiny", "--out", str(titanic_runs / "runs"), "--output", str(tmp_path / "id")]) == 0
    assert (tmp_path / "id" / "index.html").is_file()


def test_wrong_targets_exit_2_naming_the_path(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    (tmp_path / "other.json").write_text('{"cv": 0.8}')
    (tmp_path / "broken.json").write_text("{not json")
    (tmp_path / "table.csv").write_text("a,b\n1,2\n")
    for target in (tmp_path / "nope", tmp_path / "empty", tmp_path / "other.json", tmp_path / "broken.json",
                   tmp_path / "table.csv"):
        assert main(["report", str(target), "--out", str(tmp_path / "runs")]) == 2
        assert str(target) in capsys.readouterr().err
    assert main(["report", "no-such-run", "--out", str(tmp_path / "runs")]) == 2
    assert "no-such-run" in capsys.readouterr().err
    assert not (tmp_path / "empty" / "report").exists()


@pytest.mark.slow
def test_missing_matplotlib_is_a_clear_error(titanic_runs, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` now raises ImportError
    with pytest.raises(KbertError, match=re.escape("pip install 'kbert[report]'")):
        write_report(str(titanic_runs / "runs" / "titanic" / "tiny"), output=str(tmp_path / "r"))
    assert not (tmp_path / "r").exists()
