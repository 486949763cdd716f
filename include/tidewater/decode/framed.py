"""The skeleton of the registry formats (``avro``, ``json_schema``, ``protobuf`` and the Debezium envelopes in them):
Confluent's wire format read once for a whole chunk, then each schema id's records decoded together.

The framing (magic byte 0, a 4-byte big-endian schema id, the body) is checked and cut with Arrow kernels over the
chunk (``framed``): a null value is a ``Tombstone``, a value without the framing a dead letter of the format's own
class. ``by_schema_id`` then looks each schema id up once per chunk (the registry client caches it for the task's
life), hands that id's records to the format's decoder, and puts the parts back together in chunk order. A schema id
the registry does not know makes its records ``UnknownSchemaId`` dead letters; a schema the format cannot use
(``SchemaRefused``) makes them dead letters of the class it names; the topic's other records go on.

A format gives the skeleton two functions: ``look_up(schema_id) -> schema`` and ``decode(group, schema, bad) ->
parts``, each part a table of rows with each row's position in the chunk and a label naming it in errors
(``schema id 3``, ``schema id 3 (shop.Order)``); the records it cannot decode go into ``bad`` by chunk position.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tidewater.decode.records import BadRecord, in_chunk_order, refuse_conflicts, with_schema_id
from tidewater.decode.registry_client import UnknownSchemaId
from tidewater.source.kafka import Chunk

S = TypeVar("S")
TOMBSTONE = "Tombstone"
UNKNOWN_SCHEMA_ID = "UnknownSchemaId"


class SchemaRefused(Exception):
    """A registered schema the format cannot use (a JSON Schema that cannot be columns, say): its records are dead
    letters of ``error_class``, with the message."""

    def __init__(self, error_class: str, message: str) -> None:
        super().__init__(message)
        self.error_class = error_class


@dataclass(frozen=True)
class SchemaGroup:
    """One schema id's records of a chunk: their chunk positions (in chunk order) and their bodies (what follows
    the schema id: for Protobuf the message indexes, then the message)."""

    schema_id: int
    at: np.ndarray
    bodies: pa.Array

    def dead(self, bad: dict[int, BadRecord], error_class: str, message: str) -> None:
        """Every record of the group a dead letter of ``error_class``."""
        bad.update({int(i): BadRecord(int(i), error_class, message) for i in self.at})


@dataclass(frozen=True)
class Part:
    """Rows decoded apart (one schema id's, or one message type's of it), the chunk position of each, and the name
    errors give them."""

    rows: pa.Table
    at: np.ndarray
    label: str


def framed(chunk: Chunk, not_framed: str) -> tuple[list[SchemaGroup], dict[int, BadRecord]]:
    """The chunk's framed records by schema id (in the order each id first appears in the chunk) and its records
    without the framing, by chunk position: tombstones, and values of class ``not_framed``."""
    values = pa.array(chunk.values, pa.binary())
    ok = pc.fill_null(pc.and_(pc.greater_equal(pc.binary_length(values), 5), pc.equal(pc.binary_slice(values, 0, 1), b"\x00")), False)
    bad = {i: _unframed(i, chunk.values[i], not_framed) for i in pc.indices_nonzero(pc.invert(ok)).to_pylist()}
    where = pc.indices_nonzero(ok)
    heads = values.take(where)
    if not len(heads):
        return [], bad
    ids = _schema_ids(pc.binary_slice(heads, 1, 5))
    # an explicit stop: pyarrow 26's binary_slice without one sizes its output buffer wrongly (ArrowInvalid,
    # "Negative buffer resize") when values differ in length
    longest = pc.max(pc.binary_length(heads)).as_py()
    bodies = pc.binary_slice(heads, 5, max(5, longest or 0))
    where_np = where.to_numpy()
    found, first = np.unique(ids, return_index=True)
    groups = []
    for schema_id in found[np.argsort(first)].tolist():
        mine = np.flatnonzero(ids == schema_id)
        groups.append(SchemaGroup(schema_id, where_np[mine], bodies.take(pa.array(mine))))
    return groups, bad


def by_schema_id(
    chunk: Chunk,
    not_framed: str,
    look_up: Callable[[int], S],
    decode: Callable[[SchemaGroup, S, dict[int, BadRecord]], Iterable[Part]],
    table: Any = None,
    mark: bool = True,
    join: Callable[[list[pa.Table], list[np.ndarray], list[str]], pa.Table] = in_chunk_order,
) -> tuple[pa.Table, list[BadRecord]]:
    """Rows in chunk order and the bad records apart (see the module docstring). An unreachable registry or refused
    credentials raise from ``look_up`` as they are (transient, terminal): they are no record's fault.

    ``table``: the decode context whose table each part's columns are checked against (None: the rows are envelopes
    or keys, not the table's rows). ``mark``: each part's columns carry the schema id they were decoded with
    (``records.SCHEMA_ID``). ``join``: how the parts become one table (by default, refusing a field two parts give
    types that do not widen into one)."""
    groups, bad = framed(chunk, not_framed)
    parts: list[Part] = []
    for group in groups:
        try:
            schema = look_up(group.schema_id)
        except UnknownSchemaId as e:
            group.dead(bad, UNKNOWN_SCHEMA_ID, str(e))
            continue
        except SchemaRefused as e:
            group.dead(bad, e.error_class, str(e))
            continue
        for part in decode(group, schema, bad):
            rows = with_schema_id(part.rows, group.schema_id) if mark else part.rows
            if table is not None:
                refuse_conflicts(table, rows, part.label)
            parts.append(replace(part, rows=rows))
    rows = join([p.rows for p in parts], [p.at for p in parts], [p.label for p in parts])
    return rows, [bad[i] for i in sorted(bad)]  # several ids interleave


def _unframed(i: int, v: bytes | None, not_framed: str) -> BadRecord:
    if v is None:
        return BadRecord(i, TOMBSTONE, "record has a null value (tombstone)")
    if v[:1] == b"\x01":
        return BadRecord(i, not_framed, "value names its schema by GUID (magic byte 1); schema ids are read")
    return BadRecord(i, not_framed, f"value does not start with magic byte 0 and a schema id; starts with {v[:16]!r}")


def _schema_ids(heads: pa.Array) -> np.ndarray:
    """The big-endian schema ids of 4-byte slices, read from the Arrow buffer at once."""
    fixed = heads.cast(pa.binary(4))
    data = fixed.buffers()[1]
    return np.frombuffer(data, dtype=">u4", count=len(fixed), offset=fixed.offset * 4).astype(np.int64)
