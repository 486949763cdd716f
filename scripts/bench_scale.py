"""`make bench-scale`: what Tidewater's costs do as a platform grows, each against its N, with the fixes' before
and after measured in the same run. Writes a section of BENCHMARKS.md and the chart docs/img/bench-scale.png.

Curves (each one's N in brackets, as run by default):

1. pipelines [1, 50, 200, 500]: the DAG file parsed as a task's start parses it (Airflow's parsing context naming
   the task's DAG) and as the DAG processor parses it (every DAG); before the parsing-context fix every task paid
   the processor's parse. The view's pipeline lookups: the navigation page asks for the list, then each pipeline's
   overview, every request looking its pipeline up; before, each lookup loaded every pipeline file (the page's
   file loads, N+1 times a folder load, are projected from the folder load measured here), now a file is loaded
   again only when it changed (the page's lookups measured).
3. history [10, 1000, 10000 snapshots] of one pipeline's table, one manifest a snapshot as batches leave it without
   maintenance, written directly (``write_history``; ``--history-build commits`` grows it through the commit
   primitive instead, quadratic): a small batch's plan and commit (inline write), the metadata file and the
   manifests; then the maintenance DAG's expiry and manifest rewrite, and the same batch again.
2. partitions of one topic [6, 100, 1000], 100,000 records a batch: one batch through the real steps (plan,
   spark-submit write on local[2], gate, commit) with short ranges packed into a task (now) and one task per
   partition (before, `batch.pack_ranges: false`): each step's time, the data files and bytes the batch commits.
4. dead letters of one pipeline [1,000, 100,000, 1,000,000], committed through the dead-letter commit's path in
   ten commits, the first commit's letters dropped through `tidewater dead-letters drop`: the counts by state that
   the view's pipeline page, `status`-like summaries and the audit read, kept by the commits (now) and counted from
   the tables (before); `dead-letters list` (its first 100 open letters, with the counts).
6. tables in one routed pipeline [10, 100, 500], 100,000 records a batch over six partitions: a routed batch
   (``routing.dynamic`` by store id, so every table is created by it), the same pipeline's next batch (its
   tables exist) and one table's batch of the same records, each through spark-submit on local[2].

The figures are kept in docs/img/bench-scale.json; a curve measured alone is merged into them by hand and the report
redrawn with ``--from-json docs/img/bench-scale.json``.

Each parse runs in a fresh interpreter (the DagBag's construction timed inside it, the interpreter's start and
Airflow's import left out); the median of ``--repeat`` runs is reported.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO / "include"))
sys.path.insert(0, str(REPO))

from scripts.benchlib import command_line, fresh_home, timed_batch, write_section  # noqa: E402

BEGIN, END = "<!-- scale:begin -->", "<!-- scale:end -->"
VIEW_PAGE = 50  # the navigation page's page (tidewater.runtime.ui.PAGE)
CHART = REPO / "docs" / "img" / "bench-scale.png"
FIGURES = REPO / "docs" / "img" / "bench-scale.json"  # the figures of the report in BENCHMARKS.md and the docs
PAGE = REPO / "docs" / "explanation" / "scale.md"  # the docs' page on scale: the same section, its chart beside it

PARSE = """
import json, sys, time
from airflow.dag_processing.dagbag import DagBag
t0 = time.perf_counter()
bag = DagBag(dag_folder=sys.argv[1])
print(json.dumps({"seconds": time.perf_counter() - t0, "dags": len(bag.dags), "errors": len(bag.import_errors)}))
"""


def pipeline_folder(folder: Path, n: int) -> None:
    """``n`` pipeline files (the pizza example, each its own name, topic and table), as tests/dags does."""
    folder.mkdir(parents=True, exist_ok=True)
    example = (REPO / "include" / "pipelines" / "pizzas.yaml").read_text()
    shutil.copy(REPO / "include" / "pipelines" / "pizzas.expectations.json", folder)
    for i in range(n):
        name = f"p{i:04d}"
        (folder / f"{name}.yaml").write_text(
            example.replace("name: pizzas", f"name: {name}")
            .replace("completed-pizzas", f"topic-{name}")
            .replace("rpc.pizzas", f"rpc.{name}")
        )


def parse_seconds(folder: Path, dag_id: str | None, repeat: int) -> tuple[float, int]:
    """(median seconds of the DagBag's construction, DAGs built) in fresh interpreters."""
    env = {**os.environ, "TIDEWATER_PIPELINES_DIR": str(folder)}
    env.pop("_AIRFLOW_PARSING_CONTEXT_DAG_ID", None)
    if dag_id:
        env["_AIRFLOW_PARSING_CONTEXT_DAG_ID"] = dag_id
    runs = []
    for _ in range(repeat):
        done = subprocess.run([sys.executable, "-c", PARSE, str(REPO / "dags")], env=env, capture_output=True, text=True, check=True)
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    assert all(r["errors"] == 0 for r in runs), runs
    return statistics.median(r["seconds"] for r in runs), runs[0]["dags"]


def view_lookups(folder: Path, n: int, repeat: int) -> tuple[float, float, float]:
    """(seconds to load every pipeline file once, seconds of the navigation page's N+1 lookups on a fresh view, and
    on a view that has shown the page before): the list, then one lookup per pipeline's overview, through the view's
    lookups (a file is loaded again only when it changed)."""
    from tidewater.config.parse import discover_pipelines, load_pipeline
    from tidewater.runtime import ui

    os.environ["TIDEWATER_PIPELINES_DIR"] = str(folder)

    def page() -> float:
        t0 = time.perf_counter()
        names = list(ui._pipelines())
        for name in names:
            ui._pipeline(name)
        assert len(names) == n
        return time.perf_counter() - t0

    load_all, cold, warm = [], [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for path in discover_pipelines():
            load_pipeline(path)
        load_all.append(time.perf_counter() - t0)
        ui._LOADED.clear()
        cold.append(page())
        warm.append(page())
    return statistics.median(load_all), statistics.median(cold), statistics.median(warm)


def pipelines_curve(work: Path, counts: list[int], repeat: int) -> list[dict]:
    rows = []
    for n in counts:
        folder = work / f"pipelines-{n}"
        pipeline_folder(folder, n)
        task, task_dags = parse_seconds(folder, "ingest_p0000", repeat)
        processor, dags = parse_seconds(folder, None, repeat)
        load_all, cold, warm = view_lookups(folder, n, repeat)
        rows.append(
            {
                "pipelines": n,
                "dags": dags,
                "task_dags": task_dags,
                "task_parse": task,
                "processor_parse": processor,
                "load_all": load_all,
                "page_before": (n + 1) * load_all,
                "page_after": cold,
                "page_warm": warm,
            }
        )
        print(rows[-1], flush=True)
    return rows


def view_api_curve(work: Path, counts: list[int], shown: int) -> list[dict]:
    """The navigation page's API against the pipelines in the folder, on the embedded broker (a topic of one partition
    a pipeline; the first ``shown`` pipelines, a page, ingested once so that their tables, ledger and letter counts
    exist). Before: the page asked for each pipeline's overview (a consumer and an admin client each). Now: a page of
    ``shown`` pipelines' lines (``tidewater.ops.pipelines.summaries``: one metadata and one offsets request per
    broker), and all N lines in one call for the broker part's growth."""
    from confluent_kafka.admin import AdminClient, NewTopic

    from tidewater.config.parse import discover_pipelines, load_pipeline
    from tidewater.ops.overview import overview
    from tidewater.ops.pipelines import summaries
    from tidewater_dev import broker as embedded
    from tidewater_dev.sample_data import pizza_events, produce

    rows = []
    b = embedded.start(log_path=work / "broker-view.log")
    os.environ["TIDEWATER_KAFKA_BOOTSTRAP"] = b.bootstrap
    try:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        names = [f"topic-p{i:04d}" for i in range(max(counts))]
        for i in range(0, len(names), 100):
            for fut in admin.create_topics([NewTopic(t, num_partitions=1, replication_factor=1) for t in names[i : i + 100]]).values():
                fut.result(timeout=60)
        folder = work / f"pipelines-{max(counts)}"
        pipeline_folder(folder, max(counts))
        specs = [load_pipeline(path) for path in discover_pipelines(folder)]
        for spec in specs[:shown]:
            produce(b.bootstrap, spec.topics[0], pizza_events(20, seed=len(rows)), partitions=1, create=False)
            timed_batch(spec, "local[1]", inline=True)
            produce(b.bootstrap, spec.topics[0], pizza_events(5, seed=1), partitions=1, create=False)
        for n in counts:
            mine = sorted(specs[:n], key=lambda s: s.name)
            t0 = time.perf_counter()
            for spec in mine:
                overview(spec, batches=1)
            t1 = time.perf_counter()
            page = summaries(mine[:shown])
            t2 = time.perf_counter()
            every = summaries(mine)
            t3 = time.perf_counter()
            assert all(line["error"] is None for line in every), [line for line in every if line["error"]][:3]
            assert all(line["lag"] == 5 for line in page), page[:3]
            rows.append({"pipelines": n, "shown": len(page), "api_before": t1 - t0, "api_page": t2 - t1, "api_all": t3 - t2})
            print(rows[-1], flush=True)
    finally:
        b.stop()
    return rows


def partitions_curve(work: Path, counts: list[int], records: int, master: str) -> list[dict]:
    import yaml

    from tidewater.config.parse import load_pipeline
    from tidewater.table.catalog import load_catalog, load_table
    from tidewater_dev import broker as embedded
    from tidewater_dev.sample_data import pizza_events, produce

    rows = []
    values = pizza_events(records, seed=1)
    b = embedded.start(log_path=work / "broker.log")
    try:
        for parts in counts:
            topic = f"scale-{parts}"
            produce(b.bootstrap, topic, values, partitions=parts)
            for packed in (False, True):
                name = f"p{parts}_{'packed' if packed else 'apart'}"
                path = work / f"{name}.yaml"
                path.write_text(
                    yaml.safe_dump(
                        {
                            "name": name,
                            "topics": [topic],
                            "table": {"identifier": f"bench.{name}"},
                            "schedule": None,
                            "kafka": {"bootstrap_servers": b.bootstrap},
                            "spark": {"master": master},
                            "batch": {"max_records": records, "pack_ranges": packed},
                        }
                    )
                )
                spec = load_pipeline(path)
                out = timed_batch(spec, master)
                snap = load_table(load_catalog(spec), spec.table.identifier).current_snapshot()
                props = snap.summary.additional_properties
                rows.append(
                    {
                        "partitions": parts,
                        "packed": packed,
                        "records": out["records"],
                        "plan": out["plan"],
                        "write": out["write"],
                        "validate": out["validate"],
                        "commit": out["commit"],
                        "total": out["total"],
                        "files": int(props["added-data-files"]),
                        "bytes": int(props["added-files-size"]),
                    }
                )
                print(rows[-1], flush=True)
    finally:
        b.stop()
    return rows


def add_history(spec, table_ident: str, n: int) -> None:
    """Grow the table's history by ``n`` snapshots through the commit primitive, each appending one row copied
    from the table with the newest snapshot's properties (offsets unchanged, a batch id of its own): the history a
    pipeline leaves, one manifest per commit, without paying a batch's read and write each time."""
    from tidewater.commit.primitive import Change, commit
    from tidewater.table.catalog import load_catalog, load_table
    from tidewater.table.summary import BATCH_ID, summary_dict

    catalog = load_catalog(spec)
    table = load_table(catalog, table_ident)
    row = table.scan(limit=1).to_arrow()
    keep = {k: v for k, v in summary_dict(table.current_snapshot()).items() if k.startswith("tidewater.")}
    for i in range(n):
        commit(
            catalog,
            table_ident,
            lambda _t, i=i: Change({**keep, BATCH_ID: f"bench-history-{i:06d}"}, rows=row),
            marker=None,
            what="bench history",
        )


def write_history(spec, table_ident: str, n: int) -> None:
    """Grow the table's history by ``n`` snapshots written directly (``direct_history.append_snapshots``), each
    carrying the newest snapshot's Tidewater properties with a batch id of its own (offsets unchanged): what a
    pipeline leaves without maintenance, built in O(n). Through the commit primitive each commit rewrites every
    earlier snapshot, so the build grows with the square of its length (``--history-build commits`` measures it)."""
    from direct_history import append_snapshots

    from tidewater.table.catalog import load_catalog, load_table
    from tidewater.table.summary import BATCH_ID, summary_dict

    catalog = load_catalog(spec)
    keep = {k: v for k, v in summary_dict(load_table(catalog, table_ident).current_snapshot()).items() if k.startswith("tidewater.")}
    append_snapshots(catalog, table_ident, n, lambda i: {**keep, BATCH_ID: f"bench-history-{i:06d}"})


def _metadata_bytes(table) -> int:
    from urllib.parse import urlparse

    return Path(urlparse(table.metadata_location).path).stat().st_size


def history_curve(work: Path, counts: list[int], master: str, build: str = "direct") -> list[dict]:
    """One pipeline's table with N snapshots: the plan and the commit of a small batch (inline write), the metadata
    file's size and the manifests of the current snapshot; then the maintenance DAG's expiry and manifest rewrite
    (``older_than_hours: 0``, as when the snapshots are old enough) and the same batch again."""
    import yaml

    from tidewater.config.parse import load_pipeline
    from tidewater.ops.maintenance import maintain
    from tidewater.table.catalog import load_catalog, load_table
    from tidewater_dev import broker as embedded
    from tidewater_dev.sample_data import pizza_events, produce

    rows = []
    b = embedded.start(log_path=work / "broker-history.log")
    try:
        for n in counts:
            topic, name = f"history-{n}", f"history{n}"
            path = work / f"{name}.yaml"
            path.write_text(
                yaml.safe_dump(
                    {
                        "name": name,
                        "topics": [topic],
                        "table": {"identifier": f"bench.{name}"},
                        "schedule": None,
                        "kafka": {"bootstrap_servers": b.bootstrap},
                        "spark": {"master": master},
                        "maintenance": {"expire_snapshots": {"older_than_hours": 0}},
                    }
                )
            )
            spec = load_pipeline(path)
            produce(b.bootstrap, topic, pizza_events(600, seed=3), partitions=6)
            timed_batch(spec, master, inline=True)  # the table and its first snapshot
            t0 = time.monotonic()
            (write_history if build == "direct" else add_history)(spec, spec.table.identifier, n - 1)
            built = time.monotonic() - t0
            row: dict = {"snapshots": n, "build": built, "built_by": build}
            for when in ("before", "after"):
                if when == "after":
                    t0 = time.monotonic()
                    maintain(spec, actions=["expire_snapshots", "rewrite_manifests"], master=master)
                    row["maintain"] = time.monotonic() - t0
                table = load_table(load_catalog(spec), spec.table.identifier)
                row[f"{when}_snapshots"] = len(table.snapshots())
                row[f"{when}_manifests"] = len(table.current_snapshot().manifests(table.io))
                row[f"{when}_metadata_bytes"] = _metadata_bytes(table)
                produce(b.bootstrap, topic, pizza_events(600, seed=4 if when == "before" else 5), partitions=6, create=False)
                out = timed_batch(spec, master, inline=True)
                row.update({f"{when}_plan": out["plan"], f"{when}_commit": out["commit"]})
            rows.append(row)
            print(row, flush=True)
    finally:
        b.stop()
    return rows


def routed_curve(work: Path, counts: list[int], records: int, master: str) -> list[dict]:
    """A routed pipeline's batch into N tables (``routing.dynamic`` on the store id, every table auto-created by
    the batch's commit) against one table's batch of the same records, both through spark-submit. The routed
    pipeline's second batch (its tables now exist) is timed too: the first pays for creating N tables."""
    import yaml

    from tidewater.config.parse import load_pipeline
    from tidewater_dev import broker as embedded
    from tidewater_dev.sample_data import pizza_events, produce

    rows = []
    b = embedded.start(log_path=work / "broker-routed.log")
    try:
        for n in counts:
            topic = f"routed-{n}"
            # every store id 1..n appears (the events favour stores 1-10), so the batch touches all n tables
            produce(b.bootstrap, topic, pizza_events(records, seed=6, stores=n), partitions=6)
            base = {
                "topics": [topic],
                "schedule": None,
                "kafka": {"bootstrap_servers": b.bootstrap},
                "spark": {"master": master},
                "batch": {"max_records": records},
            }
            one = {**base, "name": f"one{n}", "table": {"identifier": f"bench.one{n}"}}
            many = {
                **base,
                "name": f"routed{n}",
                "table": {},
                "routing": {"dynamic": True, "field": "store_id", "table_template": "store_{value}", "namespace": f"routed{n}"},
            }
            row: dict = {"tables": n}
            for key, doc in (("one", one), ("routed", many)):
                path = work / f"{doc['name']}.yaml"
                path.write_text(yaml.safe_dump(doc))
                out = timed_batch(load_pipeline(path), master)
                row.update({f"{key}_{k}": out[k] for k in ("plan", "write", "validate", "commit", "total")})
                row["records"] = out["records"]
                row[f"{key}_tables"] = len(out["result"].touched())
            produce(b.bootstrap, topic, pizza_events(records, seed=7, stores=n), partitions=6, create=False)
            out = timed_batch(load_pipeline(work / f"routed{n}.yaml"), master)
            row.update({f"again_{k}": out[k] for k in ("plan", "write", "validate", "commit", "total")})
            rows.append(row)
            print(row, flush=True)
    finally:
        b.stop()
    return rows


LETTER_COMMITS = 10  # the letters arrive in this many commits; the first one's are dropped


def letter_rows(spec, n: int, start: int, batch: str):
    """``n`` dead letters of ``spec`` (offsets from ``start``), vectorized: the dead-letter table's schema."""
    import pyarrow as pa

    from tidewater.table.own_tables import DEAD_LETTER_SCHEMA

    offsets = pa.array(range(start, start + n), pa.int64())
    value = b'{"order_id": null, "pizza": "margherita", "note": "' + b"x" * 120 + b'"}'
    cols = {
        "topic": pa.array(["letters"] * n),
        "partition": pa.array([0] * n, pa.int32()),
        "offset": offsets,
        "timestamp": pa.array([0] * n, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
        "key": pa.nulls(n, pa.binary()),
        "value": pa.array([value] * n, pa.binary()),
        "headers": pa.nulls(n, DEAD_LETTER_SCHEMA.field("headers").type),
        "error_class": pa.array(["NotNullViolation"] * n),
        "error_message": pa.array(["order_id is null"] * n),
        "batch_id": pa.array([batch] * n),
        "pipeline": pa.array([spec.name] * n),
    }
    return pa.table(cols, schema=DEAD_LETTER_SCHEMA)


def add_letters(spec, n: int) -> None:
    """Commit ``n`` letters in chunks, each commit keeping the counts as ``commit/dead_letters.py`` does."""
    from tidewater.commit.primitive import Change, commit
    from tidewater.table.catalog import load_catalog
    from tidewater.table.letters import totals_after
    from tidewater.table.own_tables import ensure_dead_letter_table
    from tidewater.table.summary import BATCH_ID, PIPELINE

    catalog = load_catalog(spec)
    ensure_dead_letter_table(catalog, spec)
    chunk = max(n // LETTER_COMMITS, 1)
    for i, start in enumerate(range(0, n, chunk)):
        rows = letter_rows(spec, min(chunk, n - start), start, f"bench-{i:04d}")
        commit(
            catalog,
            spec.dead_letter_table(),
            lambda t, rows=rows, i=i: Change(
                {BATCH_ID: f"bench-{i:04d}", PIPELINE: spec.name}, rows=rows, set_properties=totals_after(t, spec.name, rows.num_rows)
            ),
            marker=f"bench-{i:04d}",
            what="bench letters",
        )


def letters_curve(work: Path, counts: list[int], repeat: int) -> list[dict]:
    import yaml

    from tidewater.config.parse import load_pipeline
    from tidewater.ops import dead_letters
    from tidewater.table import letters as state
    from tidewater.table.catalog import load_catalog

    def timed(f) -> tuple[float, object]:
        times, out = [], None
        for _ in range(repeat):
            t0 = time.perf_counter()
            out = f()
            times.append(time.perf_counter() - t0)
        return statistics.median(times), out

    rows = []
    for n in counts:
        path = work / f"letters{n}.yaml"
        path.write_text(
            yaml.safe_dump(
                {
                    "name": f"letters{n}",
                    "topics": ["letters"],
                    "schedule": None,
                    "table": {"identifier": f"bench.letters{n}"},
                    "kafka": {"bootstrap_servers": "127.0.0.1:9"},
                }
            )
        )  # never asked
        spec = load_pipeline(path)
        add_letters(spec, n)
        dead_letters.drop(spec, reason="bench: one batch's letters given up", batch="bench-0000", by="bench")
        catalog = load_catalog(spec)
        before, scanned = timed(lambda spec=spec, catalog=catalog: state.scanned(spec, catalog))
        after, kept = timed(lambda spec=spec, catalog=catalog: state.counts(spec, catalog))
        assert kept == scanned, (kept, scanned)
        listing, _ = timed(lambda spec=spec, catalog=catalog: state.listing(spec, catalog, limit=100))
        rows.append(
            {
                "letters": n,
                "counts_before": before,
                "counts_after": after,
                "listing": listing,
                "dropped": kept["dropped"],
                "open": kept["open"],
            }
        )
        print(rows[-1], flush=True)
    return rows


def _panel(ax, x: list, curves: list[tuple[list, str, str]], xlabel: str, ylabel: str, title: str) -> None:
    """One log-log panel: each curve (values, line style, label) against ``x``."""
    for values, style, label in curves:
        ax.plot(x, values, style, label=label)
    ax.set(xscale="log", yscale="log", xlabel=xlabel, ylabel=ylabel, title=title)
    ax.legend(fontsize=8)


def chart(pipes: list[dict], parts: list[dict], letters: list[dict], routed: list[dict], history: list[dict], view: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(18, 8.4))
    axes = [axes[0][0], axes[0][1], axes[0][2], axes[1][0], axes[1][1], axes[1][2]]
    if pipes:
        n = [r["pipelines"] for r in pipes]
        _panel(
            axes[0],
            n,
            [
                ([r["processor_parse"] for r in pipes], "o--", "task start, before (= the DAG processor's parse)"),
                ([r["task_parse"] for r in pipes], "o-", "task start, now (parsing context)"),
            ],
            "pipelines in the folder",
            "seconds",
            "Parsing the DAG file",
        )
        _panel(
            axes[1],
            n,
            [
                ([r["page_before"] for r in pipes], "o--", "before (projected: N+1 folder loads)"),
                ([r["page_after"] for r in pipes], "o-", "now, a fresh view (each file loaded once)"),
                ([r["page_warm"] for r in pipes], "o-", "now, the page shown again"),
            ],
            "pipelines",
            "seconds",
            "Navigation page: pipeline lookups",
        )
    if view:
        n = [r["pipelines"] for r in view]
        _panel(
            axes[1],
            n,
            [
                ([r["api_before"] for r in view], "s--", "API before: an overview per pipeline"),
                ([r["api_page"] for r in view], "s-", f"API now: a page ({view[-1]['shown']} pipelines)"),
                ([r["api_all"] for r in view], "s:", "API now: every pipeline's line at once"),
            ],
            "pipelines",
            "seconds",
            "Navigation page: lookups and API",
        )
    if parts:
        apart, packed = ([r for r in parts if r["packed"] == k] for k in (False, True))
        _panel(
            axes[2],
            [r["partitions"] for r in packed],
            [([r["files"] for r in apart], "o--", "a task per partition (before)"), ([r["files"] for r in packed], "o-", "packed (now)")],
            "partitions of the topic",
            "data files a batch commits",
            "Files per batch",
        )
    if letters:
        _panel(
            axes[3],
            [r["letters"] for r in letters],
            [
                ([r["counts_before"] for r in letters], "o--", "counted from the tables (before)"),
                ([r["counts_after"] for r in letters], "o-", "kept by the commits (now)"),
                ([r["listing"] for r in letters], "o:", "dead-letters list (100 letters)"),
            ],
            "dead letters of the pipeline",
            "seconds",
            "Dead-letter counts by state",
        )
    if routed:
        _panel(
            axes[4],
            [r["tables"] for r in routed],
            [
                ([r["one_total"] for r in routed], "o--", "one table, the same records"),
                ([r["routed_total"] for r in routed], "o-", "routed, first batch (creates the tables)"),
                ([r["again_total"] for r in routed], "o:", "routed, next batch"),
            ],
            "tables in the routed pipeline",
            "seconds a batch",
            "One routed pipeline, N tables",
        )
    if history:
        _panel(
            axes[5],
            [r["snapshots"] for r in history],
            [
                ([r["before_plan"] for r in history], "o--", "plan, no maintenance"),
                ([r["before_commit"] for r in history], "s--", "commit, no maintenance"),
                ([r["after_plan"] for r in history], "o-", "plan, after maintenance"),
                ([r["after_commit"] for r in history], "s-", "commit, after maintenance"),
            ],
            "snapshots of the table",
            "seconds",
            "History: plan and commit",
        )
    fig.tight_layout()
    CHART.parent.mkdir(exist_ok=True)
    fig.savefig(CHART, dpi=90)


def section(cmd: str, run: dict, chart_path: str) -> str:
    pipes, parts, letters, routed = run["pipelines"], run["partitions"], run.get("letters", []), run.get("routed", [])
    history = run.get("history", [])
    cores, day = run["cores"], run["day"]
    lines = [
        BEGIN,
        "## Platform scale (`make bench-scale`)",
        "",
        f"Command: `{cmd}` ({day}, {cores} cores).",
        "",
        f"![costs against their N]({chart_path})",
        "",
    ]
    if pipes:
        one = pipes[0]
        lines += [
            "### 1. Pipelines in one folder",
            "",
            "| pipelines | DAGs | task start: parse now (DAGs built) | before = the DAG processor's parse | "
            "now / 1 pipeline | view: folder load | navigation page lookups before (projected) | now | "
            "shown again |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in pipes:
            lines.append(
                f"| {r['pipelines']} | {r['dags']} | {r['task_parse']:.2f} s ({r['task_dags']}) | "
                f"{r['processor_parse']:.2f} s | {r['task_parse'] / one['task_parse']:.2f}x | "
                f"{r['load_all']:.2f} s | {r['page_before']:.1f} s | {r['page_after']:.2f} s | "
                f"{r['page_warm']:.2f} s |"
            )
        last = pipes[-1]
        lines += [
            "",
            f"A task's parse at {last['pipelines']} pipelines is {last['task_parse'] / one['task_parse']:.2f}x "
            f"one pipeline's (before: {last['processor_parse'] / one['processor_parse']:.1f}x, the whole folder "
            "built for every task). The DAG processor still builds every DAG, so its parse grows with the "
            "folder: that is Airflow's own cost, once per parse interval, not once per task. The navigation page "
            "looked every file up again for each pipeline's overview (quadratic); now the list loads each file once "
            "while unchanged and each overview looks up the one file named after its pipeline, so a fresh view's "
            "page costs one folder load and a page shown again one look at each file's modification time.",
            "",
        ]
        lines += _view_lines(run.get("view_api", []))
    if parts:
        lines += [
            f"### 2. Partitions of one topic, {parts[0]['records']:,} records a batch (spark-submit, local[2])",
            "",
            "| partitions | tasks | plan | write | gate | commit | batch | data files | MB |",
            "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in parts:
            lines.append(
                f"| {r['partitions']} | {'packed' if r['packed'] else 'one per partition'} | {r['plan']:.2f} s | "
                f"{r['write']:.1f} s | {r['validate']:.2f} s | {r['commit']:.2f} s | {r['total']:.1f} s | "
                f"{r['files']} | {r['bytes'] / 1e6:.2f} |"
            )
        big = [r for r in parts if r["partitions"] == max(p["partitions"] for p in parts)]
        apart, packed = (next(r for r in big if r["packed"] == k) for k in (False, True))
        lines += [
            "",
            f"At {apart['partitions']} partitions one task per partition wrote {apart['files']} files "
            f"({apart['bytes'] / 1e6:.1f} MB) for {apart['records']:,} records; packed, {packed['files']} "
            f"({packed['bytes'] / 1e6:.1f} MB), and the batch took {packed['total'] / apart['total']:.2f}x the "
            "time. Files now grow with the data and the write's parallelism, not the partitions; plan and commit "
            "still grow with the partitions (one watermark and one offset per partition).",
            "",
        ]
    if history:
        lines += _history_lines(history)
    if letters:
        lines += [
            "### 4. Dead letters of one pipeline",
            "",
            "| letters | open / dropped | counts by state: counted (before) | kept (now) | now / before | `dead-letters list` (100) |",
            "|---:|---:|---:|---:|---:|---:|",
        ]
        for r in letters:
            lines.append(
                f"| {r['letters']:,} | {r['open']:,} / {r['dropped']:,} | {r['counts_before']:.3f} s | "
                f"{r['counts_after']:.3f} s | {r['counts_after'] / r['counts_before']:.3f}x | "
                f"{r['listing']:.2f} s |"
            )
        first, last = letters[0], letters[-1]
        lines += [
            "",
            f"Counting the letters by state read every letter and every resolution: "
            f"{last['counts_before'] / first['counts_before']:.0f}x from {first['letters']:,} to "
            f"{last['letters']:,} letters. The commits that add letters and record what became of them now keep "
            "the counts in two table properties, checked against the tables' row counts, so the view's pipeline "
            f"page and the audit read them in {last['counts_after'] / first['counts_after']:.1f}x the time across "
            "the same range. `dead-letters list` still reads every matching letter: it sorts them by topic, "
            "partition and offset before it shows the first ones, and it is an operator's request, not the "
            "page's refresh.",
            "",
        ]
    if routed:
        lines += _routed_lines(routed)
    lines.append(END)
    return "\n".join(lines)


def _view_lines(view: list[dict]) -> list[str]:
    """The navigation page's API: an overview per pipeline (before) against a page of lines (now)."""
    if not view:
        return []
    last = view[-1]
    out = [
        f"Command: `{last['command']}` ({last['day']})." if last.get("command") else "",
        "",
        "The navigation page's API on the embedded broker (`view_api_curve`: a one-partition topic a pipeline, the "
        f"first {last['shown']} ingested once):",
        "",
        "| pipelines | before: an overview per pipeline | now: the first page | now / before | every line at once |",
        "|---:|---:|---:|---:|---:|",
    ]
    out += [
        f"| {r['pipelines']} | {r['api_before']:.2f} s | {r['api_page']:.2f} s ({r['shown']}) | "
        f"{r['api_page'] / r['api_before']:.2f}x | {r['api_all']:.2f} s |"
        for r in view
    ]
    out += [
        "",
        f"At {last['pipelines']} pipelines the page's API takes {last['api_page']:.2f} s where the overviews took "
        f"{last['api_before']:.1f} s. The page asks the broker once for its metadata and once for the offsets of "
        "every partition on the page, then reads each pipeline's own table metadata (offsets, the kept dead-letter "
        "counts, the ledger's last verdict), so it grows with the page, not with the folder.",
        "",
    ]
    return out


def _history_lines(history: list[dict]) -> list[str]:
    lines = ["### 3. History of one table (a small batch, inline write)", ""]
    if history[0].get("command"):
        lines += [f"Command: `{history[0]['command']}` ({history[0]['day']}).", ""]
    lines += [
        "| snapshots | manifests | metadata file | plan | commit | after maintenance: snapshots | manifests | "
        "metadata file | plan | commit | maintenance |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in history:
        lines.append(
            f"| {r['before_snapshots']:,} | {r['before_manifests']:,} | {r['before_metadata_bytes'] / 1e3:.0f} kB | "
            f"{r['before_plan']:.2f} s | {r['before_commit']:.2f} s | {r['after_snapshots']} | "
            f"{r['after_manifests']} | {r['after_metadata_bytes'] / 1e3:.0f} kB | {r['after_plan']:.2f} s | "
            f"{r['after_commit']:.2f} s | {r['maintain']:.0f} s |"
        )
    first, last = history[0], history[-1]
    lines += [
        "",
        f"From {first['before_snapshots']:,} to {last['before_snapshots']:,} snapshots without maintenance, "
        f"the plan took {last['before_plan'] / first['before_plan']:.1f}x and the commit "
        f"{last['before_commit'] / first['before_commit']:.1f}x: every commit writes a metadata file holding every "
        f"snapshot ({last['before_metadata_bytes'] / 1e6:.1f} MB at {last['before_snapshots']:,}) and a manifest "
        "list naming every manifest (one a commit), and every load reads the metadata file. After the "
        f"maintenance DAG's expiry and manifest rewrite the table had {last['after_snapshots']} snapshots and "
        f"{last['after_manifests']} manifest(s), and the plan and commit took "
        f"{last['after_plan'] / first['after_plan']:.1f}x and {last['after_commit'] / first['after_commit']:.1f}x "
        "those at the smallest history. What bounds the history is the maintenance default: snapshots older "
        "than `maintenance.expire_snapshots.older_than_hours` (120) are expired, keeping `retain_last` (10); on "
        "a one-minute schedule that is about 7,200 snapshots a table, so a platform on short schedules should "
        "lower it (a day keeps 1,440) and run the maintenance DAG daily. " + _history_build(last),
        "",
    ]
    return lines


def _history_build(last: dict) -> str:
    if last.get("built_by") == "direct":
        return (
            "The history was written directly (`scripts/direct_history.py`: a manifest and a manifest list a "
            "snapshot, each with a real batch's snapshot properties, and one metadata file: "
            f"{last['build']:.0f} s for {last['before_snapshots']:,} snapshots), since through commits building it "
            "grows with the square of its length (each commit rewrites the whole metadata file; this run's commit "
            "time at each history is in the table above). "
            "The older snapshots' manifest lists name only their own manifest, so the maintenance time at the "
            "largest history is a lower bound; the plan and the commit read the current snapshot, as on a real "
            "history."
        )
    return (
        "The history was built with a real batch's snapshot properties and one appended row a commit, not by "
        f"batches; even so building it grows with the square of its length ({last['build']:.0f} s for "
        f"{last['before_snapshots']:,} snapshots here), since each commit rewrites the whole metadata file."
    )


def _routed_lines(routed: list[dict]) -> list[str]:
    lines = [
        f"### 6. Tables in one routed pipeline, {routed[0]['records']:,} records a batch (spark-submit, local[2])",
        "",
        "| tables | one table: batch | routed, first batch (creates them) | plan / write / commit | ratio | "
        "routed, next batch | plan / write / commit | ratio |",
        "|---:|---:|---:|---|---:|---:|---|---:|",
    ]
    if routed[0].get("command"):  # measured in a run of its own, merged into the figures
        lines[1:1] = ["", f"Command: `{routed[0]['command']}` ({routed[0]['day']})."]
    for r in routed:
        lines.append(
            f"| {r['tables']} | {r['one_total']:.1f} s | {r['routed_total']:.1f} s | {r['routed_plan']:.2f} / "
            f"{r['routed_write']:.1f} / {r['routed_commit']:.1f} s | {r['routed_total'] / r['one_total']:.2f}x | "
            f"{r['again_total']:.1f} s | {r['again_plan']:.2f} / {r['again_write']:.1f} / "
            f"{r['again_commit']:.1f} s | {r['again_total'] / r['one_total']:.2f}x |"
        )
    last = routed[-1]
    lines += [
        "",
        f"At {last['tables']} tables a routed batch took {last['again_total'] / last['one_total']:.2f}x one "
        f"table's batch of the same records ({last['routed_total'] / last['one_total']:.2f}x for the first, which "
        "creates the tables). What grows with the tables is the commit (one Iceberg commit per table: its "
        "metadata file, manifest list and manifest, and the catalog's row) and the write's files (at least one "
        "per table the task saw); the plan does not. Read the ratios: a row's three batches ran back to back, "
        "while the rows ran minutes apart on a shared machine.",
        "",
    ]
    return lines


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pipelines", default="1,50,200,500", help="pipeline counts (empty: skip the curve)")
    ap.add_argument("--view", default="1,50,200,500", help="pipelines for the navigation page's API (empty: skip)")
    ap.add_argument("--partitions", default="6,100,1000", help="partition counts (empty: skip the curve)")
    ap.add_argument("--letters", default="1000,100000,1000000", help="dead-letter counts (empty: skip the curve)")
    ap.add_argument("--history", default="10,1000,10000", help="snapshots of the history curve (empty: skip it)")
    ap.add_argument(
        "--history-build",
        choices=("direct", "commits"),
        default="direct",
        help="how the history is grown: snapshots written directly (O(n), write_history) or through the "
        "commit primitive (what a pipeline does; quadratic in the history's length)",
    )
    ap.add_argument("--tables", default="10,100,500", help="tables of the routed pipeline (empty: skip the curve)")
    ap.add_argument("--records", type=int, default=100_000, help="records a batch in the partitions curve")
    ap.add_argument("--repeat", type=int, default=3, help="runs per parse measurement (median)")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--output", default=str(REPO / "BENCHMARKS.md"))
    ap.add_argument("--from-json", help="draw and write the report from a run's figures (its rows.json), measuring nothing")
    args = ap.parse_args(argv)
    if args.from_json:
        run = json.loads(Path(args.from_json).read_text())
    else:
        work = fresh_home("bench-scale")
        counts = [int(x) for x in args.pipelines.split(",") if x]
        pipes = pipelines_curve(work, counts, args.repeat) if counts else []
        counts = [int(x) for x in args.view.split(",") if x]
        view = view_api_curve(work, counts, VIEW_PAGE) if counts else []
        for row in view:
            row.update(command=command_line("make bench-scale"), day=time.strftime("%Y-%m-%d", time.gmtime()))
        counts = [int(x) for x in args.partitions.split(",") if x]
        parts = partitions_curve(work, counts, args.records, args.master) if counts else []
        counts = [int(x) for x in args.letters.split(",") if x]
        letters = letters_curve(work, counts, args.repeat) if counts else []
        counts = [int(x) for x in args.history.split(",") if x]
        history = history_curve(work, counts, args.master, args.history_build) if counts else []
        for row in history:
            row.update(command=command_line("make bench-scale"), day=time.strftime("%Y-%m-%d", time.gmtime()))
        counts = [int(x) for x in args.tables.split(",") if x]
        routed = routed_curve(work, counts, args.records, args.master) if counts else []
        for row in routed:
            row.update(command=command_line("make bench-scale"), day=time.strftime("%Y-%m-%d", time.gmtime()))
        run = {
            "command": command_line("make bench-scale"),
            "cores": os.cpu_count() or 0,
            "day": time.strftime("%Y-%m-%d", time.gmtime()),
            "pipelines": pipes,
            "view_api": view,
            "partitions": parts,
            "letters": letters,
            "routed": routed,
            "history": history,
        }
        (work / "rows.json").write_text(json.dumps(run, indent=1))
        FIGURES.write_text(json.dumps(run, indent=1))  # kept beside the chart: --from-json redraws it
    chart(
        run["pipelines"], run["partitions"], run.get("letters", []), run.get("routed", []), run.get("history", []), run.get("view_api", [])
    )
    for output, image in ((args.output, "docs/img/bench-scale.png"), (PAGE, "../img/bench-scale.png")):
        write_section(output, BEGIN, END, section(run["command"], run, image))


if __name__ == "__main__":
    main()
