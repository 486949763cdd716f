"""The registry formats' framing (decode/framed.py), read once for a chunk with Arrow kernels: a pure function of the
chunk's values, so no registry takes part."""

from __future__ import annotations

import struct

from tidewater.decode.framed import framed
from tidewater.source.kafka import Chunk


def head(schema_id: int) -> bytes:
    return b"\x00" + struct.pack(">I", schema_id)


def test_framing_groups_records_by_schema_id_in_the_order_ids_first_appear():
    values = [
        head(7) + b"seven-a",
        head(3) + b"three",
        None,
        b"\x00\x00\x01",  # too short for a schema id
        b"\x01" + bytes(16),  # a schema named by GUID
        b'{"plain": "json"}',
        head(7) + b"",  # a framed value with an empty body
        head(2**32 - 1) + b"max",
    ]
    chunk = Chunk("t", 0, values, list(range(100, 100 + len(values))), [0] * len(values))
    groups, bad = framed(chunk, "NotFramedHere")
    assert [g.schema_id for g in groups] == [7, 3, 2**32 - 1]
    assert [g.at.tolist() for g in groups] == [[0, 6], [1], [7]]
    assert [g.bodies.to_pylist() for g in groups] == [[b"seven-a", b""], [b"three"], [b"max"]]
    assert {i: b.error_class for i, b in bad.items()} == {2: "Tombstone", 3: "NotFramedHere", 4: "NotFramedHere", 5: "NotFramedHere"}
    assert "GUID" in bad[4].message and "magic byte 0 and a schema id" in bad[5].message and 'b\'{"plain"' in bad[5].message
    assert sum(len(g.at) for g in groups) + len(bad) == len(values)


def test_a_chunk_with_no_framed_value_has_no_groups():
    chunk = Chunk("t", 0, [None, b"x"], [0, 1], [0, 0])
    groups, bad = framed(chunk, "NotFramedHere")
    assert groups == [] and sorted(bad) == [0, 1]
