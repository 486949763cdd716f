"""The command line as people use it: subprocesses of the installed `tidewater` command against the real
broker, catalog and (for maintenance) Spark."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ingest_inline, produce_to_partition, write_pipeline
from tidewater import __version__
from tidewater.config.parse import load_pipeline
from tidewater_dev.sample_data import pizza_events

pytestmark = [pytest.mark.integration]
TIDEWATER = str(Path(sys.executable).parent / "tidewater")


def cli(home: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([TIDEWATER, *args], capture_output=True, text=True, timeout=300, env={**os.environ, "TIDEWATER_HOME": str(home)})


def test_version(home):
    proc = cli(home, "--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"tidewater {__version__}"


def test_run_json_prints_only_the_json_document_on_stdout(broker, home, topic):
    """Progress goes to standard error: `tidewater run --json`'s standard output parses as JSON."""
    path = write_pipeline(home, topics=[topic], kafka={"bootstrap_servers": broker.bootstrap})
    produce_to_partition(broker.bootstrap, topic, 0, pizza_events(3, seed=90))
    ingest_inline(load_pipeline(path))
    proc = cli(home, "run", "--pipeline", str(path), "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout) == {"status": "empty", "batch_id": None, "records": 0}
    assert "[1/4] plan" in proc.stderr


def test_maintain_and_replay_dry_runs_show_each_line_once(broker, home, topic):
    """The maintenance report and the replay preview are printed by the command and not logged a second time."""
    path = write_pipeline(home, topics=[topic], kafka={"bootstrap_servers": broker.bootstrap}, format={"metadata": "prefixed"})
    produce_to_partition(broker.bootstrap, topic, 0, pizza_events(8, seed=91))
    ingest_inline(load_pipeline(path))
    maintain = cli(home, "maintain", "--pipeline", str(path), "--actions", "rewrite_manifests", "--dry-run", "--master", "local[1]")
    assert maintain.returncode == 0, maintain.stderr[-2000:]
    both = maintain.stdout + maintain.stderr
    assert both.count("rewrite_manifests on rpc.orders (dry run)") == 1
    # progress on stderr, as each action starts and ends
    assert "[1/1] rewrite_manifests on rpc.orders ..." in maintain.stderr
    assert re.search(r"\[1/1\] rewrite_manifests on rpc\.orders: done in \d+\.\d s", maintain.stderr), maintain.stderr
    replay = cli(home, "replay", "--pipeline", str(path), "--topic", topic, "--start-offset", "0", "--end-offset", "5", "--dry-run")
    assert replay.returncode == 0, replay.stderr[-2000:]
    both = replay.stdout + replay.stderr
    assert both.count(f"{topic}[0] [0, 5)") == 1 and "dry run: nothing changed" in replay.stdout


STEPS_SCRIPT = """
import json, sys
from tidewater.config.parse import load_pipeline
from tidewater.steps.lifecycle import commit_step, plan_step, validate_step
spec = load_pipeline(sys.argv[1])
plan, path = plan_step(spec)
seen = {"empty_plan": sorted(m for m in ("pyspark", "great_expectations") if m in sys.modules)}
from tidewater.source.kafka import kafka_settings
from tidewater.write.job import run_inline
from tidewater.batch import manifest_path, write_json_atomic
produce = __import__("tidewater_dev.sample_data", fromlist=["produce"])
produce.produce(spec.kafka.bootstrap_servers, spec.topics[0], produce.pizza_events(5, seed=93), partitions=1)
plan, path = plan_step(spec)
manifest = run_inline(plan, spec, kafka_settings(spec))
write_json_atomic(manifest_path(path), manifest.to_json())
validate_step(spec, plan, manifest)
commit_step(spec, plan, manifest)
seen["batch"] = sorted(m for m in ("pyspark", "great_expectations") if m in sys.modules)
seen["batch_id"] = plan.batch_id
print(json.dumps(seen))
"""


def test_steps_import_spark_and_great_expectations_only_when_used(broker, home, topic):
    """An empty plan and a batch checked by the built-in checks alone import neither pyspark nor
    great-expectations (2-4 s of imports, more than a small batch's data path). The batch's Data Docs page
    is then left for later: `tidewater data-docs` (the DAG's data_docs task) renders it from the saved report."""
    path = write_pipeline(home, topics=[topic], kafka={"bootstrap_servers": broker.bootstrap}, validation={"not_null": ["order_id"]})
    produce_to_partition(broker.bootstrap, topic, 0, pizza_events(3, seed=92))
    ingest_inline(load_pipeline(path))  # the script's first plan finds nothing new
    proc = subprocess.run(
        [sys.executable, "-c", STEPS_SCRIPT, str(path)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TIDEWATER_HOME": str(home)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["empty_plan"] == [] and seen["batch"] == []
    from tidewater.quality.data_docs import page_of, report_path, site_dir

    spec = load_pipeline(path)
    assert report_path(spec, seen["batch_id"]).is_file() and page_of(spec, seen["batch_id"]) is None
    rendered = cli(home, "data-docs", "--pipeline", str(path))
    assert rendered.returncode == 0, rendered.stderr[-2000:]
    page = page_of(spec, seen["batch_id"])  # in great-expectations' site of the pipeline's data context
    assert page is not None and page.is_relative_to(site_dir(spec) / "validations")
    assert str(page) in rendered.stdout.split()  # (the batch ingested above had its page left pending too)
    assert "Data documentation compiled by Great Expectations" in page.read_text()
    assert "expect_column_values_to_not_be_null" in page.read_text() or "values must never be null" in page.read_text()
    assert seen["batch_id"] in (site_dir(spec) / "index.html").read_text()  # the site's own index lists it
    assert not report_path(spec, seen["batch_id"]).exists()  # the result is in the context's store now
    assert cli(home, "data-docs", "--pipeline", str(path)).stdout == ""  # nothing left to render


def test_status_after_the_topic_was_recreated_warns_and_fails(broker, home, topic):
    """The topic is deleted and created again (its offsets restart at 0) after 5 records were committed:
    `tidewater status` shows no negative lag, names the partition and why the next batch will fail, and
    exits non-zero (also with --json, whose document lists the problem)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    path = write_pipeline(home, topics=[topic], kafka={"bootstrap_servers": broker.bootstrap})
    produce_to_partition(broker.bootstrap, topic, 0, pizza_events(5, seed=97))
    ingest_inline(load_pipeline(path))
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for f in admin.delete_topics([topic]).values():
        f.result()
    deadline = time.monotonic() + 30
    while True:  # the broker may take a moment to forget the topic
        try:
            for f in admin.create_topics([NewTopic(topic, 1, 1)]).values():
                f.result()
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    produce_to_partition(broker.bootstrap, topic, 0, pizza_events(2, seed=98))
    proc = cli(home, "status", "--pipeline", str(path))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"warning: {topic}[0]: committed offset 5 is beyond the end offset 2: the topic was recreated" in proc.stderr
    assert "total lag:     0" in proc.stdout
    doc = cli(home, "status", "--pipeline", str(path), "--json")
    st = json.loads(doc.stdout)
    assert doc.returncode == 1 and st["total_lag"] == 0 and [p["lag"] for p in st["partitions"]] == [0]
    assert len(st["problems"]) == 1 and "recreated or truncated" in st["problems"][0]


def test_broker_stop_with_a_port_stops_only_the_broker_on_that_port(home):
    """`tidewater broker stop --port N` refuses (exit 2, naming both ports) when the recorded broker listens
    elsewhere, and stops it when the port matches; `status --port` answers for that port only."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started = cli(home, "broker", "start", "--port", str(port))
    assert started.returncode == 0, started.stderr
    try:
        other = port + 1 if port < 65535 else port - 1
        wrong = cli(home, "broker", "stop", "--port", str(other))
        assert wrong.returncode == 2
        assert f"the recorded embedded broker listens on port {port}, not {other}; nothing stopped" in wrong.stderr
        assert cli(home, "broker", "status", "--port", str(other)).returncode == 1
        assert cli(home, "broker", "status", "--port", str(port)).returncode == 0
        stopped = cli(home, "broker", "stop", "--port", str(port))
        assert stopped.returncode == 0 and "embedded broker stopped" in stopped.stdout
        assert cli(home, "broker", "status").returncode == 1
    finally:
        cli(home, "broker", "stop")


def test_the_demo_broker_started_again_keeps_its_topics_and_records(home):
    """`tidewater broker start` keeps its log directories in $TIDEWATER_HOME/kafka-<port>: stopped and started again
    on the same port, the broker has the topic and the records produced before (its first start formatted the
    directories; the second reuses them)."""
    import socket

    from confluent_kafka import Consumer
    from confluent_kafka import TopicPartition as KTP

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    bootstrap = f"127.0.0.1:{port}"
    try:
        assert cli(home, "broker", "start", "--port", str(port)).returncode == 0
        produce_to_partition(bootstrap, "kept", 0, pizza_events(3, seed=91))
        assert cli(home, "broker", "stop", "--port", str(port)).returncode == 0
        again = cli(home, "broker", "start", "--port", str(port))
        assert again.returncode == 0, again.stderr
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "kept-check"})
        assert consumer.get_watermark_offsets(KTP("kept", 0), timeout=30) == (0, 3)
        consumer.close()
    finally:
        cli(home, "broker", "stop")


QUIET_SCRIPT = """
import logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stderr)  # a task's log, as Airflow captures it
sys.path.insert(0, sys.argv[2])
from tests.conftest import stage_inline
from tidewater.config.parse import load_pipeline
from tidewater.steps.lifecycle import validate_step
spec = load_pipeline(sys.argv[1])
plan, manifest = stage_inline(spec)
print("=====VALIDATE", file=sys.stderr, flush=True)
validate_step(spec, plan, manifest)
"""


def test_a_suite_validation_log_is_not_buried_in_great_expectations_noise(broker, home, topic):
    """Importing great-expectations logs about 210 INFO lines; the validate step with a suite (which imports
    it) logs its own verdict and the Data Docs page, and at most a couple of great-expectations lines."""
    (home / "range.json").write_text(
        json.dumps(
            {
                "expectations": [
                    {"type": "expect_column_values_to_be_between", "kwargs": {"column": "store_id", "min_value": 0, "max_value": 1000}}
                ]
            }
        )
    )
    path = write_pipeline(home, topics=[topic], kafka={"bootstrap_servers": broker.bootstrap}, validation={"suite": "range.json"})
    produce_to_partition(broker.bootstrap, topic, 0, pizza_events(20, seed=99))
    proc = subprocess.run(
        [sys.executable, "-c", QUIET_SCRIPT, str(path), str(Path(__file__).resolve().parents[2])],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TIDEWATER_HOME": str(home)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = proc.stderr.split("=====VALIDATE", 1)[1].splitlines()
    assert any("suite orders.range.json): passed" in line for line in log), log
    assert len([line for line in log if "great_expectations" in line]) <= 2, "\n".join(log[:40])


def test_broker_start_on_a_port_another_process_holds_fails_naming_it(home):
    """`tidewater broker start --port N` with N held by another process: exit 2 naming the port, nothing
    recorded (it used to report success while its own broker died with AddrInUse)."""
    import socket

    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        started = cli(home, "broker", "start", "--port", str(port))
    finally:
        holder.close()
    assert started.returncode == 2, started.stdout + started.stderr
    assert f"127.0.0.1:{port} is already in use by another process" in started.stderr
    assert not (home / "broker.json").exists()


def test_sql_uses_the_dags_spark_connection_and_fails_in_one_line(home):
    """`tidewater sql` without --master takes the master of the Airflow connection the DAGs use
    (AIRFLOW_CONN_TIDEWATER_SPARK), not the pipeline's spark.master; a failing query ends in one
    `tidewater: error:` line (exit 2), not a Py4J stack trace."""
    path = write_pipeline(home, spark={"master": "local[2]"})
    env = {**os.environ, "TIDEWATER_HOME": str(home), "AIRFLOW_CONN_TIDEWATER_SPARK": '{"conn_type": "spark", "host": "local[1]"}'}
    ok = subprocess.run(
        [TIDEWATER, "sql", "--pipeline", str(path), "SET spark.master"], capture_output=True, text=True, timeout=300, env=env
    )
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert "local[1]" in ok.stdout and "local[2]" not in ok.stdout
    bad = subprocess.run(
        [TIDEWATER, "sql", "--pipeline", str(path), "SELECT * FROM rpc.no_such_table"], capture_output=True, text=True, timeout=300, env=env
    )
    assert bad.returncode == 2, bad.stderr[-2000:]
    errors = [ln for ln in bad.stderr.splitlines() if ln.startswith("tidewater: ")]
    assert len(errors) == 1 and errors[0].startswith("tidewater: error: Spark: ") and "no_such_table" in errors[0], errors
    assert "Traceback" not in bad.stderr and "py4j" not in bad.stderr.lower()
