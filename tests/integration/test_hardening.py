"""Hardening against unlucky operators and hostile records, through the real broker, Spark and catalog:
dead letters survive a crash between commits, routed names stay inside their namespace, orphan removal
never touches another table's files, and no secret reaches a command line or a generated file."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import ingest_inline, produce_to_partition, write_pipeline
from tidewater.config.parse import load_pipeline
from tidewater.table.catalog import load_catalog, load_table
from tidewater.table.summary import DEAD_LETTERS, RECORDS, committed_state
from tidewater_dev.sample_data import pizza_events

pytestmark = [pytest.mark.integration]


class _Killed(BaseException):
    """Stands for the process dying at that point: nothing after it runs (not an Exception)."""


def _rows(spec, ident):
    t = load_table(load_catalog(spec), ident)
    return 0 if t is None or t.current_snapshot() is None else t.scan().to_arrow().num_rows


def test_killed_between_the_batch_commit_and_its_dead_letters_loses_no_dead_letter(broker, home, topic, monkeypatch):
    """`tidewater run` (spark-submit write) dies right after the table's commit, before the dead-letter
    commit. Expected: the table has the batch (offsets moved) and the dead-letter table not yet; the next
    run finishes the dead-letter commit before it plans, then ingests the new records. In the end every
    record is once in the table or once in the dead-letter table, and read = rows + dead letters."""
    import tidewater.commit.holders as holders
    from tidewater.steps.lifecycle import run_once
    from tidewater.table import letters

    path = write_pipeline(home, topics=[topic], kafka={"bootstrap_servers": broker.bootstrap})
    spec = load_pipeline(path)
    good = pizza_events(12, seed=71)
    produce_to_partition(broker.bootstrap, topic, 0, good[:6] + [b"{bad", b"[1]", b"\xff"] + good[6:])

    def die(*_a, **_k):
        raise _Killed()

    real = holders.commit_dead_letters
    monkeypatch.setattr(holders, "commit_dead_letters", die)
    with pytest.raises(_Killed):
        run_once(path, master="local[2]")
    monkeypatch.setattr(holders, "commit_dead_letters", real)
    table = load_table(load_catalog(spec), spec.table.identifier)
    assert table.scan().to_arrow().num_rows == 12 and committed_state(table).offsets == {topic: {0: 15}}
    assert _rows(spec, spec.dead_letter_table()) == 0, "the crash came before the dead-letter commit"

    produce_to_partition(broker.bootstrap, topic, 0, pizza_events(5, seed=72) + [b"nope"])
    result = run_once(path, master="local[2]")
    assert result["status"] == "committed" and result["records"] == 6
    assert _rows(spec, spec.table.identifier) == 12 + 5
    assert _rows(spec, spec.dead_letter_table()) == 3 + 1
    dlq = load_table(load_catalog(spec), spec.dead_letter_table())
    assert sorted(dlq.scan().to_arrow().column("offset").to_pylist()) == [6, 7, 8, 20]
    assert letters.kept(dlq, letters.KEPT_TOTALS) == {"rows": 4, "pipelines": {spec.name: 4}}, "kept once per commit"
    assert letters.counts(spec)["open"] == letters.scanned(spec)["open"] == 4
    reads = dead = 0
    for s in load_table(load_catalog(spec), spec.table.identifier).snapshots():
        props = s.summary.additional_properties
        reads += int(props.get(RECORDS, 0))
        dead += int(props.get(DEAD_LETTERS, 0))
    assert reads == 21 == 17 + dead


def _routed(home, broker, topic, **routing):
    path = write_pipeline(
        home,
        topics=[topic],
        kafka={"bootstrap_servers": broker.bootstrap},
        table={"identifier": ""},
        validation={"not_null": []},
        routing={"namespace": "tenants", "field": "tenant", "dynamic": True, **routing},
    )
    return load_pipeline(path)


def test_route_values_cannot_leave_the_namespace_or_reach_reserved_or_foreign_tables(broker, home, topic):
    """Dynamic routing with the default `{value}` template. Route values `a.b`, `victim.t`, `acme\\n`,
    the pipeline's own checkpoint, dead-letter and ledger table names, and the name of a table that another
    pipeline writes, each also spelled in other cases (`ORDERS_CHECKPOINTS`, `Orders_Dead_Letters`,
    `SHARED`: on a catalog that folds case these are the same tables): each is a dead letter (InvalidRoute
    or ForeignTable) naming it; no table is created outside `tenants`, none beside a protected table by case,
    the reserved tables keep their schema, the foreign table is unchanged, and `acme` and `ACME` land in
    `tenants.acme` alone. Written through spark-submit."""
    other = load_pipeline(
        write_pipeline(
            home,
            name="other",
            topics=[topic + "-o"],
            kafka={"bootstrap_servers": broker.bootstrap},
            table={"identifier": "tenants.shared"},
            validation={"not_null": []},
        )
    )
    produce_to_partition(broker.bootstrap, topic + "-o", 0, [json.dumps({"id": 1}).encode()])
    ingest_inline(other)
    foreign_before = load_table(load_catalog(other), "tenants.shared").current_snapshot().snapshot_id

    spec = _routed(home, broker, topic)
    names = [
        "acme",
        "a.b",
        "victim.t",
        "acme\n",
        spec.checkpoint_table().split(".")[1],
        spec.dead_letter_table().split(".")[1],
        "shared",
        spec.checkpoint_table().split(".")[1].upper(),
        spec.dead_letter_table().split(".")[1].title(),
        "SHARED",
        "ACME",
        spec.ledger_table().split(".")[1],
    ]
    produce_to_partition(broker.bootstrap, topic, 0, [json.dumps({"id": i, "tenant": n}).encode() for i, n in enumerate(names)])
    from tidewater.steps.lifecycle import commit_step, plan_step, validate_step
    from tidewater.steps.write import run_write_step

    plan, plan_path = plan_step(spec)
    manifest = run_write_step(spec, plan_path, master="local[2]")  # through spark-submit

    validate_step(spec, plan, manifest)
    commit_step(spec, plan, manifest)
    catalog = load_catalog(spec)
    dlq = load_table(catalog, spec.dead_letter_table()).scan().to_arrow().sort_by("offset").to_pylist()
    assert [(r["offset"], r["error_class"]) for r in dlq] == [
        (1, "InvalidRoute"),
        (2, "InvalidRoute"),
        (3, "InvalidRoute"),
        (4, "InvalidRoute"),
        (5, "InvalidRoute"),
        (6, "ForeignTable"),
        (7, "InvalidRoute"),
        (8, "InvalidRoute"),
        (9, "ForeignTable"),
        (11, "InvalidRoute"),
    ]
    assert "own checkpoint, dead-letter or ledger table" in dlq[3]["error_message"]
    assert "pipeline 'other'" in dlq[5]["error_message"]
    assert {".".join(t) for ns in catalog.list_namespaces() for t in catalog.list_tables(ns)} == {
        "tenants.shared",
        "tenants.shared_ledger",
        "tenants.acme",
        spec.checkpoint_table(),
        spec.dead_letter_table(),
        spec.ledger_table(),
    }  # the pipeline's own ledger, written by the commit step, never by a route
    assert "own checkpoint, dead-letter or ledger table" in dlq[6]["error_message"] and "pipeline 'other'" in dlq[8]["error_message"]
    assert "own checkpoint, dead-letter or ledger table" in dlq[9]["error_message"]
    assert _rows(spec, "tenants.acme") == 2
    assert load_table(catalog, "tenants.shared").current_snapshot().snapshot_id == foreign_before
    assert "tenant" not in load_table(catalog, spec.checkpoint_table()).schema().column_names
    assert manifest.records == manifest.routed + manifest.dead_letters + manifest.skipped


def test_a_template_cannot_put_the_value_into_the_namespace(home):
    """`{value}.t` would let records choose the namespace: refused by configuration validation."""
    from tidewater.errors import ConfigError

    with pytest.raises(ConfigError, match=r"routing.table_template: .*never in the namespace"):
        load_pipeline(
            write_pipeline(
                home,
                topics=["t"],
                kafka={"bootstrap_servers": "127.0.0.1:1"},
                table={"identifier": ""},
                routing={"namespace": "ns", "field": "k", "dynamic": True, "table_template": "{value}.t"},
            )
        )


def test_orphan_removal_refuses_a_location_another_table_shares(broker, home, topic):
    """Table B is created at table A's location. Expected: remove_orphan_files on A removes nothing
    (reported as skipped, naming B) and B's files are intact and readable."""
    import pyarrow as pa

    from tidewater.ops.maintenance import run_action
    from tidewater.spark import session as spark_session

    path = write_pipeline(
        home, topics=[topic], kafka={"bootstrap_servers": broker.bootstrap}, maintenance={"remove_orphan_files": {"older_than_hours": 24}}
    )
    spec = load_pipeline(path)
    produce_to_partition(broker.bootstrap, topic, 0, pizza_events(5, seed=73))
    ingest_inline(spec)
    catalog = load_catalog(spec)
    a = load_table(catalog, spec.table.identifier)
    b = catalog.create_table("rpc.neighbour", schema=pa.schema([("x", pa.int64())]), location=a.location())
    b.append(pa.table({"x": [1, 2, 3]}))
    b_files = [f.file.file_path for f in load_table(catalog, "rpc.neighbour").scan().plan_files()]
    for f in b_files:  # old enough to be judged an orphan of A
        os.utime(f.removeprefix("file://"), (time.time() - 90_000, time.time() - 90_000))
    spark = spark_session.session(spec, app_name="orphans", master="local[1]")
    try:
        report = run_action(spark, spec, "remove_orphan_files")
    finally:
        spark.stop()
    assert report.details["skipped"] == "location shared with rpc.neighbour" and report.details["orphan_files"] == 0
    assert all(Path(f.removeprefix("file://")).is_file() for f in b_files)
    assert load_table(catalog, "rpc.neighbour").scan().to_arrow().num_rows == 3


# Secret Spark settings of the kinds a held-out check found on the command line, and more (a password in a
# URL, an environment-style name, known Hadoop credential keys), each with a value no other setting holds.
SPARK_SECRETS = {
    "spark.hadoop.fs.s3a.secret.key": "spark-s3cr3t-Q7",
    "spark.hadoop.javax.jdo.option.ConnectionURL": "jdbc:postgresql://u:UrlPw-5555@db/x",
    "spark.kubernetes.driverEnv.DB_PASS": "DbP-8888",
    "spark.hadoop.fs.s3a.access.key": "AK-2222",
    "spark.executorEnv.API_TOKEN": "ApiTok-3131",
    "spark.hadoop.fs.azure.account.key.acct.dfs.core.windows.net": "AzKey-4242",
    "spark.tw.endpoint": "https://svc:EndPw-6060@example.invalid/x",
    "spark.tw.signed": "https://example.invalid/x?password=QueryPw-7070",
}


def _command_lines_while(fn):
    """(fn's result, every process command line seen while it ran)."""
    seen: list[str] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            for pid in os.listdir("/proc"):
                if pid.isdigit():
                    try:
                        seen.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
                    except OSError:
                        pass
            time.sleep(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        return fn(), seen
    finally:
        done.set()
        watcher.join()


def _event_log_environment(events_dir: Path) -> dict[str, str]:
    """The Spark properties the write job's driver recorded in its event log (SparkListenerEnvironmentUpdate)."""
    logs = [f for f in events_dir.iterdir() if f.is_file()]
    assert len(logs) == 1, f"one event log for the one job: {logs}"
    for line in logs[0].read_text().splitlines():
        event = json.loads(line)
        if event.get("Event") == "SparkListenerEnvironmentUpdate":
            return dict(event["Spark Properties"])
    raise AssertionError("the event log has no environment update")


def test_no_secret_on_the_spark_submit_command_line(broker, home, topic, monkeypatch):
    """A pipeline with a catalog credential and secret Spark settings of every kind (by key name, known
    Hadoop credential keys, environment-style names, a password inside a URL's value), written through
    spark-submit on a Spark whose `spark-defaults.conf` (in SPARK_CONF_DIR) turns on event logs and sets a
    probe setting. Expected: the job saw both, the cluster's defaults and the secrets (its event log exists
    and lists the probe's value and every secret key, each secret value redacted by Spark); no process's
    command line, the job's log, the event log, a staged file of the batch or the plan task's XCom value holds
    a secret; the private properties file is removed afterwards."""
    from tidewater.runtime.airflow import plan_task
    from tidewater.steps.write import run_write_step

    conf_dir, events = home / "spark-conf", home / "events"
    conf_dir.mkdir()
    events.mkdir()
    (conf_dir / "spark-defaults.conf").write_text(
        f"spark.eventLog.enabled  true\nspark.eventLog.dir  file://{events}\nspark.tw.probe  from-the-cluster"
    )
    monkeypatch.setenv("SPARK_CONF_DIR", str(conf_dir))
    catalog_secret = "cat-s3cr3t-Z9"
    path = write_pipeline(
        home,
        topics=[topic],
        kafka={"bootstrap_servers": broker.bootstrap},
        catalog={
            "properties": {
                "type": "sql",
                "uri": f"sqlite:///{home}/catalog.db",
                "warehouse": f"file://{home}/warehouse",
                "credential": catalog_secret,
            }
        },
        spark={"conf": SPARK_SECRETS},
    )
    spec = load_pipeline(path)
    produce_to_partition(broker.bootstrap, topic, 0, pizza_events(20, seed=74))
    planned = plan_task(str(path))
    plan_path = Path(planned["plan_path"])
    manifest, seen = _command_lines_while(lambda: run_write_step(spec, plan_path, master="local[1]"))
    assert manifest.rows_in_files == 20
    secrets = [catalog_secret, *SPARK_SECRETS.values()]
    submits = [c for c in seen if "spark-submit" in c or "SparkSubmit" in c]
    assert submits, "the watcher saw the spark-submit process"
    assert [s for s in secrets if any(s in c for c in seen)] == []
    assert any("--properties-file" in c for c in submits)

    recorded = _event_log_environment(events)  # the cluster's default turned the event log on
    assert recorded["spark.tw.probe"] == "from-the-cluster"
    assert {k: recorded.get(k) for k in SPARK_SECRETS} == {k: "*********(redacted)" for k in SPARK_SECRETS}
    texts = {
        "spark-submit.log": (plan_path.parent / "spark-submit.log").read_text(),
        "event log": next(events.iterdir()).read_text(),
        "XCom": json.dumps(planned),
    }
    texts.update({str(f): f.read_text(errors="replace") for f in plan_path.parent.rglob("*") if f.is_file()})
    assert [(where, s) for where, text in texts.items() for s in secrets if s in text] == []
    assert not list(Path("/tmp").glob("tidewater-spark-*/secrets.properties")), "the properties file was removed"


# Run in a process of its own (the JVM must start there: this process's is shared by the tests) by the test below.
_SESSION_SCRIPT = """
import json, sys
from tidewater.config.parse import load_pipeline
from tidewater.spark.session import session
spark = session(load_pipeline(sys.argv[1]), master="local[1]")
keys = json.loads(sys.argv[2])
print("RESULT " + json.dumps({k: spark.conf.get(k, None) for k in keys}), flush=True)
spark.stop()
"""


def test_no_secret_on_the_command_line_of_a_maintenance_or_sql_session(home, tmp_path):
    """The SparkSession of `tidewater maintain` and `tidewater sql` (spark/session.py), started by pyspark in a
    fresh process, on a pipeline with a PostgreSQL catalog's password and the secret Spark settings above, on a Spark whose
    `spark-defaults.conf` sets a probe setting. pyspark puts every setting given before the JVM starts on
    spark-submit's command line (it did, before: the catalog's password and every S3 key were readable with `ps`).
    Expected: the session has every secret and the cluster's default, no process's command line seen while it
    started holds a secret, and the private properties file is removed."""
    import subprocess
    import sys

    conf_dir = tmp_path / "spark-conf"
    conf_dir.mkdir()
    (conf_dir / "spark-defaults.conf").write_text("spark.tw.probe  from-the-cluster\n")
    catalog_secret = "cat-s3cr3t-S7"  # a PostgreSQL catalog's password (the session only opens it when queried)
    path = write_pipeline(
        home,
        catalog={
            "name": "lake",
            "properties": {
                "type": "sql",
                "uri": f"postgresql+psycopg2://tidewater:{catalog_secret}@127.0.0.1:5432/catalog",
                "warehouse": f"file://{home}/warehouse",
            },
        },
        spark={"conf": SPARK_SECRETS},
    )
    keys = ["spark.tw.probe", "spark.sql.catalog.lake.jdbc.password", *SPARK_SECRETS]
    env = {**os.environ, "SPARK_CONF_DIR": str(conf_dir), "TMPDIR": str(tmp_path)}
    env.pop("PYSPARK_SUBMIT_ARGS", None)
    done, seen = _command_lines_while(
        lambda: subprocess.run(
            [sys.executable, "-c", _SESSION_SCRIPT, str(path), json.dumps(keys)], capture_output=True, text=True, timeout=300, env=env
        )
    )
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stdout[-2000:] + done.stderr[-3000:]
    got = json.loads(lines[-1][len("RESULT ") :])
    assert got == {"spark.tw.probe": "from-the-cluster", "spark.sql.catalog.lake.jdbc.password": catalog_secret, **SPARK_SECRETS}
    assert any("SparkSubmit" in c and "--properties-file" in c for c in seen), "the watcher saw the JVM start"
    secrets = [catalog_secret, *SPARK_SECRETS.values()]
    assert [s for s in secrets if any(s in c for c in seen)] == []
    assert not list(tmp_path.glob("tidewater-spark-*")), "the properties file was removed"


def test_the_properties_file_keeps_the_cluster_defaults_and_lets_secrets_win(tmp_path):
    """The merged properties file as java.util.Properties reads it: the defaults file's text as it is (a
    trailing continuation line and no final newline included), then the secrets, which win over a default of
    the same key. This pins the layout (java.util.Properties ends a continued line at the blank line after it);
    the test above shows spark-submit reading such a file, its defaults file ending without a newline."""
    from tidewater.spark.conf import properties_file, remove_properties_file, spark_defaults_file

    (tmp_path / "spark-defaults.conf").write_text("spark.a  1\nspark.shared  cluster\nspark.b  x \\")
    defaults = spark_defaults_file({"SPARK_CONF_DIR": str(tmp_path)})
    assert defaults == tmp_path / "spark-defaults.conf"
    assert spark_defaults_file({"SPARK_CONF_DIR": str(tmp_path / "none")}) is None
    # neither variable set: the conf folder of this environment's pyspark (none there: None; it raised before)
    import pyspark

    shipped = Path(pyspark.__file__).parent / "conf" / "spark-defaults.conf"
    assert spark_defaults_file({}) == (shipped if shipped.is_file() else None)
    path = properties_file({"spark.shared": "secret-wins"}, defaults)
    try:
        assert oct(path.stat().st_mode & 0o777) == "0o600"
        lines = path.read_text().splitlines()
        assert lines[:3] == ["spark.a  1", "spark.shared  cluster", "spark.b  x \\"]
        assert lines[-1] == "spark.shared=secret-wins" and "" in lines[3:-1]
    finally:
        remove_properties_file(path)


def test_connect_import_turns_every_credential_into_an_environment_reference():
    """Bearer tokens in `header.Authorization`, passwords inside URLs and JDBC query strings: none is
    copied into the generated pipeline; each becomes a ${TIDEWATER_...} reference that is reported."""
    from tidewater.interop.connect import convert, to_yaml

    res = convert(
        {
            "name": "c",
            "config": {
                "topics": "t",
                "iceberg.tables": "ns.t",
                "iceberg.catalog.type": "rest",
                "iceberg.catalog.uri": "https://svc:Sup3rS3cret@catalog.example/api",
                "iceberg.catalog.header.Authorization": "Bearer eyJ-T0KEN",
                "iceberg.kafka.sasl.jaas.config": "org.apache.kafka.common.security.plain.PlainLoginModule required "
                'username="u" password="KafkaPw1";',
            },
        }
    )
    text = to_yaml(res)
    for secret in ("Sup3rS3cret", "eyJ-T0KEN", "KafkaPw1"):
        assert secret not in text
    props = res.pipeline["catalog"]["properties"]
    assert props["uri"].startswith("${TIDEWATER_C_") and props["header.Authorization"].startswith("${TIDEWATER_C_")
    assert {k for k, _ in res.env} >= {"iceberg.catalog.uri", "iceberg.catalog.header.Authorization", "iceberg.kafka.sasl.jaas.config"}
    res = convert(
        {
            "name": "c",
            "config": {"topics": "t", "iceberg.tables": "ns.t", "iceberg.catalog.uri": "jdbc:postgresql://db/ice?user=u&password=JdbcPw2"},
        }
    )
    assert "JdbcPw2" not in to_yaml(res) and res.pipeline["catalog"]["properties"]["uri"].startswith("${")


def test_unreachable_broker_gives_one_clear_error_not_a_flood_of_librdkafka_lines(home):
    """`tidewater run` against a port where no broker listens. Expected: exit 75 (transient) with our
    one-line error, and librdkafka's repeated connection failures held back (a handful of lines through
    our logger instead of hundreds on stderr)."""
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    path = write_pipeline(home, kafka={"bootstrap_servers": f"127.0.0.1:{port}"})
    tidewater = str(Path(sys.executable).parent / "tidewater")
    proc = subprocess.run(
        [tidewater, "run", "--pipeline", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "TIDEWATER_HOME": str(home)},
    )
    assert proc.returncode == 75, proc.stderr[-2000:]
    lines = proc.stderr.splitlines()
    assert any(line.startswith("tidewater: transient") or "tidewater: " in line for line in lines[-3:]), lines[-5:]
    refused = [line for line in lines if "Connection refused" in line]
    assert 1 <= len(refused) <= 8, f"{len(refused)} connection-refused lines"


def test_watermarks_of_every_partition_in_one_request_equal_a_consumers_per_partition_answers(broker, topic):
    """`source.kafka.watermarks` asks the leader once for every partition's log start and once for every end (the
    admin client's ListOffsets, read_committed): the same (start, end) as a read_committed consumer's
    get_watermark_offsets per partition once no transaction is open; while one is, the end is the last stable offset
    (the open transaction's first) where the consumer's answer is the high watermark; and a transient error naming the
    topic when it does not exist."""
    from confluent_kafka import Producer
    from confluent_kafka import TopicPartition as KTP

    from tidewater.errors import TransientError
    from tidewater.source.kafka import high_watermarks, new_consumer, watermarks

    settings = {"bootstrap.servers": broker.bootstrap}
    for p, n in ((0, 3), (2, 7)):  # partition 1 stays empty
        produce_to_partition(broker.bootstrap, topic, p, pizza_events(n, seed=p), partitions=3)
    txn = Producer({**settings, "transactional.id": f"wm-{topic}"})
    txn.init_transactions(15)
    txn.begin_transaction()
    txn.produce(topic, b'{"order_id": "open"}', partition=2)
    txn.flush(15)

    def per_partition() -> dict:
        consumer = new_consumer(settings, "wm-test")
        try:
            return {(topic, p): consumer.get_watermark_offsets(KTP(topic, p), timeout=15, cached=False) for p in range(3)}
        finally:
            consumer.close()

    parts = [(topic, p) for p in range(3)]
    while_open = watermarks(settings, parts)
    consumer_view = per_partition()  # a consumer's answer is the high watermark, past an open transaction
    assert {tp: lo for tp, (lo, _) in while_open.items()} == {tp: lo for tp, (lo, _) in consumer_view.items()}
    assert while_open == {(topic, 0): (0, 3), (topic, 1): (0, 0), (topic, 2): (0, 7)}, while_open  # stable: 7
    assert high_watermarks(settings, parts)[(topic, 2)] == 8  # the open transaction's record is at 7
    assert consumer_view[(topic, 2)] in ((0, 7), (0, 8))  # librdkafka's consumer gives either, by timing
    txn.abort_transaction(15)
    deadline = time.monotonic() + 30  # the last stable offset moves once the abort marker is written
    while (after := watermarks(settings, parts))[(topic, 2)] != (0, 9) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert after == per_partition() == {(topic, 0): (0, 3), (topic, 1): (0, 0), (topic, 2): (0, 9)}, after
    with pytest.raises(TransientError) as err:
        watermarks(settings, [(f"{topic}-missing", 0)], timeout=5)
    assert err.value.transient and f"{topic}-missing" in str(err.value)


def test_an_operator_skips_the_record_that_blocks_a_partition(broker, home, topic):
    """dead_letter.policy fail and a poison record at offset 10: every run fails naming it. The operator
    runs `tidewater skip` for [10, 11) with a reason. Expected: the 10 records before it are ingested by
    a batch of their own, the poison record is a dead letter (OperatorSkip, with the reason and who asked),
    the offset moves to 11 and the history records the skip; the next run ingests the rest. A range
    starting before the committed offset is refused naming start_offset (exit 2), a dry run changes
    nothing."""
    import subprocess
    import sys

    from tidewater.errors import BatchWriteError
    from tidewater.steps.lifecycle import run_once

    path = write_pipeline(home, topics=[topic], kafka={"bootstrap_servers": broker.bootstrap}, dead_letter={"policy": "fail"})
    spec = load_pipeline(path)
    good = pizza_events(15, seed=75)
    produce_to_partition(broker.bootstrap, topic, 0, good[:10] + [b'{"order_id": "x", "store_id": '] + good[10:])
    for _ in range(2):
        with pytest.raises(BatchWriteError) as e:
            run_once(path, master="local[2]")
        assert (e.value.partition, e.value.offset) == (0, 10)
    tidewater = str(Path(sys.executable).parent / "tidewater")
    env = {**os.environ, "TIDEWATER_HOME": str(home)}

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [tidewater, "skip", "--pipeline", str(path), "--topic", topic, "--partition", "0", *args],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
        )

    dry = cli("--start-offset", "10", "--end-offset", "11", "--reason", "bad deploy", "--dry-run", "--json")
    assert dry.returncode == 0 and json.loads(dry.stdout)["status"] == "dry-run"
    assert load_table(load_catalog(spec), spec.table.identifier) is None
    done = cli("--start-offset", "10", "--end-offset", "11", "--reason", "bad deploy 4711", "--by", "alice", "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout)
    assert (out["status"], out["ingested_first"], out["dead_letters"]) == ("committed", 10, 1)
    table = load_table(load_catalog(spec), spec.table.identifier)
    assert table.scan().to_arrow().num_rows == 10 and committed_state(table).offsets == {topic: {0: 11}}
    skips = [
        json.loads(s.summary.additional_properties["tidewater.operator-skip"])
        for s in table.snapshots()
        if "tidewater.operator-skip" in s.summary.additional_properties
    ]
    assert skips == [{"topic": topic, "partition": 0, "start": 10, "end": 11, "reason": "bad deploy 4711", "by": "alice"}]
    dlq = load_table(load_catalog(spec), spec.dead_letter_table()).scan().to_arrow().to_pylist()
    assert [(r["offset"], r["error_class"]) for r in dlq] == [(10, "OperatorSkip")]
    assert "alice" in dlq[0]["error_message"] and "bad deploy 4711" in dlq[0]["error_message"]
    assert dlq[0]["value"] == b'{"order_id": "x", "store_id": '
    refused = cli("--start-offset", "3", "--end-offset", "5", "--reason", "x")
    assert refused.returncode == 2 and "start_offset" in refused.stderr
    assert run_once(path, master="local[2]")["records"] == 5
    table = load_table(load_catalog(spec), spec.table.identifier)
    assert table.scan().to_arrow().num_rows == 15 and committed_state(table).offsets == {topic: {0: 16}}


@pytest.mark.parametrize("policy", ["fail", "dead_letter"])
def test_a_null_in_a_not_null_column_fails_the_batch_or_becomes_a_dead_letter(broker, home, topic, policy, caplog):
    """Two records without order_id among ten, through spark-submit. `fail`: the gate stops the batch and
    nothing is committed, and its Data Docs page renders the failed check (no renderer error logged);
    `dead_letter`: they are dead letters (NullInRequiredColumn naming the column), the eight others land,
    read = rows + dead letters."""
    from tidewater.errors import ValidationFailedError
    from tidewater.steps.lifecycle import run_once

    path = write_pipeline(
        home,
        topics=[topic],
        kafka={"bootstrap_servers": broker.bootstrap},
        validation={"not_null": ["order_id"], "not_null_policy": policy},
    )
    spec = load_pipeline(path)
    values = pizza_events(8, seed=76)
    values.insert(3, json.dumps({"store_id": 1}).encode())
    values.insert(7, json.dumps({"order_id": None, "store_id": 2}).encode())
    produce_to_partition(broker.bootstrap, topic, 0, values)
    if policy == "fail":
        with caplog.at_level("ERROR"), pytest.raises(ValidationFailedError):
            run_once(path, master="local[2]")
        table = load_table(load_catalog(spec), spec.table.identifier)
        assert table is None or table.current_snapshot() is None
        assert not [r for r in caplog.records if "unexpected_percent" in r.getMessage()]
        from tidewater.quality.data_docs import site_dir

        pages = list((site_dir(spec) / "validations").glob("**/2*/*/*.html"))
        page = " ".join(pages[0].read_text().split()) if len(pages) == 1 else ""
        assert "2 unexpected values found" in page and "80% not null" in page and "unknown" not in page
        return
    result = run_once(path, master="local[2]")
    assert (result["status"], result["records"], result["dead_letters"]) == ("committed", 10, 2)
    dlq = load_table(load_catalog(spec), spec.dead_letter_table()).scan().to_arrow().sort_by("offset").to_pylist()
    assert [(r["offset"], r["error_class"]) for r in dlq] == [(3, "NullInRequiredColumn"), (7, "NullInRequiredColumn")]
    assert "'order_id'" in dlq[0]["error_message"]
    assert _rows(spec, spec.table.identifier) == 8


def _props(spec) -> dict:
    t = load_table(load_catalog(spec), spec.table.identifier)
    return {} if t is None else {k: v for k, v in t.properties.items() if k.startswith("tidewater.")}


def test_a_rejected_batch_leaves_no_column_and_no_table_behind(broker, home, topic):
    """Through spark-submit. First batch: its records would create the table, one lacks order_id (gate
    `fail`): the gate rejects it and the table it created is dropped. Then a good batch creates it; then a
    batch whose records bring a new field `coupon` is rejected by the gate: `coupon` is removed again, no
    provisional tag remains, and the rejected batch can never be committed afterwards."""
    from tidewater.batch import REVERTED_NAME
    from tidewater.errors import TerminalError, ValidationFailedError
    from tidewater.steps.lifecycle import commit_step, plan_step, run_once, validate_step
    from tidewater.steps.write import load_manifest, run_write_step

    path = write_pipeline(home, topics=[topic], kafka={"bootstrap_servers": broker.bootstrap})
    spec = load_pipeline(path)
    produce_to_partition(broker.bootstrap, topic, 0, [json.dumps({"store_id": 1}).encode()] + pizza_events(3, seed=77))
    with pytest.raises(ValidationFailedError):
        run_once(path, master="local[2]")
    assert load_table(load_catalog(spec), spec.table.identifier) is None, "the table the rejected batch created is gone"

    spec = load_pipeline(write_pipeline(home, topics=[topic], kafka={"bootstrap_servers": broker.bootstrap}, validation={"not_null": []}))
    assert run_once(path.parent / "orders.yaml", master="local[2]")["status"] == "committed"
    spec = load_pipeline(write_pipeline(home, topics=[topic], kafka={"bootstrap_servers": broker.bootstrap}))
    events = [json.loads(v) for v in pizza_events(4, seed=78)]
    values = [json.dumps({**e, "coupon": f"c{i}"}).encode() for i, e in enumerate(events)] + [json.dumps({"coupon": "x"}).encode()]
    produce_to_partition(broker.bootstrap, topic, 0, values)
    plan, plan_path = plan_step(spec)
    manifest = run_write_step(spec, plan_path, master="local[2]")
    assert "coupon" in load_table(load_catalog(spec), spec.table.identifier).schema().column_names
    assert any(k.startswith("tidewater.provisional.") for k in _props(spec)), "tagged while the batch is open"
    with pytest.raises(ValidationFailedError):
        validate_step(spec, plan, manifest)
    table = load_table(load_catalog(spec), spec.table.identifier)
    assert "coupon" not in table.schema().column_names and _props(spec) == {}
    assert (plan_path.parent / REVERTED_NAME).is_file()
    with pytest.raises(TerminalError, match="will never commit"):
        commit_step(spec, plan, load_manifest(plan_path))
    assert committed_state(table).offsets == {topic: {0: 4}}


def test_a_batch_that_died_before_its_commit_has_its_new_columns_undone_then_lands_once(broker, home, topic, monkeypatch):
    """`tidewater run` (spark-submit) dies in the commit step of a batch whose records bring `coupon`.
    Expected: `coupon` exists, tagged as that batch's; the next run undoes it before planning, plans the
    same records anew, adds `coupon` again and confirms it with its commit (no tag left); every record once."""
    import tidewater.steps.lifecycle as steps

    path = write_pipeline(home, topics=[topic], kafka={"bootstrap_servers": broker.bootstrap})
    spec = load_pipeline(path)
    produce_to_partition(broker.bootstrap, topic, 0, pizza_events(3, seed=79))
    assert steps.run_once(path, master="local[2]")["status"] == "committed"
    values = [json.dumps({**json.loads(v), "coupon": "c"}).encode() for v in pizza_events(5, seed=80)]
    produce_to_partition(broker.bootstrap, topic, 0, values)
    real = steps.commit_step

    def die(*_a, **_k):
        raise _Killed()

    monkeypatch.setattr(steps, "commit_step", die)
    with pytest.raises(_Killed):
        steps.run_once(path, master="local[2]")
    monkeypatch.setattr(steps, "commit_step", real)
    assert "coupon" in load_table(load_catalog(spec), spec.table.identifier).schema().column_names
    assert any(k.startswith("tidewater.provisional.") for k in _props(spec))
    result = steps.run_once(path, master="local[2]")
    assert (result["status"], result["records"]) == ("committed", 5)
    table = load_table(load_catalog(spec), spec.table.identifier)
    assert "coupon" in table.schema().column_names and _props(spec) == {}
    rows = table.scan().to_arrow()
    assert rows.num_rows == 8 and sorted(x for x in rows.column("coupon").to_pylist() if x) == ["c"] * 5
    assert committed_state(table).offsets == {topic: {0: 8}}


def test_a_failed_write_step_undoes_the_columns_it_added(broker, home, topic):
    """dead_letter.policy fail, small chunks: the first chunk brings `coupon` (added while writing), a later
    chunk holds a truncated record and the task fails. Expected: the batch fails naming the record, its
    files are gone and `coupon` is removed again."""
    from tidewater.errors import BatchWriteError
    from tidewater.steps.lifecycle import run_once

    path = write_pipeline(
        home, topics=[topic], kafka={"bootstrap_servers": broker.bootstrap}, dead_letter={"policy": "fail"}, batch={"chunk_records": 2}
    )
    spec = load_pipeline(path)
    produce_to_partition(broker.bootstrap, topic, 0, pizza_events(2, seed=81))
    assert run_once(path, master="local[2]")["status"] == "committed"
    values = [json.dumps({**json.loads(v), "coupon": "c"}).encode() for v in pizza_events(4, seed=82)] + [b'{"order_id": ']
    produce_to_partition(broker.bootstrap, topic, 0, values)
    with pytest.raises(BatchWriteError) as e:
        run_once(path, master="local[2]")
    assert e.value.offset == 6
    table = load_table(load_catalog(spec), spec.table.identifier)
    assert "coupon" not in table.schema().column_names and _props(spec) == {}
    assert table.scan().to_arrow().num_rows == 2
