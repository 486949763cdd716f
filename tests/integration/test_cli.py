"""The command line as people use it: subprocesses of the installed `tidewater` command against the real
broker, catalog and (for maintenance) Spark."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ingest_inline, produce_to_partition, write_pipeline
from tidewater import __version__
from tidewater.config.parse import load_pipeline
from tidewater.dev.sample_data import pizza_events

pytestmark = [pytest.mark.integration]
TIDEWATER = str(Path(sys.executable).parent / "tidewater")


def cli(home: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([TIDEWATER, *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TIDEWATER_HOME": str(home)})


def test_version(home):
    proc = cli(home, "--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"tidewater {__version__}"


def test_run_json_prints_only_the_json_document_on_stdout(broker, home, topic):
    """Progress goes to standard error: `tidewater run --json`'s standard output parses as JSON."""
    path = write_pipeline(home, topics=[topic], kafka={"bootstrap_servers": broker.bootstrap})
    produce_to_partition(broker.bootstrap, topic, 0, pizza_events(3, seed=90))
    ingest_inline(load_pipeline(path))
    proc = cli(home, "run", "--pipeline", str(path), "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout) == {"status": "empty", "batch_id": None, "records": 0}
    assert "[1/4] plan" in proc.stderr


def test_maintain_and_replay_dry_runs_show_each_line_once(broker, home, topic):
    """The maintenance report and the replay preview are printed by the command and not logged a second time."""
    path = write_pipeline(home, topics=[topic], kafka={"bootstrap_servers": broker.bootstrap},
                          format={"metadata": "prefixed"})
    produce_to_partition(broker.bootstrap, topic, 0, pizza_events(8, seed=91))
    ingest_inline(load_pipeline(path))
    maintain = cli(home, "maintain", "--pipeline", str(path), "--actions", "rewrite_manifests", "--dry-run",
                   "--master", "local[1]")
    assert maintain.returncode == 0, maintain.stderr[-2000:]
    both = maintain.stdout + maintain.stderr
    assert both.count("rewrite_manifests on rpc.orders (dry run)") == 1
    replay = cli(home, "replay", "--pipeline", str(path), "--topic", topic, "--start-offset", "0", "--end-offset", "5",
                 "--dry-run")
    assert replay.returncode == 0, replay.stderr[-2000:]
    both = replay.stdout + replay.stderr
    assert both.count(f"{topic}[0] [0, 5)") == 1 and "dry run: nothing changed" in replay.stdout
