"""The Iceberg catalog: loading it from a pipeline, creating and evolving tables.

Creation and evolution are metadata-only operations, safe to race: creating an existing table loads
it, and adding columns that already exist is a no-op (``union_by_name``). Conflicting catalog updates
are retried after a refresh.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import pyarrow as pa

from tidewater.config import PipelineSpec
from tidewater.errors import ConfigError, TerminalError, TransientError

log = logging.getLogger(__name__)


def load_catalog(spec: PipelineSpec) -> Any:
    from pyiceberg.catalog import load_catalog as _load

    props = spec.catalog_properties()
    if props.get("type") == "sql" and str(props.get("uri", "")).startswith("sqlite:///"):
        from pathlib import Path

        Path(props["uri"][len("sqlite:///") :]).parent.mkdir(parents=True, exist_ok=True)
        warehouse = str(props.get("warehouse", ""))
        if warehouse.startswith("file://"):
            Path(warehouse[len("file://") :]).mkdir(parents=True, exist_ok=True)
    for attempt in range(5):
        try:
            return _load(spec.catalog.name, **props)
        except Exception as e:
            # A new SQL catalog creates its own tables on first load; concurrent first loads collide
            # ("already exists"), and the next attempt finds the tables in place.
            if "already exists" in str(e) and attempt < 4:
                time.sleep(0.1 * (attempt + 1))
                continue
            raise ConfigError(f"catalog.properties: cannot load catalog {spec.catalog.name!r}: {e}") from None
    raise AssertionError("unreachable")


def load_table(catalog: Any, identifier: str) -> Any | None:
    from pyiceberg.exceptions import NoSuchTableError

    try:
        return catalog.load_table(identifier)
    except NoSuchTableError:
        return None


def arrow_paths(t: pa.DataType, prefix: str = "") -> set[str]:
    """Dotted names of every field inside a (struct) type; list elements as ``name.element``."""
    out: set[str] = set()
    if pa.types.is_struct(t):
        for f in t:
            p = f"{prefix}.{f.name}" if prefix else f.name
            out.add(p)
            out |= arrow_paths(f.type, p)
    elif pa.types.is_list(t) or pa.types.is_large_list(t):
        out |= arrow_paths(t.value_type, f"{prefix}.element")
    elif pa.types.is_map(t):
        out |= arrow_paths(t.key_type, f"{prefix}.key") | arrow_paths(t.item_type, f"{prefix}.value")
    return out


def table_arrow_schema(table: Any) -> pa.Schema:
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    return schema_to_pyarrow(table.schema(), include_field_ids=False)


def new_fields(table: Any, decoded: pa.Schema) -> list[str]:
    have = arrow_paths(pa.struct(list(table_arrow_schema(table))))
    return sorted(arrow_paths(pa.struct(list(decoded))) - have)


def _subset(decoded: pa.DataType, have: pa.DataType) -> pa.DataType:
    """``decoded`` restricted to the fields ``have`` knows (by name, recursively)."""
    if pa.types.is_struct(decoded) and pa.types.is_struct(have):
        fields = []
        for f in decoded:
            i = have.get_field_index(f.name)
            if i >= 0:
                fields.append(pa.field(f.name, _subset(f.type, have.field(i).type)))
        return pa.struct(fields)
    if (pa.types.is_list(decoded) or pa.types.is_large_list(decoded)) and (pa.types.is_list(have) or pa.types.is_large_list(have)):
        return pa.list_(_subset(decoded.value_type, have.value_type))
    return decoded


def without_new_fields(table: Any, decoded: pa.Table) -> pa.Table:
    """``decoded`` without the fields the table does not have (``table.evolve_schema: false``)."""
    have = pa.struct(list(table_arrow_schema(table)))
    keep = [n for n in decoded.column_names if have.get_field_index(n) >= 0]
    projected = decoded.select(keep)
    target = pa.schema([pa.field(f.name, _subset(f.type, have.field(have.get_field_index(f.name)).type)) for f in projected.schema])
    return projected.cast(target)


def create_table(catalog: Any, ident: str, schema: pa.Schema, properties: dict[str, str]) -> Any:
    """Create the namespace and table if missing; safe when several writers do it at once."""
    namespace = tuple(ident.split(".")[:-1])
    # Several Spark tasks may create the same namespace and table at once; a catalog's check-then-insert
    # lets the loser fail with a raw database error, so a failure counts only if the object is still missing.
    try:
        catalog.create_namespace_if_not_exists(namespace)
    except Exception:
        if not catalog.namespace_exists(namespace):
            raise
    try:
        table = catalog.create_table_if_not_exists(ident, schema=schema, properties=properties)
    except Exception:
        table = load_table(catalog, ident)
        if table is None:
            raise
    log.info("table %s ready (schema id %s)", ident, table.schema().schema_id)
    return table


DEAD_LETTER_SCHEMA = pa.schema([
    pa.field("topic", pa.string()),
    pa.field("partition", pa.int32()),
    pa.field("offset", pa.int64()),
    pa.field("timestamp", pa.timestamp("us", tz="UTC")),
    pa.field("key", pa.binary()),
    pa.field("value", pa.binary()),
    pa.field("headers", pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))),
    pa.field("error_class", pa.string()),
    pa.field("error_message", pa.string()),
    pa.field("batch_id", pa.string()),
    pa.field("pipeline", pa.string()),
])


def ensure_dead_letter_table(catalog: Any, spec: PipelineSpec) -> Any:
    """The pipeline's dead-letter table (raw records that could not be decoded), created when missing."""
    ident = spec.dead_letter_table()
    return load_table(catalog, ident) or create_table(catalog, ident, DEAD_LETTER_SCHEMA, {"format-version": "2"})


def ensure_table(catalog: Any, spec: PipelineSpec, table: Any | None, decoded: pa.Schema) -> Any:
    """A table that has every field of ``decoded`` (creating or evolving it), or an error."""
    from pyiceberg.exceptions import CommitFailedException

    ident = spec.table.identifier
    if table is None:
        if not spec.table.auto_create:
            raise TerminalError(f"table {ident} does not exist and table.auto_create is off", table=ident)
        if len(decoded) == 0:
            raise TerminalError("cannot create a table from records without any typed field", table=ident)
        table = create_table(catalog, ident, decoded, {"format-version": "2", **spec.table.properties})
    missing = new_fields(table, decoded)
    if not missing:
        return table
    if not spec.table.evolve_schema:
        raise TerminalError(
            f"records have fields the table does not have ({', '.join(missing)}) and table.evolve_schema is off",
            table=ident,
        )
    for attempt in range(10):
        try:
            with table.update_schema() as upd:
                upd.union_by_name(decoded)
            log.info("table %s: added columns %s", ident, ", ".join(missing))
            return table
        except CommitFailedException:
            time.sleep(0.2 * (attempt + 1))
            table = catalog.load_table(ident)
            if not new_fields(table, decoded):
                return table
        except ValueError as e:
            raise TerminalError(f"cannot evolve the schema with fields {', '.join(missing)}: {e}", table=ident) from e
    raise TransientError("schema evolution kept conflicting with other writers", table=ident)
