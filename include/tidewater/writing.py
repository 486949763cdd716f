"""Writing data files: Arrow chunks in, Parquet data files with Iceberg field ids and metrics out.

Files are written into the table's data location and never committed here. Each writer streams
chunks into one open Parquet file and rolls to a new file at the table's
``write.target-file-size-bytes``; memory is bounded by the chunk size, not the batch size.
Data files are returned as plain JSON-able dicts (metrics included) for the batch manifest.
"""

from __future__ import annotations

import base64
import uuid
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from tidewater.errors import TerminalError

TARGET_FILE_SIZE = "write.target-file-size-bytes"
TARGET_FILE_SIZE_DEFAULT = 512 * 1024 * 1024


def to_table_schema(table: Any, decoded: pa.Table) -> pa.Table:
    """Reorder, fill, promote and tag ``decoded`` with the table schema's field ids."""
    from pyiceberg.io.fileformat import FileFormatFactory
    from pyiceberg.io.pyarrow import _to_requested_schema, pyarrow_to_schema, schema_to_pyarrow
    from pyiceberg.manifest import FileFormat

    fmt = FileFormatFactory.get(FileFormat.PARQUET)
    schema = table.schema()
    file_schema = pyarrow_to_schema(decoded.schema, name_mapping=schema.name_mapping, format_version=table.format_version)
    batches = [
        _to_requested_schema(
            requested_schema=schema, file_schema=file_schema, batch=b, include_field_ids=True, format_model=fmt
        )
        for b in decoded.to_batches()
    ]
    target = schema_to_pyarrow(schema, include_field_ids=True)
    return pa.Table.from_batches(batches).cast(target)  # one physical layout for every file


class DataFileWriter:
    """Streams Arrow tables (already in the table schema) into rolling Parquet data files."""

    def __init__(self, table: Any, file_prefix: str) -> None:
        from pyiceberg.io.pyarrow import _get_parquet_writer_kwargs
        from pyiceberg.table.locations import load_location_provider

        meta = table.metadata
        if not table.spec().is_unpartitioned():
            raise TerminalError(
                "writing to partitioned tables is not supported yet; use an unpartitioned table",
                table=".".join(table.name()),
            )
        self._table = table
        self._io = table.io
        self._schema = table.schema()
        self._props = meta.properties
        self._locations = load_location_provider(table_location=meta.location, table_properties=meta.properties)
        self._kwargs = _get_parquet_writer_kwargs(meta.properties)
        self._target = int(meta.properties.get(TARGET_FILE_SIZE, TARGET_FILE_SIZE_DEFAULT))
        self._prefix = file_prefix
        self._seq = 0
        self._writer: pq.ParquetWriter | None = None
        self._stream: Any = None
        self._path: str | None = None
        self._output: Any = None
        self.files: list[dict[str, Any]] = []

    def write(self, data: pa.Table) -> None:
        if data.num_rows == 0:
            return
        if self._writer is None:
            self._seq += 1
            name = f"{self._prefix}-{self._seq:05d}-{uuid.uuid4().hex[:12]}.parquet"
            self._path = self._locations.new_data_location(data_file_name=name)
            self._output = self._io.new_output(self._path)
            self._stream = self._output.create(overwrite=False)
            self._writer = pq.ParquetWriter(self._stream, schema=data.schema, store_decimal_as_integer=True, **self._kwargs)
        self._writer.write_table(data)
        if self._stream.tell() >= self._target:
            self._roll()

    def _roll(self) -> None:
        from pyiceberg.io.pyarrow import (
            compute_statistics_plan,
            data_file_statistics_from_parquet_metadata,
            parquet_path_to_id_mapping,
        )

        assert self._writer is not None and self._path is not None
        self._writer.close()
        metadata = self._writer.writer.metadata
        self._stream.close()
        stats = data_file_statistics_from_parquet_metadata(
            parquet_metadata=metadata,
            stats_columns=compute_statistics_plan(self._schema, self._props),
            parquet_column_mapping=parquet_path_to_id_mapping(self._schema),
        )
        size = len(self._io.new_input(self._path))
        self.files.append(serialize_data_file(self._path, size, self._table.metadata.default_spec_id, stats.to_serialized_dict()))
        self._writer = None
        self._stream = None
        self._path = None

    def close(self) -> list[dict[str, Any]]:
        if self._writer is not None:
            self._roll()
        return self.files

    def abort(self) -> list[str]:
        """Stop writing; returns every path this writer created (finished files and the open one)."""
        paths = [f["file_path"] for f in self.files]
        if self._writer is not None:
            paths.append(self._path)  # type: ignore[arg-type]
            try:
                self._writer.close()
                self._stream.close()
            except Exception:  # the partial file is deleted or left as an orphan either way
                pass
            self._writer = None
        return paths


def _enc(d: dict[int, bytes]) -> dict[str, str]:
    return {str(k): base64.b64encode(v).decode() for k, v in d.items()}


def _dec(d: dict[str, str]) -> dict[int, bytes]:
    return {int(k): base64.b64decode(v) for k, v in d.items()}


def _ints(d: dict[Any, Any]) -> dict[str, int]:
    return {str(k): int(v) for k, v in d.items()}


def serialize_data_file(path: str, size: int, spec_id: int, stats: dict[str, Any]) -> dict[str, Any]:
    return {
        "file_path": path,
        "file_format": "PARQUET",
        "file_size_in_bytes": int(size),
        "spec_id": int(spec_id),
        "record_count": int(stats["record_count"]),
        "column_sizes": _ints(stats["column_sizes"]),
        "value_counts": _ints(stats["value_counts"]),
        "null_value_counts": _ints(stats["null_value_counts"]),
        "nan_value_counts": _ints(stats["nan_value_counts"]),
        "lower_bounds": _enc(stats["lower_bounds"]),
        "upper_bounds": _enc(stats["upper_bounds"]),
        "split_offsets": [int(x) for x in (stats["split_offsets"] or [])],
    }


def deserialize_data_file(d: dict[str, Any], format_version: int) -> Any:
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
    from pyiceberg.typedef import Record

    def ints(x: dict[str, Any]) -> dict[int, int]:
        return {int(k): int(v) for k, v in x.items()}

    return DataFile.from_args(
        _table_format_version=format_version,
        content=DataFileContent.DATA,
        file_path=d["file_path"],
        file_format=FileFormat.PARQUET,
        partition=Record(),
        record_count=d["record_count"],
        file_size_in_bytes=d["file_size_in_bytes"],
        column_sizes=ints(d["column_sizes"]),
        value_counts=ints(d["value_counts"]),
        null_value_counts=ints(d["null_value_counts"]),
        nan_value_counts=ints(d["nan_value_counts"]),
        lower_bounds=_dec(d["lower_bounds"]),
        upper_bounds=_dec(d["upper_bounds"]),
        split_offsets=d["split_offsets"] or None,
        sort_order_id=None,
        spec_id=d["spec_id"],
        equality_ids=None,
        key_metadata=None,
    )
