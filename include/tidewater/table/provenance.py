"""Where a row came from: the Kafka metadata columns a table keeps (``format.metadata``) and the questions they
answer about its rows: which rows came from some offset ranges (replays delete them, the audit reads them, an
append-missing replay skips what is present) and whether every row can answer at all."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pyarrow as pa

from tidewater.batch import PartitionRange
from tidewater.config.spec import PipelineSpec
from tidewater.errors import ConfigError
from tidewater.table.filters import all_of, any_of, at_least, below, equal

if TYPE_CHECKING:
    from pyiceberg.table import Table


def metadata_columns(spec: PipelineSpec) -> tuple[str, str, str]:
    """Names of the topic, partition and offset columns (dotted for the struct form)."""
    if spec.format.metadata == "struct":
        return "_kafka.topic", "_kafka.partition", "_kafka.offset"
    return "_kafka_topic", "_kafka_partition", "_kafka_offset"


def rows_filter(spec: PipelineSpec, ranges: list[PartitionRange] | tuple[PartitionRange, ...]) -> Any:
    """An Iceberg row filter selecting the rows that came from ``ranges``."""
    topic, partition, offset = metadata_columns(spec)
    return any_of(
        all_of((equal(topic, r.topic), equal(partition, r.partition), at_least(offset, r.start), below(offset, r.end))) for r in ranges
    )


def present_offsets(spec: PipelineSpec, table: Table, ranges: list[PartitionRange] | tuple[PartitionRange, ...]) -> Any:
    """(topic, partition, offset) of the rows the table holds from ``ranges`` (Arrow table)."""
    if table is None or not ranges or table.current_snapshot() is None:
        return pa.table({"topic": pa.array([], pa.string()), "partition": pa.array([], pa.int32()), "offset": pa.array([], pa.int64())})
    cols = metadata_columns(spec)
    top = cols[0].split(".")[0]
    data = table.scan(row_filter=rows_filter(spec, ranges), selected_fields=tuple({c.split(".")[0] for c in cols} | {top})).to_arrow()
    return _coordinates(spec, data)


def staged_offsets(spec: PipelineSpec, table: Table, paths: list[str]) -> Any:
    """(topic, partition, offset) of the rows of data files written for ``table`` and not committed yet (Arrow
    table), read through the table's FileIO (local files or object storage alike)."""
    import pyarrow.parquet as pq

    columns = sorted({c.split(".")[0] for c in metadata_columns(spec)})
    parts = []
    for path in paths:
        with table.io.new_input(path).open() as stream:
            parts.append(pq.read_table(stream, columns=columns))
    return _coordinates(spec, pa.concat_tables(parts))


def _coordinates(spec: PipelineSpec, data: Any) -> Any:
    """The metadata columns of ``data`` as (topic, partition, offset)."""
    if spec.format.metadata == "struct":
        s = data.column("_kafka").combine_chunks()
        return pa.table({"topic": s.field("topic"), "partition": s.field("partition").cast(pa.int32()), "offset": s.field("offset")})
    return pa.table(
        {
            "topic": data.column("_kafka_topic"),
            "partition": data.column("_kafka_partition").cast(pa.int32()),
            "offset": data.column("_kafka_offset"),
        }
    )


def check_rows_carry_offsets(spec: PipelineSpec, table: Table) -> None:
    """Refuse when some rows lack their source offset (written before ``format.metadata`` was set): a
    replay could not find them and would add their records a second time. Uses file metrics only."""
    if table.current_snapshot() is None:
        return
    offset_col = metadata_columns(spec)[2]
    try:
        field_id = table.schema().find_field(offset_col).field_id
    except ValueError:
        raise ConfigError(f"format.metadata: the table has no {offset_col} column yet: its rows cannot be matched to offsets") from None
    missing = 0
    for task in table.scan(selected_fields=(offset_col.split(".")[0],)).plan_files():
        counts = task.file.null_value_counts or {}
        missing += int(counts.get(field_id, 0)) if field_id in counts else task.file.record_count
    if missing:
        raise ConfigError(
            f"format.metadata: {missing} rows of {spec.table.identifier} have no {offset_col} (written "
            "before format.metadata was set); a replay cannot match them to offsets and would add their "
            "records again"
        )
