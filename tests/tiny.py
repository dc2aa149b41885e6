"""The tiny run that training tests share: a one-layer BERT 32 wide, 2 folds of 1 epoch, short texts."""

from pathlib import Path

from kbert.pipeline.artifacts import RunResult
from kbert.models.encoders import trains_from_scratch
from kbert.pipeline.config import BERT_SIZES, CompetitionConfig, RunConfig, load_competition, resolve_run_config
from kbert.pipeline.run import run_competition

TINY = {"folds": 2, "epochs": 1, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
        "intermediate_size": 64, "vocab_size": 300, "max_length": 64}


def tiny_args(limit_rows: int, max_length: int = 64) -> list[str]:
    """TINY's folds, epochs and length as `kbert run` options (the command trains the competition's own model)."""
    return ["--limit-rows", str(limit_rows), "--folds", "2", "--epochs", "1", "--max-length", str(max_length),
            "--no-progress"]


def tiny_config(competition: str | Path | CompetitionConfig, out: Path, **overrides) -> RunConfig:
    """TINY's settings for a competition (its name, its YAML's path or itself), writing runs to out/runs and
    submissions to out/subs; ``overrides`` change any run setting."""
    if not isinstance(competition, CompetitionConfig):
        competition = load_competition(str(competition))
    tiny = dict(TINY)
    encoder = overrides.get("encoder", "bert")
    if encoder != "bert":  # a named size or a pretrained encoder has its own sizes (refused if given)
        tiny = {k: v for k, v in tiny.items() if k not in BERT_SIZES}
    if not trains_from_scratch(encoder):
        tiny.pop("vocab_size")
    return resolve_run_config(competition, {**tiny, "out_dir": str(out / "runs"), "submissions_dir": str(out / "subs"),
                                            **overrides})


def run_tiny(competition: str | Path | CompetitionConfig, out: Path, run_id: str = "t", **overrides) -> RunResult:
    """Train tiny_config's run quietly."""
    return run_competition(tiny_config(competition, out, **overrides), run_id=run_id, progress=False,
                           log=lambda _: None)


def reseal_fold_files(run_dir: Path) -> None:
    """Record the run's fold files in its metrics.json as they are now on disk (as if it had been trained to them), so
    that a test reaches the check behind the fold seal."""
    import json

    from kbert.pipeline.artifacts import fold_files_sha256, sealed

    metrics = json.loads((run_dir / "metrics.json").read_text())
    (run_dir / "metrics.json").write_text(json.dumps(sealed({**metrics, "fold_files_sha256": fold_files_sha256(run_dir)})))
