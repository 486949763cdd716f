"""Protobuf values in Confluent's wire format (magic byte 0, a 4-byte big-endian schema id, the message indexes that
pick a message type in the schema's file, the message), with schemas fetched from the schema registry by id
(``schemaType: PROTOBUF``, the files they import by their subject and version) and cached for the task's life.

The framing is read once for the chunk by the registry formats' skeleton (``decode/framed.py``), the message indexes
by confluent-kafka's ``SchemaId`` reader (the deserializer's own), each message by protobuf's
parser into a class built from the registry's descriptors (``message_factory``), and each schema id's messages are
converted to Arrow at once by protarrow (``messages_to_table``, field numbers kept as field metadata). Parsing is the
per-record step, as Avro's is (protobuf has no batch parser); the conversions below are Arrow kernels over columns.

The mapping to a table's columns (what protarrow gives, then made Iceberg's):

- scalars as they are; ``uint32``/``fixed32`` -> long; ``uint64``/``fixed64`` -> decimal(20, 0): every value fits, where
  long would turn values above 2^63 - 1 negative (Kafka Connect's converter does) or make them dead letters;
- ``bytes`` -> binary; enums -> their names (a number the schema does not name: null);
- nested messages -> structs, ``repeated`` -> lists, maps -> maps;
- ``oneof`` -> its fields, each null unless it is the one set, plus a ``<oneof>_case`` column naming the one set;
- proto3 ``optional`` and the wrapper types (``google.protobuf.StringValue``, ...) -> null when absent;
- ``google.protobuf.Timestamp`` -> timestamptz (microseconds: Iceberg v2 has no finer timestamps);
  ``google.protobuf.Duration`` -> long, in microseconds (Iceberg has no duration type);
- every column is nullable (a proto3 scalar that is not set reads as its default, as protobuf defines).

Bad records are dead letters of their own classes: ``NotConfluentProtobuf`` (no magic byte 0 and schema id, or
message indexes that cannot be read), ``UnknownSchemaId``, ``MessageIndexOutOfRange`` and ``InvalidProtobuf``
(truncated or corrupt bytes).
"""

from __future__ import annotations

import io
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tidewater.decode.framed import Part, SchemaGroup, by_schema_id
from tidewater.decode.records import FIELD_NUMBER, BadRecord, DecodeContext
from tidewater.source.kafka import Chunk

NOT_FRAMED = "NotConfluentProtobuf"
INDEX_OUT_OF_RANGE = "MessageIndexOutOfRange"
INVALID = "InvalidProtobuf"

_WRAPPERS = {f"google.protobuf.{n}Value" for n in ("Double", "Float", "Int64", "UInt64", "Int32", "UInt32", "Bool", "String", "Bytes")}
_TIMESTAMP, _DURATION = "google.protobuf.Timestamp", "google.protobuf.Duration"


def message_type(file: Any, indexes: tuple[int, ...]) -> Any:
    """The message descriptor the message indexes pick: the file's top-level message, then nested ones. Raises
    IndexError naming the index out of range."""
    options = file.message_types_by_name
    found, where = None, "the file"
    for index in indexes or (0,):
        messages = list(options.values()) if found is None else list(found.nested_types)
        if not 0 <= index < len(messages):
            raise IndexError(f"message index {index} out of range: {where} has {len(messages)} message(s)")
        found = messages[index]
        where = found.full_name
    return found


def named_type(pool: Any, name: str) -> Any:
    """The message descriptor ``format.message`` names. Raises IndexError when the schema has none by that name."""
    try:
        return pool.FindMessageTypeByName(name)
    except KeyError:
        raise IndexError(f"format.message {name!r} is not a message type of this schema") from None


def decode(chunk: Chunk, ctx: DecodeContext) -> tuple[pa.Table, list[BadRecord]]:
    """Registry entry for ``protobuf`` (see the module docstring)."""
    return decode_protobuf(chunk, ctx.registry, ctx.message, ctx)


def decode_protobuf(
    chunk: Chunk, registry: Any, message: str | None = None, table: DecodeContext | None = None
) -> tuple[pa.Table, list[BadRecord]]:
    """Rows in chunk order and the bad records apart; an unreachable registry fails the batch (``TransientError``:
    nothing is committed, retrying is safe). ``message``: the message type to read (``format.message``) instead of
    the message indexes'. ``table``: the context whose table each message type's columns are checked against (None:
    the messages are envelopes, not rows). The framing and the per-schema-id loop: ``decode/framed.py``."""

    def rows_of(group: SchemaGroup, schema: tuple[Any, Any], bad: dict[int, BadRecord]) -> Iterator[Part]:
        pool, file = schema
        for indexes, items in _by_message_type(group, bad).items():
            try:
                desc = message_type(file, indexes) if message is None else named_type(pool, message)
            except IndexError as e:
                bad.update({i: BadRecord(i, INDEX_OUT_OF_RANGE, f"schema id {group.schema_id}: {e}") for i, _ in items})
                continue
            rows, kept = _messages(desc, items, group.schema_id, bad)
            yield Part(rows, kept, f"schema id {group.schema_id} ({desc.full_name})")

    return by_schema_id(chunk, NOT_FRAMED, registry.protobuf, rows_of, table=table)


def _by_message_type(group: SchemaGroup, bad: dict[int, BadRecord]) -> dict[tuple[int, ...], list[tuple[int, bytes]]]:
    """One schema id's records by the message indexes that open each body (most often the single byte 0: the file's
    first message), each with its message; those whose indexes cannot be read are set apart in ``bad``. The indexes
    are read by confluent-kafka's own reader (``SchemaId._read_index_array``, what its deserializer calls: a
    private method, used rather than a second copy of the varint format)."""
    import struct

    from confluent_kafka.schema_registry.common.serde import SchemaId
    from confluent_kafka.serialization import SerializationError

    out: dict[tuple[int, ...], list[tuple[int, bytes]]] = defaultdict(list)
    for i, body in zip(group.at.tolist(), group.bodies.to_pylist(), strict=True):
        if body[:1] == b"\x00":
            out[(0,)].append((i, body[1:]))
            continue
        buf = io.BytesIO(body)
        try:
            indexes = tuple(SchemaId._read_index_array(buf, zigzag=True))
        except (SerializationError, EOFError, struct.error, ValueError) as e:  # what indexes that are not ones raise
            bad[i] = BadRecord(
                i,
                NOT_FRAMED,
                f"value does not start with magic byte 0, a schema id and message indexes ({type(e).__name__}: {e}); "
                f"its body starts with {body[:16]!r}",
            )
            continue
        out[indexes].append((i, buf.read()))
    return out


def _messages(desc: Any, items: list[tuple[int, bytes]], schema_id: int, bad: dict[int, BadRecord]) -> tuple[pa.Table, np.ndarray]:
    """One message type's records: parsed (the corrupt ones set apart in ``bad``), converted to Arrow by protarrow,
    then to the table's types."""
    import protarrow
    from google.protobuf import message_factory
    from google.protobuf.message import DecodeError

    cls = message_factory.GetMessageClass(desc)
    messages, kept = [], []
    for i, body in items:
        message = cls()
        try:
            message.ParseFromString(body)
        except (DecodeError, RuntimeWarning) as e:
            bad[i] = BadRecord(i, INVALID, f"schema id {schema_id} ({desc.full_name}): {type(e).__name__}: {e}")
            continue
        messages.append(message)
        kept.append(i)
    config = protarrow.ProtarrowConfig(
        enum_type=pa.string(),
        timestamp_type=pa.timestamp("us", "UTC"),
        duration_type=pa.duration("us"),
        list_nullable=True,
        map_nullable=True,
    )
    if not messages:
        return pa.table({}), np.array([], dtype=np.int64)
    table = protarrow.messages_to_table(messages, cls, config)
    struct = pa.StructArray.from_arrays([c.combine_chunks() for c in table.columns], fields=list(table.schema))
    return pa.Table.from_struct_array(_columns(struct, desc)), np.array(kept, dtype=np.int64)


def _columns(arr: pa.StructArray, desc: Any) -> pa.StructArray:
    """A message's struct with the table's types (see the module docstring), its oneof cases added."""
    fields, children = [], []
    for f in desc.fields:
        child = _field(arr.field(f.name), f)
        # a field's identity is its number: the table renames a column whose number a new name takes
        # (table/evolution.py: FIELD_NUMBER)
        fields.append(pa.field(f.name, child.type, metadata={FIELD_NUMBER: str(f.number)}))
        children.append(child)
    for oneof in desc.oneofs:
        if len(oneof.fields) == 1 and oneof.fields[0].has_presence and oneof.name.startswith("_"):
            continue  # proto3 `optional`: a synthetic oneof of one field, whose null says it was not set
        case = pa.nulls(len(arr), pa.string())
        for member in reversed(oneof.fields):
            case = pc.if_else(pc.is_valid(arr.field(member.name)), pa.scalar(member.name), case)
        fields.append(pa.field(f"{oneof.name}_case", pa.string()))
        children.append(case)
    return pa.StructArray.from_arrays(children, fields=fields, mask=pc.invert(arr.is_valid()))


def _field(arr: pa.Array, f: Any) -> pa.Array:
    if _repeated(f) and f.message_type is not None and f.message_type.GetOptions().map_entry:
        value = f.message_type.fields_by_name["value"]
        keys, items = arr.keys, _value(arr.items, value)
        return pa.MapArray.from_arrays(arr.offsets, keys, items, mask=pc.invert(arr.is_valid()))
    if _repeated(f):
        values = _value(arr.values, f)
        return pa.ListArray.from_arrays(arr.offsets, values, mask=pc.invert(arr.is_valid()))
    return _value(arr, f)


def _repeated(f: Any) -> bool:
    return bool(f.is_repeated)  # protobuf 7 has no ``label``


def _value(arr: pa.Array, f: Any) -> pa.Array:
    """One (not repeated) value of field ``f`` with the table's type."""
    if f.message_type is not None:
        name = f.message_type.full_name
        if name in (_TIMESTAMP, _DURATION):
            micros = pc.add(
                pc.multiply(arr.field("seconds"), 1_000_000), pc.divide(arr.field("nanos").cast(pa.int64()), 1000)
            )  # integer division: microseconds
            micros = pc.if_else(arr.is_valid(), micros, pa.scalar(None, pa.int64()))
            return micros.cast(pa.timestamp("us", "UTC")) if name == _TIMESTAMP else micros
        if name in _WRAPPERS:
            inner = _value(arr.field("value"), f.message_type.fields_by_name["value"])
            return pc.if_else(arr.is_valid(), inner, pa.scalar(None, inner.type))
        return _columns(arr, f.message_type)
    if f.type in (f.TYPE_UINT64, f.TYPE_FIXED64):
        return arr.cast(pa.decimal128(20, 0))
    if f.type in (f.TYPE_UINT32, f.TYPE_FIXED32):
        return arr.cast(pa.int64())
    return arr
