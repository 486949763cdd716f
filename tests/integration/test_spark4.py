"""The write step through Spark 4's own spark-submit, as a worker whose Spark is a Spark 4 distribution
(``SPARK_HOME``) runs it: the Airflow deployments on the Spark provider 6.x, which brings Spark 4's client.

The Spark 4 here is pyspark 4.0.x's distribution that `make spark-connect-install` unpacks for the Connect
server (make test runs it); the job's driver and executors import its pyspark (``PYTHONPATH``), not the
virtualenv's 3.5. Rows, offsets and the committed state are checked exactly, as for Spark 3.5."""

from __future__ import annotations

import json
import re
import sys

import pytest

from tests.conftest import REPO, produce_to_partition, spark4_dist, table_of, write_pipeline
from tidewater.config.parse import load_pipeline
from tidewater.spark.conf import spark_submit_binary
from tidewater.steps.lifecycle import commit_step, plan_step, validate_step
from tidewater.steps.write import run_write_step
from tidewater.table.summary import committed_state
from tidewater_dev.sample_data import pizza_events
from tidewater_dev.spark_connect import check_dist, server_env

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture
def spark4(monkeypatch: pytest.MonkeyPatch) -> str:
    """This process's environment pointed at the Spark 4 distribution (what a worker with SPARK_HOME has);
    returns its release."""
    dist = spark4_dist()
    check_dist(dist)
    env = server_env(dist, sys.executable, base={})
    for name in ("SPARK_HOME", "PYTHONPATH"):
        monkeypatch.setenv(name, env[name])
    monkeypatch.delenv("SPARK_CONF_DIR", raising=False)
    return re.search(r"__version__.*?['\"]([^'\"]+)", (dist / "pyspark" / "version.py").read_text()).group(1)


def test_the_write_step_on_spark_4_writes_every_record_once(broker, home, topic, spark4):
    """300 records over 2 partitions in sub-ranges of at most 70 (6 Spark tasks), written by Spark 4's
    spark-submit and committed. Expected: `tidewater run`'s spark-submit is $SPARK_HOME's, the job's log says
    it ran on Spark 4, 300 rows with offsets {0: 150, 1: 150}, and a retried commit adds nothing."""
    assert spark4.startswith("4.")
    assert spark_submit_binary().startswith(str(REPO / ".data" / "spark-connect" / "deps" / "bin"))
    path = write_pipeline(home, topics=[topic], kafka={"bootstrap_servers": broker.bootstrap}, batch={"records_per_task": 70})
    spec = load_pipeline(path)
    events = pizza_events(300, seed=41)
    produce_to_partition(broker.bootstrap, topic, 0, events[:150], partitions=2)
    produce_to_partition(broker.bootstrap, topic, 1, events[150:])
    plan, plan_path = plan_step(spec)
    manifest = run_write_step(spec, plan_path)
    validate_step(spec, plan, manifest)
    assert commit_step(spec, plan, manifest).status == "committed"
    assert commit_step(spec, plan, manifest).status == "already-committed"
    assert len(manifest.task_timings) == 6 and manifest.records == 300 and manifest.rows_in_files == 300
    log = (plan_path.parent / "spark-submit.log").read_text()
    assert f"wrote 300 records in {len(manifest.data_files)} files" in log and f"on Spark {spark4}" in log
    table = table_of(path)
    assert committed_state(table).offsets == {topic: {0: 150, 1: 150}}
    ids = table.scan().to_arrow().column("order_id").to_pylist()
    assert sorted(ids) == sorted(json.loads(e)["order_id"] for e in events)
