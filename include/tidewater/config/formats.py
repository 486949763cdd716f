"""The value formats: name -> the module that decodes it (part of the configuration's grammar: `format.value`;
pure, read by configuration checks at DAG parse time and by the decoders' registry, `decode/registry.py`).

A new format is one new module in ``decode/`` with ``decode(chunk, ctx)`` plus one line here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ValueFormat:
    module: str  # holds ``decode(chunk, ctx)``
    structured: bool = True  # rows with fields: shaping and date-time conversions apply
    skipped_classes: tuple[str, ...] = ()  # bad-record classes that are skipped by design, not dead letters
    registry: bool = False  # writer schemas come from the schema registry (format.registry_url)
    op_column: str | None = None  # change events: the column holding each record's operation
    control_classes: tuple[str, ...] = ()  # the connector's own events (schema changes, heartbeats): format.skip_control_events


_DEBEZIUM_CONTROL = ("SchemaChange", "Heartbeat")  # decode/debezium.py: control_events

FORMATS: dict[str, ValueFormat] = {
    "json": ValueFormat("tidewater.decode.json"),
    "connect_json": ValueFormat("tidewater.decode.connect"),
    "debezium": ValueFormat(
        "tidewater.decode.debezium", skipped_classes=("Tombstone",), op_column="_op", control_classes=_DEBEZIUM_CONTROL
    ),
    "debezium_avro": ValueFormat(
        "tidewater.decode.debezium_avro", skipped_classes=("Tombstone",), registry=True, op_column="_op", control_classes=_DEBEZIUM_CONTROL
    ),
    "avro": ValueFormat("tidewater.decode.avro", registry=True),
    "json_schema": ValueFormat("tidewater.decode.json_schema", registry=True),
    "protobuf": ValueFormat("tidewater.decode.protobuf", registry=True),
    "debezium_protobuf": ValueFormat(
        "tidewater.decode.debezium_protobuf",
        skipped_classes=("Tombstone",),
        registry=True,
        op_column="_op",
        control_classes=_DEBEZIUM_CONTROL,
    ),
    "string": ValueFormat("tidewater.decode.raw", structured=False),
    "bytes": ValueFormat("tidewater.decode.raw", structured=False),
}

# Debezium's change events, whatever they are encoded in: ids from message keys, {source.<field>} routing
DEBEZIUM_FORMATS = tuple(name for name, f in FORMATS.items() if f.control_classes == _DEBEZIUM_CONTROL)
