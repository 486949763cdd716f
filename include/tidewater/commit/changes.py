"""Where a change batch becomes visible: upserts and deletes by key, in the batch's single commit.

The write step staged the batch's change records (row images with their operation, partition and offset)
as Parquet files. The batch's commit (``commit/batch.py``: idempotent by batch id, refused when the offsets
moved, exactly like an append) asks this module for the change of each change table; computing it:
1. the records are reduced to the net change per key (``transform.changes``: (partition, offset) order,
   the last change wins);
2. against the table as this attempt loaded it, the live rows of every changed key are found (data files
   pruned by the keys' bounds, their id columns read, positions already deleted left out);
3. one position delete file per data file that holds such rows (merge-on-read: the cost grows with the
   changes, never with the table; no equality deletes), plus data files with the new row images;
4. one row delta: new data files + delete files + the offsets and the counts, in one snapshot. A
   concurrent commit (another batch, a compaction) fails the attempt; the next attempt finds the rows
   again on the new files, so a row is never resurrected or deleted twice.
The staged change files are not part of the table: they are removed once the batch is committed.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.expressions import AlwaysTrue, And, GreaterThanOrEqual, LessThanOrEqual
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat

from tidewater.batch import BatchPlan, Offsets, StagedFile
from tidewater.commit.primitive import Change
from tidewater.config.spec import PipelineSpec
from tidewater.errors import TerminalError
from tidewater.table.provisional import confirm_keys
from tidewater.table.summary import (
    BATCH_ID,
    CHANGES,
    OFFSETS,
    PIPELINE,
    QUARANTINE_OF,
    QUARANTINED,
    TRUNCATE,
    committed_state,
    find_batch_snapshot,
    quarantine_branch,
    summary_dict,
)
from tidewater.transform.changes import (
    OFFSET,
    PARTITION,
    TOPIC,
    count_effects,
    cut_at_truncates,
    net_changes,
    reapply_decisions,
    retry_decisions,
)
from tidewater.write.parquet import DataFileWriter, to_table_schema

log = logging.getLogger(__name__)

PATH_FIELD_ID, POS_FIELD_ID = 2147483546, 2147483545


def read_staged(table: Any, files: Any) -> Any:
    """The batch's staged change records (``files``), in the table's current schema."""
    pieces = []
    for f in files:
        with table.io.new_input(f.file_path).open() as fh:
            pieces.append(pq.read_table(fh))
    if not pieces:
        return None
    return to_table_schema(table, pa.concat_tables(pieces, promote_options="permissive"))


def _file_columns(pf: Any, table: Any, id_columns: list[str]) -> dict[str, str]:
    """The names the id columns have in one data file (matched by Iceberg field id, so renames are followed)."""
    schema = table.schema()
    by_id = {}
    for f in pf.schema_arrow:
        fid = (f.metadata or {}).get(b"PARQUET:field_id")
        if fid is not None:
            by_id[int(fid)] = f.name
    return {c: by_id.get(schema.find_field(c).field_id, c) for c in id_columns}


def _deleted_positions(table: Any, task: Any) -> Any:
    """Positions of ``task.file`` already deleted by the table's position delete files."""
    gone = []
    for d in task.delete_files:
        if d.content != DataFileContent.POSITION_DELETES:
            raise TerminalError(f"{d.file_path} is an equality delete file (written by another tool): change tables "
                                "need position deletes only; rewrite the table's deletes with Spark first",
                                table=table.name())
        with table.io.new_input(d.file_path).open() as fh:
            t = pq.read_table(fh, columns=["file_path", "pos"])
        gone.append(t.filter(pc.equal(t.column("file_path"), task.file.file_path)).column("pos"))
    return pa.chunked_array([c for g in gone for c in g.chunks], pa.int64()) if gone else None


def _bounds_filter(keys: Any, id_columns: list[str]) -> Any:
    """A filter that prunes data files by the changed keys' min/max (per id column)."""
    expr: Any = AlwaysTrue()
    for c in id_columns:
        mm = pc.min_max(keys.column(c))
        lo, hi = mm["min"].as_py(), mm["max"].as_py()
        if lo is None or isinstance(lo, (bytes, dict, list)):
            continue
        expr = And(expr, And(GreaterThanOrEqual(c, lo), LessThanOrEqual(c, hi)))
    return expr


def _hits_in_file(table: Any, task: Any, indexed: Any, id_columns: list[str], source: bool) -> Any | None:
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


def find_rows(table: Any, keys: Any, id_columns: list[str], source: bool = False,
              branch: str | None = None) -> list[tuple[Any, Any]]:
    """Where the changed keys live in ``table`` now (on ``branch``, default main): [(data file, rows)], rows as
    ``_hits_in_file`` gives them. Reads only the id columns of files whose bounds admit the keys (files in
    parallel: Arrow's readers and lookups release the GIL), and a file's delete files only when it holds a
    changed key."""
    head = table.snapshot_by_name(branch) if branch else table.current_snapshot()
    if head is None or keys.num_rows == 0:
        return []
    indexed = keys.append_column("__key", pa.array(np.arange(keys.num_rows), pa.int64()))
    tasks = list(table.scan(row_filter=_bounds_filter(keys, id_columns), selected_fields=tuple(id_columns),
                            snapshot_id=head.snapshot_id).plan_files())
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


def write_position_deletes(table: Any, hits: list[tuple[Any, Any]], prefix: str) -> list[Any]:
    """One position delete file per data file in ``hits``, beside it (same partition directory)."""
    schema = pa.schema([
        pa.field("file_path", pa.string(), nullable=False, metadata={"PARQUET:field_id": str(PATH_FIELD_ID)}),
        pa.field("pos", pa.int64(), nullable=False, metadata={"PARQUET:field_id": str(POS_FIELD_ID)}),
    ])
    out = []
    for i, (data_file, positions) in enumerate(hits):
        path = f"{os.path.dirname(data_file.file_path)}/{prefix}-deletes-{i:05d}-{uuid.uuid4().hex[:12]}.parquet"
        rows = pa.table([pa.repeat(data_file.file_path, len(positions)), positions], schema=schema)
        with table.io.new_output(path).create(overwrite=False) as stream:
            pq.write_table(rows, stream)
        lo, hi = positions[0].as_py(), positions[-1].as_py()
        f = DataFile.from_args(
            _table_format_version=table.format_version, content=DataFileContent.POSITION_DELETES, file_path=path,
            file_format=FileFormat.PARQUET, partition=data_file.partition, record_count=len(positions),
            file_size_in_bytes=len(table.io.new_input(path)),
            value_counts={PATH_FIELD_ID: len(positions), POS_FIELD_ID: len(positions)},
            null_value_counts={PATH_FIELD_ID: 0, POS_FIELD_ID: 0},
            lower_bounds={PATH_FIELD_ID: data_file.file_path.encode(), POS_FIELD_ID: lo.to_bytes(8, "little", signed=True)},
            upper_bounds={PATH_FIELD_ID: data_file.file_path.encode(), POS_FIELD_ID: hi.to_bytes(8, "little", signed=True)},
            sort_order_id=None, equality_ids=None, key_metadata=None,
        )
        f.spec_id = data_file.spec_id  # not a manifest field: pyiceberg keeps it beside the record
        out.append(f)
    return out


def write_upserts(table: Any, rows: Any, prefix: str) -> list[StagedFile]:
    """The new row images as data files of ``table``."""
    if rows is None or rows.num_rows == 0:
        return []
    writer = DataFileWriter(table, prefix)
    writer.write(to_table_schema(table, rows))
    return [StagedFile.from_json(d) for d in writer.close()]


def _net_once(table: Any, spec: PipelineSpec, files: Any, state: dict[str, Any]) -> Any:
    """The batch's changes reduced to one per key (None without records), computed on the first attempt only.
    Changes a truncate of the batch supersedes are left out (``state["truncated"]`` says what the truncates did;
    they reach this point only when the table applies them, see ``table.truncate``)."""
    if "net" not in state:
        staged = read_staged(table, files)
        state["net"] = state["truncated"] = None
        if staged is not None:
            staged, state["truncated"] = cut_at_truncates(staged, spec.op_column(), spec.table.op_values)
            state["net"] = net_changes(staged, list(spec.table.id_columns), spec.op_column(), spec.table.op_values)
    return state["net"]


def _next_attempt(table: Any, state: dict[str, Any]) -> int:
    """Start a commit attempt: number it, and remove the files the previous attempt wrote for the table as it was
    then (its position deletes, and the row images a replay or retry chose). That attempt did not commit: the commit
    primitive asks again only after a conflict, or after an unknown outcome once the table's snapshots showed the
    batch's marker missing. An attempt's files are kept with ``_written_by_attempt``; the last attempt's, when every
    attempt failed, are left to orphan removal (its outcome may be unknown)."""
    remove_staged(table, state.pop("attempt_files", ()))
    state["attempt"] = attempt = state.get("attempt", 0) + 1
    return attempt


def _written_by_attempt(state: dict[str, Any], *files: Any) -> None:
    state["attempt_files"] = [f for group in files for f in group]


def reapply_attempt(table: Any, spec: PipelineSpec, plan: BatchPlan, files: Any, state: dict[str, Any],
                    properties: Callable[[Any], dict[str, str]]) -> Change:
    """A replay attempt (mode reapply): the staged changes ``files`` again, only where each is still its key's
    latest (``transform.changes.reapply_decisions``); the committed offsets stay as they are (``properties``
    gives the snapshot's properties on ``table``)."""
    ids, branch = list(spec.table.id_columns), spec.table.branch
    offsets = committed_state(table, branch).offsets
    net = _net_once(table, spec, files, state)
    attempt = _next_attempt(table, state)
    found = find_rows(table, net.keys, ids, source=True, branch=branch) if net else []
    rows = pa.concat_tables([t for _, t in found]) if found else pa.table({"__key": pa.array([], pa.int64())})
    applied, counts = reapply_decisions(net, rows, restorable(table, plan, offsets, spec)) if net else (
        None, {"reapplied": 0, "restored": 0, "superseded": 0, "absent": 0, "noop": 0})
    chosen = pc.indices_nonzero(applied) if net else pa.array([], pa.int64())
    hits = [(f, t.filter(pc.is_in(t.column("__key"), value_set=chosen)).column("__pos").combine_chunks()) for f, t in found]
    hits = [(f, p) for f, p in hits if len(p)]
    upserts = net.last.filter(pc.and_(applied, pc.invert(net.last_deletes))) if net else None
    written = write_upserts(table, upserts, f"{plan.batch_id}-a{attempt}-upserts")
    counts["position_deletes"] = sum(len(p) for _, p in hits)
    state["counts"], state["files"] = counts, written
    props = properties(table)
    props[CHANGES] = json.dumps(counts, separators=(",", ":"), sort_keys=True)
    log.info("replay %s of %s: %s", plan.batch_id, spec.table.identifier, ", ".join(f"{v} {k}" for k, v in counts.items()))
    deletes = write_position_deletes(table, hits, f"{plan.batch_id}-a{attempt}")
    _written_by_attempt(state, written, deletes)
    return Change(props, tuple(written), deletes=tuple(deletes), branch=branch,
                  remove_properties=tuple(confirm_keys(table, plan.batch_id)))


def restorable(table: Any, plan: BatchPlan, offsets: Offsets, spec: PipelineSpec) -> list[int]:
    """The partitions where a reapply may restore a lost row (``reapply_decisions``): those whose replayed range
    reaches the table's committed offset, so no later change of the partition exists. None on a table that has
    applied a truncate: a truncate is not ordered against other partitions' changes, so a row may be missing
    because of it."""
    if any(TRUNCATE in summary_dict(s) for s in table.snapshots()):
        log.info("replay %s: %s has applied a truncate: rows missing from it are not restored (counted absent)",
                 plan.batch_id, spec.table.identifier)
        return []
    return sorted({r.partition for r in plan.ranges if r.end >= offsets.get(r.topic, {}).get(r.partition, r.end + 1)})


def change_attempt(table: Any, spec: PipelineSpec, plan: BatchPlan, files: Any, state: dict[str, Any],
                   properties: Callable[[Any], dict[str, str]], quarantine: bool = False) -> Change:
    """One attempt to apply the staged change records ``files`` to ``table`` as loaded now; ``properties`` gives
    the snapshot's properties (offsets included) on it. ``state`` keeps what is done once (the net changes, the
    new row images). ``quarantine``: the row delta goes to the batch's quarantine branch instead
    (``quarantined``)."""
    ids = list(spec.table.id_columns)
    net = _net_once(table, spec, files, state)
    if "files" not in state:  # the new row images do not depend on the table: written once, whatever the attempts
        state["files"] = write_upserts(table, net.upserts if net else None, f"{plan.batch_id}-upserts")
    attempt = _next_attempt(table, state)
    truncated = state["truncated"]
    if truncated is not None:  # every row committed before the batch goes: the changes meet an empty table

        hits, existed = [], pa.repeat(False, net.keys.num_rows)
    else:
        hits, existed = live_rows(table, net.keys, ids, spec.table.branch) if net else ([], None)
    counts: dict[str, Any] = count_effects(net, existed) if net else dict.fromkeys(("inserted", "updated", "deleted", "noop"), 0)
    counts.update(cross_partition_keys=net.cross_partition_keys if net else 0, position_deletes=sum(len(p) for _, p in hits))
    if truncated is not None:
        counts.update(truncated=truncated.truncates, superseded=truncated.superseded)
        log.info("batch %s: %d truncate(s) of %s applied: its rows removed, %d earlier change(s) of the batch superseded",
                 plan.batch_id, truncated.truncates, spec.table.identifier, truncated.superseded)
    if net and net.cross_partition_keys:
        counts["cross_partition_examples"] = list(net.cross_partition_examples)
        log.warning("batch %s: %d key(s) of %s changed in more than one partition (e.g. %s): their order across "
                    "partitions is not the source's; keys must be partitioned by key", plan.batch_id,
                    net.cross_partition_keys, spec.table.identifier, net.cross_partition_examples[:3])
    state["counts"] = counts
    deletes = write_position_deletes(table, hits, f"{plan.batch_id}-a{attempt}")
    _written_by_attempt(state, deletes)  # the row images are the batch's, kept for every attempt
    props = properties(table)
    props[CHANGES] = json.dumps(counts, separators=(",", ":"), sort_keys=True, default=str)
    remove = tuple(confirm_keys(table, plan.batch_id))
    branch = spec.table.branch
    if quarantine:
        return quarantined(plan, props, tuple(state["files"]), tuple(deletes), truncated is not None, branch, remove)
    if truncated is None:
        return Change(props, tuple(state["files"]), deletes=tuple(deletes), branch=branch, remove_properties=remove)

    emptied = {TRUNCATE: json.dumps({"batch_id": plan.batch_id, "truncates": truncated.truncates}), PIPELINE: plan.pipeline}
    return Change(props, tuple(state["files"]), branch=branch, delete_filter=AlwaysTrue(), delete_properties=emptied,
                  remove_properties=remove)


def quarantined(plan: BatchPlan, props: dict[str, str], files: tuple[Any, ...], deletes: tuple[Any, ...], truncates: bool,
                branch: str | None, remove: tuple[str, ...]) -> Change:
    """A change batch the gate refused (``validation.on_failure: quarantine``): its whole row delta (new row images
    and position deletes, computed against the table as it is) lands on the branch ``quarantine-<batch id>``, and
    main gets an empty snapshot with the batch id, the advanced offsets and the branch's name, in one transaction.
    Main's rows do not change, so publishing can apply the same row delta to main as long as nothing was committed
    after that snapshot; the next batch is not planned until a person publishes or drops it (a key's changes apply
    in order). A batch with a truncate cannot be quarantined: its emptying of the table is not a row delta."""
    if truncates:
        raise TerminalError(f"batch {plan.batch_id} failed the quality gate and holds a truncate, which a quarantine "
                            "branch cannot carry: fix the data or the suite, or set validation.on_failure: fail",
                            batch_id=plan.batch_id, table=plan.table)
    name = quarantine_branch(plan.batch_id)
    to_branch = Change({**{k: v for k, v in props.items() if k not in (OFFSETS, BATCH_ID)}, QUARANTINE_OF: plan.batch_id},
                       files, deletes=deletes, branch=name)
    main = {k: v for k, v in props.items() if k != CHANGES}  # nothing of the batch is applied to main
    return Change({**main, QUARANTINED: name}, (), branch=branch, also=(to_branch,), remove_properties=remove)


def remove_staged(table: Any, files: Any) -> None:
    """The staged change files once the batch is committed: no snapshot references them."""
    if table is None:
        return
    for f in files:
        try:
            table.io.delete(f.file_path)
        except FileNotFoundError:
            pass
        except OSError as e:  # left for remove_orphan_files
            log.warning("could not remove staged change file %s: %s", f.file_path, e)


MAX_LATER_SNAPSHOTS = 200  # snapshots that removed rows, searched for a later delete of a retried key (beyond: refused)


def retry_attempt(table: Any, spec: PipelineSpec, plan: BatchPlan, files: Any, state: dict[str, Any],
                  properties: Callable[[Any], dict[str, str]]) -> Change:
    """A dead-letter retry of a change table (``ops/dead_letters.py``): the retried changes are applied in source
    order (reduced to one per key, like a batch) where no later change of the same key is already applied, and
    refused where one is: a live row written by a later offset or by another partition, or (no live row) a
    snapshot since the letters' batch that removed a row of the key (``transform.changes.retry_decisions``). The
    refused letters are stamped on the snapshot (``refused_letters``: [topic, partition, offset, why]) for the retry to
    leave them open; the committed offsets stay as they are."""
    ids, branch = list(spec.table.id_columns), spec.table.branch
    if "rows" not in state:  # sorted as net_changes sorts them, so that net.group indexes these rows
        staged = read_staged(table, files)
        state["rows"] = staged.sort_by([(c, "ascending") for c in ids] + [(PARTITION, "ascending"), (OFFSET, "ascending")]) \
            if staged is not None else None
    rows = state["rows"]
    attempt = _next_attempt(table, state)
    if rows is None or rows.num_rows == 0:
        state["counts"], state["files"] = {"applied": 0, "refused": 0, "refused_letters": []}, []
        props = properties(table)
        props[CHANGES] = json.dumps(state["counts"], separators=(",", ":"))
        return Change(props, (), branch=branch)
    net = net_changes(rows, ids, spec.op_column(), spec.table.op_values)
    found = find_rows(table, net.keys, ids, source=True, branch=branch)
    live = pa.concat_tables([t for _, t in found]) if found else None
    removed = removed_since(table, net.keys, ids, plan.retry_of, branch)
    applied, reasons = retry_decisions(net, live, removed)
    chosen = pc.indices_nonzero(applied)
    hits = [(f, t.filter(pc.is_in(t.column("__key"), value_set=chosen)).column("__pos").combine_chunks()) for f, t in found]
    hits = [(f, p) for f, p in hits if len(p)]
    upserts = net.last.filter(pc.and_(applied, pc.invert(net.last_deletes)))
    written = write_upserts(table, upserts, f"{plan.batch_id}-a{attempt}-upserts")
    refusing = pc.invert(pc.take(applied, net.group))
    refused_rows = rows.filter(refusing)  # every retried change of a refused key
    why = dict(reasons)
    counts: dict[str, Any] = {
        "applied": int(pc.sum(pc.cast(pc.take(applied, net.group), pa.int64())).as_py() or 0),
        "refused": refused_rows.num_rows,
        "refused_letters": [[t, p, o, why[k]] for t, p, o, k in zip(refused_rows.column(TOPIC).to_pylist(),
                                                                     refused_rows.column(PARTITION).to_pylist(),
                                                                     refused_rows.column(OFFSET).to_pylist(),
                                                                     net.group.filter(refusing).to_pylist(), strict=True)],
        "position_deletes": sum(len(p) for _, p in hits)}
    state["counts"], state["files"] = counts, written
    props = properties(table)
    props[CHANGES] = json.dumps(counts, separators=(",", ":"), sort_keys=True, default=str)
    log.info("retry %s of %s: %d changes applied, %d refused (a later change of their key is applied)", plan.batch_id,
             spec.table.identifier, counts["applied"], counts["refused"])
    deletes = write_position_deletes(table, hits, f"{plan.batch_id}-a{attempt}")
    _written_by_attempt(state, written, deletes)
    return Change(props, tuple(written), deletes=tuple(deletes), branch=branch,
                  remove_properties=tuple(confirm_keys(table, plan.batch_id)))


def removed_since(table: Any, keys: Any, ids: list[str], letter_batches: tuple[str, ...], branch: str | None) -> Any:
    """Per key of ``keys``: None when no snapshot since the earliest of ``letter_batches`` (their own included)
    removed a row of the key, else why it may have (a row of the key was live before a snapshot that removed rows,
    or the history cannot tell: the letters' batch is no longer in it, too many snapshots removed rows)."""
    n = keys.num_rows
    found = [find_batch_snapshot(table, b) for b in letter_batches]
    if not letter_batches or any(s is None for s in found):
        return ["the history no longer holds the letters' batch, so a later delete of the key cannot be ruled out"] * n
    since = min(s.sequence_number or 0 for s in found)
    head = table.snapshot_by_name(branch) if branch else table.current_snapshot()
    chain, snap = [], head
    while snap is not None and (snap.sequence_number or 0) >= since:
        chain.append(snap)
        snap = table.snapshot_by_id(snap.parent_snapshot_id) if snap.parent_snapshot_id is not None else None
    removing = [s for s in chain if s.parent_snapshot_id is not None and s.summary is not None
                and (int(s.summary.get("added-position-deletes", 0) or 0) or int(s.summary.get("deleted-records", 0) or 0))]
    if len(removing) > MAX_LATER_SNAPSHOTS:
        return [f"{len(removing)} snapshots removed rows since the letters' batch (more than {MAX_LATER_SNAPSHOTS} "
                "searched)"] * n
    out: list[str | None] = [None] * n
    indexed = keys.append_column("__key", pa.array(np.arange(n), pa.int64()))
    for s in removing:
        before = table.scan(row_filter=_bounds_filter(keys, ids), selected_fields=tuple(ids),
                            snapshot_id=s.parent_snapshot_id).to_arrow()
        if before.num_rows:
            hit = before.cast(indexed.select(ids).schema).join(indexed, keys=ids, join_type="inner")
            for k in hit.column("__key").to_pylist():  # error path: the retried keys only
                out[k] = out[k] or f"a row of the key was removed by snapshot {s.snapshot_id}, after the letter's batch"
    return out
