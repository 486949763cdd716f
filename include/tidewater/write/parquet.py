"""Writing data files: Arrow chunks in, Parquet data files with Iceberg field ids and metrics out.

Files are written into the table's data location and never committed here. Each writer streams
chunks into one open Parquet file per partition (the table's current spec) and rolls to a new file at
the table's ``write.target-file-size-bytes``; memory is bounded by the chunk size and the number of
partitions one task writes at once, not the batch size.
Data files are returned as plain JSON-able dicts (metrics included) for the batch manifest.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.io.fileformat import FileFormatFactory
from pyiceberg.io.pyarrow import (
    _get_parquet_writer_kwargs,
    _to_requested_schema,
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    parquet_path_to_id_mapping,
    pyarrow_to_schema,
    schema_to_pyarrow,
)
from pyiceberg.manifest import FileFormat
from pyiceberg.table.locations import load_location_provider

from tidewater.batch import staged_data_file
from tidewater.table.partitioning import split

if TYPE_CHECKING:
    from pyiceberg.table import Table

TARGET_FILE_SIZE = "write.target-file-size-bytes"


TARGET_FILE_SIZE_DEFAULT = 512 * 1024 * 1024


def to_table_schema(table: Table, decoded: pa.Table) -> pa.Table:
    """Reorder, fill, promote and tag ``decoded`` with the table schema's field ids."""
    fmt = FileFormatFactory.get(FileFormat.PARQUET)
    schema = table.schema()
    file_schema = pyarrow_to_schema(decoded.schema, name_mapping=schema.name_mapping, format_version=table.format_version)
    batches = [
        _to_requested_schema(requested_schema=schema, file_schema=file_schema, batch=b, include_field_ids=True, format_model=fmt)
        for b in decoded.to_batches()
    ]
    target = schema_to_pyarrow(schema, include_field_ids=True)
    return pa.Table.from_batches(batches).cast(target)  # one physical layout for every file


# Dictionary encoding pays where values repeat. For a column whose values are mostly distinct (ids, offsets,
# times) the writer builds a dictionary of nearly every value until the dictionary page limit, then falls back to
# plain encoding: CPU spent for a larger file. Measured on the pizza events (scripts/profile_data_path.py,
# BENCHMARKS.md): without a dictionary for such columns Parquet encoding took a third less CPU and the files were
# 18% smaller. A column goes without a dictionary in a file when more than DISTINCT_SHARE of the non-null values of
# the file's first rows (up to DICTIONARY_SAMPLE) are distinct; decided once per file, from its data alone.
DISTINCT_SHARE = 0.5
DICTIONARY_SAMPLE = 10_000


def dictionary_columns(rows: pa.Table) -> list[str]:
    """The top-level columns of ``rows`` worth a dictionary (nested columns always keep Parquet's default: one)."""
    sample = rows.slice(0, DICTIONARY_SAMPLE)
    keep = []
    for name, column in zip(sample.column_names, sample.columns):
        if pa.types.is_nested(column.type):
            keep.append(name)
            continue
        present = len(column) - column.null_count
        if present == 0 or pc.count_distinct(column).as_py() <= DISTINCT_SHARE * present:
            keep.append(name)
    return keep


class _OpenFile:
    """One Parquet data file being written (for one partition)."""

    def __init__(self, path: str, stream: Any, writer: pq.ParquetWriter, partition: Any) -> None:
        self.path, self.stream, self.writer, self.partition = path, stream, writer, partition


class DataFileWriter:
    """Streams Arrow tables (already in the table schema) into rolling Parquet data files, one open
    file per partition of the table's current partition spec."""

    def __init__(self, table: Table, file_prefix: str) -> None:
        meta = table.metadata
        self._table = table
        self._io = table.io
        self._schema = table.schema()
        self._spec_id = meta.default_spec_id
        self._props = meta.properties
        self._locations = load_location_provider(table_location=meta.location, table_properties=meta.properties)
        self._kwargs = _get_parquet_writer_kwargs(meta.properties)
        self._target = int(meta.properties.get(TARGET_FILE_SIZE, TARGET_FILE_SIZE_DEFAULT))
        self._prefix = file_prefix
        self._seq = 0
        self._open: dict[Any, _OpenFile] = {}
        self.files: list[dict[str, Any]] = []

    def write(self, data: pa.Table) -> None:
        if data.num_rows == 0:
            return
        for key, rows in split(self._table, data):
            record = None if key is None else tuple(key.partition)
            f = self._open.get(record)
            if f is None:
                self._seq += 1
                name = f"{self._prefix}-{self._seq:05d}-{uuid.uuid4().hex[:12]}.parquet"
                path = self._locations.new_data_location(data_file_name=name, partition_key=key)
                stream = self._io.new_output(path).create(overwrite=False)
                writer = pq.ParquetWriter(
                    stream, schema=rows.schema, store_decimal_as_integer=True, use_dictionary=dictionary_columns(rows), **self._kwargs
                )
                f = self._open[record] = _OpenFile(path, stream, writer, record)
            f.writer.write_table(rows)
            if f.stream.tell() >= self._target:
                self._roll(self._open.pop(record))

    def _roll(self, f: _OpenFile) -> None:
        f.writer.close()
        metadata = f.writer.writer.metadata
        f.stream.close()
        stats = data_file_statistics_from_parquet_metadata(
            parquet_metadata=metadata,
            stats_columns=compute_statistics_plan(self._schema, self._props),
            parquet_column_mapping=parquet_path_to_id_mapping(self._schema),
        )
        size = len(self._io.new_input(f.path))
        self.files.append(staged_data_file(f.path, size, self._spec_id, stats.to_serialized_dict(), f.partition))

    def close(self) -> list[dict[str, Any]]:
        for record in list(self._open):
            self._roll(self._open.pop(record))
        return self.files

    def abort(self) -> list[str]:
        """Stop writing; returns every path this writer created (finished files and the open ones)."""
        paths = [f["file_path"] for f in self.files]
        for f in self._open.values():
            paths.append(f.path)
            try:
                f.writer.close()
                f.stream.close()
            except Exception:  # noqa: BLE001 - the partial file is deleted or left as an orphan either way
                pass
        self._open.clear()
        return paths
