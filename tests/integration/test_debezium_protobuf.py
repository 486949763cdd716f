"""``format.value: debezium_protobuf``: Debezium change events framed by confluent-kafka's real ``ProtobufSerializer``
(the envelope as Confluent's Protobuf converter writes it: ``before``/``after`` messages of the row's type, nullable
columns as wrapper types), through the real broker, task code, gate and catalog. The table equals a reference model of
the source after every batch, under a retried commit and a killed batch, and ``audit --deep`` is clean. The schemas
are registered in a real registry (the session's Apicurio Registry) by the real serializer."""

from __future__ import annotations

import subprocess
import sys
from collections import defaultdict

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, wrappers_pb2

from tests.conftest import REPO, ingest_inline, produce_to_partition, stage_inline, write_pipeline
from tidewater.audit.pipeline import audit
from tidewater.batch import PLAN_NAME, BatchManifest, BatchPlan, batch_dir, manifest_path, read_json
from tidewater.config.parse import load_pipeline
from tidewater.errors import OffsetsMovedError
from tidewater.steps.lifecycle import commit_step, validate_step
from tidewater.table.catalog import load_catalog, load_table
from tidewater.table.summary import committed_state
from tidewater_dev.changes import apply, change_stream

pytestmark = [pytest.mark.integration]

PARTITIONS = 3
F = descriptor_pb2.FieldDescriptorProto


def _envelope_class():
    """``dbserver.public.prices.Envelope`` as the converter would register it (a pool of its own)."""
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(wrappers_pb2.DESCRIPTOR.serialized_pb)
    fd = descriptor_pb2.FileDescriptorProto(
        name="prices/envelope.proto", package="dbserver.public.prices", syntax="proto3", dependency=["google/protobuf/wrappers.proto"]
    )
    env = fd.message_type.add(name="Envelope")
    value = env.nested_type.add(name="Value")
    value.field.add(name="id", number=1, type=F.TYPE_INT32, label=F.LABEL_OPTIONAL)
    value.field.add(name="item", number=2, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL, type_name=".google.protobuf.StringValue")
    value.field.add(name="price", number=3, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL, type_name=".google.protobuf.DoubleValue")
    source = env.nested_type.add(name="Source")
    source.field.add(name="db", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    source.field.add(name="table", number=2, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    kind = ".dbserver.public.prices.Envelope"
    env.field.add(name="before", number=1, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL, type_name=f"{kind}.Value")
    env.field.add(name="after", number=2, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL, type_name=f"{kind}.Value")
    env.field.add(name="source", number=3, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL, type_name=f"{kind}.Source")
    env.field.add(name="op", number=4, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    env.field.add(name="ts_ms", number=5, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    pool.Add(fd)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("dbserver.public.prices.Envelope"))


def _image(cls, row: dict | None):
    if row is None:
        return None
    value = cls.Value(id=row["id"])
    if row.get("item") is not None:
        value.item.value = row["item"]
    if row.get("price") is not None:
        value.price.value = row["price"]
    return value


def _produce(broker, topic, url, model, changes, produced: dict[int, int]) -> None:
    """``changes`` as Debezium Protobuf envelopes (a delete followed by its tombstone), each key to partition
    key % PARTITIONS in order, as Debezium partitions by key; ``produced`` counts the records per partition."""
    cls = _envelope_class()
    ser = ProtobufSerializer(cls, SchemaRegistryClient({"url": url}), {"use.deprecated.format": False})
    by_part: dict[int, list] = defaultdict(list)
    model = dict(model)
    for c in changes:
        before = model.get(c.id) if c.op != "insert" else None
        before = before or ({"id": c.id} if c.op != "insert" else None)
        after = None if c.op == "delete" else c.row()
        env = cls(
            op={"insert": "c", "update": "u", "delete": "d"}[c.op], ts_ms=1_700_000_000_000, source=cls.Source(db="shop", table="prices")
        )
        for name, img in (("before", _image(cls, before)), ("after", _image(cls, after))):
            if img is not None:
                getattr(env, name).CopyFrom(img)
        by_part[c.id % PARTITIONS].append(ser(env, SerializationContext(topic, MessageField.VALUE)))
        if c.op == "delete":
            by_part[c.id % PARTITIONS].append(None)
            model.pop(c.id, None)
        else:
            model[c.id] = c.row()
    for p, values in sorted(by_part.items()):
        produce_to_partition(broker.bootstrap, topic, p, values, partitions=PARTITIONS)
        produced[p] = produced.get(p, 0) + len(values)


def _rows(spec) -> dict[int, dict]:
    table = load_table(load_catalog(spec), spec.table.identifier)
    t = table.scan(selected_fields=("id", "item", "price")).to_arrow().to_pylist()
    out = {r["id"]: r for r in t}
    assert len(out) == len(t), "a key is in the table twice"
    return out


def _spec(home, broker, topic, url):
    return load_pipeline(
        write_pipeline(
            home,
            name="prices",
            topics=[topic],
            kafka={"bootstrap_servers": broker.bootstrap},
            validation={"not_null": ["id"]},
            format={"value": "debezium_protobuf", "registry_url": url},
            table={"identifier": "rpc.prices", "id_columns": ["id"], "upsert": True},
        )
    )


STAGE_VALIDATE_THEN_HANG = """
import sys, time
from tests.conftest import stage_inline
from tidewater.config.parse import load_pipeline
from tidewater.steps.lifecycle import validate_step
spec = load_pipeline(sys.argv[1])
plan, manifest = stage_inline(spec)
validate_step(spec, plan, manifest)
print(plan.batch_id, flush=True)
time.sleep(600)
"""


def _killed_after_validate(spec):
    """A batch planned, written and validated by a process that is then SIGKILLed before its commit; its plan and
    manifest as the killed process staged them."""
    proc = subprocess.Popen(
        [sys.executable, "-c", STAGE_VALIDATE_THEN_HANG, str(spec.source_path)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )  # the test's TIDEWATER_HOME
    try:
        assert proc.stdout is not None
        batch_id = proc.stdout.readline().strip()
        assert batch_id, "the batch's process ended before it was written and validated"
    finally:
        proc.kill()
        proc.wait()
    plan_path = batch_dir(spec.staging_dir(), spec.name, batch_id) / PLAN_NAME
    return BatchPlan.from_json(read_json(plan_path)), BatchManifest.from_json(read_json(manifest_path(plan_path)))


def test_a_debezium_protobuf_stream_equals_its_source_after_every_batch_a_retried_commit_and_a_killed_batch(
    broker, home, topic, registry_url
):
    spec = _spec(home, broker, topic, registry_url)
    model: dict[int, dict] = {}
    produced: dict[int, int] = {}
    for b in range(3):
        changes = change_stream(model, 120, keys=40, seed=60 + b)
        _produce(broker, topic, registry_url, model, changes, produced)
        plan, manifest = stage_inline(spec)
        validate_step(spec, plan, manifest)
        first = commit_step(spec, plan, manifest)
        again = commit_step(spec, plan, manifest)  # Airflow's retry after a commit that landed
        assert (first.status, again.status) == ("committed", "already-committed")
        model = apply(model, changes)
        assert _rows(spec) == {k: {"id": k, **{c: v.get(c) for c in ("item", "price")}} for k, v in model.items()}, b

    changes = change_stream(model, 120, keys=40, seed=70)
    _produce(broker, topic, registry_url, model, changes, produced)
    dead_plan, dead_manifest = _killed_after_validate(spec)  # written and validated, its process SIGKILLed
    assert ingest_inline(spec).status == "committed"  # the next run plans the same range anew
    with pytest.raises(OffsetsMovedError):
        commit_step(spec, dead_plan, dead_manifest)
    model = apply(model, changes)
    assert _rows(spec) == {k: {"id": k, **{c: v.get(c) for c in ("item", "price")}} for k, v in model.items()}
    table = load_table(load_catalog(spec), spec.table.identifier)
    assert committed_state(table).offsets == {topic: produced}
    assert sum(1 for s in table.snapshots() if s.summary.additional_properties.get("tidewater.batch-id") == dead_plan.batch_id) == 0
    report = audit(spec, deep=True)
    assert report.clean, [f.text() for f in report.findings if f.severity == "error"]
