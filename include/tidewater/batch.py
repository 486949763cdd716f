"""The small, versioned, frozen records that the pipeline's steps exchange.

``BatchPlan``: what to read (made by the planner, before Spark starts; Spark never decides offsets).
``BatchManifest``: what was written (made by the Spark job; read by validation and the committer).
Both are JSON documents in the staging area (a local directory or object storage: ``tidewater.staging``);
XCom carries only their locations and a summary.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import date, datetime, timezone
from decimal import Decimal
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from pyiceberg.typedef import TableVersion

from tidewater.errors import TerminalError
from tidewater.staging import read_json as read
from tidewater.staging import write_json

PLAN_VERSION = 1


MANIFEST_VERSION = 2
# Version 1 (staged by Tidewater 0.1 before the one-commit redesign; still read, so batches in flight during an
# upgrade commit): a plain batch's files at the top and no outputs; per-table outputs for routed batches only.
READABLE_MANIFESTS = (1, 2)


TopicPartition = tuple[str, int]


Offsets = dict[str, dict[int, int]]  # topic -> partition -> next offset to read


@dataclass(frozen=True, order=True)
class PartitionRange:
    """Records [start, end) of one topic-partition. ``end`` is exclusive."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start

    def split(self, max_records: int) -> list[PartitionRange]:
        """Contiguous sub-ranges of at most ``max_records`` offsets each."""
        return [
            PartitionRange(self.topic, self.partition, s, min(s + max_records, self.end)) for s in range(self.start, self.end, max_records)
        ]


class Mode(StrEnum):
    """What a batch is: whether it moves the committed offsets, how its batch id starts, and what each target table
    does with it (``for_table``). Replays and backfills re-read committed ranges (``plan/replay.py``)."""

    INGEST = "ingest"  # the next offsets (a scheduled or triggered batch)
    SKIP = "skip"  # an operator's skip: the range becomes dead letters and the offsets move past it (ops/skip.py)
    REPLACE = "replace"  # a replay: the range's rows deleted, the re-read ones appended
    APPEND_MISSING = "append-missing"  # a replay: only offsets the table does not hold are appended
    REAPPLY = "reapply"  # a replay of changes: each applied again where it is still its key's latest
    RETRY = "retry"  # a dead-letter retry (ops/dead_letters.py)

    @property
    def moves_offsets(self) -> bool:
        """Its commit advances the holder's offsets (the others keep them: their ranges are committed already)."""
        return self in (Mode.INGEST, Mode.SKIP)

    @property
    def prefix(self) -> str:
        """How its batch ids start (an ingest batch's id is the bare time-ordered id: see ``is_ingest_batch``)."""
        return _PREFIXES[self]

    def new_batch_id(self) -> str:
        return self.prefix + new_batch_id()

    def for_table(self, applies_changes: bool) -> Mode:
        """The mode a target table commits the batch in: a replay's change table is always reapplied, its append table
        gets the replay's mode (``replace`` for a replay that reapplies); other modes are every table's."""
        if self not in (Mode.REPLACE, Mode.APPEND_MISSING, Mode.REAPPLY):
            return self
        if applies_changes:
            return Mode.REAPPLY
        return Mode.REPLACE if self is Mode.REAPPLY else self


_PREFIXES = {
    Mode.INGEST: "",
    Mode.SKIP: "skip-",
    Mode.REPLACE: "replay-",
    Mode.APPEND_MISSING: "replay-",
    Mode.REAPPLY: "replay-",
    Mode.RETRY: "retry-",
}
BACKFILL_PREFIX = "backfill-"  # a backfill's batch id: a replay planned from an Airflow run's data interval


def is_ingest_batch(batch_id: str) -> bool:
    """An ingest batch's id (no mode's prefix, no backfill's): the ids the plan step orders to find abandoned ones."""
    return not batch_id.startswith(tuple({m.prefix for m in Mode if m.prefix} | {BACKFILL_PREFIX}))


@dataclass(frozen=True)
class BatchPlan:
    batch_id: str
    pipeline: str
    table: str
    pipeline_path: str
    ranges: tuple[PartitionRange, ...]
    base_offsets: Offsets  # committed offsets of every known partition when the plan was made
    created_at: str
    base_snapshot_id: int | None = None
    mode: Mode = Mode.INGEST
    data_interval: tuple[str, str] | None = None  # the Airflow run's data interval (ISO), recorded at commit
    tables: tuple[str, ...] = ()  # routed replays: only these target tables (empty: every table records route to)
    retry_of: tuple[str, ...] = ()  # dead-letter retries (mode retry): the batches that dead-lettered the records
    version: int = PLAN_VERSION

    @classmethod
    def new(
        cls,
        spec: Any,
        ranges: Any,
        offsets: Offsets | None,
        snapshot_id: int | None,
        mode: Mode = Mode.INGEST,
        batch_id: str | None = None,
        **more: Any,
    ) -> BatchPlan:
        """A new batch of ``spec``'s pipeline (a ``PipelineSpec``) over ``ranges``: its id minted for ``mode`` (unless
        given), planned now from the offsets holder's committed ``offsets`` at ``snapshot_id``; ``more``: the other
        fields of its mode (data_interval, tables, retry_of)."""
        return cls(
            batch_id=batch_id or Mode(mode).new_batch_id(),
            pipeline=spec.name,
            table=spec.checkpoint_table(),
            pipeline_path=str(spec.source_path),
            ranges=tuple(ranges),
            base_offsets=offsets or {},
            created_at=utc_now_iso(),
            base_snapshot_id=snapshot_id,
            mode=mode,
            **more,
        )

    def __post_init__(self) -> None:
        try:  # a plan read from JSON, or built with the mode's name
            object.__setattr__(self, "mode", Mode(self.mode))
        except ValueError:
            raise TerminalError(
                f"batch plan {self.batch_id}: unknown mode {self.mode!r} (one of {', '.join(m.value for m in Mode)})"
            ) from None

    @property
    def is_empty(self) -> bool:
        return not any(r.size for r in self.ranges)

    @property
    def record_span(self) -> int:
        """Offsets covered (an upper bound on records: compaction and transaction markers leave gaps)."""
        return sum(r.size for r in self.ranges)

    def end_offsets(self) -> Offsets:
        """The cumulative offsets the table will hold once this batch is committed."""
        return merge_offsets(self.base_offsets, self.ranges)

    def seen_offsets(self) -> dict[str, dict[str, tuple[int | None, ...]]]:
        """The offsets holder's committed offset each planned partition started from (a ``TableOutput``'s
        ``seen_offsets`` for a table that is its own holder)."""
        seen: dict[str, dict[str, tuple[int | None, ...]]] = {}
        for r in self.ranges:
            seen.setdefault(r.topic, {})[str(r.partition)] = (self.base_offsets.get(r.topic, {}).get(r.partition),)
        return seen

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["ranges"] = [asdict(r) for r in self.ranges]
        d["base_offsets"] = offsets_to_json(self.base_offsets)
        d["mode"] = self.mode.value
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> BatchPlan:
        if d.get("version") != PLAN_VERSION:
            raise TerminalError(f"batch plan version {d.get('version')!r} is not supported (expected {PLAN_VERSION})")
        return cls(
            batch_id=d["batch_id"],
            pipeline=d["pipeline"],
            table=d["table"],
            pipeline_path=d["pipeline_path"],
            ranges=tuple(PartitionRange(**r) for r in d["ranges"]),
            base_offsets=offsets_from_json(d["base_offsets"]),
            created_at=d["created_at"],
            base_snapshot_id=d.get("base_snapshot_id"),
            mode=d.get("mode", "ingest"),
            data_interval=tuple(d["data_interval"]) if d.get("data_interval") else None,
            tables=tuple(d.get("tables") or ()),
            retry_of=tuple(d.get("retry_of") or ()),
            version=d["version"],
        )


@dataclass(frozen=True)
class PartitionStats:
    """What one sub-range read produced."""

    topic: str
    partition: int
    start: int
    end: int
    records: int
    first_offset: int | None
    last_offset: int | None
    min_timestamp_ms: int | None
    max_timestamp_ms: int | None
    dead_letters: int = 0  # records written to the dead-letter table
    skipped: int = 0  # records dropped by the `skip` policy (and unmatched records of routed pipelines)
    routed: int | None = None  # routed pipelines: records that went to at least one table
    present: int = 0  # append-missing replays: records whose offsets the table already holds


FileContent = Literal["data", "deletes"]
_METRICS = ("column_sizes", "value_counts", "null_value_counts", "nan_value_counts", "lower_bounds", "upper_bounds", "split_offsets")


@dataclass(frozen=True)
class StagedFile:
    """A Parquet file the write step left for the commit: which table content it holds and its metrics.

    ``content`` says what committing it means: ``data`` files are appended; ``deletes`` (position delete
    files) make a commit a row delta, which the commit step does not write yet and refuses by name.
    ``metrics`` are Iceberg's column statistics in JSON form (field ids as strings, bounds base64).
    """

    file_path: str
    record_count: int
    file_size_in_bytes: int
    spec_id: int
    content: FileContent = "data"
    partition: tuple[Any, ...] = ()  # encoded partition values (see encode_values)
    metrics: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            **self.metrics,
            "file_path": self.file_path,
            "file_format": "PARQUET",
            "record_count": self.record_count,
            "file_size_in_bytes": self.file_size_in_bytes,
            "spec_id": self.spec_id,
            "content": self.content,
            "partition": list(self.partition),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> StagedFile:
        content = d.get("content", "data")
        if content not in ("data", "deletes"):
            raise TerminalError(f"staged file {d.get('file_path')}: unknown content {content!r}")
        return cls(
            file_path=d["file_path"],
            record_count=int(d["record_count"]),
            file_size_in_bytes=int(d["file_size_in_bytes"]),
            spec_id=int(d["spec_id"]),
            content=content,
            partition=tuple(d.get("partition") or ()),
            metrics={k: d[k] for k in _METRICS if k in d},
        )

    def to_data_file(self, format_version: TableVersion) -> Any:
        """The pyiceberg ``DataFile`` a commit adds to a manifest: the staged form's other side
        (``staged_data_file``). pyiceberg is imported here, not at the top: the spark-submit driver reads these
        documents and starts without it (``tests/unit/test_architecture.py``)."""
        from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
        from pyiceberg.typedef import Record

        if self.content != "data":
            raise TerminalError(
                f"staged file {self.file_path} holds {self.content}: a write step stages data files only "
                "(a change table's position deletes are written by its commit step)",
                table=None,
            )
        m = self.metrics

        def ints(x: dict[str, Any]) -> dict[int, int]:
            return {int(k): int(v) for k, v in x.items()}

        def raw(x: dict[str, str]) -> dict[int, bytes]:
            return {int(k): base64.b64decode(v) for k, v in x.items()}

        return DataFile.from_args(
            _table_format_version=format_version,
            content=DataFileContent.DATA,
            file_path=self.file_path,
            file_format=FileFormat.PARQUET,
            partition=Record(*decode_values(list(self.partition))),
            record_count=self.record_count,
            file_size_in_bytes=self.file_size_in_bytes,
            column_sizes=ints(m["column_sizes"]),
            value_counts=ints(m["value_counts"]),
            null_value_counts=ints(m["null_value_counts"]),
            nan_value_counts=ints(m["nan_value_counts"]),
            lower_bounds=raw(m["lower_bounds"]),
            upper_bounds=raw(m["upper_bounds"]),
            split_offsets=m["split_offsets"] or None,
            sort_order_id=None,
            spec_id=self.spec_id,
            equality_ids=None,
            key_metadata=None,
        )


def staged_data_file(path: str, size: int, spec_id: int, stats: dict[str, Any], partition: Any) -> dict[str, Any]:
    """A data file the write step finished, in its staged form (``StagedFile.from_json`` reads it): pyiceberg's
    serialized statistics with field ids as strings and bounds base64, and the partition values encoded."""

    def ints(d: dict[Any, Any]) -> dict[str, int]:
        return {str(k): int(v) for k, v in d.items()}

    def text(d: dict[int, bytes]) -> dict[str, str]:
        return {str(k): base64.b64encode(v).decode() for k, v in d.items()}

    return {
        "file_path": path,
        "file_format": "PARQUET",
        "file_size_in_bytes": int(size),
        "spec_id": int(spec_id),
        "record_count": int(stats["record_count"]),
        "column_sizes": ints(stats["column_sizes"]),
        "value_counts": ints(stats["value_counts"]),
        "null_value_counts": ints(stats["null_value_counts"]),
        "nan_value_counts": ints(stats["nan_value_counts"]),
        "lower_bounds": text(stats["lower_bounds"]),
        "upper_bounds": text(stats["upper_bounds"]),
        "split_offsets": [int(x) for x in (stats["split_offsets"] or [])],
        "partition": encode_values(list(partition or ())),
    }


def encode_values(values: list[Any]) -> list[Any]:
    """Partition values as JSON can hold them (bytes, decimals, UUIDs and dates tagged); ``decode_values`` reverses."""
    out: list[Any] = []
    for v in values:
        if isinstance(v, bytes):
            out.append({"b64": base64.b64encode(v).decode()})
        elif isinstance(v, Decimal):
            out.append({"decimal": str(v)})
        elif isinstance(v, uuid.UUID):
            out.append({"uuid": str(v)})
        elif isinstance(v, date):
            out.append({"date": v.isoformat()})
        else:
            out.append(v)
    return out


def decode_values(values: list[Any]) -> list[Any]:
    """The partition values ``encode_values`` encoded."""
    out: list[Any] = []
    for v in values:
        if isinstance(v, dict):
            if "b64" in v:
                v = base64.b64decode(v["b64"])
            elif "decimal" in v:
                v = Decimal(v["decimal"])
            elif "uuid" in v:
                v = uuid.UUID(v["uuid"])
            elif "date" in v:
                v = date.fromisoformat(v["date"])
        out.append(v)
    return out


@dataclass(frozen=True)
class TableOutput:
    """What the write step left for one target table of a batch (every batch has one per table it wrote; a plain
    batch's one table is its own offsets holder)."""

    table: str
    data_files: tuple[StagedFile, ...]
    rows: int  # rows the writer counted into the files
    already_committed: int  # records the table already held (below its own committed offset), dropped
    seen_offsets: Mapping[str, Mapping[str, tuple[int | None, ...]]]  # topic -> partition -> committed offsets seen
    ignored_fields: tuple[str, ...] = ()
    branch: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "data_files": [f.to_json() for f in self.data_files],
            "rows": self.rows,
            "already_committed": self.already_committed,
            "seen_offsets": {t: {p: list(s) for p, s in ps.items()} for t, ps in self.seen_offsets.items()},
            "ignored_fields": list(self.ignored_fields),
            "branch": self.branch,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> TableOutput:
        return cls(
            table=d["table"],
            data_files=tuple(StagedFile.from_json(f) for f in d["data_files"]),
            rows=int(d["rows"]),
            already_committed=int(d["already_committed"]),
            seen_offsets={t: {p: tuple(s) for p, s in ps.items()} for t, ps in d["seen_offsets"].items()},
            ignored_fields=tuple(d.get("ignored_fields", ())),
            branch=d.get("branch"),
        )


@dataclass(frozen=True)
class BatchManifest:
    batch_id: str
    table: str
    data_files: tuple[StagedFile, ...]
    partitions: tuple[PartitionStats, ...]
    schema_id: int
    written_at: str
    task_timings: tuple[dict[str, Any], ...] = ()  # per Spark task: started_at, finished_at (epoch s), records
    dead_letter_table: str | None = None
    dead_letter_files: tuple[StagedFile, ...] = ()
    ignored_fields: tuple[str, ...] = ()  # record fields left out because table.evolve_schema is off
    # One output per target table. ``data_files`` are the files of ``table``'s own output: a plain batch's
    # (its table holds its offsets); a routed batch's ``table`` is its checkpoint table, which gets no files.
    outputs: tuple[TableOutput, ...] = ()
    # The Spark driver's milestones (epoch seconds): driver_started, session_ready, job_submitted, job_done,
    # manifest_built; with the task timings they break a batch's write step down (``make bench``).
    driver_timings: dict[str, float] = field(default_factory=dict)
    version: int = MANIFEST_VERSION

    @property
    def records(self) -> int:
        """Records read."""
        return sum(p.records for p in self.partitions)

    @property
    def dead_letters(self) -> int:
        return sum(p.dead_letters for p in self.partitions)

    @property
    def skipped(self) -> int:
        return sum(p.skipped for p in self.partitions)

    @property
    def present(self) -> int:
        return sum(p.present for p in self.partitions)

    @property
    def rows_expected(self) -> int:
        """Rows the data files must hold: records read minus dead letters, skipped records and (append-missing
        replays) records the table already holds."""
        return self.records - self.dead_letters - self.skipped - self.present

    @property
    def dead_letters_in_files(self) -> int:
        return sum(f.record_count for f in self.dead_letter_files)

    @property
    def rows_in_files(self) -> int:
        return sum(f.record_count for f in self.data_files)

    @property
    def routed(self) -> int | None:
        """Routed pipelines: records that went to at least one table (None otherwise)."""
        counts = [p.routed for p in self.partitions]
        return None if not counts or any(c is None for c in counts) else sum(c for c in counts if c is not None)

    def data_path_seconds(self) -> float | None:
        """Wall time from the first task's start (first read) to the last task's end (last file written)."""
        if not self.task_timings:
            return None
        return max(t["finished_at"] for t in self.task_timings) - min(t["started_at"] for t in self.task_timings)

    def next_offsets(self) -> Offsets:
        """Per topic-partition the end of the highest sub-range read."""
        out: Offsets = {}
        for p in self.partitions:
            cur = out.setdefault(p.topic, {}).get(p.partition)
            out[p.topic][p.partition] = p.end if cur is None else max(cur, p.end)
        return out

    def valid_through_ms(self) -> int | None:
        """Minimum over partitions of the maximum record timestamp (partitions with records only)."""
        per_tp: dict[TopicPartition, int] = {}
        for p in self.partitions:
            if p.max_timestamp_ms is None:
                continue
            key = (p.topic, p.partition)
            per_tp[key] = max(per_tp.get(key, p.max_timestamp_ms), p.max_timestamp_ms)
        return min(per_tp.values()) if per_tp else None

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["partitions"] = [asdict(p) for p in self.partitions]
        # the files are listed once, in their table's output (``from_json`` puts the holder's back at the top)
        d["data_files"] = [] if self.own_output() is not None else [f.to_json() for f in self.data_files]
        d["task_timings"] = list(self.task_timings)
        d["dead_letter_files"] = [f.to_json() for f in self.dead_letter_files]
        d["ignored_fields"] = list(self.ignored_fields)
        d["outputs"] = [o.to_json() for o in self.outputs]
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> BatchManifest:
        if d.get("version") not in READABLE_MANIFESTS:
            raise TerminalError(
                f"batch manifest version {d.get('version')!r} is not supported (this version reads "
                f"{', '.join(map(str, READABLE_MANIFESTS))})"
            )
        outputs = tuple(TableOutput.from_json(o) for o in d.get("outputs", ()))
        own = next((o for o in outputs if o.table == d["table"]), None)
        return cls(
            batch_id=d["batch_id"],
            table=d["table"],
            data_files=own.data_files if own is not None else tuple(StagedFile.from_json(f) for f in d["data_files"]),
            partitions=tuple(PartitionStats(**p) for p in d["partitions"]),
            schema_id=d["schema_id"],
            written_at=d["written_at"],
            task_timings=tuple(d.get("task_timings", ())),
            dead_letter_table=d.get("dead_letter_table"),
            dead_letter_files=tuple(StagedFile.from_json(f) for f in d.get("dead_letter_files", ())),
            ignored_fields=tuple(d.get("ignored_fields", ())),
            outputs=outputs,
            driver_timings=dict(d.get("driver_timings", {})),
            version=d["version"],
        )

    def own_output(self) -> TableOutput | None:
        """The output of the manifest's own table (a plain batch's; a version-1 manifest has none)."""
        return next((o for o in self.outputs if o.table == self.table), None)


def fused_output(
    plan: BatchPlan, files: tuple[StagedFile, ...], rows: int, present: int, ignored: tuple[str, ...], branch: str | None
) -> TableOutput:
    """The one output of a plain batch: its table holds its own offsets, so its files were written against the
    offsets the plan started from."""
    return TableOutput(plan.table, tuple(files), rows, present, plan.seen_offsets(), tuple(ignored), branch)


def merge_offsets(base: Offsets, ranges: list[PartitionRange] | tuple[PartitionRange, ...]) -> Offsets:
    """``base`` advanced to the end of each range (cumulative offsets after a batch). Routed tables keep
    their own offsets where they are ahead instead (``commit/batch.py``, ``advanced``)."""
    out: Offsets = {t: dict(ps) for t, ps in base.items()}
    for r in ranges:
        out.setdefault(r.topic, {})[r.partition] = r.end
    return out


def offsets_to_json(offsets: Offsets) -> dict[str, dict[str, int]]:
    return {t: {str(p): int(o) for p, o in sorted(ps.items())} for t, ps in sorted(offsets.items())}


def offsets_from_json(d: dict[str, dict[str, Any]]) -> Offsets:
    return {t: {int(p): int(o) for p, o in ps.items()} for t, ps in d.items()}


def new_batch_id(now: datetime | None = None) -> str:
    """``<UTC time to the millisecond>Z-<random>``: ids sort in the order batches were planned (the plan step
    finds abandoned batches as those after the newest committed one), also for batches a second apart or
    less, which whole-second ids ordered by their random part."""
    now = now or datetime.now(timezone.utc)
    return f"{now.strftime('%Y%m%dT%H%M%S')}{now.microsecond // 1000:03d}Z-{uuid.uuid4().hex[:8]}"


def utc_now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def batch_dir(staging_dir: Any, pipeline: str, batch_id: str) -> Any:
    return staging_dir / pipeline / batch_id


def write_json_atomic(path: Any, doc: dict[str, Any]) -> None:
    """Write a JSON document so readers see either nothing or the whole file (a local path or an object:
    ``tidewater.staging`` says how on each)."""
    write_json(Path(path) if isinstance(path, str) else path, doc)


def read_json(path: Any) -> dict[str, Any]:
    """A staged JSON document (a local path as text, a Path, or an ObjectPath)."""
    return read(Path(path) if isinstance(path, str) else path)


# ---- the batch's staging directory: what each step leaves for the next -----------------------------

PLAN_NAME = "plan.json"  # the planner's BatchPlan
MANIFEST_NAME = "manifest.json"  # the write step's BatchManifest
ERROR_NAME = "error.json"  # the write step's error document, when a Spark task failed
VALIDATION_NAME = "validation.json"  # the quality gate's verdict, stamped at commit
GATE_REPORT_NAME = "gate.json"  # every check of the quality gate (for lineage: runtime/lineage.py)
REVERTED_NAME = "reverted.json"  # the batch will never commit: its schema changes were undone


def manifest_path(plan_path: Any) -> Any:
    """Where the write step leaves the manifest of the plan at ``plan_path`` (a staged location)."""
    return (Path(plan_path) if isinstance(plan_path, str) else plan_path).parent / MANIFEST_NAME
