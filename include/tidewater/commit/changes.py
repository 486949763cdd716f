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

One attempt function (``row_delta_attempt``) serves every mode; what differs is the ``Decision`` the batch's
commit picks from ``KINDS``: apply all (an ingest), reapply (a replay: a change again only where it is still its
key's latest) or retry (dead letters: refused where a later change of the key is applied). The attempt's state is
the target's ``TargetAttempt`` (``commit/attempt.py``); the row mechanics live in ``table/row_delta.py``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.expressions import AlwaysTrue

from tidewater.batch import BatchPlan, Offsets, StagedFile
from tidewater.commit.attempt import TargetAttempt
from tidewater.commit.primitive import Change
from tidewater.config.spec import PipelineSpec
from tidewater.errors import TerminalError
from tidewater.table.provisional import confirm_keys
from tidewater.table.row_delta import find_rows, live_rows, removed_since, write_position_deletes
from tidewater.table.summary import (
    BATCH_ID,
    CHANGES,
    OFFSETS,
    PIPELINE,
    QUARANTINE_OF,
    QUARANTINED,
    TRUNCATE,
    committed_state,
    quarantine_branch,
    summary_dict,
)
from tidewater.transform.changes import (
    OFFSET,
    PARTITION,
    TOPIC,
    NetChanges,
    Truncated,
    count_effects,
    cut_at_truncates,
    net_changes,
    reapply_decisions,
    retry_decisions,
)
from tidewater.write.parquet import DataFileWriter, to_table_schema

if TYPE_CHECKING:
    from pyiceberg.table import Table

log = logging.getLogger(__name__)


def read_staged(table: Table, files: Any) -> Any:
    """The batch's staged change records (``files``), in the table's current schema."""
    pieces = []
    for f in files:
        with table.io.new_input(f.file_path).open() as fh:
            pieces.append(pq.read_table(fh))
    if not pieces:
        return None
    return to_table_schema(table, pa.concat_tables(pieces, promote_options="permissive"))


def write_upserts(table: Any, rows: Any, prefix: str) -> list[StagedFile]:
    """The new row images as data files of ``table``."""
    if rows is None or rows.num_rows == 0:
        return []
    writer = DataFileWriter(table, prefix)
    writer.write(to_table_schema(table, rows))
    return [StagedFile.from_json(d) for d in writer.close()]


@dataclass(frozen=True)
class Decided:
    """What a decision makes of the batch's changes against the table as this attempt loaded it: the rows to
    delete (``hits``: [(data file, sorted positions)]), the counts stamped on the snapshot, and the new row images
    it chose (``upserts``; None: the batch's own, written once for every attempt). ``truncated``: the change
    removes every row of the table first (the batch's truncates)."""

    hits: list[tuple[Any, Any]]
    counts: dict[str, Any]
    upserts: Any = None
    truncated: Truncated | None = None


@dataclass(frozen=True)
class Decision:
    """How a row delta decides which of the batch's changes apply: ``stage`` reads the staged changes into the
    attempt state once per batch; ``decide`` answers for one attempt. ``batch_upserts``: the new row images are the
    batch's net upserts whatever the table holds (an ingest), so they are written once; a replay's and a retry's
    depend on what the table holds now, so each attempt writes its own (and the next attempt removes them)."""

    stage: Callable[[Any, PipelineSpec, TargetAttempt], None]
    decide: Callable[[Any, PipelineSpec, BatchPlan, TargetAttempt], Decided]
    batch_upserts: bool = False


def _stage_net(staged: Any, spec: PipelineSpec, attempt: TargetAttempt) -> None:
    """The batch's changes reduced to one per key (None without records). Changes a truncate of the batch
    supersedes are left out (``attempt.truncated`` says what the truncates did; they reach this point only when the
    table applies them, see ``table.truncate``)."""
    if staged is not None:
        staged, attempt.truncated = cut_at_truncates(staged, spec.op_column(), spec.table.op_values)
        attempt.net = net_changes(staged, list(spec.table.id_columns), spec.op_column(), spec.table.op_values)


def _stage_sorted(staged: Any, spec: PipelineSpec, attempt: TargetAttempt) -> None:
    """A retry's changes, sorted as ``net_changes`` sorts them so that ``net.group`` indexes these rows (the refused
    letters are read from them), and reduced to one per key."""
    if staged is not None and staged.num_rows:
        ids = list(spec.table.id_columns)
        attempt.rows = staged.sort_by([(c, "ascending") for c in ids] + [(PARTITION, "ascending"), (OFFSET, "ascending")])
        attempt.net = net_changes(attempt.rows, ids, spec.op_column(), spec.table.op_values)


def _apply_all(table: Any, spec: PipelineSpec, plan: BatchPlan, attempt: TargetAttempt) -> Decided:
    """An ingest: every key's net change applied; its live rows (none after a truncate of the batch) deleted."""
    net, truncated = attempt.net, attempt.truncated
    if truncated is not None:  # every row committed before the batch goes: the changes meet an empty table
        hits, existed = [], pa.repeat(False, net.keys.num_rows if net else 0)
    else:
        hits, existed = live_rows(table, net.keys, list(spec.table.id_columns), spec.table.branch) if net else ([], None)
    counts: dict[str, Any] = count_effects(net, existed) if net else dict.fromkeys(("inserted", "updated", "deleted", "noop"), 0)
    counts.update(cross_partition_keys=net.cross_partition_keys if net else 0, position_deletes=sum(len(p) for _, p in hits))
    if truncated is not None:
        counts.update(truncated=truncated.truncates, superseded=truncated.superseded)
        log.info(
            "batch %s: %d truncate(s) of %s applied: its rows removed, %d earlier change(s) of the batch superseded",
            plan.batch_id,
            truncated.truncates,
            spec.table.identifier,
            truncated.superseded,
        )
    if net and net.cross_partition_keys:
        counts["cross_partition_examples"] = list(net.cross_partition_examples)
        log.warning(
            "batch %s: %d key(s) of %s changed in more than one partition (e.g. %s): their order across "
            "partitions is not the source's; keys must be partitioned by key",
            plan.batch_id,
            net.cross_partition_keys,
            spec.table.identifier,
            net.cross_partition_examples[:3],
        )
    return Decided(hits, counts, truncated=truncated)


def _chosen(net: NetChanges, found: list[tuple[Any, Any]], applied: Any) -> tuple[list[tuple[Any, Any]], Any]:
    """What a replay's or retry's decision ``applied`` (per key) makes: the positions of the chosen keys' live rows
    (by the rows' ``__key``), and the chosen keys' new row images (their last change, unless a delete)."""
    chosen = pc.indices_nonzero(applied)
    hits = [(f, t.filter(pc.is_in(t.column("__key"), value_set=chosen)).column("__pos").combine_chunks()) for f, t in found]
    return [(f, p) for f, p in hits if len(p)], net.last.filter(pc.and_(applied, pc.invert(net.last_deletes)))


def _reapply(table: Any, spec: PipelineSpec, plan: BatchPlan, attempt: TargetAttempt) -> Decided:
    """A replay (mode reapply): each change again, only where it is still its key's latest
    (``transform.changes.reapply_decisions``)."""
    net, branch = attempt.net, spec.table.branch
    if net is None:
        return Decided(
            [], {"reapplied": 0, "restored": 0, "superseded": 0, "absent": 0, "noop": 0, "position_deletes": 0}, upserts=pa.table({})
        )
    found = find_rows(table, net.keys, list(spec.table.id_columns), source=True, branch=branch)
    rows = pa.concat_tables([t for _, t in found]) if found else pa.table({"__key": pa.array([], pa.int64())})
    offsets = committed_state(table, branch).offsets
    applied, counts = reapply_decisions(net, rows, restorable(table, plan, offsets, spec))
    hits, upserts = _chosen(net, found, applied)
    counts["position_deletes"] = sum(len(p) for _, p in hits)
    log.info("replay %s of %s: %s", plan.batch_id, spec.table.identifier, ", ".join(f"{v} {k}" for k, v in counts.items()))
    return Decided(hits, counts, upserts=upserts)


def _retry(table: Any, spec: PipelineSpec, plan: BatchPlan, attempt: TargetAttempt) -> Decided:
    """A dead-letter retry (``ops/dead_letters.py``): the retried changes applied in source order (reduced to one per
    key, like a batch) where no later change of the same key is already applied, and refused where one is: a live
    row written by a later offset or by another partition, or (no live row) a snapshot since the letters' batch that
    removed a row of the key (``transform.changes.retry_decisions``). The refused letters are stamped on the
    snapshot (``refused_letters``: [topic, partition, offset, why]) for the retry to leave them open."""
    net, rows, branch, ids = attempt.net, attempt.rows, spec.table.branch, list(spec.table.id_columns)
    if net is None:
        return Decided([], {"applied": 0, "refused": 0, "refused_letters": []}, upserts=pa.table({}))
    found = find_rows(table, net.keys, ids, source=True, branch=branch)
    live = pa.concat_tables([t for _, t in found]) if found else None
    applied, reasons = retry_decisions(net, live, removed_since(table, net.keys, ids, plan.retry_of, branch))
    hits, upserts = _chosen(net, found, applied)
    refusing = pc.invert(pc.take(applied, net.group))
    refused_rows = rows.filter(refusing)  # every retried change of a refused key
    why = dict(reasons)
    counts: dict[str, Any] = {
        "applied": int(pc.sum(pc.cast(pc.take(applied, net.group), pa.int64())).as_py() or 0),
        "refused": refused_rows.num_rows,
        "refused_letters": [
            [t, p, o, why[k]]
            for t, p, o, k in zip(
                refused_rows.column(TOPIC).to_pylist(),
                refused_rows.column(PARTITION).to_pylist(),
                refused_rows.column(OFFSET).to_pylist(),
                net.group.filter(refusing).to_pylist(),
                strict=True,
            )
        ],
        "position_deletes": sum(len(p) for _, p in hits),
    }
    log.info(
        "retry %s of %s: %d changes applied, %d refused (a later change of their key is applied)",
        plan.batch_id,
        spec.table.identifier,
        counts["applied"],
        counts["refused"],
    )
    return Decided(hits, counts, upserts=upserts)


APPLY = Decision(_stage_net, _apply_all, batch_upserts=True)
REAPPLY = Decision(_stage_net, _reapply)
RETRY = Decision(_stage_sorted, _retry)


def row_delta_attempt(
    table: Any,
    spec: PipelineSpec,
    plan: BatchPlan,
    files: Any,
    attempt: TargetAttempt,
    properties: Callable[[Any], dict[str, str]],
    decision: Decision,
    quarantine: bool = False,
) -> Change:
    """One attempt to apply the staged change records ``files`` to ``table`` as loaded now, as ``decision`` decides;
    ``properties`` gives the snapshot's properties (offsets included) on it. ``attempt`` keeps what is done once (the
    staged changes, an ingest's new row images) and what this attempt wrote. ``quarantine``: the row delta goes to
    the batch's quarantine branch instead (``quarantined``)."""
    if not attempt.staged:
        decision.stage(read_staged(table, files), spec, attempt)
        attempt.staged = True
        if decision.batch_upserts:  # the new row images do not depend on the table: written once, whatever the attempts
            net = attempt.net
            attempt.upserts = tuple(write_upserts(table, net.upserts if net else None, f"{plan.batch_id}-upserts"))
    n = attempt.begin(table)
    decided = decision.decide(table, spec, plan, attempt)
    own = () if decided.upserts is None else tuple(write_upserts(table, decided.upserts, f"{plan.batch_id}-a{n}-upserts"))
    deletes = tuple(write_position_deletes(table, decided.hits, f"{plan.batch_id}-a{n}"))
    attempt.written = own + deletes
    attempt.files, attempt.counts = (attempt.upserts if decided.upserts is None else own), decided.counts
    props = properties(table)
    props[CHANGES] = json.dumps(decided.counts, separators=(",", ":"), sort_keys=True, default=str)
    remove, branch = tuple(confirm_keys(table, plan.batch_id)), spec.table.branch
    if quarantine:
        return quarantined(plan, props, attempt.files, deletes, decided.truncated is not None, branch, remove)
    if decided.truncated is None:
        return Change(props, attempt.files, deletes=deletes, branch=branch, remove_properties=remove)

    emptied = {TRUNCATE: json.dumps({"batch_id": plan.batch_id, "truncates": decided.truncated.truncates}), PIPELINE: plan.pipeline}
    return Change(props, attempt.files, branch=branch, delete_filter=AlwaysTrue(), delete_properties=emptied, remove_properties=remove)


def restorable(table: Table, plan: BatchPlan, offsets: Offsets, spec: PipelineSpec) -> list[int]:
    """The partitions where a reapply may restore a lost row (``reapply_decisions``): those whose replayed range
    reaches the table's committed offset, so no later change of the partition exists. None on a table that has
    applied a truncate: a truncate is not ordered against other partitions' changes, so a row may be missing
    because of it."""
    if any(TRUNCATE in summary_dict(s) for s in table.snapshots()):
        log.info(
            "replay %s: %s has applied a truncate: rows missing from it are not restored (counted absent)",
            plan.batch_id,
            spec.table.identifier,
        )
        return []
    return sorted({r.partition for r in plan.ranges if r.end >= offsets.get(r.topic, {}).get(r.partition, r.end + 1)})


def quarantined(
    plan: BatchPlan,
    props: dict[str, str],
    files: tuple[Any, ...],
    deletes: tuple[Any, ...],
    truncates: bool,
    branch: str | None,
    remove: tuple[str, ...],
) -> Change:
    """A change batch the gate refused (``validation.on_failure: quarantine``): its whole row delta (new row images
    and position deletes, computed against the table as it is) lands on the branch ``quarantine-<batch id>``, and
    main gets an empty snapshot with the batch id, the advanced offsets and the branch's name, in one transaction.
    Main's rows do not change, so publishing can apply the same row delta to main as long as nothing was committed
    after that snapshot; the next batch is not planned until a person publishes or drops it (a key's changes apply
    in order). A batch with a truncate cannot be quarantined: its emptying of the table is not a row delta."""
    if truncates:
        raise TerminalError(
            f"batch {plan.batch_id} failed the quality gate and holds a truncate, which a quarantine "
            "branch cannot carry: fix the data or the suite, or set validation.on_failure: fail",
            batch_id=plan.batch_id,
            table=plan.table,
        )
    name = quarantine_branch(plan.batch_id)
    to_branch = Change(
        {**{k: v for k, v in props.items() if k not in (OFFSETS, BATCH_ID)}, QUARANTINE_OF: plan.batch_id},
        files,
        deletes=deletes,
        branch=name,
    )
    main = {k: v for k, v in props.items() if k != CHANGES}  # nothing of the batch is applied to main
    return Change({**main, QUARANTINED: name}, (), branch=branch, also=(to_branch,), remove_properties=remove)
