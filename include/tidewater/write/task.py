"""task (moved from spark_job.py)."""


from __future__ import annotations

import functools
import logging
import time
from dataclasses import asdict
from typing import Any

from tidewater.batch import (
    PartitionRange,
    PartitionStats,
)
from tidewater.config.spec import PipelineSpec
from tidewater.decode.registry import decode_chunk
from tidewater.errors import error_document
from tidewater.write.sinks import TableSink, delete_files

log = logging.getLogger(__name__)


def route_chunk(spec: PipelineSpec, router: Any, sinks: dict[str, TableSink], open_sink: Any, chunk: Any,
                 decoded: Any, bad_idx: list[int]) -> tuple[list[Any], int, int]:
    """Routed pipelines: split decoded rows over the target tables and write them.

    Returns (records that become dead letters, records skipped as unmatched, records routed to at least
    one table). A record that cannot be written to one of its tables (its value does not take the
    column's type, an id column is empty, its dynamic table does not exist) is a dead letter and is
    written to none, so records read = routed + dead letters + skipped holds.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    from tidewater.decode.records import BadRecord, decoded_rows, keep_mask
    from tidewater.transform.shaping import NameMatcher, conform

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
            from tidewater.table.evolution import table_arrow_schema

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

    from tidewater.source.kafka import Rereader, read_range
    from tidewater.table.catalog import ensure_dead_letter_table, load_catalog
    from tidewater.table.evolution import table_arrow_schema
    from tidewater.transform import shaping
    from tidewater.transform.conversions import decoder_schema
    from tidewater.transform.source_columns import add_source_columns, without_source_columns
    from tidewater.write.dead_letters import dead_letter_rows
    from tidewater.write.parquet import DataFileWriter, to_table_schema

    started = time.monotonic()
    started_at = time.time()
    catalog = load_catalog(spec)
    policy = spec.dead_letter.policy if mode == "ingest" else "skip"
    present_set = present_offsets(exclude_path, rng) if exclude_path else None
    present = 0
    prefix = f"{batch_id}-{task_id:05d}"
    sinks: dict[str, TableSink] = {}
    router = None
    if spec.routed:
        from tidewater.transform.routing import Router

        router = Router(spec)

    def open_sink(ident: str) -> TableSink:
        tspec = spec.table_spec(ident) if router is not None else spec.table
        sinks[ident] = TableSink(spec, tspec, catalog, prefix, routed=router is not None)
        return sinks[ident]

    single = None if router is not None else open_sink(spec.table.identifier)
    registry = None
    if spec.format.value == "avro":
        from tidewater.decode.avro import RegistryClient

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
                more, unmatched, routed_now = route_chunk(spec, router, sinks, open_sink, chunk, decoded, gone)
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
                from tidewater.decode.records import decoded_rows

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
            delete_files(dlq_table, dlq_writer.abort())
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


def present_offsets(path: str, rng: PartitionRange) -> Any:
    """Offsets of ``rng``'s partition that the table already holds (append-missing replays)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    t = pq.read_table(path)
    mask = pc.and_(pc.equal(t.column("topic"), rng.topic), pc.equal(t.column("partition"), rng.partition))
    return t.column("offset").filter(mask).combine_chunks()


