"""A Spark standalone cluster on local ports, for tests and benchmarks: a master and workers started with
``spark-class org.apache.spark.deploy.master.Master`` / ``...worker.Worker`` from pyspark's own Spark
installation, in an environment of their own (by default: no project virtualenv on PATH, Debian's Python
without the project's packages, another TIDEWATER_HOME and working directory than the driver's).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from tidewater.errors import TransientError

BARE_PYTHON = "/usr/bin/python3"  # Debian's: the same minor version as ours, none of the project's packages


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _alive_workers(ui: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=2) as r:
            body = r.read()
    except OSError:
        return -1  # the master is not up yet
    return max(body.count(b'"state" : "ALIVE"'), body.count(b'"state": "ALIVE"'))


@dataclass
class StandaloneCluster:
    master: str  # spark://127.0.0.1:PORT
    work: Path
    procs: list[subprocess.Popen] = field(default_factory=list)

    def stop(self) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()


def bare_env(work: Path) -> dict[str, str]:
    """The workers' environment: a Spark installation (pyspark's) and Debian's Python, nothing of ours."""
    import pyspark

    return {
        "PATH": "/usr/bin:/bin",
        "SPARK_HOME": str(Path(pyspark.__file__).parent),
        "JAVA_HOME": os.environ.get("JAVA_HOME", "/usr/lib/jvm/java-17-openjdk-amd64"),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": BARE_PYTHON,
        "TIDEWATER_HOME": str(work / "elsewhere"),
        "HOME": str(work),
        "SPARK_WORKER_DIR": str(work / "worker-dirs"),
    }


def start_standalone(
    work: Path, workers: int = 2, cores: int = 1, memory: str = "1g", env: dict[str, str] | None = None, timeout: float = 90
) -> StandaloneCluster:
    """Start a master and ``workers`` workers (``cores`` cores and ``memory`` each) under ``work``; returns once
    every worker is registered. Logs: ``work/master.log``, ``work/worker<i>/worker.log``."""
    spark_class = str(Path(sys.executable).parent / "spark-class")
    env = env or bare_env(work)
    port, ui = _port(), _port()
    cluster = StandaloneCluster(f"spark://127.0.0.1:{port}", work)
    with open(work / "master.log", "wb") as log:
        cluster.procs.append(
            subprocess.Popen(
                [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port), "--webui-port", str(ui)],
                env=env,
                cwd=work,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
    for i in range(workers):
        wdir = work / f"worker{i}"
        wdir.mkdir(exist_ok=True)
        with open(wdir / "worker.log", "wb") as log:
            cluster.procs.append(
                subprocess.Popen(
                    [
                        spark_class,
                        "org.apache.spark.deploy.worker.Worker",
                        cluster.master,
                        "--cores",
                        str(cores),
                        "--memory",
                        memory,
                        "--webui-port",
                        str(_port()),
                        "--work-dir",
                        str(wdir),
                    ],
                    env=env,
                    cwd=wdir,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
    deadline = time.monotonic() + timeout
    while _alive_workers(ui) < workers:
        if time.monotonic() > deadline:
            cluster.stop()
            raise TransientError(f"the standalone cluster did not come up with {workers} workers; logs under {work}")
        time.sleep(0.5)
    return cluster
