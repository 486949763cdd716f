"""The write step on a real Spark Connect server (pyspark 4.0.x's distribution, `make spark-connect-install`;
one server for the session, `spark_connect` fixture) with the project's pyspark 3.5 client: ingest, a change
batch, a replay, the schema-change round, dead letters, a batch killed mid-write then run again, and the
server's faults (one gone or restarting is transient; workers without the packages are terminal). Rows,
offsets and change-table contents are checked exactly, as for spark-submit."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest

from tests.conftest import produce_to_partition, table_of, write_pipeline
from tidewater.config.parse import load_pipeline
from tidewater.steps.lifecycle import commit_step, plan_step, run_once, validate_step
from tidewater.steps.write import run_write_step
from tidewater.table.catalog import load_catalog, load_table
from tidewater.table.summary import CHANGES, DEAD_LETTERS, RECORDS, committed_state
from tidewater_dev.sample_data import pizza_events

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _pipeline(home, broker, topic, url, **more):
    spark = {"connect_url": url, **more.pop("spark", {})}
    return write_pipeline(home, topics=[topic], kafka={"bootstrap_servers": broker.bootstrap}, spark=spark, **more)


def _batch(spec):
    """Plan, write through the pipeline's Connect server, validate and commit one batch."""
    plan, plan_path = plan_step(spec)
    manifest = run_write_step(spec, plan_path)
    validate_step(spec, plan, manifest)
    return plan, manifest, commit_step(spec, plan, manifest)


def test_ingest_through_the_server_is_exact_and_a_retried_commit_adds_nothing(broker, home, topic, spark_connect):
    """300 records over 2 partitions in sub-ranges of at most 70 (6 tasks on the server), then 40 more through
    `run_once` (the `tidewater run` path). Expected: rows and offsets exact after each batch, the commit step
    run again reports already-committed, and the tasks ran in the server's workers (their timings are in the
    manifest)."""
    path = _pipeline(home, broker, topic, spark_connect.url, batch={"records_per_task": 70})
    spec = load_pipeline(path)
    events = pizza_events(340, seed=95)
    produce_to_partition(broker.bootstrap, topic, 0, events[:150], partitions=2)
    produce_to_partition(broker.bootstrap, topic, 1, events[150:300])
    plan, manifest, result = _batch(spec)
    assert len(manifest.task_timings) == 6 and manifest.records == 300 and manifest.rows_in_files == 300
    assert result.status == "committed" and commit_step(spec, plan, manifest).status == "already-committed"
    assert table_of(path).scan().to_arrow().num_rows == 300
    produce_to_partition(broker.bootstrap, topic, 1, events[300:])
    assert run_once(path)["records"] == 40
    table = table_of(path)
    assert table.scan().to_arrow().num_rows == 340
    assert committed_state(table).offsets == {topic: {0: 150, 1: 190}}
    assert sorted(table.scan().to_arrow().column("order_id").to_pylist()) == sorted(json.loads(e)["order_id"] for e in events)
    # this process stays fit for spark-submit: pyspark's Connect marker would make a later job refuse a SparkContext
    import os

    assert "SPARK_CONNECT_MODE_ENABLED" not in os.environ and "SPARK_REMOTE" not in os.environ


def test_a_change_batch_through_the_server_equals_the_source(broker, home, topic, spark_connect):
    """Debezium changes (inserts, updates, deletes, tombstones) over 40 keys in three partitions, three batches
    through the server. Expected: after each batch the table equals the reference model (each key once, values
    equal, deleted keys absent) and the snapshot's counts add up."""
    from tidewater_dev.changes import apply, change_stream, encode

    path = _pipeline(
        home,
        broker,
        topic,
        spark_connect.url,
        name="prices",
        format={"value": "debezium"},
        table={"identifier": "rpc.prices", "id_columns": ["id"], "upsert": True},
        validation={"not_null": ["id"]},
    )
    spec = load_pipeline(path)
    model: dict[int, dict] = {}
    for b in range(3):
        changes = change_stream(model, 120, keys=40, seed=200 + b)
        records = encode(changes, model, "debezium")
        by_part: dict[int, list] = defaultdict(list)
        for key, value in records:
            by_part[key % 3].append(value)
        for p, values in sorted(by_part.items()):
            produce_to_partition(broker.bootstrap, topic, p, values, partitions=3)
        _, manifest, result = _batch(spec)
        model = apply(model, changes)
        table = table_of(path)
        rows = table.scan(selected_fields=("id", "item", "price")).to_arrow().to_pylist()
        assert len({r["id"] for r in rows}) == len(rows), "a key is in the table twice"
        import numpy as np

        got = {r["id"]: (r["item"], np.float32(r["price"] or 0)) for r in rows}
        assert got == {k: (v["item"], np.float32(v["price"] or 0)) for k, v in model.items()}, f"batch {b}"
        counts = json.loads(table.current_snapshot().summary[CHANGES])
        assert counts["inserted"] + counts["updated"] + counts["deleted"] + counts["noop"] == len(changes)
        assert result.records == len(records)


def test_a_replay_through_the_server_leaves_the_table_identical(broker, home, topic, spark_connect):
    """A committed table (metadata columns on), then a replace replay of offsets 10..30 of partition 0 written
    through the server. Expected: the same (partition, offset, id) rows, offsets unchanged, the replay
    recorded in the snapshot."""
    from tidewater.ops.replay import run_replay
    from tidewater.plan.replay import ReplayRequest
    from tidewater.table.summary import REPLAY

    path = _pipeline(home, broker, topic, spark_connect.url, format={"metadata": "prefixed"}, validation={"not_null": ["id"]})
    spec = load_pipeline(path)
    produce_to_partition(broker.bootstrap, topic, 0, [json.dumps({"id": i}).encode() for i in range(40)], partitions=2)
    produce_to_partition(broker.bootstrap, topic, 1, [json.dumps({"id": 1000 + i}).encode() for i in range(30)])
    _batch(spec)

    def content():
        t = table_of(path).scan().to_arrow()
        return sorted(zip(t.column("_kafka_partition").to_pylist(), t.column("_kafka_offset").to_pylist(), t.column("id").to_pylist()))

    before, offsets = content(), committed_state(table_of(path)).offsets
    result = run_replay(spec, ReplayRequest(topic=topic, partitions=(0,), start_offset=10, end_offset=30), out=None)
    assert (result["status"], result["rows"]) == ("committed", 20)
    assert content() == before and len(before) == 70
    assert committed_state(table_of(path)).offsets == offsets
    assert json.loads(table_of(path).current_snapshot().summary[REPLAY])["ranges"] == [[topic, 0, 10, 30]]


def test_schema_changes_the_tasks_find_on_the_server_are_made_once_by_the_driver(broker, home, topic, spark_connect):
    """A first batch creates the table; the second carries a new field in each of two partitions (`tip` in one,
    `coupon` in the other). Expected: the tasks on the server report the changes, the driver (this process)
    makes one schema change and runs those tasks again: one new schema, both fields, rows and values exact."""
    path = _pipeline(home, broker, topic, spark_connect.url, validation={"not_null": []})
    spec = load_pipeline(path)
    produce_to_partition(broker.bootstrap, topic, 0, [json.dumps({"id": i}).encode() for i in range(10)], partitions=2)
    produce_to_partition(broker.bootstrap, topic, 1, [json.dumps({"id": 100 + i}).encode() for i in range(10)])
    _batch(spec)
    schemas_before = len(table_of(path).schemas())
    produce_to_partition(broker.bootstrap, topic, 0, [json.dumps({"id": 20 + i, "tip": i}).encode() for i in range(5)])
    produce_to_partition(broker.bootstrap, topic, 1, [json.dumps({"id": 120 + i, "coupon": f"c{i}"}).encode() for i in range(5)])
    _, manifest, _ = _batch(spec)
    assert "schema_changed_1" in manifest.driver_timings and "schema_changed_2" not in manifest.driver_timings
    table = table_of(path)
    assert len(table.schemas()) == schemas_before + 1
    rows = {r["id"]: r for r in table.scan().to_arrow().to_pylist()}
    assert len(rows) == 30 and [rows[20 + i]["tip"] for i in range(5)] == list(range(5))
    assert [rows[120 + i]["coupon"] for i in range(5)] == [f"c{i}" for i in range(5)]
    assert committed_state(table).offsets == {topic: {0: 15, 1: 15}}


def test_dead_letters_through_the_server_are_counted_and_kept(broker, home, topic, spark_connect):
    """Good records with invalid JSON, an array, invalid UTF-8 and NaN among them. Expected: the good ones are
    rows, the bad ones are in the dead-letter table at their offsets, and read = rows + dead letters."""
    path = _pipeline(home, broker, topic, spark_connect.url)
    spec = load_pipeline(path)
    good = pizza_events(12, seed=97)
    produce_to_partition(broker.bootstrap, topic, 0, good[:6] + [b"{bad", b"[1]", b"\xff", b'{"order_id": "n", "x": NaN}'] + good[6:])
    _, manifest, result = _batch(spec)
    assert result.status == "committed"
    table = table_of(path)
    assert table.scan().to_arrow().num_rows == 12
    summary = table.current_snapshot().summary
    assert int(summary[RECORDS]) == 16 == 12 + int(summary[DEAD_LETTERS])
    dlq = load_table(load_catalog(spec), spec.dead_letter_table()).scan().to_arrow()
    assert sorted(zip(dlq.column("offset").to_pylist(), dlq.column("error_class").to_pylist())) == [
        (6, "InvalidJson"),
        (7, "TypeMismatch"),
        (8, "InvalidUtf8"),
        (9, "InvalidJson"),
    ]


def _kill_once_a_file_is_written(command: list[str], home: Path, what: str) -> None:
    """Start ``command`` and SIGKILL it as soon as the server's first task wrote a data file under ``home``'s
    warehouse; it must still have been running then."""
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not list((home / "warehouse").rglob("*.parquet")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, f"{what} was still writing when it was killed"


def test_a_batch_killed_mid_write_is_written_once_by_the_next_run(broker, home, topic, spark_connect):
    """`tidewater run` (the Connect path) is killed (SIGKILL) as soon as the server's first task wrote a data file
    (30 tasks of 10,000 records: most are still to run). Expected: nothing was committed and no manifest was
    staged; the next run plans the range again and commits it: every record exactly once, offsets exact."""
    path = _pipeline(
        home, broker, topic, spark_connect.url, batch={"records_per_task": 10_000, "chunk_records": 2000, "max_records": 400_000}
    )
    events = pizza_events(300_000, seed=98)
    for p in range(2):
        for i in range(p * 150_000, (p + 1) * 150_000, 50_000):  # the producer's local queue holds 100,000
            produce_to_partition(broker.bootstrap, topic, p, events[i : i + 50_000], partitions=2)
    _kill_once_a_file_is_written([str(Path(sys.executable).parent / "tidewater"), "run", "--pipeline", str(path)], home, "the run")
    assert not list((home / "staging").rglob("manifest.json")), "killed before the write step's manifest"
    table = table_of(path)
    assert table is None or table.current_snapshot() is None, "the killed batch committed nothing"
    result = run_once(path)
    assert result["status"] == "committed" and result["records"] == 300_000
    table = table_of(path)
    ids = table.scan(selected_fields=("order_id",)).to_arrow().column("order_id")
    assert len(ids) == 300_000 and len(set(ids.to_pylist())) == 300_000
    assert committed_state(table).offsets == {topic: {0: 150_000, 1: 150_000}}


def test_server_faults_are_transient_or_terminal_and_name_the_setting(broker, home, topic, tmp_path, spark_connect):
    """Two servers of its own. (1) Its workers run Debian's Python without the project's packages: the write is
    a terminal ConfigError naming spark.connect_url and the module that is missing, even though this process
    wrote a batch through the session's healthy server just before (each URL gets its own session; pyspark's
    getOrCreate would have handed back the healthy server's). (2) A good server stopped
    while it runs a batch's tasks: a TransientError naming spark.connect_url within the bounded retries (not
    the client's ten minutes). Neither commits anything; a later run on a healthy server would plan the range
    again (shown by the test above)."""
    from tidewater.errors import ConfigError, TransientError
    from tidewater_dev import spark_connect as connect
    from tidewater_dev.cluster import BARE_PYTHON

    dist = Path(__file__).resolve().parents[2] / ".data" / "spark-connect"
    warm = load_pipeline(_pipeline(home, broker, topic + "-warm", spark_connect.url, name="warm", table={"identifier": "rpc.warm"}))
    produce_to_partition(broker.bootstrap, topic + "-warm", 0, pizza_events(5, seed=101))
    assert _batch(warm)[2].status == "committed"
    # sessions idle for 8 s are closed (checked every second): for the session walk that opens part (1)
    idle = {"spark.connect.session.manager.defaultSessionTimeout": "8s", "spark.connect.session.manager.maintenanceInterval": "1s"}
    bare = connect.start(dist, python=BARE_PYTHON, log_path=tmp_path / "bare.log", conf=idle)
    try:
        _sessions_are_shared_and_a_closed_one_is_replaced(bare.url)
        spec = load_pipeline(_pipeline(home, broker, topic, bare.url))
        produce_to_partition(broker.bootstrap, topic, 0, pizza_events(10, seed=99))
        _, plan_path = plan_step(spec)
        with pytest.raises(
            ConfigError,
            match=r"spark.connect_url: the Spark Connect server's Python workers cannot "
            r"import '\w+'",
        ) as e:
            run_write_step(spec, plan_path)
        assert e.value.transient is False
    finally:
        bare.stop()

    server = connect.start(dist, log_path=tmp_path / "good.log")
    events = pizza_events(150_000, seed=100)
    for i in range(0, len(events), 50_000):  # the producer's local queue holds 100,000 messages
        produce_to_partition(broker.bootstrap, topic, 0, events[i : i + 50_000])
    spec = load_pipeline(_pipeline(home, broker, topic, server.url, batch={"chunk_records": 2000}))
    _, plan_path = plan_step(spec)
    before = set(home.rglob("*.parquet"))
    done = threading.Event()

    def stop_while_writing() -> None:
        """Stop the server once the tasks write their first data file (the job is under way: a fixed delay was
        sometimes past the job's end on a quiet machine); at the latest after a minute."""
        deadline = time.monotonic() + 60
        while not done.is_set() and time.monotonic() < deadline and not set(home.rglob("*.parquet")) - before:
            time.sleep(0.02)
        server.stop()

    stopper = threading.Thread(target=stop_while_writing, daemon=True)
    stopper.start()
    started = time.monotonic()
    try:
        with pytest.raises(
            TransientError,
            match=r"spark.connect_url: the Spark Connect server 127.0.0.1:\d+ "
            r"(went away or is restarting|is unreachable)",
        ) as e:
            run_write_step(spec, plan_path)
    finally:
        done.set()
        stopper.join(timeout=30)
        server.stop()
    assert e.value.transient is True and time.monotonic() - started < 120
    table = load_table(load_catalog(spec), spec.table.identifier)
    assert table is None or table.current_snapshot() is None


def _session_id(url: str) -> str:
    """The session id a new process takes for ``url`` (a separate interpreter, as an Airflow task is)."""
    # a process that hangs prints where (its stacks) and exits, so that the assertion below shows them
    code = (
        "import faulthandler, sys; faulthandler.dump_traceback_later(90, exit=True); "
        "from tidewater.spark.connect import connect_session; "
        "s = connect_session(sys.argv[1]); print(s.client._session_id); assert s.range(3).count() == 3"
    )
    out = subprocess.run([sys.executable, "-c", code, url], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip().splitlines()[-1]


def _sessions_are_shared_and_a_closed_one_is_replaced(url: str) -> None:
    """Two processes in a row get the same session (the server's Python workers stay warm between batches);
    once the server closed it (idle past its timeout), the next process takes the next id, works and exits
    (twice, so that a process walks past one and then two refused ids: a refused session left to pyspark's
    ``__del__`` at interpreter shutdown once hung the process after its work was done, in CI)."""
    from tidewater.spark.connect import connect_session

    first = _session_id(url)
    assert _session_id(url) == first
    held = connect_session(url)  # this process's cached session: the same one
    assert held.client._session_id == first
    time.sleep(12)  # idle past the server's 8 s timeout: the session is closed and its id refused
    middle = _session_id(url)
    assert middle not in (first, "")
    time.sleep(12)
    second = _session_id(url)
    assert second not in (first, middle, "")
    again = connect_session(url)  # the cached session is found closed and replaced, not used
    assert again.client._session_id == second and again.range(2).count() == 2


# A stand-in for Airflow's task state store (``task_state_store``: kept by Airflow's API server per task instance,
# across its tries) that two processes can share: a JSON file.
FILE_STORE = """
import json
from pathlib import Path

class FileStore:
    def __init__(self, path):
        self.path = Path(path)

    def get(self, key, default=None):
        return json.loads(self.path.read_text()).get(key, default) if self.path.is_file() else default

    def set(self, key, value):
        doc = json.loads(self.path.read_text()) if self.path.is_file() else {}
        self.path.write_text(json.dumps({**doc, key: value}))
"""


def test_a_retry_interrupts_what_its_killed_try_left_running_on_the_server_and_writes_the_batch_once(
    broker, home, topic, spark_connect, tmp_path, caplog
):
    """The write task's first try (a process running the Connect write with a task state store, as the Airflow task
    does) is killed (SIGKILL) once the server's first task wrote a data file; its operation goes on running on the
    server. The retry, with the same store, finds the dead try's operation tag there and interrupts that operation
    (the server says which) before it submits its own, then writes the same plan: validated and committed, every
    record once and the offsets exact. The store is a file standing in for Airflow's (the API server keeps it per
    task instance; here two processes share it)."""
    import logging

    from tidewater.spark.connect import CONNECT_TAG_KEY
    from tidewater.steps.write import run_connect_write

    namespace: dict = {}
    exec(FILE_STORE, namespace)
    store = namespace["FileStore"](tmp_path / "task-state.json")
    path = _pipeline(
        home, broker, topic, spark_connect.url, batch={"records_per_task": 10_000, "chunk_records": 2000, "max_records": 400_000}
    )
    events = pizza_events(200_000, seed=99)
    for p in range(2):
        for i in range(p * 100_000, (p + 1) * 100_000, 50_000):
            produce_to_partition(broker.bootstrap, topic, p, events[i : i + 50_000], partitions=2)
    spec = load_pipeline(path)
    plan, plan_path = plan_step(spec)
    first_try = FILE_STORE + (
        "import sys\nfrom tidewater.config.parse import load_pipeline\nfrom tidewater.steps.write import run_connect_write\n"
        "spec = load_pipeline(sys.argv[1])\n"
        "run_connect_write(spec, spec.stage(sys.argv[2]), tries=FileStore(sys.argv[3]))\n"
    )
    _kill_once_a_file_is_written([sys.executable, "-c", first_try, str(path), str(plan_path), str(store.path)], home, "the first try")
    old_tag = store.get(CONNECT_TAG_KEY)
    assert old_tag and old_tag.startswith(f"tidewater-{spec.name}-{plan.batch_id}-"), old_tag
    with caplog.at_level(logging.WARNING, logger="tidewater.spark.connect"):
        manifest = run_connect_write(spec, plan_path, tries=store)
    assert f"of the previous try (tag {old_tag})" in caplog.text, caplog.text  # the server named what it interrupted
    assert store.get(CONNECT_TAG_KEY) != old_tag  # the retry's own tag, for a try after it
    validate_step(spec, plan, manifest)
    commit_step(spec, plan, manifest)
    table = table_of(path)
    ids = table.scan(selected_fields=("order_id",)).to_arrow().column("order_id")
    assert len(ids) == 200_000 and len(set(ids.to_pylist())) == 200_000
    assert committed_state(table).offsets == {topic: {0: 100_000, 1: 100_000}}
