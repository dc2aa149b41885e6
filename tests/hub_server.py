"""A small Hugging Face Hub on 127.0.0.1 for tests: the endpoints huggingface_hub 2.x calls to download a model.

``snapshot_download`` asks ``GET /api/models/{repo}/revision/{revision}`` for the commit (``sha``) and
``GET /api/models/{repo}/tree/{commit}?recursive=...`` for the file listing (cached per commit), then each file
with ``hf_hub_download``: ``HEAD /{repo}/resolve/{commit}/{file}`` for its metadata (``X-Repo-Commit``, ``ETag``,
``Content-Length``) and a ``GET`` of the same URL. As on the real Hub, weights (LFS files: ``.safetensors``,
``.bin``) are not served there: the resolve URL answers ``302`` to a CDN on another host (``localhost`` instead of
``127.0.0.1``, same port) with ``X-Linked-Etag`` (the sha256) and ``X-Linked-Size``, which the client takes as the
file's metadata before it downloads from the CDN; a resumed download sends ``Range: bytes=N-`` and gets ``206``.
No ``X-Xet-*`` header is ever sent, so huggingface_hub downloads over plain HTTP (hf_xet is never used). Errors
carry the ``X-Error-Code`` huggingface_hub maps to its exceptions (RepoNotFound, RevisionNotFound, EntryNotFound,
GatedRepo); anything else (``/api/agent-harnesses``, which huggingface_hub asks for once) is a plain 404.

``cut(filename)`` makes every download of that file stop halfway: ``"drop"`` announces the full length, sends half
and closes the connection (huggingface_hub retries five times, a second apart, and gives up);
``"short"`` announces and sends only half of what HEAD said (its size check fails). ``heal()`` undoes it, and
``stop()`` shuts the server down (the Hub unreachable).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".bin")


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Commit:
    sha: str
    files: dict[str, bytes]


@dataclass
class Repo:
    commits: dict[str, Commit] = field(default_factory=dict)  # by sha
    refs: dict[str, str] = field(default_factory=dict)  # branch or tag -> sha
    gated: bool = False

    def resolve(self, revision: str) -> Commit | None:
        sha = self.refs.get(revision, revision)
        return self.commits.get(sha)


class FakeHub:
    """The repos, the switches and a log of the requests (method, path) of a running fake Hub."""

    def __init__(self, port: int):
        self.url = f"http://127.0.0.1:{port}"
        self.cdn = f"http://localhost:{port}"  # another host: the client stops at the redirect, as with the real CDN
        self.repos: dict[str, Repo] = {}
        self.blobs: dict[str, bytes] = {}  # sha256 -> content, for the CDN
        self.cuts: dict[str, str] = {}  # file name -> "drop" | "short"
        self.requests: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def add(self, repo_id: str, files: dict[str, bytes | str | Path], refs: tuple[str, ...] = ("main",),
            gated: bool = False) -> str:
        """A commit of ``files`` (name -> bytes, text or a file to read) that ``refs`` (branches, tags) point at;
        returns its sha."""
        contents = {name: (Path(value).read_bytes() if isinstance(value, Path) else
                           value.encode() if isinstance(value, str) else bytes(value)) for name, value in files.items()}
        digest = hashlib.sha1(repo_id.encode())
        for name in sorted(contents):
            digest.update(name.encode() + b"\0" + hashlib.sha256(contents[name]).digest())
        repo = self.repos.setdefault(repo_id, Repo())
        digest.update(str(len(repo.commits)).encode())
        sha = digest.hexdigest()
        repo.commits[sha] = Commit(sha, contents)
        repo.refs.update({ref: sha for ref in refs})
        repo.gated = repo.gated or gated
        for data in contents.values():
            self.blobs[hashlib.sha256(data).hexdigest()] = data
        return sha

    def cut(self, filename: str, mode: str = "drop") -> None:
        assert mode in ("drop", "short")
        self.cuts[filename] = mode

    def heal(self) -> None:
        self.cuts.clear()

    def stop(self) -> None:
        """Shut the server down (a later request is refused); ``hub_server`` sets it."""

    def downloads(self) -> list[str]:
        """The paths of the file GETs so far (resolve URLs and CDN blobs)."""
        return [path for method, path in self.requests if method == "GET" and not path.startswith("/api/")]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: ThreadingHTTPServer

    def log_message(self, *args) -> None:  # quiet
        pass

    @property
    def hub(self) -> FakeHub:
        return self.server.hub  # type: ignore[attr-defined]

    def do_HEAD(self) -> None:
        self.route(body=False)

    def do_GET(self) -> None:
        self.route(body=True)

    # ------------------------------------------------------------------ routing

    def route(self, body: bool) -> None:
        path = unquote(urlsplit(self.path).path)
        with self.hub.lock:
            self.hub.requests.append((self.command, path))
        if match := re.fullmatch(r"/api/models/([^/]+/[^/]+)/revision/(.+)", path):
            return self.revision_info(match[1], match[2], body)
        if match := re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/([^/]+)(?:/(.*))?", path):
            return self.tree(match[1], match[2], match[3] or "", body)
        if match := re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path):
            return self.resolve(match[1], match[2], match[3], body)
        if match := re.fullmatch(r"/cdn/([0-9a-f]{64})/(.+)", path):
            return self.cdn(match[1], match[2], body)
        self.send_json(404, {"error": "not found"}, body)

    def find(self, repo_id: str, revision: str, body: bool) -> Commit | None:
        """The commit ``revision`` names in ``repo_id``, or None after answering the error the Hub gives."""
        repo = self.hub.repos.get(repo_id)
        if repo is None:
            self.send_json(404, {"error": "Repository not found"}, body, {"X-Error-Code": "RepoNotFound"})
            return None
        if repo.gated:
            self.send_json(401, {"error": "Access to this model is restricted"}, body, {"X-Error-Code": "GatedRepo"})
            return None
        commit = repo.resolve(revision)
        if commit is None:
            self.send_json(404, {"error": f"Invalid rev id: {revision}"}, body,
                           {"X-Error-Code": "RevisionNotFound"})
        return commit

    def revision_info(self, repo_id: str, revision: str, body: bool) -> None:
        commit = self.find(repo_id, revision, body)
        if commit is not None:
            self.send_json(200, {"_id": repo_id, "id": repo_id, "modelId": repo_id, "sha": commit.sha,
                                 "private": False, "gated": False, "disabled": False, "tags": [],
                                 "siblings": [{"rfilename": name} for name in sorted(commit.files)]}, body)

    def tree(self, repo_id: str, revision: str, folder: str, body: bool) -> None:
        commit = self.find(repo_id, revision, body)
        if commit is None:
            return
        entries, folders = [], set()
        for name in sorted(commit.files):
            if folder and not name.startswith(folder.rstrip("/") + "/"):
                continue
            data = commit.files[name]
            parts = name.split("/")
            folders.update("/".join(parts[:i]) for i in range(1, len(parts)))
            entry = {"type": "file", "path": name, "size": len(data), "oid": git_blob_id(data)}
            if name.endswith(LFS_SUFFIXES):
                entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
            entries.append(entry)
        entries += [{"type": "directory", "path": f, "size": 0, "oid": git_blob_id(f.encode())} for f in folders]
        self.send_json(200, entries, body)

    def resolve(self, repo_id: str, revision: str, filename: str, body: bool) -> None:
        commit = self.find(repo_id, revision, body)
        if commit is None:
            return
        headers = {"X-Repo-Commit": commit.sha}
        data = commit.files.get(filename)
        if data is None:
            self.send_json(404, {"error": "Entry not found"}, body, {**headers, "X-Error-Code": "EntryNotFound"})
            return
        if filename.endswith(LFS_SUFFIXES):  # LFS: the Hub redirects to its CDN and names the blob in headers
            sha256 = hashlib.sha256(data).hexdigest()
            self.send_response(302)
            for name, value in {**headers, "Location": f"{self.hub.cdn}/cdn/{sha256}/{filename}",
                                "ETag": f'"{git_blob_id(data)}"', "X-Linked-Etag": f'"{sha256}"',
                                "X-Linked-Size": str(len(data)), "Content-Length": "0"}.items():
                self.send_header(name, value)
            self.end_headers()
            return
        self.send_file(data, filename, body, {**headers, "ETag": f'"{git_blob_id(data)}"'})

    def cdn(self, sha256: str, filename: str, body: bool) -> None:
        data = self.hub.blobs.get(sha256)
        if data is None:
            self.send_json(404, {"error": "no such blob"}, body)
            return
        self.send_file(data, filename, body, {"ETag": f'"{sha256}"'})

    # ------------------------------------------------------------------ answers

    def send_file(self, data: bytes, filename: str, body: bool, headers: dict[str, str]) -> None:
        """The file, or from ``Range: bytes=N-`` on (206); a cut file stops halfway."""
        start = 0
        if match := re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range", "")):
            start = min(int(match[1]), len(data))
        cut = self.hub.cuts.get(filename) if body else None
        half = len(data) // 2
        announced = len(data) - start if cut != "short" else max(half - start, 0)
        sent = data[start:] if cut is None else data[start:max(half, start)]
        self.send_response(206 if start else 200)
        for name, value in {**headers, "Content-Type": "application/octet-stream", "Accept-Ranges": "bytes",
                            "Content-Length": str(announced)}.items():
            self.send_header(name, value)
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        if cut == "drop":
            self.send_header("Connection", "close")
        self.end_headers()
        if body:
            self.wfile.write(sent)
            self.wfile.flush()
        if cut == "drop":
            self.close_connection = True

    def send_json(self, status: int, value, body: bool, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(value).encode()
        self.send_response(status)
        for name, header in {**(headers or {}), "Content-Type": "application/json",
                             "Content-Length": str(len(data))}.items():
            self.send_header(name, header)
        self.end_headers()
        if body:
            self.wfile.write(data)


@contextmanager
def hub_server() -> Iterator[FakeHub]:
    """A running fake Hub; point huggingface_hub at it with ``HF_ENDPOINT=hub.url`` (read at its import)."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    hub = FakeHub(httpd.server_address[1])
    httpd.hub = hub  # type: ignore[attr-defined]
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()

    def stop() -> None:
        if thread.is_alive():
            httpd.shutdown()
            httpd.server_close()

    hub.stop = stop  # type: ignore[method-assign]
    try:
        yield hub
    finally:
        stop()
