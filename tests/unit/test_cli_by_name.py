"""The command line by name: a pipeline's NAME is looked up in the pipelines folder beside ``--pipeline FILE``;
``validate`` without either checks every file of the folder and reports every problem (``--json`` too); a command's
``--json`` carries its errors as JSON as well. No component is contacted: the commands here fail or finish before."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from tidewater.runtime.cli import main

BASE = {"topics": ["a"], "kafka": {"bootstrap_servers": "h:9092"}, "schedule": None}


def _write(folder: Path, file: str, name: str, **more: object) -> Path:
    path = folder / file
    path.write_text(yaml.safe_dump({"name": name, "table": f"ns.{name}", **BASE, **more}))
    return path


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "pipelines"
    d.mkdir()
    monkeypatch.setenv("TIDEWATER_PIPELINES_DIR", str(d))
    monkeypatch.delenv("AIRFLOW__CORE__EXECUTOR", raising=False)
    return d


def test_a_name_finds_its_file_named_after_it_or_the_one_file_that_names_it(folder, capsys):
    _write(folder, "orders.yaml", "orders")
    other = _write(folder, "legacy-file.yml", "payments")
    assert main(["validate", "orders"]) == 0
    assert f"{folder / 'orders.yaml'}: ok (pipeline orders" in capsys.readouterr().out
    assert main(["validate", "payments"]) == 0
    assert f"{other}: ok (pipeline payments" in capsys.readouterr().out


def test_an_unknown_name_a_shared_name_and_both_forms_at_once_are_refused_clearly(folder, capsys):
    _write(folder, "orders.yaml", "orders")
    assert main(["validate", "order"]) == 2
    err = capsys.readouterr().err
    assert f"no pipeline named 'order' in {folder}" in err and "did you mean 'orders'?" in err
    _write(folder, "a.yaml", "dup")
    _write(folder, "b.yaml", "dup")
    assert main(["validate", "dup"]) == 2
    assert "pipeline 'dup': 2 files in" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["validate", "orders", "--pipeline", str(folder / "orders.yaml")])
    assert e.value.code == 2 and "give a pipeline NAME or --pipeline FILE, not both" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["status"])
    assert e.value.code == 2 and "status: which pipeline?" in capsys.readouterr().err


def test_validate_checks_the_whole_folder_and_reports_every_problem_of_every_file(folder, capsys):
    _write(folder, "orders.yaml", "orders")
    _write(folder, "bad.yaml", "bad", batch={"max_record": 5}, validation={"not_nul": ["a"]})
    _write(folder, "x.yaml", "twin")
    _write(folder, "y.yaml", "twin")
    assert main(["validate"]) == 2
    out = capsys.readouterr().out
    assert f"{folder / 'orders.yaml'}: ok" in out and "1 of 4 pipeline files are valid" in out
    assert f"{folder / 'bad.yaml'}: 2 problem(s)" in out and "batch.max_record: unknown key (did you mean 'max_records'?)" in out
    assert main(["validate", "--json"]) == 2
    doc = json.loads(capsys.readouterr().out)
    problems = {Path(r["file"]).name: r["problems"] for r in doc["pipelines"]}
    assert doc["ok"] is False and problems["orders.yaml"] == [] and len(problems["bad.yaml"]) == 2
    assert problems["x.yaml"] == ["name: pipeline 'twin' is also the name in y.yaml (its DAG ids would clash)"]
    assert problems["y.yaml"] == ["name: pipeline 'twin' is also the name in x.yaml (its DAG ids would clash)"]
    (folder / "x.yaml").unlink()
    (folder / "bad.yaml").unlink()
    assert main(["validate", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True


def test_an_error_of_a_command_with_json_is_json_too(folder, capsys):
    assert main(["status", "nope", "--json"]) == 2
    captured = capsys.readouterr()
    err = json.loads(captured.out)["error"]
    assert err["class"] == "ConfigError" and err["transient"] is False and err["exit"] == 2
    assert "no pipeline named 'nope'" in err["message"] and "tidewater: error: no pipeline named" in captured.err


def test_the_command_line_reference_is_generated_from_the_parser():
    """docs/reference/cli.md is what the parser generates (regenerate with `make docs`): every command, its usage and
    each of its arguments; a command added without a description fails the parser itself."""
    from tidewater.runtime.cli import build_parser, cli_reference
    from tidewater.runtime.cli_reference import DETAILS

    page = (Path(__file__).resolve().parents[2] / "docs" / "reference" / "cli.md").read_text()
    assert page == cli_reference()
    commands = build_parser()._subparsers._group_actions[0].choices
    assert set(commands) == set(DETAILS)
    for name, parser in commands.items():
        assert f"## tidewater {name}\n" in page
        for action in parser._actions:
            for option in action.option_strings:
                assert action.dest == "help" or f"`{option}" in page or f", {option}" in page, (name, option)
    assert "tidewater status [-h] [--pipeline FILE] [--json] [NAME]" in page


def test_read_only_commands_leave_no_catalog_or_warehouse_behind(folder, tmp_path, monkeypatch, capsys):
    """On a host where nothing ran yet, `history`, `dead-letters list` and `quarantine list` answer that there is
    nothing (no table, no letters, no quarantined batch) and create neither the data folder nor the default SQLite
    catalog or warehouse. (`status` is read-only too, but asks the broker; `audit` records its verdict, so it writes.)"""
    home = tmp_path / "fresh-home"
    monkeypatch.setenv("TIDEWATER_HOME", str(home))
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "fresh-airflow"))
    monkeypatch.delenv("AIRFLOW__CORE__EXECUTOR", raising=False)
    # as the command line runs, without Airflow loaded (restored after the test): the executor is read from the file
    monkeypatch.delitem(sys.modules, "airflow.configuration", raising=False)
    _write(folder, "orders.yaml", "orders")
    assert main(["validate", "orders"]) == 0  # asks Airflow's executor without loading Airflow (no airflow.cfg made)
    assert not (tmp_path / "fresh-airflow").exists()
    assert main(["history", "orders"]) == 0
    assert main(["dead-letters", "list", "orders"]) == 0
    assert main(["quarantine", "list", "orders"]) == 0
    out = capsys.readouterr().out
    assert "0 total dead letters" in out and "no quarantined batches" in out
    assert not home.exists()
    import os

    assert "TIDEWATER_READ_ONLY" not in os.environ  # the mode ends with the command (main() runs in this process)


def test_the_checkouts_development_commands_come_from_tidewater_dev(capsys, monkeypatch):
    """`broker`, `spark-connect` and `produce-sample` are the checkout's (include/tidewater_dev/cli.py, outside the
    wheel). Without that package (as installed from the wheel: tidewater_dev hidden from the import system here), each
    is a stand-in that fails with a ConfigError saying where the command lives; nothing else of the CLI changes."""
    import sys

    from tidewater.runtime.cli import DEV_COMMANDS, build_parser

    dev_parsers = {name: p for name, p in build_parser()._subparsers._group_actions[0].choices.items() if name in DEV_COMMANDS}
    assert set(dev_parsers) == set(DEV_COMMANDS)
    assert all(p._defaults["fn"].__module__ == "tidewater_dev.cli" for p in dev_parsers.values())

    monkeypatch.delitem(sys.modules, "tidewater_dev.cli", raising=False)
    monkeypatch.setitem(sys.modules, "tidewater_dev", None)
    choices = build_parser()._subparsers._group_actions[0].choices
    assert all(choices[name]._defaults["fn"].__module__ == "tidewater.runtime.cli" for name in DEV_COMMANDS)
    assert main(["broker", "start", "--port", "19099"]) == 2
    assert "`tidewater broker` is a development tool of a Tidewater checkout" in capsys.readouterr().err
