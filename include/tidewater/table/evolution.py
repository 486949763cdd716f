"""Table creation from records and schema evolution (new fields, widening, required -> optional)."""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.types import StructType

from tidewater.config.sections.table import TableSpec
from tidewater.decode.arrow_types import DottedPaths, visit
from tidewater.decode.records import FIELD_NUMBER, SCHEMA_ID
from tidewater.errors import TerminalError, TransientError
from tidewater.table import provisional as prov
from tidewater.table.backoff import tries
from tidewater.table.catalog import create_table, load_table, retry_busy
from tidewater.table.limits import field_paths
from tidewater.table.targets import target_spec

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

log = logging.getLogger(__name__)


def arrow_paths(t: pa.DataType) -> set[str]:
    """Dotted names of every field inside a (struct) type; list elements as ``name.element``, map keys and values
    as ``name.key`` and ``name.value``."""
    found = DottedPaths()
    visit(t, found)
    return found.found


def table_arrow_schema(table: Table) -> pa.Schema:
    return schema_to_pyarrow(table.schema(), include_field_ids=False)


def new_fields(table: Any, decoded: pa.Schema) -> list[str]:
    have = arrow_paths(pa.struct(list(table_arrow_schema(table))))
    return sorted(arrow_paths(pa.struct(list(decoded))) - have)


def subset(decoded: pa.DataType, have: pa.DataType) -> pa.DataType:
    """``decoded`` restricted to the fields ``have`` knows (by name, recursively)."""
    if pa.types.is_struct(decoded) and pa.types.is_struct(have):
        fields = []
        for f in decoded:
            i = have.get_field_index(f.name)
            if i >= 0:
                fields.append(pa.field(f.name, subset(f.type, have.field(i).type)))
        return pa.struct(fields)
    if (pa.types.is_list(decoded) or pa.types.is_large_list(decoded)) and (pa.types.is_list(have) or pa.types.is_large_list(have)):
        return pa.list_(subset(decoded.value_type, have.value_type))
    return decoded


def without_new_fields(table: Any, decoded: pa.Table) -> pa.Table:
    """``decoded`` without the fields the table does not have (``table.evolve_schema: false``)."""
    have = pa.struct(list(table_arrow_schema(table)))
    keep = [n for n in decoded.column_names if have.get_field_index(n) >= 0]
    projected = decoded.select(keep)
    target = pa.schema([pa.field(f.name, subset(f.type, have.field(have.get_field_index(f.name)).type)) for f in projected.schema])
    return projected.cast(target)


@dataclass(frozen=True)
class Evolution:
    """What the table's schema needs so that a chunk of rows fits it."""

    new: tuple[str, ...] = ()  # dotted paths of fields the table does not have
    widen: tuple[str, ...] = ()  # int -> long, float -> double
    optional: tuple[str, ...] = ()  # required columns the rows leave null (or lack)
    renamed: tuple[tuple[str, str], ...] = ()  # (column, its new path): the source field kept its number (FIELD_NUMBER)

    def __bool__(self) -> bool:
        return bool(self.new or self.widen or self.optional or self.renamed)

    def describe(self) -> str:
        parts = [
            f"rename {', '.join(f'{a} to {b}' for a, b in self.renamed)}" if self.renamed else "",
            f"add {', '.join(self.new)}" if self.new else "",
            f"widen {', '.join(self.widen)}" if self.widen else "",
            f"make optional {', '.join(self.optional)}" if self.optional else "",
        ]
        return "; ".join(p for p in parts if p)


NUMBERS = "tidewater.field-numbers"  # table property: column path -> its source field's number (JSON)
SCHEMA_IDS = "tidewater.field-schema-ids"  # table property: column -> the registered schema id that added it (JSON)


def schema_ids(schema: pa.Schema) -> dict[str, int]:
    """The registered schema id each top-level field was decoded with (``SCHEMA_ID``; none for other formats)."""
    return {f.name: int(f.metadata[SCHEMA_ID]) for f in schema if f.metadata and SCHEMA_ID in f.metadata}


def with_schema_ids(explicit: pa.Schema | None, table: Any) -> pa.Schema | None:
    """The table's columns (``explicit``) marked with the schema id that added each (``SCHEMA_IDS``), for the decoder's
    error when a later version gives one another type."""
    known = json.loads(table.metadata.properties.get(SCHEMA_IDS, "{}")) if table is not None else {}
    if explicit is None or not known:
        return explicit
    return pa.schema(
        [f.with_metadata({**(f.metadata or {}), SCHEMA_ID: str(known[f.name]).encode()}) if f.name in known else f for f in explicit]
    )


def field_numbers(t: pa.DataType | pa.Schema, prefix: str = "") -> dict[str, int]:
    """The source field numbers the decoder put on ``t``'s fields (``FIELD_NUMBER``), by dotted path (structs)."""
    out: dict[str, int] = {}
    for f in t:
        path = f"{prefix}{f.name}"
        if f.metadata and FIELD_NUMBER in f.metadata:
            out[path] = int(f.metadata[FIELD_NUMBER])
        if pa.types.is_struct(f.type):
            out.update(field_numbers(f.type, path + "."))
    return out


def renames(table: Any, schema: pa.Schema, new: list[str]) -> list[tuple[str, str]]:
    """The table's columns a new field takes over: the same source field number under the same parent, the old name
    absent from ``schema`` (the field was renamed in the source schema, its values are the column's)."""
    known = json.loads(table.metadata.properties.get(NUMBERS, "{}"))
    if not known:
        return []
    got = field_numbers(schema)
    data_paths = arrow_paths(pa.struct(list(schema)))
    by_number = {(p.rpartition(".")[0], n): p for p, n in known.items()}
    out: list[tuple[str, str]] = []
    for path in new:
        old = by_number.get((path.rpartition(".")[0], got.get(path)))
        if old is not None and old not in data_paths and not any(path.startswith(b + ".") for _, b in out):
            out.append((old, path))
    return out


_WIDER = {("int", "long"), ("float", "double")}


def _walk(fields: Any, arrays: dict[str, pa.Array], valid: pa.Array | None, prefix: str, widen: list[str], optional: list[str]) -> None:
    for f in fields:
        path = f"{prefix}{f.name}"
        arr = arrays.get(f.name)
        if arr is None:
            if f.required:
                optional.append(path)
            continue
        if (str(f.field_type), _arrow_family(arr.type)) in _WIDER:
            widen.append(path)
        if f.required:
            nulls = pc.is_null(arr) if valid is None else pc.and_(pc.is_null(arr), valid)
            if pc.any(nulls).as_py():
                optional.append(path)
        if isinstance(f.field_type, StructType) and pa.types.is_struct(arr.type):
            child_valid = pc.is_valid(arr) if valid is None else pc.and_(pc.is_valid(arr), valid)
            children = {arr.type.field(i).name: arr.field(i) for i in range(arr.type.num_fields)}
            _walk(f.field_type.fields, children, child_valid, path + ".", widen, optional)


def _arrow_family(t: pa.DataType) -> str:
    if pa.types.is_int64(t):
        return "long"
    if pa.types.is_float64(t):
        return "double"
    return str(t)


def evolution_needed(table: Any | None, data: pa.Table) -> Evolution:
    """New fields, type widenings and required columns made optional that ``data`` needs."""
    if table is None:
        return Evolution(new=tuple(sorted(arrow_paths(pa.struct(list(data.schema))))))
    new = new_fields(table, data.schema)
    renamed = renames(table, data.schema, new)
    new = [p for p in new if not any(p == b or p.startswith(b + ".") for _, b in renamed)]
    widen: list[str] = []
    optional: list[str] = []
    fields = table.schema().fields
    if any(_has_required_or_narrow(f) for f in fields):  # auto-created tables have neither: nothing to scan
        arrays = {name: data.column(name).combine_chunks() for name in data.column_names}
        _walk(fields, arrays, None, "", widen, optional)
    # identifier fields stay required: a row without its key is a dead letter (MissingId), not a reason to
    # weaken the table (Iceberg refuses an optional identifier field anyway)
    schema = table.schema()
    keys = {schema.find_column_name(i) for i in schema.identifier_field_ids}
    return Evolution(tuple(new), tuple(widen), tuple(p for p in optional if p not in keys), tuple(renamed))


def _has_required_or_narrow(f: Any) -> bool:
    if f.required or str(f.field_type) in ("int", "float"):
        return True
    return isinstance(f.field_type, StructType) and any(_has_required_or_narrow(c) for c in f.field_type.fields)


def _keep_required(table: Table, schema: pa.Schema, relax: set[str]) -> pa.Schema:
    """``schema`` with fields the table has as required (and that stay required) marked non-nullable,
    so that ``union_by_name`` changes nothing about them."""

    def walk(fields: Any, t: pa.StructType, prefix: str) -> list[pa.Field]:
        ice = {f.name: f for f in fields}
        out = []
        for af in t:
            f = ice.get(af.name)
            path = f"{prefix}{af.name}"
            typ = af.type
            if f is not None and isinstance(f.field_type, StructType) and pa.types.is_struct(typ):
                typ = pa.struct(walk(f.field_type.fields, typ, path + "."))
            nullable = not (f is not None and f.required and path not in relax)
            out.append(pa.field(af.name, typ, nullable=nullable))
        return out

    return pa.schema(walk(table.schema().fields, pa.struct(list(schema)), ""))


def pending_change(tspec: TableSpec, table: Any | None, data: pa.Table, optional: tuple[str, ...] = ()) -> Evolution | None:
    """What the table must change so that ``data`` fits it (None: nothing, or a narrowing the writer casts),
    or an error when the settings forbid it (no table and ``auto_create`` off, new fields or optional
    columns and ``evolve_schema`` off). ``optional``: required columns a writer already found left null."""
    ident = tspec.identifier
    if table is None:
        if not tspec.auto_create:
            raise TerminalError(f"table {ident} does not exist and table.auto_create is off", table=ident)
        if len(data.schema) == 0:
            raise TerminalError("cannot create a table from records without any typed field", table=ident)
        return Evolution(new=tuple(sorted(arrow_paths(pa.struct(list(data.schema))))))
    change = evolution_needed(table, data)
    still = [p for p in optional if _required(table, p)]  # another change may have made them optional since
    if still:  # replace, not rebuild: the change keeps its renames (and whatever else it holds)
        change = dataclasses.replace(change, optional=tuple(sorted(set(change.optional) | set(still))))
    if not change:
        return None
    if not tspec.evolve_schema:
        if not (change.new or change.optional):
            return None  # values are cast to the narrower type; one that does not fit fails the task
        raise TerminalError(f"the records need schema changes ({change.describe()}) and table.evolve_schema is off", table=ident)
    return change


def _required(table: Table, path: str) -> bool:
    try:
        return bool(table.schema().find_field(path).required)
    except ValueError:
        return False


def ensure_table(
    catalog: Catalog,
    tspec: TableSpec,
    table: Any | None,
    data: pa.Table,
    provisional: tuple[str, str] | None = None,
    optional: tuple[str, ...] = (),
) -> Any:
    """A table that ``data`` fits (creating or evolving it: new fields, int -> long and float -> double,
    required -> optional), or an error. Safe to race: every attempt re-checks against a fresh table.
    ``tspec``: the table's settings (a pipeline's ``table``, or one target of a routed pipeline).
    ``provisional``: (batch id, tag): the changes are tagged as that batch's, confirmed by its commit
    or reverted (see ``table/provisional.py``). ``optional``: see :func:`pending_change`."""
    ident = tspec.identifier
    schema = data.schema
    change = pending_change(tspec, table, data, optional)
    numbers, ids = field_numbers(schema), schema_ids(schema)
    if table is None:
        created_by = {prov.CREATED_BY: provisional[0]} if provisional else {}
        known = {NUMBERS: json.dumps(numbers, sort_keys=True)} if numbers else {}
        known |= {SCHEMA_IDS: json.dumps(ids, sort_keys=True)} if ids else {}
        table = create_table(
            catalog,
            ident,
            schema,
            {"format-version": "2", **tspec.properties, **created_by, **known},
            tspec.partition_by,
            tspec.sort_by,
            tspec.id_columns,
        )
        change = pending_change(tspec, table, data, optional)
    if not change:
        return table
    try:
        for attempt in tries(CommitFailedException, attempts=10, wait=0.2):
            with attempt:
                if attempt.retry_state.attempt_number > 1:  # another writer changed the table first: ask again
                    table = catalog.load_table(ident)
                    change = pending_change(tspec, table, data, optional)
                    if not change:
                        return table
                _apply_change(table, ident, change, schema, provisional)
                return table
    except CommitFailedException:
        raise TransientError("schema evolution kept conflicting with other writers", table=ident) from None
    raise AssertionError("unreachable: the last try returns or raises")


def _apply_change(table: Any, ident: str, change: Evolution, schema: pa.Schema, provisional: tuple[str, str] | None) -> None:
    """One attempt at ``change`` on ``table`` as loaded: renames first, then the union of ``schema``, columns made
    optional, the provisional mark and the field numbers and schema ids of the new columns, in one transaction.
    Raises pyiceberg's CommitFailedException when another writer was first."""
    numbers, ids = field_numbers(schema), schema_ids(schema)
    try:
        have = set(field_paths(pa.struct(list(table_arrow_schema(table)))))
        added = [p for p in field_paths(pa.struct(list(schema))) if p not in have]
        with table.transaction() as tx:
            if change.renamed:  # first, on its own: the union below then finds the columns by their new names
                with tx.update_schema() as upd:
                    for old, path in change.renamed:  # not reverted with the batch: the source's schema says so
                        upd.rename_column(old, path.rpartition(".")[2])
            with tx.update_schema() as upd:
                upd.union_by_name(_keep_required(table, schema, set(change.optional)))
                for path in change.optional:
                    if path not in arrow_paths(pa.struct(list(schema))):
                        upd.make_column_optional(path)
            if provisional and added:
                tx.set_properties(prov.marked_properties(table, provisional[0], provisional[1], added))
            if numbers:
                tx.set_properties({NUMBERS: _numbers_after(table, numbers, change.renamed)})
            if ids and added:  # the id that added each new top-level column (the columns it had keep theirs)
                have_ids = json.loads(table.metadata.properties.get(SCHEMA_IDS, "{}"))
                new_ids = {p[0]: ids[p[0]] for p in added if len(p) == 1 and p[0] in ids}  # paths are name tuples
                tx.set_properties({SCHEMA_IDS: json.dumps({**new_ids, **have_ids}, sort_keys=True)})
        log.info(
            "table %s: schema changed%s: %s",
            ident,
            f" (batch {provisional[0]}, until it commits)" if provisional and added else "",
            change.describe(),
        )
    except ValueError as e:
        raise TerminalError(f"cannot evolve the schema ({change.describe()}): {e}", table=ident) from e


def _numbers_after(table: Any, numbers: dict[str, int], renamed: tuple[tuple[str, str], ...]) -> str:
    """The table's field numbers once its schema changed: the renamed columns under their new paths, the new fields'
    numbers added."""
    known = json.loads(table.metadata.properties.get(NUMBERS, "{}"))
    for old, path in renamed:
        known = {(path + p[len(old) :] if p == old or p.startswith(old + ".") else p): n for p, n in known.items()}
    return json.dumps({**known, **numbers}, sort_keys=True)


def unified(schemas: list[pa.Schema]) -> pa.Schema | None:
    """One schema holding every field of ``schemas`` (types promoted: int32 + int64 -> int64, null + T -> T),
    or None when two of them give a field types that do not promote."""
    try:
        return pa.unify_schemas(schemas, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return None


DRIVER_TAG = "driver"  # the provisional tag of the changes the write job's driver makes (table/provisional.py)


def change_request(ident: str, data: pa.Table, change: Evolution, id_columns: list[str] | None = None) -> dict[str, Any]:
    """A task's report of a change its rows need (JSON: it travels in the task's result to the driver).
    ``id_columns``: the table's, as the task knows them (read from the message keys: see ``TableSink.key_ids``)."""
    return {
        "table": ident,
        "schema": base64.b64encode(data.schema.serialize().to_pybytes()).decode("ascii"),
        "optional": list(change.optional),
        "change": change.describe(),
        "id_columns": list(id_columns or []),
    }


def apply_requests(catalog: Catalog, spec: Any, requests: list[dict[str, Any]], batch_id: str) -> list[str]:
    """The write job's driver: make the changes the tasks reported, once per table and before any task writes
    with them (the tasks never change a table: see ``write/job.py``). The schemas a table's tasks saw are
    unified into one change when their types agree (one schema commit per table per batch); otherwise each
    is applied in turn and the conflicting one fails naming the field. Returns what changed, per table."""
    by_table: dict[str, list[dict[str, Any]]] = {}
    for r in requests:
        by_table.setdefault(r["table"], []).append(r)
    done = []
    for ident, reqs in sorted(by_table.items()):
        tspec = target_spec(spec, ident).table
        if not tspec.id_columns:  # a table the message keys name the id columns of: the tasks read them
            tspec = dataclasses.replace(tspec, id_columns=next((r["id_columns"] for r in reqs if r.get("id_columns")), []))
        schemas = [pa.ipc.read_schema(pa.py_buffer(base64.b64decode(r["schema"]))) for r in reqs]
        optional = tuple(sorted({p for r in reqs for p in r["optional"]}))
        one = unified(schemas)
        merged = [one] if one is not None else schemas
        table = load_table(catalog, ident)
        for schema in merged:
            current = table
            table = retry_busy(
                lambda s=schema, t=current, ts=tspec, o=optional: ensure_table(catalog, ts, t, s.empty_table(), (batch_id, DRIVER_TAG), o),
                "creating or evolving the table",
                ident,
            )
        done.append(f"{ident}: {'; '.join(sorted({r['change'] for r in reqs}))}")
    return done
