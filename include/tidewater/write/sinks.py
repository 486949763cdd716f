"""Per target table, what one task writes: the table's schema set-up, the offsets it saw, its data files."""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from tidewater.batch import Mode
from tidewater.config.spec import PipelineSpec
from tidewater.errors import TerminalError
from tidewater.table import limits
from tidewater.table.catalog import load_table, retry_busy
from tidewater.table.evolution import (
    arrow_paths,
    change_request,
    ensure_table,
    new_fields,
    pending_change,
    table_arrow_schema,
    unified,
    without_new_fields,
)
from tidewater.table.provenance import present_offsets
from tidewater.table.summary import CHANGES, DROPPED, PIPELINE, RECOVERED, committed_state, summary_dict
from tidewater.table.targets import TargetRole
from tidewater.transform.changes import ops_mask
from tidewater.transform.keys import key_field_names
from tidewater.write.parquet import DataFileWriter, to_table_schema

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

log = logging.getLogger(__name__)


class TableSink:
    """Everything one Spark task writes to one target table: the schema changes its rows need, data files,
    and (routed pipelines) the rows it leaves out because the table already committed them."""

    def __init__(
        self,
        spec: PipelineSpec,
        tspec: Any,
        catalog: Catalog,
        prefix: str,
        role: TargetRole,
        batch: tuple[str, str] | None = None,
        replay: tuple[Mode, Any] | None = None,
        registry: Any = None,
    ) -> None:
        self.spec, self.tspec, self.catalog, self.prefix = spec, tspec, catalog, prefix
        self.batch = batch  # (batch id, task tag): schema changes are provisional until the batch commits
        self.table = load_table(catalog, tspec.identifier)
        self.view = spec.for_table(tspec.identifier, self.table) if role.has_own_settings else spec
        self.registry = registry  # Avro message keys (``key_ids``)
        if role.has_own_settings:
            self.tspec = tspec = dataclasses.replace(tspec, id_columns=self.view.table.id_columns)
        self.writer: Any = None
        self.files: list[dict[str, Any]] = []
        self.ignored_fields: set[str] = set()  # fields not added because evolve_schema is off
        self.rows = 0
        self.already = 0  # routed: rows of records this table committed before (a retried batch)
        # routed replays: (mode, the task's range); append-missing leaves out the offsets this table holds
        self.replay = replay
        self._present: Any = None
        self.seen: dict[str, dict[int, int | None]] = {}
        self._committed = committed_state(self.table, tspec.branch).offsets if role.keeps_own_offsets and self.table is not None else {}
        newest = newest_batch(self.table) if role.reached_by_routing and self.table is not None else None
        self.owner = newest.get(PIPELINE) if newest else None
        # a routed table's records must be what the table holds: changes to rows, or rows to append
        self.kind_mismatch = (
            None
            if newest is None or (CHANGES in newest) == self.view.applies_changes
            else (
                f"table {tspec.identifier} holds "
                + (
                    "changes applied to rows, but this pipeline appends rows to it"
                    if CHANGES in newest
                    else "appended rows, but this pipeline applies changes to it (table.upsert / op_field)"
                )
            )
        )
        self.added = 0  # fields this task added to the table (table.max_new_columns)
        # a schema probe (see task.probe_schema): the only sink that changes the table itself; it writes no file
        self.probe = False
        self.requests: list[dict[str, Any]] = []  # changes reported (see write), the driver makes them
        self.assumed: Any = None  # the Arrow schema the table will have once the driver made them

    def key_ids(self, chunk: Any) -> str | None:
        """A change table whose id columns come from the message keys (``PipelineSpec.ids_from_keys``): once the
        table exists they are its identifier fields; before, the chunk's first key names them (and the table is
        created with them). Returns why a record cannot be applied when no id columns can be found, else None."""
        if not self.view.applies_changes or self.tspec.id_columns:
            return None
        where = f"table {self.tspec.identifier}: its id columns come from the message keys (id_columns is empty), but"
        if self.table is not None:
            return f"{where} the table has no identifier fields; set its id_columns"

        names, offset = key_field_names(chunk, self.registry)
        if not names:
            found = (
                f"no record of {chunk.topic}[{chunk.partition}] in this chunk has a key"
                if offset is None
                else f"the key at {chunk.topic}[{chunk.partition}] offset {offset} is not a record of fields"
            )
            return f"{where} {found} (a source table without a primary key?); set its id_columns"
        self.tspec = dataclasses.replace(self.tspec, id_columns=names)
        self.view = dataclasses.replace(self.view, table=self.tspec)
        log.info(
            "table %s: id columns %s from the message key at %s[%d] offset %d",
            self.tspec.identifier,
            names,
            chunk.topic,
            chunk.partition,
            offset,
        )
        return None

    @property
    def foreign(self) -> bool:
        """The table holds another pipeline's batches: routed records must not land there."""
        return self.owner is not None and self.owner != self.spec.name

    def threshold(self, topic: str, partition: int) -> int | None:
        """Routed pipelines: records below this offset are already in the table (recorded for the commit)."""
        t = self._committed.get(topic, {}).get(partition)
        self.seen.setdefault(topic, {})[partition] = t
        return t

    def held(self, topic: str, partition: int, offsets: Any) -> Any:
        """Which of these offsets (of rows bound for this table) the table already holds, as a boolean mask, or None
        for none. A batch: those below the table's own committed offset (a retried batch; the pipeline's own table
        keeps none apart from the batch's). A replay re-lands committed records, so none, except with append-missing
        and dead-letter retries: the offsets of rows the table holds from the task's range (read once per task, from
        the table's Kafka metadata columns; without them no row can be matched to an offset, and none is held)."""
        if self.replay is None:
            t = self.threshold(topic, partition)
            return None if t is None else pc.less(offsets, t)
        mode, rng = self.replay
        if mode is not Mode.APPEND_MISSING or self.table is None or self.view.format.metadata not in ("prefixed", "struct"):
            return None
        if self._present is None:
            self._present = present_offsets(self.view, self.table, [rng]).column("offset").combine_chunks()
        return pc.is_in(offsets, value_set=self._present)

    def admit(self, decoded: Any) -> tuple[Any, list[Any]]:
        """(rows within the table's schema limits, rows over them as ``limits.Rejected``): see
        ``table/limits.py``. With ``evolve_schema`` off nothing is added, so nothing is over a limit."""
        if not decoded.num_rows or (self.table is not None and not self.tspec.evolve_schema):
            return decoded, []
        return limits.check(decoded, self.schema_for_limits(), self.tspec.limits(), self.added)

    def write(self, decoded: Any) -> None:
        """Write ``decoded`` to this task's data files. A chunk that needs the table created or its schema
        changed is not written: the change is recorded in ``requests`` for the write job's driver, which makes
        it once and runs the task again (``write/job.py``); only the plan step's probe (``probe``)
        changes the table itself."""
        if not decoded.num_rows:
            return
        decoded = staged_truncates(self.view, decoded)
        table = self.table
        if table is not None and not self.tspec.evolve_schema:
            extra = new_fields(table, decoded.schema)
            if extra:
                self.ignored_fields.update(extra)
                decoded = without_new_fields(table, decoded)
        change = pending_change(self.tspec, table, decoded)
        if change and not self.probe:
            self.request(decoded, change)
            return
        if change:
            self.added += len(new_fields(table, decoded.schema)) if table is not None else 0
            current = table
            table = self.table = retry_busy(
                lambda: ensure_table(self.catalog, self.tspec, current, decoded, self.batch),
                "creating or evolving the table",
                self.tspec.identifier,
            )
        if self.probe or self.requests:
            return
        if table is None:  # a missing table is a pending change: created above, or requested and returned
            raise TerminalError(f"{self.tspec.identifier}: no table to write to", table=self.tspec.identifier)
        if self.writer is None:
            self.writer = DataFileWriter(table, self.prefix + f"-s{table.schema().schema_id}")
        self.writer.write(to_table_schema(table, decoded))
        self.rows += decoded.num_rows

    def request(self, decoded: Any, change: Any) -> None:
        """Record a change for the driver; later chunks are checked against the schema the table will have
        (``assumed``), so the limits count the fields this task asks for as added."""
        req = change_request(self.tspec.identifier, decoded, change, self.tspec.id_columns)
        if req not in self.requests:
            self.requests.append(req)
        before = self.schema_for_limits()
        if before is not None:
            self.added += len(arrow_paths(pa.struct(list(decoded.schema))) - arrow_paths(pa.struct(list(before))))
        # conflicting types keep the schema as it was: the driver's change fails naming the field
        self.assumed = decoded.schema if before is None else (unified([before, decoded.schema]) or before)

    def schema_for_limits(self) -> Any:
        """The table's schema as this task's rows will find it (with the changes it asked for), or None."""
        if self.assumed is not None:
            return self.assumed
        return table_arrow_schema(self.table) if self.table is not None else None

    def close(self) -> list[dict[str, Any]]:
        if self.writer is not None:
            self.files.extend(self.writer.close())
            self.writer = None
        return self.files

    def abort(self) -> None:
        paths = [f["file_path"] for f in self.files] + (self.writer.abort() if self.writer is not None else [])
        delete_files(self.table, paths)

    def output(self) -> dict[str, Any]:
        return {
            "table": self.tspec.identifier,
            "data_files": self.files,
            "rows": self.rows,
            "already_committed": self.already,
            "seen_offsets": {t: {str(p): o for p, o in ps.items()} for t, ps in self.seen.items()},
            "ignored_fields": sorted(self.ignored_fields),
            "branch": self.tspec.branch,
        }


def staged_truncates(spec: PipelineSpec, rows: Any) -> Any:
    """A change table that applies truncates (``table.truncate: apply``) stages them with its change records, in
    the table's schema, whose id columns are required: a truncate has no key, so its id columns get a typed
    placeholder. The commit finds truncates by their operation and never uses their id (``transform/changes.py:
    cut_at_truncates`` removes them before the changes are netted); the gate never judges them (no row image)."""
    if not spec.applies_changes or spec.table.truncate != "apply":
        return rows
    truncating = ops_mask(rows, spec.op_column(), spec.table.op_values, ("truncate",))
    if not pc.any(truncating).as_py():
        return rows
    for name in spec.table.id_columns:
        if name in rows.column_names:
            i = rows.column_names.index(name)
            column = rows.column(i)
            rows = rows.set_column(i, name, pc.if_else(truncating, _placeholder(column.type), column.combine_chunks()))
    return rows


def _placeholder(t: Any) -> Any:
    """A value of type ``t`` (zero, empty text or bytes, whichever ``t`` takes)."""
    for raw in (0, "", b""):
        try:
            return pa.scalar(raw).cast(t)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, TypeError):
            continue
    return pa.scalar(None, t)


def delete_files(table: Table | None, paths: list[str]) -> None:
    """Delete data files of a batch that can never be committed (no manifest references them; no table: none were
    written)."""
    if table is None:
        return
    for p in paths:
        try:
            table.io.delete(p)
        except Exception:  # noqa: BLE001 - best effort: an undeleted file is an orphan that is never committed
            log.warning("could not delete uncommitted file %s", p)


def newest_batch(table: Table) -> dict[str, str] | None:
    """The summary of the newest snapshot of main that a pipeline's batch made (it names the pipeline whose
    batches the table holds, and whether they were changes), if any. Recovered offsets (``ops/recover.py``) are no
    batch, nor is the record of a dropped quarantined batch (``ops/quarantine.py``): they say nothing of what the
    table holds."""
    by_id = {s.snapshot_id: s for s in table.metadata.snapshots}
    snap_id = table.metadata.current_snapshot_id
    while snap_id is not None and snap_id in by_id:
        props = summary_dict(by_id[snap_id])
        if props.get(PIPELINE) and RECOVERED not in props and DROPPED not in props:
            return props
        snap_id = by_id[snap_id].parent_snapshot_id
    return None
