"""Table maintenance: compaction, manifest rewrite, snapshot expiry and orphan removal, safe beside ingestion.

Each action runs Iceberg's Spark procedure on the pipeline's catalog (one SparkSession, configured by
:mod:`tidewater.spark.session`) and returns an :class:`ActionReport` with the table's files and bytes
before and after. The rules that keep ingestion safe:

- Compaction commits a ``replace`` snapshot. An ingest commit racing it either lands first (the
  rewrite's commit is retried on top of it by Iceberg) or fails its optimistic check and is retried by
  the committer on top of the compaction. Compaction snapshots do not carry offsets: the committed
  offsets are read from the newest ancestor that does (stamping them on a rewrite could publish
  offsets older than a racing ingest commit).
- Expiry never removes the newest snapshot carrying offsets nor any snapshot after it, so offsets stay
  readable however the age and ``retain_last`` are set.
- Orphan removal only considers files older than ``remove_orphan_files.older_than_hours`` (validated to
  exceed the longest possible batch), lists candidates with Spark's procedure in dry-run mode, and
  deletes them itself, skipping every file named in the manifest of a batch that is staged but not
  yet committed.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tidewater.audit import ledger
from tidewater.batch import MANIFEST_NAME, BatchManifest, read_json
from tidewater.config.sections.maintenance import MAINTENANCE_ACTIONS
from tidewater.config.spec import PipelineSpec
from tidewater.errors import ConfigError, TerminalError, TransientError
from tidewater.spark import session as spark_session
from tidewater.staging import modified, remove_tree
from tidewater.table.backoff import tries
from tidewater.table.catalog import load_catalog, load_table
from tidewater.table.summary import committed_state
from tidewater.table.targets import target_spec, target_tables
from tidewater.write.parquet import TARGET_FILE_SIZE, TARGET_FILE_SIZE_DEFAULT

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

log = logging.getLogger(__name__)


ACTIONS = MAINTENANCE_ACTIONS


@dataclass(frozen=True)
class TableStats:
    snapshots: int
    data_files: int
    data_bytes: int
    records: int
    manifests: int
    delete_files: int = 0
    position_deletes: int = 0

    @classmethod
    def of(cls, table: Table) -> TableStats:
        snap = table.current_snapshot()
        if snap is None:
            return cls(len(table.metadata.snapshots), 0, 0, 0, 0)
        summary = dict(snap.summary.additional_properties) if snap.summary else {}
        return cls(
            snapshots=len(table.metadata.snapshots),
            data_files=int(summary.get("total-data-files", 0)),
            data_bytes=int(summary.get("total-files-size", 0)),
            records=int(summary.get("total-records", 0)),
            manifests=len(snap.manifests(table.io)),
            delete_files=int(summary.get("total-delete-files", 0)),
            position_deletes=int(summary.get("total-position-deletes", 0)),
        )


@dataclass(frozen=True)
class ActionReport:
    table: str
    action: str
    dry_run: bool
    before: TableStats
    after: TableStats
    details: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    def text(self) -> str:
        b, a = self.before, self.after
        head = f"{self.action} on {self.table}{' (dry run)' if self.dry_run else ''}:"
        change = (
            f"data files {b.data_files} -> {a.data_files}, bytes {b.data_bytes:,} -> {a.data_bytes:,}, "
            f"manifests {b.manifests} -> {a.manifests}, snapshots {b.snapshots} -> {a.snapshots}, "
            f"records {b.records:,} -> {a.records:,}"
            + (f", delete files {b.delete_files} -> {a.delete_files}" if b.delete_files or a.delete_files else "")
        )
        details = ", ".join(f"{k}={v}" for k, v in self.details.items() if k != "files")
        return f"{head} {change}; {details} ({self.seconds:.1f} s)"

    def metadata(self) -> dict[str, Any]:
        """What the Airflow asset event carries (no file lists)."""
        d = asdict(self)
        d["details"] = {k: v for k, v in self.details.items() if k != "files"}
        return d


def _ts_literal(epoch_ms: int) -> str:
    t = datetime.fromtimestamp(epoch_ms / 1000, tz=timezone.utc)
    return "TIMESTAMP '" + t.strftime("%Y-%m-%d %H:%M:%S.") + f"{t.microsecond // 1000:03d}'"


def _sql_str(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _one_row(spark: Any, sql: str) -> dict[str, Any]:
    log.info("%s", sql)
    rows = spark.sql(sql).collect()
    return rows[0].asDict() if rows else {}


# ---- actions ---------------------------------------------------------------------------------------


def rewrite_data_files(spark: Any, spec: PipelineSpec, table: Table, dry_run: bool) -> dict[str, Any]:
    c = spec.maintenance.rewrite_data_files
    strategy = c.strategy
    if strategy == "auto":
        strategy = "binpack" if table.sort_order().is_unsorted else "sort"
    target = c.target_file_size_bytes or int(table.properties.get(TARGET_FILE_SIZE, TARGET_FILE_SIZE_DEFAULT))
    options = {
        "target-file-size-bytes": str(target),
        "min-input-files": str(c.min_input_files),
        "partial-progress.enabled": str(c.partial_progress).lower(),
        "partial-progress.max-commits": str(c.partial_progress_max_commits),
        "delete-ratio-threshold": str(c.delete_ratio_threshold),
        "delete-file-threshold": str(c.delete_file_threshold),
    }
    if dry_run:
        small = [f for f in _live_files(table) if f["size"] < 0.75 * target]
        return {
            "strategy": strategy,
            "target_file_size_bytes": target,
            "candidate_files": len(small) if len(small) >= c.min_input_files else 0,
        }
    args = [f"table => {_sql_str(spec.table.identifier)}", f"strategy => {_sql_str('sort' if strategy == 'zorder' else strategy)}"]
    if strategy == "zorder":
        args.append(f"sort_order => {_sql_str('zorder(' + ','.join(c.zorder_columns) + ')')}")
    opts = ", ".join(f"{_sql_str(k)}, {_sql_str(v)}" for k, v in options.items())
    args.append(f"options => map({opts})")
    known = {s.snapshot_id for s in table.metadata.snapshots}
    surely = _surely_rewritten(table, target, c.min_input_files)
    row = _one_row(spark, f"CALL {spec.catalog.name}.system.rewrite_data_files({', '.join(args)})")
    _check_rewrite_committed(spec, table, known, surely, row)
    return {"strategy": strategy, "target_file_size_bytes": target, **row}


def _surely_rewritten(table: Table, target: int, min_input_files: int) -> int:
    """Files Iceberg's planner rewrites whatever else it decides: in each partition, the files under its
    minimum size (75% of the target) when there are at least ``min-input-files`` of them."""
    if table.current_snapshot() is None:
        return 0
    files = table.inspect.files().select(["content", "spec_id", "partition", "file_size_in_bytes"]).to_pylist()
    groups: dict[str, int] = {}
    for f in files:
        if f["content"] == 0 and f["file_size_in_bytes"] < 0.75 * target:  # data files (not delete files)
            key = repr((f["spec_id"], sorted((f["partition"] or {}).items())))
            groups[key] = groups.get(key, 0) + 1
    return sum(n for n in groups.values() if n >= min_input_files)


def _check_rewrite_committed(spec: PipelineSpec, table: Table, known: set[int], surely: int, row: dict[str, Any]) -> None:
    """With partial progress, Iceberg logs a file group whose commit failed ("... partial progress enabled.
    Ignoring") and returns as if the group had not been planned. Compare what the table's new replace
    snapshots removed with the files that had to be rewritten: a compaction that did not land must fail
    (transient: a busy or locked catalog, or a concurrent change), never look done."""
    for attempt in tries(TransientError, attempts=10, wait=0.5, grows=False):  # the check reads the catalog too:
        with attempt:  # a commit of an ingest may hold it for a moment
            loaded = load_table(load_catalog(spec), spec.table.identifier)
    if loaded is None:
        raise TerminalError(f"{spec.table.identifier} was dropped during its compaction", table=spec.table.identifier)
    table = loaded
    landed = sum(
        int(s.summary.get("deleted-data-files", 0) or 0)
        for s in table.metadata.snapshots
        if s.snapshot_id not in known and s.summary is not None and s.summary.operation.value == "replace"
    )
    expected = max(surely, int(row.get("rewritten_data_files_count") or 0))
    failed = int(row.get("failed_data_files_count") or 0) + max(0, expected - landed)
    if failed:
        raise TransientError(
            f"rewrite_data_files: {failed} data file(s) were not compacted because their file groups failed to commit "
            f"(a busy or locked catalog, or a concurrent change); {landed} file(s) were compacted. Retrying compacts "
            "the rest",
            table=spec.table.identifier,
        )


def _live_files(table: Table) -> list[dict[str, Any]]:
    if table.current_snapshot() is None:
        return []
    files = table.inspect.files().select(["content", "file_path", "file_size_in_bytes"]).to_pylist()
    return [{"path": f["file_path"], "size": f["file_size_in_bytes"]} for f in files if f["content"] == 0]


def rewrite_position_delete_files(spark: Any, spec: PipelineSpec, table: Any, dry_run: bool) -> dict[str, Any]:
    """Merge small position delete files and drop the ones whose data files were rewritten (change tables)."""
    deletes = TableStats.of(table).delete_files
    if dry_run or not deletes:
        return {"delete_files": deletes}
    return _one_row(
        spark,
        f"CALL {spec.catalog.name}.system.rewrite_position_delete_files(table => "
        f"{_sql_str(spec.table.identifier)}, options => map('rewrite-all', 'true'))",
    )


def rewrite_manifests(spark: Any, spec: PipelineSpec, table: Table, dry_run: bool) -> dict[str, Any]:
    if dry_run:
        snap = table.current_snapshot()
        return {"manifests": len(snap.manifests(table.io)) if snap else 0}
    return _one_row(spark, f"CALL {spec.catalog.name}.system.rewrite_manifests(table => {_sql_str(spec.table.identifier)})")


def expiry_cutoff_ms(spec: PipelineSpec, table: Table, now_ms: int | None = None) -> tuple[int, bool]:
    """Snapshots strictly older than the returned time may be expired; True if offsets moved the cutoff."""
    now_ms = now_ms if now_ms is not None else int(time.time() * 1000)
    cutoff = now_ms - int(spec.maintenance.expire_snapshots.older_than_hours * 3600 * 1000)
    state = committed_state(table)
    if state.tidewater_snapshot_id is not None:
        kept = table.metadata.snapshot_by_id(state.tidewater_snapshot_id)  # None: expired by another tool already
        if kept is not None and kept.timestamp_ms < cutoff:
            return kept.timestamp_ms, True
    return cutoff, False


def expire_snapshots(spark: Any, spec: PipelineSpec, table: Table, dry_run: bool) -> dict[str, Any]:
    e = spec.maintenance.expire_snapshots
    cutoff, clamped = expiry_cutoff_ms(spec, table)
    snaps = sorted(table.metadata.snapshots, key=lambda s: s.timestamp_ms)
    kept_newest = {s.snapshot_id for s in snaps[-e.retain_last :]}
    candidates = [s.snapshot_id for s in snaps if s.timestamp_ms < cutoff and s.snapshot_id not in kept_newest]
    out: dict[str, Any] = {"older_than": _ts_literal(cutoff)[10:-1], "kept_for_offsets": clamped}
    if dry_run:
        return {**out, "snapshots_to_expire": len(candidates)}

    catalog = load_catalog(spec)
    ledger.sync(catalog, spec)  # the batches' ranges outlive their snapshots (raises: nothing expired)
    ledger.expire_history(catalog, spec)
    row = _one_row(
        spark,
        f"CALL {spec.catalog.name}.system.expire_snapshots(table => {_sql_str(spec.table.identifier)}, "
        f"older_than => {_ts_literal(cutoff)}, retain_last => {e.retain_last})",
    )
    return {**out, **row}


def _batch_dirs(spec: PipelineSpec) -> list[tuple[Any, float]]:
    """Staging directories of the pipeline's batches (local or on object storage) with their last change
    (their newest file, or the directory itself)."""
    root = spec.staging_dir() / spec.name
    if not root.is_dir():
        return []
    return [(d, modified(d)) for d in root.iterdir() if d.is_dir()]


def in_flight_files(spec: PipelineSpec, cutoff_s: float) -> set[str]:
    """Data files named by the manifests of batches staged after the cutoff: such a batch may still be
    committed. Batches staged before it are past their longest possible life (abandoned)."""
    out: set[str] = set()
    for d, changed in _batch_dirs(spec):
        manifest = d / MANIFEST_NAME
        if changed < cutoff_s or not manifest.is_file():
            continue
        try:
            m = BatchManifest.from_json(read_json(manifest))
        except Exception as e:  # noqa: BLE001 - an unreadable manifest: keep going, its files stay protected by age
            log.warning("cannot read %s: %s", manifest, e)
            continue
        out.update(f.file_path for f in m.data_files)
        out.update(f.file_path for o in m.outputs for f in o.data_files)
    return out


def _normalise(path: str) -> str:
    return path.replace("file:///", "/").replace("file:/", "/")


def _under(path: str, location: str) -> bool:
    a, b = _normalise(path).rstrip("/") + "/", _normalise(location).rstrip("/") + "/"
    return a.startswith(b)


def tables_sharing_location(catalog: Catalog, table: Table) -> list[str]:
    """Other tables of the catalog whose location is the table's, inside it or around it: their files
    would look like orphans of this table."""
    own = ".".join(table.name())
    location = table.location()
    out = []
    for ns in catalog.list_namespaces():
        for ident in catalog.list_tables(ns):
            name = ".".join(ident)
            if name == own:
                continue
            other = catalog.load_table(ident).location()
            if _under(other, location) or _under(location, other):
                out.append(name)
    return out


def remove_orphan_files(spark: Any, spec: PipelineSpec, table: Table, dry_run: bool) -> dict[str, Any]:
    """Delete files under the table's location that no snapshot references and that are older than the
    safety margin, except files of staged batches that may still commit. Refuses (deletes nothing) when
    another table of the catalog shares the location: its files are not this table's to judge."""
    sharing = tables_sharing_location(load_catalog(spec), table)
    if sharing:
        log.warning(
            "remove_orphan_files: %s shares its location %s with %s; nothing removed",
            ".".join(table.name()),
            table.location(),
            ", ".join(sharing),
        )
        return {
            "skipped": f"location shared with {', '.join(sharing)}",
            "orphan_files": 0,
            "orphan_bytes": 0,
            "kept_in_flight": 0,
            "staging_dirs_removed": 0,
            "files": [],
        }
    hours = spec.maintenance.remove_orphan_files.older_than_hours
    cutoff = int(time.time() * 1000) - int(hours * 3600 * 1000)
    sql = (
        f"CALL {spec.catalog.name}.system.remove_orphan_files(table => {_sql_str(spec.table.identifier)}, "
        f"older_than => {_ts_literal(cutoff)}, dry_run => true)"
    )
    log.info("%s", sql)
    candidates = [r[0] for r in spark.sql(sql).collect()]
    protected = {_normalise(p) for p in in_flight_files(spec, cutoff / 1000)}
    orphans = [p for p in candidates if _normalise(p) not in protected]
    kept = len(candidates) - len(orphans)
    removed_bytes = 0
    if not dry_run:
        for p in orphans:
            local = Path(_normalise(p))
            if local.is_file():
                removed_bytes += local.stat().st_size
            table.io.delete(p)
    stale = remove_stale_staging(spec, cutoff / 1000, dry_run)
    return {
        "older_than": _ts_literal(cutoff)[10:-1],
        "orphan_files": len(orphans),
        "orphan_bytes": removed_bytes,
        "kept_in_flight": kept,
        "staging_dirs_removed": stale,
        "files": orphans,
    }


def remove_stale_staging(spec: PipelineSpec, cutoff_s: float, dry_run: bool = False) -> int:
    """Remove the staging directories of batches last changed before the cutoff (past any retry, committed or
    abandoned), local or on object storage; returns how many there were."""
    stale = [d for d, changed in _batch_dirs(spec) if changed < cutoff_s]
    if not dry_run:
        for d in stale:
            remove_tree(d)
    return len(stale)


_RUNNERS = {
    "rewrite_data_files": rewrite_data_files,
    "rewrite_position_delete_files": rewrite_position_delete_files,
    "rewrite_manifests": rewrite_manifests,
    "expire_snapshots": expire_snapshots,
    "remove_orphan_files": remove_orphan_files,
}


def run_action(spark: Any, spec: PipelineSpec, action: str, dry_run: bool = False) -> ActionReport:
    if action not in _RUNNERS:
        raise ConfigError(f"maintenance action {action!r} is not one of {', '.join(ACTIONS)}")
    catalog = load_catalog(spec)
    table = load_table(catalog, spec.table.identifier)
    if table is None:
        raise TerminalError("the table does not exist yet (nothing to maintain)", table=spec.table.identifier)
    before = TableStats.of(table)
    started = time.monotonic()
    try:
        details = _RUNNERS[action](spark, spec, table, dry_run)
    finally:
        spark_session.release_catalog(spark, spec)
    table = catalog.load_table(spec.table.identifier)
    report = ActionReport(spec.table.identifier, action, dry_run, before, TableStats.of(table), details, time.monotonic() - started)
    log.debug("%s", report.text())  # callers show it: the CLI prints it, the Airflow task logs it
    return report


def maintain(
    spec: PipelineSpec,
    actions: list[str] | None = None,
    dry_run: bool = False,
    spark: Any = None,
    master: str | None = None,
    table: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[ActionReport]:
    """Run the enabled actions (or ``actions``) in order on each target table in turn (or on ``table``).
    ``progress``: told of each action as it starts and ends (``[2/8] rewrite_manifests on rpc.orders``), for long
    work on many tables (the command line prints it on stderr)."""
    todo = actions or spec.maintenance.enabled_actions(spec.applies_changes)
    own = spark is None
    views = [target_spec(spec, t) for t in ([table] if table else target_tables(load_catalog(spec), spec))]
    steps = [(v, a) for v in views for a in todo]
    if own:
        spark = spark_session.session(spec, app_name=f"tidewater-maintain-{spec.name}", master=master)
    try:
        reports = []
        for i, (view, action) in enumerate(steps, start=1):
            started = time.monotonic()
            if progress:
                progress(f"[{i}/{len(steps)}] {action} on {view.table.identifier} ...")
            reports.append(run_action(spark, view, action, dry_run))
            if progress:
                progress(f"[{i}/{len(steps)}] {action} on {view.table.identifier}: done in {time.monotonic() - started:.1f} s")
        return reports
    finally:
        if own:
            spark.stop()


def reports_json(reports: list[ActionReport]) -> str:
    return json.dumps([r.metadata() for r in reports], indent=2, default=str)
