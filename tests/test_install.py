"""kbert installed from a wheel, not the editable checkout: `kbert init` then `kbert run` from a folder outside the
repository work, and leave the installed package byte-for-byte as it was (nothing kbert does at run time may
write inside it). Offline and fast: the wheel is built without build isolation from a clean copy of the sources
and installed with --no-deps into a folder put first on PYTHONPATH."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pandas as pd
import pytest

from tests.tiny import tiny_args

pytestmark = pytest.mark.slow  # builds and installs a wheel
ROOT = Path(__file__).resolve().parent.parent
TOP_LEVEL_FOLDERS = ("models", "pipeline", "features", "competitions", "ensembles")  # mapped into kbert, never top level


def package_dirs() -> dict[str, str]:
    """pyproject.toml's [tool.setuptools.package-dir]: import name -> repository folder."""
    with open(ROOT / "pyproject.toml", "rb") as handle:
        return tomllib.load(handle)["tool"]["setuptools"]["package-dir"]


def source_files() -> list[str]:
    """The files under the mapped folders, repository-relative: git's tracked and not-ignored ones where this is a
    checkout (so caches and scratch files do not count), else every file but bytecode."""
    folders = sorted(set(package_dirs().values()))
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z", "--", *folders], cwd=ROOT,
                            capture_output=True, text=True) if (ROOT / ".git").exists() and shutil.which("git") else None
    if listed is not None and listed.returncode == 0:
        return sorted({name for name in listed.stdout.split("\0") if name and (ROOT / name).is_file()})
    return sorted(str(p.relative_to(ROOT)) for folder in folders for p in (ROOT / folder).rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc")


def digest(folder: Path) -> dict[str, str]:
    """sha256 of every file under ``folder``, by relative path (a file added or removed shows too)."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def pip(*args: str, cwd: Path) -> None:
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INDEX": "1", "PIP_NO_INPUT": "1"}
    done = subprocess.run([sys.executable, "-m", "pip", *args, "--quiet"], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, Path]:
    """(the wheel, the folder it is installed in)."""
    pytest.importorskip("setuptools", reason="building the wheel offline needs setuptools in this environment")
    from kbert.ensembles.package import build_kbert_wheel

    base = tmp_path_factory.mktemp("install")
    (base / "wheel").mkdir()
    wheel = build_kbert_wheel(base / "wheel")  # as kbert package builds it: from a copy of the sources
    # --no-compile, and PYTHONDONTWRITEBYTECODE in the runs below: Python's own bytecode caches stay out of the
    # package, so any file that appears or changes there was written by kbert.
    pip("install", "--no-deps", "--no-compile", "--target", str(base / "site"), str(wheel), cwd=base)
    return wheel, base / "site"


def installed_env(site: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(site), "PYTHONDONTWRITEBYTECODE": "1"}


PROBE = """
import importlib, importlib.util, json, sys
import kbert, kbert.cli, kbert.models
failed = {}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
        failed[name] = False
    except ImportError:
        failed[name] = True
print(json.dumps({"kbert": kbert.__file__, "kbert.cli": kbert.cli.__file__, "kbert.models": kbert.models.__file__,
                  "kbert.pipeline": importlib.util.find_spec("kbert.pipeline").origin,
                  "kbert.competitions": importlib.util.find_spec("kbert.competitions").origin,
                  "failed": failed, "meta_path": [repr(finder) for finder in sys.meta_path]}))
"""


def test_wheel_install_inits_and_runs_outside_the_repository_and_leaves_the_package_alone(installed, tmp_path):
    _, site = installed
    package = site / "kbert"
    work = tmp_path / "work"  # the user's folder: empty, outside the repository
    work.mkdir()
    assert not work.resolve().is_relative_to(ROOT)
    env = installed_env(site)
    before = digest(site)
    assert "kbert/competitions/titanic.yaml" in before and "kbert/models/cpu_kernels.cpp" in before

    # Which kbert a fresh `python` in that folder imports: the wheel's (PYTHONPATH precedes site-packages, and an
    # editable install's finder comes after the path finder), and none of the repository folders by their own name.
    # Probed before anything is written into the folder: `python -c` and `-m` put it first on sys.path.
    probe = subprocess.run([sys.executable, "-c", PROBE, *TOP_LEVEL_FOLDERS], cwd=work, env=env, capture_output=True,
                           text=True, timeout=120)
    assert probe.returncode == 0, probe.stderr
    found = json.loads(probe.stdout)
    print("kbert.__file__:", found["kbert"], "| kbert.models.__file__:", found["kbert.models"])
    print("sys.meta_path:", found["meta_path"])
    assert Path(found["kbert"]) == package / "__init__.py"
    assert Path(found["kbert.cli"]) == package / "cli" / "__init__.py"
    assert Path(found["kbert.models"]) == package / "models" / "__init__.py"
    assert Path(found["kbert.pipeline"]) == package / "pipeline" / "__init__.py"
    assert Path(found["kbert.competitions"]) == package / "competitions" / "__init__.py"
    assert found["failed"] == {name: True for name in TOP_LEVEL_FOLDERS}

    # A small CSV pair in a downloads folder beside the working folder (the first rows of the bundled Titanic).
    downloads = tmp_path / "downloads" / "mini"
    downloads.mkdir(parents=True)
    titanic = ROOT / "competitions" / "data" / "titanic"
    pd.read_csv(titanic / "train.csv").head(80).to_csv(downloads / "train.csv", index=False)
    pd.read_csv(titanic / "test.csv").head(30).to_csv(downloads / "test.csv", index=False)

    # `kbert init` through the installed console script (the entry point), then `kbert run` the path it printed.
    script = site / "bin" / "kbert"
    assert script.is_file()
    made = subprocess.run([sys.executable, str(script), "init", "mini", "--train", str(downloads / "train.csv"),
                           "--test", str(downloads / "test.csv")], cwd=work, env=env, capture_output=True, text=True,
                          timeout=120)
    assert made.returncode == 0, made.stderr
    printed = re.fullmatch(r"wrote (.+); check it, then: kbert run (.+)\n", made.stdout)
    assert printed, made.stdout
    yaml_path = printed[2]
    assert (work / yaml_path).resolve() == (work / "competitions" / "mini.yaml").resolve()
    assert not (ROOT / "competitions" / "mini.yaml").exists()

    ran = subprocess.run([sys.executable, "-m", "kbert.cli", "run", yaml_path, *tiny_args(40), "--run-id", "w"], cwd=work,
                         env=env, capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    submission = pd.read_csv(work / "submissions" / "mini" / "w.csv")
    assert list(submission.columns) == ["PassengerId", "Survived"] and len(submission) == 30
    assert (work / "runs" / "mini" / "w" / "metrics.json").is_file()

    after = digest(site)
    assert after == before, {name: "changed" if name in before else "added"
                             for name in set(after) if after.get(name) != before.get(name)} | \
        {name: "removed" for name in set(before) - set(after)}


def test_wheel_holds_every_source_file(installed):
    """Each module and data file under the folders pyproject.toml maps into kbert is in the wheel: a subpackage
    missing from [tool.setuptools] packages, or a data file no package-data pattern matches, names itself here."""
    wheel, _ = installed
    with zipfile.ZipFile(wheel) as archive:
        packed = set(archive.namelist())
    into = {folder: name.replace(".", "/") for name, folder in package_dirs().items()}
    missing = []
    for name in source_files():
        folder, _, rest = name.partition("/")
        if f"{into[folder]}/{rest}" not in packed:
            missing.append(name)
    assert not missing, f"not in the wheel ({wheel.name}): {missing}"
