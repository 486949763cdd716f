"""The peers of `make bench-peers`, started the way a platform runs them, and what the benchmark reads of every
process it measures.

- ``ConnectWorker``: one Kafka Connect worker in distributed mode (its config, offset and status topics on the
  broker) with the Apache Iceberg sink on its classpath (jvm/peers/connect, `make peers`), driven through its REST API.
- ``streaming_command``: scripts/peer_streaming.py under spark-submit (local[2]), Spark's Kafka source and Iceberg's
  Spark runtime from jvm/peers/spark.
- ``Processes``: CPU-seconds and peak RSS of process trees, sampled, and the whole machine's CPU-seconds over the
  same window. A live process's CPU includes its reaped children (``children_user``/``children_system``), but a
  process that ends after its parent (the Spark JVM and the PySpark daemon that `tidewater run` leaves stopping)
  escapes any tree: the machine's busy time does not, so it is the figure the benchmark compares. Nothing else
  runs during a benchmark; this process's own CPU (its polls of the tables) is taken out.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[1]
PEERS = REPO / ".data" / "peers"
CONNECT_HEAP = ["-Xms256m", "-Xmx2g"]  # connect-distributed.sh's default heap
SINK = "org.apache.iceberg.connect.IcebergSinkConnector"


def peer_jars(kind: str) -> list[Path]:
    folder = PEERS / kind / ("libs" if kind == "connect" else "jars")
    jars = sorted(folder.glob("*.jar"))
    if not jars:
        raise SystemExit(f"{folder} is empty: run `make peers` (Maven copies the peers' jars there)")
    return jars


def jar_version(kind: str, prefix: str) -> str:
    """The version in a peer jar's file name (``iceberg-kafka-connect-1.12.0.jar`` -> ``1.12.0``)."""
    for jar in peer_jars(kind):
        rest = jar.stem[len(prefix) :]
        if jar.stem.startswith(prefix) and rest[:1] == "-" and rest[1:2].isdigit():
            return rest[1:]
    return "?"


class ConnectWorker:
    """One distributed-mode worker; ``create`` posts a connector, ``failed_tasks`` asks its status."""

    def __init__(self, bootstrap: str, work: Path, port: int, flush_ms: int | None, name: str = "peers-connect") -> None:
        """``flush_ms``: the worker's ``offset.flush.interval.ms`` (None: Connect's default, 60 s). ``name``: its
        Connect cluster (group id and storage topics), one per worker here."""
        from tidewater_dev.broker import java

        self.url = f"http://127.0.0.1:{port}"
        work.mkdir(parents=True, exist_ok=True)
        props = {
            "bootstrap.servers": bootstrap,
            "group.id": name,
            "listeners": self.url,
            "config.storage.topic": f"{name}-configs",
            "offset.storage.topic": f"{name}-offsets",
            "status.storage.topic": f"{name}-status",
            "config.storage.replication.factor": "1",
            "offset.storage.replication.factor": "1",
            "status.storage.replication.factor": "1",
            "key.converter": "org.apache.kafka.connect.storage.StringConverter",
            "value.converter": "org.apache.kafka.connect.json.JsonConverter",
            "value.converter.schemas.enable": "false",
            "plugin.discovery": "only_scan",
        }
        if flush_ms is not None:
            # A sink task's put() runs once per consumer poll, and a poll with no new records waits until the
            # next offset flush (60 s by default): the sink answers its coordinator's commit only then, so a
            # drained topic's last records wait up to two of those intervals beside a 30 s commit timeout.
            props["offset.flush.interval.ms"] = str(flush_ms)
        self.props = props
        config = work / "worker.properties"
        config.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        log4j = work / "log4j2.properties"
        log4j.write_text((REPO / "jvm" / "kafka" / "log4j2.properties").read_text())
        classpath = os.pathsep.join(str(j) for j in peer_jars("connect"))
        self.log = open(work / "worker.log", "ab")
        self.proc = subprocess.Popen(
            [
                java(),
                *CONNECT_HEAP,
                f"-Dlog4j2.configurationFile={log4j}",
                "-cp",
                classpath,
                "org.apache.kafka.connect.cli.ConnectDistributed",
                str(config),
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._wait_ready(180)

    def _request(self, method: str, path: str, body: dict | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            raw = resp.read()
        return json.loads(raw) if raw else None

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the Kafka Connect worker exited ({self.proc.returncode}): see {self.log.name}")
            try:
                plugins = self._request("GET", "/connector-plugins")
                if any(p["class"] == SINK for p in plugins):
                    return
                raise RuntimeError(f"the worker lists no {SINK}: see {self.log.name}")
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(0.5)
        raise RuntimeError(f"the Kafka Connect worker was not ready in {timeout:.0f} s: see {self.log.name}")

    def create(self, name: str, config: dict[str, str]) -> None:
        self._request("POST", "/connectors", {"name": name, "config": config})

    def failed_tasks(self, name: str) -> list[str]:
        """The traces of the connector's failed tasks (empty while they run)."""
        try:
            status = self._request("GET", f"/connectors/{name}/status")
        except urllib.error.HTTPError:
            return []
        return [t.get("trace", "")[:2000] for t in status.get("tasks", []) if t.get("state") == "FAILED"]

    def delete(self, name: str) -> None:
        self._request("DELETE", f"/connectors/{name}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    """A topic created before a peer starts (the sink's docs ask for its control topic to exist first)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])[topic].result(timeout=15)


def streaming_command(bootstrap: str, topic: str, table: str, checkpoint: Path, trigger_s: float, catalog: dict[str, str]) -> list[str]:
    """spark-submit of scripts/peer_streaming.py on local[2] with the shared catalog as ``spark.sql.catalog.peers``."""
    conf = {
        "spark.sql.catalog.peers": "org.apache.iceberg.spark.SparkCatalog",
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "2",
    }
    conf.update({f"spark.sql.catalog.peers.{k}": v for k, v in catalog.items()})
    cmd = [
        str(Path(sys.executable).parent / "spark-submit"),
        "--master",
        "local[2]",
        "--jars",
        ",".join(str(j) for j in peer_jars("spark")),
    ]
    for k, v in conf.items():
        cmd += ["--conf", f"{k}={v}"]
    return [*cmd, str(REPO / "scripts" / "peer_streaming.py"), bootstrap, topic, table, str(checkpoint), f"{trigger_s:g}"]


class Processes:
    """CPU-seconds and RSS of the process trees under ``roots`` (pids), sampled every ``every`` seconds from
    ``start()``; ``finish()`` returns the CPU used since then, ``peak_rss_mb`` is the largest sum of RSS seen."""

    def __init__(self, roots: dict[str, int], every: float = 0.25) -> None:
        self.roots = roots
        self.every = every
        self.base = {name: self._tree_cpu(pid) for name, pid in roots.items()}
        self.machine_base = self._machine_busy()
        self.last = dict(self.base)
        self.peak_rss_mb = {name: 0.0 for name in roots}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def _tree(pid: int) -> list[psutil.Process]:
        try:
            root = psutil.Process(pid)
            return [root, *root.children(recursive=True)]
        except psutil.Error:
            return []

    @classmethod
    def _tree_cpu(cls, pid: int) -> float:
        total = 0.0
        for p in cls._tree(pid):
            try:
                t = p.cpu_times()
            except psutil.Error:
                continue
            total += t.user + t.system + t.children_user + t.children_system
        return total

    @staticmethod
    def _machine_busy() -> float:
        """CPU-seconds the whole machine has been busy, less this process's own (it polls the tables)."""
        t = psutil.cpu_times()
        me = psutil.Process().cpu_times()
        return (sum(t) - t.idle - getattr(t, "iowait", 0.0)) - (me.user + me.system)

    def _sample(self) -> None:
        for name, pid in self.roots.items():
            cpu = self._tree_cpu(pid)
            if cpu:
                self.last[name] = cpu
            rss = 0.0
            for p in self._tree(pid):
                try:
                    rss += p.memory_info().rss / 2**20
                except psutil.Error:
                    continue
            self.peak_rss_mb[name] = max(self.peak_rss_mb[name], rss)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self._sample()

    def start(self) -> Processes:
        self._thread.start()
        return self

    def finish(self) -> dict[str, float]:
        """Stop sampling (one last sample first) and return each tree's CPU-seconds since the start, and under
        ``"machine"`` the whole machine's (this process's own left out)."""
        self._stop.set()
        self._thread.join(5)
        self._sample()
        out = {name: self.last[name] - self.base[name] for name in self.roots}
        out["machine"] = self._machine_busy() - self.machine_base
        return out
