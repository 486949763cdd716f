"""Partition specs and sort orders from the pipeline (``table.partition_by``, ``table.sort_by``, parsed by
``config/partitioning.py``), and splitting Arrow data by partition for the writer.

Splitting is vectorized: the transforms run as Arrow kernels over the whole chunk, rows are ordered by
their partition values once, and each partition is a zero-copy slice.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg import transforms as t
from pyiceberg.io.pyarrow import _get_field_from_arrow_table
from pyiceberg.partitioning import PartitionField as IcebergPartitionField
from pyiceberg.partitioning import PartitionFieldValue, PartitionKey, PartitionSpec
from pyiceberg.table.sorting import NullOrder, SortDirection, SortOrder
from pyiceberg.table.sorting import SortField as IcebergSortField

from tidewater.config.partitioning import PartitionField, parse_partition_field, parse_sort_field
from tidewater.errors import TerminalError

if TYPE_CHECKING:
    from pyiceberg.table import Table


def iceberg_transform(f: PartitionField) -> Any:
    """The Iceberg transform of a parsed ``table.partition_by`` entry."""
    return (
        {
            "identity": t.IdentityTransform,
            "year": t.YearTransform,
            "month": t.MonthTransform,
            "day": t.DayTransform,
            "hour": t.HourTransform,
        }[f.transform]()
        if f.width is None
        else (t.BucketTransform(f.width) if f.transform == "bucket" else t.TruncateTransform(f.width))
    )


def build(schema: Any, partition_by: list[str], sort_by: list[str], prefix: str = "table") -> tuple[Any, Any]:
    """The Iceberg PartitionSpec and SortOrder for ``schema`` (an Iceberg Schema with field ids).

    Raises TerminalError naming the setting when a column is missing or its type does not suit the transform.
    """

    def source(column: str, key: str) -> Any:
        try:
            return schema.find_field(column)
        except ValueError:
            raise TerminalError(
                f"{key}: column {column!r} is not in the records' schema (columns: {', '.join(f.name for f in schema.fields)})"
            ) from None

    pfields = []
    for i, text in enumerate(partition_by):
        key = f"{prefix}.partition_by[{i}]"
        pf = parse_partition_field(text, key)
        src = source(pf.column, key)
        transform = iceberg_transform(pf)
        if not transform.can_transform(src.field_type):
            raise TerminalError(f"{key}: {text!r}: a {pf.transform} transform cannot apply to {src.field_type} column {pf.column!r}")
        pfields.append(IcebergPartitionField(source_id=src.field_id, field_id=1000 + i, transform=transform, name=pf.name))
    sfields = []
    for i, text in enumerate(sort_by):
        key = f"{prefix}.sort_by[{i}]"
        sf = parse_sort_field(text, key)
        src = source(sf.column, key)
        direction = SortDirection.DESC if sf.descending else SortDirection.ASC
        nulls_first = (not sf.descending) if sf.nulls_first is None else sf.nulls_first
        sfields.append(
            IcebergSortField(
                source_id=src.field_id,
                transform=t.IdentityTransform(),
                direction=direction,
                null_order=NullOrder.NULLS_FIRST if nulls_first else NullOrder.NULLS_LAST,
            )
        )
    spec = PartitionSpec(*pfields) if pfields else PartitionSpec()
    order = SortOrder(*sfields) if sfields else SortOrder()
    return spec, order


def split(table: Table, data: pa.Table) -> list[tuple[Any, pa.Table]]:
    """``data`` (already in the table's schema) split by the table's current partition spec:
    [(PartitionKey, rows)]. Unpartitioned tables give one piece with key None."""
    spec, schema = table.spec(), table.schema()
    if spec.is_unpartitioned():
        return [(None, data)]
    names = [f"__part_{i}" for i in range(len(spec.fields))]
    keyed = data
    for f, name in zip(spec.fields, names):
        source = schema.find_column_name(f.source_id)
        if source is None:
            raise TerminalError(f"{'.'.join(table.name())}: partition field {f.name} has no source column (field id {f.source_id})")
        column = _get_field_from_arrow_table(data, source)
        keyed = keyed.append_column(name, f.transform.pyarrow_transform(schema.find_field(f.source_id).field_type)(column))
    keyed = keyed.sort_by([(n, "ascending") for n in names]).combine_chunks()
    # A new partition starts where any partition value differs from the row before (nulls compare equal).
    n = keyed.num_rows
    starts_mask = None
    for name in names:
        col = keyed.column(name).combine_chunks()
        prev, cur = col.slice(0, n - 1), col.slice(1)
        differs = pc.fill_null(pc.not_equal(prev, cur), False)
        differs = pc.or_(differs, pc.xor(pc.is_null(prev), pc.is_null(cur)))
        starts_mask = differs if starts_mask is None else pc.or_(starts_mask, differs)
    starts = [0] + ([i + 1 for i in pc.indices_nonzero(starts_mask).to_pylist()] if n > 1 else [])
    bounds = starts + [n]
    firsts = keyed.select(names).take(pa.array(starts)).to_pylist()
    out = []
    for (lo, hi), values in zip(zip(bounds, bounds[1:]), firsts):
        key = PartitionKey(
            field_values=[PartitionFieldValue(field=f, value=values[name]) for f, name in zip(spec.fields, names)],
            partition_spec=spec,
            schema=schema,
        )
        out.append((key, keyed.slice(lo, hi - lo).drop_columns(names)))
    return out


# ---- partition values in the batch manifest (JSON) -----------------------------------------------
