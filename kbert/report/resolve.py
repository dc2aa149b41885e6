"""What a report is of and where it goes: ``resolve_target`` tells a run (folder or run id), a study folder and
an ensemble sidecar JSON apart; ``output_folder`` is where each one's report is written by default."""

from __future__ import annotations

import json
from pathlib import Path

from kbert.errors import KbertError

REPORT_FOLDER = "report"  # in a run or study folder; also where kbert.tune.write_report writes a study's plots
ENSEMBLE_KEYS = ("method", "weights", "members")  # what makes a JSON file an ensemble sidecar


def resolve_target(target: str, runs_dir: str = "runs") -> tuple[str, Path]:
    """("run" | "study" | "ensemble", path): a run folder or run id, a study folder (journal.log), or an
    ensemble sidecar JSON."""
    path = Path(target)
    if path.is_file():
        if path.suffix != ".json":
            raise KbertError(f"{path}: not a report target; pass a run folder or run id, a study folder "
                             "(runs/<competition>/<study>) or an ensemble sidecar .json")
        try:
            values = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise KbertError(f"{path}: not valid JSON: {exc}") from None
        missing = [k for k in ENSEMBLE_KEYS if not isinstance(values, dict) or k not in values]
        if missing:
            raise KbertError(f"{path}: not an ensemble sidecar JSON (no {', '.join(missing)}); "
                             "kbert ensemble writes one beside its submission")
        return "ensemble", path
    if path.is_dir() and (path / "journal.log").is_file():
        return "study", path
    if path.is_dir() and not (path / "config.yaml").is_file():
        raise KbertError(f"{path}: neither a run folder (config.yaml), a study folder (journal.log) nor an "
                         "ensemble sidecar .json")
    from kbert.pipeline.new_rows import resolve_run_dir  # imports MLX: only when the target may be a run

    return "run", resolve_run_dir(target, runs_dir)


def output_folder(kind: str, path: Path) -> Path:
    """``<run or study>/report/``, or ``<json stem>-report/`` beside an ensemble sidecar."""
    return path.with_name(f"{path.stem}-report") if kind == "ensemble" else path / REPORT_FOLDER
