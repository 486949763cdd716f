"""`make bench-broker`: the embedded Apache Kafka broker's start time and memory, and 1M records through it.

Starts the embedded broker (`tidewater_dev.broker`: Kafka in KRaft mode, one node) ``--starts`` times and
measures each start until the broker's metadata lists it (format of its log directories included). Then on one
broker: produces ``--records`` pizza events over 6 partitions, reads them back with raw librdkafka (the read limit,
scripts/bench.py's ``limit``) and ingests them with one `tidewater run` (spark-submit, local[2]), sampling the
broker's RSS idle, after the produce and at its peak. Writes a section of BENCHMARKS.md; the Tansu broker's last
figures stand in the Throughput table at the top of that file (make bench of 2026-11-26), measured in another run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import LIMIT_CODE, RssSampler, pipeline_file, produce_topic, run_python, tidewater_run
from bench import watermarks as topic_watermarks
from benchlib import REPO, command_line, fresh_home, write_section

BEGIN, END = "<!-- broker:begin -->", "<!-- broker:end -->"


def rss_mb(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss / 2**20


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--starts", type=int, default=3)
    ap.add_argument("--output", default=str(REPO / "BENCHMARKS.md"))
    args = ap.parse_args()
    home = fresh_home("bench-broker")
    sys.path.insert(0, str(REPO))
    from tidewater_dev import broker as embedded

    env = {**os.environ, "TIDEWATER_HOME": str(home), "TIDEWATER_LOG_LEVEL": "WARNING"}
    starts = []
    for i in range(args.starts):
        t = time.monotonic()
        b = embedded.start(log_path=home / f"start-{i}.log")
        starts.append((time.monotonic() - t, rss_mb(b.pid)))
        b.stop()
    b = embedded.start(log_path=home / "broker.log")
    try:
        idle = rss_mb(b.pid)
        t = time.monotonic()
        nbytes = produce_topic(b.bootstrap, "pizzas", args.records, 6)
        produce_s = time.monotonic() - t
        after_produce = rss_mb(b.pid)
        ends = {p: hi for p, (_, hi) in topic_watermarks(b.bootstrap, "pizzas").items()}
        assert sum(ends.values()) == args.records, f"broker shows {sum(ends.values())} of {args.records} records"
        with RssSampler(b.pid) as broker_rss:
            limit, _ = run_python(LIMIT_CODE, [b.bootstrap, "pizzas", json.dumps(ends)], env)
            path = pipeline_file(home, "pizzas", "pizzas", b.bootstrap, "bench.pizzas", "local[2]")
            run, _, wall = tidewater_run(path, env)
        assert run["records"] == args.records, run
        peak = max(broker_rss.peak.values())
    finally:
        b.stop()

    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M")
    start_s = statistics.median(s for s, _ in starts)
    n = args.records
    lines = [
        BEGIN,
        "## The embedded broker: Apache Kafka (issue 55)",
        "",
        f"Produced by `{command_line('make bench-broker')}` on {when} (UTC), Apache Kafka "
        f"{embedded.kafka_version()} in KRaft mode (one node, controller and broker; heap {' '.join(embedded.HEAP)}), "
        f"{n:,} pizza events over 6 partitions. The broker it replaces (Tansu 0.6.0, memory storage) was measured "
        "by `make bench` of 2026-11-26 (its Throughput table's `limit` and `tidewater run` rows, in git history: "
        "the table above is from Kafka since 2026-11-29) and, "
        "for its start and memory, in the project's stack notes; those are other runs: compare the two brokers' "
        "figures loosely, not as ratios.",
        "",
        "| measure | Apache Kafka |",
        "| --- | ---: |",
        f"| start until ready, median of {len(starts)} (s) | {start_s:.1f} |",
        f"| RSS when ready (MB) | {statistics.median(r for _, r in starts):.0f} |",
        f"| RSS idle on the benchmark's broker (MB) | {idle:.0f} |",
        f"| produce {n:,} records (s; records/s) | {produce_s:.1f}; {n / produce_s / 1000:,.0f}k |",
        f"| RSS after the produce (MB) | {after_produce:.0f} |",
        f"| read limit: raw librdkafka, one process (s; records/s) | {limit['seconds']:.1f}; {n / limit['seconds'] / 1000:,.0f}k |",
        f"| `tidewater run`, spark-submit local[2], wall (s; records/s) | {wall:.1f}; {n / wall / 1000:,.0f}k |",
        f"| peak RSS while read and ingested (MB) | {peak:.0f} |",
        f"| value bytes produced (MB) | {nbytes / 1e6:.0f} |",
        "",
        END,
    ]
    write_section(args.output, BEGIN, END, "\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
