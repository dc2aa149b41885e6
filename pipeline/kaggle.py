"""Kaggle competitions through the official ``kaggle`` package: download, submit, list submissions, leaderboard.

``credential_source()`` finds credentials as the package does, without importing it (importing authenticates);
``_connect()`` then authenticates, and ``_translated()`` turns the package's failures into one KbertError line.
No credential value ever enters a message, and a download lands in a temp folder and is moved into place file by
file.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import os
import re
import shutil
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, quote_plus

from kbert.errors import KbertError
from kbert.io import make_folders, removed_on_refusal

log = logging.getLogger(__name__)

SETTINGS_URL = "https://www.kaggle.com/settings"
NO_CREDENTIALS = (f"no Kaggle credentials found: create a token at {SETTINGS_URL} (API -> Create New Token), then "
                  "export KAGGLE_API_TOKEN=<token> or save it to ~/.kaggle/access_token "
                  "(a legacy kaggle.json in ~/.kaggle/ also works)")
OFFLINE = "could not reach Kaggle: check your connection (and any proxy settings), then retry"
LEADERBOARD_PAGE = 200  # the most rows the API sends per page
DESCRIPTION_WIDTH = 40  # longer submission descriptions and team names are cut in the tables
DATASET_WAIT_S, DATASET_POLL_S = 600.0, 10.0  # kbert push waits this long for Kaggle to process a dataset


# ---------------------------------------------------------------- credentials


def _home() -> Path:
    return Path(os.path.expanduser("~"))


def _display(path: Path) -> str:
    """``path`` with the home folder written as ``~``."""
    try:
        return "~/" + Path(path).relative_to(_home()).as_posix()
    except ValueError:
        return str(path)


def config_dir() -> Path:
    """The folder the kaggle package reads kaggle.json from: ``$KAGGLE_CONFIG_DIR``, else ``~/.kaggle``, else on
    Linux (when ``~/.kaggle`` does not exist) ``$XDG_CONFIG_HOME/kaggle``."""
    configured = os.environ.get("KAGGLE_CONFIG_DIR")
    if configured:
        return Path(configured)
    default = _home() / ".kaggle"
    if sys.platform.startswith("linux") and not default.exists():
        return Path(os.environ.get("XDG_CONFIG_HOME") or _home() / ".config") / "kaggle"
    return default


def _read_text(path: Path) -> str:
    """A small file's stripped text; "" when it is missing or unreadable."""
    try:
        return Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return ""


def _read_json(path: Path) -> dict[str, Any]:
    try:
        values = json.loads(_read_text(path) or "{}")
    except json.JSONDecodeError:
        return {}
    return values if isinstance(values, dict) else {}


def unreadable_keys_file() -> str | None:
    """What is wrong with a kaggle.json that exists but holds no username and key (the package ignores it, and
    ``credential_source`` then finds none), or None."""
    path = config_dir() / "kaggle.json"
    if not path.is_file():
        return None
    try:
        values = json.loads(_read_text(path) or "{}")
    except json.JSONDecodeError as exc:
        try:  # the line in the file: its text was stripped of the blank lines before it
            raw = path.read_text(encoding="utf-8")
            line = exc.lineno + raw[: len(raw) - len(raw.lstrip())].count("\n")
        except (OSError, UnicodeDecodeError):
            line = exc.lineno
        return f"{_display(path)} is not valid JSON ({exc.msg}, line {line})"
    if not (isinstance(values, dict) and values.get("username") and values.get("key")):
        return f"{_display(path)} holds no username and key"
    return None


def _notebook_token_file() -> Path | None:
    """Inside a Kaggle notebook the package reads a token from the file ``$KAGGLE_API_V1_TOKEN`` names."""
    if os.environ.get("KAGGLE_KERNEL_RUN_TYPE") is None or os.environ.get("KAGGLE_DATA_PROXY_URL") is None:
        return None
    path = os.environ.get("KAGGLE_API_V1_TOKEN")
    return Path(path) if path and _read_text(Path(path)) else None


def _token_files() -> list[Path]:
    return [_home() / ".kaggle" / "access_token", _home() / ".kaggle" / "access_token.txt"]


def _legacy_keys() -> tuple[dict[str, Any], str | None]:
    """kaggle.json's values with ``KAGGLE_USERNAME``/``KAGGLE_KEY`` on top (as the package merges them), and the
    source of a complete username + key pair (None without one)."""
    path = config_dir() / "kaggle.json"
    values = _read_json(path)
    for name in ("username", "key"):
        if os.environ.get(f"KAGGLE_{name.upper()}"):
            values[name] = os.environ[f"KAGGLE_{name.upper()}"]
    if not (values.get("username") and values.get("key")):
        return values, None
    if os.environ.get("KAGGLE_USERNAME") and os.environ.get("KAGGLE_KEY"):
        return values, "KAGGLE_USERNAME/KAGGLE_KEY environment variables"
    return values, _display(path)


def _oauth_file() -> Path:
    return _home() / ".kaggle" / "credentials.json"  # written by `kaggle auth login`


def credential_source() -> str | None:
    """Where the kaggle package will find credentials, in its own order, or None; never a credential value.

    Does not import ``kaggle``. A token that Kaggle rejects is still reported here: ``authenticate`` decides."""
    notebook = _notebook_token_file()
    if notebook is not None:
        return f"KAGGLE_API_V1_TOKEN file {_display(notebook)} (Kaggle notebook)"
    token = os.environ.get("KAGGLE_API_TOKEN")
    if token:
        if not Path(token).exists():  # the token itself, or a path to a file that is not there
            pathlike = os.sep in token or token.startswith("~") or token.endswith((".txt", ".json"))
            return "KAGGLE_API_TOKEN environment variable" + (" (as a path, it names no file)" if pathlike else "")
        if _read_text(Path(token)):
            return f"KAGGLE_API_TOKEN file {_display(Path(token))}"
        # an empty token file ends the package's token search; legacy keys are next
    else:
        for path in _token_files():
            if _read_text(path):
                return _display(path)
    _, legacy = _legacy_keys()
    if legacy is not None:
        return legacy
    if _read_json(_oauth_file()).get("refresh_token"):
        return f"{_display(_oauth_file())} (kaggle auth login)"
    return None


def _secrets() -> list[str]:
    """Every credential value present now (also without surrounding spaces and line breaks, and in each of its
    ``encoded_forms``), and the basic-auth form of the legacy pair, for ``_redact``."""
    values = [os.environ.get("KAGGLE_API_TOKEN", ""), os.environ.get("KAGGLE_KEY", "")]
    token = os.environ.get("KAGGLE_API_TOKEN")
    files = _token_files() + ([Path(token)] if token else [])
    if os.environ.get("KAGGLE_API_V1_TOKEN"):
        files.append(Path(os.environ["KAGGLE_API_V1_TOKEN"]))
    values += [_read_text(path) for path in files if path.is_file()]
    oauth = _read_json(_oauth_file())
    values += [str(oauth.get(name) or "") for name in ("refresh_token", "access_token")]
    legacy, _ = _legacy_keys()
    key, username = str(legacy.get("key") or ""), str(legacy.get("username") or "")
    values += [key, str(_read_json(config_dir() / "kaggle.json").get("key") or "")]
    if key:
        values.append(base64.b64encode(f"{username}:{key}".encode()).decode())
    forms = {form for value in values for v in (value, value.strip()) for form in encoded_forms(v)}
    return sorted((v for v in forms if len(v) >= 6), key=len, reverse=True)


def encoded_forms(value: str) -> tuple[str, ...]:
    """``value`` as messages can print it: as given, escaped (a str's repr, unicode_escape), percent-encoded (a URL's
    query or form body) and base64-encoded."""
    raw = value.encode()
    return (value, value.encode("unicode_escape").decode("ascii"), repr(value)[1:-1], quote(value, safe=""),
            quote_plus(value), base64.b64encode(raw).decode(), base64.urlsafe_b64encode(raw).decode(),
            base64.b64encode(raw).decode().rstrip("="))


def _redact(text: str) -> str:
    """``text`` with every credential value (also as an escaped string prints it) and any value of an
    Authorization header replaced by ``***``."""
    for secret in _secrets():
        text = text.replace(secret, "***")
    return re.sub(r"\b(Bearer|Basic)\s+[\w+/=\\-]+", r"\1 ***", text)


# ---------------------------------------------------------------- the kaggle package


def _bad_credentials(source: str) -> str:
    return (f"Kaggle rejected the credentials from {source} (wrong or expired): create a new token at "
            f"{SETTINGS_URL} (API -> Create New Token) and retry")


def _server_message(response: Any) -> str:
    """Kaggle's error message from a response, one line, redacted."""
    try:
        message = response.json().get("message", "")
    except Exception:  # not JSON, or a body that could not be read
        message = ""
    message = str(message or getattr(response, "reason", "") or "")
    return _redact(re.sub(r"\s+", " ", message)).strip()


def _http_error(exc: Any, slug: str, source: str, kind: str = "competition") -> str:
    """One sentence for an HTTP error from Kaggle about the ``kind`` (competition, dataset, notebook) ``slug``."""
    response = getattr(exc, "response", None)
    status = response.status_code if response is not None else None
    if status == 401:
        return _bad_credentials(source)
    if kind != "competition" and status in (403, 404):
        return (f"Kaggle {'refused access to' if status == 403 else 'does not know'} the {kind} '{slug}' (HTTP "
                f"{status}): is the owner in its id your Kaggle user name?")
    if status == 403:
        return (f"Kaggle refused access to '{slug}' (HTTP 403): accept the rules at "
                f"https://www.kaggle.com/competitions/{slug}/rules, then retry")
    if status == 404:
        return (f"unknown competition '{slug}' on Kaggle (HTTP 404): use the slug from the competition's URL, "
                f"https://www.kaggle.com/competitions/<slug>")
    if status == 429:
        return "Kaggle is rate-limiting requests (HTTP 429): wait a minute, then retry"
    detail = _server_message(response) if response is not None else _redact(str(exc))
    if status is not None and status >= 500:
        return f"Kaggle had a server error (HTTP {status}{': ' + detail if detail else ''}): retry later"
    return f"Kaggle refused the request for '{slug}' (HTTP {status}{': ' + detail if detail else ''})"


class _Captured(io.StringIO):
    """The kaggle package's prints, kept for the debug log; its retry notices ("Request failed: ... Will retry in
    12.0 seconds") and its warnings (a key file other users can read) are passed on to ``echo`` at once, redacted:
    an upload retrying for minutes says so."""

    def __init__(self, echo: Any):
        super().__init__()
        self.echo = echo

    said: set[str] = set()  # the warnings said in this process: the package repeats them at each authentication

    def write(self, text: str) -> int:
        warning = text.lstrip().startswith("Warning:")
        if warning and text.strip() in self.said:
            return super().write(text)
        if warning:
            self.said.add(text.strip())
        if "Will retry" in text or warning:
            self.echo.write(f"kaggle: {_redact(' '.join(text.split()))}\n")
            self.echo.flush()
        return super().write(text)


class _Retrying(logging.Handler):
    """urllib3's notices of the retries it makes itself (a file upload's: 'Retrying (Retry(total=9 ...)) after
    connection broken by ...'), passed on to ``echo``, redacted: the upload of a package retried for 6 minutes
    with nothing on the screen."""

    def __init__(self, echo: Any):
        super().__init__(logging.WARNING)
        self.echo = echo

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("Retrying"):
            self.echo.write(f"kaggle: {_redact(' '.join(message.split()))}\n")
            self.echo.flush()


@contextmanager
def _silenced(occasion: str) -> Iterator[None]:
    """The kaggle package's prints (stdout and stderr) go to the debug log, redacted; retry notices to stderr."""
    captured = _Captured(sys.stderr)
    retrying = _Retrying(sys.stderr)
    connections = logging.getLogger("urllib3.connectionpool")
    connections.addHandler(retrying)
    try:
        with redirect_stdout(captured), redirect_stderr(captured):
            yield
    finally:
        connections.removeHandler(retrying)
        output = _redact(captured.getvalue()).strip()
        if output:
            log.debug("kaggle package output%s: %s", occasion, output)


@contextmanager
def _translated(slug: str, source: str, kind: str = "competition") -> Iterator[None]:
    """Run kaggle package calls: their prints go to the debug log (redacted), their errors become KbertError."""
    import requests

    try:
        with _silenced(""):
            yield
    except SystemExit:  # authenticate() calls exit(1) when no credential works
        raise KbertError(_bad_credentials(source)) from None
    except ValueError as exc:  # the package's own checks; http.client's of a header value (a credential's)
        if "header" in str(exc) or isinstance(exc, UnicodeEncodeError):
            raise KbertError(f"the Kaggle credential from {source} holds a line break or a character a request "
                             "cannot carry (a byte-order mark, a curly quote): write it again as plain text") from None
        raise KbertError(f"the kaggle package refused the request for '{slug}': {_redact(str(exc))}") from None
    except requests.HTTPError as exc:
        raise KbertError(_http_error(exc, slug, source, kind)) from None
    except (requests.ConnectionError, requests.Timeout, ConnectionError, TimeoutError):
        raise KbertError(OFFLINE) from None
    except requests.RequestException as exc:
        raise KbertError(f"the request to Kaggle failed ({type(exc).__name__}): check your connection, "
                         "then retry") from None


def _import_kaggle() -> Any:
    """``KaggleApi``. Importing the package authenticates a throw-away client and may print: silenced."""
    try:
        with _silenced(" on import"):
            from kaggle.api.kaggle_api_extended import KaggleApi
    except ImportError as exc:
        raise KbertError(f"the kaggle package is not installed ({exc.name} is missing): "
                         "pip install 'kaggle>=2.0'") from None
    return KaggleApi


def _connect(slug: str) -> tuple[Any, str]:
    """An authenticated ``KaggleApi`` and the name of its credential source; KbertError when there is none. A
    credential variable's surrounding spaces and line breaks (a token pasted from a file with Windows line endings)
    are dropped: the package would send them in the request's header."""
    for name in ("KAGGLE_API_TOKEN", "KAGGLE_USERNAME", "KAGGLE_KEY"):
        if os.environ.get(name, "").strip() != os.environ.get(name, ""):
            os.environ[name] = os.environ[name].strip()
    source = credential_source()
    if source is None:
        damaged = unreadable_keys_file()
        raise KbertError(f"no Kaggle credentials found: {damaged}" if damaged else NO_CREDENTIALS)
    kaggle_api = _import_kaggle()
    api = kaggle_api()
    # The class fixed these when the package was imported; use today's environment.
    api.config_dir = str(config_dir())
    api.config = str(config_dir() / "kaggle.json")
    api.args = [arg for arg in api.args if arg not in ("--verbose", "-v")]  # verbose prints auth headers
    with _translated(slug, source):
        api.authenticate()
    log.debug("authenticated with Kaggle using %s", source)
    return api, source


# ---------------------------------------------------------------- download


def _visible_files(folder: Path) -> list[Path]:
    """Files under ``folder`` (recursively, sorted), leaving out hidden ones such as .DS_Store."""
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.rglob("*")
                  if p.is_file() and not any(part.startswith(".") for part in p.relative_to(folder).parts))


def _extract(downloads: Path, out: Path, slug: str, again: str) -> None:
    """Unzip every archive in ``downloads`` into ``out``; move any other file there as is."""
    out.mkdir()
    for path in sorted(downloads.iterdir()):
        if path.name.startswith(".") or path.name.endswith(".kaggle-partial"):  # the package's resume marker
            continue
        if zipfile.is_zipfile(path):
            try:
                with zipfile.ZipFile(path) as archive:
                    archive.extractall(out)  # drops absolute paths and '..' from member names
            except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError) as exc:
                raise KbertError(f"the download of '{slug}' is a damaged zip ({exc}): {again}") from None
        elif path.suffix == ".zip":
            raise KbertError(f"the download of '{slug}' is not a valid zip: {again}")
        else:
            os.replace(path, out / path.name)


def _unpacked_root(files: Path, slug: str) -> Path:
    """Where the unpacked files are: ``files``, or the one folder it holds when the archive put them all in one
    (``titanic/train.csv``); an archive with no file is refused."""
    if not _visible_files(files):
        raise KbertError(f"the download of '{slug}' holds no files: nothing was written")
    entries = [p for p in files.iterdir() if not p.name.startswith(".")]
    return entries[0] if len(entries) == 1 and entries[0].is_dir() else files


def _move_into(source: Path, folder: Path) -> list[Path]:
    """Move every entry of ``source`` into ``folder`` (one rename each, replacing what is there); the files
    moved, sorted."""
    folder.mkdir(parents=True, exist_ok=True)
    moved = [folder / p.relative_to(source) for p in _visible_files(source)]
    for entry in sorted(source.iterdir()):
        target = folder / entry.name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif entry.is_dir() and (target.is_file() or target.is_symlink()):
            target.unlink()
        os.replace(entry, target)
    return moved


def _fetched(api: Any, source: str, slug: str, staging: Path, folder: Path, again: str) -> list[Path]:
    """The competition's zip fetched into ``staging``, unpacked, and its files moved into ``folder``; ``again``:
    what to do after a damaged download (nothing of it was written)."""
    downloads = staging / "zip"
    with _translated(slug, source):
        try:
            api.competition_download_files(slug, path=str(downloads), force=True, quiet=True)
        except ValueError as exc:  # the package's size check after the transfer
            raise KbertError(f"the download of '{slug}' was incomplete ({_redact(str(exc))}): retry") from None
    if not downloads.is_dir():
        raise KbertError(f"Kaggle sent no files for '{slug}': {again}")
    _extract(downloads, staging / "files", slug, again)
    return _move_into(_unpacked_root(staging / "files", slug), folder)


def download_competition(slug: str, folder: Path, force: bool = False) -> list[Path]:
    """Download ``slug``'s files and unzip them into ``folder``; the extracted files, sorted.

    A folder that already holds files is left alone unless ``force``. The zip is fetched and unpacked in a temp
    folder beside ``folder``, then the files are moved into place; the temp folder and the zip are removed."""
    folder = Path(folder)
    existing = _visible_files(folder)
    if existing and not force:
        print(f"{folder} already holds {len(existing)} file(s): not downloading '{slug}' again "
              "(--force downloads it again)")
        return existing
    api, source = _connect(slug)
    try:
        with removed_on_refusal():  # an unknown competition leaves no new parent folder behind
            make_folders(folder.parent)
            staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".download", dir=folder.parent))
            try:
                files = _fetched(api, source, slug, staging, folder, "retry with --force" if force else "retry")
            finally:
                shutil.rmtree(staging, ignore_errors=True)
    except OSError as exc:
        raise KbertError(f"could not write the files of '{slug}' to {folder}: {exc.strerror or exc}") from None
    stale = [p.relative_to(folder) for p in existing if p not in files]
    if stale:  # --force: files of an earlier download (or the user's own) that this one does not hold
        print(f"{folder}: kept {len(stale)} file(s) that this download does not hold, from before: "
              f"{', '.join(map(str, stale[:6]))}{', ...' if len(stale) > 6 else ''}; remove them if they are stale")
    log.debug("downloaded %d file(s) of %s into %s", len(files), slug, folder)
    return files


# ---------------------------------------------------------------- submit, submissions, leaderboard


def submit_file(slug: str, path: Path, message: str) -> str:
    """Upload ``path`` and submit it to ``slug`` with ``message``; a one-line report with Kaggle's answer.

    The caller has validated the file against the sample submission."""
    path = Path(path)
    api, source = _connect(slug)
    try:
        with _translated(slug, source):
            response = api.competition_submit(str(path), message, slug, quiet=True)
    except KbertError as exc:
        if str(exc) != OFFLINE:
            raise
        raise KbertError(f"{OFFLINE}; if it failed after the upload, Kaggle may have recorded the submission: see "
                         f"kbert submissions {slug} before submitting again") from None
    reply = re.sub(r"\s+", " ", _redact(str(response.message or ""))).strip()
    if reply == api.COMPETITION_SUBMIT_UPLOAD_FAILED_MESSAGE:  # the upload itself failed; the package printed why
        raise KbertError(f"Kaggle did not take the upload of {path.name} (the connection or the server failed): "
                         "retry")
    return f"submitted {path.name} to {slug}: {reply or 'accepted'}; see kbert submissions {slug}"


def _cell(value: Any, width: int | None = None) -> str:
    """A table cell: one line, '' for None, dates as YYYY-MM-DD HH:MM, enums by lower-case name."""
    if value is None:
        return ""
    if isinstance(value, datetime):
        text = value.strftime("%Y-%m-%d %H:%M")
    elif hasattr(value, "name") and hasattr(value, "value"):  # an enum such as SubmissionStatus.COMPLETE
        text = str(value.name).lower()
    else:
        text = re.sub(r"\s+", " ", str(value)).strip()
    if width is not None and len(text) > width:
        text = text[: width - 3] + "..."
    return text


def _table(headers: list[str], rows: list[list[str]]) -> str:
    """Left-aligned columns two spaces apart."""
    widths = [max([len(h)] + [len(row[i]) for row in rows]) for i, h in enumerate(headers)]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip()
                     for line in [headers] + rows)


def submissions_table(slug: str) -> str:
    """Your latest submissions to ``slug`` (newest first): date, file, description, status, scores."""
    api, source = _connect(slug)
    with _translated(slug, source):
        submissions = [s for s in api.competition_submissions(slug) or [] if s is not None]
    if not submissions:
        return f"no submissions to {slug} yet"
    rows = [[_cell(s.date), _cell(s.file_name), _cell(s.description, DESCRIPTION_WIDTH), _cell(s.status),
             _cell(s.public_score), _cell(s.private_score)] for s in submissions]
    return _table(["date", "file", "description", "status", "public", "private"], rows)


def leaderboard_table(slug: str, top: int) -> str:
    """The first ``top`` rows of ``slug``'s public leaderboard: rank, team, score, date of the submission."""
    if top < 1:
        raise KbertError(f"--top must be at least 1, got {top}")
    api, source = _connect(slug)
    from kagglesdk.competitions.types.competition_api_service import ApiGetLeaderboardRequest

    entries: list[Any] = []
    page_token = ""
    with _translated(slug, source), api.build_kaggle_client() as client:
        while len(entries) < top:  # the server may send fewer rows per page than asked for
            request = ApiGetLeaderboardRequest()
            request.competition_name = slug
            request.page_size = min(top - len(entries), LEADERBOARD_PAGE)
            request.page_token = page_token
            response = client.competitions.competition_api_client.get_leaderboard(request)
            entries.extend(s for s in response.submissions or [] if s is not None)
            page_token = response.next_page_token
            if not page_token or not response.submissions:
                break
    if not entries:
        return f"the public leaderboard of {slug} is empty"
    rows = [[str(rank), _cell(e.team_name, DESCRIPTION_WIDTH), _cell(e.score), _cell(e.submission_date)]
            for rank, e in enumerate(entries[:top], start=1)]
    return _table(["rank", "team", "score", "date"], rows)


# ---------------------------------------------------------------- push a package (dataset and notebook)


def check_dataset_id(value: Any, what: str) -> None:
    """A Kaggle dataset id as Kaggle takes it: OWNER/SLUG, the slug 6-42 lowercase letters, digits and '-'."""
    owner, _, slug = str(value).partition("/")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]*", owner) or not re.fullmatch(r"[a-z0-9][a-z0-9-]{5,41}", slug):
        raise KbertError(f"{what} {value!r}: give it as OWNER/SLUG, the slug 6-42 lowercase letters, digits and '-' "
                         "(the notebook's is SLUG-predict)")


DATASET_FIELDS = {"title": str, "id": str, "licenses": list, "description": str, "subtitle": str, "keywords": list}
KERNEL_FIELDS = {"id": str, "title": str, "code_file": str, "language": str, "kernel_type": str, "is_private": bool,
                 "enable_gpu": bool, "enable_internet": bool, "dataset_sources": list, "competition_sources": list,
                 "kernel_sources": list}


def check_metadata(path: Path, fields: dict[str, type], required: tuple[str, ...]) -> dict:
    """A package's metadata file as kbert package writes it: each field of its type (a list of text; licenses of
    {name: text}), so that the kaggle package gets nothing it would raise a traceback on, after an upload."""
    from kbert.io import read_json

    values = read_json(path, required=required)
    for key, kind in fields.items():
        value = values.get(key)
        if key not in values and key not in required:
            continue
        fits = isinstance(value, kind) and (kind is not list or all(
            isinstance(item, dict) and isinstance(item.get("name"), str) if key == "licenses" else isinstance(item, str)
            for item in value))
        if not fits:
            shape = {str: "text", bool: "true or false", list: "a list of {name: text}" if key == "licenses" else
                     "a list of text"}[kind]
            raise KbertError(f"{path}: {key} must be {shape}, got {value!r}; run kbert package again")
    return values


def check_push_folders(dataset_dir: Path, notebook_dir: Path) -> tuple[str, str]:
    """The dataset and notebook folders of a package hold what kbert package wrote (edited since or not): their
    metadata's fields of the right types, ids Kaggle takes, the notebook reading the dataset, its code file inside
    its folder, and no hidden file or link (everything in the folders is uploaded). Their ids."""
    metadata = check_metadata(dataset_dir / "dataset-metadata.json", DATASET_FIELDS, ("id", "title", "licenses"))
    check_dataset_id(metadata["id"], f"{dataset_dir / 'dataset-metadata.json'}: id")
    notebook = check_metadata(notebook_dir / "kernel-metadata.json", KERNEL_FIELDS, ("id", "code_file"))
    kernel, code = notebook["id"], notebook_dir / notebook["code_file"]
    where = notebook_dir / "kernel-metadata.json"
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]*/[a-z0-9][a-z0-9-]*", kernel):
        raise KbertError(f"{where}: id {kernel!r}: give it as OWNER/SLUG, the slug lowercase letters, digits and '-'")
    if metadata["id"] not in notebook.get("dataset_sources", []):
        raise KbertError(f"{where}: dataset_sources does not name the dataset {metadata['id']}, which the notebook "
                         "installs kbert from; run kbert package again")
    if code.resolve().parent != notebook_dir.resolve() or not code.is_file():
        raise KbertError(f"{notebook_dir}: no {notebook['code_file']} in it, the code_file its kernel-metadata.json "
                         "names; run kbert package again")
    for folder in (dataset_dir, notebook_dir):
        stray = next((p for p in sorted(folder.rglob("*")) if p.is_symlink() or p.name.startswith(".")), None)
        if stray is not None:
            raise KbertError(f"{stray}: a {'link' if stray.is_symlink() else 'hidden file'} in the package, which "
                             "push would upload to Kaggle; kbert package writes none: remove it")
    return metadata["id"], kernel


def push_package(dataset_dir: Path, notebook_dir: Path, notes: str) -> list[str]:
    """Create the dataset of ``dataset_dir`` (its dataset-metadata.json's id), or add a version when it exists, wait
    until Kaggle has processed it, then push the notebook of ``notebook_dir``; one line per step."""
    import time

    import requests

    dataset, kernel = check_push_folders(Path(dataset_dir), Path(notebook_dir))  # before anything goes up
    api, source = _connect(dataset)
    lines = []
    with _translated(dataset, source, "dataset"):
        try:
            api.dataset_status(dataset)
            exists = True
        except requests.HTTPError as exc:
            if getattr(exc.response, "status_code", None) != 404:
                raise
            exists = False
        try:  # the package's own checks of the folder (title, slug, license) raise ValueError
            if exists:
                answer = api.dataset_create_version(str(dataset_dir), notes, quiet=True, dir_mode="zip")
            else:
                answer = api.dataset_create_new(str(dataset_dir), public=False, quiet=True, dir_mode="zip")
        except ValueError as exc:
            reason = _redact(str(exc))
            if reason.startswith("Upload unsuccessful"):  # the server took no file: nothing wrong with the folder
                raise KbertError(f"Kaggle did not take the upload of the dataset {dataset} ({reason}): retry "
                                 "kbert push") from None
            raise KbertError(f"{dataset_dir}: the kaggle package refused it: {reason}") from None
    if (answer.status or "").lower() != "ok":
        raise KbertError(f"Kaggle did not take the dataset {dataset}: {_redact(answer.error or answer.status)}")
    lines.append(f"dataset {dataset}: {'a new version' if exists else 'created'} ({answer.url})")
    waited = 0.0
    with _translated(dataset, source, "dataset"):
        status = api.dataset_status(dataset)
        while status != "ready" and waited < DATASET_WAIT_S:
            time.sleep(DATASET_POLL_S)
            waited += DATASET_POLL_S
            status = api.dataset_status(dataset)
    if status != "ready":
        raise KbertError(f"Kaggle has not processed the dataset {dataset} after {waited:.0f}s (status {status}); "
                         f"push the notebook later: kaggle kernels push -p {notebook_dir}")
    with _translated(kernel, source, "notebook"):
        try:
            pushed = api.kernels_push(str(notebook_dir))
        except ValueError as exc:
            raise KbertError(f"{notebook_dir}: the kaggle package refused it: {_redact(str(exc))}") from None
    invalid = [*pushed.invalid_dataset_sources, *pushed.invalid_competition_sources]
    if pushed.error or invalid:
        raise KbertError(f"Kaggle did not take the notebook {kernel}: "
                         f"{_redact(pushed.error) or 'unknown sources ' + ', '.join(invalid)}")
    with _translated(kernel, source, "notebook"):
        state = api.kernels_status(kernel)
    status = getattr(state.status, "name", str(state.status)).lower()
    lines.append(f"notebook {kernel}: version {pushed.version_number} ({pushed.url}), {status}; follow it with "
                 f"kaggle kernels status {kernel}")
    return lines
