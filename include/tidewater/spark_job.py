"""The write step as a Spark job: one Spark task per partition sub-range, files written, never committed.

The plan is made before Spark starts and passed in; Spark never decides offsets. Each task reads its
exact range with confluent-kafka inside the Python worker, decodes with Arrow, and writes Parquet data
files with the table's field ids; record data never crosses between the JVM and Python. The driver
collects what each task wrote into a batch manifest in the staging directory.

A task that fails on a record (or cannot read Kafka) deletes the files it wrote (nothing can have
landed: only the commit step makes files visible) and reports the error; the driver writes it to
``error.json`` next to the plan and exits non-zero.
"""

from __future__ import annotations

import argparse
import functools
import logging
import sys
import time
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tidewater.batch import (
    BatchManifest,
    BatchPlan,
    PartitionRange,
    PartitionStats,
    read_json,
    utc_now_iso,
    write_json_atomic,
)
from tidewater.config import PipelineSpec, load_pipeline
from tidewater.errors import TerminalError, TidewaterError

log = logging.getLogger(__name__)

MANIFEST_NAME = "manifest.json"
ERROR_NAME = "error.json"


def subranges(plan: BatchPlan, records_per_task: int) -> list[PartitionRange]:
    return [s for r in plan.ranges for s in r.split(records_per_task)]


def decode_chunk(spec: PipelineSpec, chunk: Any, explicit: Any, registry: Any = None,
                 shaper: Any = None) -> tuple[Any, list[Any], list[Any]]:
    """Decode a chunk in the pipeline's value format: (rows, bad records, records ignored by design).

    Ignored: Debezium tombstones (they follow deletes and carry no row), counted as skipped.
    ``shaper``: (NameMatcher, table schema) when shaping applies (maps, flattening, name matching).
    With ``dead_letter.policy: fail`` the first bad record raises RecordError naming it.
    """
    from tidewater.decoding import BadRecord, decode_json, decode_json_lenient, decode_raw, surviving
    from tidewater.envelopes import decode_connect, decode_debezium
    from tidewater.errors import RecordError

    fmt = spec.format.value
    fail = spec.dead_letter.policy == "fail"
    if fmt == "json" and fail:
        decoded, bad = decode_json(chunk, explicit), []
    elif fmt in ("string", "bytes"):
        decoded, bad = decode_raw(chunk, fmt)
    elif fmt == "connect_json":
        decoded, bad = decode_connect(chunk, explicit)
    elif fmt == "debezium":
        decoded, bad = decode_debezium(chunk, explicit)
    elif fmt == "avro":
        from tidewater.avro import decode_avro

        decoded, bad = decode_avro(chunk, registry)
    else:
        decoded, bad = decode_json_lenient(chunk, explicit)
    ignored: list[Any] = []
    if fmt == "debezium":
        ignored = [b for b in bad if b.error_class == "Tombstone"]
        bad = [b for b in bad if b.error_class != "Tombstone"]

    def record_failures(failed: list[tuple[int, str]], error_class: str) -> list[Any]:
        """Failures by row of the current ``decoded`` -> BadRecords by chunk index, merged into ``bad``."""
        if not failed:
            return bad
        rows = surviving(len(chunk), [b.index for b in bad + ignored])  # chunk index of each decoded row
        return sorted(bad + [BadRecord(rows[r], error_class, msg) for r, msg in failed], key=lambda b: b.index)

    if shaper is not None and fmt not in ("string", "bytes"):
        from tidewater.shaping import conform, shape

        matcher, target = shaper
        decoded, failed = conform(shape(decoded, spec.format, matcher), target)
        bad = record_failures(failed, "TypeMismatch")
    if fmt not in ("string", "bytes") and spec.format.timestamps:
        from tidewater.conversions import apply

        decoded, failed = apply(decoded, spec.format)
        bad = record_failures(failed, "ConversionError")
    if bad and fail:
        raise RecordError(f"{bad[0].error_class}: {bad[0].message}", topic=chunk.topic, partition=chunk.partition,
                          offset=chunk.offsets[bad[0].index])
    return decoded, bad, ignored


class TableSink:
    """Everything one Spark task writes to one target table: schema creation and evolution, data files,
    and (routed pipelines) the rows it leaves out because the table already committed them."""

    def __init__(self, spec: PipelineSpec, tspec: Any, catalog: Any, prefix: str, routed: bool) -> None:
        from tidewater.catalog import load_table
        from tidewater.offsets import committed_state

        self.spec, self.tspec, self.catalog, self.prefix = spec, tspec, catalog, prefix
        self.table = load_table(catalog, tspec.identifier)
        self.writer: Any = None
        self.files: list[dict[str, Any]] = []
        self.ignored_fields: set[str] = set()  # fields not added because evolve_schema is off
        self.rows = 0
        self.already = 0  # routed: rows of records this table committed before (a retried batch)
        self.seen: dict[str, dict[int, int | None]] = {}
        self._committed = committed_state(self.table, tspec.branch).offsets if routed and self.table is not None else {}

    def threshold(self, topic: str, partition: int) -> int | None:
        """Routed pipelines: records below this offset are already in the table (recorded for the commit)."""
        t = self._committed.get(topic, {}).get(partition)
        self.seen.setdefault(topic, {})[partition] = t
        return t

    def write(self, decoded: Any) -> None:
        from tidewater.catalog import ensure_table, evolution_needed, new_fields, without_new_fields
        from tidewater.writing import DataFileWriter, to_table_schema

        if not decoded.num_rows:
            return
        table = self.table
        if table is not None and not self.tspec.evolve_schema:
            extra = new_fields(table, decoded.schema)
            if extra:
                self.ignored_fields.update(extra)
                decoded = without_new_fields(table, decoded)
        if table is None or evolution_needed(table, decoded):
            before = None if table is None else table.schema().schema_id
            table = self.table = ensure_table(self.catalog, self.tspec, table, decoded)
            if self.writer is not None and table.schema().schema_id != before:
                self.files.extend(self.writer.close())  # schema changed: finish the file written with the old one
                self.writer = None
        if self.writer is None:
            self.writer = DataFileWriter(table, self.prefix + f"-s{table.schema().schema_id}")
        self.writer.write(to_table_schema(table, decoded))
        self.rows += decoded.num_rows

    def close(self) -> list[dict[str, Any]]:
        if self.writer is not None:
            self.files.extend(self.writer.close())
            self.writer = None
        return self.files

    def abort(self) -> None:
        paths = [f["file_path"] for f in self.files] + (self.writer.abort() if self.writer is not None else [])
        _delete_files(self.table, paths)

    def output(self) -> dict[str, Any]:
        return {"table": self.tspec.identifier, "data_files": self.files, "rows": self.rows, "already_committed": self.already,
                "seen_offsets": {t: {str(p): o for p, o in ps.items()} for t, ps in self.seen.items()},
                "ignored_fields": sorted(self.ignored_fields), "branch": self.tspec.branch}


def _route_chunk(spec: PipelineSpec, router: Any, sinks: dict[str, TableSink], open_sink: Any, chunk: Any,
                 decoded: Any, bad_idx: list[int]) -> tuple[list[Any], int, int]:
    """Routed pipelines: split decoded rows over the target tables and write them.

    Returns (records that become dead letters, records skipped as unmatched, records routed to at least
    one table). A record that cannot be written to one of its tables (its value does not take the
    column's type, an id column is empty, its dynamic table does not exist) is a dead letter and is
    written to none, so records read = routed + dead letters + skipped holds.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    from tidewater.decoding import BadRecord, decoded_rows, keep_mask
    from tidewater.shaping import NameMatcher, conform

    n = decoded.num_rows
    chunk_idx = decoded_rows(len(chunk), bad_idx)
    offsets = pc.take(pa.array(chunk.offsets, pa.int64()), chunk_idx)
    routed = router.route(chunk.topic, decoded)
    failed: dict[int, tuple[str, str]] = {r: ("InvalidRoute", msg) for r, msg in routed.invalid}
    pending: list[tuple[TableSink, Any, Any]] = []
    for ident, mask in routed.masks.items():
        sink = sinks.get(ident) or open_sink(ident)
        rows_of = pc.indices_nonzero(mask)
        if sink.table is None and not sink.tspec.auto_create:
            for r in rows_of.to_pylist():  # error path
                failed.setdefault(r, ("UnknownTable", f"table {ident} does not exist and auto_create is off"))
            continue
        threshold = sink.threshold(chunk.topic, chunk.partition)
        if threshold is not None:
            fresh = pc.filter(rows_of, pc.greater_equal(pc.take(offsets, rows_of), threshold))
            sink.already += len(rows_of) - len(fresh)
            rows_of = fresh
        if not len(rows_of):
            continue
        sub = decoded.take(rows_of)
        if sink.table is not None or sink.tspec.case_insensitive:
            from tidewater.catalog import table_arrow_schema

            matcher = NameMatcher(sink.table, sink.tspec.case_insensitive)
            sub, casts = conform(matcher.apply(sub), table_arrow_schema(sink.table) if sink.table is not None else None)
            if casts:  # error path
                for r, msg in casts:
                    failed.setdefault(rows_of[r].as_py(), ("TypeMismatch", f"table {ident}: {msg}"))
                rows_of = pc.filter(rows_of, keep_mask(len(rows_of), [r for r, _ in casts]))
        for column in sink.tspec.id_columns:
            empty = pc.is_null(sub.column(column)) if column in sub.column_names else pa.nulls(sub.num_rows).is_null()
            for r in pc.indices_nonzero(empty).to_pylist():  # error path
                failed.setdefault(rows_of[r].as_py(), ("MissingId", f"table {ident}: id column {column!r} is empty"))
        pending.append((sink, sub, rows_of))
    if failed:
        gone = pa.array(sorted(failed), pa.uint64())
        pending = [(sink, sub.filter(pc.invert(pc.is_in(rows, value_set=gone))), rows) for sink, sub, rows in pending]
    for sink, sub, _ in pending:
        sink.write(sub)
    bad = [BadRecord(chunk_idx[r].as_py(), cls, msg) for r, (cls, msg) in sorted(failed.items())]
    unmatched_rows = pc.indices_nonzero(pc.and_(routed.unmatched, keep_mask(n, list(failed))))
    skipped = 0
    if len(unmatched_rows):
        if spec.routing.unmatched == "skip":
            skipped = len(unmatched_rows)
        else:
            field = spec.routing.field
            msg = f"no table takes this record (route field {field!r})" if field else f"no table takes records of topic {chunk.topic}"
            bad.extend(BadRecord(chunk_idx[r].as_py(), "Unrouted", msg) for r in unmatched_rows.to_pylist())
    bad.sort(key=lambda b: b.index)
    return bad, skipped, n - len(failed) - len(unmatched_rows)


def write_subrange(
    spec: PipelineSpec, settings: dict[str, str], batch_id: str, task_id: int, rng: PartitionRange,
    mode: str = "ingest", exclude_path: str | None = None,
) -> dict[str, Any]:
    """Read ``rng``, decode, write data files (one TableSink per target table). Returns files and stats,
    or an error document.

    Replays (``mode`` replace or append-missing) count undecodable records as skipped (their dead letters
    were written when the range was first ingested); append-missing leaves out the offsets listed in
    ``exclude_path`` (the rows the table already holds).
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    from tidewater import shaping
    from tidewater.catalog import ensure_dead_letter_table, load_catalog, table_arrow_schema
    from tidewater.conversions import decoder_schema
    from tidewater.dead_letters import dead_letter_rows
    from tidewater.kafka_source import Rereader, read_range
    from tidewater.source_columns import add_source_columns, without_source_columns
    from tidewater.writing import DataFileWriter, to_table_schema

    started = time.monotonic()
    started_at = time.time()
    catalog = load_catalog(spec)
    policy = spec.dead_letter.policy if mode == "ingest" else "skip"
    present_set = _present_offsets(exclude_path, rng) if exclude_path else None
    present = 0
    prefix = f"{batch_id}-{task_id:05d}"
    sinks: dict[str, TableSink] = {}
    router = None
    if spec.routed:
        from tidewater.routing import Router

        router = Router(spec)

    def open_sink(ident: str) -> TableSink:
        tspec = spec.table_spec(ident) if router is not None else spec.table
        sinks[ident] = TableSink(spec, tspec, catalog, prefix, routed=router is not None)
        return sinks[ident]

    single = None if router is not None else open_sink(spec.table.identifier)
    registry = None
    if spec.format.value == "avro":
        from tidewater.avro import RegistryClient

        registry = RegistryClient(spec.format.registry_url or "", spec.format.registry_basic_auth)
    rereader = Rereader(settings, f"{spec.name}-{task_id}-dlq", spec.kafka.read_timeout_seconds)
    dlq_writer: DataFileWriter | None = None
    dlq_table: Any = None
    records = dead = skipped = routed_records = 0
    first = last = tmin = tmax = None
    try:
        for chunk in read_range(
            settings,
            rng,
            chunk_records=spec.batch.chunk_records,
            read_timeout=spec.kafka.read_timeout_seconds,
            client_id=f"{spec.name}-{task_id}",
            keys=spec.format.key != "none",
            headers=spec.format.headers,
        ):
            shaper = None
            explicit = None
            if single is not None:
                table = single.table
                table_schema = table_arrow_schema(table) if table is not None else None
                explicit = decoder_schema(without_source_columns(table_schema, spec.format), spec.format)
                if shaping.active(spec.format, spec.table, table):
                    explicit = shaping.decoder_schema(explicit, spec.format)
                    shaper = (shaping.NameMatcher(table, spec.table.case_insensitive), table_schema)
            elif spec.format.flatten or spec.format.map_columns:  # per-table name matching comes after routing
                shaper = (shaping.NameMatcher(None, False), None)
            decoded, bad, ignored = decode_chunk(spec, chunk, explicit, registry, shaper)
            skipped += len(ignored)
            gone = sorted(b.index for b in bad + ignored)
            decoded = add_source_columns(spec.format, chunk, decoded, gone)
            if router is not None:
                more, unmatched, routed_now = _route_chunk(spec, router, sinks, open_sink, chunk, decoded, gone)
                skipped += unmatched
                routed_records += routed_now
                if more and policy == "fail":
                    from tidewater.errors import RecordError

                    raise RecordError(f"{more[0].error_class}: {more[0].message}", topic=chunk.topic,
                                      partition=chunk.partition, offset=chunk.offsets[more[0].index])
                bad = sorted(bad + more, key=lambda b: b.index)
            if bad and policy == "dead_letter":
                if dlq_writer is None:
                    dlq_table = ensure_dead_letter_table(catalog, spec)
                    dlq_writer = DataFileWriter(dlq_table, prefix + "-dlq")
                reread = functools.partial(rereader.fetch, chunk.topic, chunk.partition)
                dlq_writer.write(to_table_schema(dlq_table, dead_letter_rows(chunk, bad, batch_id, spec.name, reread)))
                dead += len(bad)
            elif bad:
                skipped += len(bad)
                log.warning("batch %s: skipped %d undecodable records of %s[%d], first at offset %d: %s", batch_id,
                            len(bad), chunk.topic, chunk.partition, chunk.offsets[bad[0].index], bad[0].message)
            if present_set is not None and decoded.num_rows and len(present_set):
                from tidewater.decoding import decoded_rows

                held = pc.is_in(pc.take(pa.array(chunk.offsets, pa.int64()), decoded_rows(len(chunk), gone)),
                                value_set=present_set)
                present += pc.sum(held.cast(pa.int64())).as_py() or 0
                decoded = decoded.filter(pc.invert(held))
            if single is not None:
                single.write(decoded)
            records += len(chunk)
            first = chunk.offsets[0] if first is None else first
            last = chunk.offsets[-1]
            ts = pa.array(chunk.timestamps, pa.int64())
            ts = pc.filter(ts, pc.greater_equal(ts, 0))
            if len(ts):
                mm = pc.min_max(ts)
                lo, hi = mm["min"].as_py(), mm["max"].as_py()
                tmin = lo if tmin is None else min(tmin, lo)
                tmax = hi if tmax is None else max(tmax, hi)
        for sink in sinks.values():
            sink.close()
        dlq_files = dlq_writer.close() if dlq_writer is not None else []
        rereader.close()
    except Exception as e:
        rereader.close()
        for sink in sinks.values():
            sink.abort()
        if dlq_writer is not None:
            _delete_files(dlq_table, dlq_writer.abort())
        return {"task_id": task_id, "error": error_document(e)}
    # Python workers are reused across tasks: hand Arrow's cached buffers back so memory stays per task.
    pa.default_memory_pool().release_unused()
    stats = PartitionStats(rng.topic, rng.partition, rng.start, rng.end, records, first, last, tmin, tmax, dead, skipped,
                           routed_records if router is not None else None, present)
    result: dict[str, Any] = {
        "task_id": task_id,
        "dead_letter_files": dlq_files,
        "stats": asdict(stats),
        "timing": {"task_id": task_id, "started_at": started_at, "finished_at": time.time(),
                   "seconds": time.monotonic() - started, "records": records},
    }
    if single is not None:
        result.update(files=single.files, ignored_fields=sorted(single.ignored_fields))
    else:
        result.update(files=[], outputs=[s.output() for s in sinks.values()])
    return result


def _present_offsets(path: str, rng: PartitionRange) -> Any:
    """Offsets of ``rng``'s partition that the table already holds (append-missing replays)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    t = pq.read_table(path)
    mask = pc.and_(pc.equal(t.column("topic"), rng.topic), pc.equal(t.column("partition"), rng.partition))
    return t.column("offset").filter(mask).combine_chunks()


def _delete_files(table: Any, paths: list[str]) -> None:
    """Delete data files of a batch that can never be committed (no manifest references them)."""
    if table is None:
        return
    for p in paths:
        try:
            table.io.delete(p)
        except Exception:  # best effort: an undeleted file is an orphan that is never committed
            log.warning("could not delete uncommitted file %s", p)


def error_document(e: BaseException) -> dict[str, Any]:
    doc: dict[str, Any] = {"class": type(e).__name__, "message": str(e)}
    if isinstance(e, TidewaterError):
        doc.update(
            transient=e.transient,
            detail=e.message,
            topic=e.topic,
            partition=e.partition,
            offset=e.offset,
            table=e.table,
        )
    else:
        doc.update(transient=False, traceback=traceback.format_exc(limit=5))
    return doc


def run(spark: Any, plan: BatchPlan, spec: PipelineSpec, settings: dict[str, str]) -> BatchManifest:
    """Run the write step on ``spark`` (one Spark task per sub-range) and return the manifest."""
    ranges = subranges(plan, spec.batch.records_per_task)
    log.info("batch %s: %d sub-ranges over %d partitions", plan.batch_id, len(ranges), len(plan.ranges))
    batch_id = plan.batch_id
    work = list(enumerate(ranges))
    results: list[dict[str, Any]] = []
    if work:
        rdd = spark.sparkContext.parallelize(work, numSlices=len(work))
        mode, exclude = plan.mode, plan.exclude_path
        results = rdd.map(lambda x: write_subrange(spec, settings, batch_id, x[0], x[1], mode, exclude)).collect()
    return collect_manifest(plan, spec, results)


def run_inline(plan: BatchPlan, spec: PipelineSpec, settings: dict[str, str]) -> BatchManifest:
    """The same write step without Spark: sub-ranges one after another in this process."""
    work = list(enumerate(subranges(plan, spec.batch.records_per_task)))
    results = [write_subrange(spec, settings, plan.batch_id, i, r, plan.mode, plan.exclude_path) for i, r in work]
    return collect_manifest(plan, spec, results)


def collect_manifest(plan: BatchPlan, spec: PipelineSpec, results: list[dict[str, Any]]) -> BatchManifest:
    """Gather the tasks' results; raise the first task error (all tasks' files are then uncommitted)."""
    from tidewater.catalog import load_catalog, load_table

    errors = [r for r in results if "error" in r]
    catalog = load_catalog(spec)
    if errors:
        # No manifest will exist, so no commit can reference these files: remove them.
        by_table: dict[str, list[str]] = {}
        for r in results:
            by_table.setdefault(spec.table.identifier, []).extend(f["file_path"] for f in r.get("files", []))
            for out in r.get("outputs", []):
                by_table.setdefault(out["table"], []).extend(f["file_path"] for f in out["data_files"])
            by_table.setdefault(spec.dead_letter_table(), []).extend(f["file_path"] for f in r.get("dead_letter_files", []))
        for ident, paths in by_table.items():
            if paths:
                _delete_files(load_table(catalog, ident), paths)
        raise BatchWriteError(errors[0]["error"], len(errors))
    results = sorted(results, key=lambda r: r["task_id"])
    table = None if spec.routed else load_table(catalog, spec.table.identifier)
    return BatchManifest(
        batch_id=plan.batch_id,
        table=plan.table,
        data_files=tuple(f for r in results for f in r["files"]),
        partitions=tuple(PartitionStats(**r["stats"]) for r in results),
        schema_id=table.schema().schema_id if table is not None else -1,
        written_at=utc_now_iso(),
        task_timings=tuple(r["timing"] for r in results),
        dead_letter_table=spec.dead_letter_table(),
        dead_letter_files=tuple(f for r in results for f in r.get("dead_letter_files", [])),
        ignored_fields=tuple(sorted({n for r in results for n in r.get("ignored_fields", [])})),
        outputs=merge_outputs([o for r in results for o in r.get("outputs", [])]),
    )


def merge_outputs(outputs: list[dict[str, Any]]) -> tuple[dict[str, Any], ...]:
    """The tasks' per-table outputs, one per table (files joined, counts added, offsets seen kept per
    partition as the list of distinct values the tasks saw)."""
    merged: dict[str, dict[str, Any]] = {}
    for o in outputs:
        m = merged.setdefault(o["table"], {"table": o["table"], "data_files": [], "rows": 0, "already_committed": 0,
                                           "seen_offsets": {}, "ignored_fields": [], "branch": o.get("branch")})
        m["data_files"].extend(o["data_files"])
        m["rows"] += o["rows"]
        m["already_committed"] += o["already_committed"]
        m["ignored_fields"] = sorted(set(m["ignored_fields"]) | set(o["ignored_fields"]))
        for topic, parts in o["seen_offsets"].items():
            for p, off in parts.items():
                seen = m["seen_offsets"].setdefault(topic, {}).setdefault(p, [])
                if off not in seen:
                    seen.append(off)
    return tuple(merged[k] for k in sorted(merged))


class BatchWriteError(TerminalError):
    """A Spark task failed; carries the task's error document."""

    def __init__(self, doc: dict[str, Any], count: int) -> None:
        self.doc = doc
        self.transient = bool(doc.get("transient"))
        more = f" ({count - 1} more task(s) failed)" if count > 1 else ""
        super().__init__(
            f"{doc.get('class')}: {doc.get('detail') or doc.get('message')}{more}",
            topic=doc.get("topic"),
            partition=doc.get("partition"),
            offset=doc.get("offset"),
            table=doc.get("table"),
        )


def read_error(batch_dir: Path) -> BatchWriteError | None:
    """The error the write step left next to the plan, if it failed on a record or on Kafka."""
    path = batch_dir / ERROR_NAME
    return BatchWriteError(read_json(path), 1) if path.is_file() else None


def main(argv: list[str] | None = None) -> int:
    """spark-submit entry point: ``ingest_batch.py --plan PLAN.json``."""
    from pyspark.sql import SparkSession

    from tidewater.kafka_source import kafka_settings
    from tidewater.logs import configure_logging

    configure_logging()
    ap = argparse.ArgumentParser(prog="ingest_batch.py", description="Write one Tidewater batch (never commits).")
    ap.add_argument("--plan", required=True, help="path of the batch plan JSON")
    args = ap.parse_args(argv)
    plan_path = Path(args.plan)
    plan = BatchPlan.from_json(read_json(plan_path))
    spec = load_pipeline(plan.pipeline_path)
    settings = kafka_settings(spec)
    out_dir = plan_path.parent
    (out_dir / ERROR_NAME).unlink(missing_ok=True)
    spark = SparkSession.builder.appName(f"tidewater-{plan.pipeline}-{plan.batch_id}").getOrCreate()
    try:
        started = time.monotonic()
        manifest = run(spark, plan, spec, settings)
        write_json_atomic(out_dir / MANIFEST_NAME, manifest.to_json())
        log.info(
            "batch %s: wrote %d records in %d files in %.1fs; manifest %s",
            plan.batch_id,
            manifest.records,
            len(manifest.data_files),
            time.monotonic() - started,
            out_dir / MANIFEST_NAME,
        )
        return 0
    except BatchWriteError as e:
        write_json_atomic(out_dir / ERROR_NAME, e.doc)
        print(f"TIDEWATER-ERROR: {e}", file=sys.stderr)
        return 3
    finally:
        spark.stop()
