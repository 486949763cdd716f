"""The 3-minute version of `make soak` (scripts/soak.py): Airflow's scheduler with the LocalExecutor on PostgreSQL
runs three pipelines (JSON appends through the Spark Connect server, a 10-table Debezium database in one routed
pipeline and Avro through a registry, both through spark-submit, all staged in the bucket) while producers feed them
and faults hit them. Everything is real except the bucket (moto's server), the stand-in for S3, which cannot run
here. The run's services are its own (its broker, PostgreSQL
and Connect server), since it kills and restarts some of them."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

FAULTS = {"kill_task", "kill_scheduler", "kill_connect", "catalog_lock", "outside_expire", "outside_compaction"}
OPERATIONS = {"maintain", "replay_avro", "replay_db", "quarantine_publish", "quarantine_drop"}


def test_three_minutes_of_production_with_faults_end_audited_clean_and_equal_to_the_source(tmp_path):
    """Every fault and operation happened while records kept coming; after the drain: `tidewater audit --deep` of
    each pipeline finds no discrepancy, every table equals the model of what was produced (the events less the
    dropped quarantined batch's, the readings, each source table row by row), every lag is 0, each quarantined batch's
    decision run succeeded and none waits, and the scheduler's and the Connect server's memory was sampled (judged
    flat or not only on runs of 20 minutes or more)."""
    work = tmp_path / "soak"
    env = {**os.environ, "PATH": f"{REPO / '.venv' / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "soak.py"), "--minutes", "3", "--work", str(work), "--drain-minutes", "15", "--keep"],
        env=env,
        capture_output=True,
        text=True,
        timeout=3000,
    )
    assert (work / "report.json").is_file(), proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((work / "report.json").read_text())
    assert report["failures"] == [] and proc.returncode == 0, report["failures"]
    done = {e["name"] for e in report["events"] if e["outcome"] == "done"}
    assert FAULTS | OPERATIONS <= done, sorted(FAULTS | OPERATIONS - done)
    assert sorted(report["quarantine"].values()) == ["drop", "publish"]
    # each decision applied: a decision Airflow failed after the answer leaves its batch waiting on its branch,
    # which no table's model can tell from a drop
    assert report["decisions"]["waiting"] == [], report["decisions"]
    assert {d["state"] for d in report["decisions"]["runs"].values()} == {"success"}, report["decisions"]
    assert len(report["decisions"]["runs"]) == len(report["quarantine"]) >= 2, report["decisions"]
    assert report["dropped_ranges"], "the dropped batch's ranges were read from its branch"
    for name, audit in report["audits"].items():
        assert (audit["exit"], audit["discrepancies"]) == (0, 0), (name, audit)
        assert audit["batches"] > 0, name
    assert set(report["tables"]) == {"rpc.soak_events", "rpc.soak_avro", *(f"rpc.soak_db_{i}" for i in range(10))}
    for table, check in report["tables"].items():
        assert check["equal"] and check["rows"] == check["expected"], (table, check)
    assert report["tables"]["rpc.soak_events"]["rows"] > 1000 and report["tables"]["rpc.soak_avro"]["rows"] > 500
    assert report["lag"] == {"soak_events": 0, "soak_db": 0, "soak_avro": 0}
    sampled = {s["process"] for s in report["rss_samples"]}
    assert sampled == {"scheduler", "spark-connect"}
    assert set(report["memory"]) == sampled
