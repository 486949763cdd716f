"""Dynamic route values and the catalog's case rules (transform/routing.py), without a broker."""

from __future__ import annotations

import re

import pyarrow as pa
import pytest

from tidewater.config.parse import parse_pipeline
from tidewater.transform.routing import Router


def _router(case_sensitive: bool) -> Router:
    return Router(
        parse_pipeline(
            {
                "name": "relroute2",
                "topics": ["t"],
                "kafka": {"bootstrap_servers": "h:1"},
                "table": {"identifier": ""},
                "catalog": {"case_sensitive": case_sensitive},
                "routing": {"namespace": "ev", "field": "k", "dynamic": True, "table_template": "ev_{value}"},
            }
        )
    )


@pytest.mark.parametrize("value", ["RELROUTE2_CHECKPOINTS", "Relroute2_Dead_Letters", "relroute2_checkpoints", "relroute2_ledger"])
def test_a_case_variant_of_a_protected_table_is_refused_whatever_the_catalog(value):
    """With the template `{value}`, a value naming the checkpoint, dead-letter or ledger table in any case is refused,
    on a case-folding catalog and on a case-sensitive one alike (the names only differ by case)."""
    for case_sensitive in (False, True):
        router = Router(
            parse_pipeline(
                {
                    "name": "relroute2",
                    "topics": ["t"],
                    "kafka": {"bootstrap_servers": "h:1"},
                    "table": {"identifier": ""},
                    "catalog": {"case_sensitive": case_sensitive},
                    "routing": {"namespace": "ev", "field": "k", "dynamic": True},
                }
            )
        )
        refused = router.refusal(value)
        if case_sensitive and value != value.lower():
            assert refused is None, "a case-sensitive catalog keeps them apart"
        else:
            assert refused is not None and "own checkpoint, dead-letter or ledger table" in refused


def test_values_that_differ_by_case_name_one_table_unless_the_catalog_is_case_sensitive():
    """`VT`, `vt` and `Vt` route to `ev.ev_vt` together (one mask holding all three rows) on the default,
    case-folding rule; with `catalog.case_sensitive` they name three tables."""
    data = pa.table({"k": ["VT", "vt", "Vt", "other"]})
    folded = _router(False).route("t", data)
    assert sorted(folded.masks) == ["ev.ev_other", "ev.ev_vt"]
    assert folded.masks["ev.ev_vt"].to_pylist() == [True, True, True, False]
    kept = _router(True).route("t", data)
    assert sorted(kept.masks) == ["ev.ev_VT", "ev.ev_Vt", "ev.ev_other", "ev.ev_vt"]


def _topic_router(template: str, field: str | None = None) -> Router:
    return Router(
        parse_pipeline(
            {
                "name": "db",
                "topic_pattern": r"dbserver1\..*",
                "kafka": {"bootstrap_servers": "h:1"},
                "table": {"identifier": ""},
                "routing": {"namespace": "raw", "dynamic": True, "table_template": template, **({"field": field} if field else {})},
            }
        )
    )


@pytest.mark.parametrize(
    ("template", "topic", "table"),
    [
        ("{topic[-1]}", "dbserver1.inventory.Customers", "raw.customers"),
        ("{topic[1]}_{topic[2]}", "dbserver1.inventory.order-lines", "raw.inventory_order_lines"),
        ("{topic[1]}.{topic[-1]}", "dbserver1.inventory.orders", "inventory.orders"),
        ("cdc_{topic}", "dbserver1.inventory.orders", "raw.cdc_dbserver1_inventory_orders"),
    ],
)
def test_the_topic_names_the_table_of_every_record_of_a_chunk(template, topic, table):
    """`{topic}` is the whole name and `{topic[N]}` its N-th dotted part (negative: from the end); other characters
    become `_` and names fold to lower case; a template without a namespace puts the table in routing.namespace."""
    routed = _topic_router(template).route(topic, pa.table({"id": [1, 2, 3]}))
    assert list(routed.masks) == [table] and routed.masks[table].to_pylist() == [True] * 3
    assert not routed.invalid and routed.unmatched.to_pylist() == [False] * 3


def test_a_topic_that_cannot_name_a_table_is_refused_by_name_and_a_value_still_fills_its_part():
    """A topic without the part the template asks for, or naming the pipeline's own tables, makes every record of
    the chunk an invalid route naming the topic; `{topic[-1]}_{value}` takes both."""
    missing = _topic_router("{topic[3]}").route("dbserver1.orders", pa.table({"id": [1, 2]}))
    assert not missing.masks and [r for r, _ in missing.invalid] == [0, 1]
    assert "topic 'dbserver1.orders' has no part {topic[3]}" in missing.invalid[0][1]
    own = _topic_router("{topic[-1]}").route("dbserver1.db_checkpoints", pa.table({"id": [1]}))
    assert not own.masks and "own checkpoint, dead-letter or ledger table" in own.invalid[0][1]
    both = _topic_router("{topic[-1]}_{value}", field="kind").route("dbserver1.pay", pa.table({"kind": ["a", "b", "a"]}))
    assert {k: m.to_pylist() for k, m in both.masks.items()} == {"raw.pay_a": [True, False, True], "raw.pay_b": [False, True, False]}


def test_the_database_example_routes_each_topic_to_its_change_table():
    """docs/examples/inventory_database.yaml validates, names `cdc.<table>` by each topic's last part, and every
    table it names applies changes, its id columns from the message keys (none listed) or the override's."""
    from pathlib import Path

    from tidewater.config.parse import load_pipeline

    spec = load_pipeline(Path(__file__).resolve().parents[2] / "docs" / "examples" / "inventory_database.yaml")
    router = Router(spec)
    assert list(router.route("dbserver1.inventory.orders", pa.table({"id": [1]})).masks) == ["cdc.orders"]
    assert spec.for_table("cdc.orders").applies_changes and spec.for_table("cdc.orders").table.id_columns == []
    assert spec.ids_from_keys and spec.for_table("cdc.audit_log").table.id_columns == ["event_id"]


def test_the_debezium_source_block_names_the_table_of_each_record():
    """`{source.schema}_{source.table}`: a topic carrying several source tables (Debezium's topic routing) goes to
    one table per source table, worked out from the envelope's source block, which the decoder keeps for the router
    only. A source value that is not a name part, or an event without the field, is refused by name per record."""
    import json

    from tidewater.decode.debezium import SOURCE_COLUMN, decode_debezium
    from tidewater.source.kafka import Chunk

    spec = parse_pipeline(
        {
            "name": "bysource",
            "topics": ["dbserver1.all"],
            "kafka": {"bootstrap_servers": "h:1"},
            "format": {"value": "debezium"},
            "table": {"identifier": "", "upsert": True, "id_columns": ["id"]},
            "routing": {"namespace": "cdc", "dynamic": True, "table_template": "{source.schema}_{source.table}"},
        }
    )
    assert spec.routes_by_source

    def event(i: int, source: dict) -> bytes:
        return json.dumps({"before": None, "after": {"id": i}, "op": "c", "source": source}).encode()

    values = [
        event(1, {"schema": "inv", "table": "Orders"}),
        event(2, {"schema": "inv", "table": "items"}),
        event(3, {"schema": "inv", "table": "orders"}),
        event(4, {"schema": "inv", "table": "bad name"}),
        event(5, {"schema": "inv"}),
    ]
    decoded, bad = decode_debezium(Chunk("dbserver1.all", 0, values, list(range(5)), [0] * 5), None, keep_source=True)
    assert not bad and SOURCE_COLUMN in decoded.column_names
    routed = Router(spec).route("dbserver1.all", decoded)
    assert {t: m.to_pylist() for t, m in routed.masks.items()} == {
        "cdc.inv_orders": [True, False, True, False, False],
        "cdc.inv_items": [False, True, False, False, False],
    }
    why = dict(routed.invalid)
    assert sorted(why) == [3, 4] and "source.table = 'bad name'" in why[3]
    assert "has no source.schema / source.table" in why[4]
    plain, _ = decode_debezium(Chunk("dbserver1.all", 0, values[:1], [0], [0]), None)
    assert SOURCE_COLUMN not in plain.column_names


@pytest.mark.parametrize(
    "routing,fmt,message",
    [
        ({"table_template": "{source.table}"}, "json", "{source.<field>} needs a Debezium format"),
        ({"table_template": "{source.db}.{source.table}"}, "debezium", "may only be in the table name"),
        ({"table_template": "{source.table}_{value}", "field": "k"}, "debezium", "use {value} or {source.<field>}, not both"),
    ],
)
def test_source_placeholders_are_checked(routing, fmt, message):
    from tidewater.errors import ConfigError

    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_pipeline(
            {
                "name": "bysource",
                "topics": ["t"],
                "kafka": {"bootstrap_servers": "h:1"},
                "format": {"value": fmt},
                "table": {"identifier": ""},
                "routing": {"namespace": "cdc", "dynamic": True, **routing},
            }
        )
