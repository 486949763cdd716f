"""Shared pieces of the benchmark scripts: a fresh data directory, and replacing a marked section of
BENCHMARKS.md."""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def command_line(make_target: str) -> str:
    """How the benchmark was run, for the report (the make target when run by make)."""
    return make_target if os.environ.get("MAKELEVEL") else " ".join(["python", *sys.argv])


def fresh_home(name: str) -> Path:
    """An empty ``$TIDEWATER_HOME/<name>`` (sharing the repaired Iceberg jars), made the process's home."""
    work = Path(os.environ.get("TIDEWATER_HOME", REPO / ".data")) / name
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    if (REPO / ".data" / "jars").is_dir():
        (work / "jars").symlink_to(REPO / ".data" / "jars")
    os.environ["TIDEWATER_HOME"] = str(work)
    return work


def write_section(output: str | Path, begin: str, end: str, section: str) -> None:
    """Replace the text between ``begin`` and ``end`` in ``output`` (appended when the markers are missing)."""
    out = Path(output)
    text = out.read_text() if out.is_file() else ""
    if begin in text and end in text:
        text = text.split(begin)[0] + section + text.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    out.write_text(text)
    print(section)


def timed_batch(spec: Any, master: str, inline: bool = False) -> dict[str, Any]:
    """One batch through the real steps (plan, write, gate, commit), each timed. ``inline``: the write step's task
    code in this process instead of spark-submit."""
    from tidewater.batch import manifest_path, write_json_atomic
    from tidewater.plan.ingest import plan_batch
    from tidewater.source.kafka import kafka_settings
    from tidewater.steps.lifecycle import commit_step, validate_step
    from tidewater.steps.write import run_write_step
    from tidewater.write.job import run_inline

    t0 = time.monotonic()
    plan, path = plan_batch(spec)
    t1 = time.monotonic()
    if inline:
        manifest = run_inline(plan, spec, kafka_settings(spec))
        write_json_atomic(manifest_path(path), manifest.to_json())
    else:
        manifest = run_write_step(spec, path, master=master)
    t2 = time.monotonic()
    validate_step(spec, plan, manifest)
    t3 = time.monotonic()
    result = commit_step(spec, plan, manifest)
    t4 = time.monotonic()
    return {
        "records": manifest.records,
        "plan": t1 - t0,
        "write": t2 - t1,
        "data_path": manifest.data_path_seconds(),
        "validate": t3 - t2,
        "commit": t4 - t3,
        "total": t4 - t0,
        "result": result,
        "batch_id": plan.batch_id,
        "files": len(manifest.data_files) + sum(len(o.data_files) for o in manifest.outputs),
    }
