"""Exactly-once in each registry format on the real schema registry (the session's Apicurio Registry, through
confluent-kafka's serializers and client): per format, a batch whose commit step is retried after it landed, a schema
version that adds a column, and a batch whose process is SIGKILLed after its write and validation (the next run plans
the range anew; the killed batch's commit is refused). Rows are counted by order id, offsets and the deep audit
checked. The Debezium Protobuf change stream has the same test against a reference model
(tests/integration/test_debezium_protobuf.py)."""

from __future__ import annotations

import pytest

from tests.conftest import ingest_inline, produce_to_partition, registered_avro, stage_inline, table_of, write_pipeline
from tests.integration.test_debezium_protobuf import _killed_after_validate
from tidewater.audit.pipeline import audit
from tidewater.config.parse import load_pipeline
from tidewater.errors import OffsetsMovedError
from tidewater.steps.lifecycle import commit_step, validate_step
from tidewater.table.summary import committed_state

pytestmark = [pytest.mark.integration]


def _values(fmt: str, url: str, topic: str, version: int, ids: range) -> list[bytes]:
    """Orders ``ids`` serialized in ``fmt`` under schema version ``version`` (2 adds ``coupon``), registered in the
    registry at ``url`` under the topic's value subject."""
    if fmt == "avro":
        from tests.integration.test_avro import V1, V2, framed

        schema = V1 if version == 1 else V2
        sid = registered_avro(url, f"{topic}-value", {version: schema})[version]
        extra = {"coupon": "C"} if version == 2 else {}
        return [framed(sid, {"order_id": f"o{i}", "qty": i, "at": 1_700_000_000_000 + i, **extra}, schema) for i in ids]
    if fmt == "json_schema":
        from tests.integration.test_json_schema import V1, V2, _serialize

        extra = {"coupon": "C"} if version == 2 else {}
        docs = [{"order_id": f"o{i}", "qty": i, "at": "2026-01-02T03:04:05Z", **extra} for i in ids]
        return _serialize(url, V1 if version == 1 else V2, docs, topic)
    from tests.integration.test_protobuf import _event_class, _serialize

    cls = _event_class(version)
    messages = []
    for i in ids:
        m = cls(order_id=f"o{i}", qty=i)
        if version == 2:
            m.coupon.value = "C"
        messages.append(m)
    return _serialize(url, cls, messages, topic)


def _order_ids(path) -> list[str]:
    return sorted(table_of(path).scan(selected_fields=("order_id",)).to_arrow().column("order_id").to_pylist())


@pytest.mark.parametrize("fmt", ["avro", "json_schema", "protobuf"])
def test_a_retried_commit_a_schema_change_and_a_killed_batch_land_each_record_once(broker, home, topic, registry_url, fmt):
    path = write_pipeline(
        home,
        topics=[topic],
        kafka={"bootstrap_servers": broker.bootstrap},
        format={"value": fmt, "registry_url": registry_url},  # Kafka metadata columns: audit --deep
        validation={"not_null": ["order_id"]},
    )
    spec = load_pipeline(path)
    produce_to_partition(broker.bootstrap, topic, 0, _values(fmt, registry_url, topic, 1, range(20)))
    plan, manifest = stage_inline(spec)
    validate_step(spec, plan, manifest)
    first, again = commit_step(spec, plan, manifest), commit_step(spec, plan, manifest)  # Airflow's retry
    assert (first.status, again.status, first.rows) == ("committed", "already-committed", 20)

    produce_to_partition(broker.bootstrap, topic, 0, _values(fmt, registry_url, topic, 2, range(20, 30)))
    assert ingest_inline(spec).records == 10
    assert "coupon" in table_of(path).schema().column_names

    produce_to_partition(broker.bootstrap, topic, 0, _values(fmt, registry_url, topic, 2, range(30, 45)))
    dead_plan, dead_manifest = _killed_after_validate(spec)  # written and validated, its process SIGKILLed
    assert ingest_inline(spec).records == 15  # the next run plans the same range anew
    with pytest.raises(OffsetsMovedError):
        commit_step(spec, dead_plan, dead_manifest)

    assert _order_ids(path) == sorted(f"o{i}" for i in range(45))
    table = table_of(path)
    assert committed_state(table).offsets == {topic: {0: 45}}
    assert not any(s.summary.additional_properties.get("tidewater.batch-id") == dead_plan.batch_id for s in table.snapshots())
    report = audit(spec, deep=True)
    assert report.clean, [f.text() for f in report.findings if f.severity == "error"]
