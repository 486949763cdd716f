"""A real Spark Connect server for the demo, tests and benchmarks: the warm path of the write step.

pyspark 3.5 (the project's, matching the Iceberg runtime jar) ships no Connect server. pyspark 4.0.x's source
distribution does (``deps/jars/spark-connect_2.13-*.jar`` and ``deps/bin/spark-submit``): ``make spark-connect``
downloads it from the package registry (pinned in ``constraints-spark-connect.txt``) and unpacks it in its own
folder, ``.data/spark-connect/``, never into the project's virtualenv. The server runs from there with
``SPARK_HOME`` set to its ``deps/`` folder and its Python workers started with the project's interpreter
(``PYSPARK_PYTHON``), so they import ``tidewater`` and its packages, with the distribution's own pyspark first
on ``PYTHONPATH`` (a worker must speak its server's version). The project's pyspark 3.5 client talks to it
(Spark tests this skew, SPARK-48054). It listens on 127.0.0.1 only. The write step needs no Iceberg catalog
in Spark, so the server runs none.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from tidewater.config.locations import home_dir
from tidewater.errors import ConfigError
from tidewater_dev.broker import CHECKOUT, free_port, port_free
from tidewater_dev.process import LocalServer, spawn

log = logging.getLogger(__name__)

DIST_ENV = "TIDEWATER_SPARK_CONNECT_DIST"
STATE_FILE = "spark-connect.json"
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
WORKER_DAEMON = "tidewater.runtime.worker_daemon"


def default_dist() -> Path:
    """Where ``make spark-connect`` unpacks the distribution: ``$TIDEWATER_SPARK_CONNECT_DIST``, else
    ``.data/spark-connect`` beside the package's checkout."""
    env = os.environ.get(DIST_ENV)
    return Path(env) if env else CHECKOUT / ".data" / "spark-connect"


def check_dist(dist: Path) -> Path:
    """The distribution's spark-submit, or a ConfigError saying how to install it."""
    submit = dist / "deps" / "bin" / "spark-submit"
    if not submit.is_file() or not list((dist / "deps" / "jars").glob("spark-connect_*.jar")):
        raise ConfigError(
            f"no Spark Connect server distribution at {dist} (`make spark-connect` installs it, or set "
            f"{DIST_ENV} to an unpacked pyspark 4.0.x source distribution)"
        )
    for script in (dist / "deps" / "bin").iterdir():  # the archive keeps no execute bits
        if not os.access(script, os.X_OK):
            script.chmod(0o755)
    return submit


def server_env(dist: Path, python: str, base: dict[str, str] | None = None) -> dict[str, str]:
    """The server's environment: its own Spark home, its own pyspark first on the path, ``python`` for workers."""
    env = dict(os.environ if base is None else base)
    py4j = sorted((dist / "lib").glob("py4j-*.zip"))
    env.update(
        {
            "SPARK_HOME": str(dist / "deps"),
            "PYSPARK_PYTHON": python,
            "SPARK_LOCAL_IP": "127.0.0.1",
            "PYTHONPATH": os.pathsep.join([str(dist), *map(str, py4j)]),
        }
    )
    env.setdefault("JAVA_HOME", "/usr/lib/jvm/java-17-openjdk-amd64")
    env.pop("SPARK_CONF_DIR", None)  # the project's Spark settings are for its own (3.5) Spark
    return env


@dataclass
class ConnectServer(LocalServer):
    process_group: ClassVar[bool] = True  # the JVM and its Python workers
    grace: ClassVar[float] = 20.0

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"


def server_command(
    dist: Path, port: int, host: str = "127.0.0.1", master: str = "local[2]", conf: dict[str, str] | None = None
) -> list[str]:
    """The spark-submit command line of a server listening on ``host:port`` (no secret is ever on it)."""
    settings = {
        "spark.connect.grpc.binding.port": str(port),
        "spark.connect.grpc.binding.address": host,
        "spark.ui.enabled": "false",
        "spark.python.worker.reuse": "true",
        # workers forked with the write step's modules loaded (Spark reaps idle workers after a minute)
        "spark.python.daemon.module": WORKER_DAEMON,
        **(conf or {}),
    }
    cmd = [str(check_dist(dist)), "--master", master, "--class", SERVER_CLASS, "--name", "tidewater-spark-connect"]
    for k, v in settings.items():
        cmd += ["--conf", f"{k}={v}"]
    return [*cmd, "spark-internal"]


def start(
    dist: Path | None = None,
    port: int | None = None,
    log_path: Path | None = None,
    python: str | None = None,
    master: str = "local[2]",
    conf: dict[str, str] | None = None,
    timeout: float = 180,
) -> ConnectServer:
    """Start a server on 127.0.0.1 (its own process group) and return once it accepts connections. ``python``:
    the workers' interpreter (default: this one, which has the project's packages). ``conf``: more settings."""
    dist = dist or default_dist()
    if port and not port_free(port):
        raise ConfigError(f"--port: 127.0.0.1:{port} is already in use by another process; choose another port")
    port = port or free_port()
    log_path = log_path or home_dir() / f"spark-connect-{port}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    cmd = server_command(dist, port, master=master, conf=conf)
    proc = spawn(cmd, log_path, server_env(dist, python or sys.executable), cwd=log_path.parent)
    server = ConnectServer(proc.pid, port, str(log_path)).listening(proc, "the Spark Connect server", timeout)
    log.info("Spark Connect server pid %d on %s (log %s)", proc.pid, server.url, log_path)
    return server


def start_background(port: int) -> ConnectServer:
    """Start (or reuse) the recorded server on ``port`` ($TIDEWATER_HOME/spark-connect.json)."""
    current = read_state()
    if current is not None and current.alive() and current.port == port:
        return current
    if current is not None:
        current.stop()
    server = start(port=port)
    server.record(STATE_FILE)
    return server


def read_state() -> ConnectServer | None:
    return ConnectServer.recorded(STATE_FILE)


def stop_background() -> bool:
    server = read_state()
    if server is None:
        return False
    server.stop()
    ConnectServer.forget(STATE_FILE)
    return True


def serve(argv: list[str] | None = None) -> None:
    """Run a server in the foreground, in place of this process (a container's command: see docker-compose.yml's
    ``spark-connect`` service): ``python -m tidewater_dev.spark_connect --dist D --host 0.0.0.0 --port 15002``."""
    ap = argparse.ArgumentParser(prog="python -m tidewater_dev.spark_connect", description=serve.__doc__)
    ap.add_argument("--dist", type=Path, default=None, help="the unpacked pyspark 4.0.x distribution")
    ap.add_argument("--host", default="127.0.0.1", help="the address to listen on (0.0.0.0 in a container)")
    ap.add_argument("--port", type=int, default=15002)
    ap.add_argument("--master", default="local[2]", help="the server's own Spark master (its version's: 4.0)")
    args = ap.parse_args(argv)
    dist = args.dist or default_dist()
    cmd = server_command(dist, args.port, args.host, args.master)
    os.execvpe(cmd[0], cmd, server_env(dist, sys.executable))


if __name__ == "__main__":
    serve()
