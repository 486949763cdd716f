"""The pipeline's dead letters and what became of them, as read from its dead-letter table and that table's companion
``<dead-letter table>_resolutions`` (``table.own_tables.RESOLUTION_SCHEMA``; written by ``ops/dead_letters.py``, which
describes the states). For the CLI's listing, the Tidewater view and the audit.

**Kept counts.** How many letters a pipeline has, and how many are in each state, are kept as they change, so the view,
``status`` and the audit read two table properties instead of scanning a dead-letter table that may hold millions of
rows: ``KEPT_TOTALS`` on the dead-letter table (set by ``commit/dead_letters.py`` in the commit that appends the
letters) and ``KEPT_STATES`` on the resolution table (set by each resolution commit). Each records the table's
``total-records`` it counts, so a count another writer made stale (an older Tidewater, a hand-made append or delete)
is noticed (:func:`kept`) and the letters are scanned instead, until the next commit of that table recounts them."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from tidewater.config.spec import PipelineSpec
from tidewater.errors import ConfigError
from tidewater.table.catalog import load_catalog, load_table
from tidewater.table.filters import all_of, equal
from tidewater.table.own_tables import RESOLUTION_SCHEMA, resolution_table_name

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

log = logging.getLogger(__name__)

KEY = ["topic", "partition", "offset", "letter_batch_id"]
KEPT_TOTALS = "tidewater.letter-totals"  # dead-letter table property: {"rows": total-records, "pipelines": {name: n}}
KEPT_STATES = "tidewater.letter-states"  # resolution table property: {"rows": ..., "pipelines": {name: {state: n}}}


class LetterState(StrEnum):
    """What a row of the resolution table says became of a letter (``ops/dead_letters.py`` describes each); a
    letter's state is its newest row's, and a letter without one is open."""

    RELEASED = "released"
    REFUSED = "refused"
    FAILED_AGAIN = "failed-again"
    RETRYING = "retrying"
    RESOLVED = "resolved"
    SKIPPED = "skipped"
    DROPPED = "dropped"


OPEN = tuple(s.value for s in (LetterState.RELEASED, LetterState.REFUSED, LetterState.FAILED_AGAIN))  # open again
STATES = ("open", "retrying", "resolved", "skipped", "dropped")  # what a letter is now (a letter that failed again is open)
OUTCOMES = (LetterState.RESOLVED, LetterState.FAILED_AGAIN, LetterState.REFUSED, LetterState.SKIPPED)  # of a retry
SKIPPED_REASON = "decoded, but the pipeline's settings skip it (a tombstone, a record no route takes): no row"

Coordinates = tuple[str, int, int]  # a record's topic, partition and offset


def classify(
    claimed: list[Coordinates],
    again: Mapping[Coordinates, str],
    refused: Mapping[tuple[str | None, int, int], str],
    without_row: set[Coordinates],
) -> list[tuple[LetterState, str | None]]:
    """The outcome of each letter a retry claimed, in order, with its reason: ``failed-again`` when a new letter of the
    retry holds its coordinates (``again``: its new error), ``refused`` when a change table refused its change
    (``refused``, keyed by topic, partition and offset; a refusal an earlier version stamped names no topic, None, and
    stands for that partition and offset in every topic), ``skipped`` when it decoded but no table holds its offset
    (``without_row``), else ``resolved``. Pure: the caller reads the files and snapshots."""
    out: list[tuple[LetterState, str | None]] = []
    for c in claimed:  # the error path: letters are few
        why = refused.get(c) or refused.get((None, c[1], c[2]))
        if c in again:
            out.append((LetterState.FAILED_AGAIN, again[c]))
        elif why is not None:
            out.append((LetterState.REFUSED, why))
        elif c in without_row:
            out.append((LetterState.SKIPPED, SKIPPED_REASON))
        else:
            out.append((LetterState.RESOLVED, None))
    return out


def refusals(stamped: list[list[Any]], table: str) -> dict[tuple[str | None, int, int], str]:
    """A change table's refused letters as its retry commit stamped them (``refused_letters``: [topic, partition,
    offset, why], or [partition, offset, why] from before the topic was stamped), keyed for ``classify``."""
    out: dict[tuple[str | None, int, int], str] = {}
    for entry in stamped:
        t, p, o, why = entry if len(entry) == 4 else (None, *entry)
        out[(t, int(p), int(o))] = f"refused by {table}: {why}"
    return out


PREVIEW_BYTES = 512  # of a letter's payload, in the view and the CLI's listing


KEY_TYPES = pa.schema([("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()), ("letter_batch_id", pa.string())])


def keys_of(t: pa.Table) -> pa.Table:
    """The letter keys of ``t`` with one set of types (pyiceberg reads strings as large strings)."""
    return t.select(KEY).cast(KEY_TYPES)


def letter_states(catalog: Catalog | None, spec: PipelineSpec, table: Table | None = None) -> pa.Table:
    """Each letter's newest resolution row: ``KEY`` + state, action_id, snapshots, reason, by, at (none: all open);
    from ``table`` (the resolution table as a commit attempt loaded it) or the catalog's current one."""
    if table is None and catalog is not None:
        table = load_table(catalog, resolution_table_name(spec))
    if table is None or table.current_snapshot() is None:
        return RESOLUTION_SCHEMA.empty_table().drop_columns(["pipeline"])
    rows = table.scan(row_filter=equal("pipeline", spec.name)).to_arrow()
    latest = _newest(rows, KEY, [c for c in RESOLUTION_SCHEMA.names if c not in KEY and c != "pipeline"])
    for c in KEY:
        latest = latest.set_column(latest.schema.get_field_index(c), c, latest.column(c).cast(KEY_TYPES.field(c).type))
    return latest


def _newest(rows: pa.Table, keys: list[str], columns: list[str]) -> pa.Table:
    """Per letter (``keys``), ``columns`` of its newest resolution row (by ``at``, then by order written)."""
    rows = rows.append_column("__n", pa.array(range(rows.num_rows), pa.int64())).sort_by([("at", "ascending"), ("__n", "ascending")])
    latest = rows.group_by(keys, use_threads=False).aggregate([(c, "last") for c in columns])
    return latest.rename_columns([c.removesuffix("_last") for c in latest.column_names])


def letters(
    spec: PipelineSpec,
    catalog: Any | None = None,
    *,
    error_class: str | None = None,
    batch: str | None = None,
    state: str = "open",
    payload: bool = True,
) -> pa.Table:
    """The pipeline's dead letters (rows of its dead-letter table, with ``letter_batch_id`` for their batch) and their
    ``state`` (``STATES``), filtered by error class, the batch that dead-lettered them, and state (one of ``STATES``
    or ``all``), sorted by topic, partition and offset."""
    if state not in (*STATES, "all"):
        raise ConfigError(f"state: {state!r} is not one of {', '.join((*STATES, 'all'))}")
    catalog = catalog or load_catalog(spec)
    dlq = load_table(catalog, spec.dead_letter_table())
    if dlq is None or dlq.current_snapshot() is None:
        return pa.table({})
    conditions = [equal("pipeline", spec.name)]
    if error_class:
        conditions.append(equal("error_class", error_class))
    if batch:
        conditions.append(equal("batch_id", batch))
    cond = all_of(conditions)
    fields = ("*",) if payload else ("topic", "partition", "offset", "timestamp", "error_class", "error_message", "batch_id")
    rows = dlq.scan(row_filter=cond, selected_fields=fields).to_arrow()
    rows = rows.rename_columns(["letter_batch_id" if n == "batch_id" else n for n in rows.column_names])
    rows = rows.set_column(rows.schema.get_field_index("partition"), "partition", rows.column("partition").cast(pa.int32()))
    # joined by key and row number: Arrow's join carries no list columns (the headers)
    index = keys_of(rows).append_column("__i", pa.array(range(rows.num_rows), pa.int64()))
    found = index.join(letter_states(catalog, spec), keys=KEY, join_type="left outer").sort_by("__i")
    joined = rows
    for c in found.column_names:
        if c not in KEY and c != "__i":
            joined = joined.append_column(c, found.column(c))
    joined = joined.append_column("status", _status(joined.column("state")))
    if state != "all":
        joined = joined.filter(pc.equal(joined.column("status"), state))
    return joined.sort_by([("topic", "ascending"), ("partition", "ascending"), ("offset", "ascending")])


def tally(column: Any) -> dict[Any, int]:
    """How many times each value occurs in ``column``, most frequent first."""
    vc = pc.value_counts(column.combine_chunks())
    return dict(sorted(zip(vc.field("values").to_pylist(), vc.field("counts").to_pylist()), key=lambda x: -x[1]))


def counts(spec: PipelineSpec, catalog: Any | None = None) -> dict[str, int]:
    """How many of the pipeline's letters are in each state (``STATES``), and in all: the kept counts when both are
    current (two table properties, whatever the letters' number), else counted from the tables (:func:`scanned`)."""
    catalog = catalog or load_catalog(spec)
    dlq = load_table(catalog, spec.dead_letter_table())
    if dlq is None or dlq.current_snapshot() is None:
        return {**dict.fromkeys(STATES, 0), "total": 0}
    totals = kept(dlq, KEPT_TOTALS)
    resolutions = load_table(catalog, resolution_table_name(spec))
    states = kept(resolutions, KEPT_STATES) if resolutions is not None and resolutions.current_snapshot() is not None else {"pipelines": {}}
    if totals is None or states is None:
        log.info(
            "the dead-letter counts of %s are not kept current (written by another writer or an earlier "
            "version): counted from the tables; the next commit of letters or outcomes keeps them again",
            spec.name,
        )
        return scanned(spec, catalog)
    out = dict.fromkeys(STATES, 0)
    out.update({s: n for s, n in states["pipelines"].get(spec.name, {}).items() if s in out and s != "open"})
    out["total"] = int(totals["pipelines"].get(spec.name, 0))
    out["open"] = out["total"] - sum(n for s, n in out.items() if s not in ("open", "total"))
    return out


def scanned(spec: PipelineSpec, catalog: Any | None = None) -> dict[str, int]:
    """:func:`counts` from every letter of the pipeline and its newest resolution (a scan of both tables)."""
    rows = letters(spec, catalog, state="all", payload=False)
    out = dict.fromkeys(STATES, 0)
    if rows.num_rows:
        out.update(tally(rows.column("status")))
    out["total"] = rows.num_rows
    return out


def listing(
    spec: PipelineSpec,
    catalog: Any | None = None,
    *,
    error_class: str | None = None,
    batch: str | None = None,
    state: str = "open",
    limit: int = 100,
    preview: bool = True,
) -> dict[str, Any]:
    """Letters as JSON for the view and ``tidewater dead-letters list``: the first ``limit`` rows (a payload preview of
    ``PREVIEW_BYTES`` when ``preview``), the counts per state."""
    rows = letters(spec, catalog, error_class=error_class, batch=batch, state=state, payload=preview)
    out = []
    for r in rows.slice(0, limit).to_pylist() if rows.num_rows else []:  # bounded by limit: the error path
        item = {
            k: r[k]
            for k in (
                "topic",
                "partition",
                "offset",
                "error_class",
                "error_message",
                "letter_batch_id",
                "status",
                "action_id",
                "reason",
                "by",
            )
        }
        item["timestamp"] = r["timestamp"].isoformat() if r.get("timestamp") else None
        if r.get("snapshots"):
            item["snapshots"] = json.loads(r["snapshots"])
        if preview:
            value = r.get("value")
            item["payload_preview"] = value[:PREVIEW_BYTES].decode("utf-8", "replace") if value is not None else None
            item["payload_bytes"] = len(value) if value is not None else 0
        out.append(item)
    return {"pipeline": spec.name, "state": state, "matching": rows.num_rows, "letters": out, "counts": counts(spec, catalog)}


# ---- kept counts ----------------------------------------------------------------------------------------------------


def total_records(table: Table) -> int | None:
    """The table's rows, from its current snapshot's summary (None: no snapshot, or a summary without the total)."""
    snap = table.current_snapshot() if table is not None else None
    value = snap.summary.get("total-records") if snap is not None and snap.summary is not None else None
    return int(value) if value is not None else None


def kept(table: Table, prop: str) -> dict[str, Any] | None:
    """The counts kept in ``table``'s property ``prop`` when they count the table as it is now (the ``rows`` they
    were kept at are its ``total-records``); None when absent or stale."""
    text = table.metadata.properties.get(prop)
    if not text:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    rows = total_records(table)
    return value if rows is not None and value.get("rows") == rows else None


def totals_after(table: Table, pipeline: str, added: int) -> dict[str, str]:
    """The dead-letter table's property after a commit appends ``added`` letters of ``pipeline`` to ``table`` (as this
    commit attempt loaded it): the kept totals plus those, or, when they are not current, the table's letters counted
    by pipeline (once: the commit keeps them from then on)."""
    current: dict[str, Any] | None = kept(table, KEPT_TOTALS) if table.current_snapshot() is not None else {"rows": 0, "pipelines": {}}
    if current is None:  # the rows they count are the summary's total (which counts rows a delete file removed too)
        rows = table.scan(selected_fields=("pipeline",)).to_arrow()
        current = {"rows": total_records(table) or 0, "pipelines": tally(rows.column("pipeline")) if rows.num_rows else {}}
    pipelines = dict(current["pipelines"])
    pipelines[pipeline] = int(pipelines.get(pipeline, 0)) + added
    return {KEPT_TOTALS: json.dumps({"rows": current["rows"] + added, "pipelines": pipelines}, sort_keys=True, separators=(",", ":"))}


def _status(state: pa.Array) -> pa.Array:
    """A letter's state as ``STATES`` name it (``released``, ``refused`` and ``failed-again`` are open; null: open)."""
    return pc.if_else(pc.or_(pc.is_null(state), pc.is_in(state, pa.array(OPEN))), "open", state)


def states_after(table: Table, spec: PipelineSpec, rows: pa.Table) -> dict[str, str]:
    """The resolution table's property after a commit appends ``rows`` (resolution rows of ``spec``'s letters) to
    ``table`` as this attempt loaded it: each letter leaves its state's count for its new state's. The letters' states
    before are read from the table (an operator's action, not a batch: it may read the table)."""
    has = table.current_snapshot() is not None
    current: dict[str, Any] | None = kept(table, KEPT_STATES) if has else {"rows": 0, "pipelines": {}}
    before = letter_states(None, spec, table) if has else RESOLUTION_SCHEMA.empty_table().drop_columns(["pipeline"])
    if current is None:  # not current: every pipeline's letters counted from the rows
        current = {"rows": total_records(table) or 0, "pipelines": _state_counts(table)}
    index = keys_of(rows).append_column("__new", rows.column("state"))
    moved = index.join(keys_of(before).append_column("__old", before.column("state")), keys=KEY, join_type="left outer")
    mine = {s: int(n) for s, n in current["pipelines"].get(spec.name, {}).items()}
    for s, n in tally(_status(moved.column("__old"))).items():
        mine[s] = mine.get(s, 0) - n
    for s, n in tally(_status(moved.column("__new"))).items():
        mine[s] = mine.get(s, 0) + n
    pipelines = {**current["pipelines"], spec.name: {s: n for s, n in sorted(mine.items()) if s != "open" and n}}
    return {
        KEPT_STATES: json.dumps({"rows": current["rows"] + rows.num_rows, "pipelines": pipelines}, sort_keys=True, separators=(",", ":"))
    }


def _state_counts(table: Table) -> dict[str, dict[str, int]]:
    """Per pipeline, how many letters are in each state other than open, from every row of the resolution table."""
    rows = table.scan(selected_fields=(*KEY, "pipeline", "state", "at")).to_arrow()
    if rows.num_rows == 0:
        return {}
    latest = _newest(rows, [*KEY, "pipeline"], ["state"])
    latest = latest.append_column("status", _status(latest.column("state")))
    per = latest.group_by(["pipeline", "status"], use_threads=False).aggregate([("status", "count")])
    out: dict[str, dict[str, int]] = {}
    for p, s, n in zip(*(per.column(c).to_pylist() for c in ("pipeline", "status", "status_count"))):
        if s != "open":
            out.setdefault(p, {})[s] = n
    return out
