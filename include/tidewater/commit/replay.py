"""The change a replay or backfill makes to one table (see ``plan/replay.py``; committed by ``commit/batch.py``).

``replace``: the rows that came from the plan's ranges are deleted (copy-on-write) and the re-read rows
appended, both snapshots in one transaction. ``append-missing``: only the append. Change tables reapply
(``commit/changes.py``: REAPPLY). The snapshots carry the table's committed offsets unchanged and the
replay's batch id, so a retry after success is a no-op and the offsets never move (backwards or forwards); a
separate offsets holder (a routed pipeline's checkpoint) is not touched.
"""

from __future__ import annotations

import json
from typing import Any

from tidewater.batch import BatchPlan, Mode, Offsets
from tidewater.commit.primitive import Change
from tidewater.config.spec import PipelineSpec
from tidewater.errors import TerminalError
from tidewater.table.provenance import present_offsets, rows_filter, staged_offsets
from tidewater.table.provisional import confirm_keys
from tidewater.table.summary import BATCH_ID, REPLAY, summary_properties


def refuse_uncommitted_ranges(plan: BatchPlan, offsets: Offsets, holder: str) -> None:
    """A replay re-reads committed records only: a range past the holder's committed offset is the scheduled
    batches'."""
    for r in plan.ranges:
        if r.end > offsets.get(r.topic, {}).get(r.partition, -1):
            raise TerminalError(
                f"replay range [{r.start}, {r.end}) is beyond the committed offset",
                table=holder,
                topic=r.topic,
                partition=r.partition,
                batch_id=plan.batch_id,
            )


def refuse_rows_held_since_written(table: Any, spec: PipelineSpec, plan: BatchPlan, files: Any) -> None:
    """Append-missing replays and dead-letter retries stage only the offsets the table did not hold when their write
    step asked it. Asked again on the table as it is now (every commit attempt, after the refresh): if it holds any
    of the staged rows' offsets, another replay or retry added them since, and appending would hold them twice. Terminal:
    nothing is committed, and the replay run again leaves them out. Vectorized: the staged rows' coordinates against
    those the table holds from the plan's ranges."""
    if not files or table is None:
        return
    present = present_offsets(spec, table, plan.ranges)
    if not present.num_rows:
        return
    staged = staged_offsets(spec, table, [f.file_path for f in files])
    coordinates = ["topic", "partition", "offset"]
    held = _distinct(present, coordinates)
    again = (
        staged.cast(held.schema)
        .join(held, keys=coordinates, join_type="inner")
        .sort_by([("partition", "ascending"), ("offset", "ascending")])
    )
    if again.num_rows:
        first, count = again.slice(0, 1).to_pylist()[0], again.num_rows
        raise TerminalError(
            f"{count} of the rows this replay would append are in the table already: another replay or "
            "retry of these offsets committed after this one's write step read what the table held. "
            "Nothing was committed; run the replay again (it leaves out what the table holds)",
            table=spec.table.identifier,
            batch_id=plan.batch_id,
            topic=first["topic"],
            partition=first["partition"],
            offset=first["offset"],
        )


def _distinct(table: Any, columns: list[str]) -> Any:
    """``table``'s distinct rows over ``columns`` (a row the table holds twice is one coordinate)."""
    return table.group_by(columns).aggregate([]).select(columns)


def replay_summary(
    plan: BatchPlan, offsets: Offsets, records: int, skipped: int, dag_run_id: str | None, validation: dict[str, Any] | None
) -> dict[str, str]:
    """A replay snapshot's properties: the table's committed offsets unchanged, the batch id, the ranges."""
    props = summary_properties(
        offsets=offsets,
        batch_id=plan.batch_id,
        pipeline=plan.pipeline,
        records=records,
        valid_through_ms=None,
        dag_run_id=dag_run_id,
        dead_letters=0,
        skipped=skipped,
        validation=validation,
    )
    props[REPLAY] = json.dumps(
        {
            "mode": plan.mode,
            "ranges": [[r.topic, r.partition, r.start, r.end] for r in plan.ranges],
            **({"data_interval": list(plan.data_interval)} if plan.data_interval else {}),
            **({"tables": list(plan.tables)} if plan.tables else {}),
            **({"retry_of": list(plan.retry_of)} if plan.retry_of else {}),
        },
        separators=(",", ":"),
    )
    return props


def replay_change(table: Any, spec: PipelineSpec, plan: BatchPlan, files: Any, props: dict[str, str], mode: Mode) -> Change:
    """``replace``: delete the range's rows and append ``files`` (one transaction); ``append-missing``: append."""
    append = bool(files) or mode is not Mode.REPLACE
    confirm = tuple(confirm_keys(table, plan.batch_id))
    if mode is not Mode.REPLACE:
        return Change(props, files, branch=spec.table.branch, remove_properties=confirm)
    # With nothing to append the delete's snapshot carries the batch id (the idempotency marker).
    marker = {k: v for k, v in props.items() if k != BATCH_ID} if append else props
    return Change(
        props,
        files,
        branch=spec.table.branch,
        delete_filter=rows_filter(spec, plan.ranges),
        delete_properties=marker,
        append=append,
        remove_properties=confirm,
    )
