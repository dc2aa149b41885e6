"""`--encoder org/name[@revision]`: Hugging Face Hub models fetched through huggingface_hub (models/hub.py).

The Hub is tests/hub_server.py on 127.0.0.1, serving tiny random BERTs saved by transformers' save_pretrained.
huggingface_hub reads HF_ENDPOINT, HF_HOME and HF_HUB_OFFLINE when it is imported, so every kbert command runs in a
subprocess with them set (a fresh HF_HOME per test: nothing is shared with the user's cache).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import yaml

from kbert.models.hub import HubModel, is_hub_name, parse_hub_name
from kbert.pipeline.config import BUNDLED_DATA_DIR
from tests.hub_server import FakeHub, hub_server
from tests.tiny import tiny_args

RUN = [*tiny_args(60, max_length=32), "--out", "runs"]
TEXTS = "A woman travelling in first class.\nA man in third class.\n"


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """Tiny random BERT checkpoints as transformers saves them: ``main`` (model.safetensors + tokenizer.json),
    ``v1`` (other weights), ``bin`` (pytorch_model.bin + vocab.txt only), ``sharded`` (an index and its shards)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from tests.test_pretrained import random_reference, tiny_tokenizer_folder

    base = tmp_path_factory.mktemp("checkpoints")
    folders = {name: base / name for name in ("main", "v1", "bin", "sharded")}
    for folder in folders.values():
        folder.mkdir()
    tokenizer = tiny_tokenizer_folder(folders["main"])
    model = random_reference("bert", tokenizer.get_vocab_size())
    model.save_pretrained(folders["main"])
    model.save_pretrained(folders["sharded"], max_shard_size="40KB")
    tiny_tokenizer_folder(folders["sharded"])
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    (folders["bin"] / "vocab.txt").write_text("".join(token + "\n" for token, _ in vocab), encoding="utf-8")
    (folders["bin"] / "tokenizer_config.json").write_text('{"do_lower_case": true}')
    model.config.to_json_file(folders["bin"] / "config.json")
    torch.save(model.state_dict(), folders["bin"] / "pytorch_model.bin")
    with torch.no_grad():
        model.embeddings.word_embeddings.weight.add_(0.5)  # revision v1: other weights, so another commit
    model.save_pretrained(folders["v1"])
    tiny_tokenizer_folder(folders["v1"])
    assert (folders["sharded"] / "model.safetensors.index.json").is_file()
    return folders


def files_of(folder: Path, **extra: bytes | str) -> dict[str, Path | bytes | str]:
    return {path.name: path for path in folder.iterdir()} | extra


@pytest.fixture
def hub(folders) -> Iterator[FakeHub]:
    """The fake Hub: org/tiny (main; tag v1 on a second commit; a README, an ONNX export and a .bin copy that kbert
    must not fetch), org/binonly, org/sharded and org/gated."""
    with hub_server() as hub:
        hub.main = hub.add("org/tiny", files_of(folders["main"], **{"README.md": "# tiny", "onnx/model.onnx": b"o" * 64,
                                                                   "pytorch_model.bin": b"never fetched"}))
        hub.v1 = hub.add("org/tiny", files_of(folders["v1"]), refs=("v1",))
        hub.add("org/binonly", files_of(folders["bin"]))
        hub.add("org/sharded", files_of(folders["sharded"]))
        hub.add("org/gated", files_of(folders["main"]), gated=True)
        yield hub


def kbert(*args: str, cwd: Path, endpoint: str, offline: bool = False) -> subprocess.CompletedProcess:
    """``kbert ARGS`` in a subprocess against the Hub at ``endpoint``, with the Hugging Face cache in cwd/hf."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HF_", "HUGGINGFACE_")) and k not in ("TRANSFORMERS_OFFLINE", "XDG_CACHE_HOME")}
    env.update(HF_HOME=str(cwd / "hf"), HF_ENDPOINT=endpoint, HF_HUB_DISABLE_TELEMETRY="1",
               NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    return subprocess.run([sys.executable, "-m", "kbert.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def one_line_error(result: subprocess.CompletedProcess) -> str:
    """A refused command: exit 2, no traceback, and its error on a single last line (huggingface_hub's progress
    bars and retry warnings may come before it on stderr)."""
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    error = result.stderr[result.stderr.index("kbert: error: "):]
    assert len(error.strip().splitlines()) == 1, error
    return error.strip()


def snapshot(cwd: Path, repo: str, commit: str) -> set[str]:
    folder = cwd / "hf" / "hub" / f"models--{repo.replace('/', '--')}" / "snapshots" / commit
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()} if folder.is_dir() else set()


def recorded_encoder(run_dir: Path) -> tuple[str, str]:
    """model.encoder in the run's config.yaml, and the "source" of its first fold's checkpoint."""
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    checkpoint = json.loads((run_dir / "folds" / "0" / "config.json").read_text())
    return config["model"]["encoder"], checkpoint["source"]


# ---------------------------------------------------------------- names


@pytest.mark.parametrize("name,parsed", [
    ("org/name", ("org/name", None)),
    ("sentence-transformers/all-MiniLM-L6-v2", ("sentence-transformers/all-MiniLM-L6-v2", None)),
    ("org/name@v1.0", ("org/name", "v1.0")),
    ("org/name@refs/pr/1", ("org/name", "refs/pr/1")),
    ("Org_1/my.model@" + "a" * 40, ("Org_1/my.model", "a" * 40)),
])
def test_hub_names_are_recognised_by_their_shape(name, parsed, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert parse_hub_name(name) == parsed and is_hub_name(name)


@pytest.mark.parametrize("name", [
    "bert", "minilm-l6", "bert-mini", "org", "a/b/c", "./org/name", "/abs/name", "~/org", "org/", "/name",
    "org//name", "org/name@", "org/na me", "org/-name", "org/name-", "org/.name", "org/na--me", "org/na..me",
    "org/name.git", "org/name@../x", "org/name@a b", "org/name@/x", "org/" + "n" * 97, "org/café",
])
def test_other_shapes_are_not_hub_names(name):
    assert parse_hub_name(name) is None and not is_hub_name(name)


def test_a_local_path_wins_over_a_hub_name(tmp_path, monkeypatch):
    """`org/name` that exists here is that folder (a file too is no Hub name): nothing is fetched."""
    from kbert.models.encoders import resolve_encoder_path

    monkeypatch.chdir(tmp_path)
    (tmp_path / "org" / "name").mkdir(parents=True)
    (tmp_path / "org" / "file").write_text("a file")
    assert not is_hub_name("org/name") and not is_hub_name("org/file") and is_hub_name("org/other")
    assert resolve_encoder_path("org/name") == Path("org/name")
    assert HubModel("org/name", None, "c" * 40, tmp_path).pinned == f"org/name@{'c' * 40}"


# ---------------------------------------------------------------- runs


@pytest.mark.slow
def test_run_downloads_once_records_the_commit_and_works_offline(hub, tmp_path):
    """A download cut off halfway fails in one line and leaves nothing that loads (offline it is refused as
    incomplete); the healthy Hub then completes it and the run records org/tiny@<commit>; with the Hub stopped and
    HF_HUB_OFFLINE=1 the next run trains from the cache and `kbert predict` reloads its pinned base."""
    hub.cut("model.safetensors")  # every download of the weights stops halfway
    result = kbert("run", "titanic", "--encoder", "org/tiny", "--run-id", "cut", *RUN, cwd=tmp_path, endpoint=hub.url)
    error = one_line_error(result)
    assert "encoder 'org/tiny'" in error and "download" in error
    assert not (tmp_path / "runs").exists() and not (tmp_path / "submissions").exists()
    assert not [p for p in (tmp_path / "hf").rglob("*") if p.name.endswith(".incomplete")]
    assert snapshot(tmp_path, "org/tiny", hub.main) == {"config.json", "tokenizer.json"}  # no partial weights

    result = kbert("run", "titanic", "--encoder", "org/tiny", "--run-id", "cut", *RUN, cwd=tmp_path,
                   endpoint=hub.url, offline=True)
    error = one_line_error(result)
    assert "encoder 'org/tiny'" in error and "incomplete" in error and "HF_HUB_OFFLINE" in error

    hub.heal()
    result = kbert("run", "titanic", "--encoder", "org/tiny", "--run-id", "online", *RUN, cwd=tmp_path,
                   endpoint=hub.url)
    assert result.returncode == 0, result.stderr
    assert f"encoder org/tiny@{hub.main}" in result.stdout
    assert "it/s]" not in result.stderr  # --no-progress holds huggingface_hub's download bars back too
    assert recorded_encoder(tmp_path / "runs" / "titanic" / "online") == (f"org/tiny@{hub.main}",) * 2
    # Only what kbert reads: not the README, the ONNX export, nor the .bin beside the safetensors.
    assert snapshot(tmp_path, "org/tiny", hub.main) == {"config.json", "tokenizer.json", "model.safetensors"}
    assert not [path for path in hub.downloads() if path.endswith(("README.md", ".onnx", ".bin"))]

    hub.stop()  # offline now: the next run trains from the cache (with adapters, whose checkpoints name the base
    # encoder pinned to its commit), and `kbert predict` reloads that same base from the cache
    result = kbert("run", "titanic", "--encoder", "org/tiny", "--adapter", "efficient", "--run-id", "offline", *RUN,
                   cwd=tmp_path, endpoint=hub.url, offline=True)
    assert result.returncode == 0, result.stderr
    run_dir = tmp_path / "runs" / "titanic" / "offline"
    assert recorded_encoder(run_dir) == (f"org/tiny@{hub.main}",) * 2
    assert json.loads((run_dir / "folds" / "0" / "adapter_config.json").read_text())["base_encoder"] == \
        f"org/tiny@{hub.main}"
    result = kbert("predict", str(run_dir), "--data", str(BUNDLED_DATA_DIR / "titanic" / "test.csv"), cwd=tmp_path,
                   endpoint=hub.url, offline=True)
    assert result.returncode == 0, result.stderr
    assert (run_dir / "predictions" / "test.csv").is_file()


@pytest.mark.slow
def test_a_stopped_hub_falls_back_to_the_cache(hub, tmp_path):
    """Online but unreachable (not HF_HUB_OFFLINE): the cached copy is used; an uncached model is one line."""
    (tmp_path / "texts.txt").write_text(TEXTS)
    embed = ["embed", "org/tiny", "--texts", "texts.txt", "--out", "vectors.npy"]
    assert kbert(*embed, cwd=tmp_path, endpoint=hub.url).returncode == 0
    hub.stop()
    result = kbert(*embed, cwd=tmp_path, endpoint=hub.url)
    assert result.returncode == 0, result.stderr
    error = one_line_error(kbert("embed", "org/binonly", "--texts", "texts.txt", "--out", "b.npy", cwd=tmp_path,
                                 endpoint=hub.url))
    assert "encoder 'org/binonly'" in error and "cannot be reached" in error


@pytest.mark.slow
def test_offline_without_a_cached_copy_is_refused_in_one_line(hub, tmp_path):
    result = kbert("run", "titanic", "--encoder", "org/tiny", "--run-id", "refused", *RUN, cwd=tmp_path,
                   endpoint=hub.url, offline=True)
    error = one_line_error(result)
    assert error.startswith("kbert: error: encoder 'org/tiny' is not in the Hugging Face cache")
    assert "HF_HUB_OFFLINE" in error and "hf download org/tiny" in error and "local model folder" in error
    assert not (tmp_path / "runs").exists() and not (tmp_path / "submissions").exists()
    assert hub.requests == []


@pytest.mark.slow
def test_a_revision_pins_its_commit(hub, tmp_path):
    assert hub.main != hub.v1
    result = kbert("run", "titanic", "--encoder", "org/tiny@v1", "--run-id", "v1", *RUN, cwd=tmp_path,
                   endpoint=hub.url)
    assert result.returncode == 0, result.stderr
    assert recorded_encoder(tmp_path / "runs" / "titanic" / "v1") == (f"org/tiny@{hub.v1}",) * 2
    assert (tmp_path / "hf" / "hub" / "models--org--tiny" / "refs" / "v1").read_text() == hub.v1
    assert snapshot(tmp_path, "org/tiny", hub.main) == set()  # main was never fetched
    # The pinned name loads offline: what `kbert run --config <its config.yaml>` and adapter checkpoints rely on.
    (tmp_path / "texts.txt").write_text(TEXTS)
    result = kbert("embed", f"org/tiny@{hub.v1}", "--texts", "texts.txt", "--out", "v.npy", cwd=tmp_path,
                   endpoint=hub.url, offline=True)
    assert result.returncode == 0, result.stderr


# ---------------------------------------------------------------- weights and failures


@pytest.mark.slow
def test_bin_weights_when_a_repo_has_no_safetensors(hub, tmp_path):
    """pytorch_model.bin (read with torch.load(weights_only=True)) and a vocab.txt tokenizer."""
    (tmp_path / "texts.txt").write_text(TEXTS)
    result = kbert("embed", "org/binonly", "--texts", "texts.txt", "--out", "v.npy", cwd=tmp_path, endpoint=hub.url)
    assert result.returncode == 0, result.stderr
    assert snapshot(tmp_path, "org/binonly", hub.repos["org/binonly"].refs["main"]) == {
        "config.json", "tokenizer_config.json", "vocab.txt", "pytorch_model.bin"}
    assert np.load(tmp_path / "v.npy").shape == (2, 32)


@pytest.mark.slow
def test_sharded_weights_load_like_the_local_folder(hub, folders, tmp_path):
    """model.safetensors.index.json and exactly the shards it names: the same embeddings as the local folder."""
    (tmp_path / "texts.txt").write_text(TEXTS)
    result = kbert("embed", "org/sharded", "--texts", "texts.txt", "--out", "hub.npy", cwd=tmp_path, endpoint=hub.url)
    assert result.returncode == 0, result.stderr
    files = {p.name for p in folders["sharded"].iterdir()}
    assert len([name for name in files if name.endswith(".safetensors")]) > 1
    assert snapshot(tmp_path, "org/sharded", hub.repos["org/sharded"].refs["main"]) == files
    result = kbert("embed", str(folders["sharded"]), "--texts", "texts.txt", "--out", "local.npy", cwd=tmp_path,
                   endpoint=hub.url)
    assert result.returncode == 0, result.stderr
    assert np.array_equal(np.load(tmp_path / "hub.npy"), np.load(tmp_path / "local.npy"))


@pytest.mark.slow  # a kbert process each
@pytest.mark.parametrize("name,expected", [
    ("org/missing", "encoder 'org/missing' is not a local folder, and the Hugging Face Hub"),
    ("org/tiny@nope", "encoder 'org/tiny@nope': the Hub model org/tiny has no revision 'nope'"),
    ("org/gated", "encoder 'org/gated': the Hub model org/gated is gated"),
    ("short", "encoder 'org/tiny': the download from the Hugging Face Hub failed (OSError: Consistency check failed"),
])
def test_hub_failures_are_one_line_errors(hub, tmp_path, name, expected):
    if name == "short":  # the body ends halfway though HEAD announced the whole file: the size check fails
        hub.cut("model.safetensors", "short")
        name = "org/tiny"
    (tmp_path / "texts.txt").write_text(TEXTS)
    error = one_line_error(kbert("embed", name, "--texts", "texts.txt", "--out", "v.npy", cwd=tmp_path,
                                 endpoint=hub.url))
    assert error.startswith(f"kbert: error: {expected}"), error
    assert not (tmp_path / "v.npy").exists()
