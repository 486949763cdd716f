"""`make bench-metadata`: what `format.metadata` costs in storage on the pizza table.

The same 200,000 Scenario 1 events (6 partitions, embedded broker) are ingested into three tables, with
`format.metadata` none, prefixed and struct; the data files' sizes are compared (zstd Parquet, one file
per partition). Writes a section of BENCHMARKS.md.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- metadata:begin -->", "<!-- metadata:end -->"
RECORDS = 200_000


def main() -> int:
    home = Path(tempfile.mkdtemp(prefix="tidewater-bench-metadata-"))
    os.environ["TIDEWATER_HOME"] = str(home)
    sys.path.insert(0, str(REPO))
    from tests.conftest import ingest_inline
    from tidewater.config.parse import load_pipeline
    from tidewater.table.catalog import load_catalog, load_table
    from tidewater_dev import broker as embedded
    from tidewater_dev.sample_data import pizza_events, produce

    b = embedded.start(log_path=home / "broker.log")
    rows = []
    try:
        produce(b.bootstrap, "pizzas", pizza_events(RECORDS, seed=1), partitions=6)
        for meta in ("none", "prefixed", "struct"):
            path = home / f"m_{meta}.yaml"
            path.write_text(
                yaml.safe_dump(
                    {
                        "name": f"m_{meta}",
                        "topics": ["pizzas"],
                        "kafka": {"bootstrap_servers": b.bootstrap},
                        "table": {"identifier": f"cost.m_{meta}"},
                        "format": {"metadata": meta},
                        "batch": {"max_records": 1_000_000, "records_per_task": 1_000_000},
                    }
                )
            )
            spec = load_pipeline(path)
            ingest_inline(spec)
            files = load_table(load_catalog(spec), spec.table.identifier).inspect.files().to_pylist()
            assert sum(f["record_count"] for f in files) == RECORDS
            rows.append((meta, sum(f["file_size_in_bytes"] for f in files), len(files)))
    finally:
        b.stop()
    base = rows[0][1]
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M")
    lines = [
        BEGIN,
        "## What `format.metadata` costs in storage",
        "",
        f"Produced by `make bench-metadata` on {when} (UTC): {RECORDS:,} pizza events (6 partitions) ingested "
        "three times, one table per setting (zstd Parquet, one file per partition).",
        "",
        "| format.metadata | data files | bytes | vs none |",
        "| --- | ---: | ---: | ---: |",
    ]
    lines += [f"| {m} | {n} | {size:,} | {size / base:.3f} |" for m, size, n in rows]
    lines += ["", END]
    out = REPO / "BENCHMARKS.md"
    text = out.read_text()
    section = "\n".join(lines)
    text = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), section, text, flags=re.S) if BEGIN in text else text + "\n" + section + "\n"
    out.write_text(text)
    print(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
