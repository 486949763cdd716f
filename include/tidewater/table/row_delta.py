"""A row delta: new data files and position delete files in one snapshot (Iceberg's ``RowDelta``).

pyiceberg 0.12 has no public API that adds delete files to a commit (it writes data manifests only), so
this is a small subclass of its fast-append producer that also writes one delete manifest per partition
spec. Why not Iceberg's Java ``RowDelta`` through Spark: the commit step would need a JVM (about 3 s
more per batch, measured for the write job), and the exactly-once check (offsets, batch id) must stay in
the one commit primitive that every other commit of ours goes through. The snapshot is then an ordinary
pyiceberg commit: it asserts that the branch head is the snapshot the deletes were computed against, so a
concurrent commit (another batch, a compaction) makes it fail and the primitive re-plans the deletes on
the new files. Spark and pyiceberg both read the result (tests/integration/test_changes.py).
Pinned by the frozen constraints; the private names used are ``_FastAppendFiles``, ``_added_data_files``,
``_compression``, ``_snapshot_id`` and ``new_manifest_output``.

The rows a row delta touches are found here too: where a batch's changed keys live in the table now (data
files pruned by the keys' bounds, their id columns read, positions already deleted left out), the position
delete files that remove them, and whether a snapshot since a batch removed a key's row (a dead-letter retry).
"""

from __future__ import annotations

import os
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestWriterV2,
)
from pyiceberg.table.snapshots import Operation
from pyiceberg.table.update.snapshot import _FastAppendFiles

from tidewater.errors import TerminalError
from tidewater.table.filters import all_of, at_least, at_most
from tidewater.table.summary import find_batch_snapshot
from tidewater.transform.changes import OFFSET, PARTITION

if TYPE_CHECKING:
    from pyiceberg.table import Table


def _delete_manifest_writer(producer: Any, spec: Any) -> Any:
    class DeleteManifestWriter(ManifestWriterV2):
        def content(self) -> ManifestContent:
            return ManifestContent.DELETES

        @property
        def _meta(self) -> dict[str, str]:
            return {**super()._meta, "content": "deletes"}

    return DeleteManifestWriter(spec, producer.schema(), producer.new_manifest_output(), producer.snapshot_id, producer._compression)


def row_delta(tx: Any, table: Table, files: list[Any], deletes: list[Any], properties: dict[str, str], branch: str) -> None:
    """Add ``files`` (data) and ``deletes`` (position delete files) to ``branch`` in one snapshot of ``tx``."""
    if table.format_version < 2:
        raise TerminalError(
            "position deletes need a format-version 2 table; upgrade it with `ALTER TABLE ... SET TBLPROPERTIES ('format-version'='2')`",
            table=".".join(table.name()),
        )

    class RowDelta(_FastAppendFiles):
        def _manifests(self) -> list[Any]:
            manifests = super()._manifests()
            by_spec: dict[int, list[Any]] = {}
            for f in deletes:
                by_spec.setdefault(f.spec_id, []).append(f)
            for spec_id, group in by_spec.items():
                with _delete_manifest_writer(self, self.spec(spec_id)) as writer:
                    for f in group:
                        writer.add(
                            ManifestEntry.from_args(
                                status=ManifestEntryStatus.ADDED,
                                snapshot_id=self.snapshot_id,
                                sequence_number=None,
                                file_sequence_number=None,
                                data_file=f,
                            )
                        )
                manifests.append(writer.to_manifest_file())
            return manifests

        def _summary(self, snapshot_properties: Any = None) -> Any:
            data = self._added_data_files
            self._added_data_files = data + deletes  # the summary counts added delete files and positions
            try:
                return super()._summary(snapshot_properties or {})
            finally:
                self._added_data_files = data

    producer = RowDelta(
        operation=Operation.OVERWRITE if deletes else Operation.APPEND,
        transaction=tx,
        io=table.io,
        branch=branch,
        snapshot_properties=properties,
    )
    with producer:
        for f in files:
            producer.append_data_file(f)


PATH_FIELD_ID, POS_FIELD_ID = 2147483546, 2147483545


def _file_columns(pf: Any, table: Table, id_columns: list[str]) -> dict[str, str]:
    """The names the id columns have in one data file (matched by Iceberg field id, so renames are followed)."""
    schema = table.schema()
    by_id = {}
    for f in pf.schema_arrow:
        fid = (f.metadata or {}).get(b"PARQUET:field_id")
        if fid is not None:
            by_id[int(fid)] = f.name
    return {c: by_id.get(schema.find_field(c).field_id, c) for c in id_columns}


def _deleted_positions(table: Table, task: Any) -> Any:
    """Positions of ``task.file`` already deleted by the table's position delete files."""
    gone = []
    for d in task.delete_files:
        if d.content != DataFileContent.POSITION_DELETES:
            raise TerminalError(
                f"{d.file_path} is an equality delete file (written by another tool): change tables "
                "need position deletes only; rewrite the table's deletes with Spark first",
                table=".".join(table.name()),
            )
        with table.io.new_input(d.file_path).open() as fh:
            t = pq.read_table(fh, columns=["file_path", "pos"])
        gone.append(t.filter(pc.equal(t.column("file_path"), task.file.file_path)).column("pos"))
    return pa.chunked_array([c for g in gone for c in g.chunks], pa.int64()) if gone else None


def _bounds_filter(keys: Any, id_columns: list[str]) -> Any:
    """A filter that prunes data files by the changed keys' min/max (per id column)."""
    bounds = []
    for c in id_columns:
        mm = pc.min_max(keys.column(c))
        lo, hi = mm["min"].as_py(), mm["max"].as_py()
        if lo is None or isinstance(lo, (bytes, dict, list)):
            continue
        bounds += [at_least(c, lo), at_most(c, hi)]
    return all_of(bounds)


def _hits_in_file(table: Table, task: Any, indexed: Any, id_columns: list[str], source: bool) -> Any | None:
    """The live rows of one data file whose keys are in ``indexed``: a table of ``__pos`` (sorted) and
    ``__key`` (index into ``indexed``), with ``source`` also each row's ``_kafka_partition``/``_kafka_offset``."""
    extra = [PARTITION, OFFSET] if source else []
    with table.io.new_input(task.file.file_path).open() as fh:
        pf = pq.ParquetFile(fh)
        names = _file_columns(pf, table, id_columns + extra)
        data = pf.read(columns=list(names.values())).rename_columns(list(names))
    want = indexed.select(id_columns).schema
    ids = data.select(id_columns)
    if ids.schema != want:
        data = pa.Table.from_arrays([*ids.cast(want).columns, *data.select(extra).columns], names=id_columns + extra)
    if len(id_columns) == 1:  # a set lookup first: most rows of most files are not changed
        candidates = pc.indices_nonzero(pc.is_in(data.column(0), value_set=indexed.column(0).combine_chunks()))
        if not len(candidates):
            return None
        data = data.take(candidates).append_column("__pos", pc.cast(candidates, pa.int64()))
    else:
        data = data.append_column("__pos", pa.array(range(data.num_rows), pa.int64()))
    gone = _deleted_positions(table, task)
    if gone is not None and len(gone):
        data = data.filter(pc.invert(pc.is_in(data.column("__pos"), value_set=gone.combine_chunks())))
    hit = data.join(indexed.select([*id_columns, "__key"]), keys=id_columns, join_type="inner")
    return hit.sort_by("__pos").select(["__pos", "__key", *extra]) if hit.num_rows else None


def find_rows(table: Table, keys: Any, id_columns: list[str], source: bool = False, branch: str | None = None) -> list[tuple[Any, Any]]:
    """Where the changed keys live in ``table`` now (on ``branch``, default main): [(data file, rows)], rows as
    ``_hits_in_file`` gives them. Reads only the id columns of files whose bounds admit the keys (files in
    parallel: Arrow's readers and lookups release the GIL), and a file's delete files only when it holds a
    changed key."""
    head = table.snapshot_by_name(branch) if branch else table.current_snapshot()
    if head is None or keys.num_rows == 0:
        return []
    indexed = keys.append_column("__key", pa.array(np.arange(keys.num_rows), pa.int64()))
    tasks = list(
        table.scan(
            row_filter=_bounds_filter(keys, id_columns), selected_fields=tuple(id_columns), snapshot_id=head.snapshot_id
        ).plan_files()
    )
    with ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1))) as pool:
        found = list(pool.map(lambda t: _hits_in_file(table, t, indexed, id_columns, source), tasks))
    return [(t.file, f) for t, f in zip(tasks, found) if f is not None]


def existed_keys(keys: Any, found: list[tuple[Any, Any]]) -> Any:
    """Per key of ``keys``: whether ``found`` holds a live row of it."""
    seen = pa.concat_arrays([t.column("__key").combine_chunks() for _, t in found]) if found else pa.array([], pa.int64())
    return pc.is_in(pa.array(np.arange(keys.num_rows), pa.int64()), value_set=seen)


def live_rows(table: Any, keys: Any, id_columns: list[str], branch: str | None = None) -> tuple[list[tuple[Any, Any]], Any]:
    """[(data file, sorted positions of the changed keys' live rows)] on ``branch`` (default main), and per key
    whether it existed."""
    found = find_rows(table, keys, id_columns, branch=branch)
    return [(f, t.column("__pos").combine_chunks()) for f, t in found], existed_keys(keys, found)


def write_position_deletes(table: Table, hits: list[tuple[Any, Any]], prefix: str) -> list[Any]:
    """One position delete file per data file in ``hits``, beside it (same partition directory)."""
    schema = pa.schema(
        [
            pa.field("file_path", pa.string(), nullable=False, metadata={"PARQUET:field_id": str(PATH_FIELD_ID)}),
            pa.field("pos", pa.int64(), nullable=False, metadata={"PARQUET:field_id": str(POS_FIELD_ID)}),
        ]
    )
    out = []
    for i, (data_file, positions) in enumerate(hits):
        path = f"{os.path.dirname(data_file.file_path)}/{prefix}-deletes-{i:05d}-{uuid.uuid4().hex[:12]}.parquet"
        rows = pa.table([pa.repeat(data_file.file_path, len(positions)), positions], schema=schema)
        with table.io.new_output(path).create(overwrite=False) as stream:
            pq.write_table(rows, stream)
        lo, hi = positions[0].as_py(), positions[-1].as_py()
        f = DataFile.from_args(
            _table_format_version=table.format_version,
            content=DataFileContent.POSITION_DELETES,
            file_path=path,
            file_format=FileFormat.PARQUET,
            partition=data_file.partition,
            record_count=len(positions),
            file_size_in_bytes=len(table.io.new_input(path)),
            value_counts={PATH_FIELD_ID: len(positions), POS_FIELD_ID: len(positions)},
            null_value_counts={PATH_FIELD_ID: 0, POS_FIELD_ID: 0},
            lower_bounds={PATH_FIELD_ID: data_file.file_path.encode(), POS_FIELD_ID: lo.to_bytes(8, "little", signed=True)},
            upper_bounds={PATH_FIELD_ID: data_file.file_path.encode(), POS_FIELD_ID: hi.to_bytes(8, "little", signed=True)},
            sort_order_id=None,
            equality_ids=None,
            key_metadata=None,
        )
        f.spec_id = data_file.spec_id  # not a manifest field: pyiceberg keeps it beside the record
        out.append(f)
    return out


MAX_LATER_SNAPSHOTS = 200  # snapshots that removed rows, searched for a later delete of a retried key (beyond: refused)


def removed_since(table: Table, keys: Any, ids: list[str], letter_batches: tuple[str, ...], branch: str | None) -> Any:
    """Per key of ``keys``: None when no snapshot since the earliest of ``letter_batches`` (their own included)
    removed a row of the key, else why it may have (a row of the key was live before a snapshot that removed rows,
    or the history cannot tell: the letters' batch is no longer in it, too many snapshots removed rows)."""
    n = keys.num_rows
    found = [s for b in letter_batches if (s := find_batch_snapshot(table, b)) is not None]
    if not letter_batches or len(found) < len(letter_batches):
        return ["the history no longer holds the letters' batch, so a later delete of the key cannot be ruled out"] * n
    since = min(s.sequence_number or 0 for s in found)
    head = table.snapshot_by_name(branch) if branch else table.current_snapshot()
    chain, snap = [], head
    while snap is not None and (snap.sequence_number or 0) >= since:
        chain.append(snap)
        snap = table.snapshot_by_id(snap.parent_snapshot_id) if snap.parent_snapshot_id is not None else None
    removing = [
        s
        for s in chain
        if s.parent_snapshot_id is not None
        and s.summary is not None
        and (int(s.summary.get("added-position-deletes", 0) or 0) or int(s.summary.get("deleted-records", 0) or 0))
    ]
    if len(removing) > MAX_LATER_SNAPSHOTS:
        return [f"{len(removing)} snapshots removed rows since the letters' batch (more than {MAX_LATER_SNAPSHOTS} searched)"] * n
    out: list[str | None] = [None] * n
    indexed = keys.append_column("__key", pa.array(np.arange(n), pa.int64()))
    for s in removing:
        before = table.scan(row_filter=_bounds_filter(keys, ids), selected_fields=tuple(ids), snapshot_id=s.parent_snapshot_id).to_arrow()
        if before.num_rows:
            hit = before.cast(indexed.select(ids).schema).join(indexed, keys=ids, join_type="inner")
            for k in hit.column("__key").to_pylist():  # error path: the retried keys only
                out[k] = out[k] or f"a row of the key was removed by snapshot {s.snapshot_id}, after the letter's batch"
    return out
