"""End-to-end smoke runs of the `kbert` command on a slice of the real Titanic data."""

import argparse
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from kbert.errors import KbertError
from kbert.pipeline.config import BUNDLED_DATA_DIR, load_competition
from kbert.pipeline.submission import validate_submission

SMOKE = ["--limit-rows", "200", "--folds", "2", "--epochs", "2", "--no-progress"]


def kbert(*args, cwd):
    return subprocess.run([sys.executable, "-m", "kbert.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def test_help_lists_commands_and_flags(tmp_path):
    top = kbert("--help", cwd=tmp_path)
    assert top.returncode == 0 and "run" in top.stdout
    run = kbert("run", "--help", cwd=tmp_path)
    for flag in ("--folds", "--seed", "--epochs", "--data-dir", "--out"):
        assert flag in run.stdout


def test_run_options_are_the_declared_settings(tmp_path, monkeypatch):
    """Every run setting declared with a flag (pipeline/config.py) is a `kbert run` option with its declaration's
    help and choices, set in the run's overrides under its name, and one declared with an environment variable takes
    its value when the flag is not given; building the parser loads no MLX (the choices are read from their
    modules' source)."""
    from kbert.cli import build_parser
    from kbert.cli.run import _overrides
    from kbert.pipeline.config import FLAG_SECTIONS, flags

    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    run = commands.choices["run"]
    options = {action.dest: action for action in run._actions}
    declared = {name: f for settings in FLAG_SECTIONS.values() for name, f in flags(settings).items()}
    assert {"pooling", "folds", "learning_rate", "compile", "out_dir", "threshold"} <= set(declared)
    for name, f in declared.items():
        env = f" (default: ${f.metadata['env']} when set)" if f.metadata["env"] else ""
        assert options[name].option_strings == [f.metadata["flag"]] and options[name].help == f.metadata["help"] + env
        assert tuple(options[name].choices or ()) == f.metadata["choices"], name
    overrides = _overrides(run.parse_args(["titanic", "--pooling", "mean", "--no-compile", "--folds", "3"]))
    assert set(overrides) == set(declared)
    chosen = (overrides["pooling"], overrides["compile"], overrides["folds"], overrides["epochs"])
    assert chosen == ("mean", False, 3, None)
    assert declared["limit_rows"].metadata["env"] == "KBERT_LIMIT_ROWS" and overrides["limit_rows"] is None
    monkeypatch.setenv("KBERT_LIMIT_ROWS", "50")
    run = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices["run"]
    from kbert.cli.common import check_numbers

    def checked(argv):  # as main reads the variable: after parsing, where no flag was given
        args = run.parse_args(argv)
        check_numbers(args)
        return args

    assert _overrides(checked(["titanic"]))["limit_rows"] == 50
    assert _overrides(checked(["titanic", "--limit-rows", "7"]))["limit_rows"] == 7  # the flag wins
    for text in ("0", "abc"):  # named as the variable, not as the flag nobody gave (argparse's refusal for abc)
        monkeypatch.setenv("KBERT_LIMIT_ROWS", text)
        with pytest.raises(KbertError) as error:
            checked(["titanic"])
        assert str(error.value) == ("the environment's KBERT_LIMIT_ROWS must be an integer >= 1, got "
                                    f"{int(text) if text.isdigit() else text!r}")
    code = "import sys; from kbert.cli import build_parser; build_parser(); print('mlx.core' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.stdout.strip() == "False", out.stderr


def test_an_unknown_choice_is_refused_by_the_command_line(tmp_path):
    result = kbert("run", "titanic", "--pooling", "bogus", cwd=tmp_path)
    assert result.returncode == 2 and "argument --pooling: invalid choice: 'bogus' (choose from" in result.stderr
    assert "'cls-last4'" in result.stderr


@pytest.mark.parametrize("argv, error", [
    (["run", "titanic", "--augment", "many"], "argument --augment: invalid int value: 'many'; `kbert run --help`"),
    (["baseline", "titanic", "--no-such-option"], "unrecognized arguments: --no-such-option; `kbert baseline --help`"),
    (["no-such-command"], "argument COMMAND: invalid choice: 'no-such-command'"),
    (["tune", "titanic", "--trials"], "argument --trials: expected one argument; `kbert tune --help`")])
def test_the_command_line_refuses_in_one_line(argv, error, tmp_path, capsys):
    """An option argparse refuses is one line naming it and where the options are listed, no usage dump."""
    from kbert.cli import main

    with pytest.raises(SystemExit) as exit:
        main(argv)
    stderr = capsys.readouterr().err
    assert exit.value.code == 2 and stderr.count("\n") == 1 and stderr.startswith("kbert: error: ")
    assert error in stderr


@pytest.mark.slow
def test_smoke_run_writes_artifacts_and_a_valid_submission(tmp_path):
    started = time.perf_counter()
    result = kbert("run", "titanic", *SMOKE, "--run-id", "smoke", "--out", "runs", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert time.perf_counter() - started < 60
    assert "CV accuracy:" in result.stdout and "fold 2/2: accuracy" in result.stdout

    run_dir = tmp_path / "runs" / "titanic" / "smoke"
    assert (tmp_path / "runs" / "titanic" / "folds" / "stratified-k2-seed42-first200.csv").is_file()
    for name in ("config.yaml", "folds.csv", "oof.csv", "test.csv", "metrics.json"):
        assert (run_dir / name).is_file(), name
    for k in range(2):
        for name in ("model.safetensors", "config.json", "tokenizer.json", "test.csv"):
            assert (run_dir / "folds" / str(k) / name).is_file()
    oof = pd.read_csv(run_dir / "oof.csv")
    assert len(oof) == 200 and oof["Survived"].between(0, 1).all()

    submission_path = tmp_path / "submissions" / "titanic" / "smoke.csv"
    assert f"submission: {Path('submissions') / 'titanic' / 'smoke.csv'}" in result.stdout
    submission = pd.read_csv(submission_path)
    sample = pd.read_csv(BUNDLED_DATA_DIR / "titanic" / "gender_submission.csv")
    validate_submission(submission, sample, load_competition("titanic"))
    assert list(submission["PassengerId"]) == list(sample["PassengerId"])


@pytest.mark.slow
def test_same_seed_gives_identical_oof(tmp_path):
    for run_id in ("a", "b"):
        result = kbert("run", "titanic", *SMOKE, "--seed", "7", "--run-id", run_id, "--out", "runs", cwd=tmp_path)
        assert result.returncode == 0, result.stderr
    a = (tmp_path / "runs" / "titanic" / "a" / "oof.csv").read_bytes()
    b = (tmp_path / "runs" / "titanic" / "b" / "oof.csv").read_bytes()
    assert a == b


@pytest.mark.slow
def test_user_errors_exit_nonzero_with_one_line(tmp_path):
    result = kbert("run", "no-such-competition", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().startswith("kbert: error: unknown competition 'no-such-competition'")
    assert "Traceback" not in result.stderr

    data = tmp_path / "data"
    data.mkdir()
    (data / "train.csv").write_text((BUNDLED_DATA_DIR / "titanic" / "train.csv").read_text())
    result = kbert("run", "titanic", "--data-dir", str(data), "--out", "runs", cwd=tmp_path)
    assert result.returncode == 2
    assert f"{data / 'test.csv'}: file not found" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "submissions").exists()


@pytest.mark.slow
def test_validate_command_accepts_the_sample_and_rejects_a_short_file(tmp_path):
    sample = BUNDLED_DATA_DIR / "titanic" / "gender_submission.csv"
    ok = kbert("validate", "titanic", str(sample), cwd=tmp_path)
    assert ok.returncode == 0 and "valid titanic submission (418 rows)" in ok.stdout
    short = tmp_path / "short.csv"
    short.write_text("\n".join(sample.read_text().splitlines()[:-1]) + "\n")
    bad = kbert("validate", "titanic", str(short), cwd=tmp_path)
    assert bad.returncode == 2 and "417 rows, but the sample submission has 418" in bad.stderr


REPO_SUBMISSIONS = sorted((Path(__file__).resolve().parent.parent / "submissions" / "titanic").glob("*.csv"))


@pytest.mark.slow
def test_submissions_written_by_full_runs_are_valid(tmp_path):
    """A submission a quick `kbert baseline titanic` writes here, and every one `kbert run titanic` left in
    submissions/titanic/ (none on a clean checkout), match the sample submission."""
    result = kbert("baseline", "titanic", "--folds", "2", "--run-id", "check", "--out", "runs", "--submissions-dir",
                   "subs", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    fresh = tmp_path / "subs" / "titanic" / "check.csv"
    sample = pd.read_csv(BUNDLED_DATA_DIR / "titanic" / "gender_submission.csv")
    for path in [fresh, *REPO_SUBMISSIONS]:
        validate_submission(pd.read_csv(path), sample, load_competition("titanic"), source=str(path))
    checked = kbert("validate", "titanic", str(fresh), cwd=tmp_path)
    assert checked.returncode == 0 and "valid titanic submission (418 rows)" in checked.stdout


def numeric_options() -> list[tuple[str, argparse.Action, argparse.ArgumentParser]]:
    """(command, action, its parser) for every int or float option of every kbert command."""
    from kbert.cli import build_parser

    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return [(name, action, parser) for name, parser in commands.choices.items() for action in parser._actions
            if action.type in (int, float)]


REQUIRED = {"predict": ["run", "--data", "new.csv"], "embed": ["minilm-l6", "--texts", "t.txt", "--out", "v.npy"],
            "run": ["titanic"], "auto": ["titanic", "--time-limit", "1m"]}  # the positionals and required options of each command (anything: nothing runs)


@pytest.mark.parametrize("command,action", [(c, a) for c, a, _ in numeric_options()],
                         ids=[f"{c} {a.option_strings[0]}" for c, a, _ in numeric_options()])
def test_every_numeric_option_refuses_nan_infinity_and_negatives(command, action, tmp_path, monkeypatch, capsys):
    """argparse's float() takes nan and inf and int() takes negatives: every numeric option of every command is
    checked (kbert.cli.common.add_number) before its handler runs, with one line naming the flag."""
    from kbert.cli import main

    parser = next(p for c, a, p in numeric_options() if c == command and a.dest == action.dest)
    assert action.dest in (parser.get_default("numbers") or {}), f"{command} {action.option_strings[0]}: use add_number"
    monkeypatch.chdir(tmp_path)
    flag = action.option_strings[0]
    for value in (["nan", "inf", "-inf"] if action.type is float else ["-1"]):
        code = main([command, *REQUIRED.get(command, ["titanic"]), f"{flag}={value}"])
        err = capsys.readouterr().err
        assert code == 2 and err.startswith(f"kbert: error: {flag} must be "), err
        assert len(err.strip().splitlines()) == 1 and err.strip().endswith(f"got {float(value)!r}"
                                                                           if action.type is float else "got -1")
    assert list(tmp_path.iterdir()) == []


def test_doctor_decides_fast_blas_from_what_is_bound_not_from_a_timing(monkeypatch, capsys):
    """A busy machine times the sgemm slowly: with a fast BLAS bound doctor still exits 0, and reports the timing."""
    from kbert.cli import main
    from kbert.cli.doctor import fast_blas_bound
    from kbert.models import blas, runtime

    assert fast_blas_bound("openblas", "Linux") and fast_blas_bound("mkl", "Linux")
    assert not fast_blas_bound("reference", "Linux") and not fast_blas_bound("unbound", "Linux")
    assert fast_blas_bound("platform", "Darwin")
    monkeypatch.setattr(blas, "measure_sgemm_gflops", lambda: 1.5)
    code = main(["doctor"])
    out, err = capsys.readouterr()
    fast = fast_blas_bound(runtime.status().blas.name, __import__("platform").system())
    assert f"sgemm 1024^3 float32 on one CPU core: 1.5 GFLOP/s (fast BLAS bound: {'yes' if fast else 'no'}, " in out
    assert code == (0 if fast else 1)
    if fast and sys.platform == "linux":
        assert "note: the sgemm timing (1.5 GFLOP/s) is low for a fast BLAS" in err


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["bert", "modernbert"])
def test_run_fine_tunes_a_pretrained_encoder_folder(tmp_path, kind):
    """`--encoder FOLDER` loads a Hugging Face checkpoint (here a tiny random one) and its tokenizer."""
    from tests.test_pretrained import random_reference, tiny_tokenizer_folder

    folder = tmp_path / kind
    folder.mkdir()
    tokenizer = tiny_tokenizer_folder(folder)
    random_reference(kind, tokenizer.get_vocab_size()).save_pretrained(folder)
    result = kbert("run", "titanic", "--encoder", str(folder), "--max-length", "64", *SMOKE, "--run-id", kind,
                   "--out", "runs", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"encoder {folder}" in result.stdout
    saved = tmp_path / "runs" / "titanic" / kind / "folds" / "0"
    from kbert.models.checkpoints import load_checkpoint

    model, config = load_checkpoint(saved)
    assert config["encoder_config"]["model_type"] == kind and config["source"] == str(folder)
    # Each fold started from the checkpoint's weights: 2 epochs at lr 1e-5 move a weight by well under 0.01,
    # while a fresh random initialisation would differ by about the init scale.
    import numpy as np
    from mlx.utils import tree_flatten

    from kbert.models.encoders import architecture, read_weights

    reference = architecture(kind).sanitize(read_weights(folder))
    fold_weights = dict(tree_flatten(model.encoder.parameters()))
    name = next(n for n in reference if n.endswith("embeddings.weight"))
    assert np.abs(np.array(fold_weights[name]) - np.array(reference[name])).max() < 0.01


@pytest.mark.slow
def test_run_trains_a_named_size_from_scratch(tmp_path):
    result = kbert("run", "titanic", "--encoder", "bert-mini", *SMOKE, "--run-id", "mini", "--out", "runs", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    from kbert.models.checkpoints import load_checkpoint

    _, config = load_checkpoint(tmp_path / "runs" / "titanic" / "mini" / "folds" / "0")
    assert (config["encoder_config"]["num_hidden_layers"], config["encoder_config"]["hidden_size"]) == (4, 256)
