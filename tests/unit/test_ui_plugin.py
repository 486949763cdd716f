"""The plugin gives Airflow the React apps when it can load them (3.1+, the bundle built) and the plain page
otherwise; the pure decision of a change table's dead-letter retry."""

from __future__ import annotations

import pyarrow as pa

from tidewater.runtime import plugin
from tidewater.transform.changes import OFFSET, PARTITION, net_changes, retry_decisions


def test_react_apps_when_the_bundle_is_built_else_the_plain_page(tmp_path, monkeypatch):
    bundle = tmp_path / "tidewater-ui.js"
    assert plugin.react_apps(bundle) == []  # not built: no apps
    bundle.write_text("globalThis.AirflowPlugin = () => null;")
    apps = plugin.react_apps(bundle)
    assert [a["destination"] for a in apps] == ["nav", "dag", "dag_run", "dashboard"]  # Airflow 3.3: the dashboard too
    assert len({a["bundle_url"] for a in apps}) == 4 and len({a["name"] for a in apps}) == 4  # one URL and name each
    # relative: resolved against the page's base, so a base-URL prefix ([api] base_url with a path) is kept
    assert all(a["bundle_url"].startswith("tidewater/static/tidewater-ui.js?") for a in apps)
    assert "icon" not in apps[0]  # no icon beside this bundle; the built one has it (below)
    (tmp_path / "tidewater.svg").write_text("<svg/>")
    assert plugin.react_apps(bundle)[0]["icon"] == "tidewater/static/tidewater.svg"
    from airflow.api_fastapi.core_api.datamodels.plugins import ReactAppResponse

    assert all(ReactAppResponse.model_validate(a) for a in apps)  # as this Airflow's API server lists them
    monkeypatch.setattr(plugin, "dashboard_supported", lambda: False)  # Airflow 3.1/3.2: no dashboard destination
    assert [a["destination"] for a in plugin.react_apps(bundle)] == ["nav", "dag", "dag_run"]
    monkeypatch.undo()
    monkeypatch.setattr(plugin, "BUNDLE", bundle)
    assert plugin.react_apps_supported()  # the Airflow this project pins
    apps, views = plugin.views()
    assert len(apps) == 4 and views == []
    monkeypatch.setattr(plugin, "react_apps_supported", lambda: False)  # Airflow 3.0
    apps, views = plugin.views()
    assert apps == [] and [v["href"] for v in views] == ["/tidewater/"]


def test_retry_decisions_apply_in_source_order_and_refuse_a_later_change():
    """Keys 1..4 retried at offsets 10..13 of partition 0: key 1's row was written earlier (applied), key 2's later
    (refused), key 3's in another partition (refused: no order), key 4 has no row but one was removed since
    (refused); key 5 has no row and nothing removed (applied)."""
    changes = pa.table(
        {
            "id": [1, 2, 3, 4, 5],
            PARTITION: pa.array([0] * 5, pa.int32()),
            OFFSET: pa.array([10, 11, 12, 13, 14], pa.int64()),
            "op": ["U"] * 5,
        }
    )
    net = net_changes(changes, ["id"], "op", {"U": "update", "I": "insert", "D": "delete"})
    rows = pa.table(
        {"__key": pa.array([0, 1, 2], pa.int64()), PARTITION: pa.array([0, 0, 1], pa.int32()), OFFSET: pa.array([3, 20, 1], pa.int64())}
    )
    apply, refused = retry_decisions(net, rows, [None, None, None, "removed by snapshot 7", None])
    assert apply.to_pylist() == [True, False, False, False, True]
    assert [k for k, _ in refused] == [1, 2, 3]
    assert "offset 20" in refused[0][1] and "partition 1" in refused[1][1] and refused[2][1] == "removed by snapshot 7"


def test_the_view_loads_a_pipeline_file_again_only_when_it_changed(tmp_path, monkeypatch):
    """The navigation page asks for the list, then each pipeline's overview; every request looks pipelines up. Each
    file is loaded once while it is unchanged (three lookups: three loads for three files, not nine); a changed file
    is loaded again, a removed one is gone, a broken one is left out without hiding the others."""
    import os
    import shutil
    from pathlib import Path

    from tidewater.config import parse
    from tidewater.runtime import ui

    repo = Path(__file__).resolve().parents[2]
    example = (repo / "include" / "pipelines" / "pizzas.yaml").read_text()
    shutil.copy(repo / "include" / "pipelines" / "pizzas.expectations.json", tmp_path)
    for name in ("a", "b", "c"):
        (tmp_path / f"{name}.yaml").write_text(example.replace("name: pizzas", f"name: {name}"))
    monkeypatch.setenv("TIDEWATER_PIPELINES_DIR", str(tmp_path))
    monkeypatch.setattr(ui, "_LOADED", {})
    loads = []
    real = parse.load_pipeline
    monkeypatch.setattr(parse, "load_pipeline", lambda path: loads.append(Path(path).stem) or real(path))
    for _ in range(3):
        assert sorted(ui._pipelines()) == ["a", "b", "c"]
    assert sorted(loads) == ["a", "b", "c"]
    changed = tmp_path / "b.yaml"
    changed.write_text(example.replace("name: pizzas", "name: b2"))
    os.utime(changed, ns=(1, 1))  # a different modification time whatever the clock's resolution
    (tmp_path / "c.yaml").unlink()
    (tmp_path / "d.yaml").write_text("name: d\nkafka: {bootstrp_servers: x}\n")
    assert sorted(ui._pipelines()) == ["a", "b2"]
    assert sorted(loads) == ["a", "b", "b", "c", "d"]
    loads.clear()
    assert ui._pipeline("a").name == "a" and ui._pipeline("b2").name == "b2"  # b2 lives in b.yaml: every file looked at
    assert ui._pipeline("zz") is None and loads == [], "nothing changed: nothing loaded again"
    os.utime(tmp_path / "a.yaml", ns=(2, 2))
    assert ui._pipeline("a").name == "a" and loads == ["a"], "a's own file, and only it"


def test_the_package_metadata_is_seen_once_so_airflow_loads_the_plugin_once():
    """`make setup`'s editable install left `include/tidewater.egg-info` on the path it adds, a second copy of the
    package's metadata: Airflow found the plugin's entry point twice and showed a plugin import error ("already
    registered"). The Makefile removes it; one distribution of the package (named airflow-provider-tidewater since 0.3; the
    Makefile uninstalls one named tidewater), one plugin entry point."""
    from importlib.metadata import distributions, entry_points

    found = [str(getattr(d, "_path", d)) for d in distributions() if d.metadata["Name"] in ("tidewater", "airflow-provider-tidewater")]
    assert len(found) == 1, found
    assert [e.value for e in entry_points(group="airflow.plugins") if e.name == "tidewater"] == ["tidewater.runtime.plugin:TidewaterPlugin"]
