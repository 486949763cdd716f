"""Profile of the write step's data path in one worker: where the CPU of a batch goes, stage by stage.

Runs the write step's task code (``write.task.write_ranges``, what each Spark task runs) in this process over one
partition of N pizza events (default 1M) on the embedded broker, in two passes: the range is consumed into chunks
(``source.kafka.read_range``: librdkafka and the chunk's Python lists), then the task runs over those chunks held in
memory, with each stage timed by wrapping the function that does it: decode (the join into one buffer and Arrow's
JSON parse, shaping, conversions), source columns (the metadata columns), the cast to the table's schema, Parquet
encoding and compression, and the files' Iceberg metrics. Consuming first keeps librdkafka's fetch thread from
running beside the other stages. CPU is this process's (every thread); the broker's CPU is measured on its process
and reported apart, and the raw librdkafka loop is measured beside consumption.

    make bench-profile [PROFILE_ARGS="--records 1000000 --repeat 2 --markdown BENCHMARKS.md"]

``--codec``/``--level``/``--row-group`` set the table's Parquet properties (write.parquet.*) for comparisons;
``--py-spy FILE`` also samples the run with py-spy (a flame graph, SVG).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from scripts.benchlib import command_line, fresh_home, write_section


def markers(records: int, fmt: str = "json") -> tuple[str, str]:
    """The report's markers in BENCHMARKS.md: one section per batch size and value format."""
    name = f"profile {records}" if fmt == "json" else f"profile {records} {fmt}"
    return f"<!-- {name}: begin -->", f"<!-- {name}: end -->"


MEMORY = "replay of the read chunks from memory (not a cost of the worker)"
STAGES = (
    MEMORY,
    "decode",
    "source columns",
    "admit and route",
    "cast to the table schema",
    "parquet encode",
    "file close and Iceberg metrics",
)


class Stages:
    """Wall and CPU seconds per stage, from wrappers around the functions that do each stage."""

    def __init__(self) -> None:
        self.wall = dict.fromkeys(STAGES, 0.0)
        self.cpu = dict.fromkeys(STAGES, 0.0)
        self._originals: list[tuple[Any, str, Any]] = []

    def replace(self, owner: Any, name: str, new: Any) -> None:
        self._originals.append((owner, name, getattr(owner, name)))
        setattr(owner, name, new)

    def restore(self) -> None:
        """Put back every function replaced, last first."""
        while self._originals:
            setattr(*self._originals.pop())

    @contextlib.contextmanager
    def timing(self, stage: str):
        w, c = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            self.wall[stage] += time.perf_counter() - w
            self.cpu[stage] += time.process_time() - c

    def wrap(self, owner: Any, name: str, stage: str) -> None:
        fn = getattr(owner, name)

        @functools.wraps(fn)
        def timed(*a: Any, **k: Any) -> Any:
            with self.timing(stage):
                return fn(*a, **k)

        self.replace(owner, name, timed)

    def wrap_generator(self, owner: Any, name: str, stage: str) -> None:
        fn = getattr(owner, name)

        @functools.wraps(fn)
        def timed(*a: Any, **k: Any) -> Any:
            it = fn(*a, **k)
            while True:
                with self.timing(stage):
                    try:
                        item = next(it)
                    except StopIteration:
                        return
                yield item

        self.replace(owner, name, timed)


def instrument(stages: Stages, held: dict) -> None:
    """The task reads ``held`` instead of Kafka, and each stage's function is timed (``stages.restore`` undoes it).
    The stages do not nest: ``_roll`` runs inside ``write`` only when a file reaches its target size, 128 MB here,
    which the profile's files never do (they close at the end of each task)."""
    import tidewater.write.destinations as destinations
    import tidewater.write.parquet as parquet
    import tidewater.write.sinks as sinks
    import tidewater.write.task as task

    stages.replace(task, "read_range", from_memory(held))
    stages.wrap_generator(task, "read_range", MEMORY)
    stages.wrap(task, "decode_chunk", "decode")
    stages.wrap(task, "add_source_columns", "source columns")
    stages.wrap(destinations.OneTable, "admit", "admit and route")
    stages.wrap(sinks, "to_table_schema", "cast to the table schema")
    stages.wrap(parquet.DataFileWriter, "write", "parquet encode")
    stages.wrap(parquet.DataFileWriter, "_roll", "file close and Iceberg metrics")


def pipeline(work: Path, topic: str, bootstrap: str, args: argparse.Namespace, fmt: dict | None = None) -> Path:
    props = {"write.target-file-size-bytes": str(128 << 20)}
    if args.codec:
        props["write.parquet.compression-codec"] = args.codec
    if args.level is not None:
        props["write.parquet.compression-level"] = str(args.level)
    if args.row_group:
        props["write.parquet.row-group-limit"] = str(args.row_group)
    doc = {
        "name": "profile",
        "topics": [topic],
        "kafka": {"bootstrap_servers": bootstrap, "read_timeout_seconds": 60},
        "table": {"identifier": "rpc.profile", "properties": props},
        "batch": {"max_records": 100_000_000},
        "validation": {"not_null": ["order_id", "store_id"]},
        "schedule": None,
        **({"format": fmt} if fmt else {}),
    }
    path = work / "profile.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def task_collections() -> Any:
    """The write task's collector thresholds (``write.task.fewer_collections``), or Python's defaults when profiling
    code from before it (a baseline checkout on PYTHONPATH)."""
    try:
        from tidewater.write.task import fewer_collections
    except ImportError:
        return contextlib.nullcontext()
    return fewer_collections()


def consume_only(settings: dict[str, str], plan: Any, chunk_records: int) -> tuple[tuple[float, float, int], dict]:
    """((wall, CPU, records) of reading the batch's ranges into chunks and nothing else, the records read by
    partition: (values, offsets, timestamps), for the processing pass to replay from memory)."""
    w, c, n, held = time.perf_counter(), time.process_time(), 0, {}
    with task_collections():  # as in the write task
        _read_into(settings, plan, chunk_records, held)
        n = sum(len(v[0]) for v in held.values())
    return (time.perf_counter() - w, time.process_time() - c, n), held


def _read_into(settings: dict[str, str], plan: Any, chunk_records: int, held: dict) -> None:
    from tidewater.source.kafka import read_range

    for rng in plan.ranges:
        vals, offs, stamps = held.setdefault((rng.topic, rng.partition), ([], [], []))
        for chunk in read_range(settings, rng, chunk_records=chunk_records, read_timeout=60):
            vals += chunk.values
            offs += chunk.offsets
            stamps += chunk.timestamps


def from_memory(held: dict) -> Any:
    """A stand-in for ``read_range`` that yields the records read before, in the same chunks: the processing pass
    then measures decoding and writing alone (no fetch thread of librdkafka running beside them)."""
    from bisect import bisect_left

    from tidewater.source.kafka import Chunk

    def read_range(settings: Any, rng: Any, *, chunk_records: int, **_: Any) -> Any:
        vals, offs, stamps = held[(rng.topic, rng.partition)]
        lo, hi = bisect_left(offs, rng.start), bisect_left(offs, rng.end)
        for i in range(lo, hi, chunk_records):
            j = min(hi, i + chunk_records)
            yield Chunk(rng.topic, rng.partition, vals[i:j], offs[i:j], stamps[i:j])

    return read_range


def raw_consumption(settings: dict[str, str], plan: Any) -> tuple[float, float, int]:
    """(wall, CPU, records) of the raw loop (``make bench``'s limit): librdkafka's messages, each value read once."""
    from confluent_kafka import Consumer, TopicPartition

    from tidewater.source.kafka import consumer_config

    c = Consumer(consumer_config(settings, "profile-raw"))
    c.assign([TopicPartition(r.topic, r.partition, r.start) for r in plan.ranges])
    target, n = sum(r.size for r in plan.ranges), 0
    w, cpu = time.perf_counter(), time.process_time()
    with task_collections():  # as the write task: this process holds every module the worker imports
        while n < target:
            for m in c.consume(num_messages=10_000, timeout=1.0):
                if m.error() is None and m.value() is not None:
                    n += 1
    out = time.perf_counter() - w, time.process_time() - cpu, n
    c.close()
    return out


def one_pass(spec: Any, settings: dict[str, str], broker: psutil.Process, py_spy: str | None) -> dict[str, Any]:
    """One batch's write step in this process, profiled; the batch is planned but never committed."""
    from tidewater.plan.ingest import plan_batch
    from tidewater.write.job import run_inline

    plan, _ = plan_batch(spec)
    raw = raw_consumption(settings, plan)
    b0 = broker.cpu_times()
    (c_wall, c_cpu, c_n), held = consume_only(settings, plan, spec.batch.chunk_records)
    b1 = broker.cpu_times()
    stages = Stages()
    instrument(stages, held)
    spy = None
    if py_spy:
        spy = subprocess.Popen(
            ["py-spy", "record", "--pid", str(os.getpid()), "--native", "--rate", "200", "-o", py_spy],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(1)
    w0, c0 = time.perf_counter(), time.process_time()
    try:
        manifest = run_inline(plan, spec, settings)
    finally:
        stages.restore()
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    if spy is not None:
        spy.send_signal(2)
        spy.wait(60)
    files = [f for o in manifest.outputs for f in o.data_files]  # every table's files (the table's own included)
    assert manifest.records == c_n, (manifest.records, c_n)
    return {
        "records": manifest.records,
        "wall": wall - stages.wall[MEMORY],
        "cpu": cpu - stages.cpu[MEMORY],
        "broker_cpu": (b1.user + b1.system) - (b0.user + b0.system),
        "stages": stages,
        "consume": (c_wall, c_cpu),
        "raw": raw,
        "files": len(files),
        "bytes": sum(f.file_size_in_bytes for f in files),
        "rows": sum(f.record_count for f in files),
    }


def report(runs: list[dict[str, Any]], args: argparse.Namespace) -> str:
    """The stages of the run with the least CPU (consumption from its consume-only pass, the rest from its
    processing pass over the same records held in memory)."""
    total = lambda r: r["cpu"] + r["consume"][1]  # noqa: E731
    best = min(runs, key=total)
    n = best["records"]
    us = lambda s: s / n * 1e6  # noqa: E731
    st, (cw, cc) = best["stages"], best["consume"]
    cpu, wall = total(best), best["wall"] + cw
    rest_cpu = best["cpu"] - sum(st.cpu[s] for s in STAGES if s != MEMORY)
    rest_wall = best["wall"] - sum(st.wall[s] for s in STAGES if s != MEMORY)
    begin, end = markers(args.records, args.format)
    what = "" if args.format == "json" else f", format.value {args.format}"
    lines = [
        begin,
        f"## Profile of the data path in one worker ({n:,} records, one partition{what})",
        "",
        f"Command: `{command_line('make bench-profile')}` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
        f"the run with the least CPU of {len(runs)}. The write step's task code in one process "
        "(scripts/profile_data_path.py): the range is consumed into chunks first (librdkafka's fetch thread "
        "included), then processed from memory, each stage timed; CPU counts every thread of the process.",
        "",
        "| stage | wall s | CPU s | CPU us per record | share of CPU |",
        "| --- | ---: | ---: | ---: | ---: |",
        f"| consume (librdkafka, the chunk's lists) | {cw:.2f} | {cc:.2f} | {us(cc):.2f} | {cc / cpu:.0%} |",
    ]
    for s in STAGES[1:]:
        lines.append(f"| {s} | {st.wall[s]:.2f} | {st.cpu[s]:.2f} | {us(st.cpu[s]):.2f} | {st.cpu[s] / cpu:.0%} |")
    lines.append(
        f"| the rest (task set-up, counting, dead-letter checks, manifest) | {rest_wall:.2f} | {rest_cpu:.2f} | "
        f"{us(rest_cpu):.2f} | {rest_cpu / cpu:.0%} |"
    )
    lines.append(f"| **worker total** | {wall:.2f} | {cpu:.2f} | **{us(cpu):.2f}** | 100% |")
    rw, rc, rn = best["raw"]
    lines += [
        "",
        f"- Raw librdkafka consumption (`make bench`'s limit loop: each message's value read, nothing kept; in this "
        "process, with the task's collector thresholds): "
        f"{rc / rn * 1e6:.2f} us of CPU per record ({rw:.2f} s wall).",
        f"- The broker's own CPU while the range was consumed: {best['broker_cpu']:.2f} s "
        f"({us(best['broker_cpu']):.2f} us per record), not counted above.",
        f"- Written: {best['files']} files, {best['rows']:,} rows, {best['bytes'] / 1e6:.1f} MB. Parquet: codec "
        f"{args.codec or 'the table default (zstd)'}, level {args.level if args.level is not None else 'default'}"
        f", row group {args.row_group or 'default'}.",
        "- Every run: " + ", ".join(f"{total(r) / r['records'] * 1e6:.2f}" for r in runs) + " us of CPU per record.",
        end,
    ]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--codec", default=None)
    ap.add_argument("--level", type=int, default=None)
    ap.add_argument("--row-group", type=int, default=None)
    ap.add_argument("--py-spy", default=None, metavar="SVG")
    ap.add_argument("--markdown", default=None, help="write the report into this file (between its profile markers)")
    ap.add_argument(
        "--format",
        default="json",
        choices=("json", "avro", "json_schema", "protobuf"),
        help="the pizza events' value format (the registry formats through the stand-in registry)",
    )
    args = ap.parse_args()
    work = fresh_home("profile")
    from scripts.bench import produce_topic, registry_formats
    from scripts.benchlib import timed_batch
    from tidewater.config.parse import load_pipeline
    from tidewater.source.kafka import kafka_settings
    from tidewater_dev import broker as embedded
    from tidewater_dev.sample_data import PIZZA_AVRO_SCHEMA, LocalSchemaRegistry

    b = embedded.start(log_path=work / "broker.log")
    registry = LocalSchemaRegistry({1: PIZZA_AVRO_SCHEMA})
    url = registry.start()
    try:
        encode = next((e for f, e in registry_formats(registry).values() if f == args.format), None)
        fmt = {"value": args.format, "registry_url": url} if encode else None
        topic = "profile"
        produce_topic(b.bootstrap, topic, 1000, partitions=1, encode=encode)
        spec = load_pipeline(pipeline(work, topic, b.bootstrap, args, fmt))
        timed_batch(spec, "local[1]", inline=True)  # creates the table, warms imports
        produce_topic(b.bootstrap, topic, args.records, partitions=1, encode=encode)
        runs = [one_pass(spec, kafka_settings(spec), psutil.Process(b.pid), args.py_spy if i == 0 else None) for i in range(args.repeat)]
    finally:
        registry.stop()
        b.stop()
    text = report(runs, args)
    if args.markdown:
        write_section(args.markdown, *markers(args.records, args.format), text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
