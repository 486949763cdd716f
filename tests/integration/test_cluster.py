"""A Spark standalone cluster whose workers lack the project's packages: a master and two workers started with
`spark-class` on local ports, in an environment of their own (their PATH has no project virtualenv, their
Python is the system's, without pyarrow or tidewater, their TIDEWATER_HOME and working directory differ from
the driver's). The packed environment (`make executor-env`, `spark.python_env`) is shipped to them with
`spark.archives`; ingest, replay and maintenance run through them."""

from __future__ import annotations

import pytest

from tests.conftest import REPO, ingest_inline, write_pipeline
from tidewater.config.parse import load_pipeline
from tidewater.table.catalog import load_catalog, load_table
from tidewater.table.summary import committed_state
from tidewater_dev.cluster import BARE_PYTHON  # Debian's Python, none of the project's packages
from tidewater_dev.sample_data import pizza_events, produce

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PACK = REPO / ".data" / "executor-env.tar.gz"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    if not PACK.is_file():
        pytest.fail(f"{PACK} is missing: `make executor-env` builds it (make test does)")
    from tidewater_dev.cluster import start_standalone

    running = start_standalone(tmp_path_factory.mktemp("cluster"), workers=2, cores=1)
    yield running.master
    running.stop()


def test_ingest_replay_and_maintenance_run_on_workers_without_the_projects_packages(broker, home, topic, cluster):
    """Without the packed environment a batch fails on the workers (their Python lacks our packages) with a
    terminal error naming spark.python_env, and commits nothing; with `spark.python_env` the same batch lands
    with exact offsets, the tasks ran in the shipped interpreter, a replay of a range re-reads it through the
    workers (replace and append-missing), and compaction runs on the cluster."""
    from tidewater.errors import TerminalError
    from tidewater.ops.maintenance import maintain
    from tidewater.ops.replay import run_replay
    from tidewater.plan.replay import ReplayRequest
    from tidewater.steps.lifecycle import commit_step, plan_step, validate_step
    from tidewater.steps.write import run_write_step

    base = {
        "topics": [topic],
        "kafka": {"bootstrap_servers": broker.bootstrap},
        "maintenance": {"rewrite_data_files": {"min_input_files": 2}},
    }
    bare = load_pipeline(
        write_pipeline(
            home,
            name="bare",
            spark={"master": cluster, "conf": {"spark.pyspark.python": BARE_PYTHON}},
            table={"identifier": "rpc.bare"},
            **base,
        )
    )
    produce(broker.bootstrap, topic, pizza_events(60, seed=700), partitions=2)
    plan, path = plan_step(bare)
    with pytest.raises(TerminalError, match="spark.python_env: the executors' Python cannot import"):
        run_write_step(bare, path, master=cluster)
    failed = load_table(load_catalog(bare), "rpc.bare")
    assert failed is None or failed.current_snapshot() is None  # nothing committed (a table it made is undone)

    spec = load_pipeline(write_pipeline(home, spark={"master": cluster, "python_env": str(PACK)}, **base))
    plan, path = plan_step(spec)
    manifest = run_write_step(spec, path, master=cluster)
    pythons = {t.get("python") for t in manifest.task_timings}
    assert pythons and all(p and p.endswith("environment/bin/python") and str(REPO) not in p for p in pythons), pythons
    validate_step(spec, plan, manifest)
    commit_step(spec, plan, manifest)
    table = load_table(load_catalog(spec), spec.table.identifier)
    assert table.scan().to_arrow().num_rows == 60
    assert committed_state(table).offsets == {topic: {0: 30, 1: 30}}
    assert all(f["file_path"].startswith(f"file://{home}") for f in table.inspect.files().to_pylist())

    produce(broker.bootstrap, topic, pizza_events(20, seed=701), partitions=2)
    ingest_inline(spec)  # a second batch, so compaction has files to merge
    result = run_replay(spec, ReplayRequest(topic=topic, partitions=(0,), start_offset=0, end_offset=30), master=cluster, out=None)
    assert result["status"] == "committed" and result["rows"] == 30
    # append-missing: the offsets already held are read by the driver and sent with each task (executors never
    # read the staging directory, which may be the driver's local disk)
    missing = run_replay(
        spec, ReplayRequest(topic=topic, partitions=(1,), start_offset=0, end_offset=30, mode="append-missing"), master=cluster, out=None
    )
    assert missing["status"] == "committed" and (missing["rows"], missing["already_present"]) == (0, 30)
    [report] = maintain(spec, actions=["rewrite_data_files"], master=cluster)
    assert report.after.data_files < report.before.data_files
    table = load_table(load_catalog(spec), spec.table.identifier)
    assert table.scan().to_arrow().num_rows == 80 and committed_state(table).offsets == {topic: {0: 40, 1: 40}}
