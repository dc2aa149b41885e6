"""The figures in README.md and docs/ come from recorded results (benchmarks/figures.py): the checkout's own check
passes, and each kind of drift fails it in a clone (a result changed after it was measured, a result not in the
manifest, a commit from elsewhere, a figure typed into a page or into a block of output, a substitution of a figure
that was never recorded). Recording refuses a checkout with uncommitted changes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
import figures  # noqa: E402

PROBE = """import sys
sys.path.insert(0, {benchmarks!r})
import figures
figures.record("probe", figures={{"wall": [62, "s"], "cv": [0.8137, ""]}},
               tables={{"runs": {{"columns": ["competition", "CV"], "rows": [["titanic", "0.8137"]]}}}},
               outputs={{"log": "CV accuracy: 0.8137"}})
"""


def test_the_checkout_has_no_figure_outside_its_recorded_results():
    assert figures.check(REPO) == []
    assert figures.load_manifest(), "no recorded results"
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "figures.py"), "check"], capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr


def test_what_counts_as_a_figure():
    page = "\n".join([
        "Titanic takes 62 s and scores 0.8137; a 1.4x speed-up, 91 MB of weights, 18% saved, 5-15 s a blend.",
        "Parameters as code are not figures: `--time-limit 10m`, `0.5`, and neither are 5 folds or batch 32.",
        "```bash", "kbert tune titanic --timeout 8h --lr 3e-4", "```",
        "```yaml", "threshold: 0.95", "```",
        "```", "fold 1/5: accuracy 0.8324 (best epoch 19, 57s)", "```",
        "```text", "usage: kbert run [--lr 0.001]", "```",
        "Measured: {{ fig.competition_runs.titanic_wall }}.",
    ])
    assert figures.figures_in(page) == ["62 s", "0.8137", "1.4x", "91 MB", "18%", "5-15 s", "0.8324", "57s"]


@pytest.fixture
def clone(tmp_path) -> Path:
    """A clone of this checkout's last commit (its results and manifest as committed)."""
    subprocess.run(["git", "clone", "--quiet", "--shared", str(REPO), str(tmp_path / "clone")], check=True)
    return tmp_path / "clone"


def test_each_kind_of_drift_fails_the_check(clone):
    assert figures.check(clone) == []
    manifest = figures.load_manifest(clone / "benchmarks" / "results")
    name = next(iter(manifest))
    result = clone / "benchmarks" / "results" / f"{name}.json"
    result.write_text(result.read_text().replace("}", " }", 1))  # a result edited after it was measured
    (clone / "benchmarks" / "results" / "typed.json").write_text("{}")  # a result no script recorded
    manifest[name]["commit"] = "0" * 40  # a commit from another history
    (clone / "benchmarks" / "results" / "manifest.json").write_text(json.dumps(manifest))
    with (clone / "docs" / "speed.md").open("a") as page:
        page.write("\nA run takes 45 s here.\n\n```\nwall time: 46s\n```\n\n{{ fig.competition_runs.no_such }}\n")
    problems = "\n".join(figures.check(clone))
    assert f"{name}.json does not have the recorded SHA-256" in problems
    assert "benchmarks/results/typed.json: not in the manifest" in problems
    assert f"commit {'0' * 40} is not in this checkout's history" in problems
    assert "docs/speed.md: a figure outside benchmarks/results: '45 s'" in problems
    assert "docs/speed.md: a figure outside benchmarks/results: '46s'" in problems
    assert "{{ fig.competition_runs.no_such }} is no recorded figure" in problems
    done = subprocess.run([sys.executable, str(clone / "benchmarks" / "figures.py"), "check"], capture_output=True,
                          text=True)
    assert done.returncode == 2 and "not in the manifest" in done.stderr


def test_a_recorded_result_names_its_provenance_and_feeds_the_docs(clone):
    probe = clone / "benchmarks" / "probe_figures.py"
    probe.write_text(PROBE.format(benchmarks=str(clone / "benchmarks")))
    subprocess.run([sys.executable, str(probe), "--reps", "1"], check=True, capture_output=True, cwd=clone)
    entry = figures.load_manifest(clone / "benchmarks" / "results")["probe"]
    head = subprocess.run(["git", "-C", str(clone), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    assert entry["commit"] == head.strip() and entry["script"] == "benchmarks/probe_figures.py"
    assert entry["command"] == "python benchmarks/probe_figures.py --reps 1"
    assert entry["machine"] and entry["date"]
    assert entry["sha256"] == figures.sha256(clone / "benchmarks" / "results" / "probe.json")
    assert figures.check(clone) == []
    made = figures.substitutions(clone)
    assert made["fig"]["probe"]["wall"] == f"62 s ({entry['date']})"  # a timing is dated
    assert made["fig"]["probe"]["cv"] == "0.8137"
    assert "| titanic | 0.8137 |" in made["table"]["probe"]["runs"]
    assert made["output"]["probe"]["log"].endswith("```text\nCV accuracy: 0.8137\n```")
    assert entry["command"] in made["table"]["probe"]["runs"] and "## probe" in made["every_result"]


def test_recording_refuses_uncommitted_changes_before_measuring(clone):
    (clone / "README.md").write_text("changed\n")
    probe = clone / "benchmarks" / "probe_figures.py"
    probe.write_text(PROBE.format(benchmarks=str(clone / "benchmarks")))
    done = subprocess.run([sys.executable, str(probe)], capture_output=True, text=True, cwd=clone)
    assert done.returncode != 0 and "commit the code first" in done.stderr
    assert not (clone / "benchmarks" / "results" / "probe.json").exists()
    early = subprocess.run([sys.executable, str(clone / "benchmarks" / "stack_speed.py"), "--rows", "40", "--reps", "1",
                            "--record", "stack"], capture_output=True, text=True, cwd=clone)
    assert early.returncode != 0 and "commit the code first" in early.stderr
    assert "rows:" not in early.stdout  # refused before it measured, not after


def test_a_shallow_clone_checks_all_but_the_commits(tmp_path):
    """Without its history (a CI checkout at depth 1) a checkout still has its hashes and pages checked."""
    subprocess.run(["git", "clone", "--quiet", "--depth", "1", f"file://{REPO}", str(tmp_path / "shallow")],
                   check=True)
    assert figures.shallow(tmp_path / "shallow")
    assert figures.check(tmp_path / "shallow") == []
    with (tmp_path / "shallow" / "README.md").open("a") as readme:
        readme.write("\nIt takes 62 s.\n")
    assert figures.check(tmp_path / "shallow") == ["README.md: a figure outside benchmarks/results: '62 s'"]


def test_the_machine_names_its_gpu_when_it_has_one(tmp_path, monkeypatch):
    """A --device gpu measurement's record names the card (from nvidia-smi, the driver's own tool)."""
    assert "GPU:" not in figures.machine() or figures.gpus()
    tool = tmp_path / "nvidia-smi"
    tool.write_text("#!/bin/sh\necho 'NVIDIA H200'\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    assert figures.machine().endswith("; GPU: NVIDIA H200")
