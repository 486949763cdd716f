"""The net change of a batch (transform.changes), property-based against a record-by-record Python model."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from tidewater.transform.changes import bad_ops, count_effects, net_changes

OPS = {"I": "insert", "U": "update", "D": "delete"}

change = st.tuples(st.integers(0, 5), st.integers(0, 2), st.sampled_from("IUD"), st.integers(0, 99))


def _records(changes: list[tuple[int, int, str, int]]) -> pa.Table:
    """(key, partition, op, value) in production order; offsets count per partition."""
    offsets: dict[int, int] = {}
    rows = []
    for key, part, op, value in changes:
        offsets[part] = offsets.get(part, -1) + 1
        rows.append({"id": key, "_kafka_partition": part, "_kafka_offset": offsets[part], "op": op, "v": value})
    return pa.Table.from_pylist(
        rows,
        schema=pa.schema(
            [("id", pa.int64()), ("_kafka_partition", pa.int32()), ("_kafka_offset", pa.int64()), ("op", pa.string()), ("v", pa.int64())]
        ),
    )


@settings(max_examples=300, deadline=None)
@given(st.lists(change, max_size=40), st.sets(st.integers(0, 5)))
def test_net_change_and_counts_match_applying_records_one_by_one(changes, existing):
    """Applying the records one by one in (key, partition, offset) order to a dict that starts with
    ``existing`` gives the net rows and the counts; the counts add up to the records."""
    t = _records(changes)
    net = net_changes(t, ["id"], "op", OPS)
    ordered = sorted(t.to_pylist(), key=lambda r: (r["id"], r["_kafka_partition"], r["_kafka_offset"]))
    state = {k: None for k in existing}
    counts = {"inserted": 0, "updated": 0, "deleted": 0, "noop": 0}
    for r in ordered:
        present = r["id"] in state
        if r["op"] == "D":
            counts["deleted" if present else "noop"] += 1
            state.pop(r["id"], None)
        else:
            counts["updated" if present else "inserted"] += 1
            state[r["id"]] = r["v"]
    touched = {r["id"] for r in ordered}
    assert {r["id"]: r["v"] for r in net.upserts.to_pylist()} == {k: v for k, v in state.items() if k in touched}
    assert sorted(net.keys.column("id").to_pylist()) == sorted(touched)
    existed = pa.array([k in existing for k in net.keys.column("id").to_pylist()])
    assert count_effects(net, existed) == counts
    assert sum(counts.values()) == len(changes)
    crossing = {k for k in touched if len({r["_kafka_partition"] for r in ordered if r["id"] == k}) > 1}
    assert net.cross_partition_keys == len(crossing)


def test_without_an_op_column_every_record_upserts_and_the_last_image_wins():
    t = _records([(1, 0, "D", 1), (1, 0, "I", 2), (2, 1, "I", 3)])
    net = net_changes(t, ["id"], None, OPS)
    assert sorted(net.upserts.select(["id", "v"]).to_pylist(), key=lambda r: r["id"]) == [{"id": 1, "v": 2}, {"id": 2, "v": 3}]
    assert count_effects(net, pa.array([True, False])) == {"inserted": 1, "updated": 2, "deleted": 0, "noop": 0}


def test_unknown_and_missing_operations_are_named_per_row():
    t = pa.table({"op": ["I", "X", None, "d"]})
    assert bad_ops(t, "op", OPS) == {
        1: "operation 'X' in 'op' is not one of I, U, D",
        2: "operation None in 'op' is not one of I, U, D",
        3: "operation 'd' in 'op' is not one of I, U, D",
    }
    assert bad_ops(pa.table({"x": [1]}), "op", OPS) == {0: "no operation field 'op'"}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 2), st.sampled_from("IUDT"), st.integers(0, 99)), max_size=40))
def test_a_truncate_supersedes_the_changes_before_it_in_its_partition_only(changes):
    """`cut_at_truncates` keeps, in each partition with a truncate (`T`), the changes after its last one, and every
    change of the other partitions; the truncates and the changes they supersede are counted, so kept + truncates +
    superseded = the records. Without a truncate the changes come back as they are and nothing is reported."""
    from tidewater.transform.changes import cut_at_truncates

    t = _records(changes)
    kept, truncated = cut_at_truncates(t, "op", {**OPS, "T": "truncate"})
    rows = t.to_pylist()
    last = {}
    for r in rows:
        if r["op"] == "T":
            last[r["_kafka_partition"]] = r["_kafka_offset"]
    expected = [r for r in rows if r["_kafka_offset"] > last.get(r["_kafka_partition"], -1)]
    assert kept.to_pylist() == expected
    if not last:
        assert truncated is None
    else:
        truncates = sum(1 for r in rows if r["op"] == "T")
        assert (truncated.truncates, truncated.superseded) == (truncates, len(rows) - len(expected) - truncates)


def test_the_id_columns_are_the_field_names_of_the_first_message_key():
    """Debezium's message key names the source table's primary key: JSON with its schema or without, read from the
    first record that has a key; a key that is not an object names none (with its offset), no key at all neither."""
    import json

    from tidewater.source.kafka import Chunk
    from tidewater.transform.keys import key_field_names

    def chunk(keys: list) -> Chunk:
        return Chunk("db.inv.orders", 0, [b"{}"] * len(keys), list(range(10, 10 + len(keys))), [0] * len(keys), keys)

    with_schema = json.dumps({"schema": {"type": "struct", "fields": []}, "payload": {"order_id": 1, "line": 2}}).encode()
    assert key_field_names(chunk([None, with_schema])) == (["order_id", "line"], 11)
    assert key_field_names(chunk([b'{"id": 7}'])) == (["id"], 10)
    assert key_field_names(chunk([b"7"])) == ([], 10)
    assert key_field_names(chunk([None, None])) == ([], None)
