"""Encoders from the Hugging Face Hub: ``--encoder org/name[@revision]`` (a branch, tag or commit).

``is_hub_name`` tells a Hub id by its shape (a local folder of that name always wins); ``fetch`` downloads only
what kbert reads into huggingface_hub's cache and returns the snapshot and its commit, which a run records
(``HubModel.pinned``). Offline, the cache alone is used. Nothing from the repo is run as code.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from kbert.errors import KbertError
from kbert.io import read_json

CONFIG_FILE = "config.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt", "spm.model",
                   "sentencepiece.bpe.model", "merges.txt", "vocab.json")
SAFETENSORS, SAFETENSORS_INDEX, TORCH_BIN = "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin"
# Downloaded first: everything but the weights, whose choice depends on what the repo holds (``weight_files``).
FIRST_FILES = [CONFIG_FILE, *TOKENIZER_FILES, SAFETENSORS_INDEX]

# A Hub repo id part (huggingface_hub's validate_repo_id): 1-96 ASCII letters, digits, "_", "-" or ".", starting
# and ending with a letter, digit or "_"; "--" and ".." are refused, and a name may not end in ".git". A
# revision: a branch, tag or commit (branch names may hold "/", as in refs/pr/1).
_PART = r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?"
_REVISION = r"[A-Za-z0-9_][A-Za-z0-9_.\-/]{0,254}"
HUB_NAME = re.compile(rf"(?P<repo>{_PART}/{_PART})(?:@(?P<revision>{_REVISION}))?")


@dataclass(frozen=True)
class HubModel:
    """A Hub model in the local cache: its id, the revision asked for, the commit it resolved to, its folder."""

    repo_id: str
    revision: str | None  # as given after "@" (a branch, tag or commit); None: the repo's default branch
    commit: str  # the 40-hex commit the files come from
    folder: Path  # the snapshot folder in huggingface_hub's cache

    @property
    def pinned(self) -> str:
        """``org/name@<commit>``: the name that loads these exact files again (``fetch`` accepts it)."""
        return f"{self.repo_id}@{self.commit}"


def parse_hub_name(text: str) -> tuple[str, str | None] | None:
    """(repo id, revision or None) when ``text`` has the shape of a Hub model id, else None."""
    match = HUB_NAME.fullmatch(str(text))
    if match is None:
        return None
    repo_id, revision = match["repo"], match["revision"]
    if "--" in repo_id or ".." in repo_id or repo_id.endswith(".git"):
        return None
    if revision is not None and (".." in revision or "//" in revision or revision.endswith(("/", ".lock"))):
        return None
    return repo_id, revision


def is_hub_name(text: str | Path) -> bool:
    """``org/name`` or ``org/name@revision``, and no local file or folder of that name (a local path wins)."""
    return parse_hub_name(str(text)) is not None and not Path(text).exists()


def fetch(name: str) -> HubModel:
    """Download (once) what kbert reads of the Hub model ``name`` (``org/name[@revision]``) into the Hugging Face
    cache, or find it there offline; every failure is one KbertError line naming the model."""
    parsed = parse_hub_name(name)
    if parsed is None:
        raise KbertError(f"'{name}' is not a Hugging Face Hub model id: expected org/name or org/name@revision")
    repo_id, revision = parsed
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise KbertError(f"encoder '{name}' is a Hugging Face Hub model, which needs huggingface_hub: "
                         "pip install huggingface_hub") from None
    offline = offline_mode()
    with hub_errors(name, repo_id, revision, offline):
        folder = Path(snapshot_download(repo_id, revision=revision, allow_patterns=FIRST_FILES,
                                        local_files_only=offline, library_name="kbert"))
        commit = folder.name  # snapshots/<commit>
        if not (folder / CONFIG_FILE).is_file():
            raise KbertError(f"encoder '{name}': the Hub model {repo_id} (commit {commit}) has no config.json; "
                             "kbert reads Transformers encoder checkpoints (config.json, tokenizer, weights)")
        wanted = FIRST_FILES + weight_files(name, repo_id, commit, folder)
        folder = Path(snapshot_download(repo_id, revision=commit, allow_patterns=wanted, local_files_only=offline,
                                        library_name="kbert"))
    return HubModel(repo_id=repo_id, revision=revision, commit=commit, folder=folder)


def offline_mode() -> bool:
    """HF_HUB_OFFLINE, as huggingface_hub read it at import or as the environment says now."""
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE) or os.environ.get("HF_HUB_OFFLINE", "").upper() in {"1", "ON", "YES", "TRUE"}


def weight_files(name: str, repo_id: str, commit: str, folder: Path) -> list[str]:
    """The weight files to fetch: model.safetensors, else the sharded index's shards, else pytorch_model.bin. The
    repo's files come from the listing huggingface_hub cached for this commit (written by the download that just
    ran, or by an earlier one offline); a cache without it offers what its snapshot folder holds."""
    from huggingface_hub import get_cached_repo_tree
    from huggingface_hub.errors import CachedRepoTreeNotFoundError

    try:
        listed = {entry.path for entry in get_cached_repo_tree(repo_id, revision=commit)}
    except CachedRepoTreeNotFoundError:
        listed = {path.relative_to(folder).as_posix() for path in folder.rglob("*") if path.is_file()}
    if SAFETENSORS in listed:
        return [SAFETENSORS]
    if SAFETENSORS_INDEX in listed and (folder / SAFETENSORS_INDEX).is_file():
        weight_map = read_json(folder / SAFETENSORS_INDEX, required=("weight_map",))["weight_map"]
        if not isinstance(weight_map, dict):
            raise KbertError(f"{folder / SAFETENSORS_INDEX}: 'weight_map' must map weight names to shard files")
        return sorted(set(map(str, weight_map.values())))
    if TORCH_BIN in listed:
        return [TORCH_BIN]
    raise KbertError(f"encoder '{name}': the Hub model {repo_id} (commit {commit}) has no weights kbert reads: "
                     f"{SAFETENSORS}, {SAFETENSORS_INDEX} with its shards, or {TORCH_BIN}")


@contextmanager
def hub_errors(name: str, repo_id: str, revision: str | None, offline: bool) -> Iterator[None]:
    """huggingface_hub's and the network's exceptions as one KbertError line naming the model and what to do."""
    from huggingface_hub import constants
    from huggingface_hub.errors import (GatedRepoError, HfHubHTTPError, IncompleteSnapshotError,
                                        LocalEntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError)

    where = f"encoder '{name}'"
    get = f"`hf download {repo_id}" + (f" --revision {revision}" if revision else "") + "`"
    cache = constants.HF_HUB_CACHE
    try:
        yield
    except GatedRepoError:
        raise KbertError(f"{where}: the Hub model {repo_id} is gated: accept its conditions on its Hub page, then "
                         "log in (`hf auth login`) or set HF_TOKEN") from None
    except RepositoryNotFoundError:
        raise KbertError(f"{where} is not a local folder, and the Hugging Face Hub ({constants.ENDPOINT}) has no model "
                         f"'{repo_id}' (if it is private: log in with `hf auth login` or set HF_TOKEN)") from None
    except RevisionNotFoundError:
        raise KbertError(f"{where}: the Hub model {repo_id} has no revision '{revision or 'main'}' (a branch, tag "
                         "or commit)") from None
    except IncompleteSnapshotError as exc:
        reason = "HF_HUB_OFFLINE is set" if offline else f"the Hub cannot be reached ({cause(exc)})"
        raise KbertError(f"{where}: its copy in the Hugging Face cache ({cache}) is incomplete (an interrupted "
                         f"download) and {reason}: run once online to complete it, or {get}") from None
    except LocalEntryNotFoundError as exc:
        if offline:
            raise KbertError(f"{where} is not in the Hugging Face cache ({cache}) and HF_HUB_OFFLINE is set: run "
                             f"once online (without HF_HUB_OFFLINE) or {get} to cache it, or pass a local model "
                             "folder") from None
        raise KbertError(f"{where}: the Hugging Face Hub ({constants.ENDPOINT}) cannot be reached ({cause(exc)}) "
                         f"and no complete copy is in the cache ({cache}): check the network, or pass a local "
                         "model folder") from None
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else "?"
        raise KbertError(f"{where}: the Hugging Face Hub answered HTTP {status} for {repo_id} "
                         f"({first_line(exc)})") from None
    except PermissionError as exc:
        raise KbertError(f"{where}: cannot write the Hugging Face cache ({exc}); set HF_HOME to a writable "
                         "folder") from None
    except (OSError, *transport_errors()) as exc:
        raise KbertError(f"{where}: the download from the Hugging Face Hub failed ({type(exc).__name__}: "
                         f"{first_line(exc)}); nothing partial is kept: run again to retry") from None


def transport_errors() -> tuple[type[BaseException], ...]:
    """The HTTP client's own exceptions (a connection dropped mid-file, a timeout): not OSErrors."""
    try:
        import httpx2
    except ImportError:
        return ()
    return (httpx2.HTTPError,)


def first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def cause(exc: BaseException) -> str:
    """The first line of what made huggingface_hub give up (the connection error behind a LocalEntryNotFoundError)."""
    inner = exc.__cause__ or exc.__context__
    return f"{type(inner).__name__}: {first_line(inner)}" if inner is not None else first_line(exc)
