"""User-given names that become paths (run ids, study names, `kbert init` names, a YAML's `name:`, member ids, a
`kbert predict` run id) are plain names: one holding `../`, `/` or an absolute path is refused by every command
with one line and exit 2, and nothing is written anywhere."""

import shutil
from pathlib import Path

import pytest
import yaml

from kbert.cli import main
from kbert.errors import KbertError
from kbert.names import check_name
from kbert.pipeline.config import load_competition, resolve_run_config

BASE = Path(__file__).resolve().parent / "bad_inputs" / "base"  # twelve Titanic rows and a YAML kbert run accepts
ESCAPES = ["../escape", "a/b", "ABSOLUTE"]  # ABSOLUTE: a path under the test's own folder, so the listing sees it


@pytest.fixture
def work(tmp_path, monkeypatch):
    """The working folder (a copy of the corpus base); --out and --submissions-dir are its siblings."""
    folder = tmp_path / "work"
    shutil.copytree(BASE, folder)
    monkeypatch.chdir(folder)
    return folder


def listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def escape_name(kind: str, root: Path) -> str:
    return str(root / "absolute-escape") if kind == "ABSOLUTE" else kind


def refused(argv: list[str], root: Path, capsys) -> str:
    """Run kbert; it must exit 2 with one line on stderr, no traceback, and leave ``root`` (the parent of the
    working folder, --out and --submissions-dir) exactly as it was. Returns the line."""
    capsys.readouterr()
    before = listing(root)
    code = main(argv)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("kbert: error: "), err
    assert "Traceback" not in err
    assert listing(root) == before
    return lines[0]


def outputs(root: Path) -> list[str]:
    return ["--out", str(root / "out"), "--submissions-dir", str(root / "subs")]


@pytest.mark.parametrize("kind", ESCAPES)
def test_run_refuses_a_run_id_that_is_a_path(work, kind, capsys):
    name = escape_name(kind, work.parent)
    line = refused(["run", "competition.yaml", "--run-id", name, "--no-progress", *outputs(work.parent)], work.parent,
                   capsys)
    assert line.startswith(f"kbert: error: --run-id {name!r} is not a plain name")


@pytest.mark.parametrize("kind", ESCAPES)
def test_baseline_refuses_a_run_id_that_is_a_path(work, kind, capsys):
    name = escape_name(kind, work.parent)
    line = refused(["baseline", "competition.yaml", "--run-id", name, *outputs(work.parent)], work.parent, capsys)
    assert line.startswith(f"kbert: error: --run-id {name!r} is not a plain name")


@pytest.mark.parametrize("kind", ESCAPES)
def test_pretrain_refuses_a_run_id_that_is_a_path(work, kind, capsys):
    name = escape_name(kind, work.parent)
    line = refused(["pretrain", "competition.yaml", "--run-id", name, "--out", str(work.parent / "out")], work.parent,
                   capsys)
    assert line.startswith(f"kbert: error: --run-id {name!r} is not a plain name")


@pytest.mark.parametrize("kind", ESCAPES)
def test_tune_refuses_a_study_name_that_is_a_path(work, kind, capsys):
    name = escape_name(kind, work.parent)
    line = refused(["tune", "competition.yaml", "--study", name, "--out", str(work.parent / "out")], work.parent,
                   capsys)
    assert line.startswith(f"kbert: error: --study {name!r} is not a plain name")


@pytest.mark.parametrize("kind", ESCAPES + ["..", ""])
def test_init_refuses_a_name_that_is_a_path(work, kind, capsys):
    name = escape_name(kind, work.parent)
    line = refused(["init", name, "--train", "data/train.csv", "--test", "data/test.csv"], work.parent, capsys)
    assert line.startswith(f"kbert: error: kbert init NAME {name!r} is not a plain name")


@pytest.mark.parametrize("kind", ["../escape", "study/../../escape", "ABSOLUTE"])
def test_ensemble_refuses_a_member_id_that_leaves_the_runs_folder(work, kind, capsys):
    """A member id is a run id or <study>/trial-NNNN: each '/'-separated part is a plain name."""
    name = escape_name(kind, work.parent)
    line = refused(["ensemble", "competition.yaml", "--members", f"plain-run,{name}", *outputs(work.parent)],
                   work.parent, capsys)
    assert line.startswith(f"kbert: error: --members entry {name!r}: part ")


@pytest.mark.parametrize("kind", ESCAPES + [".."])
def test_predict_refuses_a_run_id_that_is_a_path(work, kind, capsys):
    """A RUN that is not a run folder is a run id under --out: a path there is refused, not looked up."""
    name = escape_name(kind, work.parent)
    line = refused(["predict", name, "--data", "data/test.csv", "--out", str(work.parent / "out")], work.parent,
                   capsys)
    assert line in (f"kbert: error: kbert predict RUN: no run folder {name} (no config.yaml there)",
                    (f"kbert: error: kbert predict RUN (a run id) {name!r} is not a plain name: use letters, "
                     "digits, '-', '_' and '.' (not first), at most 128, with no folder separators"))


@pytest.mark.parametrize("kind", ESCAPES)
def test_a_yaml_name_that_is_a_path_is_refused(work, kind, capsys):
    """The competition's `name:` becomes runs/<name>/ and submissions/<name>/: from a competition YAML and from a
    resolved run config (kbert run --config) alike."""
    name = escape_name(kind, work.parent)
    spec = yaml.safe_load((work / "competition.yaml").read_text())
    (work / "named.yaml").write_text(yaml.safe_dump({**spec, "name": name}, sort_keys=False))
    line = refused(["run", "named.yaml", "--no-progress", *outputs(work.parent)], work.parent, capsys)
    assert line.startswith(f"kbert: error: named.yaml: name {name!r} is not a plain name")

    resolved = resolve_run_config(load_competition("competition.yaml")).to_dict()
    resolved["competition"]["name"] = name
    (work / "resolved.yaml").write_text(yaml.safe_dump(resolved, sort_keys=False))
    line = refused(["run", "--config", "resolved.yaml", "--no-progress", *outputs(work.parent)], work.parent, capsys)
    assert line.startswith(f"kbert: error: resolved.yaml: competition.name {name!r} is not a plain name")


@pytest.mark.parametrize("kind", ESCAPES)
def test_download_refuses_a_slug_that_is_a_path(work, kind, capsys):
    """data/<slug>/ by default: refused before any Kaggle call."""
    name = escape_name(kind, work.parent)
    line = refused(["download", name], work.parent, capsys)
    assert line.startswith(f"kbert: error: kbert download SLUG {name!r} is not a plain name")


def test_check_name_accepts_plain_names_and_nothing_else():
    for name in ("run-1", "20250101-120000-seed42", "baseline-hgb-seed42", "a.b", "x_y", "A" * 128):
        assert check_name(name, "--run-id") == name
    for name in ("", ".", "..", ".hidden", "a/b", "a\\b", "/abs", "../x", "a b", "A" * 129, "x\n", None):
        with pytest.raises(KbertError, match=r"^--run-id .* is not a plain name"):
            check_name(name, "--run-id")
