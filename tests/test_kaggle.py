"""kbert download / submit / submissions / leaderboard against a fake Kaggle API on 127.0.0.1.

No test touches the internet: HOME and the kaggle config folder are temp folders, KAGGLE_* variables are cleared,
proxies point at an unroutable address, and socket connects and name lookups other than loopback are refused.

The seam: kagglesdk's KaggleHttpClient reads its endpoint from ``kagglesdk.kaggle_env._env_to_endpoint`` when a
client is built (``get_endpoint(env)``), not at import. KaggleApi always builds clients for ``KaggleEnv.PROD``
(it maps only --local/--staging/--admin, so KAGGLE_API_ENVIRONMENT=TEST is never used), so the tests point the
PROD entry at the fake server. Requests then arrive as ``POST /v1/<service>/<Method>`` with JSON bodies, exactly
as at https://api.kaggle.com/v1/...; the zip comes through a 302 redirect to a storage URL (GET), and a submission
is a StartSubmissionUpload call, a PUT of the file to the returned createUrl, then CreateSubmission.
"""

from __future__ import annotations

import base64
import contextlib
import importlib
import io
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import zipfile
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from kagglesdk import kaggle_env

from kbert.cli import main
from kbert.pipeline.config import BUNDLED_DATA_DIR
from kbert.ensembles.package import NOTEBOOK as NOTEBOOK_NAME
from kbert.pipeline.kaggle import credential_source

REPO = Path(__file__).resolve().parent.parent
TITANIC = BUNDLED_DATA_DIR / "titanic"
TITANIC_FILES = ("gender_submission.csv", "test.csv", "train.csv")

TOKEN = "KGAT_secret_token_9f8e7d"
USERNAME = "kbert-tester"
KEY = "legacykey_5a4b3c"
BASIC = base64.b64encode(f"{USERNAME}:{KEY}".encode()).decode()
SECRETS = (TOKEN, KEY, BASIC)

COMPETITION_SERVICE = "/v1/competitions.CompetitionApiService/"
INTROSPECT = "/v1/security.OAuthService/IntrospectToken"
UPLOAD_TOKEN = "blob-token-1"
SUBMITTED = "Successfully submitted to Titanic - Machine Learning from Disaster"
SUBMISSIONS = [
    {"ref": 2, "date": "2024-05-02T08:30:00.123Z", "fileName": "tuned.csv", "description": "tuned encoder",
     "status": "PENDING", "submittedBy": USERNAME},
    {"ref": 1, "date": "2024-05-01T10:15:00.000Z", "fileName": "submission.csv", "description": "first try",
     "status": "COMPLETE", "publicScore": "0.77511", "privateScore": "0.76000", "submittedBy": USERNAME},
]
LEADERBOARD = [{"teamId": 100 + i, "teamName": name, "submissionDate": f"2024-04-0{i + 1}T12:00:00Z",
                "score": score}
               for i, (name, score) in enumerate([("Alpha Team", "1.00000"), ("Beta Squad", "0.99761"),
                                                  ("Gamma Ray", "0.98325"), ("Delta Force", "0.97129"),
                                                  ("Epsilon", "0.96650"), ("Zeta", "0.95000")])]
FAILURES = {401: "Unauthenticated", 403: "You must accept this competition's rules before you'll be able to "
            "download files.", 404: "Competition not found", 500: "Internal error"}


# ---------------------------------------------------------------- a fake Kaggle API


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> dict:
        return json.loads(self.body or b"{}")


@dataclass
class FakeKaggle:
    """Answers the RPCs the sdk sends, with JSON shaped like the real API's; records every request."""

    url: str = ""
    seen: list[Seen] = field(default_factory=list)
    fail: dict[str, int] = field(default_factory=dict)  # RPC name or "PUT" -> HTTP status to answer with
    fail_message: str = ""  # overrides FAILURES' message
    zip_bytes: bytes = b""
    page_cap: int = 200  # most leaderboard rows per page
    blobs: dict[str, tuple[str, bytes]] = field(default_factory=dict)  # upload token -> (file name, bytes)
    datasets: dict[str, list[dict[str, bytes]]] = field(default_factory=dict)  # owner/slug -> versions' files
    kernels: dict[str, list[dict]] = field(default_factory=dict)  # owner/slug -> pushed versions (SaveKernel bodies)
    processing: int = 0  # GetDatasetStatus answers "BLOBS_RECEIVED" this many times before "READY"

    def rpcs(self) -> list[str]:
        return [s.path.rsplit("/", 1)[-1] for s in self.seen if s.path.startswith("/v1/")]

    def rpc(self, name: str) -> Seen:
        matches = [s for s in self.seen if s.path.endswith("/" + name)]
        assert len(matches) == 1, (name, self.rpcs())
        return matches[0]

    def answer(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        body = _read_body(handler)
        path = urlsplit(handler.path).path
        self.seen.append(Seen(method, path, dict(handler.headers), body))
        if method == "GET" and path == "/storage/titanic.zip":
            return _send(handler, 200, self.zip_bytes, "application/zip")
        if method == "PUT" and path == f"/upload/{UPLOAD_TOKEN}":
            return _send_json(handler, self.fail.get("PUT", 200), {})
        if method == "PUT" and path.startswith("/upload/") and path[8:] in self.blobs:
            self.blobs[path[8:]] = (self.blobs[path[8:]][0], body)
            return _send_json(handler, 200, {})
        if method != "POST" or not path.startswith("/v1/"):
            return _send_json(handler, 404, {"code": 404, "message": "no such route"})
        name, request = path.rsplit("/", 1)[-1], json.loads(body or b"{}")
        if name == "IntrospectToken":  # an unknown token is inactive, as with OAuth introspection
            return _send_json(handler, 200, {"active": request.get("token") == TOKEN, "username": USERNAME,
                                             "clientId": "kaggle-cli", "scope": "resources.admin:*"})
        if handler.headers.get("Authorization") not in (f"Bearer {TOKEN}", f"Basic {BASIC}"):
            return _send_json(handler, 401, {"code": 401, "message": FAILURES[401]})
        if name in self.fail:
            status = self.fail[name]
            return _send_json(handler, status, {"code": status, "message": self.fail_message or FAILURES[status]})
        if name in DATASET_AND_KERNEL_RPCS:
            return _send_json(handler, *self.datasets_and_kernels(name, request))
        if request.get("competitionName") != "titanic":
            return _send_json(handler, 404, {"code": 404, "message": FAILURES[404]})
        if name == "DownloadDataFiles":
            handler.send_response(302)
            handler.send_header("Location", f"{self.url}/storage/titanic.zip?X-Goog-Signature=0a1b2c")
            handler.send_header("Content-Length", "0")
            handler.end_headers()
            return None
        if name == "StartSubmissionUpload":
            return _send_json(handler, 200, {"token": UPLOAD_TOKEN, "createUrl": f"{self.url}/upload/{UPLOAD_TOKEN}"})
        if name == "CreateSubmission":
            return _send_json(handler, 200, {"message": SUBMITTED, "ref": 4242})
        if name == "ListSubmissions":
            return _send_json(handler, 200, {"submissions": SUBMISSIONS, "nextPageToken": ""})
        if name == "GetLeaderboard":
            start = int(request.get("pageToken") or 0)
            stop = start + min(int(request.get("pageSize") or 20), self.page_cap)
            more = stop < len(LEADERBOARD)
            return _send_json(handler, 200, {"submissions": LEADERBOARD[start:stop],
                                             "nextPageToken": str(stop) if more else ""})
        return _send_json(handler, 404, {"code": 404, "message": f"unknown method {name}"})


    def datasets_and_kernels(self, name: str, request: dict) -> tuple[int, dict]:
        """Datasets (status, blob uploads, create, new version) and notebooks (push, status), as the API answers."""
        if name == "GetDatasetStatus":
            ref = f"{request['ownerSlug']}/{request['datasetSlug']}"
            if ref not in self.datasets:
                return 404, {"code": 404, "message": "Dataset not found"}
            if self.processing:
                self.processing -= 1
                return 200, {"status": "BLOBS_RECEIVED"}
            return 200, {"status": "READY"}
        if name == "StartBlobUpload":
            token = f"blob-{len(self.blobs) + 1}"
            self.blobs[token] = (request["name"], b"")
            return 200, {"token": token, "createUrl": f"{self.url}/upload/{token}"}
        if name in ("CreateDataset", "CreateDatasetVersion"):
            ref = f"{request['ownerSlug']}/{request.get('slug') or request.get('datasetSlug')}"
            files = request["files"] if name == "CreateDataset" else request["body"]["files"]
            self.datasets.setdefault(ref, []).append(dict(self.blobs[f["token"]] for f in files))
            return 200, {"ref": ref, "url": f"https://www.kaggle.com/datasets/{ref}", "status": "ok"}
        if name == "SaveKernel":
            unknown = [ref for ref in request.get("datasetDataSources", []) if ref not in self.datasets]
            if unknown:
                return 200, {"invalidDatasetSources": unknown}
            versions = self.kernels.setdefault(request["slug"], [])
            versions.append(request)
            return 200, {"ref": f"/code/{request['slug']}", "url": f"https://www.kaggle.com/code/{request['slug']}",
                         "versionNumber": len(versions)}
        return 200, {"status": "COMPLETE"}  # GetKernelSessionStatus


DATASET_AND_KERNEL_RPCS = ("GetDatasetStatus", "StartBlobUpload", "CreateDataset", "CreateDatasetVersion",
                           "SaveKernel", "GetKernelSessionStatus")


def _read_body(handler: BaseHTTPRequestHandler) -> bytes:
    if handler.headers.get("Transfer-Encoding", "").lower() == "chunked":
        chunks = []
        while True:
            size = int(handler.rfile.readline().split(b";")[0], 16)
            chunk = handler.rfile.read(size)
            handler.rfile.readline()
            if size == 0:
                return b"".join(chunks)
            chunks.append(chunk)
    length = int(handler.headers.get("Content-Length") or 0)
    return handler.rfile.read(length) if length else b""


def _send(handler: BaseHTTPRequestHandler, status: int, body: bytes, content_type: str) -> None:
    handler.send_response(status)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def _send_json(handler: BaseHTTPRequestHandler, status: int, payload: dict) -> None:
    _send(handler, status, json.dumps(payload).encode(), "application/json")


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        self.server.kaggle.answer(self, "GET")

    def do_POST(self) -> None:  # noqa: N802
        self.server.kaggle.answer(self, "POST")

    def do_PUT(self) -> None:  # noqa: N802
        self.server.kaggle.answer(self, "PUT")

    def log_message(self, *args) -> None:
        pass


def titanic_zip() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name in TITANIC_FILES:
            archive.write(TITANIC / name, name)
    return buffer.getvalue()


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module", autouse=True)
def kaggle_imported(tmp_path_factory):
    """Import the kaggle package once, quietly and offline: its import authenticates a client (legacy keys here:
    no request, no print), so later tests see only the requests kbert makes."""
    home = tmp_path_factory.mktemp("import-home")
    with pytest.MonkeyPatch.context() as patch:
        for name in [n for n in os.environ if n.startswith("KAGGLE_")]:
            patch.delenv(name)
        patch.setenv("HOME", str(home))
        patch.setenv("KAGGLE_CONFIG_DIR", str(home / ".kaggle"))
        patch.setenv("KAGGLE_USERNAME", "importer")
        patch.setenv("KAGGLE_KEY", "import-time-key")
        with contextlib.redirect_stdout(io.StringIO()):
            importlib.import_module("kaggle.api.kaggle_api_extended")


def _is_loopback(host) -> bool:
    return str(host) in ("127.0.0.1", "::1", "localhost")


@pytest.fixture(autouse=True)
def offline(tmp_path, monkeypatch):
    """A temp HOME and config folder, no KAGGLE_* variables, and no way out of 127.0.0.1."""
    home = tmp_path / "home"
    home.mkdir()
    for name in [n for n in os.environ if n.startswith("KAGGLE_") or n in ("VERBOSE", "VERBOSE_OUTPUT")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("KAGGLE_CONFIG_DIR", str(home / ".kaggle"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    for name in ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "https_proxy", "http_proxy", "all_proxy"):
        monkeypatch.setenv(name, "http://192.0.2.1:9")  # TEST-NET-1: unroutable, and refused below anyway
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    monkeypatch.chdir(tmp_path)

    real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex
    real_getaddrinfo = socket.getaddrinfo

    def refuse(sock, address) -> None:
        if sock.family in (socket.AF_INET, socket.AF_INET6) and not _is_loopback(address[0]):
            raise ConnectionRefusedError(f"test: no connections outside 127.0.0.1 ({address[0]})")

    def connect(sock, address):
        refuse(sock, address)
        return real_connect(sock, address)

    def connect_ex(sock, address):
        refuse(sock, address)
        return real_connect_ex(sock, address)

    def getaddrinfo(host, *args, **kwargs):
        if not _is_loopback(host):
            raise socket.gaierror(socket.EAI_NONAME, f"test: no name lookups ({host})")
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return home


@pytest.fixture
def server(monkeypatch):
    """The fake Kaggle API in a thread; the sdk's PROD endpoint points at it."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    fake = FakeKaggle(url=f"http://127.0.0.1:{httpd.server_address[1]}", zip_bytes=titanic_zip())
    httpd.kaggle = fake
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    monkeypatch.setitem(kaggle_env._env_to_endpoint, kaggle_env.KaggleEnv.PROD, fake.url)
    yield fake
    httpd.shutdown()
    httpd.server_close()


@dataclass
class Result:
    code: int
    out: str
    err: str


@pytest.fixture
def credential_files() -> set[Path]:
    """Files a test wrote credentials into: the leak check does not read them."""
    return set()


@pytest.fixture
def login(offline, monkeypatch, credential_files):
    """``login(kind)`` puts the fake credentials where ``kind`` says."""
    home = offline

    def write(path: Path, text: str) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(0o600)
        credential_files.add(path)
        return path

    def put(kind: str, token: str = TOKEN) -> None:
        if kind == "token-env":
            monkeypatch.setenv("KAGGLE_API_TOKEN", token)
        elif kind == "token-env-path":
            monkeypatch.setenv("KAGGLE_API_TOKEN", str(write(home / "kaggle-token.txt", token + "\n")))
        elif kind in ("access_token", "access_token.txt"):
            write(home / ".kaggle" / kind, token + "\n")
        elif kind == "legacy-env":
            monkeypatch.setenv("KAGGLE_USERNAME", USERNAME)
            monkeypatch.setenv("KAGGLE_KEY", KEY)
        elif kind == "legacy-json":
            write(home / ".kaggle" / "kaggle.json", json.dumps({"username": USERNAME, "key": KEY}))
        elif kind == "oauth":
            write(home / ".kaggle" / "credentials.json", json.dumps({"refresh_token": TOKEN, "username": USERNAME}))
        else:
            assert kind == "none", kind

    return put


def assert_no_secrets(texts: list[str], root: Path, skip: set[Path]) -> None:
    for secret in SECRETS:
        for text in texts:
            assert secret not in text
        for path in root.rglob("*"):
            if path.is_file() and path not in skip:
                assert secret.encode() not in path.read_bytes(), path


@pytest.fixture
def kbert(capsys, caplog, tmp_path, credential_files):
    """Run the kbert CLI in-process; afterwards no credential may appear in its output, the logs or any file."""
    caplog.set_level(logging.DEBUG)
    outputs: list[str] = []

    def run(*argv) -> Result:
        code = main([str(a) for a in argv])
        captured = capsys.readouterr()
        outputs.extend([captured.out, captured.err, caplog.text])  # caplog.text: this phase's records so far
        return Result(code, captured.out, captured.err)

    yield run
    assert_no_secrets(outputs, tmp_path, credential_files)


def one_line_error(result: Result) -> str:
    assert result.code == 2, (result.out, result.err)
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kbert: error: "), result.err
    return lines[0]


def leftovers(folder: Path) -> list[str]:
    """Anything kbert download left beside ``folder`` (its temp folder) or a zip inside it."""
    beside = [p.name for p in folder.parent.iterdir() if p.name.startswith(f".{folder.name}.")]
    return beside + [p.name for p in folder.rglob("*.zip")] if folder.exists() else beside


# ---------------------------------------------------------------- download


@pytest.mark.parametrize("kind", ["token-env", "access_token"])
def test_download_unzips_the_files_into_the_folder(server, login, kbert, tmp_path, kind):
    login(kind)
    folder = tmp_path / "data" / "titanic"
    result = kbert("download", "titanic", "--data-dir", folder)
    assert result.code == 0, result.err
    assert sorted(p.name for p in folder.iterdir()) == sorted(TITANIC_FILES)
    for name in TITANIC_FILES:
        assert (folder / name).read_bytes() == (TITANIC / name).read_bytes()
    assert leftovers(folder) == []
    assert result.out.strip().splitlines() == [f"{folder}: 3 files ({', '.join(TITANIC_FILES)})",
                                               f"next: kbert run titanic --data-dir {folder}"]

    assert server.rpcs() == ["IntrospectToken", "DownloadDataFiles"]
    assert server.rpc("IntrospectToken").json() == {"token": TOKEN}
    request = server.rpc("DownloadDataFiles")
    assert request.path == COMPETITION_SERVICE + "DownloadDataFiles"
    assert request.json() == {"competitionName": "titanic"}
    assert request.headers["Authorization"] == f"Bearer {TOKEN}"
    assert [s.path for s in server.seen if s.method == "GET"] == ["/storage/titanic.zip"]

    again = kbert("download", "titanic", "--data-dir", folder)  # files there: nothing is fetched
    assert again.code == 0 and "already holds 3 file(s)" in again.out
    assert server.rpcs() == ["IntrospectToken", "DownloadDataFiles"]

    (folder / "train.csv").write_text("stale")
    forced = kbert("download", "titanic", "--data-dir", folder, "--force")
    assert forced.code == 0, forced.err
    assert server.rpcs().count("DownloadDataFiles") == 2
    assert (folder / "train.csv").read_bytes() == (TITANIC / "train.csv").read_bytes()
    assert leftovers(folder) == []


@pytest.mark.parametrize("kind", ["legacy-env", "legacy-json"])
def test_legacy_keys_use_basic_auth(server, login, kbert, tmp_path, kind):
    login(kind)
    folder = tmp_path / "titanic"
    result = kbert("download", "titanic", "--data-dir", folder)
    assert result.code == 0, result.err
    assert sorted(p.name for p in folder.iterdir()) == sorted(TITANIC_FILES)
    assert server.rpcs() == ["DownloadDataFiles"]  # no token to introspect
    assert server.rpc("DownloadDataFiles").headers["Authorization"] == f"Basic {BASIC}"


def test_download_before_accepting_the_rules(server, login, kbert, tmp_path):
    login("token-env")
    server.fail["DownloadDataFiles"] = 403
    folder = tmp_path / "titanic"
    error = one_line_error(kbert("download", "titanic", "--data-dir", folder))
    assert "accept the rules at https://www.kaggle.com/competitions/titanic/rules, then retry" in error
    assert not folder.exists() or not any(folder.iterdir())
    assert leftovers(folder) == []


def test_download_of_an_unknown_competition(server, login, kbert, tmp_path):
    login("token-env")
    error = one_line_error(kbert("download", "no-such-competition", "--data-dir", tmp_path / "x"))
    assert "unknown competition 'no-such-competition'" in error and "HTTP 404" in error
    assert server.rpc("DownloadDataFiles").json() == {"competitionName": "no-such-competition"}
    assert not (tmp_path / "x").exists()
    one_line_error(kbert("download", "no-such-competition", "--data-dir", tmp_path / "a" / "b" / "c"))
    assert not (tmp_path / "a").exists()  # (the parents made for it were left behind, empty)


def test_a_damaged_zip_leaves_no_files(server, login, kbert, tmp_path):
    login("legacy-env")
    server.zip_bytes = b"PK\x03\x04 this is not a zip archive"
    folder = tmp_path / "titanic"
    error = one_line_error(kbert("download", "titanic", "--data-dir", folder))
    assert ("not a valid zip" in error or "damaged zip" in error) and error.endswith(": retry")  # nothing written
    assert not folder.exists() or not any(folder.iterdir())
    assert leftovers(folder) == []
    assert one_line_error(kbert("download", "titanic", "--data-dir", folder, "--force")).endswith(
        ": retry with --force")


def zip_of(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, content in files.items():
            archive.writestr(name, content)
    return buffer.getvalue()


def test_an_archive_of_one_folder_is_unpacked_from_it_and_an_empty_one_is_refused(server, login, kbert, tmp_path):
    """Files zipped inside a folder land where `kbert run --data-dir` reads them; an archive with no file is no
    download; and --force names the files of the earlier download that the new one does not hold."""
    login("legacy-env")
    folder = tmp_path / "titanic"
    server.zip_bytes = zip_of({f"titanic/{name}": (TITANIC / name).read_bytes() for name in TITANIC_FILES})
    assert kbert("download", "titanic", "--data-dir", folder).code == 0
    assert sorted(p.name for p in folder.iterdir()) == sorted(TITANIC_FILES)
    server.zip_bytes = zip_of({"train.csv": b"a\n1\n", "test.csv": b"a\n2\n", "sample_submission.csv": b"a\n2\n"})
    forced = kbert("download", "titanic", "--data-dir", folder, "--force")
    assert forced.code == 0 and forced.out.splitlines()[0] == (
        f"{folder}: kept 1 file(s) that this download does not hold, from before: gender_submission.csv; remove "
        "them if they are stale")
    assert (folder / "train.csv").read_text() == "a\n1\n"
    server.zip_bytes = zip_of({})
    empty = tmp_path / "empty"
    assert one_line_error(kbert("download", "titanic", "--data-dir", empty)) == (
        "kbert: error: the download of 'titanic' holds no files: nothing was written")
    assert not empty.exists() and leftovers(empty) == []


@pytest.mark.parametrize("argv", [["download", "titanic"], ["submissions", "titanic"],
                                  ["leaderboard", "titanic"]])
def test_missing_credentials_say_where_to_put_a_token(server, login, kbert, argv):
    login("none")
    error = one_line_error(kbert(*argv))
    for hint in ("no Kaggle credentials", "https://www.kaggle.com/settings", "KAGGLE_API_TOKEN",
                 "~/.kaggle/access_token", "kaggle.json"):
        assert hint in error
    assert server.seen == []


def test_a_damaged_kaggle_json_is_named_not_passed_over(server, login, kbert):
    from kbert.pipeline.kaggle import config_dir

    login("none")
    config_dir().mkdir(parents=True, exist_ok=True)
    (config_dir() / "kaggle.json").write_text('{"username": "me", "key": "k",}')  # a trailing comma
    error = one_line_error(kbert("submissions", "titanic"))
    assert error.startswith("kbert: error: no Kaggle credentials found: ")
    assert "kaggle.json is not valid JSON (" in error
    assert server.seen == []
    (config_dir() / "kaggle.json").write_text('\n\n\n{"username": "me",\n "key": "k",}')
    assert "kaggle.json is not valid JSON (Expecting property name enclosed in double quotes, line 5)" in \
        one_line_error(kbert("submissions", "titanic"))  # the file's line (it said 2: the blank lines stripped)


def test_a_token_variable_naming_a_missing_file_says_so(server, login, kbert, tmp_path):
    login("token-env", token=str(tmp_path / "no-such-token.txt"))
    assert "rejected the credentials from KAGGLE_API_TOKEN environment variable (as a path, it names no file)" in \
        one_line_error(kbert("submissions", "titanic"))


def test_a_rejected_token_names_its_source_not_its_value(server, login, kbert, tmp_path):
    wrong = "KGAT_wrong_token_000000"
    login("token-env", token=wrong)
    result = kbert("download", "titanic", "--data-dir", tmp_path / "titanic")
    error = one_line_error(result)
    assert "rejected the credentials from KAGGLE_API_TOKEN environment variable" in error
    assert "https://www.kaggle.com/settings" in error
    assert wrong not in result.out + result.err
    assert server.rpcs() == ["IntrospectToken"]


def test_http_401_says_the_credentials_are_wrong_or_expired(server, login, kbert):
    login("legacy-json")
    server.fail["ListSubmissions"] = 401
    error = one_line_error(kbert("submissions", "titanic"))
    assert "rejected the credentials from ~/.kaggle/kaggle.json (wrong or expired)" in error


@pytest.mark.parametrize("kind", ["token-env", "legacy-env"])
def test_offline_is_reported_quickly(server, login, kbert, monkeypatch, tmp_path, kind):
    login(kind)
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    monkeypatch.setitem(kaggle_env._env_to_endpoint, kaggle_env.KaggleEnv.PROD, f"http://127.0.0.1:{closed}")
    started = time.perf_counter()
    error = one_line_error(kbert("download", "titanic", "--data-dir", tmp_path / "titanic"))
    assert time.perf_counter() - started < 5
    assert "could not reach Kaggle" in error and "check your connection" in error
    assert leftovers(tmp_path / "titanic") == []


# ---------------------------------------------------------------- submit


def test_submit_uploads_the_file_then_submits_it(server, login, kbert, tmp_path):
    login("token-env")
    submission = tmp_path / "submission.csv"
    shutil.copy(TITANIC / "gender_submission.csv", submission)
    result = kbert("submit", "titanic", submission, "-m", "first try", "--data-dir", TITANIC)
    assert result.code == 0, result.err
    assert f"submitted submission.csv to titanic: {SUBMITTED}; see kbert submissions titanic" in result.out

    assert server.rpcs() == ["IntrospectToken", "StartSubmissionUpload", "CreateSubmission"]
    start = server.rpc("StartSubmissionUpload").json()
    assert start["competitionName"] == "titanic" and start["fileName"] == "submission.csv"
    assert start["contentLength"] == submission.stat().st_size
    [upload] = [s for s in server.seen if s.method == "PUT"]
    assert upload.path == f"/upload/{UPLOAD_TOKEN}" and upload.body == submission.read_bytes()
    assert "Authorization" not in upload.headers  # a signed upload URL: credentials stay with the API
    assert server.rpc("CreateSubmission").json() == {"competitionName": "titanic", "blobFileTokens": UPLOAD_TOKEN,
                                                     "submissionDescription": "first try"}
    order = [s.path for s in server.seen]
    assert order.index(upload.path) < order.index(COMPETITION_SERVICE + "CreateSubmission")


def test_an_invalid_submission_is_never_sent(server, login, kbert, tmp_path):
    login("token-env")
    lines = (TITANIC / "gender_submission.csv").read_text().splitlines()
    submission = tmp_path / "short.csv"
    submission.write_text("\n".join(lines[:-1]) + "\n")  # one row short
    one_line_error(kbert("submit", "titanic", submission, "-m", "broken", "--data-dir", TITANIC))
    assert server.seen == []


def test_a_failed_upload_is_an_error(server, login, kbert, tmp_path):
    login("legacy-json")
    server.fail["PUT"] = 400
    submission = tmp_path / "submission.csv"
    shutil.copy(TITANIC / "gender_submission.csv", submission)
    error = one_line_error(kbert("submit", "titanic", submission, "-m", "x", "--data-dir", TITANIC))
    assert error == ("kbert: error: Kaggle did not take the upload of submission.csv (the connection or the server "
                     "failed): retry")
    assert "CreateSubmission" not in server.rpcs()


# ---------------------------------------------------------------- submissions and leaderboard


def test_submissions_table(server, login, kbert):
    login("token-env")
    result = kbert("submissions", "titanic")
    assert result.code == 0, result.err
    header, *rows = result.out.strip().splitlines()
    assert header.split() == ["date", "file", "description", "status", "public", "private"]
    assert len(rows) == 2
    assert rows[0].startswith("2024-05-02 08:30") and "tuned.csv" in rows[0] and "pending" in rows[0]
    for value in ("2024-05-01 10:15", "submission.csv", "first try", "complete", "0.77511", "0.76000"):
        assert value in rows[1]
    assert server.rpc("ListSubmissions").json()["competitionName"] == "titanic"


def test_leaderboard_shows_the_top_rows(server, login, kbert):
    login("legacy-env")
    result = kbert("leaderboard", "titanic", "--top", "2")
    assert result.code == 0, result.err
    header, *rows = result.out.strip().splitlines()
    assert header.split() == ["rank", "team", "score", "date"]
    assert len(rows) == 2
    assert rows[0].split()[:4] == ["1", "Alpha", "Team", "1.00000"] and "2024-04-01" in rows[0]
    assert rows[1].split()[:4] == ["2", "Beta", "Squad", "0.99761"]
    assert server.rpc("GetLeaderboard").json() == {"competitionName": "titanic", "pageSize": 2, "pageToken": ""}


def test_leaderboard_pages_until_it_has_the_top_rows(server, login, kbert):
    login("legacy-env")
    server.page_cap = 2
    result = kbert("leaderboard", "titanic", "--top", "5")
    assert result.code == 0, result.err
    rows = result.out.strip().splitlines()[1:]
    assert [r.split()[0] for r in rows] == ["1", "2", "3", "4", "5"]
    assert "Epsilon" in rows[4] and "Zeta" not in result.out
    assert server.rpcs() == ["GetLeaderboard"] * 3


def test_leaderboard_of_an_unknown_competition(server, login, kbert):
    login("token-env")
    assert "unknown competition 'nope'" in one_line_error(kbert("leaderboard", "nope"))


# ---------------------------------------------------------------- credentials never leak


def test_nothing_leaks_even_with_verbose_kaggle_and_an_echoing_server(server, login, kbert, tmp_path,
                                                                       monkeypatch, caplog):
    """The package's verbose mode prints request headers; kbert turns it off. Text from Kaggle is redacted."""
    from kaggle.api.kaggle_api_extended import KaggleApi

    monkeypatch.setattr(KaggleApi, "args", ["--verbose"])  # as if VERBOSE=1 when kaggle was imported
    login("legacy-env")
    assert kbert("leaderboard", "titanic", "--top", "3").code == 0
    server.fail["ListSubmissions"] = 400
    server.fail_message = f"bad request from {USERNAME} with key {KEY} (Basic {BASIC})"
    error = one_line_error(kbert("submissions", "titanic"))
    assert f"HTTP 400: bad request from {USERNAME} with key *** (Basic ***)" in error
    login("token-env")
    server.fail["CreateSubmission"] = 400
    server.fail_message = f"token {TOKEN} may not submit"
    submission = tmp_path / "submission.csv"
    shutil.copy(TITANIC / "gender_submission.csv", submission)
    error = one_line_error(kbert("submit", "titanic", submission, "-m", "x", "--data-dir", TITANIC))
    assert "HTTP 400: token *** may not submit" in error
    assert "Authorization" not in caplog.text  # the verbose request dumps were never printed
    # the kbert fixture's teardown checks stdout, stderr, the DEBUG logs of every logger and every file


# ---------------------------------------------------------------- credential_source and imports


@pytest.mark.parametrize("kinds, expected", [
    ([], None),
    (["token-env"], "KAGGLE_API_TOKEN environment variable"),
    (["token-env-path"], "KAGGLE_API_TOKEN file ~/kaggle-token.txt"),
    (["access_token"], "~/.kaggle/access_token"),
    (["access_token.txt"], "~/.kaggle/access_token.txt"),
    (["legacy-env"], "KAGGLE_USERNAME/KAGGLE_KEY environment variables"),
    (["legacy-json"], "~/.kaggle/kaggle.json"),
    (["oauth"], "~/.kaggle/credentials.json (kaggle auth login)"),
    (["legacy-json", "legacy-env", "token-env"], "KAGGLE_API_TOKEN environment variable"),
    (["legacy-env", "access_token"], "~/.kaggle/access_token"),
    (["legacy-json", "legacy-env"], "KAGGLE_USERNAME/KAGGLE_KEY environment variables"),
    (["oauth", "legacy-json"], "~/.kaggle/kaggle.json"),
])
def test_credential_source_follows_the_kaggle_order(login, kinds, expected):
    for kind in kinds:
        login(kind)
    source = credential_source()
    assert source == expected
    assert not any(secret in (source or "") for secret in SECRETS)


def test_credential_source_config_dir(offline, login, monkeypatch, tmp_path):
    config = tmp_path / "elsewhere"
    monkeypatch.setenv("KAGGLE_CONFIG_DIR", str(config))
    login("legacy-json")  # in ~/.kaggle, which KAGGLE_CONFIG_DIR now hides
    assert credential_source() is None
    config.mkdir()
    (config / "kaggle.json").write_text(json.dumps({"username": USERNAME, "key": KEY}))
    assert credential_source() == str(config / "kaggle.json")
    monkeypatch.setenv("KAGGLE_USERNAME", "someone-else")  # the package lays variables over the file
    assert credential_source() == str(config / "kaggle.json")
    (config / "kaggle.json").unlink()
    monkeypatch.delenv("KAGGLE_USERNAME")
    (offline / "empty-token").write_text("")
    monkeypatch.setenv("KAGGLE_API_TOKEN", str(offline / "empty-token"))  # an empty file ends the token search
    login("access_token")
    assert credential_source() is None


def test_the_cli_does_not_import_kaggle(tmp_path):
    code = ("import sys, kbert.cli as cli, pipeline.kaggle as kaggle_module\n"
            "cli.build_parser().parse_args(['download', 'titanic'])\n"
            "cli.build_parser().parse_args(['submit', 'titanic', 'x.csv', '-m', 'm'])\n"
            "kaggle_module.credential_source()\n"
            "loaded = sorted(m for m in sys.modules if m == 'kaggle' or m.startswith(('kaggle.', 'kagglesdk')))\n"
            "assert not loaded, loaded\n")
    env = {**os.environ, "HOME": str(tmp_path), "KAGGLE_API_TOKEN": TOKEN, "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr


@pytest.mark.slow
def test_first_import_of_kaggle_prints_nothing(server, tmp_path):
    """In a fresh process the package's import-time authenticate prints its help (a rejected token here):
    kbert prints only its own one-line error."""
    script = ("import sys\n"
              "from kagglesdk import kaggle_env\n"
              "kaggle_env._env_to_endpoint[kaggle_env.KaggleEnv.PROD] = sys.argv[1]\n"
              "from kbert.cli import main\n"
              "sys.exit(main(sys.argv[2:]))\n")
    home = tmp_path / "fresh-home"
    home.mkdir()
    env = {name: value for name, value in os.environ.items() if not name.startswith("KAGGLE_")}
    env.update(HOME=str(home), KAGGLE_CONFIG_DIR=str(home / ".kaggle"), KAGGLE_API_TOKEN="KGAT_not_valid_123",
               PYTHONPATH=str(REPO))
    result = subprocess.run([sys.executable, "-c", script, server.url, "submissions", "titanic"], cwd=tmp_path,
                            env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.startswith("kbert: error: Kaggle rejected the credentials from KAGGLE_API_TOKEN")
    assert len(result.stderr.strip().splitlines()) == 1
    assert "KGAT_not_valid_123" not in result.stdout + result.stderr


@pytest.mark.slow
def test_doctor_names_the_credential_source_never_its_value(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAGGLE_")}
    env.update(HOME=str(tmp_path), KAGGLE_CONFIG_DIR=str(tmp_path / "config"), KAGGLE_API_TOKEN=TOKEN)
    result = subprocess.run([sys.executable, "-m", "kbert.cli", "doctor"], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=120)
    assert "kaggle credentials: found (KAGGLE_API_TOKEN environment variable)" in result.stdout
    assert "free disk: " in result.stdout and "versions: kbert " in result.stdout and "kaggle 2." in result.stdout
    assert TOKEN not in result.stdout + result.stderr
    del env["KAGGLE_API_TOKEN"]
    result = subprocess.run([sys.executable, "-m", "kbert.cli", "doctor"], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=120)
    assert "kaggle credentials: none (kbert download/submit need a token)" in result.stdout
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "kaggle.json").write_text("{bad")  # a damaged file is named, not passed over as none
    result = subprocess.run([sys.executable, "-m", "kbert.cli", "doctor"], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=120)
    assert "kaggle credentials: none (~/config/kaggle.json is not valid JSON (" in result.stdout  # HOME is tmp_path


# ---------------------------------------------------------------- push a package


def hand_made_package(root: Path, dataset: str) -> Path:
    """A folder laid out as kbert package writes one, with a stand-in wheel (the real build needs pip and the
    index: tests/test_package.py)."""
    from kbert.ensembles.package import NOTEBOOK, dataset_metadata, inference_notebook, kernel_metadata

    package = root / "package"
    (package / "dataset" / "wheels").mkdir(parents=True)
    (package / "dataset" / "wheels" / "kbert-0.1.0-py3-none-any.whl").write_bytes(b"a wheel")
    (package / "dataset" / "ensemble.json").write_text("{}")
    (package / "dataset" / "dataset-metadata.json").write_text(json.dumps(dataset_metadata(dataset, "kbert titanic")))
    (package / "notebook").mkdir()
    (package / "notebook" / "kernel-metadata.json").write_text(json.dumps(kernel_metadata(dataset, "titanic", False)))
    (package / "notebook" / NOTEBOOK).write_text(json.dumps(inference_notebook(
        dataset.split("/")[1], "titanic", "ensemble.json", ["numpy"], ["kbert-0.1.0-py3-none-any.whl"], True)))
    return package


@pytest.fixture
def uploads_here(tmp_path, monkeypatch):
    """The kaggle client keeps resumable-upload state under tempfile.gettempdir(): a folder of this test's."""
    import tempfile

    folder = tmp_path / "uploads-tmp"
    folder.mkdir(mode=0o700)
    monkeypatch.setattr(tempfile, "tempdir", str(folder))


def test_push_creates_the_dataset_then_versions_it_and_pushes_the_notebook(server, login, kbert, tmp_path,
                                                                         uploads_here, monkeypatch):
    from kbert.pipeline import kaggle

    monkeypatch.setattr(kaggle, "DATASET_POLL_S", 0.01)
    login("token-env")
    ref = f"{USERNAME}/kbert-titanic-blend"
    package = hand_made_package(tmp_path, ref)
    server.processing = 2  # Kaggle is still processing the new dataset twice: push waits
    result = kbert("push", package)
    assert result.code == 0, result.err
    assert result.out.splitlines() == [
        f"dataset {ref}: created (https://www.kaggle.com/datasets/{ref})",
        f"notebook {ref}-predict: version 1 (https://www.kaggle.com/code/{ref}-predict), complete; follow it with "
        f"kaggle kernels status {ref}-predict"]
    assert server.rpc("GetKernelSessionStatus").json() == {"userName": USERNAME,
                                                           "kernelSlug": "kbert-titanic-blend-predict"}
    [files] = server.datasets[ref]
    assert set(files) == {"wheels.zip", "ensemble.json"}  # a sub-folder travels as a zip that Kaggle unpacks
    with zipfile.ZipFile(io.BytesIO(files["wheels.zip"])) as archive:
        assert archive.read("kbert-0.1.0-py3-none-any.whl") == b"a wheel"
    assert server.rpc("CreateDataset").json()["isPrivate"] is True
    [pushed] = server.kernels[f"{ref}-predict"]
    assert pushed["enableInternet"] is False and pushed["datasetDataSources"] == [ref]
    assert pushed["competitionDataSources"] == ["titanic"] and pushed["kernelType"] == "notebook"
    assert "--no-index" in json.loads(pushed["text"])["cells"][1]["source"]

    server.seen.clear()
    again = kbert("push", package, "--notes", "second")
    assert again.code == 0, again.err
    assert again.out.startswith(f"dataset {ref}: a new version")
    assert len(server.datasets[ref]) == 2 and len(server.kernels[f"{ref}-predict"]) == 2
    assert server.rpc("CreateDatasetVersion").json()["body"]["versionNotes"] == "second"


def test_push_failures_are_one_line(server, login, kbert, tmp_path, uploads_here):
    login("token-env")
    package = hand_made_package(tmp_path, f"{USERNAME}/kbert-titanic-other")
    server.fail["CreateDataset"] = 403
    assert "Kaggle refused access to the dataset 'kbert-tester/kbert-titanic-other' (HTTP 403)" in one_line_error(
        kbert("push", package))
    del server.fail["CreateDataset"]
    kernel = json.loads((package / "notebook" / "kernel-metadata.json").read_text())
    kernel["dataset_sources"] = [*kernel["dataset_sources"], "someone/not-there"]
    (package / "notebook" / "kernel-metadata.json").write_text(json.dumps(kernel))
    assert "did not take the notebook kbert-tester/kbert-titanic-other-predict: unknown sources someone/not-there" \
        in one_line_error(kbert("push", package))
    assert "no dataset/dataset-metadata.json" in one_line_error(kbert("push", tmp_path))
    # The notebook is checked before the dataset goes up (a dataset version uploaded for a push that then failed)
    server.seen.clear()
    (package / "notebook" / NOTEBOOK_NAME).unlink()
    assert one_line_error(kbert("push", package)) == (
        f"kbert: error: {package / 'notebook'}: no {NOTEBOOK_NAME} in it, the code_file its kernel-metadata.json "
        "names; run kbert package again")
    assert server.seen == []


@pytest.mark.parametrize("ending", ["\r\n", "\n", " "])
def test_a_token_variable_with_a_line_break_works_and_never_shows(server, login, kbert, ending):
    """A token pasted from a file with Windows line endings went into the request header: http.client's
    ValueError, a traceback holding the token."""
    login("token-env", token=TOKEN + ending)
    result = kbert("submissions", "titanic")
    assert result.code == 0, result.err


def test_push_of_an_edited_dataset_id_is_refused_before_any_request(server, login, kbert, tmp_path, uploads_here):
    """push read the id kbert package had checked, edited since: 'noslash' raised IndexError in the kaggle package
    after its first request, a number AttributeError."""
    login("token-env")
    package = hand_made_package(tmp_path, f"{USERNAME}/kbert-titanic-edited")
    metadata = package / "dataset" / "dataset-metadata.json"
    made = json.loads(metadata.read_text())
    for edited in ("noslash", f"{USERNAME}/", f"{USERNAME}/Bad Slug!"):
        metadata.write_text(json.dumps({**made, "id": edited}))
        server.seen.clear()
        assert one_line_error(kbert("push", package)) == (
            f"kbert: error: {metadata}: id {edited!r}: give it as OWNER/SLUG, the slug 6-42 lowercase letters, "
            "digits and '-' (the notebook's is SLUG-predict)")
        assert server.seen == []
    # every field of either metadata file of the type the kaggle package reads (a title of 5, a license of 5, a
    # source of 5 raised tracebacks, some after the dataset was uploaded), the notebook's code inside its folder and
    # reading the dataset, and nothing hidden or linked in the folders (all of it is uploaded)
    kernel_path = package / "notebook" / "kernel-metadata.json"
    kernel = json.loads(kernel_path.read_text())
    outside = tmp_path / "outside.py"
    outside.write_text("print('elsewhere')")
    for path, edit, says in (
            (metadata, {"id": 123}, "id must be text, got 123"),
            (metadata, {"title": 5}, "title must be text, got 5"),
            (metadata, {"licenses": [{"name": 5}]}, "licenses must be a list of {name: text}, got [{'name': 5}]"),
            (metadata, {"keywords": "abc"}, "keywords must be a list of text, got 'abc'"),
            (kernel_path, {"dataset_sources": [5]}, "dataset_sources must be a list of text, got [5]"),
            (kernel_path, {"competition_sources": "titanic"}, "competition_sources must be a list of text"),
            (kernel_path, {"enable_internet": "no"}, "enable_internet must be true or false, got 'no'"),
            (kernel_path, {"dataset_sources": ["someone/else-entirely"]},
             f"dataset_sources does not name the dataset {USERNAME}/kbert-titanic-edited"),
            (kernel_path, {"code_file": str(outside)}, f"no {outside} in it, the code_file")):
        original = {metadata: made, kernel_path: kernel}
        path.write_text(json.dumps({**original[path], **edit}))
        server.seen.clear()
        assert says in one_line_error(kbert("push", package))
        assert server.seen == []
        path.write_text(json.dumps(original[path]))
    (package / "dataset" / ".env").write_text("SECRET=1")
    assert one_line_error(kbert("push", package)) == (
        f"kbert: error: {package / 'dataset' / '.env'}: a hidden file in the package, which push would upload to "
        "Kaggle; kbert package writes none: remove it")


def test_the_packages_retry_notices_are_said_as_they_happen(login, capsys):
    """An upload the kaggle package retries with backoff for minutes said nothing until it gave up: its notices
    went to the debug log only. They are passed on, redacted."""
    from kbert.pipeline.kaggle import _silenced

    login("token-env")
    with _silenced(""):
        print(f"Request failed: 503 for Bearer {TOKEN}. Will retry in 12.0 seconds", file=sys.stderr)
        print("other chatter")
    err = capsys.readouterr().err
    assert err == "kaggle: Request failed: 503 for Bearer ***. Will retry in 12.0 seconds\n"


def test_a_submit_that_lost_the_connection_says_to_look_before_submitting_again(server, login, kbert, tmp_path,
                                                                                monkeypatch):
    """The connection may fail after Kaggle recorded the submission: 'retry' could submit twice. An empty
    description is refused before anything is sent."""
    login("token-env")
    submission = tmp_path / "submission.csv"
    shutil.copy(TITANIC / "gender_submission.csv", submission)
    for empty in (" ", "\u200b"):
        assert one_line_error(kbert("submit", "titanic", submission, "-m", empty, "--data-dir", TITANIC)) == (
            "kbert: error: -m/--message is empty: give the submission a description (Kaggle lists it beside the "
            "score)")
    assert server.seen == []
    import requests
    from kaggle.api.kaggle_api_extended import KaggleApi

    def dropped(self, *args, **kwargs):  # the connection fails once the request is on its way
        raise requests.ConnectionError("Connection aborted")

    monkeypatch.setattr(KaggleApi, "competition_submit", dropped)
    error = one_line_error(kbert("submit", "titanic", submission, "-m", "again", "--data-dir", TITANIC))
    assert error.endswith("if it failed after the upload, Kaggle may have recorded the submission: see kbert "
                          "submissions titanic before submitting again")


def test_the_packages_warnings_are_said(capsys):
    """The package's warning of a key file other users can read went to the debug log only."""
    from kbert.pipeline.kaggle import _silenced

    with _silenced(""):
        print("Warning: Your Kaggle API key is readable by other users on this system! To fix this, you can run "
              "'chmod 600 /h/.kaggle/kaggle.json'")
    assert capsys.readouterr().err.startswith("kaggle: Warning: Your Kaggle API key is readable by other users")


def test_a_token_with_a_line_break_inside_says_so_and_never_shows(server, login, kbert):
    """A line break inside the token reached http.client's header check, whose message printed the header escaped
    ('Bearer KGAT_secret\\\\ntoken'): redaction missed it."""
    inside = "KGAT_secret\ntoken_9f8e7d"
    login("token-env", token=inside)
    result = kbert("submissions", "titanic")
    assert one_line_error(result) == (
        "kbert: error: the Kaggle credential from KAGGLE_API_TOKEN environment variable holds a line break or a "
        "character a request cannot carry (a byte-order mark, a curly quote): write it again as plain text")
    from kbert.pipeline.kaggle import _redact

    escaped = inside.encode("unicode_escape").decode()
    assert _redact(f"Invalid header value b'Bearer {escaped}'") == "Invalid header value b'Bearer ***'"
    assert "secret" not in _redact(repr(inside)) and "token_9f8e7d" not in _redact(repr(inside))


def test_a_credential_percent_or_base64_encoded_never_shows(login):
    """A token in a URL's query or a form body is percent-encoded, in a header or a dump base64-encoded: redaction
    matched it as given and escaped only, so a message quoting a request echoed it."""
    import base64
    from urllib.parse import quote, quote_plus

    from kbert.pipeline.kaggle import _redact

    token = "KGAT_a+b/c=d e&f"
    login("token-env", token=token)
    for form in (quote(token, safe=""), quote_plus(token), base64.b64encode(token.encode()).decode(),
                 base64.urlsafe_b64encode(token.encode()).decode()):
        assert form != token and _redact(f"GET /api/v1/x?token={form} failed") == "GET /api/v1/x?token=*** failed"


def test_retries_the_connection_layer_makes_are_said_and_a_warning_once(login, capsys):
    """A file upload retried inside urllib3 for 6 minutes with nothing on the screen; the package's warning of a
    readable key file was said twice."""
    from kbert.pipeline.kaggle import _silenced

    login("token-env")
    with _silenced(""):
        logging.getLogger("urllib3.connectionpool").warning(
            "Retrying (Retry(total=9, connect=None)) after connection broken by 'ProtocolError' for Bearer %s: "
            "/upload/blob", TOKEN)
        for _ in range(2):
            print("Warning: Your Kaggle API key is readable by other users on this system!")
    assert capsys.readouterr().err.splitlines() == [
        "kaggle: Retrying (Retry(total=9, connect=None)) after connection broken by 'ProtocolError' for Bearer ***: "
        "/upload/blob", "kaggle: Warning: Your Kaggle API key is readable by other users on this system!"]
