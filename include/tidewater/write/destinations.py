"""Where a task's decoded records go: one table, or the tables routing names.

A plain pipeline is a set of one target table (``config/targets.py``); its task writes every decoded record to that
table's sink. A routed pipeline's task splits each chunk over the tables its routes name. The task's loop
(``write/task.py: TaskWriter``) is the same for both: it asks its destination (``Destination``) for the decoder's
inputs, for the change table a topic's message keys feed, and to place each chunk's rows, and the destination
answers; a placement comes back by value (``Placement``), and the task alone adds its counts to the range's. A new
difference between the two kinds is a method of both classes here, not a branch in the loop. What a destination asks
of its task is declared here too (``Task``), so this module does not know the task's class.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from functools import reduce
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tidewater.config.formats import FORMATS
from tidewater.config.sections.table import KEYED_OP
from tidewater.config.spec import PipelineSpec
from tidewater.decode.debezium import SOURCE_COLUMN
from tidewater.decode.records import BadRecord, decoded_rows, keep_mask, null_rows
from tidewater.errors import RecordError
from tidewater.table.evolution import table_arrow_schema, with_schema_ids
from tidewater.transform import shaping
from tidewater.transform.changes import bad_ops, ops_mask
from tidewater.transform.conversions import decoder_schema
from tidewater.transform.routing import Router
from tidewater.transform.shaping import NameMatcher, conform
from tidewater.transform.source_columns import without_source_columns
from tidewater.write.sinks import TableSink


class Task(Protocol):
    """What a destination asks of its task (``write/task.py: TaskWriter``): the pipeline, the bad-record policy
    (``dead_letter.policy``, or ``skip`` in a replay), the sinks opened so far and a sink for a table."""

    @property
    def spec(self) -> PipelineSpec: ...

    @property
    def policy(self) -> str: ...

    @property
    def sinks(self) -> dict[str, TableSink]: ...

    def open_sink(self, ident: str) -> TableSink: ...


@dataclass(frozen=True)
class Placement:
    """What a destination did with one chunk's rows. ``bad``: every bad record of the chunk (the decoder's and the
    destination's, by index); ``write``: the write of the admitted rows, run after the bad records are set apart;
    ``present``: records left out because the table already holds their offsets; ``skipped``: records routed to no
    table."""

    bad: list[Any]
    write: Callable[[], None]
    present: int = 0
    skipped: int = 0


class Destination(Protocol):
    """Where a task's records go (``OneTable``, ``Routes``). ``routed``: records of the range routed to at least one
    table (None: a plain pipeline routes nothing)."""

    routed: int | None

    def reset(self) -> None: ...

    def decoder_inputs(self) -> tuple[Any, Any]: ...

    def keyed(self, topic: str) -> tuple[PipelineSpec, Any] | None: ...

    def place(self, chunk: Any, decoded: Any, gone: list[int], bad: list[Any]) -> Placement: ...

    def result(self) -> dict[str, Any]: ...


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
    why = (
        "a truncate of the source table: not applied (table.truncate: dead_letter); set table.truncate: apply to "
        "remove the table's rows at this point of the stream"
        if spec.applies_changes
        else "a truncate of the source table: an append table cannot apply it (it keeps its rows)"
    )
    return dict.fromkeys(found, ("Truncate", why))


def _rows_for_sink(
    sink: TableSink, ident: str, mask: Any, chunk: Any, decoded: Any, offsets: Any, failed: dict[int, tuple[str, str]]
) -> tuple[Any, Any] | None:
    """The rows routed to one table, conformed to its types: (rows, their indices in ``decoded``), or None.

    Rows the table already holds (below its own committed offset) are dropped and counted; rows that
    cannot go to this table are added to ``failed`` (row -> error class, message)."""
    rows_of = pc.indices_nonzero(mask)
    if sink.table is None and not sink.tspec.auto_create:
        for r in rows_of.to_pylist():  # error path
            failed.setdefault(r, ("UnknownTable", f"table {ident} does not exist and auto_create is off"))
        return None
    refused = (
        ("ForeignTable", f"table {ident} holds the batches of pipeline {sink.owner!r}")
        if sink.foreign
        else ("TableKindMismatch", sink.kind_mismatch)
        if sink.kind_mismatch
        else None
    )
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


def route_chunk(
    spec: PipelineSpec,
    router: Any,
    sinks: dict[str, TableSink],
    open_sink: Any,
    chunk: Any,
    decoded: Any,
    bad_idx: list[int],
    only: frozenset[str] | None = None,
) -> tuple[list[Any], int, int]:
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


def _refuse(chunk: Any, bad: list[Any]) -> None:
    """``dead_letter.policy: fail``: the first bad record stops the task, named by its coordinates."""
    first = bad[0]
    raise RecordError(
        f"{first.error_class}: {first.message}", topic=chunk.topic, partition=chunk.partition, offset=chunk.offsets[first.index]
    )


class OneTable:
    """A plain pipeline's destination: its one table's sink takes every decoded record. Records over the table's
    limits or failing its row checks join the bad records; a replay leaves out the offsets the table holds."""

    def __init__(self, writer: Task) -> None:
        self.writer = writer
        self.sink = writer.open_sink(writer.spec.table.identifier)
        self.routed: int | None = None  # a plain pipeline routes nothing (its stats say None, not 0)

    def reset(self) -> None:
        """A new range's counts begin (this destination keeps none)."""

    def decoder_inputs(self) -> tuple[Any, Any]:
        """(explicit schema, shaper): the table's own types decode the values."""
        spec, table = self.writer.spec, self.sink.table
        table_schema = table_arrow_schema(table) if table is not None else None
        if table_schema is not None and spec.applies_changes and spec.table.key_source == "message_key":
            # the key and the operation come from the message key, not from the value
            keyed = {*spec.table.id_columns, KEYED_OP}
            table_schema = pa.schema([f for f in table_schema if f.name not in keyed])
        explicit = with_schema_ids(decoder_schema(without_source_columns(table_schema, spec.format), spec.format), table)
        if not shaping.active(spec.format, spec.table, table):
            return explicit, None
        return shaping.decoder_schema(explicit, spec.format), (shaping.NameMatcher(table, spec.table.case_insensitive), table_schema)

    def keyed(self, topic: str) -> tuple[PipelineSpec, Any] | None:
        """(the pipeline, its table or None) when its records are changes keyed by the message key."""
        spec = self.writer.spec
        if spec.applies_changes and spec.table.key_source == "message_key":
            return spec, self.sink.table
        return None

    def place(self, chunk: Any, decoded: Any, gone: list[int], bad: list[Any]) -> Placement:
        """Every bad record, the write of the admitted rows and the records the table already holds."""
        decoded, bad, gone = self.admit(chunk, decoded, bad, gone)
        decoded, present = self.drop_present(chunk, decoded, gone)
        return Placement(bad, lambda: self.sink.write(decoded), present=present)

    def admit(self, chunk: Any, decoded: Any, bad: list[Any], gone: list[int]) -> tuple[Any, list[Any], list[int]]:
        """Records over the table's schema limits (see ``table/limits.py``) and, with
        ``validation.not_null_policy: dead_letter``, records with a null in a ``not_null`` column join the
        bad records."""
        spec = self.writer.spec
        decoded, over = self.sink.admit(decoded)
        over_rows = [(o.row, o.error_class, o.message) for o in over]
        failing = row_failures(spec, spec.table, decoded, list(spec.validation.not_null)) if decoded.num_rows else {}
        if failing:  # error path
            # position of each admitted row among the rows before admission (error path)
            kept_pos = np.delete(np.arange(decoded.num_rows + len(over)), [o.row for o in over]).tolist()
            over_rows += [(kept_pos[r], cls, msg) for r, (cls, msg) in failing.items()]
            decoded = decoded.filter(keep_mask(decoded.num_rows, list(failing)))
        if not over_rows:
            return decoded, bad, gone
        index = decoded_rows(len(chunk), gone)  # chunk index of each decoded row
        more = sorted((BadRecord(index[r].as_py(), cls, msg) for r, cls, msg in over_rows), key=lambda b: b.index)
        if self.writer.policy == "fail":
            _refuse(chunk, more)
        bad = sorted(bad + more, key=lambda b: b.index)
        return decoded, bad, sorted(gone + [b.index for b in more])

    def drop_present(self, chunk: Any, decoded: Any, gone: list[int]) -> tuple[Any, int]:
        """Append-missing replays and dead-letter retries: leave out the records whose offsets the table already
        holds (``TableSink.held``); returns the rows left and how many were present. An ingest asks nothing: the
        table keeps no offsets apart from the batch's."""
        if self.sink.replay is None or not decoded.num_rows:
            return decoded, 0
        offsets = pc.take(pa.array(chunk.offsets, pa.int64()), decoded_rows(len(chunk), gone))
        held = self.sink.held(chunk.topic, chunk.partition, offsets)
        if held is None:
            return decoded, 0
        return decoded.filter(pc.invert(held)), pc.sum(held.cast(pa.int64())).as_py() or 0

    def result(self) -> dict[str, Any]:
        """The task result's fields for its table: its files, the fields it ignored, the schema it wrote."""
        table = self.sink.table
        return {
            "files": self.sink.files,
            "ignored_fields": sorted(self.sink.ignored_fields),
            "schema_id": table.schema().schema_id if table is not None else -1,
        }


class Routes:
    """A routed pipeline's destination: each chunk's rows split over the tables the routes name (``Router``), each
    table's sink opened when a record first goes to it. ``only`` (a replay of some target tables) skips the rest."""

    def __init__(self, writer: Task, only: frozenset[str] | None) -> None:
        self.writer = writer
        self.router = Router(writer.spec)
        self.only = only
        self._keyed: dict[str, str | None] = {}  # topic -> its change table keyed by the message key
        self.routed: int | None = 0

    def reset(self) -> None:
        """A new range's counts begin: records routed to at least one table."""
        self.routed = 0

    def decoder_inputs(self) -> tuple[Any, Any]:
        """(explicit schema, shaper): no table's types before routing; per-table name matching comes after it."""
        fmt = self.writer.spec.format
        return None, ((shaping.NameMatcher(None, False), None) if fmt.flatten or fmt.map_columns else None)

    def keyed(self, topic: str) -> tuple[PipelineSpec, Any] | None:
        """(the change table's view, its table or None) when ``topic``'s records are changes keyed by the message key
        (``table.key_source: message_key``) of the one table the routes send the topic to (validation makes such a
        topic feed that table alone)."""
        if topic not in self._keyed:
            ident = self.router.topic_table(topic)
            view = self.writer.spec.for_table(ident) if ident else None
            keyed = view is not None and view.applies_changes and view.table.key_source == "message_key"
            self._keyed[topic] = ident if keyed else None
        ident = self._keyed[topic]
        if ident is None:
            return None
        sink = self.writer.sinks.get(ident) or self.writer.open_sink(ident)
        return sink.view, sink.table

    def place(self, chunk: Any, decoded: Any, gone: list[int], bad: list[Any]) -> Placement:
        """Every bad record, nothing left to write (routing writes each table's rows as it splits them, since a
        record that one of its tables refuses is written to none) and the records routed to no table."""
        w = self.writer
        more, unmatched, routed_now = route_chunk(w.spec, self.router, w.sinks, w.open_sink, chunk, decoded, gone, self.only)
        self.routed = (self.routed or 0) + routed_now
        if more and w.policy == "fail":
            _refuse(chunk, more)
        return Placement(sorted(bad + more, key=lambda b: b.index), lambda: None, skipped=unmatched)

    def result(self) -> dict[str, Any]:
        """The task result's fields: each table's output (its files, its schema, its counts)."""
        return {"files": [], "outputs": [s.output() for s in self.writer.sinks.values()]}
