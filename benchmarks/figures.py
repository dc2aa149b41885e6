"""Measured figures with their provenance: the only source of the figures in README.md and docs/.

A benchmark script run with ``--record NAME`` writes its figures to ``benchmarks/results/NAME.json`` through
``record`` and lists the file in ``benchmarks/results/manifest.json`` with the script, the command, the machine, the
commit, the date and the file's SHA-256. It records only from a clean checkout, so the commit is the code measured.
The docs show the figures through MyST substitutions made from these files (``substitutions``, docs/conf.py):
``{{ fig.NAME.KEY }}`` is one figure (a timing carries its date), ``{{ table.NAME.KEY }}`` a table and
``{{ output.NAME.KEY }}`` a command's output, each under its provenance line. Hand-written pages hold no figures.

    python benchmarks/figures.py check      # what CI runs: the manifest, the hashes, the commits, the pages

A figure is a measured timing, score, ratio or size: in prose or in a block of output, a number with a unit of time,
size, rate or ratio, or a decimal number (``figures_in``). A parameter written as code (``--time-limit 10m``,
``0.5``), in a block of commands or configuration, or in a command's help is not one.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import shlex
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
MANIFEST = "manifest.json"
TIME_UNITS = ("ns", "µs", "ms", "s", "min", "h")

_UNIT = (r"(?:ns|µs|us|ms|s|sec|seconds?|min|minutes?|h|hours?|days?|B|KB|kB|MB|GB|TB|KiB|MiB|GiB|%|x|×|times|"
         r"GFLOP/s|TFLOP/s|seq/s|rows/s|tokens/s|it/s)")
_NUMBER = r"\d[\d,]*(?:\.\d+)?"
FIGURE = re.compile(rf"(?<![\w./-])(?:{_NUMBER}\s*(?:-|–|to)\s*)?{_NUMBER}\s?{_UNIT}(?!\w)"
                    rf"|(?<![\w./-])\d+\.\d+(?![\w.])")
KINDS = {"fig": "figures", "table": "tables", "output": "outputs"}  # a substitution's kind -> its part of a result
USE = re.compile(rf"\{{\{{\s*({'|'.join(KINDS)})\.(\w+)\.(\w+)\s*\}}\}}")


def machine() -> str:
    """The CPU's model, its cores and which of AVX2, AVX-512 and AMX it has (Linux /proc/cpuinfo), the OS, and the
    NVIDIA GPUs when there are any (a ``--device gpu`` measurement names its card)."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() in ("flags", "Features"):
                flags = set(value.split())
    except OSError:
        pass
    avx512 = sorted(f.removeprefix("avx512").strip("_") for f in flags if f.startswith("avx512"))
    amx = sorted(f.removeprefix("amx_") for f in flags if f.startswith("amx"))
    return (f"{model}, {os.cpu_count()} cores; SIMD: AVX2 {'yes' if 'avx2' in flags else 'no'}, AVX-512 "
            + (f"yes ({' '.join(avx512)})" if avx512 else "no") + ", AMX " + (f"yes ({' '.join(amx)})" if amx else "no")
            + f"; {platform.system()} {platform.machine()}" + "".join(f"; GPU: {name}" for name in gpus()))


def gpus() -> list[str]:
    try:
        listed = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                                text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in listed.stdout.splitlines() if line.strip()] if listed.returncode == 0 else []


def git(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)


def checkout(root: Path = ROOT) -> tuple[str, bool]:
    """The commit checked out and whether the tracked files outside benchmarks/results/ are unchanged."""
    changed = git(root, "status", "--porcelain", "--untracked-files=no", "--", ".", ":!benchmarks/results").stdout
    return git(root, "rev-parse", "HEAD").stdout.strip(), not changed.strip()


def header(root: Path = ROOT) -> str:
    """A benchmark's first line: the machine, the commit (``+ changes`` when the checkout has some) and the time."""
    commit, clean = checkout(root)
    return f"{machine()}; kbert {commit[:7]}{'' if clean else ' + changes'}; {datetime.now():%Y-%m-%d %H:%M}"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def record(name: str, *, figures: dict | None = None, tables: dict | None = None, outputs: dict | None = None) -> Path:
    """Write ``results/NAME.json`` (``figures``: key -> [value, unit]; ``tables``: key -> {"columns", "rows"};
    ``outputs``: key -> a command's output) and list it in the manifest with its provenance (the command is this
    process's). Refused on a checkout with uncommitted changes."""
    from kbert.io import write_json

    try:
        commit = recordable(name)[1]  # checked again: the checkout may have changed while it measured
    except argparse.ArgumentTypeError as refused:
        raise SystemExit(f"--record: {refused}") from None
    script = Path(sys.argv[0]).resolve()
    path = write_json(RESULTS / f"{name}.json", {"figures": figures or {}, "tables": tables or {},
                                                 "outputs": outputs or {}})
    manifest = load_manifest()
    manifest[name] = {
        "script": script.relative_to(ROOT).as_posix(),
        "command": shlex.join(["python", script.relative_to(ROOT).as_posix(), *sys.argv[1:]]),
        "machine": machine(), "commit": commit, "date": datetime.now(timezone.utc).date().isoformat(),
        "sha256": sha256(path),
    }
    write_json(RESULTS / MANIFEST, dict(sorted(manifest.items())))
    print(f"recorded {path.relative_to(ROOT)}")
    return path


def recordable(name: str) -> tuple[str, str]:
    """(name, commit) when a result named ``name`` can be recorded; ArgumentTypeError saying why not."""
    if not re.fullmatch(r"\w+", name):
        raise argparse.ArgumentTypeError(f"{name!r}: a name of letters, digits and underscores")
    commit, clean = checkout()
    if not commit or not clean:
        raise argparse.ArgumentTypeError("commit the code first, and change nothing while it measures (the manifest "
                                         "names the commit that was measured)")
    return name, commit


def add_record_option(parser: argparse.ArgumentParser) -> None:
    """A script's ``--record NAME``, refused as it is parsed (before anything is measured) where ``record`` would
    refuse it at the end; ``args.record`` is the name."""
    parser.add_argument("--record", metavar="NAME", type=lambda name: recordable(name)[0],
                        help="also write the results to benchmarks/results/NAME.json (benchmarks/figures.py)")


def load_manifest(results: Path = RESULTS) -> dict:
    path = results / MANIFEST
    return json.loads(path.read_text()) if path.is_file() else {}


INPUTS = r"(?:bash|sh|python|yaml|toml|\{code-cell\}|\{toctree\}|\{include\})"


def prose(text: str) -> str:
    """A Markdown page without what a reader types (fenced commands, code and configuration, inline code, link
    targets, directives). A fence without a language or marked ``text`` is output, and stays: typed-out output is
    typed-out figures."""
    text = re.sub(rf"^(```+|~~~+)\s*{INPUTS}.*?^\1", "", text, flags=re.S | re.M)
    text = re.sub(r"^(```+)\w*\nusage: .*?^\1", "", text, flags=re.S | re.M)  # a command's help: its parameters
    text = re.sub(r"`[^`\n]*`", "", text)
    return re.sub(r"\]\([^)]*\)", "]", text)


def figures_in(text: str) -> list[str]:
    """The figures written in a Markdown page's prose."""
    return FIGURE.findall(prose(text))


def pages(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def check(root: Path = ROOT) -> list[str]:
    """Every problem with the figures of a checkout: one line each, none when all is well."""
    results = root / "benchmarks" / "results"
    manifest, problems = load_manifest(results), []
    listed = {f"{name}.json" for name in manifest} | {MANIFEST}
    problems += [f"{path.relative_to(root)}: not in the manifest" for path in sorted(results.glob("*"))
                 if path.name not in listed]
    for name, entry in manifest.items():
        problems += [f"{MANIFEST}: {name}: {line}" for line in entry_problems(root, results / f"{name}.json", entry)]
    data = {name: json.loads((results / f"{name}.json").read_text()) for name in manifest
            if (results / f"{name}.json").is_file()}
    for page in pages(root):
        text = page.read_text()
        problems += [f"{page.relative_to(root)}: a figure outside benchmarks/results: {figure!r}"
                     for figure in figures_in(text)]
        problems += [f"{page.relative_to(root)}: {{{{ {kind}.{name}.{key} }}}} is no recorded figure"
                     for kind, name, key in USE.findall(text)
                     if key not in data.get(name, {}).get(KINDS[kind], {})]
    return problems


def entry_problems(root: Path, path: Path, entry: dict) -> list[str]:
    missing = [key for key in ("script", "command", "machine", "commit", "date", "sha256") if not entry.get(key)]
    if missing:
        return [f"no {', '.join(missing)}"]
    problems = []
    if not path.is_file():
        return [f"{path.name} is missing"]
    if sha256(path) != entry["sha256"]:
        problems.append(f"{path.name} does not have the recorded SHA-256 (changed after it was measured)")
    script = entry["script"]
    if not (script.startswith("benchmarks/") and (root / script).is_file()):
        problems.append(f"script {script} is not a file in benchmarks/")
    if not entry["command"].startswith(f"python {script}"):
        problems.append(f"command {entry['command']!r} does not run {script}")
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", entry["date"]):
        problems.append(f"date {entry['date']!r} is not YYYY-MM-DD")
    if not re.fullmatch(r"[0-9a-f]{40}", entry["commit"]):
        problems.append(f"commit {entry['commit']!r} is not a full commit hash")
    elif not shallow(root):
        if git(root, "merge-base", "--is-ancestor", entry["commit"], "HEAD").returncode != 0:
            problems.append(f"commit {entry['commit']} is not in this checkout's history")
    return problems


def shallow(root: Path) -> bool:
    """A checkout without its history (``git clone --depth``): the commits cannot be followed there."""
    return git(root, "rev-parse", "--is-shallow-repository").stdout.strip() == "true"


def dated(value, unit: str, date: str) -> str:
    text = f"{value} {unit}".strip() if unit not in ("%", "x") else f"{value}{unit}"
    return f"{text} ({date})" if unit in TIME_UNITS else text


def provenance(entry: dict) -> str:
    return f"Measured {entry['date']} on {entry['machine']}, kbert {entry['commit'][:7]}: `{entry['command']}`"


def markdown_table(table: dict) -> str:
    lines = ["| " + " | ".join(table["columns"]) + " |", "|" + " --- |" * len(table["columns"])]
    return "\n".join(lines + ["| " + " | ".join(str(cell) for cell in row) + " |" for row in table["rows"]])


def substitutions(root: Path = ROOT) -> dict:
    """MyST substitutions for docs/conf.py: ``fig`` (NAME -> KEY -> the figure's text), ``table`` and ``output``
    (NAME -> KEY -> a Markdown table, a block of output, under its provenance line) and ``every_result`` (all of
    them, for the figures page)."""
    results = root / "benchmarks" / "results"
    fig, table, output, every = {}, {}, {}, []
    for name, entry in load_manifest(results).items():
        data = json.loads((results / f"{name}.json").read_text())
        fig[name] = {key: dated(value, unit, entry["date"]) for key, (value, unit) in data["figures"].items()}
        tables = {key: markdown_table(t) for key, t in data["tables"].items()}
        outputs = {key: f"```text\n{text.rstrip()}\n```" for key, text in data.get("outputs", {}).items()}
        table[name] = {key: f"{provenance(entry)}\n\n{text}" for key, text in tables.items()}
        output[name] = {key: f"{provenance(entry)}\n\n{text}" for key, text in outputs.items()}
        lines = [f"## {name}", "", provenance(entry) + f" (output SHA-256 `{entry['sha256'][:12]}`)", ""]
        lines += [f"- {key}: {text}" for key, text in fig[name].items()]
        lines += [part for text in [*tables.values(), *outputs.values()] for part in ("", text)]
        every.append("\n".join(lines))
    return {"fig": fig, "table": table, "output": output, "every_result": "\n\n".join(every)}


def main() -> None:
    if sys.argv[1:] != ["check"]:
        raise SystemExit("usage: python benchmarks/figures.py check")
    problems = check()
    for line in problems:
        print(line, file=sys.stderr)
    if problems:
        raise SystemExit(2)
    if shallow(ROOT):
        print("figures: a shallow clone: the recorded commits are not followed into its history", file=sys.stderr)
    print(f"figures: {len(load_manifest())} recorded results; no figure outside them in README.md or docs/")


if __name__ == "__main__":
    main()
