"""The documentation site (docs/, Sphinx with MyST Markdown): it builds strictly, a planted broken reference fails
the build, its generated command-line reference is current, and the README stays short."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
pytest.importorskip("myst_nb", reason="the docs extra (Sphinx, MyST-NB) is not installed")


def build(docs: Path, out: Path, execute: bool = False) -> subprocess.CompletedProcess:
    """``.ci/run``'s build: warnings are errors (-W), all of them reported (--keep-going); the pages' examples run
    only with ``execute`` (.ci/run runs them all; here the structure is checked without them)."""
    switch = [] if execute else ["-D", "nb_execution_mode=off"]
    return subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", *switch,
                           str(docs), str(out)], capture_output=True, text=True, timeout=600)


def copy_figures(root: Path) -> None:
    """benchmarks/figures.py and the recorded results, beside a copy of docs/ (its conf.py reads them)."""
    shutil.copytree(REPO / "benchmarks", root / "benchmarks",
                    ignore=lambda folder, names: [n for n in names if n.endswith(".py") and n != "figures.py"])


def test_the_docs_build_strictly_and_a_broken_reference_fails_the_build(tmp_path):
    built = build(REPO / "docs", tmp_path / "html")
    assert built.returncode == 0, built.stderr[-3000:]
    pages = {p.stem for p in (REPO / "docs").glob("*.md")}
    assert pages <= {p.stem for p in (tmp_path / "html").glob("*.html")}  # every page is built ...
    index = (tmp_path / "html" / "index.html").read_text()
    assert all(f'href="{page}.html"' in index for page in pages - {"index"})  # ... and reachable from the home page
    assert "run_competition" in (tmp_path / "html" / "getting-started.html").read_text()  # the README's stage map

    planted = tmp_path / "docs"  # the README beside it, as the pages include from it
    shutil.copytree(REPO / "docs", planted)
    shutil.copy(REPO / "README.md", tmp_path / "README.md")
    copy_figures(tmp_path)
    with (planted / "tuning.md").open("a") as page:
        page.write("\nSee [the page that is not there](no-such-page.md).\n")
    broken = build(planted, tmp_path / "broken")
    assert broken.returncode != 0
    assert "tuning.md" in broken.stderr and "no-such-page.md" in broken.stderr


@pytest.mark.slow
def test_a_failing_example_fails_the_build_and_a_passing_one_shows_its_output(tmp_path):
    """Two executable pages beside the real configuration: the build runs their examples (as .ci/run runs every
    page's), shows a passing example's output, and fails on one whose kbert command fails, naming the page."""
    docs = tmp_path / "docs"
    docs.mkdir()
    shutil.copy(REPO / "docs" / "conf.py", docs)
    shutil.copytree(REPO / "docs" / "_static", docs / "_static")
    copy_figures(tmp_path)
    front = "---\nfile_format: mystnb\nkernelspec:\n  name: python3\n  display_name: Python 3\n  language: python\n---\n"
    (docs / "index.md").write_text("# Home\n\n```{toctree}\nworks\n```\n")
    (docs / "works.md").write_text(front + "# Works\n\n```{code-cell} ipython3\n%%bash\nkbert show-text titanic --n 1\n```\n")
    passing = build(docs, tmp_path / "passing", execute=True)
    assert passing.returncode == 0, passing.stderr[-3000:]
    assert "Survived" in (tmp_path / "passing" / "works.html").read_text()  # the example's output, in the page

    (docs / "index.md").write_text("# Home\n\n```{toctree}\nworks\nfails\n```\n")
    (docs / "fails.md").write_text(front + "# Fails\n\n```{code-cell} ipython3\n%%bash\nkbert run no-such-competition\n```\n")
    failing = build(docs, tmp_path / "failing", execute=True)
    assert failing.returncode != 0
    assert "fails" in failing.stderr and "no-such-competition" in failing.stderr


def test_the_command_line_reference_is_current():
    from kbert.cli import cli_markdown

    assert (REPO / "docs" / "cli-reference.md").read_text() == cli_markdown(), "run python docs/make_cli.py"


def test_the_readme_is_at_most_200_lines_and_its_links_reach_pages():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    targets = re.findall(r"\]\((docs/[^)#]+)", readme)
    assert targets and all((REPO / target).is_file() for target in targets)


@pytest.mark.slow
def test_readme_command_1_works_as_written_on_a_copy_of_the_repository(tmp_path):
    """Command 1, word for word, in a copy of the repository (its own fresh .venv): it sets up and runs Titanic,
    on the first 100 rows through ``KBERT_LIMIT_ROWS``, the variable the docs name, and writes a submission."""
    readme = (REPO / "README.md").read_text()
    command = re.search(r"# 1\. [^\n]*\n([^\n]+)\n", readme).group(1)
    assert command.startswith("python3 -m venv .venv") and command.endswith("kbert run titanic")
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True, text=True,
                           check=True).stdout.split("\n")
    copy = tmp_path / "kbert"
    for name in filter(None, files):
        if (REPO / name).is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, copy / name)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if not p.startswith(sys.prefix))
    run = subprocess.run(["bash", "-c", command], cwd=copy, capture_output=True, text=True, timeout=900,
                         env={**env, "KBERT_LIMIT_ROWS": "100"})
    assert run.returncode == 0, (run.stdout[-2000:], run.stderr[-3000:])
    assert "CV accuracy" in run.stdout
    assert "100 train rows" in run.stdout
    assert list((copy / "submissions" / "titanic").glob("*.csv"))
