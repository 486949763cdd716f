"""Tidewater installed as a user would install it, not from this checkout: the package is built (`python -m build`:
a wheel and an sdist), then installed into a fresh virtualenv with the tested pins (constraints.txt), first alone
(the command line, no Airflow), then with its `airflow` extra into the same virtualenv, as into an Airflow that
already runs: a DAGs folder holding only the two-line DAG file, a pipelines folder holding one pipeline, and no
plugins folder. The broker is the session's embedded one; nothing of this checkout is on the path.

Airflow's own constraint files (constraints-3.x.y/constraints-3.11.txt) are served from GitHub, which these machines
do not reach (only the package registries): the virtualenv takes Airflow's versions from constraints.txt, which pins
the Airflow release and providers that make test runs with, instead. The last test installs without any constraints,
as into an Airflow the user chose: Airflow 3.1 and 3.3 with the newest Spark provider, then the wheel (3.2 and
every other release of the range: `make install-check`, which `make release` runs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import pytest
import yaml
from packaging.version import Version

from tests.conftest import REPO
from tests.e2e.conftest import call_api, free_port, stop_group
from tidewater import __version__
from tidewater_dev.sample_data import pizza_events, produce

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

# the whole DAG file; the pipelines folder is TIDEWATER_PIPELINES_DIR, which the Tidewater view reads too
DIST = "airflow_provider_tidewater"  # the distribution's file-name form (PEP 427) of airflow-provider-tidewater
TWO_LINES = "from tidewater.runtime.airflow_dags import pipeline_dags\nglobals().update(pipeline_dags())\n"


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    """The wheel and the sdist `python -m build` makes of this checkout, built from a copy of it: setuptools writes
    `include/tidewater.egg-info` into the tree it builds, and in the checkout that second copy of the package's
    metadata made Airflow load the plugin's entry point twice ("Plugin 'tidewater' already registered": a plugin
    import error on every later test's Airflow home page)."""
    import shutil

    out = tmp_path_factory.mktemp("dist")
    src = tmp_path_factory.mktemp("src") / "tidewater"
    shutil.copytree(
        REPO,
        src,
        ignore=shutil.ignore_patterns(
            ".git", ".venv", ".data", "node_modules", "*.egg-info", "build", "__pycache__", ".pytest_cache", ".hypothesis"
        ),
    )
    proc = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--sdist", "--outdir", str(out), str(src)], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


def test_python_m_build_works_from_a_clean_clone_and_its_sdist_builds_the_wheel_without_npm(tmp_path):
    """`python -m build` in a fresh `git clone` (no `make setup`: no UI bundle, no node_modules) builds the UI bundle
    itself (setup.py, npm) into the sdist and the wheel; a wheel built from that sdist with no npm on the PATH carries
    the bundle too."""
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True, timeout=300)
    assert not (clone / "include" / "tidewater" / "runtime" / "ui_static").exists()
    out = tmp_path / "dist"
    proc = subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(clone)], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    bundle = "tidewater/runtime/ui_static/tidewater-ui.js"
    with zipfile.ZipFile(next(out.glob("*.whl"))) as z:
        assert bundle in z.namelist()
    sdist = next(out.glob("*.tar.gz"))
    with tarfile.open(sdist) as t:
        assert any(n.endswith(f"include/{bundle}") for n in t.getnames())
        assert not any("node_modules" in n for n in t.getnames())
        t.extractall(tmp_path / "unpacked", filter="data")
    src = next((tmp_path / "unpacked").iterdir())
    no_npm = {**_clean_env(), "PATH": str(Path(sys.executable).parent)}
    proc = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(tmp_path / "from-sdist"), str(src)],
        capture_output=True,
        text=True,
        timeout=900,
        env=no_npm,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with zipfile.ZipFile(next((tmp_path / "from-sdist").glob("*.whl"))) as z:
        assert bundle in z.namelist()


def _clean_env() -> dict[str, str]:
    """This process's environment without what would put this checkout (or its virtualenv) on a path."""
    return {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "VIRTUAL_ENV", "AIRFLOW_HOME", "TIDEWATER_HOME", "TIDEWATER_PIPELINES_DIR")
    }


def _pip(venv: Path, *args: str) -> None:
    proc = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "-q",
            "--no-compile",
            "--disable-pip-version-check",
            *args,
            "-c",
            str(REPO / "constraints.txt"),
        ],
        capture_output=True,
        text=True,
        timeout=1500,
        env=_clean_env(),
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_the_wheel_and_sdist_declare_the_dependencies_entry_points_and_package_data(dist):
    """The wheel's metadata lists the runtime dependencies (with ranges) and the extras; its entry points register the
    command, the Airflow plugin and the provider metadata; it and the sdist carry the view's page and the Spark
    entry point."""
    wheel = next(dist.glob(f"{DIST}-{__version__}-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        meta = z.read(f"{DIST}-{__version__}.dist-info/METADATA").decode()
        entry = z.read(f"{DIST}-{__version__}.dist-info/entry_points.txt").decode()
        license_text = z.read(f"{DIST}-{__version__}.dist-info/licenses/LICENSE").decode()
    requires = [ln.split(":", 1)[1].strip() for ln in meta.splitlines() if ln.startswith("Requires-Dist:")]
    core = {r.split("[")[0].split("<")[0].split(">")[0].split(";")[0].strip().lower() for r in requires if "extra ==" not in r}
    assert {"pyiceberg", "confluent-kafka", "great-expectations", "pyarrow", "fastavro", "pyyaml", "croniter"} <= core, core
    assert "pyspark" not in core  # the `spark` extra (below)
    assert any(r.startswith("apache-airflow<4,>=3.1") and 'extra == "airflow"' in r for r in requires), requires
    assert {"airflow", "spark", "spark-connect", "lineage", "s3", "dev"} <= {
        ln.split(":", 1)[1].strip() for ln in meta.splitlines() if ln.startswith("Provides-Extra:")
    }
    # a distribution of its own name (`tidewater` on the package index is another project), Apache-2.0, classified
    fields = [ln.split(":", 1) for ln in meta.splitlines() if ": " in ln and not ln.startswith(" ")]
    assert ("Name", " airflow-provider-tidewater") in [(k, v) for k, v in fields]
    assert ("License-Expression", " Apache-2.0") in [(k, v) for k, v in fields]
    assert "Framework :: Apache Airflow :: Provider" in meta and "Apache License" in license_text
    # Spark is an extra: the scheduler and the api-server need none (the Spark provider 6.x brings only its client)
    assert [r for r in meta.splitlines() if r.startswith("Requires-Dist: pyspark")] == [
        'Requires-Dist: pyspark<5,>=3.5; extra == "spark"',
        'Requires-Dist: pyspark[connect]<5,>=3.5; extra == "spark-connect"',
    ]
    assert "tidewater = tidewater.runtime.plugin:TidewaterPlugin" in entry
    assert "provider_info = tidewater.runtime.provider:get_provider_info" in entry
    assert "tidewater = tidewater.runtime.cli:entry" in entry
    shipped = {
        "tidewater/runtime/ui_page.html",
        "tidewater/runtime/spark_app/ingest_batch.py",
        "tidewater/runtime/airflow_dags.py",
        "tidewater/examples/pizzas.yaml",
        "tidewater/examples/pizzas.expectations.json",
        "tidewater/runtime/ui_static/tidewater-ui.js",  # the React apps' bundle, built by make setup
        "tidewater/runtime/ui_static/tidewater.svg",
    }  # the navigation entry's icon
    assert shipped <= names
    # the apps' sources (ui/, TypeScript) and build tools stay out
    assert not any("node_modules" in n or n.endswith((".ts", ".tsx")) or n.startswith("ui/") for n in names)
    # the checkout's development tools (embedded broker, PostgreSQL, clusters, sample data) stay out
    assert not any(n.startswith("tidewater_dev/") for n in names)
    sdist = next(dist.glob(f"{DIST}-{__version__}.tar.gz"))
    with tarfile.open(sdist) as t:
        inside = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    assert {f"include/{n}" for n in shipped} <= inside


def test_installed_alone_then_into_airflow_with_a_two_line_dag_file(dist, broker, tmp_path):
    """Alone with its `spark` extra (the package declares pyspark there only): `tidewater --version` is the
    package's, Airflow is absent, `init` writes the example from the wheel (which validates), `validate` and `run`
    (spark-submit from the installed pyspark, the Spark entry point from the wheel) commit 60 records once. With
    the `airflow` extra: `airflow dags list` shows the pipeline's ingest, replay, skip, audit, maintenance and quarantine DAGs from the
    two-line file; Airflow's providers and plugins managers report the package's provider and its plugin once, with
    no plugin import error; an ingest run commits the next 30 records exactly;
    the api-server, with no plugins folder, serves the Tidewater view's API."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300, env=_clean_env())
    wheel = next(dist.glob(f"{DIST}-*.whl"))
    _pip(venv, f"{wheel}[spark]")
    pipelines, home = tmp_path / "pipelines", tmp_path / "home"
    pipelines.mkdir()
    topic = f"install-{os.getpid()}"
    doc = {
        "name": "orders",
        "topics": [topic],
        "kafka": {"bootstrap_servers": broker.bootstrap},
        "table": {"identifier": "rpc.orders"},
        "validation": {"not_null": ["order_id"], "on_failure": "quarantine"},
        "spark": {"master": "local[2]"},
        "schedule": None,
    }
    path = pipelines / "orders.yaml"
    path.write_text(yaml.safe_dump(doc))
    env = _clean_env()
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", TIDEWATER_HOME=str(home))
    bin_ = venv / "bin"

    def run(*cmd: str, timeout: float = 600) -> subprocess.CompletedProcess:
        proc = subprocess.run(list(cmd), env=env, capture_output=True, text=True, timeout=timeout, cwd=tmp_path)
        assert proc.returncode == 0, f"{cmd}: {proc.stdout[-3000:]}{proc.stderr[-3000:]}"
        return proc

    assert run(str(bin_ / "tidewater"), "--version").stdout.strip() == f"tidewater {__version__}"
    assert subprocess.run([str(bin_ / "python"), "-c", "import airflow"], env=env, capture_output=True).returncode != 0
    where = run(str(bin_ / "python"), "-c", "import tidewater; print(tidewater.__file__)").stdout.strip()
    assert where.startswith(str(venv)), where  # the installed package, not this checkout's
    run(str(bin_ / "tidewater"), "validate", "--pipeline", str(path))
    run(str(bin_ / "tidewater"), "init", "--dir", str(tmp_path / "example"))  # the example and its suite, from the wheel
    dev = subprocess.run([str(bin_ / "tidewater"), "broker", "status"], env=env, capture_output=True, text=True, timeout=120)
    assert dev.returncode != 0 and "development tool of a Tidewater checkout" in dev.stderr, dev.stderr  # not shipped
    assert "ok (pipeline pizzas" in run(str(bin_ / "tidewater"), "validate", "--pipeline", str(tmp_path / "example" / "pizzas.yaml")).stdout
    produce(broker.bootstrap, topic, pizza_events(60, seed=360), partitions=2)
    run(str(bin_ / "tidewater"), "run", "--pipeline", str(path), timeout=900)
    assert _committed(bin_, env, path) == (60, 60, {"0": 30, "1": 30})

    _pip(venv, f"{wheel}[airflow]")
    dags, af, no_plugins = tmp_path / "dags", tmp_path / "airflow", tmp_path / "no-plugins"
    for d in (dags, af, no_plugins):
        d.mkdir()
    (dags / "tidewater_dags.py").write_text(TWO_LINES)
    env.update(
        TIDEWATER_PIPELINES_DIR=str(pipelines),
        AIRFLOW_HOME=str(af),
        AIRFLOW__CORE__DAGS_FOLDER=str(dags),
        AIRFLOW__CORE__PLUGINS_FOLDER=str(no_plugins),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW_CONN_TIDEWATER_SPARK='{"conn_type": "spark", "host": "local[2]"}',
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{af / 'airflow.db'}",
    )
    run(str(bin_ / "airflow"), "db", "migrate")
    run(str(bin_ / "airflow"), "dags", "reserialize")  # what the DAG processor does: the DAG file parsed into the database
    listed = run(str(bin_ / "airflow"), "dags", "list", "--output", "json").stdout
    table = [ln for ln in listed.splitlines() if ln.startswith("[{")]  # log lines share stdout
    dag_ids = {d["dag_id"] for d in json.loads(table[-1])} if table else set()
    assert {f"{k}_orders" for k in ("ingest", "replay", "skip", "audit", "maintain", "quarantine")} <= dag_ids, dag_ids
    from scripts.install_range import LOADED

    loaded = json.loads(run(str(bin_ / "python"), "-c", LOADED).stdout.strip().splitlines()[-1])
    assert loaded["provider"] and loaded["plugins"].count("tidewater") == 1 and loaded["plugin_errors"] == {}, loaded
    produce(broker.bootstrap, topic, pizza_events(30, seed=361), partitions=2)
    run(str(bin_ / "airflow"), "dags", "test", "ingest_orders", timeout=900)
    assert _committed(bin_, env, path) == (90, 90, {"0": 45, "1": 45})
    _view_served(bin_, env, tmp_path)


def _committed(bin_: Path, env: dict[str, str], path: Path) -> tuple[int, int, dict]:
    """(rows, distinct order ids, committed offsets of the one topic) as the installed package reads them."""
    code = (
        "import json, sys\nfrom tidewater.config.parse import load_pipeline\n"
        "from tidewater.table.catalog import load_catalog, load_table\nfrom tidewater.table.summary import committed_state\n"
        "spec = load_pipeline(sys.argv[1]); t = load_table(load_catalog(spec), spec.table.identifier)\n"
        "ids = t.scan().to_arrow().column('order_id').to_pylist()\n"
        "print(json.dumps([len(ids), len(set(ids)), list(committed_state(t).offsets.values())[0]]))\n"
    )
    proc = subprocess.run([str(bin_ / "python"), "-c", code, str(path)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows, distinct, offsets = json.loads(proc.stdout.strip().splitlines()[-1])
    return rows, distinct, offsets


def _view_served(bin_: Path, env: dict[str, str], tmp_path: Path) -> None:
    """The installed Airflow's api-server, with an empty plugins folder, serves the view's API to a signed-in user."""
    port = free_port()
    env = {**env, "AIRFLOW__API__PORT": str(port)}
    log = open(tmp_path / "api-server.log", "w")
    proc = subprocess.Popen(
        [str(bin_ / "airflow"), "api-server", "--port", str(port)], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                if call_api(f"{base}/api/v2/monitor/health")[0] == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline and proc.poll() is None, (tmp_path / "api-server.log").read_text()[-3000:]
            time.sleep(1)
        passwords = json.loads((Path(env["AIRFLOW_HOME"]) / "simple_auth_manager_passwords.json.generated").read_text())
        status, token = call_api(f"{base}/auth/token", body={"username": "admin", "password": passwords["admin"]})
        assert status in (200, 201), token
        status, listed = call_api(f"{base}/tidewater/api/pipelines", token["access_token"])
        assert status == 200 and [p["name"] for p in listed] == ["orders"], listed
        status, page = call_api(f"{base}/tidewater/", token["access_token"])
        assert status == 200 and "Tidewater" in page
    finally:
        stop_group(proc)
        log.close()


def test_the_wheel_installs_into_the_supported_airflows_without_moving_them(dist, tmp_path, broker):
    """The ends of the support range, as a user's Airflow has it (the minors between: `make install-check`, run by
    `make release`; scripts/install_range.py's SUITE_RELEASES says why): for each of the newest Airflow 3.1.x and 3.3.x, a fresh
    virtualenv gets Airflow and the newest Spark provider first, WITHOUT this project's constraints (Airflow's own
    constraint files are not reachable from these machines), then the wheel with its `airflow` extra (the
    scheduler's and api-server's install) and with `airflow,spark` (a worker's). Expected for every release: pip
    lowers no package either time, `pip check` passes, and Airflow loads the provider, the plugin and the
    pipeline's DAGs from the two-line DAG file (`scripts/install_range.py`, which `make install-check` runs). On the
    newest release an ingest run then writes 40 records through the Spark provider 6.x's SparkSubmitHook, with pip's
    pyspark pinned to the provider's `pyspark-client` release (`pip check` still passes), and commits them once."""
    from tidewater_dev.sample_data import pizza_events, produce

    topic = f"install-range-{os.getpid()}"
    produce(broker.bootstrap, topic, pizza_events(40, seed=362), partitions=2)
    import importlib.util

    loaded = importlib.util.spec_from_file_location("install_range", REPO / "scripts" / "install_range.py")
    install_range = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(install_range)
    wheel = next(dist.glob(f"{DIST}-*.whl"))
    failed, results = [], []
    artifacts = Path(os.environ.get("TIDEWATER_TEST_ARTIFACTS", REPO / ".data" / "test-artifacts"))
    artifacts.mkdir(parents=True, exist_ok=True)
    assert install_range.SUITE_RELEASES == (min(install_range.RELEASES, key=Version), max(install_range.RELEASES, key=Version))
    for release in install_range.SUITE_RELEASES:
        kafka = (broker.bootstrap, topic) if release == install_range.RELEASES[-1] else None
        r = install_range.check_release(release, wheel, tmp_path / release, kafka)
        results.append(r)  # what each release installed and loaded, kept for reading a failure or the docs
        (artifacts / "install-range.json").write_text(json.dumps(results, indent=1))
        if not (
            r["ok"]
            and str(r.get("spark_provider")).startswith("6.")
            and not r.get("downgraded")
            and r.get("provider")
            and r.get("plugin")
            and {"ingest_orders", "maintain_orders"} <= set(r.get("dags", []))
        ):
            failed.append(r)
        elif kafka and (r["batch"].get("rows"), r["batch"].get("offsets")) != (40, {topic: {"0": 20, "1": 20}}):
            failed.append(r)
    assert not failed, json.dumps(failed, indent=1)[-4000:]
    batch = results[-1]["batch"]
    assert batch["pyspark"] and batch["pyspark"].startswith("4.") and batch["pip_check"], batch
