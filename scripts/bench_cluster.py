"""`make bench-cluster`: one batch on `local[2]` and on a Spark standalone cluster (2 workers x 1 core).

The same records (pizza events, 2 partitions, embedded broker) are ingested by `tidewater run`'s code path
(plan, spark-submit write job, validate, commit) into one table per run, alternating local[2] and the cluster,
twice each. The cluster's workers run in an environment of their own (Debian's Python, none of the project's
packages) and get the packed environment (`make executor-env`, `spark.python_env`), as on a real cluster.
On a 2-core machine the figure is about overhead (application start on the cluster, environment shipping,
task scheduling across processes), not speed-up. Writes a section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import REPO, command_line, fresh_home, write_section

BEGIN, END = "<!-- cluster:begin -->", "<!-- cluster:end -->"
PACK = REPO / ".data" / "executor-env.tar.gz"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--output", default=str(REPO / "BENCHMARKS.md"))
    args = ap.parse_args()
    if not PACK.is_file():
        raise SystemExit(f"{PACK} is missing: run `make executor-env` first")
    home = fresh_home("bench-cluster")
    sys.path.insert(0, str(REPO))
    import yaml

    from tidewater.config.parse import load_pipeline
    from tidewater.steps.lifecycle import run_once
    from tidewater.table.catalog import load_catalog, load_table
    from tidewater_dev import broker as embedded
    from tidewater_dev.cluster import start_standalone
    from tidewater_dev.sample_data import pizza_events, produce

    b = embedded.start(log_path=home / "broker.log")
    (home / "cluster").mkdir()
    cluster = None
    runs: dict[str, list[dict]] = {"local[2]": [], "standalone": []}
    try:
        t = time.monotonic()
        produce(b.bootstrap, "pizzas", pizza_events(args.records, seed=7), partitions=2)
        print(f"produced {args.records:,} records in {time.monotonic() - t:.0f} s", file=sys.stderr)
        cluster = start_standalone(home / "cluster", workers=2, cores=1, memory="2g")
        for r in range(args.rounds):
            for where, master in (("local[2]", "local[2]"), ("standalone", cluster.master)):
                name = f"{where.replace('[', '').replace(']', '')}_{r}"
                path = home / f"{name}.yaml"
                spark = {"master": master, **({"python_env": str(PACK)} if where == "standalone" else {})}
                path.write_text(
                    yaml.safe_dump(
                        {
                            "name": name,
                            "topics": ["pizzas"],
                            "kafka": {"bootstrap_servers": b.bootstrap},
                            "table": {"identifier": f"bench.{name}"},
                            "spark": spark,
                            "batch": {"max_records": args.records, "records_per_task": args.records // 2},
                        }
                    )
                )
                result = run_once(path, master=master)
                spec = load_pipeline(path)
                rows = load_table(load_catalog(spec), spec.table.identifier).scan(selected_fields=("order_id",)).count()
                assert result["records"] == args.records == rows, (result, rows)
                runs[where].append(result)
                print(f"{where} round {r + 1}: {result['seconds']:.1f} s", file=sys.stderr)
    finally:
        if cluster is not None:
            cluster.stop()
        b.stop()

    def med(where: str, key: str) -> float:
        values = [r["steps"][key] if key in r["steps"] else r["write_breakdown"].get(key, r.get(key, 0.0)) for r in runs[where]]
        return statistics.median(values)

    phases = list(runs["standalone"][0]["write_breakdown"])  # the write step's phases, in order
    rows = [
        ("end to end (`tidewater run`)", "seconds"),
        ("write step (spark-submit until the manifest)", "write"),
        *((f"- {k}", k) for k in phases),
    ]
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M")
    lines = [
        BEGIN,
        "## One batch on local[2] and on a standalone cluster",
        "",
        f"Produced by `{command_line('make bench-cluster')}` on {when} (UTC): {args.records:,} pizza events "
        f"(2 partitions, 2 write tasks) per batch; {args.rounds} batches each, alternating; medians. The cluster: "
        "a master and 2 workers x 1 core on this 2-core machine, workers without the project's packages, the "
        "packed environment shipped with `spark.archives`. The ratio is the cluster's overhead, not a speed-up.",
        "",
        "| step | local[2] (s) | standalone (s) | standalone / local |",
        "| --- | ---: | ---: | ---: |",
    ]
    for label, key in rows:
        lo, cl = med("local[2]", key), med("standalone", key)
        lines.append(f"| {label} | {lo:.1f} | {cl:.1f} | {cl / lo:.2f} |" if lo else f"| {label} | {lo:.1f} | {cl:.1f} | - |")
    lines += ["", END]
    write_section(args.output, BEGIN, END, "\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
