"""`make install-check`: the package installed into Airflows it did not choose, as a user's deployment has them.

For each Airflow release given (default: the newest 3.1.x, 3.2.x and 3.3.x the package index serves), in a fresh
virtualenv and WITHOUT this project's constraints file (Airflow's own constraint files are served from GitHub, which
these machines do not reach):
1. Airflow and the newest Spark provider the package supports are installed first, as the user's Airflow;
2. the wheel of this checkout (`python -m build`) is installed into it with its `airflow` extra (the scheduler's, DAG
   processor's and api-server's install), then with `airflow,spark` (a worker's: Spark from pip's pyspark);
3. every package whose version either install lowered is a downgrade, and `pip check` must pass;
4. Airflow then loads what the package registers, as its providers and plugins managers report it: the provider, the
   plugin (once, with no plugin import error), and the DAGs of a two-line DAG file over one pipeline file (`airflow
   dags list`, after `airflow db migrate` and `airflow dags reserialize` on SQLite);
5. given a broker and a topic (`make test` gives them for the newest release), an ingest run (`airflow dags test`)
   writes through the installed Spark provider's SparkSubmitHook with pip's pyspark pinned to the provider's
   `pyspark-client` release, and commits.

Each release takes about two minutes (pip resolving Airflow's whole dependency tree). `make test` runs the same
check on the oldest and the newest release (``SUITE_RELEASES``, `tests/e2e/test_install.py`, one after the other
beside the rest of the suite); this script runs every release on its own, two at a time, and `make release` runs it
before it cuts a release. It prints one line per release and writes the figures as JSON
(``--output``); exits 1 when any release fails.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RELEASES = ("3.1.8", "3.2.2", "3.3.2")  # the newest 3.1.x, 3.2.x and 3.3.x on the package index (2026-11-28)
# make test's share of the range (tests/e2e/test_install.py): the oldest minor, the floor the package declares
# (apache-airflow>=3.1), and the newest, which also runs a batch; each release costs the suite about three minutes
# of one core on pip and Airflow's start. The minors between are checked here, by `make install-check`, which
# `make release` runs first.
SUITE_RELEASES = (RELEASES[0], RELEASES[-1])
SPARK_PROVIDER = "apache-airflow-providers-apache-spark"  # the newest: 6.x brings pyspark-client 4, not pyspark
# What Airflow itself reports it loaded (its providers manager and plugins manager), as JSON on the last line: the
# package's provider and version, the plugins by name (the view's plugin must be there once) and the plugin import
# errors (the home page's "Plugin Import Error" count)
LOADED = """
import json
from airflow import plugins_manager as pm
from airflow.providers_manager import ProvidersManager
names = [p["name"] for p in pm.get_plugin_info()]
errors = pm.get_import_errors() if hasattr(pm, "get_import_errors") else dict(getattr(pm, "import_errors", None) or {})
provider = ProvidersManager().providers.get("airflow-provider-tidewater")
print(json.dumps({"provider": provider.version if provider else None, "plugins": names, "plugin_errors": errors}))
"""

TWO_LINES = "from tidewater.runtime.airflow_dags import pipeline_dags\nglobals().update(pipeline_dags())\n"
PIPELINE = (
    "name: orders\ntopics: [{topic}]\nkafka: {{bootstrap_servers: '{bootstrap}'}}\ntable: {{identifier: rpc.orders}}\nschedule: null\n"
)
# What the batch committed, read in the release's virtualenv: rows and offsets of the pipeline's table
COMMITTED = """
import json, sys
from tidewater.config.parse import load_pipeline
from tidewater.table.catalog import load_catalog, load_table
from tidewater.table.summary import committed_state
spec = load_pipeline(sys.argv[1])
table = load_table(load_catalog(spec), spec.table.identifier)
print(json.dumps({"rows": table.scan().to_arrow().num_rows, "offsets": committed_state(table).offsets}))
"""


def _env() -> dict[str, str]:
    return {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "VIRTUAL_ENV", "AIRFLOW_HOME", "TIDEWATER_HOME", "TIDEWATER_PIPELINES_DIR", "PIP_CONSTRAINT")
    }


def _run(cmd: list[str], env: dict[str, str], timeout: float = 1800) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def _freeze(python: Path, env: dict[str, str]) -> dict[str, str]:
    out = _run([str(python), "-m", "pip", "list", "--format", "json", "--disable-pip-version-check"], env).stdout
    return {re.sub(r"[-_.]+", "-", p["name"]).lower(): p["version"] for p in json.loads(out or "[]")}  # PEP 503 names


def _lower(before: str, after: str) -> bool:
    from packaging.version import Version

    return Version(after) < Version(before)


def build_wheel(out: Path) -> Path:
    """The wheel of this checkout, built from a copy of it (the build writes egg-info into the tree it builds)."""
    import shutil

    src = out / "src"
    shutil.copytree(
        REPO,
        src,
        ignore=shutil.ignore_patterns(
            ".git", ".venv", ".data", "node_modules", "*.egg-info", "build", "__pycache__", ".pytest_cache", ".hypothesis"
        ),
    )
    done = _run([sys.executable, "-m", "build", "--wheel", "--outdir", str(out / "dist"), str(src)], _env(), 900)
    if done.returncode != 0:
        raise SystemExit(f"build failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return next((out / "dist").glob("*.whl"))


def check_release(airflow: str, wheel: Path, work: Path, kafka: tuple[str, str] | None = None) -> dict:
    """One Airflow release: installed alone, then the wheel into it; what moved and what loads. With ``kafka``
    (bootstrap, topic holding records), also an ingest batch through the Spark provider's hook (:func:`run_batch`)."""
    t0 = time.monotonic()
    venv, env = work / "venv", _env()
    result: dict = {"airflow": airflow, "ok": False}
    _run([sys.executable, "-m", "venv", str(venv)], env)
    python = venv / "bin" / "python"
    pip = [str(python), "-m", "pip", "install", "-q", "--no-compile", "--disable-pip-version-check"]
    first = _run([*pip, f"apache-airflow=={airflow}", SPARK_PROVIDER], env)
    if first.returncode != 0:
        return {**result, "error": "Airflow alone did not install: " + first.stderr[-1500:]}
    before = _freeze(python, env)
    result["spark_provider"] = before.get("apache-airflow-providers-apache-spark")
    result["downgraded"], result["added"] = {}, {}
    # the scheduler's, DAG processor's and api-server's install, then a worker's (Spark from pip's pyspark)
    for extras in ("airflow", "airflow,spark"):
        step = _run([*pip, f"{wheel}[{extras}]"], env)
        if step.returncode != 0:
            return {**result, "error": f"the wheel [{extras}] did not install: " + step.stderr[-1500:]}
        after = _freeze(python, env)
        result["downgraded"].update({n: f"{v} -> {after[n]}" for n, v in before.items() if n in after and _lower(v, after[n])})
        result["added"][extras] = sorted(set(after) - set(before))
        before = after
    result["pyspark"] = before.get("pyspark")
    result["pyspark_client"] = before.get("pyspark-client")  # the Spark provider 6.x's; both install `pyspark`
    check = _run([str(python), "-m", "pip", "check"], env)
    result["pip_check"] = check.stdout.strip() or check.stderr.strip()
    result.update(_loads(venv, work, env, kafka))
    result["ok"] = (
        not result["downgraded"] and check.returncode == 0 and result["provider"] and result["plugin"] and "ingest_orders" in result["dags"]
    )
    if kafka is not None:
        result["batch"] = run_batch(venv, work, env, result.get("pyspark_client"))
        result["ok"] = result["ok"] and result["batch"].get("state") == "success" and result["batch"].get("pip_check", True)
    result["seconds"] = round(time.monotonic() - t0)
    return result


def _airflow_env(venv: Path, work: Path, env: dict[str, str]) -> dict[str, str]:
    dags, pipelines, home = work / "dags", work / "pipelines", work / "airflow"
    return {
        **env,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "TIDEWATER_PIPELINES_DIR": str(pipelines),
        "TIDEWATER_HOME": str(work / "tidewater"),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "PATH": f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
    }


def _loads(venv: Path, work: Path, env: dict[str, str], kafka: tuple[str, str] | None) -> dict:
    """What Airflow loads of the package: provider, plugin, and the DAGs of a two-line DAG file."""
    dags, pipelines, home = work / "dags", work / "pipelines", work / "airflow"
    for d in (dags, pipelines, home):
        d.mkdir(parents=True, exist_ok=True)
    (dags / "tidewater_dags.py").write_text(TWO_LINES)
    bootstrap, topic = kafka or ("127.0.0.1:9", "orders")
    (pipelines / "orders.yaml").write_text(PIPELINE.format(bootstrap=bootstrap, topic=topic))
    env = _airflow_env(venv, work, env)
    airflow = str(venv / "bin" / "airflow")
    loaded = json.loads(_run([str(venv / "bin" / "python"), "-c", LOADED], env, 600).stdout.strip().splitlines()[-1])
    _run([airflow, "db", "migrate"], env, 900)
    serialized = _run([airflow, "dags", "reserialize"], env, 600)
    listed = _run([airflow, "dags", "list", "--output", "json"], env, 600)
    ids = []
    for line in listed.stdout.splitlines():  # log lines may come before the JSON document
        if line.startswith("[{") or line.strip() == "[]":
            ids = sorted(d["dag_id"] for d in json.loads(line))
    found = {
        "provider": loaded["provider"],
        "plugin": loaded["plugins"].count("tidewater") == 1 and not loaded["plugin_errors"],
        "plugin_errors": loaded["plugin_errors"],
        "dags": ids,
    }
    if not ids:  # say why: the DAG processor's parse, or the listing
        found["dags_error"] = (serialized.stderr[-800:] + listed.stderr[-800:] + listed.stdout[-400:]).strip()
    return found


def run_batch(venv: Path, work: Path, env: dict[str, str], pyspark_client: str | None) -> dict:
    """An ingest run of the pipeline (`airflow dags test`): its write step through the installed Spark provider's
    SparkSubmitHook and pip's pyspark, pinned first to the provider's `pyspark-client` release (both install the
    `pyspark` module; docs/install.md). Returns the run's state, the pin, `pip check` after it, and what the table
    committed."""
    python = venv / "bin" / "python"
    out: dict = {"pyspark": pyspark_client}
    if pyspark_client:
        pin = _run(
            [str(python), "-m", "pip", "install", "-q", "--no-compile", "--disable-pip-version-check", f"pyspark=={pyspark_client}"], env
        )
        if pin.returncode != 0:
            return {**out, "error": "pyspark did not install at the client's release: " + pin.stderr[-1500:]}
        out["pip_check"] = _run([str(python), "-m", "pip", "check"], env).returncode == 0
    env = {**_airflow_env(venv, work, env), "AIRFLOW_CONN_TIDEWATER_SPARK": '{"conn_type": "spark", "host": "local[2]"}'}
    run = _run([str(venv / "bin" / "airflow"), "dags", "test", "ingest_orders"], env, 1200)
    text = run.stdout + run.stderr
    out["state"] = "success" if run.returncode == 0 and "state=success" in text else "failed"
    if out["state"] != "success":
        return {**out, "error": text[-3000:]}
    committed = _run([str(python), "-c", COMMITTED, str(work / "pipelines" / "orders.yaml")], env, 600)
    if committed.returncode != 0:
        return {**out, "error": committed.stderr[-1500:]}
    out.update(json.loads(committed.stdout.strip().splitlines()[-1]))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--airflow", default=",".join(RELEASES), help="Airflow releases to install into (comma-separated)")
    ap.add_argument("--parallel", type=int, default=2, help="releases installed at once")
    ap.add_argument("--output", default=str(REPO / ".data" / "install-range.json"))
    args = ap.parse_args(argv)
    releases = [r.strip() for r in args.airflow.split(",") if r.strip()]
    with tempfile.TemporaryDirectory(prefix="tidewater-install-range-") as tmp:
        work = Path(tmp)
        wheel = build_wheel(work)
        print(f"built {wheel.name}", flush=True)
        with ThreadPoolExecutor(max_workers=args.parallel) as pool:
            results = list(pool.map(lambda r: check_release(r, wheel, work / r), releases))
    for r in results:
        print(
            f"Airflow {r['airflow']}: {'ok' if r['ok'] else 'FAILED'}; Spark provider {r.get('spark_provider')}, "
            f"pyspark {r.get('pyspark')}; "
            f"downgraded {r.get('downgraded') or 'nothing'}; pip check: {r.get('pip_check', '')[:200]}; "
            f"provider {r.get('provider')}, plugin {r.get('plugin')}, DAGs {r.get('dags')}; {r.get('seconds')} s"
            + (f"; {r['error']}" if r.get("error") else "")
            + (f"; DAGs: {r['dags_error']}" if r.get("dags_error") else ""),
            flush=True,
        )
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(results, indent=1))
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
