"""Generated change streams of a `prices(id, item, price)` table and the reference model they must produce.

A stream mixes inserts of new keys, updates of existing keys, updates and deletes of absent keys, deletes,
re-inserts of deleted keys and inserts of existing keys; every key lives in one partition (id modulo the
partition count), as a key-partitioned Debezium topic does. Encoded as Debezium JSON envelopes (with a
tombstone after each delete), as records with an op field, or as plain upserts.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Change:
    op: str  # insert, update, delete
    id: int
    item: str | None
    price: float | None

    def row(self) -> dict:
        return {"id": self.id, "item": self.item, "price": self.price}


def change_stream(model: dict[int, dict], n: int, keys: int, seed: int, deletes: bool = True) -> list[Change]:
    """``n`` changes over ids ``[0, keys)`` against the source state ``model`` (not modified)."""
    rng = random.Random(seed)
    state = dict(model)
    out = []
    for i in range(n):
        k = rng.randrange(keys)
        roll = rng.random()
        if k in state:
            op = "update" if roll < 0.55 else "delete" if roll < 0.8 and deletes else "insert"
        else:
            op = "insert" if roll < 0.7 or not deletes else "update" if roll < 0.85 else "delete"
        if op == "delete":
            out.append(Change("delete", k, None, None))
            state.pop(k, None)
        else:
            c = Change(op, k, f"item-{k}-{seed}-{i}", round(rng.uniform(1, 100), 2))
            out.append(c)
            state[k] = c.row()
    return out


def apply(model: dict[int, dict], changes: list[Change]) -> dict[int, dict]:
    """The source table after ``changes``: the reference the Iceberg table must equal."""
    out = dict(model)
    for c in changes:
        if c.op == "delete":
            out.pop(c.id, None)
        else:
            out[c.id] = c.row()
    return out


_ROW_SCHEMA = [
    {"field": "id", "type": "int64"},
    {"field": "item", "type": "string", "optional": True},
    {"field": "price", "type": "double", "optional": True},
]
CONNECT_SCHEMA = {
    "type": "struct",
    "name": "prices.Envelope",
    "fields": [
        {"field": "before", "type": "struct", "optional": True, "fields": _ROW_SCHEMA},
        {"field": "after", "type": "struct", "optional": True, "fields": _ROW_SCHEMA},
        {"field": "op", "type": "string"},
        {"field": "ts_ms", "type": "int64", "optional": True},
        {"field": "source", "type": "struct", "optional": True, "fields": [{"field": "table", "type": "string"}]},
    ],
}


def encode(changes: list[Change], model: dict[int, dict], style: str) -> list[tuple[int, bytes | None]]:
    """(id, value) per Kafka record: ``debezium`` (envelope + tombstone after a delete), ``debezium_schema``
    (the same inside Kafka Connect's JSON schema/payload wrapper), ``op_field`` (I/U/D in `op`) or ``upsert``
    (the row only; deletes cannot be expressed and are dropped)."""
    state = dict(model)
    out: list[tuple[int, bytes | None]] = []
    for c in changes:
        before = state.get(c.id)
        if style in ("debezium", "debezium_schema"):
            op = {"insert": "c", "update": "u", "delete": "d"}[c.op]
            env = {
                "before": before if c.op != "insert" else None,
                "after": None if c.op == "delete" else c.row(),
                "op": op,
                "ts_ms": 1_700_000_000_000,
                "source": {"table": "prices"},
            }
            if c.op == "delete" and before is None:
                env["before"] = {"id": c.id, "item": None, "price": None}
            doc = {"schema": CONNECT_SCHEMA, "payload": env} if style == "debezium_schema" else env
            out.append((c.id, json.dumps(doc).encode()))
            if c.op == "delete":
                out.append((c.id, None))
        elif style == "op_field":
            row = c.row() if c.op != "delete" else {"id": c.id}
            out.append((c.id, json.dumps({**row, "op": {"insert": "I", "update": "U", "delete": "D"}[c.op]}).encode()))
        elif c.op != "delete":
            out.append((c.id, json.dumps(c.row()).encode()))
        if c.op == "delete":
            state.pop(c.id, None)
        else:
            state[c.id] = c.row()
    return out
