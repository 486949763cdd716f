"""`make bench-data-docs`: what a batch's Data Docs page costs as the pipeline's history grows.

Each page is a validation result stored in the pipeline's great-expectations file data context plus
``build_data_docs`` for that result (its page and the site's index, which great-expectations builds from the
store). The store keeps the newest ``INDEX_ROWS`` results, so the cost should stop growing there. Renders
``--pages`` pages for one pipeline (three checks each, like the built-in ones) and reports the seconds per
page at points along the way. Writes a section of BENCHMARKS.md.
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

BEGIN, END = "<!-- data-docs:begin -->", "<!-- data-docs:end -->"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pages", type=int, default=500)
    ap.add_argument("--output", default=str(REPO / "BENCHMARKS.md"))
    args = ap.parse_args()
    home = fresh_home("bench-data-docs")
    sys.path.insert(0, str(REPO))
    import yaml

    from tidewater.batch import new_batch_id
    from tidewater.config.parse import load_pipeline
    from tidewater.quality import data_docs
    from tidewater.quality.gate import CheckResult, ValidationReport, import_great_expectations

    path = home / "docs.yaml"
    path.write_text(
        yaml.safe_dump(
            {"name": "docs", "topics": ["docs"], "table": {"identifier": "bench.docs"}, "kafka": {"bootstrap_servers": "127.0.0.1:9"}}
        )
    )  # no broker is used
    spec = load_pipeline(path)
    t = time.monotonic()
    import_great_expectations()
    imported = time.monotonic() - t
    seconds = []
    for i in range(args.pages):
        checks = (
            CheckResult("expect_table_row_count_to_equal", {"value": 1000}, True, {"observed_value": 1000}),
            CheckResult(
                "expect_column_values_to_not_be_null", {"column": "order_id"}, True, {"element_count": 1000, "unexpected_count": 0}
            ),
            CheckResult("accounting", {"read": 1000, "dead_letters": 0, "skipped": 0}, True),
        )
        report = ValidationReport(new_batch_id(), "docs.builtin", True, 1000, checks)
        data_docs.save_report(spec, report, "bench.docs")
        t = time.monotonic()
        page = data_docs.write_page(spec, report, "bench.docs")
        seconds.append(time.monotonic() - t)
        assert page is not None and page.is_file(), f"page {i} was not rendered"
        if (i + 1) % 100 == 0:
            print(f"{i + 1} pages", file=sys.stderr)

    fresh = {"after the run above": _fresh_process_page(path), "a pipeline with no history": _fresh_process_page(_other_pipeline(home))}

    def at(n: int) -> float:  # median seconds per page of the ten pages up to the n-th
        return statistics.median(seconds[max(0, n - 10) : n])

    points = [n for n in (10, 100, data_docs.INDEX_ROWS, 300, args.pages) if n <= args.pages]
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M")
    lines = [
        BEGIN,
        "## Data Docs page per batch",
        "",
        f"Produced by `{command_line('make bench-data-docs')}` on {when} (UTC): {args.pages} batches' pages rendered "
        "one after another into one pipeline's great-expectations file data context (store the validation result, "
        f"build its page and the site's index; the store keeps the newest {data_docs.INDEX_ROWS}). Importing "
        f"great-expectations once took {imported:.2f} s (the reason pages of built-in-only batches are rendered "
        "after the commit).",
        "",
        "| pages so far | seconds per page (median of the last 10) | vs the 10th |",
        "| ---: | ---: | ---: |",
    ]
    lines += [f"| {n} | {at(n):.3f} | {at(n) / at(points[0]):.2f} |" for n in points]
    first, second = fresh.values()
    lines += [
        "",
        "One page in a fresh process (as the DAG's data_docs task renders it; great-expectations' import not counted), median of 3:",
        "",
        "| pipeline | seconds per page |",
        "| --- | ---: |",
    ]
    lines += [f"| {k} | {v:.3f} |" for k, v in fresh.items()]
    lines += [
        "",
        f"Ratio, {args.pages} batches of history vs none, fresh processes: {first / second:.2f}. The cost grows "
        "with the results in the store (great-expectations builds the site's index from them) until the store's "
        "limit, then stays: a fresh process and a long-lived one pay the same.",
        "",
        END,
    ]
    write_section(args.output, BEGIN, END, "\n".join(lines))
    return 0


FRESH = """
import sys, time
sys.path.insert(0, {repo!r})
from tidewater.batch import new_batch_id
from tidewater.config.parse import load_pipeline
from tidewater.quality import data_docs
from tidewater.quality.gate import CheckResult, ValidationReport, import_great_expectations
import_great_expectations()
spec = load_pipeline({path!r})
checks = (CheckResult("expect_column_values_to_not_be_null", {{"column": "order_id"}}, True,
                      {{"element_count": 1000, "unexpected_count": 0}}),)
report = ValidationReport(new_batch_id(), "docs.builtin", True, 1000, checks)
data_docs.save_report(spec, report, "bench.docs")
t = time.monotonic()
assert data_docs.write_page(spec, report, "bench.docs") is not None
print(time.monotonic() - t)
"""


def _fresh_process_page(path: Path) -> float:
    """Seconds of one page rendered by a new Python process (median of 3)."""
    import subprocess

    code = FRESH.format(repo=str(REPO / "include"), path=str(path))
    times = [
        float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300).stdout.split()[-1])
        for _ in range(3)
    ]
    return statistics.median(times)


def _other_pipeline(home: Path) -> Path:
    import yaml

    path = home / "fresh.yaml"
    path.write_text(
        yaml.safe_dump(
            {"name": "fresh", "topics": ["docs"], "table": {"identifier": "bench.fresh"}, "kafka": {"bootstrap_servers": "127.0.0.1:9"}}
        )
    )
    return path


if __name__ == "__main__":
    raise SystemExit(main())
