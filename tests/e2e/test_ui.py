"""The Tidewater view in the Airflow UI, through a real `airflow api-server` (the plugin's FastAPI app
behind Airflow's authentication) and a real browser: Debian's Chromium, headless, driven by Playwright."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, ingest_inline, null_order_ids, stage_inline, write_pipeline
from tests.e2e.conftest import call_api, free_port, stop_group
from tidewater.config.parse import load_pipeline
from tidewater_dev.sample_data import pizza_events, produce

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CHROMIUM = "/usr/bin/chromium"
# Chromium here: no sandbox as root, and no background connections (the network is closed)
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = Path(os.environ.get("TIDEWATER_TEST_ARTIFACTS", REPO / ".data" / "test-artifacts"))


@pytest.fixture
def api_server(airflow_env, tmp_path):
    """Starts `airflow api-server` on a free port with the test's DAGs (serialized first) and the plugin:
    call it once the pipeline files are written. Returns (base URL, user, password)."""
    procs: list[subprocess.Popen] = []
    log = open(tmp_path / "api-server.log", "w")

    def start(prefix: str = "", **more_env: str) -> tuple[str, str, str]:
        port = free_port()
        base = f"http://127.0.0.1:{port}{prefix}"  # a prefix: Airflow served under a path (``[api] base_url``)
        env = {**airflow_env, "AIRFLOW__API__PORT": str(port), "AIRFLOW__API__BASE_URL": base, **more_env}
        subprocess.run(["airflow", "dags", "reserialize"], env=env, check=True, capture_output=True, timeout=300)
        procs.append(
            subprocess.Popen(
                ["airflow", "api-server", "--port", str(port)], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        )
        deadline = time.monotonic() + 180
        while _health(base) != 200:
            if time.monotonic() > deadline or procs[0].poll() is not None:
                raise AssertionError("the API server did not start: " + (tmp_path / "api-server.log").read_text()[-3000:])
            time.sleep(1)
        passwords = json.loads((Path(env["AIRFLOW_HOME"]) / "simple_auth_manager_passwords.json.generated").read_text())
        return base, "admin", passwords["admin"]

    yield start
    for proc in procs:
        stop_group(proc)
    log.close()


def _health(base: str) -> int | None:
    try:
        return call_api(f"{base}/api/v2/monitor/health")[0]
    except OSError:
        return None


def test_tidewater_view_api_and_browser(broker, topic, airflow_env, api_server, home):
    """The plugin's JSON API refuses anonymous calls and, with an Airflow token, lists the pipeline and its
    overview (lag per partition, the batch just committed, its Data Docs page, rendered on first request).
    In the browser: log in, find the Tidewater panel on Airflow's dashboard (both pipelines: the lag of 30, the
    freshness against the 15-minute deadline, the other's quarantined batch, links to their DAG tabs); open "Tidewater"
    in the navigation (the React app), see the lag of 30 records, ingest,
    refresh and see it drop to 0; on the other pipeline's ingest DAG tab press Publish on its quarantined batch and
    find the quarantine DAG's run with that configuration; submit the replay form's dry run (on by default) and find
    its run too.
    Screenshots go to the test artifacts directory."""
    from playwright.sync_api import sync_playwright

    pipelines = Path(airflow_env["TIDEWATER_PIPELINES_DIR"])
    path = write_pipeline(pipelines, topics=[topic], kafka={"bootstrap_servers": broker.bootstrap}, airflow={"freshness": "15m"})
    spec = load_pipeline(path)
    produce(broker.bootstrap, topic, pizza_events(60, seed=120), partitions=3)
    ingest_inline(spec)
    produce(broker.bootstrap, topic, pizza_events(30, seed=121), partitions=3)
    held = _quarantined_batch(pipelines, broker, topic)
    # a pipeline file that does not load on the API server (a variable unset on that host): an error row, not nothing
    (pipelines / "broken.yaml").write_text(
        "name: broken\ntopics: [b]\ntable: ns.broken\nschedule: null\nkafka: {bootstrap_servers: '${TIDEWATER_TEST_UNSET_BROKERS}'}\n"
    )
    base, user, password = api_server()

    assert call_api(f"{base}/tidewater/api/pipelines")[0] == 401
    status, token = call_api(f"{base}/auth/token", body={"username": user, "password": password})
    assert status in (200, 201), token
    token = token["access_token"]
    status, listed = call_api(f"{base}/tidewater/api/pipelines", token)
    assert status == 200 and sorted(p["name"] for p in listed) == ["held", "orders"]
    assert {p["name"]: p["freshness_deadline_s"] for p in listed} == {"held": None, "orders": 900}
    status, first = call_api(f"{base}/tidewater/api/summaries?limit=1", token)  # a page of one line
    assert status == 200 and (first["total"], first["offset"], first["limit"]) == (2, 0, 1), first
    assert [(p["ref"]["name"], p["summary"]["lag"]) for p in first["pipelines"]] == [("held", 0)], first
    status, second = call_api(f"{base}/tidewater/api/summaries?offset=1&limit=1", token)
    assert status == 200 and [p["ref"]["name"] for p in second["pipelines"]] == ["orders"], second
    line = second["pipelines"][0]["summary"]
    assert (line["lag"], line["partitions"], line["quarantined"], line["open_dead_letters"], line["error"]) == (30, 3, 0, 0, None), line
    assert first["pipelines"][0]["summary"]["quarantined"] == 1, first
    status, problems = call_api(f"{base}/tidewater/api/problems", token)
    assert status == 200 and [(p["file"], p["dag_id"]) for p in problems] == [("broken.yaml", "ingest_invalid_broken")]
    assert "TIDEWATER_TEST_UNSET_BROKERS" in problems[0]["error"], problems
    status, errors = call_api(f"{base}/api/v2/plugins/importErrors", token)
    assert status == 200 and errors["total_entries"] == 0, errors  # the plugin loads once, from its entry point
    status, o = call_api(f"{base}/tidewater/api/pipelines/orders", token)
    assert status == 200, o
    assert o["status"]["total_lag"] == 30 and [p["lag"] for p in o["status"]["partitions"]] == [10, 10, 10]
    assert [b["rows"] for b in o["batches"]] == [60] and o["batches"][0]["validation"]["success"] is True
    assert o["maintenance"]["data_files"] == 3 and o["quarantined"] == [] and o["freshness_s"] is not None
    status, page = call_api(f"{base}/tidewater/data-docs/{o['batches'][0]['data_docs']}", token)  # redirected into the site
    assert status == 200 and "Data documentation compiled by Great Expectations" in page
    status, index = call_api(f"{base}/tidewater/data-docs/orders/index.html", token)  # the page's Home link
    assert status == 200 and o["batches"][0]["batch_id"] in index
    suite = re.search(r'href="(?:\.\./)+(expectations/[^"]+\.html)"', page)  # the page's link to its suite
    assert suite is not None and call_api(f"{base}/tidewater/data-docs/orders/{suite.group(1)}", token)[0] == 200
    assert call_api(f"{base}/tidewater/data-docs/orders/..%2F..%2Fairflow.cfg", token)[0] == 404
    assert call_api(f"{base}/tidewater/api/pipelines/nope", token)[0] == 404

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(base + "/")
            page.fill("input[name=username]", user)
            page.fill("input[name=password]", password)
            page.click("button:has-text('Sign in')")
            page.wait_for_url(base + "/", timeout=60_000)
            # the dashboard's Tidewater panel (Airflow 3.3's `dashboard` destination), on the home page
            page.locator("#tidewater-dashboard tr.dashboard-pipeline").nth(1).wait_for(timeout=60_000)
            cells = {
                r[0]: r[1:]
                for r in (row.locator("td").all_inner_texts() for row in page.locator("#tidewater-dashboard tr.dashboard-pipeline").all())
            }
            assert cells["orders"][0] == "30" and re.fullmatch(r"\d+ s of 900 s", cells["orders"][1]), cells
            assert cells["held"][2] == "1" and cells["orders"][2] == "0", cells  # quarantined batches
            links = page.locator("#tidewater-dashboard a").evaluate_all("els => els.map(e => e.getAttribute('href'))")
            assert sorted(links) == [
                f"{base}/dags/ingest_held/plugin/tidewater-pipeline",
                f"{base}/dags/ingest_orders/plugin/tidewater-pipeline",
            ], links
            broken = page.locator("#tidewater-dashboard-problems tr.pipeline-problem")
            broken.first.wait_for(timeout=60_000)
            assert broken.count() == 1 and "TIDEWATER_TEST_UNSET_BROKERS" in broken.first.inner_text()
            page.locator("#tidewater-dashboard").scroll_into_view_if_needed()
            page.screenshot(path=str(ARTIFACTS / "tidewater-dashboard.png"), full_page=True)
            # the navigation entry's icon, from the plugin's relative URL, resolved against the page's base and loaded
            icon = page.locator("img[src='tidewater/static/tidewater.svg']").first
            icon.wait_for(state="attached", timeout=60_000)
            page.wait_for_function(
                "() => [...document.querySelectorAll(\"img[src='tidewater/static/tidewater.svg']\")]"
                ".some(i => i.complete && i.naturalWidth > 0)",
                timeout=60_000,
            )
            page.click("a[href='/plugin/tidewater']")  # the React app in the navigation (no frame)
            view = page
            view.locator("#total-lag").wait_for(timeout=60_000)
            view.locator("#pipeline").select_option("orders")
            view.locator("#total-lag", has_text=re.compile(r"^30$")).wait_for(timeout=60_000)
            assert view.locator(".lag").all_inner_texts() == ["10", "10", "10"]
            assert view.locator("#lag-chart").count() == 0  # one batch: no chart yet, said in words
            assert view.locator("#problems tr.pipeline-problem td").first.inner_text() == "broken.yaml"
            page.screenshot(path=str(ARTIFACTS / "tidewater-view-lag-30.png"))

            ingest_inline(spec)
            view.locator("#refresh").click()
            # exact text: a substring match of "0" would pass on the stale "30" while the refresh is in flight
            view.locator("#total-lag", has_text=re.compile(r"^0$")).wait_for(timeout=60_000)
            page.screenshot(path=str(ARTIFACTS / "tidewater-view-lag-0.png"))

            # the quarantined batch of the other pipeline, on its ingest DAG's tab: Publish is a run of its quarantine DAG
            page.goto(f"{base}/dags/ingest_held/plugin/tidewater-pipeline")
            view.locator("button.quarantine[data-action=publish]").wait_for(timeout=60_000)
            # committed outside Airflow (ingest_inline): no decision run was opened, the buttons decide
            view.locator(".decision[data-state=none]").wait_for(timeout=60_000)
            publish = view.locator("button.quarantine[data-action=publish]")
            publish.click()
            assert publish.inner_text() == "Confirm publish"  # nothing sent on the first click
            publish.click()
            view.locator("#quarantine-run").wait_for(timeout=60_000)
            page.screenshot(path=str(ARTIFACTS / "tidewater-view-quarantine.png"))

            page.goto(f"{base}/dags/replay_orders")
            page.click("button:has-text('Trigger')")
            dialog = page.locator("[role=dialog]")
            dialog.locator("input[name=element_start_offset]").fill("0")
            dialog.locator("input[name=element_end_offset]").fill("5")
            assert dialog.locator("input[name=element_dry_run]").is_checked()  # a dry run unless turned off
            page.screenshot(path=str(ARTIFACTS / "replay-form.png"))
            dialog.locator("button:has-text('Trigger')").last.click()
            deadline = time.monotonic() + 60
            runs: list = []
            while time.monotonic() < deadline and not runs:
                runs = call_api(f"{base}/api/v2/dags/replay_orders/dagRuns", token)[1]["dag_runs"]
                time.sleep(1)
        finally:
            browser.close()
    assert len(runs) == 1, runs
    conf = runs[0]["conf"]
    assert (conf["start_offset"], conf["end_offset"], conf["dry_run"], conf["mode"]) == (0, 5, True, "replace")
    status, queued = call_api(f"{base}/api/v2/dags/quarantine_held/dagRuns", token)
    assert [r["conf"] for r in queued["dag_runs"]] == [{"action": "publish", "batch_id": held}], queued


def test_the_view_loads_behind_a_base_url_prefix(broker, topic, airflow_env, api_server, home):
    """Airflow served under a path (``[api] base_url`` ``http://host:port/airflow``, as behind a reverse proxy that
    keeps the path): the plugin's app and icon URLs are relative, so the browser loads the bundle and the icon from
    ``/airflow/tidewater/static/`` (the same paths without the prefix do not exist), and the React app shows the
    pipeline's lag. Every request the page made for the plugin's static files succeeded under the prefix."""
    from playwright.sync_api import sync_playwright

    pipelines = Path(airflow_env["TIDEWATER_PIPELINES_DIR"])
    path = write_pipeline(pipelines, topics=[topic], kafka={"bootstrap_servers": broker.bootstrap})
    produce(broker.bootstrap, topic, pizza_events(30, seed=140), partitions=3)
    ingest_inline(load_pipeline(path))
    produce(broker.bootstrap, topic, pizza_events(12, seed=141), partitions=3)
    base, user, password = api_server(prefix="/airflow")
    root = base.removesuffix("/airflow")
    status, token = call_api(f"{base}/auth/token", body={"username": user, "password": password})
    assert status in (200, 201), token
    token = token["access_token"]
    status, listed = call_api(f"{base}/tidewater/api/pipelines", token)
    assert status == 200 and [p["name"] for p in listed] == ["orders"], listed
    assert call_api(f"{root}/tidewater/static/tidewater.svg", token)[0] == 404, "only under the prefix"
    static: list[tuple[str, int]] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.on("response", lambda r: static.append((r.url, r.status)) if "/tidewater/static/" in r.url else None)
            page.goto(base + "/")
            page.fill("input[name=username]", user)
            page.fill("input[name=password]", password)
            page.click("button:has-text('Sign in')")
            page.wait_for_url(base + "/", timeout=60_000)
            page.wait_for_function(
                "() => [...document.querySelectorAll(\"img[src='tidewater/static/tidewater.svg']\")]"
                ".some(i => i.complete && i.naturalWidth > 0)",
                timeout=60_000,
            )
            page.goto(base + "/plugin/tidewater")
            page.locator("#pipeline").wait_for(timeout=60_000)
            page.locator("#pipeline").select_option("orders")
            page.locator("#total-lag", has_text=re.compile(r"^12$")).wait_for(timeout=60_000)
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "tidewater-view-under-a-prefix.png"))
        finally:
            browser.close()
    assert {url.split("?")[0] for url, _ in static} >= {
        f"{base}/tidewater/static/tidewater-ui.js",
        f"{base}/tidewater/static/tidewater.svg",
    }, static
    assert all(code in (200, 304) for _, code in static), static


def test_the_view_shows_each_user_only_the_pipelines_whose_dag_they_may_read(broker, topic, airflow_env, api_server, home):
    """Two pipelines; an auth manager (``tests/e2e/one_dag_auth.py``: Airflow's simple one, with a user ``limited``
    who may read only ``ingest_orders``) behind the real API server. ``limited`` lists only `orders`, reads its
    overview and Data Docs, and gets 403 for every route of the other pipeline (the dashboard's panel lists only
    `orders` too); the admin sees both."""
    pipelines = Path(airflow_env["TIDEWATER_PIPELINES_DIR"])
    batches = {}
    for name in ("orders", "secret"):
        spec = load_pipeline(
            write_pipeline(
                pipelines, name=name, topics=[topic], table={"identifier": f"rpc.{name}"}, kafka={"bootstrap_servers": broker.bootstrap}
            )
        )
        produce(broker.bootstrap, topic, pizza_events(12, seed=130), partitions=2)
        batches[name] = ingest_inline(spec).batch_id
    base, admin, admin_password = api_server(
        AIRFLOW__CORE__AUTH_MANAGER="tests.e2e.one_dag_auth.OneDagAuthManager",
        AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS="admin:admin,limited:viewer",
        TIDEWATER_TEST_READABLE_DAGS="ingest_orders",
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    )
    passwords = json.loads((Path(airflow_env["AIRFLOW_HOME"]) / "simple_auth_manager_passwords.json.generated").read_text())
    tokens = {}
    for user in ("admin", "limited"):
        status, body = call_api(f"{base}/auth/token", body={"username": user, "password": passwords[user]})
        assert status in (200, 201), body
        tokens[user] = body["access_token"]
    status, listed = call_api(f"{base}/tidewater/api/pipelines", tokens["admin"])
    assert status == 200 and sorted(p["name"] for p in listed) == ["orders", "secret"]
    status, listed = call_api(f"{base}/tidewater/api/pipelines", tokens["limited"])
    assert status == 200 and [p["name"] for p in listed] == ["orders"]
    status, page = call_api(f"{base}/tidewater/api/summaries", tokens["limited"])
    assert status == 200 and page["total"] == 1 and [p["ref"]["name"] for p in page["pipelines"]] == ["orders"], page
    assert call_api(f"{base}/tidewater/api/pipelines/orders", tokens["limited"])[0] == 200
    status, page = call_api(f"{base}/tidewater/data-docs/orders/{batches['orders']}.html", tokens["limited"])
    assert status == 200 and "Data documentation compiled by Great Expectations" in page
    for route in (
        "api/pipelines/secret",
        f"data-docs/secret/{batches['secret']}.html",
        "data-docs/secret/index.html",
        "api/pipelines/secret/dead-letters",
        "api/pipelines/secret/lag-history",
        "api/pipelines/secret/runs/manual__x",
    ):
        status, body = call_api(f"{base}/tidewater/{route}", tokens["limited"])
        assert status == 403 and "ingest_secret" in body, (route, status, body)
        assert call_api(f"{base}/tidewater/{route}", tokens["admin"])[0] in (200, 307), route

    # In the browser: `limited` gets the tab of the DAG it may read, and neither the other's tab nor its letters.
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            _login(page, base, "limited", passwords["limited"])
            page.goto(f"{base}/dags/ingest_orders/plugin/tidewater-pipeline")
            page.locator("[data-testid=pipeline-detail][data-pipeline=orders]").wait_for(timeout=60_000)
            page.goto(f"{base}/dags/ingest_secret/plugin/tidewater-pipeline")
            page.locator("#not-tidewater").wait_for(timeout=60_000)  # the tab finds no pipeline it may show
            assert page.locator("[data-testid=pipeline-detail]").count() == 0
            assert page.locator("#dead-letters").count() == 0 and "rpc.secret" not in page.content()
            page.screenshot(path=str(ARTIFACTS / "limited-user-other-dag.png"))
            page.goto(f"{base}/")  # the dashboard's panel: the pipeline it may read, only
            page.locator("#tidewater-dashboard tr.dashboard-pipeline").first.wait_for(timeout=60_000)
            assert [r.locator("td").first.inner_text() for r in page.locator("#tidewater-dashboard tr.dashboard-pipeline").all()] == [
                "orders"
            ]
            page.goto(f"{base}/plugin/tidewater")
            page.locator("tr.pipeline").first.wait_for(timeout=60_000)
            assert page.locator("tr.pipeline").count() == 1 and page.locator("#pipeline option").all_inner_texts() == [
                "orders -> rpc.orders"
            ]
        finally:
            browser.close()


def _login(page, base: str, user: str, password: str) -> None:
    page.goto(base + "/")
    page.fill("input[name=username]", user)
    page.fill("input[name=password]", password)
    page.click("button:has-text('Sign in')")
    page.wait_for_url(base + "/", timeout=60_000)


def test_dag_and_run_tabs_show_the_pipeline_and_a_retry_from_the_view_runs_the_retry_dag(broker, topic, airflow_env, api_server, home):
    """The React apps in Airflow's own pages. On the ingest DAG's "Tidewater pipeline" tab: the lag per partition
    equals `tidewater status --json`, the lag chart is drawn (two batches), the 3 dead letters of the second batch are
    listed with their payload. On the "Tidewater batch" tab of the DAG run that committed the second batch: its batch
    id, records and dead letters equal the ledger's, one range per partition. After the fix, Retry (armed, then
    confirmed) queues a run of retry_dead_letters_orders with dry_run off; Airflow runs that DAG (`airflow dags test`
    with the run's configuration, no scheduler here) and the tab then shows no open letter. Screenshots are kept."""
    from playwright.sync_api import sync_playwright

    from tidewater.audit import ledger
    from tidewater.steps.lifecycle import commit_step, validate_step
    from tidewater.table.catalog import load_catalog
    from tidewater_dev.sample_data import produce as produce_round_robin

    pipelines = Path(airflow_env["TIDEWATER_PIPELINES_DIR"])
    path = write_pipeline(
        pipelines,
        topics=[topic],
        kafka={"bootstrap_servers": broker.bootstrap},
        validation={"not_null": ["order_id"], "not_null_policy": "dead_letter"},
    )
    spec = load_pipeline(path)
    produce_round_robin(broker.bootstrap, topic, pizza_events(30, seed=140), partitions=3)
    ingest_inline(spec)
    produce_round_robin(broker.bootstrap, topic, pizza_events(12, seed=141) + null_order_ids(3, 142), partitions=3)
    base, user, password = api_server()
    status, token = call_api(f"{base}/auth/token", body={"username": user, "password": password})
    token = token["access_token"]
    status, run = call_api(f"{base}/api/v2/dags/ingest_orders/dagRuns", token, body={"dag_run_id": "manual__tab-1", "logical_date": None})
    assert status in (200, 201), run
    plan, manifest = stage_inline(spec)  # the run's batch, committed with its run id as the commit task would
    validate_step(spec, plan, manifest)
    committed = commit_step(spec, plan, manifest, dag_run_id="manual__tab-1")
    assert (committed.records, committed.dead_letters) == (15, 3)
    produce_round_robin(broker.bootstrap, topic, pizza_events(6, seed=143), partitions=3)  # lag 6 for the tab
    st = json.loads(
        subprocess.run(
            ["tidewater", "status", "--pipeline", str(path), "--json"],
            env=airflow_env,
            check=True,
            capture_output=True,
            text=True,
            timeout=300,
        ).stdout
    )
    entries = [e for e in ledger.read(load_catalog(spec), spec).to_pylist() if e["dag_run_id"] == "manual__tab-1"]

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1300})
            _login(page, base, user, password)
            page.goto(f"{base}/dags/ingest_orders")
            page.click("a[href$='plugin/tidewater-pipeline']")  # the DAG's tab
            page.locator("#total-lag", has_text=re.compile(rf"^{st['total_lag']}$")).wait_for(timeout=60_000)
            assert st["total_lag"] == 6
            assert page.locator(".lag").all_inner_texts() == [str(x["lag"]) for x in st["partitions"]]
            page.locator("#lag-chart").wait_for(timeout=60_000)
            assert page.locator("#open-letters").inner_text() == "3"
            page.locator("tr.letter").first.wait_for(timeout=60_000)
            assert page.locator("tr.letter").count() == 3
            assert all('"order_id": null' in t for t in page.locator("tr.letter .payload").all_inner_texts())
            page.screenshot(path=str(ARTIFACTS / "dag-tab.png"), full_page=True)

            page.goto(f"{base}/dags/ingest_orders/runs/manual__tab-1")
            page.click("a[href$='plugin/tidewater-batch']")  # the DAG run's tab
            page.locator("#run-batch", has_text=plan.batch_id).wait_for(timeout=60_000)
            assert page.locator("#run-records").inner_text() == str(entries[0]["records"]) == "15"
            assert page.locator("#run-dead-letters").inner_text() == str(entries[0]["dead_letters"]) == "3"
            assert page.locator("#run-snapshot").inner_text() == str(entries[0]["snapshot_id"])
            assert page.locator("tr.range").count() == len(entries) == 3
            page.screenshot(path=str(ARTIFACTS / "run-tab.png"), full_page=True)

            doc = yaml.safe_load(path.read_text())
            doc["validation"] = {"not_null": []}  # the operator's fix
            path.write_text(yaml.safe_dump(doc))
            page.goto(f"{base}/dags/ingest_orders/plugin/tidewater-pipeline")
            retry = page.locator("button.retry-letters")
            retry.click()
            assert retry.inner_text().startswith("Confirm")  # nothing sent on the first click
            retry.click()
            page.locator("#retry-run").wait_for(timeout=60_000)
            status, runs = call_api(f"{base}/api/v2/dags/retry_dead_letters_orders/dagRuns", token)
            assert [r["conf"] for r in runs["dag_runs"]] == [{"dry_run": False}], runs
            done = subprocess.run(
                ["airflow", "dags", "test", "retry_dead_letters_orders", "--conf", json.dumps(runs["dag_runs"][0]["conf"])],
                env=airflow_env,
                capture_output=True,
                text=True,
                timeout=600,
            )
            assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
            page.reload()
            page.locator("#open-letters", has_text=re.compile(r"^0$")).wait_for(timeout=60_000)
            page.screenshot(path=str(ARTIFACTS / "dag-tab-after-retry.png"), full_page=True)
        finally:
            browser.close()
    from tidewater.table.letters import counts

    assert counts(spec) == {"open": 0, "retrying": 0, "resolved": 3, "skipped": 0, "dropped": 0, "total": 3}


def _quarantined_batch(pipelines: Path, broker, topic: str) -> str:
    """A second pipeline whose suite fails its batch, with validation.on_failure quarantine: the batch waits
    on its branch. Returns its batch id."""
    from tidewater.errors import ValidationFailedError

    (pipelines / "strict.json").write_text(
        json.dumps(
            {
                "expectations": [
                    {"type": "expect_column_values_to_be_between", "kwargs": {"column": "store_id", "min_value": 1, "max_value": 5}}
                ]
            }
        )
    )
    spec = load_pipeline(
        write_pipeline(
            pipelines,
            name="held",
            topics=[topic],
            kafka={"bootstrap_servers": broker.bootstrap},
            table={"identifier": "rpc.held"},
            validation={"suite": "strict.json", "on_failure": "quarantine"},
        )
    )
    with pytest.raises(ValidationFailedError, match="quarantined on branch quarantine-") as e:
        ingest_inline(spec)
    return str(e.value).split("quarantined on branch quarantine-", 1)[1].split()[0].rstrip(".;,)")
