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
"""

from __future__ import annotations

from typing import Any

from pyiceberg.manifest import ManifestContent, ManifestEntry, ManifestEntryStatus, ManifestWriterV2
from pyiceberg.table.snapshots import Operation
from pyiceberg.table.update.snapshot import _FastAppendFiles

from tidewater.errors import TerminalError


def _delete_manifest_writer(producer: Any, spec: Any) -> Any:
    class DeleteManifestWriter(ManifestWriterV2):
        def content(self) -> ManifestContent:
            return ManifestContent.DELETES

        @property
        def _meta(self) -> dict[str, str]:
            return {**super()._meta, "content": "deletes"}

    return DeleteManifestWriter(spec, producer.schema(), producer.new_manifest_output(), producer.snapshot_id,
                                producer._compression)


def row_delta(tx: Any, table: Any, files: list[Any], deletes: list[Any], properties: dict[str, str], branch: str) -> None:
    """Add ``files`` (data) and ``deletes`` (position delete files) to ``branch`` in one snapshot of ``tx``."""
    if table.format_version < 2:
        raise TerminalError("position deletes need a format-version 2 table; upgrade it with "
                            "`ALTER TABLE ... SET TBLPROPERTIES ('format-version'='2')`", table=table.name())

    class RowDelta(_FastAppendFiles):
        def _manifests(self) -> list[Any]:
            manifests = super()._manifests()
            by_spec: dict[int, list[Any]] = {}
            for f in deletes:
                by_spec.setdefault(f.spec_id, []).append(f)
            for spec_id, group in by_spec.items():
                with _delete_manifest_writer(self, self.spec(spec_id)) as writer:
                    for f in group:
                        writer.add(ManifestEntry.from_args(status=ManifestEntryStatus.ADDED, snapshot_id=self.snapshot_id,
                                                           sequence_number=None, file_sequence_number=None, data_file=f))
                manifests.append(writer.to_manifest_file())
            return manifests

        def _summary(self, snapshot_properties: Any = None) -> Any:
            data = self._added_data_files
            self._added_data_files = data + deletes  # the summary counts added delete files and positions
            try:
                return super()._summary(snapshot_properties or {})
            finally:
                self._added_data_files = data

    producer = RowDelta(operation=Operation.OVERWRITE if deletes else Operation.APPEND, transaction=tx, io=table.io,
                        branch=branch, snapshot_properties=properties)
    with producer:
        for f in files:
            producer.append_data_file(f)
