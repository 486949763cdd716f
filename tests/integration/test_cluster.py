"""A Spark standalone cluster whose workers lack the project's packages: a master and two workers started with
`spark-class` on local ports, in an environment of their own (their PATH has no project virtualenv, their
Python is the system's, without pyarrow or tidewater, their TIDEWATER_HOME and working directory differ from
the driver's). The packed environment (`make executor-env`, `spark.python_env`) is shipped to them with
`spark.archives`; ingest, replay and maintenance run through them."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import REPO, ingest_inline, write_pipeline
from tidewater.config.parse import load_pipeline
from tidewater.dev.sample_data import pizza_events, produce
from tidewater.table.catalog import load_catalog, load_table
from tidewater.table.summary import committed_state

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PACK = REPO / ".data" / "executor-env.tar.gz"
BARE_PYTHON = "/usr/bin/python3"  # Debian's: the same minor version as ours, none of the project's packages


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(url: str, what: str, check=lambda _b: True, seconds: float = 90) -> bytes:  # noqa: ANN001
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                body = r.read()
                if check(body):
                    return body
        except OSError:
            pass
        time.sleep(0.5)
    pytest.fail(f"{what} did not come up at {url}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):  # noqa: ANN001, ANN201
    if not PACK.is_file():
        pytest.fail(f"{PACK} is missing: `make executor-env` builds it (make test does)")
    spark_class = str(Path(sys.executable).parent / "spark-class")
    work = tmp_path_factory.mktemp("cluster")
    import pyspark

    # a Spark installation is all the workers have (here: the one inside pyspark's package), not our packages
    env = {"PATH": "/usr/bin:/bin", "SPARK_HOME": str(Path(pyspark.__file__).parent),
           "JAVA_HOME": os.environ.get("JAVA_HOME", "/usr/lib/jvm/java-17-openjdk-amd64"),
           "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": BARE_PYTHON, "TIDEWATER_HOME": str(work / "elsewhere"),
           "HOME": str(work), "SPARK_WORKER_DIR": str(work / "worker-dirs")}
    port, ui = _port(), _port()
    procs = [subprocess.Popen([spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port",
                               str(port), "--webui-port", str(ui)], env=env, cwd=work,
                              stdout=open(work / "master.log", "wb"), stderr=subprocess.STDOUT)]  # noqa: SIM115
    master = f"spark://127.0.0.1:{port}"
    _wait(f"http://127.0.0.1:{ui}/json/", "the Spark master")
    for i in range(2):
        wdir = work / f"worker{i}"
        wdir.mkdir()
        procs.append(subprocess.Popen([spark_class, "org.apache.spark.deploy.worker.Worker", master, "--cores", "1",
                                       "--memory", "1g", "--webui-port", str(_port()), "--work-dir", str(wdir)],
                                      env=env, cwd=wdir, stdout=open(wdir / "worker.log", "wb"),  # noqa: SIM115
                                      stderr=subprocess.STDOUT))
    _wait(f"http://127.0.0.1:{ui}/json/", "two Spark workers", lambda b: b.count(b'"state" : "ALIVE"') >= 2
          or b.count(b'"state": "ALIVE"') >= 2)
    yield master
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait(timeout=60)


def test_ingest_replay_and_maintenance_run_on_workers_without_the_projects_packages(broker, home, topic, cluster):
    """Without the packed environment a batch fails on the workers (their Python lacks our packages) with a
    terminal error naming spark.python_env, and commits nothing; with `spark.python_env` the same batch lands
    with exact offsets, the tasks ran in the shipped interpreter, a replay of a range re-reads it through the
    workers (replace and append-missing), and compaction runs on the cluster."""
    from tidewater.errors import ConfigError
    from tidewater.ops.maintenance import maintain
    from tidewater.ops.replay import run_replay
    from tidewater.plan.replay import ReplayRequest
    from tidewater.runtime.steps import commit_step, plan_step, run_write_step, validate_step

    base = {"topics": [topic], "kafka": {"bootstrap_servers": broker.bootstrap},
            "maintenance": {"rewrite_data_files": {"min_input_files": 2}}}
    bare = load_pipeline(write_pipeline(home, name="bare", spark={"master": cluster, "conf": {
        "spark.pyspark.python": BARE_PYTHON}}, table={"identifier": "rpc.bare"}, **base))
    produce(broker.bootstrap, topic, pizza_events(60, seed=700), partitions=2)
    plan, path = plan_step(bare)
    with pytest.raises(ConfigError, match="executors' Python cannot import"):
        run_write_step(bare, path, master=cluster)
    failed = load_table(load_catalog(bare), "rpc.bare")
    assert failed is None or failed.current_snapshot() is None  # nothing committed (a table it made is undone)

    spec = load_pipeline(write_pipeline(home, spark={"master": cluster, "python_env": str(PACK)}, **base))
    plan, path = plan_step(spec)
    manifest = run_write_step(spec, path, master=cluster)
    pythons = {t.get("python") for t in manifest.task_timings}
    assert pythons and all(p and p.endswith("environment/bin/python") and str(REPO) not in p for p in pythons), pythons
    validate_step(spec, plan, manifest)
    commit_step(spec, plan, manifest)
    table = load_table(load_catalog(spec), spec.table.identifier)
    assert table.scan().to_arrow().num_rows == 60
    assert committed_state(table).offsets == {topic: {0: 30, 1: 30}}
    assert all(f["file_path"].startswith(f"file://{home}") for f in table.inspect.files().to_pylist())

    produce(broker.bootstrap, topic, pizza_events(20, seed=701), partitions=2)
    ingest_inline(spec)  # a second batch, so compaction has files to merge
    result = run_replay(spec, ReplayRequest(topic=topic, partitions=(0,), start_offset=0, end_offset=30), master=cluster,
                        out=None)
    assert result["status"] == "committed" and result["rows"] == 30
    # append-missing: the offsets already held are read by the driver and sent with each task (executors never
    # read the staging directory, which may be the driver's local disk)
    missing = run_replay(spec, ReplayRequest(topic=topic, partitions=(1,), start_offset=0, end_offset=30,
                                             mode="append-missing"), master=cluster, out=None)
    assert missing["status"] == "committed" and (missing["rows"], missing["already_present"]) == (0, 30)
    [report] = maintain(spec, actions=["rewrite_data_files"], master=cluster)
    assert report.after.data_files < report.before.data_files
    table = load_table(load_catalog(spec), spec.table.identifier)
    assert table.scan().to_arrow().num_rows == 80 and committed_state(table).offsets == {topic: {0: 40, 1: 40}}
