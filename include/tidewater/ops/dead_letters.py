"""Dead letters people can act on: browse them, retry them with the current settings, or drop them with a reason.

A letter is a row of the pipeline's dead-letter table: a record (topic, partition, offset) and the batch that
dead-lettered it (``batch_id``). What became of it is recorded, append only, in the dead-letter table's companion
``<dead-letter table>_resolutions`` (``table.own_tables.RESOLUTION_SCHEMA``); a letter's state is its newest row there:

- none, ``released`` (a retry failed before it committed anything), ``refused`` (a change table holds a later
  change of its key) or ``failed-again`` (it decoded no better: the letter stays, its new error is the reason):
  **open**, a retry may take it;
- ``retrying``: claimed by a retry under way (its ``action_id``); the next retry finishes that one first;
- ``resolved``: its record is in the table(s), committed by the retry ``action_id`` (``snapshots``: each table's
  snapshot); ``skipped``: it decoded, but the current settings skip it (a tombstone, a record no route takes);
- ``dropped``: an operator gave it up (``reason``, ``by``).

A retry (``retry``) is a batch of its own, exactly once, in three commits, each idempotent by the retry's batch id:

1. the **claim**: the chosen open letters become ``retrying`` (a concurrent retry that claimed some first keeps them);
2. the **records**: the letters' stored raw records (never Kafka's: they are the same bytes and Kafka may no longer
   hold them) are decoded, transformed and routed with the pipeline's current settings (``write.task.write_letters``),
   checked by the quality gate and committed as a replay of mode ``retry`` (``commit/batch.py``): appended to append
   tables (offsets a table already holds are left out), applied in source order to change tables where no later change
   of the key is (``commit/changes.py``: RETRY); offsets never move. Records that fail again stay the letters
   they were (the files the write made for them are removed, nothing new lands in the dead-letter table); when none
   passes, nothing is committed;
3. the **outcome** of every claimed letter.

Killed anywhere, the next retry finds the claim without an outcome and finishes it with the same batch id: the
records' commit is found by its batch id (never made twice), the outcome recorded. A second retry of the same
letters finds none open: a no-op.
"""

from __future__ import annotations

import getpass
import json
import logging
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tidewater.batch import BatchManifest, BatchPlan, Mode, PartitionRange, new_batch_id
from tidewater.commit.primitive import Change, commit
from tidewater.config.spec import PipelineSpec
from tidewater.errors import ConfigError, TerminalError, TidewaterError
from tidewater.steps.lifecycle import commit_step, validate_step
from tidewater.table.catalog import load_catalog, load_table
from tidewater.table.filters import equal
from tidewater.table.letters import (
    KEY,
    OPEN,
    OUTCOMES,
    LetterState,
    classify,
    keys_of,
    letter_states,
    letters,
    refusals,
    states_after,
    tally,
)
from tidewater.table.own_tables import RESOLUTION_SCHEMA, ensure_resolution_table, resolution_table_name
from tidewater.table.provenance import present_offsets
from tidewater.table.summary import BATCH_ID, PIPELINE, RECORDS, changes_of, find_batch_snapshot, summary_dict
from tidewater.table.targets import holder_state, target_tables, target_view
from tidewater.write.job import collect_manifest, write_rounds
from tidewater.write.sinks import delete_files
from tidewater.write.task import write_letters

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

log = logging.getLogger(__name__)

# ---- retry ----------------------------------------------------------------------------------------------------------


def retry(
    spec: PipelineSpec,
    *,
    error_class: str | None = None,
    batch: str | None = None,
    dry_run: bool = False,
    by: str | None = None,
    out: Any = None,
) -> dict[str, Any]:
    """Retry the open letters (of ``error_class``, of ``batch``) with the current settings; see the module docstring.
    A retry left unfinished (killed) is finished first, whatever the filters. ``dry_run``: only say what would be
    retried. Returns what happened: the retry's batch id, and how many letters were resolved, failed again or were
    refused."""
    say = out or (lambda _s: None)
    by = by or getpass.getuser()
    catalog = load_catalog(spec)
    finished = [] if dry_run else [finish(spec, catalog, rid, claimed, by, say) for rid, claimed in in_flight(catalog, spec)]
    chosen = letters(spec, catalog, error_class=error_class, batch=batch, state="open")
    if chosen.num_rows == 0:
        say("nothing to retry: no open dead letters" + _filters(error_class, batch))
        return {"status": "nothing-to-retry", "letters": 0, "finished": finished}
    by_class = tally(chosen.column("error_class"))
    say(
        f"{chosen.num_rows} open dead letters to retry"
        + _filters(error_class, batch)
        + ": "
        + ", ".join(f"{n} {c}" for c, n in by_class.items())
    )
    if dry_run:
        return {"status": "dry-run", "letters": chosen.num_rows, "by_class": by_class, "finished": finished}
    rid = Mode.RETRY.new_batch_id()
    claimed = claim(catalog, spec, chosen, rid, by)
    if claimed.num_rows == 0:
        say("nothing to retry: another retry claimed these letters first")
        return {"status": "nothing-to-retry", "letters": 0, "finished": finished}
    return {**finish(spec, catalog, rid, claimed, by, say), "finished": finished}


def _filters(error_class: str | None, batch: str | None) -> str:
    return "".join(f" {k} {v}" for k, v in (("of class", error_class), ("of batch", batch)) if v)


def in_flight(catalog: Catalog, spec: PipelineSpec) -> list[tuple[str, pa.Table]]:
    """Retries that claimed letters and recorded no outcome (killed): (batch id, the claimed letters with payloads)."""
    claimed = letters(spec, catalog, state=LetterState.RETRYING)
    if claimed.num_rows == 0:
        return []
    out = []
    for rid in sorted(set(claimed.column("action_id").to_pylist())):
        out.append((rid, claimed.filter(pc.equal(claimed.column("action_id"), rid))))
    return out


def claim(catalog: Catalog, spec: PipelineSpec, chosen: pa.Table, rid: str, by: str) -> pa.Table:
    """Commit step 1: the chosen letters become ``retrying`` under ``rid``; those another retry or a drop took in the
    meantime are left out (checked on the resolution table as each attempt loads it). Returns the letters claimed."""
    taken: dict[str, pa.Table] = {}

    def still_open(table: Table) -> pa.Table:
        states = letter_states(catalog, spec, table) if table.current_snapshot() is not None else None
        if states is None or states.num_rows == 0:
            return chosen
        busy = states.filter(pc.invert(pc.is_in(states.column("state"), pa.array(OPEN))))
        index = keys_of(chosen).append_column("__i", pa.array(range(chosen.num_rows), pa.int64()))
        gone = index.join(keys_of(busy), keys=KEY, join_type="inner").column("__i")
        return chosen.filter(pc.invert(pc.is_in(pa.array(range(chosen.num_rows), pa.int64()), value_set=gone)))

    def rows_of(table: Any) -> pa.Table:
        taken["letters"] = still_open(table)
        return _resolution_rows(spec, taken["letters"], LetterState.RETRYING, rid, by)

    _record(catalog, spec, rows_of, f"{rid}/claim", f"retry {rid} (claim)")
    return taken["letters"]  # set by the attempt that committed (a fresh id: never committed before this call)


def finish(spec: PipelineSpec, catalog: Catalog, rid: str, claimed: pa.Table, by: str, say: Any) -> dict[str, Any]:
    """Commit steps 2 and 3 of the retry ``rid`` over its ``claimed`` letters (a rerun after a kill finds step 2's
    commit by its batch id). A failure before any of its commits releases the letters (open again, the error kept
    as the reason) when it is terminal; a transient one leaves the claim for the next retry to finish."""
    plan = _plan(spec, catalog, rid, claimed)
    committed_before = _landed(catalog, spec, rid)
    try:
        manifest = write_claimed(spec, plan, claimed)
        status = "nothing-to-commit"
        if any(o.data_files for o in manifest.outputs) or committed_before:
            validate_step(spec, plan, manifest)
            result = commit_step(spec, plan, manifest)
            status = result.status
            _remove_unused(catalog, manifest, result)
    except TidewaterError as e:
        if not e.transient and not committed_before and not _landed(catalog, spec, rid):
            why = str(e)
            _record(
                catalog,
                spec,
                lambda _t: _resolution_rows(spec, claimed, LetterState.RELEASED, rid, by, reason=why),
                f"{rid}/done",
                f"retry {rid} (released)",
            )
            say(f"retry {rid} failed before it committed anything; its {claimed.num_rows} letters are open again: {e}")
        raise
    snapshots = _snapshots(catalog, spec, rid)
    outcome = _outcome(spec, catalog, plan, claimed, manifest, snapshots, by)
    # the records that failed again stay the letters they were: the new letters' files are not committed
    delete_files(load_table(catalog, spec.dead_letter_table()), [f.file_path for f in manifest.dead_letter_files])
    _record(catalog, spec, lambda _t: outcome, f"{rid}/done", f"retry {rid} (outcome)")
    n = tally(outcome.column("state"))
    say(
        f"{status}: retry {rid} of {claimed.num_rows} dead letters: {n.get('resolved', 0)} resolved "
        f"({_rows(manifest)} rows written, {manifest.present} already present), {n.get('failed-again', 0)} failed "
        f"again, {n.get('refused', 0)} refused, {n.get('skipped', 0)} skipped"
    )
    return {
        "status": status,
        "batch_id": rid,
        "letters": claimed.num_rows,
        "rows": _rows(manifest),
        "already_present": manifest.present,
        **{s.value.replace("-", "_"): n.get(s.value, 0) for s in OUTCOMES},
        "snapshots": snapshots,
    }


def _remove_unused(catalog: Catalog, manifest: BatchManifest, result: Any) -> None:
    """The files this run wrote for tables that had the retry already (a rerun after a kill): never committed."""
    done = {t.table for t in result.tables if t.status == "already-committed"}
    for out in manifest.outputs:
        if out.table in done and out.data_files:
            delete_files(load_table(catalog, out.table), [f.file_path for f in out.data_files])


def _rows(manifest: BatchManifest) -> int:
    """Rows the retry wrote, over every table."""
    return sum(o.rows for o in manifest.outputs)


def _plan(spec: PipelineSpec, catalog: Catalog, rid: str, claimed: pa.Table) -> BatchPlan:
    """The retry's batch plan: per partition, the range from its first to its last letter (the commit checks it is
    committed), the holder's offsets (kept), the batches that dead-lettered the letters."""
    ranges = []
    parts = claimed.group_by(["topic", "partition"]).aggregate([("offset", "min"), ("offset", "max")])
    for t, p, lo, hi in zip(*(parts.column(c).to_pylist() for c in ("topic", "partition", "offset_min", "offset_max"))):
        ranges.append(PartitionRange(t, int(p), int(lo), int(hi) + 1))
    holder, state = holder_state(catalog, spec)
    return BatchPlan.new(
        spec,
        sorted(ranges),
        state.offsets if state is not None else None,
        state.snapshot_id if state is not None else None,
        Mode.RETRY,
        batch_id=rid,
        retry_of=tuple(sorted(set(claimed.column("letter_batch_id").to_pylist()))),
    )


def write_claimed(spec: PipelineSpec, plan: BatchPlan, claimed: pa.Table) -> BatchManifest:
    """The write step of a retry, in this process (letters are few; no Spark): one task per partition over the
    letters' stored records. Offsets a table already holds are left out (``TableSink.held``; the pipeline's own
    table's are counted in ``manifest.present``)."""
    parts = [
        claimed.filter(pc.and_(pc.equal(claimed.column("topic"), r.topic), pc.equal(claimed.column("partition"), r.partition))).sort_by(
            "offset"
        )
        for r in plan.ranges
    ]

    def execute(ids: list[int]) -> list[dict[str, Any]]:
        return [write_letters(spec, plan.batch_id, i, plan.ranges[i], parts[i]) for i in ids]

    return collect_manifest(plan, spec, write_rounds(execute, plan, spec, len(plan.ranges)))


def _landed(catalog: Catalog, spec: PipelineSpec, rid: str) -> bool:
    """Some table has a snapshot of the retry ``rid``."""
    return bool(_snapshots(catalog, spec, rid))


def _snapshots(catalog: Catalog, spec: PipelineSpec, rid: str) -> dict[str, str]:
    """{table: snapshot id} of the retry ``rid``'s commits (the pipeline's tables that have one)."""
    out = {}
    for ident in target_tables(catalog, spec) or [spec.targets.holder]:
        table = load_table(catalog, ident)
        snap = find_batch_snapshot(table, rid) if table is not None else None
        if snap is not None:
            out[ident] = str(snap.snapshot_id)
    return out


def _dead_letter_io(catalog: Catalog, spec: PipelineSpec, plan: BatchPlan) -> Any:
    """The dead-letter table's file IO, to read the letters a retry's commit added to it."""
    dlq = load_table(catalog, spec.dead_letter_table())
    if dlq is None:
        raise TerminalError(f"retry {plan.batch_id}: its dead letters were committed, but {spec.dead_letter_table()} is gone")
    return dlq.io


def _outcome(
    spec: PipelineSpec, catalog: Catalog, plan: BatchPlan, claimed: pa.Table, manifest: BatchManifest, snapshots: dict[str, str], by: str
) -> pa.Table:
    """Step 3's rows: per claimed letter, failed-again (a new letter of the retry holds its offset; its new error is
    the reason), refused (a change table's commit stamped it), skipped (the retry skipped records, and no table holds
    this one's offset), else resolved (pointing to the retry's ``snapshots``)."""
    again: dict[tuple[str, int, int], str] = {}
    if manifest.dead_letter_files:  # the error path: the letters that failed again
        io = _dead_letter_io(catalog, spec, plan)
        for f in manifest.dead_letter_files:
            with io.new_input(f.file_path).open() as fh:
                t = pq.read_table(fh, columns=["topic", "partition", "offset", "error_class", "error_message"])
            for r in t.to_pylist():
                again[(r["topic"], r["partition"], r["offset"])] = f"{r['error_class']}: {r['error_message']}"
    refused: dict[tuple[str | None, int, int], str] = {}
    for ident, snap_id in snapshots.items():
        target = load_table(catalog, ident)
        if target is None:
            raise TerminalError(f"retry {plan.batch_id}: {ident} was committed to and is gone", table=ident)
        changes = changes_of(summary_dict(target.snapshot_by_id(int(snap_id)))) or {}
        refused.update(refusals(changes.get("refused_letters", []), ident))
    no_row = _without_a_row(spec, catalog, plan, claimed) if manifest.skipped else set()
    coordinates = list(zip(*(claimed.column(c).to_pylist() for c in ("topic", "partition", "offset")), strict=True))
    states, reasons = zip(*classify(coordinates, again, refused, no_row), strict=True) if coordinates else ((), ())
    rows = _resolution_rows(spec, claimed, LetterState.RESOLVED, plan.batch_id, by, snapshots=json.dumps(snapshots, sort_keys=True))
    return rows.set_column(rows.schema.get_field_index("state"), "state", pa.array([st.value for st in states], pa.string())).set_column(
        rows.schema.get_field_index("reason"), "reason", pa.array(list(reasons), pa.string())
    )


def _without_a_row(spec: PipelineSpec, catalog: Catalog, plan: BatchPlan, claimed: pa.Table) -> set[tuple[str, int, int]]:
    """The ``claimed`` letters' offsets that no target table holds as a row (asked only when the retry skipped
    records; none when a change table may have taken them, or rows carry no source offset)."""
    if spec.format.metadata not in ("prefixed", "struct"):
        return set()
    held: set[tuple[str, int, int]] = set()
    for ident in target_tables(catalog, spec) or [spec.targets.holder]:
        view, table = target_view(spec, catalog, ident), load_table(catalog, ident)
        if view.applies_changes:
            return set()
        if table is not None:
            rows = present_offsets(view, table, list(plan.ranges))
            held |= set(zip(*(rows.column(c).to_pylist() for c in ("topic", "partition", "offset"))))
    return set(zip(*(claimed.column(c).to_pylist() for c in ("topic", "partition", "offset")))) - held


# ---- drop -----------------------------------------------------------------------------------------------------------


def drop(
    spec: PipelineSpec,
    *,
    reason: str,
    error_class: str | None = None,
    batch: str | None = None,
    dry_run: bool = False,
    by: str | None = None,
    out: Any = None,
) -> dict[str, Any]:
    """Give up the open letters (of ``error_class``, of ``batch``): they become ``dropped`` with ``reason`` and who
    did it; their records stay in the dead-letter table (the audit counts them as dead letters given up)."""
    say = out or (lambda _s: None)
    if not (reason or "").strip():
        raise ConfigError("--reason: required to drop dead letters (kept with each letter)")
    by = by or getpass.getuser()
    catalog = load_catalog(spec)
    chosen = letters(spec, catalog, error_class=error_class, batch=batch, state="open", payload=False)
    if chosen.num_rows == 0:
        say("nothing to drop: no open dead letters" + _filters(error_class, batch))
        return {"status": "nothing-to-drop", "letters": 0}
    if dry_run:
        say(f"dry run: would drop {chosen.num_rows} dead letters" + _filters(error_class, batch))
        return {"status": "dry-run", "letters": chosen.num_rows, "by_class": tally(chosen.column("error_class"))}
    did = "drop-" + new_batch_id()
    kept: dict[str, int] = {}

    def rows_of(_table: Any) -> pa.Table:
        still = letters(spec, catalog, error_class=error_class, batch=batch, state="open", payload=False)
        kept["n"] = still.num_rows
        return _resolution_rows(spec, still, LetterState.DROPPED, did, by, reason=reason.strip())

    _record(catalog, spec, rows_of, did, f"drop {did}")
    say(f"dropped {kept.get('n', 0)} dead letters ({did}): {reason.strip()}")
    return {"status": "dropped", "drop_id": did, "letters": kept.get("n", 0)}


# ---- the resolution table -------------------------------------------------------------------------------------------


def _resolution_rows(
    spec: PipelineSpec, chosen: pa.Table, state: LetterState, action: str, by: str, reason: str | None = None, snapshots: str | None = None
) -> pa.Table:
    n = chosen.num_rows
    return pa.table(
        {
            "topic": chosen.column("topic"),
            "partition": chosen.column("partition").cast(pa.int32()),
            "offset": chosen.column("offset"),
            "letter_batch_id": chosen.column("letter_batch_id"),
            "pipeline": pa.array([spec.name] * n, pa.string()),
            "state": pa.array([state.value] * n, pa.string()),
            "action_id": pa.array([action] * n, pa.string()),
            "snapshots": pa.array([snapshots] * n, pa.string()),
            "reason": pa.array([reason] * n, pa.string()),
            "by": pa.array([by] * n, pa.string()),
            "at": pa.array([datetime.now(timezone.utc)] * n, pa.timestamp("us", tz="UTC")),
        },
        schema=RESOLUTION_SCHEMA,
    )


def _record(catalog: Catalog, spec: PipelineSpec, rows_of: Any, marker: str, what: str) -> None:
    """Append ``rows_of(table)`` to the resolution table, once: by ``marker`` in its snapshots and, should those be
    expired, by its rows (a step of an action already recorded is not recorded again); the same commit keeps the
    count of letters in each state (``table.letters.KEPT_STATES``)."""
    ensure_resolution_table(catalog, spec)
    action, _, phase = marker.partition("/")

    def prepare(table: Table) -> Change | None:
        if table.current_snapshot() is not None:
            done = table.scan(row_filter=equal("action_id", action), selected_fields=("state",)).to_arrow()
            states = set(done.column("state").to_pylist())
            if (phase == "claim" and states) or (phase != "claim" and states - {LetterState.RETRYING.value}):
                return None
        rows = rows_of(table)
        if rows.num_rows == 0:
            return None
        return Change(
            {BATCH_ID: marker, PIPELINE: spec.name, RECORDS: str(rows.num_rows)}, rows=rows, set_properties=states_after(table, spec, rows)
        )

    commit(catalog, resolution_table_name(spec), prepare, marker=marker, what=what)
