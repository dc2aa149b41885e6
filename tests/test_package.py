"""`kbert package`: an ensemble as a Kaggle dataset and notebook that install kbert and predict with no network.

The slow test builds the package (its wheels come from the package index through pip), makes a fresh virtual
environment, and runs the notebook's code inside a network namespace with no network (`unshare -n`) against
folders laid out as /kaggle/input/<dataset>/ and /kaggle/input/<competition>/; the submission it writes must be
`kbert predict`'s.
"""

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pandas as pd
import pytest

from kbert.cli import main
from kbert.ensembles.package import notebook_script
from kbert.pipeline.config import BUNDLED_DATA_DIR, load_competition
from tests.tiny import run_tiny

TITANIC = BUNDLED_DATA_DIR / "titanic"
DATASET = "kbert-tester/kbert-titanic-offline"


@pytest.fixture(scope="module")
def ensemble_json(tmp_path_factory):
    out = tmp_path_factory.mktemp("package")
    where = ["--out", str(out / "runs"), "--submissions-dir", str(out / "subs")]
    for model in ("hgb", "logreg"):
        assert main(["baseline", "titanic", "--model", model, "--folds", "3", "--run-id", model, *where]) == 0
    run_tiny("titanic", out, "tiny", folds=3, epochs=1, max_length=48)
    assert main(["baseline", "titanic", "--model", "hgb", "--folds", "3", "--embeddings", "tiny", "--run-id", "emb",
                 *where]) == 0  # in the package it reads the tiny run from beside it
    assert main(["ensemble", "titanic", "--members", "hgb,logreg,tiny,emb", "--method", "weighted", "--name",
                 "blend", "--outer-repeats", "1", *where]) == 0
    return out / "subs" / "titanic" / "blend.json"


def offline(command: list[str], env: dict, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["unshare", "-n", "--", *command], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=900)


STATUS = ("from kbert.models import runtime; runtime.setup(); from kbert.models import cpu_kernels; "
          "cpu_kernels.kernels(); print(runtime.status())")


def same_submissions(notebook: Path, here: Path, ran: subprocess.CompletedProcess, python: str, env: dict) -> None:
    """The notebook's submission is byte for byte this process's; where not, the message says what differed: the
    rows, each side's BLAS and kernels, the libraries whose versions differ, the notebook's own warnings."""
    if notebook.read_bytes() == here.read_bytes():
        return
    theirs, ours = pd.read_csv(notebook), pd.read_csv(here)
    rows = theirs.compare(ours) if theirs.shape == ours.shape else f"shapes {theirs.shape} and {ours.shape}"
    told = subprocess.run([python, "-c", STATUS], env=env, cwd=here.parent, capture_output=True, text=True)
    status = told.stdout.strip() or told.stderr.strip()[-500:]
    from kbert.models import runtime

    freeze = subprocess.run([python, "-m", "pip", "list", "--format=freeze"], env=env, capture_output=True,
                            text=True).stdout.split()
    from kbert.ensembles.package import installed_versions, normalized

    mine = installed_versions()
    versions = {normalized(line.split("==")[0]): line.split("==")[1] for line in freeze if "==" in line}
    differ = {name: (version, mine.get(name)) for name, version in versions.items()
              if name != "kbert" and version != mine.get(name)}
    pytest.fail(f"the notebook's {notebook.name} differs from {here.name}:\n{rows}\nnotebook: {status}\nhere: "
                f"{runtime.status()}\nversions (notebook, here): {differ}\nnotebook stderr: {ran.stderr[-2000:]}")


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("unshare") is None or os.geteuid() != 0, reason="needs root's unshare -n")
def test_the_package_installs_offline_and_its_notebook_writes_kbert_predicts_submission(ensemble_json, tmp_path,
                                                                                     monkeypatch):
    package, checkout = tmp_path / "package", Path(__file__).resolve().parent.parent
    built_before = (checkout / "build").exists()
    assert main(["package", str(ensemble_json), "--out", str(package), "--dataset", DATASET]) == 0
    assert (checkout / "build").exists() == built_before  # kbert's wheel is built from a copy of the sources
    dataset, notebook = package / "dataset", package / "notebook"
    metadata = json.loads((notebook / "kernel-metadata.json").read_text())
    assert metadata["enable_internet"] is False and metadata["dataset_sources"] == [DATASET]
    assert metadata["competition_sources"] == ["titanic"]
    assert json.loads((dataset / "dataset-metadata.json").read_text())["id"] == DATASET
    wheels = sorted(p.name for p in (dataset / "wheels").glob("*.whl"))
    assert any(w.startswith("kbert-") for w in wheels) and any(w.startswith("skops-") for w in wheels)
    assert not any(w.startswith(("optuna-", "kaggle-", "torch-", "pytest-")) for w in wheels), wheels
    for name in ("mlx", "mlx_cpu", "numpy", "scikit_learn", "scipy", "tokenizers", "pandas"):  # what computes
        wheel = next(w for w in wheels if w.lower().startswith(f"{name}-"))  # at the versions installed here
        assert wheel.split("-")[1] == importlib.metadata.version(name), (wheel, importlib.metadata.version(name))

    # /kaggle/input/<dataset>/ and /kaggle/input/titanic/, /kaggle/working/; pip reads no config (no other index)
    inputs, working = tmp_path / "input", tmp_path / "working"
    shutil.copytree(dataset, inputs / DATASET.split("/")[1])
    shutil.copytree(TITANIC, inputs / "titanic")
    working.mkdir()
    subprocess.run([sys.executable, "-m", "venv", str(tmp_path / "venv")], check=True)
    python = str(tmp_path / "venv" / "bin" / "python")
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path / "home"), "PIP_CONFIG_FILE": os.devnull,
           "KBERT_KAGGLE_INPUT": str(inputs), "KBERT_KAGGLE_WORKING": str(working),
           "KBERT_CACHE": os.environ.get("KBERT_CACHE", str(Path.home() / ".cache" / "kbert"))}
    no_network = offline([python, "-c", "import socket; socket.create_connection(('pypi.org', 443), timeout=5)"],
                         env, tmp_path)
    assert no_network.returncode != 0 and ("Errno" in no_network.stderr or "gaierror" in no_network.stderr)
    (tmp_path / "notebook.py").write_text(notebook_script(notebook / "predict.ipynb"))
    ran = offline([python, str(tmp_path / "notebook.py")], env, tmp_path)
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-3000:]
    assert main(["predict", str(ensemble_json), "--data", str(TITANIC / "test.csv"), "--output",
                 str(tmp_path / "here.csv")]) == 0
    same_submissions(working / "submission.csv", tmp_path / "here.csv", ran, python, env)

    # Kaggle's rerun: another test file (other ids, fewer rows) and its sample submission in the competition folder
    hidden = pd.read_csv(TITANIC / "test.csv").sample(frac=0.6, random_state=5)
    hidden["PassengerId"] += 10_000
    hidden.to_csv(inputs / "titanic" / "test.csv", index=False)
    hidden[["PassengerId"]].assign(Survived=0).to_csv(inputs / "titanic" / "gender_submission.csv", index=False)
    ran = offline([python, str(tmp_path / "notebook.py")], env, tmp_path)
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-3000:]
    assert main(["predict", str(ensemble_json), "--data", str(inputs / "titanic" / "test.csv"), "--data-dir",
                 str(inputs / "titanic"), "--output", str(tmp_path / "hidden.csv")]) == 0
    submission = pd.read_csv(working / "submission.csv")
    assert submission["PassengerId"].tolist() == hidden["PassengerId"].tolist()
    same_submissions(working / "submission.csv", tmp_path / "hidden.csv", ran, python, env)

    # A package of one member (the embedding baseline, with the run it reads): its notebook predicts with the
    # member's folder and writes its labels (it passed --out beside the folder too, which kbert predict refuses:
    # every such notebook failed). Its wheels are the ones above.
    from kbert.ensembles import package as packaging

    monkeypatch.setattr(packaging, "download_wheels", lambda wanted, folder, *args: shutil.copytree(
        dataset / "wheels", folder, dirs_exist_ok=True))
    member = ensemble_json.parent.parent.parent / "runs" / "titanic" / "emb"
    assert main(["package", str(member), "--out", str(tmp_path / "single"), "--dataset", "kbert-tester/kbert-emb"]) == 0
    shutil.copytree(tmp_path / "single" / "dataset", inputs / "kbert-emb")
    (tmp_path / "single.py").write_text(notebook_script(tmp_path / "single" / "notebook" / "predict.ipynb"))
    ran = offline([python, str(tmp_path / "single.py")], env, tmp_path)
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-3000:]
    assert main(["predict", str(member), "--data", str(inputs / "titanic" / "test.csv"), "--data-dir",
                 str(inputs / "titanic"), "--submission", "--output", str(tmp_path / "member.csv")]) == 0
    same_submissions(working / "submission.csv", tmp_path / "member.csv", ran, python, env)


@pytest.mark.slow
def test_wheels_resolve_for_python_3_12_with_the_cuda_build(ensemble_json, capsys):
    """No 3.12 interpreter is here to install them: the package's wheels are resolved for it, not run."""
    assert main(["package", str(ensemble_json), "--out", "unused", "--dataset", DATASET, "--python", "3.12",
                 "--device", "cuda", "--resolve-only"]) == 0
    wheels = capsys.readouterr().out.split()
    assert any(w.startswith("mlx-cuda-12==") for w in wheels) and any(w.startswith("numpy==") for w in wheels)
    assert not any(w.startswith(("optuna==", "kaggle==", "mlx-cpu==")) for w in wheels)


def test_a_package_is_refused_in_one_line_for_bad_input(tmp_path, capsys):
    from kbert.ensembles.ensemble import PLACES
    from kbert.pipeline.artifacts import sealed

    record = tmp_path / "e.json"
    said = {"competition": "titanic", "members": [{"name": "../x"}], "runs_dir": "runs", "method": "mean",
            "decision": {}, "options": {}, "competition_config": asdict(load_competition("titanic"))}
    record.write_text(json.dumps(sealed(said, PLACES)))  # as if kbert wrote it
    for args, says in (
            ([str(record), "--dataset", "bad"], "--dataset 'bad': give it as OWNER/SLUG"),
            ([str(record), "--dataset", DATASET], "member '../x': '..' is not a plain name"),
            ([str(tmp_path), "--dataset", DATASET], "neither an ensemble's JSON nor a run folder")):
        assert main(["package", *args, "--out", str(tmp_path / "pkg")]) == 2
        assert says in capsys.readouterr().err
        assert not (tmp_path / "pkg").exists()
    member = tmp_path / "runs" / "titanic" / "m"  # a run folder: what an ensemble reads back
    member.mkdir(parents=True)
    for name in ("config.yaml", "inputs.json"):
        (member / name).write_text("{}")
    assert main(["package", str(record), "--dataset", DATASET, "--out", str(member / "pkg")]) == 2
    assert f"--out {member / 'pkg'}: inside the member folder {member}" in capsys.readouterr().err
    assert sorted(p.name for p in member.iterdir()) == ["config.yaml", "inputs.json"]


@pytest.mark.slow
def test_a_package_of_a_member_that_cannot_predict_or_of_another_competition_is_refused(ensemble_json, tmp_path,
                                                                                       capsys):
    runs = tmp_path / "runs"
    shutil.copytree(ensemble_json.parent.parent.parent / "runs", runs)
    (runs / "titanic" / "hgb" / "folds" / "2" / "baseline.json").unlink()
    record = json.loads(ensemble_json.read_text())
    (tmp_path / "moved.json").write_text(json.dumps({**record, "runs_dir": str(runs)}))
    (runs / "titanic" / "tiny" / "folds" / "1" / "model.safetensors").write_bytes(b"damaged")
    for source, extra, says in (
            (tmp_path / "moved.json", [], "member hgb: its folds/2/baseline.json is missing (metrics.json records it)"),
            (runs / "titanic" / "tiny", [], "model.safetensors: not the file this fold was trained to"),
            (runs / "titanic" / "logreg", ["--competition", "spaceship-titanic"],
             "a run of competition 'titanic'; this package is for 'spaceship-titanic'")):
        assert main(["package", str(source), "--out", str(tmp_path / "pkg"), "--dataset", DATASET, *extra]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and says in err[0], err
        assert not (tmp_path / "pkg").exists()


@pytest.mark.slow
def test_a_requirement_without_a_wheel_for_the_python_is_one_line(ensemble_json, tmp_path, capsys, monkeypatch):
    from kbert.ensembles import package

    wanted = package.requirements
    monkeypatch.setattr(package, "requirements", lambda *args: [*wanted(*args), "kbert-no-such-package-4f2a"])
    assert main(["package", str(ensemble_json), "--out", str(tmp_path / "pkg"), "--dataset", DATASET,
                 "--python", "3.12"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["kbert: error: kbert package: no wheel of kbert-no-such-package-4f2a for Python 3.12 on Linux "
                   "x86-64 (at the version installed here, where it is)"], err
    assert not (tmp_path / "pkg").exists()
