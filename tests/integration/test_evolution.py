"""Schema evolution against a real SQL catalog (no broker): what ``table/evolution.py`` records beside the schema
when a later batch changes it. Each test states the change, the columns and field ids it must leave, and the
table properties (field numbers, schema ids) that the next batch's decoder reads."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from tests.conftest import write_pipeline
from tidewater.config.parse import load_pipeline
from tidewater.decode.records import FIELD_NUMBER, SCHEMA_ID, refuse_conflicts, with_schema_id
from tidewater.errors import TerminalError
from tidewater.table.catalog import load_catalog, load_table
from tidewater.table.evolution import NUMBERS, SCHEMA_IDS, ensure_table, with_schema_ids

pytestmark = [pytest.mark.integration]


def _numbered(fields: list[tuple[str, pa.DataType, int, bool]]) -> pa.Schema:
    """A decoded schema whose fields carry their source field numbers (as the Protobuf decoder marks them)."""
    return pa.schema(
        [pa.field(name, typ, nullable=nullable, metadata={FIELD_NUMBER: str(n).encode()}) for name, typ, n, nullable in fields]
    )


@pytest.fixture
def catalog_and_spec(home):
    spec = load_pipeline(write_pipeline(home, table={"identifier": "rpc.evo"}))
    return load_catalog(spec), spec


def test_a_rename_in_the_same_batch_as_a_required_column_found_null_renames_the_column(catalog_and_spec):
    """A field renamed in the source (its number kept) and, in the same batch, a required column a writer found
    null (``optional``): the column is renamed (same field id, no second column) and the other made optional."""
    catalog, spec = catalog_and_spec
    v1 = _numbered([("id", pa.string(), 1, False), ("name", pa.string(), 2, True), ("qty", pa.int64(), 3, False)])
    table = ensure_table(catalog, spec.table, None, v1.empty_table())
    name_id = table.schema().find_field("name").field_id
    assert table.schema().find_field("qty").required

    v2 = _numbered([("id", pa.string(), 1, False), ("title", pa.string(), 2, True), ("qty", pa.int64(), 3, True)])
    ensure_table(catalog, spec.table, load_table(catalog, "rpc.evo"), v2.empty_table(), optional=("qty",))

    schema = load_table(catalog, "rpc.evo").schema()
    assert [f.name for f in schema.fields] == ["id", "title", "qty"]
    assert schema.find_field("title").field_id == name_id
    assert not schema.find_field("qty").required
    assert json.loads(load_table(catalog, "rpc.evo").properties[NUMBERS]) == {"id": 1, "title": 2, "qty": 3}


def test_a_column_added_by_a_later_schema_version_records_its_schema_id_and_a_conflict_names_it(catalog_and_spec):
    """Schema id 1 creates the table, schema id 2 adds ``coupon``: the table records id 2 for it (id 1 for the
    columns it had), and a later version giving ``coupon`` another type is refused naming schema id 2."""
    catalog, spec = catalog_and_spec
    v1 = with_schema_id(pa.table({"order_id": pa.array([], pa.string()), "qty": pa.array([], pa.int64())}), 1)
    ensure_table(catalog, spec.table, None, v1)
    v2 = with_schema_id(
        pa.table({"order_id": pa.array([], pa.string()), "qty": pa.array([], pa.int64()), "coupon": pa.array([], pa.string())}), 2
    )
    ensure_table(catalog, spec.table, load_table(catalog, "rpc.evo"), v2)

    table = load_table(catalog, "rpc.evo")
    assert json.loads(table.properties[SCHEMA_IDS]) == {"order_id": 1, "qty": 1, "coupon": 2}

    explicit = with_schema_ids(
        pa.schema([pa.field(f.name, t) for f, t in zip(table.schema().fields, (pa.string(), pa.int64(), pa.string()), strict=True)]), table
    )
    assert explicit.field("coupon").metadata[SCHEMA_ID] == b"2"

    class Context:  # the decoder's view of the table (decode/context.py's fields that refuse_conflicts reads)
        table = "rpc.evo"
        converted: frozenset[str] = frozenset()

    Context.explicit = explicit
    v3 = pa.table({"order_id": pa.array(["o1"]), "qty": pa.array([1]), "coupon": pa.array([7])})
    with pytest.raises(
        TerminalError,
        match=r"field coupon: schema id 3 gives it type int64, table rpc.evo has string "
        r"\(added by schema id 2\)",
    ):
        refuse_conflicts(Context, v3, "schema id 3")
