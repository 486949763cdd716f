"""The ``protobuf`` value format's decoder on chunks framed by confluent-kafka's real ``ProtobufSerializer`` against the
schema-registry stand-in (``LocalSchemaRegistry``: the unit tests start no JVM; the serializer, the registry client
and the reference resolver are the real ones; the integration tests run the same schemas on a real registry). The
message classes are built from descriptors (``descriptor_pb2``), as ``protoc`` would compile them from
``shop/orders.proto`` importing ``shop/money.proto`` and the well-known types."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pyarrow as pa
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from tidewater.decode.protobuf import decode
from tidewater.decode.records import DecodeContext
from tidewater.decode.registry_client import RegistryClient
from tidewater.source.kafka import Chunk

F = descriptor_pb2.FieldDescriptorProto


def _field(m, name, number, kind, *, label=F.LABEL_OPTIONAL, type_name=None, oneof=None, optional=False):
    f = m.field.add(name=name, number=number, type=kind, label=label)
    if type_name:
        f.type_name = type_name
    if oneof is not None:
        f.oneof_index = oneof
    if optional:
        f.proto3_optional = True


def _build() -> dict:
    """``shop/money.proto`` (Money) and ``shop/orders.proto`` (Order, with a nested Line and a map; Refund second),
    added to protobuf's default pool once, as generated code would be."""
    pool = descriptor_pool.Default()
    try:
        pool.FindFileByName("shop/orders.proto")
    except KeyError:
        money = descriptor_pb2.FileDescriptorProto(name="shop/money.proto", package="shop", syntax="proto3")
        m = money.message_type.add(name="Money")
        _field(m, "units", 1, F.TYPE_INT64)
        _field(m, "currency", 2, F.TYPE_STRING)
        pool.Add(money)
        fd = descriptor_pb2.FileDescriptorProto(
            name="shop/orders.proto",
            package="shop",
            syntax="proto3",
            dependency=[
                "shop/money.proto",
                "google/protobuf/timestamp.proto",
                "google/protobuf/duration.proto",
                "google/protobuf/wrappers.proto",
            ],
        )
        status = fd.enum_type.add(name="Status")
        status.value.add(name="NEW", number=0)
        status.value.add(name="PAID", number=1)
        o = fd.message_type.add(name="Order")
        line = o.nested_type.add(name="Line")
        _field(line, "sku", 1, F.TYPE_STRING)
        _field(line, "qty", 2, F.TYPE_UINT32)
        entry = o.nested_type.add(name="AttrsEntry")
        entry.options.map_entry = True
        _field(entry, "key", 1, F.TYPE_STRING)
        _field(entry, "value", 2, F.TYPE_STRING)
        o.oneof_decl.add(name="payment")
        o.oneof_decl.add(name="_coupon")
        for args in [
            ("id", 1, F.TYPE_STRING),
            ("big", 2, F.TYPE_UINT64),
            ("status", 3, F.TYPE_ENUM, ".shop.Status"),
            ("at", 4, F.TYPE_MESSAGE, ".google.protobuf.Timestamp"),
            ("wait", 5, F.TYPE_MESSAGE, ".google.protobuf.Duration"),
            ("note", 6, F.TYPE_MESSAGE, ".google.protobuf.StringValue"),
            ("total", 7, F.TYPE_MESSAGE, ".shop.Money"),
            ("raw", 12, F.TYPE_BYTES),
        ]:
            _field(o, *args[:3], type_name=args[3] if len(args) > 3 else None)
        _field(o, "card", 8, F.TYPE_STRING, oneof=0)
        _field(o, "cash", 9, F.TYPE_INT64, oneof=0)
        _field(o, "coupon", 10, F.TYPE_STRING, oneof=1, optional=True)
        _field(o, "lines", 11, F.TYPE_MESSAGE, label=F.LABEL_REPEATED, type_name=".shop.Order.Line")
        _field(o, "attrs", 13, F.TYPE_MESSAGE, label=F.LABEL_REPEATED, type_name=".shop.Order.AttrsEntry")
        r = fd.message_type.add(name="Refund")
        _field(r, "order_id", 1, F.TYPE_STRING)
        pool.Add(fd)
    return {n: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"shop.{n}")) for n in ("Order", "Refund")}


def _serialize(url: str, cls, messages: list) -> list[bytes]:
    ser = ProtobufSerializer(cls, SchemaRegistryClient({"url": url}), {"use.deprecated.format": False})
    return [ser(m, SerializationContext("orders", MessageField.VALUE)) for m in messages]


def _decode(url: str, values: list):
    chunk = Chunk("orders", 0, values, list(range(len(values))), [0] * len(values))
    return decode(chunk, DecodeContext("protobuf", registry=RegistryClient(url)))


def test_messages_land_with_iceberg_types_and_the_imported_file_comes_from_the_registry(registry_url):
    classes = _build()
    order = classes["Order"](
        id="a",
        big=2**64 - 1,
        status=1,
        card="visa",
        coupon="X",
        raw=b"\x01",
        lines=[classes["Order"].Line(sku="s", qty=4_000_000_000)],
        attrs={"k": "v"},
    )
    order.at.FromSeconds(1_700_000_000)
    order.at.nanos = 123_456_789
    order.wait.FromSeconds(90)
    order.note.value = "hi"
    order.total.units, order.total.currency = 12, "EUR"
    plain = classes["Order"](id="b", cash=5)
    rows, bad = _decode(registry_url, _serialize(registry_url, classes["Order"], [order, plain]))
    assert bad == []
    types = {f.name: f.type for f in rows.schema}
    assert types["big"] == pa.decimal128(20, 0) and types["status"] == pa.string()
    assert types["at"] == pa.timestamp("us", "UTC") and types["wait"] == pa.int64() and types["note"] == pa.string()
    assert types["lines"] == pa.list_(pa.struct([("sku", pa.string()), ("qty", pa.int64())]))  # uint32: long
    assert types["attrs"] == pa.map_(pa.string(), pa.string())
    assert types["total"] == pa.struct([("units", pa.int64()), ("currency", pa.string())])
    assert all(f.nullable for f in rows.schema)
    a, b = rows.to_pylist()
    assert a["big"] == Decimal(2**64 - 1) and a["status"] == "PAID"
    assert a["at"] == dt.datetime(2023, 11, 14, 22, 13, 20, 123_456, tzinfo=dt.timezone.utc)
    assert a["wait"] == 90_000_000 and a["note"] == "hi" and b["note"] is None and b["at"] is None
    assert (a["card"], a["cash"], a["payment_case"]) == ("visa", None, "card")
    assert (b["card"], b["cash"], b["payment_case"]) == (None, 5, "cash")
    assert (a["coupon"], b["coupon"]) == ("X", None) and "_coupon_case" not in rows.column_names
    assert a["lines"] == [{"sku": "s", "qty": 4_000_000_000}] and dict(a["attrs"]) == {"k": "v"}
    assert a["total"] == {"units": 12, "currency": "EUR"} and b["total"] is None and a["raw"] == b"\x01"


def test_the_message_indexes_pick_the_message_type(registry_url):
    classes = _build()
    rows, bad = _decode(registry_url, _serialize(registry_url, classes["Refund"], [classes["Refund"](order_id="a")]))
    assert bad == [] and rows.column_names == ["order_id"] and rows.to_pylist() == [{"order_id": "a"}]


def test_bad_frames_unknown_ids_indexes_out_of_range_and_corrupt_bytes_are_bad_records_of_their_own_classes(registry_url):
    classes = _build()
    good = _serialize(registry_url, classes["Order"], [classes["Order"](id="a"), classes["Order"](id="z")])
    head = good[0][:5]  # magic byte and the schema id the serializer registered
    values = [
        good[0],
        b'{"id": "json"}',  # no framing
        b"\x00" + (99).to_bytes(4, "big") + b"\x00" + b"\x0a\x01a",  # an id the registry does not know
        head + b"\x02\x0a" + b"\x0a\x01a",  # message indexes [5]: the file has two messages
        head + b"\x00" + b"\x0a\x05ab",  # a string field cut short
        None,
        good[1],
    ]
    rows, bad = _decode(registry_url, values)
    assert [r["id"] for r in rows.to_pylist()] == ["a", "z"]
    assert [(b.index, b.error_class) for b in bad] == [
        (1, "NotConfluentProtobuf"),
        (2, "UnknownSchemaId"),
        (3, "MessageIndexOutOfRange"),
        (4, "InvalidProtobuf"),
        (5, "Tombstone"),
    ]
    assert "message index 5 out of range" in bad[2].message


def test_a_message_type_that_gives_a_table_column_another_type_is_refused_naming_the_field_id_and_table(registry_url):
    """Against the table's columns (``ctx.explicit``): widenings pass (the table's int for a long), a type the column
    cannot take stops the batch."""
    from tidewater.errors import TerminalError

    classes = _build()
    values = _serialize(registry_url, classes["Refund"], [classes["Refund"](order_id="a")])
    ctx = DecodeContext(
        "protobuf", explicit=pa.schema([("order_id", pa.int64())]), registry=RegistryClient(registry_url), table="db.refunds"
    )
    chunk = Chunk("orders", 0, values, [0], [0])
    with pytest.raises(
        TerminalError,
        match=r"field order_id: schema id \d+ \(shop.Refund\) gives it type string, "
        r"table db.refunds has int64",
    ):
        decode(chunk, ctx)
    wider = DecodeContext(
        "protobuf",
        explicit=pa.schema([("order_id", pa.string()), ("old", pa.int32())]),
        registry=RegistryClient(registry_url),
        table="db.refunds",
    )
    rows, bad = decode(chunk, wider)
    assert bad == [] and rows.to_pylist() == [{"order_id": "a"}]


def test_format_message_names_the_message_type_instead_of_the_indexes(registry_url):
    """``format.message``: Refund's bytes read as Refund whatever their indexes say; a name the schema lacks makes the
    record a dead letter naming it."""
    classes = _build()
    values = _serialize(registry_url, classes["Order"], [classes["Order"](id="r1")])  # field 1 is a string in both
    chunk = Chunk("orders", 0, values, [0], [0])
    rows, bad = decode(chunk, DecodeContext("protobuf", registry=RegistryClient(registry_url), message="shop.Refund"))
    assert bad == [] and rows.to_pylist() == [{"order_id": "r1"}]
    rows, bad = decode(chunk, DecodeContext("protobuf", registry=RegistryClient(registry_url), message="shop.Nothing"))
    assert [(b.error_class, "format.message 'shop.Nothing'" in b.message) for b in bad] == [("MessageIndexOutOfRange", True)]


def test_format_message_is_refused_for_a_format_without_protobuf_messages():
    from tidewater.config.parse import parse_pipeline
    from tidewater.errors import ConfigError

    doc = {
        "name": "orders",
        "topics": ["orders"],
        "kafka": {"bootstrap_servers": "h:9092"},
        "table": {"identifier": "db.orders"},
        "format": {"value": "json", "message": "shop.Order"},
    }
    with pytest.raises(ConfigError, match="format.message: names a Protobuf message type; value format json"):
        parse_pipeline(doc)
