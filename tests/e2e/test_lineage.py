"""OpenLineage events of real DAG runs (`airflow dags test`), written by the OpenLineage provider's file
transport and read back field by field: ingest (with dead letters), replay, maintenance, audit, and a batch
the quality gate refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import produce_to_partition, table_of, write_pipeline
from tests.e2e.conftest import through_spark_connect
from tests.e2e.test_ingest_dag import dags_test
from tidewater.table.summary import committed_state
from tidewater_dev.sample_data import pizza_events

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _last(events: list[dict], job: str, kind: str) -> dict:
    found = [e for e in events if e["job"]["name"] == job and e["eventType"] == kind]
    assert found, f"no {kind} event of {job} in {sorted({(e['job']['name'], e['eventType']) for e in events})}"
    return found[-1]


def _output(event: dict, ident: str) -> dict:
    """The event's output dataset whose Iceberg identifier (symlinks facet) is ``ident``."""
    for d in event["outputs"]:
        if any(i["name"] == ident for i in d["facets"]["symlinks"]["identifiers"]):
            return d
    raise AssertionError(f"no output {ident} in {[d['name'] for d in event['outputs']]}")


def test_ingest_replay_maintenance_audit_and_a_refused_batch_emit_openlineage_events(broker, topic, airflow_env, tmp_path, spark_connect):
    """One batch of 120 pizza events and 2 records that are not JSON, through ingest_orders: the commit task's
    COMPLETE event has the topic as input (kafka://<bootstrap>, the batch's offset ranges), the table as output
    (its schema, the snapshot as version, rows/bytes/files equal to the snapshot's added rows, size and files,
    the gate's checks as assertions), the dead-letter table as a second output with 2 rows, and the batch's
    counts (read 122 = 120 rows + 2 dead letters). A replace replay's commit names its range and mode;
    compaction and the audit name the table; the audit's verdict is clean. A suite that fails the next batch:
    the validate task's FAIL event carries the failed check and the gate's verdict. No setting's value appears.
    The write tasks run on the session's Spark Connect server."""
    events_file = tmp_path / "openlineage.jsonl"
    env = {
        **through_spark_connect(airflow_env, spark_connect),
        "AIRFLOW__OPENLINEAGE__NAMESPACE": "tidewater-test",
        "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps({"type": "file", "log_file_path": str(events_file), "append": True}),
    }
    pipelines = Path(env["TIDEWATER_PIPELINES_DIR"])
    overrides = dict(
        topics=[topic],
        kafka={"bootstrap_servers": broker.bootstrap},
        format={"metadata": "prefixed"},
        maintenance={"rewrite_data_files": {"min_input_files": 1}},
    )
    pipeline = write_pipeline(pipelines, **overrides)
    values = pizza_events(120, seed=300)
    produce_to_partition(broker.bootstrap, topic, 0, values[:60] + [b"not json", b'{"order_id": '], partitions=2)
    produce_to_partition(broker.bootstrap, topic, 1, values[60:], partitions=2)

    dags_test(env, "ingest_orders")
    table = table_of(pipeline)
    snap = table.current_snapshot()
    commit = _last(_events(events_file), "ingest_orders.commit", "COMPLETE")
    assert commit["job"]["namespace"] == "tidewater-test"
    (source,) = commit["inputs"]
    assert (source["namespace"], source["name"]) == (f"kafka://{broker.bootstrap}", topic)
    assert source["inputFacets"]["tidewater_offsetRanges"]["ranges"] == [
        {"partition": 0, "start": 0, "end": 62},
        {"partition": 1, "start": 0, "end": 60},
    ]
    assert committed_state(table).offsets == {topic: {0: 62, 1: 60}}
    out = _output(commit, "rpc.orders")
    assert out["facets"]["symlinks"]["identifiers"] == [{"namespace": "iceberg://tidewater", "name": "rpc.orders", "type": "TABLE"}]
    assert out["namespace"] == "file" and table.location().endswith(out["name"])
    assert out["facets"]["catalog"]["framework"] == "iceberg" and out["facets"]["catalog"]["name"] == "tidewater"
    assert out["facets"]["version"]["datasetVersion"] == str(snap.snapshot_id)
    fields = {f["name"]: f["type"] for f in out["facets"]["schema"]["fields"]}
    assert set(fields) == {f.name for f in table.schema().fields} and "order_id" in fields
    summary = snap.summary.additional_properties
    assert out["outputFacets"]["outputStatistics"] == {
        **{k: v for k, v in out["outputFacets"]["outputStatistics"].items() if k.startswith("_")},
        "rowCount": 120,
        "size": int(summary["added-files-size"]),
        "fileCount": int(summary["added-data-files"]),
    }
    assertions = out["facets"]["dataQualityAssertions"]["assertions"]
    assert all(a["success"] for a in assertions)
    assert {"assertion": "expect_column_values_to_not_be_null", "column": "order_id"}.items() <= next(
        a for a in assertions if a["assertion"] == "expect_column_values_to_not_be_null"
    ).items()
    dead = _output(commit, "rpc.orders_dead_letters")
    assert dead["outputFacets"]["outputStatistics"]["rowCount"] == 2
    batch = commit["run"]["facets"]["tidewater_batch"]
    assert {k: batch[k] for k in ("mode", "pipeline", "recordsRead", "rows", "deadLetters", "skipped", "gate", "status", "snapshotId")} == {
        "mode": "ingest",
        "pipeline": "orders",
        "recordsRead": 122,
        "rows": 120,
        "deadLetters": 2,
        "skipped": 0,
        "gate": "passed",
        "status": "committed",
        "snapshotId": str(snap.snapshot_id),
    }
    assert batch["_schemaURL"].startswith("urn:tidewater:openlineage:facet:")

    dags_test(
        env, "replay_orders", {"topic": topic, "partitions": [1], "start_offset": 10, "end_offset": 30, "mode": "replace", "dry_run": False}
    )
    replay = _last(_events(events_file), "replay_orders.commit", "COMPLETE")
    assert replay["inputs"][0]["inputFacets"]["tidewater_offsetRanges"]["ranges"] == [{"partition": 1, "start": 10, "end": 30}]
    assert replay["run"]["facets"]["tidewater_batch"]["mode"] == "replace"
    assert replay["run"]["facets"]["tidewater_batch"]["rows"] == 20
    assert _output(replay, "rpc.orders")["outputFacets"]["outputStatistics"]["rowCount"] == 20

    dags_test(env, "maintain_orders")
    events = _events(events_file)
    compaction = next(
        e
        for e in events
        if e["job"]["name"].startswith("maintain_orders.")
        and e["eventType"] == "COMPLETE"
        and e["run"]["facets"].get("tidewater_maintenance", {}).get("action") == "rewrite_data_files"
    )
    assert compaction["run"]["facets"]["tidewater_maintenance"]["table"] == "rpc.orders"
    version = int(_output(compaction, "rpc.orders")["facets"]["version"]["datasetVersion"])
    assert table_of(pipeline).snapshot_by_id(version).summary.operation.value == "replace"  # the compaction's own

    dags_test(env, "audit_orders")
    audit = _last(_events(events_file), "audit_orders.audit", "COMPLETE")
    verdict = audit["run"]["facets"]["tidewater_audit"]
    assert verdict["clean"] is True and verdict["errors"] == 0 and verdict["batches"] >= 1
    checks = audit["inputs"][0]["facets"]["dataQualityAssertions"]["assertions"]
    assert {a["assertion"] for a in checks} >= {"tidewater_audit_coverage", "tidewater_audit_accounting"}
    assert all(a["success"] for a in checks)

    (pipelines / "strict.json").write_text(
        json.dumps(
            {
                "expectations": [
                    {"type": "expect_column_values_to_be_between", "kwargs": {"column": "store_id", "min_value": 1, "max_value": 5}}
                ]
            }
        )
    )
    write_pipeline(pipelines, **overrides, validation={"not_null": ["order_id"], "suite": str(pipelines / "strict.json")})
    produce_to_partition(broker.bootstrap, topic, 0, pizza_events(40, seed=301), partitions=2)
    dags_test(env, "ingest_orders", expect="failed")
    failed = _last(_events(events_file), "ingest_orders.validate", "FAIL")
    assert failed["run"]["facets"]["tidewater_batch"]["gate"] == "failed"
    assert failed["run"]["facets"]["tidewater_batch"]["recordsRead"] == 40
    assert "errorMessage" in failed["run"]["facets"]
    refused = _output(failed, "rpc.orders")["facets"]["dataQualityAssertions"]["assertions"]
    between = next(a for a in refused if a["assertion"] == "expect_column_values_to_be_between")
    assert between["success"] is False and between["column"] == "store_id"
    assert committed_state(table_of(pipeline)).offsets == {topic: {0: 62, 1: 60}}

    text = events_file.read_text()
    assert "sqlite:///" not in text and "bootstrap.servers" not in text
