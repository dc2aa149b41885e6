"""A throwaway PostgreSQL server for the tests: ``initdb`` in a temporary folder, ``pg_ctl`` on 127.0.0.1 and a
free port, removed afterwards. Run as the unprivileged ``postgres`` user when the tests run as root (PostgreSQL
refuses root). ``.ci/run`` installs the server from the system's packages; without it the tests that need one
are skipped with the reason.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path


def server_bin() -> Path | None:
    """The folder with initdb and pg_ctl (Debian keeps them out of PATH), or None."""
    found = shutil.which("initdb")
    if found:
        return Path(found).resolve().parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    return Path(versions[-1]).parent if versions else None


def missing_reason() -> str | None:
    """Why no server can be started here, or None."""
    if server_bin() is None:
        return "PostgreSQL is not installed (apt-get install postgresql; .ci/run does)"
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return "running as root without runuser: PostgreSQL refuses to run as root"
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "the PostgreSQL driver is not installed (pip install 'kbert[distributed]')"
    return None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Postgres:
    """One running server: ``url`` for SQLAlchemy/Optuna, ``restart()`` and ``stop()``."""

    folder: Path
    port: int
    bin: Path

    @property
    def data(self) -> Path:
        return self.folder / "data"

    @property
    def url(self) -> str:
        return f"postgresql://kbert@127.0.0.1:{self.port}/kbert"

    def command(self, *args: str) -> list[str]:
        """A server command, as the postgres user when this process is root."""
        line = [str(self.bin / args[0]), *args[1:]]
        return ["runuser", "-u", "postgres", "--", *line] if os.geteuid() == 0 else line

    def run(self, *args: str) -> None:
        done = subprocess.run(self.command(*args), capture_output=True, text=True, timeout=120)
        if done.returncode:
            log = self.folder / "server.log"
            raise RuntimeError(f"{args[0]} {args[1]} failed: {done.stderr.strip() or done.stdout.strip()}; server log: "
                               f"{log.read_text()[-2000:] if log.is_file() else '-'}")

    def pg_ctl(self, action: str, *extra: str) -> None:
        self.run("pg_ctl", action, "-D", str(self.data), "-w", "-t", "60", "-l", str(self.folder / "server.log"),
                 *extra)

    def start(self) -> None:
        self.pg_ctl("start", "-o", f"-p {self.port} -h 127.0.0.1 -k {self.folder}")

    def restart(self) -> None:
        self.pg_ctl("restart", "-m", "fast", "-o", f"-p {self.port} -h 127.0.0.1 -k {self.folder}")

    def stop(self) -> None:
        subprocess.run(self.command("pg_ctl", "stop", "-D", str(self.data), "-m", "immediate", "-w"),
                       capture_output=True, timeout=120)


def start_postgres(folder: Path) -> Postgres:
    """initdb (trust authentication on loopback, user and database ``kbert``) and start the server."""
    folder.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:  # the server runs as postgres: it must own its folder (and reach it)
        shutil.chown(folder, "postgres", "postgres")
        for parent in folder.parents:
            if parent == Path("/"):
                break
            parent.chmod(parent.stat().st_mode | 0o011)
    server = Postgres(folder, free_port(), server_bin())
    server.run("initdb", "-D", str(server.data), "-U", "kbert", "-A", "trust", "--no-sync", "-E", "UTF8")
    with open(server.data / "postgresql.conf", "a") as conf:
        conf.write("fsync = off\nmax_connections = 100\n")
    server.start()
    server.run("createdb", "-h", "127.0.0.1", "-p", str(server.port), "-U", "kbert", "kbert")
    return server


def wait_for_port(port: int, seconds: float = 30) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port}")
