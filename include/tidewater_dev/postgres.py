"""A PostgreSQL server for tests and development: Debian's server programs (``initdb``, ``postgres``) on a private
data directory and a 127.0.0.1 port, one user (``tidewater``) with trust authentication on loopback only.

The production-shaped tests use it as the Iceberg catalog (pyiceberg's SQL catalog) and as Airflow's metadata
database, as deployments do. PostgreSQL refuses to run as root: under root it runs as the ``postgres`` user the
Debian package creates (``runuser``), in a directory that user owns.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from tidewater.errors import ConfigError
from tidewater_dev.process import LocalServer

USER = "tidewater"


@dataclass
class Postgres(LocalServer):
    root: str = ""  # the server's directory (data, socket); removed by stop()
    host: str = "127.0.0.1"  # the address its URLs name (it listens on 127.0.0.1 too)

    process_group: ClassVar[bool] = True  # runuser and the postmaster's children
    grace: ClassVar[float] = 15.0

    def url(self, database: str, driver: str = "postgresql+psycopg2") -> str:
        return f"{driver}://{USER}@{self.host}:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """Create database ``name`` (if missing) and return its SQLAlchemy URL."""
        import psycopg2

        conn = psycopg2.connect(host="127.0.0.1", port=self.port, user=USER, dbname="postgres")
        try:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
                if cur.fetchone() is None:
                    cur.execute(f'CREATE DATABASE "{name}"')
        finally:
            conn.close()
        return self.url(name)

    def stop(self, grace: float | None = None) -> None:
        """A fast shutdown (SIGINT to the postmaster: clients are disconnected, data is written out), then the
        process group as any local server, and the directory removed."""
        pidfile = Path(self.root) / "data" / "postmaster.pid"
        try:
            os.kill(int(pidfile.read_text().split()[0]), signal.SIGINT)
        except (OSError, ValueError, IndexError):
            pass
        deadline = time.monotonic() + (self.grace if grace is None else grace)
        while pidfile.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        super().stop(grace)
        if self.root:
            shutil.rmtree(self.root, ignore_errors=True)


def server_bin() -> Path:
    """The directory of Debian's PostgreSQL server programs (the newest version installed)."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3]))
    if found:
        return found[-1].parent
    initdb = shutil.which("initdb")
    if initdb:
        return Path(initdb).resolve().parent
    raise ConfigError(
        "PostgreSQL's server programs (initdb, postgres) are not installed: `make system-deps` installs Debian's postgresql package"
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start(log_path: str | Path, timeout: float = 60.0, host: str | None = None, clients: str | None = None) -> Postgres:
    """Initialise a cluster in a new directory and start it on a free port; returns once it takes connections.
    ``host``: an address to listen on besides 127.0.0.1 (a bridge's, for test hosts in network namespaces), trusting
    connections from the ``clients`` network (CIDR) there."""
    bin_dir = server_bin()
    as_root = os.geteuid() == 0
    run_as = ["runuser", "-u", "postgres", "--"] if as_root else []
    root = Path(tempfile.mkdtemp(prefix="tidewater-pg-", dir="/tmp" if as_root else None))  # reachable by postgres
    if as_root:
        shutil.chown(root, "postgres", "postgres")
    data = root / "data"
    init = subprocess.run(
        run_as + [str(bin_dir / "initdb"), "-D", str(data), "-U", USER, "--auth=trust", "-E", "UTF8", "--no-sync"],
        capture_output=True,
        text=True,
    )
    if init.returncode != 0:
        shutil.rmtree(root, ignore_errors=True)
        raise ConfigError(f"initdb failed: {init.stderr.strip()[-2000:]}")
    if host and clients:
        with open(data / "pg_hba.conf", "a") as hba:
            hba.write(f"host all all {clients} trust\n")
    listen = ",".join(["127.0.0.1", *([host] if host else [])])
    port = _free_port()
    log = open(log_path, "wb")
    proc = subprocess.Popen(
        run_as
        + [
            str(bin_dir / "postgres"),
            "-D",
            str(data),
            "-p",
            str(port),
            "-k",
            str(root),
            "-c",
            f"listen_addresses={listen}",
            "-c",
            "fsync=off",
            "-c",
            "max_connections=200",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    server = Postgres(proc.pid, port, str(log_path), str(root), host=host or "127.0.0.1")
    deadline = time.monotonic() + timeout
    while True:
        try:
            server.create_database("postgres")
            return server
        except Exception:  # noqa: BLE001 - psycopg2's errors while the server starts: retried until up or gone
            if proc.poll() is not None or time.monotonic() > deadline:
                server.stop(0)
                raise ConfigError(f"PostgreSQL did not start on 127.0.0.1:{port} (log {log_path})") from None
            time.sleep(0.2)
