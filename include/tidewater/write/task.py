"""One Spark task of the write step: read an offset sub-range, decode, transform, route, write Parquet.

How a record travels: ``source.kafka.read_range`` (Arrow-friendly chunks of raw values) ->
``transform.chunk.decode_chunk`` (format decoder, shaping, date-time conversions; bad records set apart) ->
``transform.source_columns`` (key, headers, coordinates) -> ``transform.routing`` (routed pipelines) ->
``write.sinks.TableSink`` (per table: evolution, Parquet files via ``write.parquet``) and
``write.dead_letters`` (bad records as rows of the dead-letter table).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import logging
import os
import sys
import tempfile
import time
from dataclasses import asdict
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from tidewater.batch import Mode, PartitionRange, PartitionStats
from tidewater.config.formats import FORMATS
from tidewater.config.spec import PipelineSpec
from tidewater.decode.registry_client import RegistryClient
from tidewater.errors import TidewaterError, TransientError, error_document
from tidewater.source.kafka import Chunk, Rereader, read_range
from tidewater.table.catalog import catalog_failure, load_catalog
from tidewater.table.evolution import table_arrow_schema
from tidewater.table.own_tables import ensure_dead_letter_table
from tidewater.table.targets import target_role
from tidewater.transform.chunk import decode_chunk
from tidewater.transform.keys import keyed_changes
from tidewater.transform.source_columns import add_source_columns
from tidewater.write.dead_letters import dead_letter_rows
from tidewater.write.destinations import Destination, OneTable, Routes
from tidewater.write.parquet import DataFileWriter, to_table_schema
from tidewater.write.sinks import TableSink, delete_files

log = logging.getLogger(__name__)


class TaskWriter:
    """The state of one task: sinks per table, the dead-letter writer, counts. One method per step of
    the per-chunk loop; ``write_ranges`` drives it."""

    def __init__(
        self,
        spec: PipelineSpec,
        settings: dict[str, str],
        batch_id: str,
        task_id: int,
        rng: PartitionRange,
        mode: Mode,
        *,
        probe: bool = False,
        tables: tuple[str, ...] = (),
    ) -> None:
        self.probe = probe
        self.spec, self.settings, self.batch_id, self.task_id, self.rng = spec, settings, batch_id, task_id, rng
        self.started, self.started_at = time.monotonic(), time.time()
        self.catalog = load_catalog(spec)
        self.policy = spec.dead_letter.policy if mode is Mode.INGEST else "skip"
        self.mode = mode
        self.only = frozenset(tables) or None  # routed replays: the target tables asked for (None: every table)
        self.prefix = f"{batch_id}-{task_id:05d}"
        self.sinks: dict[str, TableSink] = {}
        self.registry: Any = None
        if FORMATS[spec.format.value].registry:
            self.registry = RegistryClient(*spec.registry())
        # the one place a task asks the pipeline's shape: where its records go (see write/destinations.py)
        self.dest: Destination = OneTable(self) if spec.targets.fused else Routes(self, self.only)
        self.rereader = Rereader(settings, f"{spec.name}-{task_id}-dlq", spec.kafka.read_timeout_seconds)
        self.setup_seconds = time.monotonic() - self.started  # catalog, table and clients opened
        self.dlq_writer: Any = None
        self.dlq_table: Any = None
        self.dlq_files: list[Any] = []
        self.done: list[PartitionStats] = []  # the counts of the ranges read before ``rng`` (packed tasks)
        self.reset_counts()

    def reset_counts(self) -> None:
        """The counts of one range (``rng``), from zero, here and in the destination."""
        self.records = self.dead = self.skipped = self.present = 0
        self.dest.reset()
        self.first: int | None = None
        self.last: int | None = None
        self.tmin: int | None = None
        self.tmax: int | None = None

    def read(self, ranges: tuple[PartitionRange, ...]) -> None:
        """Read and write ``ranges`` one after another (the task's first range is ``rng``), each counted apart: a
        packed task's rows share its sinks, so its files hold several ranges' rows (``write/packing.py``)."""
        for i, rng in enumerate(ranges):
            if i:
                self.done.append(self.range_stats())
                self.rng = rng
                self.reset_counts()
            for chunk in self.chunks():
                self.process(chunk)

    def open_sink(self, ident: str) -> TableSink:
        role = target_role(self.spec, ident)
        tspec = self.spec.table if role.holds_offsets else self.spec.table_spec(ident)
        self.sinks[ident] = TableSink(
            self.spec,
            tspec,
            self.catalog,
            self.prefix,
            role,
            batch=(self.batch_id, f"t{self.task_id:05d}"),
            replay=(self.mode, self.rng) if self.mode is not Mode.INGEST else None,
            registry=self.registry,
        )
        self.sinks[ident].probe = self.probe
        return self.sinks[ident]

    def requests(self) -> list[dict[str, Any]]:
        """The schema changes this task's rows need (see ``TableSink.write``): when any, nothing it wrote counts."""
        return [r for sink in self.sinks.values() for r in sink.requests]

    def chunks(self) -> Any:
        spec = self.spec
        return read_range(
            self.settings,
            self.rng,
            chunk_records=spec.batch.chunk_records,
            read_timeout=spec.kafka.read_timeout_seconds,
            client_id=f"{spec.name}-{self.task_id}",
            keys=spec.format.key != "none" or spec.keys_from_messages or spec.ids_from_keys,
            headers=spec.format.headers,
        )

    def process(self, chunk: Any) -> None:
        """One chunk: decode it, key it, add its source columns, place its rows, set its bad records apart, write."""
        explicit, shaper = self.dest.decoder_inputs()
        decoded, bad, ignored = decode_chunk(self.spec, chunk, explicit, self.registry, shaper)
        keyed = self.dest.keyed(chunk.topic)
        if keyed is not None:
            view, table = keyed
            decoded, bad, ignored = keyed_changes(
                view, chunk, decoded, bad, ignored, table_arrow_schema(table) if table is not None else None, self.registry
            )
        self.skipped += len(ignored)  # after keying: a tombstone keyed by the message key is a delete, not skipped
        gone = sorted(b.index for b in bad + ignored)
        decoded = add_source_columns(self.spec.format, chunk, decoded, gone)
        placed = self.dest.place(chunk, decoded, gone, bad)
        self.present += placed.present
        self.skipped += placed.skipped
        self.set_apart(chunk, placed.bad)
        placed.write()
        self.count(chunk)

    def set_apart(self, chunk: Any, bad: list[Any]) -> None:
        """Bad records become rows of the dead-letter table (or are skipped and logged, by policy)."""
        if not bad or self.probe or self.requests():  # a task that needs a schema change writes nothing more
            return
        if self.policy != "dead_letter":
            self.skipped += len(bad)
            log.warning(
                "batch %s: skipped %d undecodable records of %s[%d], first at offset %d: %s",
                self.batch_id,
                len(bad),
                chunk.topic,
                chunk.partition,
                chunk.offsets[bad[0].index],
                bad[0].message,
            )
            return
        if self.dlq_writer is None:
            self.dlq_table = ensure_dead_letter_table(self.catalog, self.spec)
            self.dlq_writer = DataFileWriter(self.dlq_table, self.prefix + "-dlq")
        reread = functools.partial(self.rereader.fetch, chunk.topic, chunk.partition)
        rows = dead_letter_rows(chunk, bad, self.batch_id, self.spec.name, reread)
        self.dlq_writer.write(to_table_schema(self.dlq_table, rows))
        self.dead += len(bad)

    def count(self, chunk: Any) -> None:
        self.records += len(chunk)
        self.first = chunk.offsets[0] if self.first is None else self.first
        self.last = chunk.offsets[-1]
        ts = pa.array(chunk.timestamps, pa.int64())
        ts = pc.filter(ts, pc.greater_equal(ts, 0))
        if len(ts):
            mm = pc.min_max(ts)
            lo, hi = mm["min"].as_py(), mm["max"].as_py()
            self.tmin = lo if self.tmin is None else min(self.tmin, lo)
            self.tmax = hi if self.tmax is None else max(self.tmax, hi)

    def close(self) -> None:
        for sink in self.sinks.values():
            sink.close()
        self.dlq_files = self.dlq_writer.close() if self.dlq_writer is not None else []
        self.rereader.close()

    def abort(self) -> None:
        """Nothing this task wrote can be committed: remove it."""
        self.rereader.close()
        for sink in self.sinks.values():
            sink.abort()
        if self.dlq_writer is not None:
            delete_files(self.dlq_table, self.dlq_writer.abort())

    def range_stats(self) -> PartitionStats:
        rng = self.rng
        return PartitionStats(
            rng.topic,
            rng.partition,
            rng.start,
            rng.end,
            self.records,
            self.first,
            self.last,
            self.tmin,
            self.tmax,
            self.dead,
            self.skipped,
            self.dest.routed,
            self.present,
        )

    def result(self) -> dict[str, Any]:
        stats = [*self.done, self.range_stats()]
        result: dict[str, Any] = {
            "task_id": self.task_id,
            "dead_letter_files": self.dlq_files,
            "stats": [asdict(s) for s in stats],  # one per range the task read
            "timing": {
                "task_id": self.task_id,
                "started_at": self.started_at,
                "finished_at": time.time(),
                "seconds": time.monotonic() - self.started,
                "setup_seconds": self.setup_seconds,
                "records": sum(s.records for s in stats),
                **worker_process(),
            },
        }
        result.update(self.dest.result())
        return result


PROBE_RECORDS = 1000  # records read per partition range by the schema probe


def probe_schema(spec: PipelineSpec, settings: dict[str, str], batch_id: str, ranges: Any) -> None:
    """Create the target table, with the schema the first records of each range need, once and before any
    Spark task starts. Tasks never change tables: without the probe, every task of a first batch would read
    its range only to report that the table is missing, and the write job would run them all twice (see
    ``write/job.py``). The probe runs the task code on the first ``PROBE_RECORDS`` records of each range
    without writing any file; the changes are tagged as the batch's (``table/provisional``). A record the
    probe cannot take is left to the task, which reports it with its offset."""
    for i, rng in enumerate(ranges):
        head = PartitionRange(rng.topic, rng.partition, rng.start, min(rng.end, rng.start + PROBE_RECORDS))
        # Built outside the guard: a writer that cannot be built is our fault, not a record's, and must not hide.
        writer = TaskWriter(spec, settings, batch_id, 90000 + i, head, Mode.INGEST, probe=True)
        try:
            for chunk in writer.chunks():
                writer.process(chunk)
        except Exception as e:  # noqa: BLE001 - the Spark task meets the same record and reports it
            log.info("batch %s: schema probe of %s[%d] stopped (%s); the tasks go on", batch_id, rng.topic, rng.partition, e)
        finally:
            writer.rereader.close()


def worker_process() -> dict[str, Any]:
    """This process's id, interpreter and start time (a Python worker is reused for many tasks)."""
    try:
        import psutil

        return {"pid": os.getpid(), "python": sys.executable, "process_started_at": psutil.Process().create_time()}
    except ImportError:  # psutil comes with Airflow, not necessarily on a cluster's executors
        return {"pid": os.getpid(), "python": sys.executable}


def _leave_a_removed_directory() -> None:
    """Work from the temporary directory when this process's working directory is gone. A Spark Connect server
    reuses Python workers across sessions and removes a closed session's directory, where such a worker may still
    sit; pyiceberg reads its configuration file from the working directory whenever it writes table metadata (a
    task creating the dead-letter table), which then failed with a bare ENOENT, taken for an unreachable catalog."""
    try:
        os.getcwd()
    except FileNotFoundError:
        os.chdir(tempfile.gettempdir())


# Allocations between two young-generation collections of Python's cyclic garbage collector while a task runs.
# Each consumed record allocates a few objects (librdkafka's message, its offset and timestamp) that die by reference
# counting, yet every 700 allocations (Python's default) start a collection whose older generations also walk the
# objects of every module the worker imported: that alone doubled consumption's CPU (scripts/profile_data_path.py,
# BENCHMARKS.md). Cycles are still collected, every GC_GEN0_ALLOCATIONS allocations instead.
GC_GEN0_ALLOCATIONS = 100_000


@contextlib.contextmanager
def fewer_collections() -> Any:
    """Python's collector runs less often inside (see GC_GEN0_ALLOCATIONS); its thresholds are restored after."""
    before = gc.get_threshold()
    gc.set_threshold(max(GC_GEN0_ALLOCATIONS, before[0]), *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)


def write_ranges(
    spec: PipelineSpec,
    settings: dict[str, str],
    batch_id: str,
    task_id: int,
    ranges: tuple[PartitionRange, ...],
    mode: Mode = Mode.INGEST,
    tables: tuple[str, ...] = (),
) -> dict[str, Any]:
    """One task of the write step: read ``ranges`` (one sub-range, or several short ones packed: see
    ``write/packing.py``), decode, write data files (one TableSink per target table, shared by the ranges). Returns
    files and stats (one per range), or an error document, or (``evolve``) the schema changes its rows need, for the
    driver to make before it runs the task again; in both of the latter nothing of what the task wrote is left behind.

    Replays (``mode`` replace or append-missing) count undecodable records as skipped (their dead letters
    were written when the range was first ingested); append-missing leaves out the offsets each table already holds
    (``TableSink.held``, read from the table's Kafka metadata columns). ``tables``: a routed replay of some target
    tables.
    """
    _leave_a_removed_directory()
    with fewer_collections():
        return _run_task(spec, task_id, ranges, lambda: TaskWriter(spec, settings, batch_id, task_id, ranges[0], mode, tables=tables))


def _run_task(spec: PipelineSpec, task_id: int, ranges: tuple[PartitionRange, ...], make: Any) -> dict[str, Any]:
    """Run the writer ``make()`` returns over ``ranges``: its result, the schema changes it needs, or its error."""
    writer = None
    try:
        writer = make()
        writer.read(ranges)
        needs = writer.requests()
        if needs:  # the driver changes the table and runs this task again: nothing written here may count
            writer.abort()
            return {"task_id": task_id, "evolve": needs}
        writer.close()
    except Exception as e:  # noqa: BLE001 - the task reports its error to the driver, which raises it (BatchWriteError)
        if writer is not None:
            writer.abort()
        if not isinstance(e, TidewaterError) and catalog_failure(e) is not None:  # a busy catalog is worth a retry
            e = TransientError(f"catalog unreachable or busy: {e}", table=spec.targets.own_table)
        return {"task_id": task_id, "error": error_document(e)}
    # Python workers are reused across tasks: hand Arrow's cached buffers back so memory stays per task.
    pa.default_memory_pool().release_unused()
    return writer.result()


class _LetterWriter(TaskWriter):
    """A dead-letter retry's task (``ops/dead_letters.py``): the records are the letters' stored raw records (key,
    value, headers, timestamp) instead of a read of Kafka, so a retry works when Kafka no longer holds them; they are
    decoded, transformed and routed with the pipeline's current settings like any replay that appends the missing
    rows (offsets a table already holds are left out), and a record that fails again becomes a new dead letter."""

    def __init__(self, spec: PipelineSpec, batch_id: str, task_id: int, rng: PartitionRange, letters: Any) -> None:
        super().__init__(spec, {}, batch_id, task_id, rng, Mode.APPEND_MISSING)
        self.policy = "dead_letter"
        self.letters = letters

    def chunks(self) -> Any:
        t = self.letters
        stamps = t.column("timestamp").cast(pa.int64()).to_pylist()  # microseconds; Kafka's are milliseconds
        headers = [[(h["key"], h["value"]) for h in hs] if hs else [] for hs in t.column("headers").to_pylist()]
        yield Chunk(
            self.rng.topic,
            self.rng.partition,
            t.column("value").to_pylist(),
            t.column("offset").to_pylist(),
            [s // 1000 if s is not None else -1 for s in stamps],
            t.column("key").to_pylist(),
            headers,
        )


def write_letters(spec: PipelineSpec, batch_id: str, task_id: int, rng: PartitionRange, letters: Any) -> dict[str, Any]:
    """Decode and write the dead letters ``letters`` (rows of the dead-letter table of ``rng``'s partition, sorted by
    offset) as one task of a retry; the result is ``write_ranges``'. The error path: a Python step per letter to
    make the chunk is fine here (letters are few)."""
    return _run_task(spec, task_id, (rng,), lambda: _LetterWriter(spec, batch_id, task_id, rng, letters))
