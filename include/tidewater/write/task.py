"""One Spark task of the write step: read an offset sub-range, decode, transform, route, write Parquet.

How a record travels: ``source.kafka.read_range`` (Arrow-friendly chunks of raw values) ->
``transform.chunk.decode_chunk`` (format decoder, shaping, date-time conversions; bad records set apart) ->
``transform.source_columns`` (key, headers, coordinates) -> ``transform.routing`` (routed pipelines) ->
``write.sinks.TableSink`` (per table: evolution, Parquet files via ``write.parquet``) and
``write.dead_letters`` (bad records as rows of the dead-letter table).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import logging
import os
import sys
import tempfile
import time
from dataclasses import asdict
from functools import reduce
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tidewater.batch import (
    PartitionRange,
    PartitionStats,
)
from tidewater.config.formats import FORMATS
from tidewater.config.spec import KEYED_OP, PipelineSpec
from tidewater.decode.avro import RegistryClient
from tidewater.decode.debezium import SOURCE_COLUMN
from tidewater.decode.records import BadRecord, decoded_rows, keep_mask, null_rows
from tidewater.errors import RecordError, TidewaterError, TransientError, error_document
from tidewater.source.kafka import Chunk, Rereader, read_range
from tidewater.table.catalog import catalog_failure, load_catalog
from tidewater.table.evolution import table_arrow_schema
from tidewater.table.own_tables import ensure_dead_letter_table
from tidewater.table.targets import target_role
from tidewater.transform import shaping
from tidewater.transform.changes import bad_ops, ops_mask
from tidewater.transform.chunk import decode_chunk
from tidewater.transform.conversions import decoder_schema
from tidewater.transform.keys import keyed_changes
from tidewater.transform.routing import Router
from tidewater.transform.shaping import NameMatcher, conform
from tidewater.transform.source_columns import add_source_columns, without_source_columns
from tidewater.write.dead_letters import dead_letter_rows
from tidewater.write.parquet import DataFileWriter, to_table_schema
from tidewater.write.sinks import TableSink, delete_files

log = logging.getLogger(__name__)


def row_failures(spec: PipelineSpec, tspec: Any, rows: Any, not_null: list[str]) -> dict[int, tuple[str, str]]:
    """Rows that cannot be applied (row -> error class, message): a truncate the table does not apply, an empty
    id column, an unknown change operation, a null in a ``not_null`` column when the gate's policy dead-letters
    them (a truncate the table applies has no key and no image: neither check concerns it). Each check is
    vectorized; the loops run over failing rows and truncates only."""
    failing = _truncates(spec, tspec, rows)
    applied = {r for r, (cls, _) in failing.items() if cls is None}  # truncates applied: no key, no image
    failing = {r: f for r, f in failing.items() if r not in applied}
    for r, column in null_rows(rows, list(tspec.id_columns)).items():  # error path
        if r not in applied:
            failing.setdefault(r, ("MissingId", f"id column {column!r} is empty"))
    if spec.applies_changes:
        for r, why in bad_ops(rows, spec.op_column(), tspec.op_values).items():  # error path
            failing.setdefault(r, ("UnknownOp", why))
    if spec.validation.not_null_policy == "dead_letter":
        for r, column in null_rows(rows, not_null).items():  # error path
            if r not in applied:
                failing.setdefault(r, ("NullInRequiredColumn", f"column {column!r} is null or missing"))
    return failing


def _truncates(spec: PipelineSpec, tspec: Any, rows: Any) -> dict[int, tuple[Any, str]]:
    """Records that truncate the source table (row -> (None, "") when the change table applies them, else the dead
    letter's class and message: `table.truncate`). Vectorized; the loop runs over truncate records only."""
    fmt = FORMATS.get(spec.format.value)
    op = spec.op_column() if spec.applies_changes else (fmt.op_column if fmt is not None else None)
    found = pc.indices_nonzero(ops_mask(rows, op, tspec.op_values, ("truncate",))).to_pylist()
    if not found:
        return {}
    if spec.applies_changes and tspec.truncate == "apply":
        return dict.fromkeys(found, (None, ""))
    why = ("a truncate of the source table: not applied (table.truncate: dead_letter); set table.truncate: apply to "
           "remove the table's rows at this point of the stream" if spec.applies_changes else
           "a truncate of the source table: an append table cannot apply it (it keeps its rows)")
    return dict.fromkeys(found, ("Truncate", why))


def _rows_for_sink(sink: TableSink, ident: str, mask: Any, chunk: Any, decoded: Any, offsets: Any,
                   failed: dict[int, tuple[str, str]]) -> tuple[Any, Any] | None:
    """The rows routed to one table, conformed to its types: (rows, their indices in ``decoded``), or None.

    Rows the table already holds (below its own committed offset) are dropped and counted; rows that
    cannot go to this table are added to ``failed`` (row -> error class, message)."""
    rows_of = pc.indices_nonzero(mask)
    if sink.table is None and not sink.tspec.auto_create:
        for r in rows_of.to_pylist():  # error path
            failed.setdefault(r, ("UnknownTable", f"table {ident} does not exist and auto_create is off"))
        return None
    refused = (("ForeignTable", f"table {ident} holds the batches of pipeline {sink.owner!r}") if sink.foreign else
               ("TableKindMismatch", sink.kind_mismatch) if sink.kind_mismatch else None)
    if refused is None:
        no_ids = sink.key_ids(chunk)
        refused = ("MissingId", no_ids) if no_ids else None
    if refused is not None:
        for r in rows_of.to_pylist():  # error path
            failed.setdefault(r, refused)
        return None
    held = sink.held(chunk.topic, chunk.partition, pc.take(offsets, rows_of))
    if held is not None:
        fresh = pc.filter(rows_of, pc.invert(held))
        sink.already += len(rows_of) - len(fresh)
        rows_of = fresh
    if not len(rows_of):
        return None
    sub = decoded.take(rows_of)
    if sink.table is not None or sink.tspec.case_insensitive:
        matcher = NameMatcher(sink.table, sink.tspec.case_insensitive)
        sub, casts = conform(matcher.apply(sub), table_arrow_schema(sink.table) if sink.table is not None else None)
        if casts:  # error path
            for r, msg in casts:
                failed.setdefault(rows_of[r].as_py(), ("TypeMismatch", f"table {ident}: {msg}"))
            rows_of = pc.filter(rows_of, keep_mask(len(rows_of), [r for r, _ in casts]))
    present = [c for c in sink.spec.validation.not_null if sink.table is not None and c in sink.table.schema().column_names]
    for r, (cls, msg) in row_failures(sink.view, sink.tspec, sub, present).items():  # error path
        failed.setdefault(rows_of[r].as_py(), (cls, f"table {ident}: {msg}"))
    sub, over = sink.admit(sub)
    if over:  # error path
        for o in over:
            failed.setdefault(rows_of[o.row].as_py(), (o.error_class, f"table {ident}: {o.message}"))
        rows_of = pc.filter(rows_of, keep_mask(len(rows_of), [o.row for o in over]))
    return sub, rows_of


def route_chunk(spec: PipelineSpec, router: Any, sinks: dict[str, TableSink], open_sink: Any, chunk: Any,
                 decoded: Any, bad_idx: list[int], only: frozenset[str] | None = None) -> tuple[list[Any], int, int]:
    """Routed pipelines: split decoded rows over the target tables and write them.

    Returns (records that become dead letters, records skipped as unmatched, records routed to at least
    one table). A record that cannot be written to one of its tables (its value does not take the
    column's type, an id column is empty, its dynamic table does not exist) is a dead letter and is
    written to none, so records read = routed + dead letters + skipped holds. ``only`` (a replay of some
    target tables): records routed to none of them are skipped.
    """
    n = decoded.num_rows
    chunk_idx = decoded_rows(len(chunk), bad_idx)
    offsets = pc.take(pa.array(chunk.offsets, pa.int64()), chunk_idx)
    routed = router.route(chunk.topic, decoded)
    if SOURCE_COLUMN in decoded.column_names:  # read by the router only, never written
        decoded = decoded.drop_columns([SOURCE_COLUMN])
    if only is not None:
        routed = _only_tables(routed, only)
    failed: dict[int, tuple[str, str]] = {r: ("InvalidRoute", msg) for r, msg in routed.invalid}
    pending: list[tuple[TableSink, Any, Any]] = []
    for ident, mask in routed.masks.items():
        sink = sinks.get(ident) or open_sink(ident)
        taken = _rows_for_sink(sink, ident, mask, chunk, decoded, offsets, failed)
        if taken is not None:
            pending.append((sink, *taken))
    if failed:
        gone = pa.array(sorted(failed), pa.uint64())
        pending = [(sink, sub.filter(pc.invert(pc.is_in(rows, value_set=gone))), rows) for sink, sub, rows in pending]
    for sink, sub, _ in pending:
        sink.write(sub)
    bad = [BadRecord(chunk_idx[r].as_py(), cls, msg) for r, (cls, msg) in sorted(failed.items())]
    unmatched_rows = pc.indices_nonzero(pc.and_(routed.unmatched, keep_mask(n, list(failed))))
    skipped = 0
    if len(unmatched_rows):
        if spec.routing.unmatched == "skip" or only is not None:  # a replay: their dead letters exist already
            skipped = len(unmatched_rows)
        else:
            field = spec.routing.field
            msg = f"no table takes this record (route field {field!r})" if field else f"no table takes records of topic {chunk.topic}"
            bad.extend(BadRecord(chunk_idx[r].as_py(), "Unrouted", msg) for r in unmatched_rows.to_pylist())
    bad.sort(key=lambda b: b.index)
    return bad, skipped, n - len(failed) - len(unmatched_rows)


def _only_tables(routed: Any, only: frozenset[str]) -> Any:
    """The routing of a chunk kept to the tables ``only`` names: records routed to none of them become unmatched."""
    kept = {ident: mask for ident, mask in routed.masks.items() if ident in only}
    elsewhere = [mask for ident, mask in routed.masks.items() if ident not in only]
    if not elsewhere:
        return routed
    anywhere = reduce(pc.or_, kept.values()) if kept else None
    left_out = reduce(pc.or_, elsewhere)
    left_out = left_out if anywhere is None else pc.and_(left_out, pc.invert(anywhere))
    return dataclasses.replace(routed, masks=kept, unmatched=pc.or_(routed.unmatched, left_out))


class _TaskWriter:
    """The state of one task: sinks per table, the dead-letter writer, counts. One method per step of
    the per-chunk loop; ``write_ranges`` drives it."""

    def __init__(self, spec: PipelineSpec, settings: dict[str, str], batch_id: str, task_id: int, rng: PartitionRange,
                 mode: str, *, probe: bool = False, tables: tuple[str, ...] = ()) -> None:
        self.probe = probe
        self.spec, self.settings, self.batch_id, self.task_id, self.rng = spec, settings, batch_id, task_id, rng
        self.started, self.started_at = time.monotonic(), time.time()
        self.catalog = load_catalog(spec)
        self.policy = spec.dead_letter.policy if mode == "ingest" else "skip"
        self.mode = mode
        self.only = frozenset(tables) or None  # routed replays: the target tables asked for (None: every table)
        self.prefix = f"{batch_id}-{task_id:05d}"
        self.sinks: dict[str, TableSink] = {}
        self._keyed: dict[str, str | None] = {}  # topic -> its change table keyed by the message key (routed)
        self.router: Any = None
        if not spec.targets.fused:  # records go to tables by topic and routes

            self.router = Router(spec)
        self.registry: Any = None
        if FORMATS[spec.format.value].registry:
            self.registry = RegistryClient(*spec.registry())
        self.single = None if self.router is not None else self.open_sink(spec.table.identifier)
        self.rereader = Rereader(settings, f"{spec.name}-{task_id}-dlq", spec.kafka.read_timeout_seconds)
        self.setup_seconds = time.monotonic() - self.started  # catalog, table and clients opened
        self.dlq_writer: Any = None
        self.dlq_table: Any = None
        self.dlq_files: list[Any] = []
        self.done: list[PartitionStats] = []  # the counts of the ranges read before ``rng`` (packed tasks)
        self.reset_counts()

    def reset_counts(self) -> None:
        """The counts of one range (``rng``), from zero."""
        self.records = self.dead = self.skipped = self.routed = self.present = 0
        self.first: int | None = None
        self.last: int | None = None
        self.tmin: int | None = None
        self.tmax: int | None = None

    def read(self, ranges: tuple[PartitionRange, ...]) -> None:
        """Read and write ``ranges`` one after another (the task's first range is ``rng``), each counted apart: a
        packed task's rows share its sinks, so its files hold several ranges' rows (``write/packing.py``)."""
        for i, rng in enumerate(ranges):
            if i:
                self.done.append(self.range_stats())
                self.rng = rng
                self.reset_counts()
            for chunk in self.chunks():
                self.process(chunk)

    def open_sink(self, ident: str) -> TableSink:
        role = target_role(self.spec, ident)
        tspec = self.spec.table if role.holds_offsets else self.spec.table_spec(ident)
        self.sinks[ident] = TableSink(self.spec, tspec, self.catalog, self.prefix, role,
                                      batch=(self.batch_id, f"t{self.task_id:05d}"),
                                      replay=(self.mode, self.rng) if self.mode != "ingest" else None,
                                      registry=self.registry)
        self.sinks[ident].probe = self.probe
        return self.sinks[ident]

    def requests(self) -> list[dict[str, Any]]:
        """The schema changes this task's rows need (see ``TableSink.write``): when any, nothing it wrote counts."""
        return [r for sink in self.sinks.values() for r in sink.requests]

    def chunks(self) -> Any:
        spec = self.spec
        return read_range(self.settings, self.rng, chunk_records=spec.batch.chunk_records,
                          read_timeout=spec.kafka.read_timeout_seconds, client_id=f"{spec.name}-{self.task_id}",
                          keys=spec.format.key != "none" or spec.keys_from_messages or spec.ids_from_keys,
                          headers=spec.format.headers)

    def decoder_inputs(self) -> tuple[Any, Any]:
        """(explicit schema, shaper) for the decoder: the single table's types, or none when routing."""
        spec = self.spec
        if self.single is None:  # per-table name matching comes after routing
            return None, ((shaping.NameMatcher(None, False), None) if spec.format.flatten or spec.format.map_columns else None)
        table = self.single.table
        table_schema = table_arrow_schema(table) if table is not None else None
        if table_schema is not None and spec.applies_changes and spec.table.key_source == "message_key":
            # the key and the operation come from the message key, not from the value
            keyed = {*spec.table.id_columns, KEYED_OP}
            table_schema = pa.schema([f for f in table_schema if f.name not in keyed])
        explicit = decoder_schema(without_source_columns(table_schema, spec.format), spec.format)
        if not shaping.active(spec.format, spec.table, table):
            return explicit, None
        return shaping.decoder_schema(explicit, spec.format), (shaping.NameMatcher(table, spec.table.case_insensitive),
                                                                table_schema)

    def process(self, chunk: Any) -> None:
        explicit, shaper = self.decoder_inputs()
        decoded, bad, ignored = decode_chunk(self.spec, chunk, explicit, self.registry, shaper)
        keyed = self.keyed_by_message_key(chunk.topic)
        if keyed is not None:
            view, table = keyed
            decoded, bad, ignored = keyed_changes(view, chunk, decoded, bad, ignored,
                                                  table_arrow_schema(table) if table is not None else None, self.registry)
        self.skipped += len(ignored)  # after keying: a tombstone keyed by the message key is a delete, not skipped
        gone = sorted(b.index for b in bad + ignored)
        decoded = add_source_columns(self.spec.format, chunk, decoded, gone)
        if self.router is not None:
            bad = self.route(chunk, decoded, gone, bad)
        elif self.single is not None:
            decoded, bad, gone = self.admit(chunk, decoded, bad, gone)
        self.set_apart(chunk, bad)
        decoded = self.drop_present(chunk, decoded, gone)
        if self.single is not None:
            self.single.write(decoded)
        self.count(chunk)

    def keyed_by_message_key(self, topic: str) -> tuple[PipelineSpec, Any] | None:
        """(the change table's view, its table or None) when ``topic``'s records are changes keyed by the message key
        (``table.key_source: message_key``): the pipeline's table, or the one table a routed pipeline sends the
        topic to (validation makes such a topic feed that table alone)."""
        spec = self.spec
        if self.router is None:
            if spec.applies_changes and spec.table.key_source == "message_key":
                return spec, self.single.table if self.single is not None else None
            return None
        if topic not in self._keyed:
            ident = self.router.topic_table(topic)
            view = spec.for_table(ident) if ident else None
            keyed = view is not None and view.applies_changes and view.table.key_source == "message_key"
            self._keyed[topic] = ident if keyed else None
        ident = self._keyed[topic]
        if ident is None:
            return None
        sink = self.sinks.get(ident) or self.open_sink(ident)
        return sink.view, sink.table

    def admit(self, chunk: Any, decoded: Any, bad: list[Any], gone: list[int]) -> tuple[Any, list[Any], list[int]]:
        """Records over the table's schema limits (see ``table/limits.py``) and, with
        ``validation.not_null_policy: dead_letter``, records with a null in a ``not_null`` column join the
        bad records."""
        assert self.single is not None
        decoded, over = self.single.admit(decoded)
        over_rows = [(o.row, o.error_class, o.message) for o in over]
        failing = row_failures(self.spec, self.spec.table, decoded, list(self.spec.validation.not_null)) if decoded.num_rows else {}
        if failing:  # error path

            # position of each admitted row among the rows before admission (error path)
            kept_pos = np.delete(np.arange(decoded.num_rows + len(over)), [o.row for o in over]).tolist()
            over_rows += [(kept_pos[r], cls, msg) for r, (cls, msg) in failing.items()]
            decoded = decoded.filter(keep_mask(decoded.num_rows, list(failing)))
        if not over_rows:
            return decoded, bad, gone
        index = decoded_rows(len(chunk), gone)  # chunk index of each decoded row
        more = sorted((BadRecord(index[r].as_py(), cls, msg) for r, cls, msg in over_rows), key=lambda b: b.index)
        if self.policy == "fail":
            raise RecordError(f"{more[0].error_class}: {more[0].message}", topic=chunk.topic, partition=chunk.partition,
                              offset=chunk.offsets[more[0].index])
        bad = sorted(bad + more, key=lambda b: b.index)
        return decoded, bad, sorted(gone + [b.index for b in more])

    def route(self, chunk: Any, decoded: Any, gone: list[int], bad: list[Any]) -> list[Any]:
        more, unmatched, routed_now = route_chunk(self.spec, self.router, self.sinks, self.open_sink, chunk, decoded, gone,
                                                  self.only)
        self.skipped += unmatched
        self.routed += routed_now
        if more and self.policy == "fail":
            raise RecordError(f"{more[0].error_class}: {more[0].message}", topic=chunk.topic, partition=chunk.partition,
                              offset=chunk.offsets[more[0].index])
        return sorted(bad + more, key=lambda b: b.index)

    def set_apart(self, chunk: Any, bad: list[Any]) -> None:
        """Bad records become rows of the dead-letter table (or are skipped and logged, by policy)."""
        if not bad or self.probe or self.requests():  # a task that needs a schema change writes nothing more
            return
        if self.policy != "dead_letter":
            self.skipped += len(bad)
            log.warning("batch %s: skipped %d undecodable records of %s[%d], first at offset %d: %s", self.batch_id,
                        len(bad), chunk.topic, chunk.partition, chunk.offsets[bad[0].index], bad[0].message)
            return
        if self.dlq_writer is None:
            self.dlq_table = ensure_dead_letter_table(self.catalog, self.spec)
            self.dlq_writer = DataFileWriter(self.dlq_table, self.prefix + "-dlq")
        reread = functools.partial(self.rereader.fetch, chunk.topic, chunk.partition)
        rows = dead_letter_rows(chunk, bad, self.batch_id, self.spec.name, reread)
        self.dlq_writer.write(to_table_schema(self.dlq_table, rows))
        self.dead += len(bad)

    def drop_present(self, chunk: Any, decoded: Any, gone: list[int]) -> Any:
        """Append-missing replays and dead-letter retries: leave out the records whose offsets the pipeline's own
        table already holds, asked of its sink as every target table is asked (``TableSink.held``); counted as
        present. A routed pipeline's tables are asked as records are routed to them (``_rows_for_sink``)."""
        if self.single is None or self.single.replay is None or not decoded.num_rows:  # an ingest: nothing to ask
            return decoded
        offsets = pc.take(pa.array(chunk.offsets, pa.int64()), decoded_rows(len(chunk), gone))
        held = self.single.held(chunk.topic, chunk.partition, offsets)
        if held is None:
            return decoded
        self.present += pc.sum(held.cast(pa.int64())).as_py() or 0
        return decoded.filter(pc.invert(held))

    def count(self, chunk: Any) -> None:
        self.records += len(chunk)
        self.first = chunk.offsets[0] if self.first is None else self.first
        self.last = chunk.offsets[-1]
        ts = pa.array(chunk.timestamps, pa.int64())
        ts = pc.filter(ts, pc.greater_equal(ts, 0))
        if len(ts):
            mm = pc.min_max(ts)
            lo, hi = mm["min"].as_py(), mm["max"].as_py()
            self.tmin = lo if self.tmin is None else min(self.tmin, lo)
            self.tmax = hi if self.tmax is None else max(self.tmax, hi)

    def close(self) -> None:
        for sink in self.sinks.values():
            sink.close()
        self.dlq_files = self.dlq_writer.close() if self.dlq_writer is not None else []
        self.rereader.close()

    def abort(self) -> None:
        """Nothing this task wrote can be committed: remove it."""
        self.rereader.close()
        for sink in self.sinks.values():
            sink.abort()
        if self.dlq_writer is not None:
            delete_files(self.dlq_table, self.dlq_writer.abort())

    def range_stats(self) -> PartitionStats:
        rng = self.rng
        return PartitionStats(rng.topic, rng.partition, rng.start, rng.end, self.records, self.first, self.last, self.tmin,
                              self.tmax, self.dead, self.skipped, self.routed if self.router is not None else None,
                              self.present)

    def result(self) -> dict[str, Any]:
        stats = [*self.done, self.range_stats()]
        result: dict[str, Any] = {
            "task_id": self.task_id,
            "dead_letter_files": self.dlq_files,
            "stats": [asdict(s) for s in stats],  # one per range the task read
            "timing": {"task_id": self.task_id, "started_at": self.started_at, "finished_at": time.time(),
                       "seconds": time.monotonic() - self.started, "setup_seconds": self.setup_seconds,
                       "records": sum(s.records for s in stats), **worker_process()},
        }
        if self.single is not None:
            table = self.single.table
            result.update(files=self.single.files, ignored_fields=sorted(self.single.ignored_fields),
                          schema_id=table.schema().schema_id if table is not None else -1)
        else:
            result.update(files=[], outputs=[s.output() for s in self.sinks.values()])
        return result


PROBE_RECORDS = 1000  # records read per partition range by the schema probe


def probe_schema(spec: PipelineSpec, settings: dict[str, str], batch_id: str, ranges: Any) -> None:
    """Create the target table, with the schema the first records of each range need, once and before any
    Spark task starts. Tasks never change tables: without the probe, every task of a first batch would read
    its range only to report that the table is missing, and the write job would run them all twice (see
    ``write/job.py``). The probe runs the task code on the first ``PROBE_RECORDS`` records of each range
    without writing any file; the changes are tagged as the batch's (``table/provisional``). A record the
    probe cannot take is left to the task, which reports it with its offset."""
    for i, rng in enumerate(ranges):
        head = PartitionRange(rng.topic, rng.partition, rng.start, min(rng.end, rng.start + PROBE_RECORDS))
        # Built outside the guard: a writer that cannot be built is our fault, not a record's, and must not hide.
        writer = _TaskWriter(spec, settings, batch_id, 90000 + i, head, "ingest", probe=True)
        try:
            for chunk in writer.chunks():
                writer.process(chunk)
        except Exception as e:  # noqa: BLE001 - the Spark task meets the same record and reports it
            log.info("batch %s: schema probe of %s[%d] stopped (%s); the tasks go on", batch_id, rng.topic,
                     rng.partition, e)
        finally:
            writer.rereader.close()


def worker_process() -> dict[str, Any]:
    """This process's id, interpreter and start time (a Python worker is reused for many tasks)."""
    try:
        import psutil

        return {"pid": os.getpid(), "python": sys.executable, "process_started_at": psutil.Process().create_time()}
    except ImportError:  # psutil comes with Airflow, not necessarily on a cluster's executors
        return {"pid": os.getpid(), "python": sys.executable}


def _leave_a_removed_directory() -> None:
    """Work from the temporary directory when this process's working directory is gone. A Spark Connect server
    reuses Python workers across sessions and removes a closed session's directory, where such a worker may still
    sit; pyiceberg reads its configuration file from the working directory whenever it writes table metadata (a
    task creating the dead-letter table), which then failed with a bare ENOENT, taken for an unreachable catalog."""
    try:
        os.getcwd()
    except FileNotFoundError:
        os.chdir(tempfile.gettempdir())


# Allocations between two young-generation collections of Python's cyclic garbage collector while a task runs.
# Each consumed record allocates a few objects (librdkafka's message, its offset and timestamp) that die by reference
# counting, yet every 700 allocations (Python's default) start a collection whose older generations also walk the
# objects of every module the worker imported: that alone doubled consumption's CPU (scripts/profile_data_path.py,
# BENCHMARKS.md). Cycles are still collected, every GC_GEN0_ALLOCATIONS allocations instead.
GC_GEN0_ALLOCATIONS = 100_000


@contextlib.contextmanager
def fewer_collections() -> Any:
    """Python's collector runs less often inside (see GC_GEN0_ALLOCATIONS); its thresholds are restored after."""
    before = gc.get_threshold()
    gc.set_threshold(max(GC_GEN0_ALLOCATIONS, before[0]), *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)


def write_ranges(
    spec: PipelineSpec, settings: dict[str, str], batch_id: str, task_id: int, ranges: tuple[PartitionRange, ...],
    mode: str = "ingest", tables: tuple[str, ...] = (),
) -> dict[str, Any]:
    """One task of the write step: read ``ranges`` (one sub-range, or several short ones packed: see
    ``write/packing.py``), decode, write data files (one TableSink per target table, shared by the ranges). Returns
    files and stats (one per range), or an error document, or (``evolve``) the schema changes its rows need, for the
    driver to make before it runs the task again; in both of the latter nothing of what the task wrote is left behind.

    Replays (``mode`` replace or append-missing) count undecodable records as skipped (their dead letters
    were written when the range was first ingested); append-missing leaves out the offsets each table already holds
    (``TableSink.held``, read from the table's Kafka metadata columns). ``tables``: a routed replay of some target
    tables.
    """
    _leave_a_removed_directory()
    with fewer_collections():
        return _run_task(spec, task_id, ranges, lambda: _TaskWriter(spec, settings, batch_id, task_id, ranges[0], mode,
                                                                    tables=tables))


def _run_task(spec: PipelineSpec, task_id: int, ranges: tuple[PartitionRange, ...], make: Any) -> dict[str, Any]:
    """Run the writer ``make()`` returns over ``ranges``: its result, the schema changes it needs, or its error."""
    writer = None
    try:
        writer = make()
        writer.read(ranges)
        needs = writer.requests()
        if needs:  # the driver changes the table and runs this task again: nothing written here may count
            writer.abort()
            return {"task_id": task_id, "evolve": needs}
        writer.close()
    except Exception as e:  # the task reports its error to the driver, which raises it (BatchWriteError)
        if writer is not None:
            writer.abort()
        if not isinstance(e, TidewaterError) and catalog_failure(e) is not None:  # a busy catalog is worth a retry
            e = TransientError(f"catalog unreachable or busy: {e}", table=spec.targets.holder if spec.targets.fused else None)
        return {"task_id": task_id, "error": error_document(e)}
    # Python workers are reused across tasks: hand Arrow's cached buffers back so memory stays per task.
    pa.default_memory_pool().release_unused()
    return writer.result()






class _LetterWriter(_TaskWriter):
    """A dead-letter retry's task (``ops/dead_letters.py``): the records are the letters' stored raw records (key,
    value, headers, timestamp) instead of a read of Kafka, so a retry works when Kafka no longer holds them; they are
    decoded, transformed and routed with the pipeline's current settings like any replay that appends the missing
    rows (offsets a table already holds are left out), and a record that fails again becomes a new dead letter."""

    def __init__(self, spec: PipelineSpec, batch_id: str, task_id: int, rng: PartitionRange, letters: Any) -> None:
        super().__init__(spec, {}, batch_id, task_id, rng, "append-missing")
        self.policy = "dead_letter"
        self.letters = letters

    def chunks(self) -> Any:
        t = self.letters
        stamps = t.column("timestamp").cast(pa.int64()).to_pylist()  # microseconds; Kafka's are milliseconds
        headers = [[(h["key"], h["value"]) for h in hs] if hs else [] for hs in t.column("headers").to_pylist()]
        yield Chunk(self.rng.topic, self.rng.partition, t.column("value").to_pylist(), t.column("offset").to_pylist(),
                    [s // 1000 if s is not None else -1 for s in stamps], t.column("key").to_pylist(), headers)


def write_letters(spec: PipelineSpec, batch_id: str, task_id: int, rng: PartitionRange, letters: Any) -> dict[str, Any]:
    """Decode and write the dead letters ``letters`` (rows of the dead-letter table of ``rng``'s partition, sorted by
    offset) as one task of a retry; the result is ``write_ranges``'. The error path: a Python step per letter to
    make the chunk is fine here (letters are few)."""
    return _run_task(spec, task_id, (rng,), lambda: _LetterWriter(spec, batch_id, task_id, rng, letters))
