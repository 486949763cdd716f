"""A table's history written directly, for the benchmarks that need a long one (``bench_scale.py``'s history curve,
``bench_audit.py``'s ledger): per snapshot one manifest (the newest snapshot's first data file appended again) and a
manifest list, then one metadata file holding every snapshot, registered in the catalog in place of the table's.

What a pipeline leaves without maintenance (one manifest per commit, the current manifest list naming them all, each
snapshot with its batch's properties), built in O(n); through commits each one rewrites the metadata file of every
earlier snapshot, so n commits cost O(n^2) (1,000 took 577 s here). One difference, so that the size stays linear:
the older snapshots' manifest lists name only their own manifest (a commit's names every earlier one), so an expiry
reads less here than on a real history of this length. The current snapshot, which the plan, the commit and the
audit read, is as a real history's.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any


def append_snapshots(catalog: Any, ident: str, n: int, props_of: Callable[[int], dict[str, str]]) -> None:
    """Append ``n`` snapshots to table ``ident``, the i-th (0-based) with ``props_of(i)`` in its summary."""
    from pyiceberg.manifest import ManifestEntry, ManifestEntryStatus, write_manifest, write_manifest_list
    from pyiceberg.serializers import ToOutputFile
    from pyiceberg.table.refs import MAIN_BRANCH, SnapshotRef, SnapshotRefType
    from pyiceberg.table.snapshots import Operation, Snapshot, SnapshotLogEntry, Summary

    table = catalog.load_table(ident)
    meta, io, base = table.metadata, table.io, table.current_snapshot()
    every = list(base.manifests(io))
    data_file = next(iter(every[0].fetch_manifest_entry(io))).data_file
    totals = {
        k: int(base.summary.additional_properties.get(k, 0) if base.summary else 0)
        for k in ("total-data-files", "total-records", "total-files-size")
    }
    folder, tag = f"{table.location()}/metadata", uuid.uuid4().hex[:8]
    snapshots, log = list(meta.snapshots), list(meta.snapshot_log)
    parent, seq, ts, sid = base.snapshot_id, meta.last_sequence_number, base.timestamp_ms, base.snapshot_id
    for i in range(n):
        sid, seq, ts = sid + 1, seq + 1, ts + 1
        with write_manifest(
            format_version=meta.format_version,
            spec=table.spec(),
            schema=table.schema(),
            output_file=io.new_output(f"{folder}/{tag}-m{i}.avro"),
            snapshot_id=sid,
            avro_compression="deflate",
        ) as writer:
            writer.add(
                ManifestEntry.from_args(
                    status=ManifestEntryStatus.ADDED, snapshot_id=sid, sequence_number=seq, file_sequence_number=seq, data_file=data_file
                )
            )
        manifest = writer.to_manifest_file()
        manifest.sequence_number = manifest.min_sequence_number = seq
        every.append(manifest)
        listed = f"{folder}/snap-{sid}-{tag}.avro"
        with write_manifest_list(
            format_version=meta.format_version,
            output_file=io.new_output(listed),
            snapshot_id=sid,
            parent_snapshot_id=parent,
            sequence_number=seq,
            avro_compression="deflate",
        ) as lw:
            lw.add_manifests(every if i == n - 1 else [manifest])
        totals = {
            "total-data-files": totals["total-data-files"] + 1,
            "total-records": totals["total-records"] + data_file.record_count,
            "total-files-size": totals["total-files-size"] + data_file.file_size_in_bytes,
        }
        added = {
            "added-data-files": "1",
            "added-records": str(data_file.record_count),
            "added-files-size": str(data_file.file_size_in_bytes),
        }
        summary = Summary(Operation.APPEND, **{**props_of(i), **added, **{k: str(v) for k, v in totals.items()}})
        snapshots.append(
            Snapshot(
                snapshot_id=sid,
                parent_snapshot_id=parent,
                sequence_number=seq,
                timestamp_ms=ts,
                manifest_list=listed,
                summary=summary,
                schema_id=meta.current_schema_id,
            )
        )
        log.append(SnapshotLogEntry(snapshot_id=sid, timestamp_ms=ts))
        parent = sid
    grown = meta.model_copy(
        update={
            "snapshots": snapshots,
            "snapshot_log": log,
            "current_snapshot_id": sid,
            "last_sequence_number": seq,
            "last_updated_ms": ts,
            "refs": {MAIN_BRANCH: SnapshotRef(snapshot_id=sid, snapshot_ref_type=SnapshotRefType.BRANCH)},
        }
    )
    location = f"{folder}/99999-{tag}.metadata.json"
    ToOutputFile.table_metadata(grown, io.new_output(location))
    catalog.drop_table(ident)
    catalog.register_table(ident, location)
