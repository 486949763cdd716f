"""Pipeline files: parsing, errors that name the key, environment interpolation, secrets, reference page."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tidewater.config.parse import load_pipeline, parse_pipeline
from tidewater.config.reference import reference_markdown
from tidewater.config.secrets import redact
from tidewater.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
BASE = {"name": "p", "topics": ["a"], "kafka": {"bootstrap_servers": "h:9092"}, "table": "ns.t"}


def test_shipped_pipelines_are_valid():
    files = sorted((REPO / "include" / "pipelines").glob("*.yaml"))
    assert files, "the repo ships at least the demo pipeline"
    for f in files:
        spec = load_pipeline(f)
        assert spec.dag_id == f"ingest_{spec.name}"


def test_init_writes_the_packaged_example_that_the_demo_runs_and_never_overwrites(tmp_path, capsys):
    """`tidewater init` copies the example pipeline and its suite (package data, the files the repository's demo
    reads through include/pipelines/) and the JSON Schema the pipeline file points editors at; a second init into
    the same folder refuses, naming the file, and leaves the operator's edits alone."""
    from tidewater.runtime.cli import main

    folder = tmp_path / "pipelines"
    assert main(["init", "--dir", str(folder)]) == 0
    assert sorted(p.name for p in folder.iterdir()) == ["pipeline.schema.json", "pizzas.expectations.json", "pizzas.yaml"]
    written = (folder / "pizzas.yaml").read_text()
    assert written.startswith("# yaml-language-server: $schema=pipeline.schema.json\n")
    demo = (REPO / "include" / "pipelines" / "pizzas.yaml").read_text()
    assert written.split("\n", 1)[1] == demo.split("\n", 1)[1]  # the demo's pipeline, the schema line aside
    assert (folder / "pizzas.expectations.json").read_text() == (REPO / "include" / "pipelines" / "pizzas.expectations.json").read_text()
    spec = load_pipeline(folder / "pizzas.yaml")
    assert spec.suite_path() == folder / "pizzas.expectations.json" and spec.dag_id == "ingest_pizzas"
    assert json.loads((folder / "pipeline.schema.json").read_text())["type"] == "object"
    (folder / "pizzas.yaml").write_text(written + "# edited\n")
    capsys.readouterr()
    assert main(["init", "--dir", str(folder)]) == 2
    assert "pizzas.yaml exists already" in capsys.readouterr().err
    assert (folder / "pizzas.yaml").read_text().endswith("# edited\n")


def test_defaults_and_shorthand():
    spec = parse_pipeline(BASE)
    assert spec.table.identifier == "ns.t"
    assert spec.batch.max_records == 1_000_000
    assert spec.catalog_properties()["type"] == "sql"


def test_routed_tables_take_their_defaults_from_table():
    spec = parse_pipeline(
        {
            **BASE,
            "table": {"partition_by": ["day(ts)"], "properties": {"a": "1"}},
            "tables": [{"identifier": "ns.x"}, {"identifier": "ns.y", "partition_by": []}],
            "routing": {"namespace": "ns"},
        }
    )
    assert spec.routed and spec.checkpoint_table() == f"ns.{spec.name}_checkpoints"
    assert spec.dead_letter_table() == f"ns.{spec.name}_dead_letters"
    assert spec.table_spec("ns.x").partition_by == ["day(ts)"] and spec.table_spec("ns.x").properties == {"a": "1"}
    assert spec.table_spec("ns.y").partition_by == []
    assert spec.table_spec("ns.dynamic_one").partition_by == ["day(ts)"]  # not listed: the defaults
    view = spec.for_table("ns.x")
    assert not view.routed and view.table.identifier == "ns.x" and view.dead_letter_table() == spec.dead_letter_table()


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"topcs": ["a"]}, "topcs: unknown key (did you mean 'topics'?)"),
        ({"batch": {"max_records": "lots"}}, "batch.max_records: expected an integer, got 'lots'"),
        ({"batch": {"max_records": 0}}, "batch.max_records: must be at least 1"),
        ({"table": "nonamespace"}, "table.identifier"),
        ({"kafka": {}}, "kafka: set either bootstrap_servers or conn_id"),
        ({"kafka": {"bootstrap_servers": "h", "settings": {"group.id": "x"}}}, "kafka.settings.group.id: managed by Tidewater"),
        ({"format": {"value": "thrift"}}, "format.value: 'thrift' is not supported"),
        ({"name": "Bad-Name"}, "name: 'Bad-Name' must be lower-case"),
        ({"topics": []}, "topics: at least one topic"),
        ({"validation": {"suite": "missing.json"}}, "validation.suite: file"),
        ({"validation": {"chunk_rows": 0}}, "validation.chunk_rows: must be at least 1"),
        (
            {"maintenance": {"remove_orphan_files": {"older_than_hours": 2}}},
            "maintenance.remove_orphan_files.older_than_hours: 2 is less than the longest possible batch (12.2 h",
        ),
        (
            {"airflow": {"task_timeout_minutes": 600}},
            "maintenance.remove_orphan_files.older_than_hours: 72 is less than the longest possible batch (120.2 h",
        ),
        ({"maintenance": {"rewrite_data_files": {"strategy": "zorder"}}}, "maintenance.rewrite_data_files.zorder_columns"),
        ({"maintenance": {"rewrite_data_files": {"strategy": "fast"}}}, "maintenance.rewrite_data_files.strategy: 'fast'"),
        ({"maintenance": {"expire_snapshots": {"retain_last": 0}}}, "maintenance.expire_snapshots.retain_last"),
        ({"table": {"identifier": "ns.t", "partition_by": ["bucket(id)"]}}, "table.partition_by[0]: 'bucket(id)'"),
        ({"table": {"identifier": "ns.t", "partition_by": ["weekly(ts)"]}}, "table.partition_by[0]: 'weekly(ts)' is not a supported"),
        ({"table": {"identifier": "ns.t", "sort_by": ["ts sideways"]}}, "table.sort_by[0]: 'ts sideways'"),
        ({"format": {"flatten_separator": "."}}, "format.flatten_separator"),
        ({"validation": {"unique_ids": "table"}}, "validation.unique_ids: needs table.id_columns"),
        ({"table": {"identifier": "ns.t", "suite": "nope.json"}}, "table.suite: file"),
        ({"dead_letter": {"topic": "a"}}, "dead_letter.topic: 'a' must be a valid Kafka topic name, not a source topic"),
        ({"table": "", "tables": [{"identifier": "ns.a"}]}, "routing.namespace: required when routing"),
        ({"tables": [{"identifier": "ns.a"}], "routing": {"namespace": "ns"}}, "table.identifier: not used when records are routed"),
        (
            {"table": "", "tables": [{"identifier": "ns.a", "route_regex": "x"}], "routing": {"namespace": "ns"}},
            "tables[0].route_regex: needs routing.field",
        ),
        (
            {"table": "", "tables": [{"identifier": "ns.a", "topics": ["zz"]}], "routing": {"namespace": "ns"}},
            "tables[0].topics: 'zz' is not one of the pipeline's topics",
        ),
        (
            {"table": "", "tables": [{"identifier": "ns.a"}, {"identifier": "ns.a"}], "routing": {"namespace": "ns"}},
            "tables[1].identifier: 'ns.a' is listed twice",
        ),
        (
            {"table": "", "tables": [{"identifier": "ns.a", "route_regex": "("}], "routing": {"namespace": "ns", "field": "k"}},
            "tables[0].route_regex: '(' is not a valid regular expression",
        ),
        ({"table": "", "routing": {"namespace": "ns", "dynamic": True}}, "routing.field: required with routing.dynamic"),
        (
            {"table": "", "routing": {"namespace": "ns", "dynamic": True, "field": "k", "table_template": "t"}},
            "routing.table_template: 't' must contain {value}",
        ),
        (
            {"table": "", "routing": {"namespace": "ns", "dynamic": True, "field": "k", "unmatched": "drop"}},
            "routing.unmatched: 'drop' is not one of dead_letter, skip",
        ),
        (
            {"table": "", "tables": [{"identifier": "ns.p_checkpoints"}], "routing": {"namespace": "ns"}},
            "tables: 'ns.p_checkpoints' is the pipeline's own checkpoint",
        ),
        ({"table": {"identifier": "ns.t", "upsert": True}}, "table.upsert: needs table.id_columns"),
        (
            {
                "table": {"identifier": "", "upsert": True, "id_columns": ["id"], "key_source": "message_key"},
                "routing": {"namespace": "ns", "dynamic": True, "field": "k", "table_template": "t_{value}"},
            },
            "table.key_source: message_key needs tables named by their topic alone",
        ),
        (
            {"table": {"identifier": "ns.t", "op_field": "op", "id_columns": ["id"]}, "format": {"metadata": "none"}},
            "table.op_field: needs format.metadata: prefixed",
        ),
        (
            {"table": {"identifier": "ns.t", "op_field": "op", "id_columns": ["id"], "op_values": {"X": "erase"}}},
            "table.op_values.X: 'erase' is not insert, update, delete or truncate",
        ),
        (
            {"table": {"identifier": "ns.t", "upsert": True, "id_columns": ["id"], "truncate": "drop"}},
            "table.truncate: 'drop' is not one of dead_letter, apply",
        ),
        (
            {"table": {"identifier": "ns.t", "upsert": True, "id_columns": ["id"], "key_source": "header"}},
            "table.key_source: 'header' is not one of value, message_key",
        ),
        (
            {"table": {"identifier": "ns.t", "op_field": "op", "id_columns": ["id"], "key_source": "message_key"}},
            "table.key_source: message_key is for upserts without an op field",
        ),
        (
            {"table": "", "tables": [{"identifier": "ns.a", "upsert": True}], "routing": {"namespace": "ns"}},
            "tables[0].upsert: needs tables[0].id_columns",
        ),
        (
            {"table": {"identifier": "", "upsert": True}, "tables": [{"identifier": "ns.a"}], "routing": {"namespace": "ns"}},
            "table.upsert / op_field: on a routed pipeline with static `tables`, set them per table under `tables`",
        ),
        (
            {
                "topics": ["a", "b"],
                "table": "",
                "routing": {"namespace": "ns"},
                "tables": [{"identifier": "ns.a", "upsert": True, "id_columns": ["id"]}],
            },
            "tables[0].topics: a change table takes the records of exactly one topic",
        ),
        (
            {"table": "", "routing": {"namespace": "ns", "dynamic": True, "table_template": "{topic[-1]}_{source}"}},
            "routing.table_template: '{topic[-1]}_{source}': the placeholders are {value}, {topic}, {topic[N]}",
        ),
        (
            {"table": "", "routing": {"namespace": "ns", "dynamic": True, "table_template": "t_{value}"}},
            "routing.field: required with routing.dynamic (or name tables by {topic}",
        ),
        (
            {"table": {"identifier": "", "upsert": True}, "routing": {"namespace": "ns", "dynamic": True, "table_template": "{topic}"}},
            "table.upsert: needs table.id_columns",
        ),
    ],
)
def test_errors_name_the_key(patch, message):
    with pytest.raises(ConfigError) as e:
        parse_pipeline({**BASE, **patch})
    assert message in str(e.value)


def test_a_routed_debezium_pipeline_may_leave_id_columns_to_the_message_keys():
    """Change tables of a routed Debezium pipeline without `id_columns` take them from the message keys; a table
    listed with its own keeps them; other formats still need them (see test_errors_name_the_key)."""
    doc = {
        **BASE,
        "table": {"identifier": "", "upsert": True},
        "format": {"value": "debezium"},
        "routing": {"namespace": "ns", "dynamic": True, "table_template": "{topic[-1]}"},
    }
    spec = parse_pipeline(doc)
    assert spec.ids_from_keys and spec.for_table("ns.orders").table.id_columns == []
    keyed = parse_pipeline({**doc, "table": {"identifier": "", "upsert": True, "id_columns": ["id"]}})
    assert not keyed.ids_from_keys
    with pytest.raises(ConfigError, match="table.upsert: needs table.id_columns"):
        parse_pipeline({**doc, "format": {"value": "json"}})


def test_env_interpolation(monkeypatch):
    monkeypatch.setenv("KAFKA_PW", "s3cret")
    spec = parse_pipeline({**BASE, "kafka": {"bootstrap_servers": "${BROKERS:-b:1}", "settings": {"sasl.password": "${KAFKA_PW}"}}})
    assert spec.kafka.bootstrap_servers == "b:1"
    assert spec.kafka.settings["sasl.password"] == "s3cret"
    monkeypatch.delenv("KAFKA_PW")
    with pytest.raises(ConfigError, match=r"kafka.settings.sasl.password: environment variable KAFKA_PW is not set"):
        parse_pipeline({**BASE, "kafka": {"bootstrap_servers": "h", "settings": {"sasl.password": "${KAFKA_PW}"}}})


def test_file_errors_name_the_file(tmp_path):
    p = tmp_path / "x.yaml"
    p.write_text("name: [unclosed")
    with pytest.raises(ConfigError, match="x.yaml: not valid YAML"):
        load_pipeline(p)


def test_redact_hides_secrets():
    r = redact({"sasl.password": "pw", "sasl.jaas.config": "j", "ssl.key.pem": "k", "bootstrap.servers": "h:1"})
    assert r == {"sasl.password": "***", "sasl.jaas.config": "***", "ssl.key.pem": "***", "bootstrap.servers": "h:1"}


def test_reference_page_matches_the_code():
    """docs/configuration.md is generated from config.py: regenerate with `make docs`."""
    page = (REPO / "docs" / "configuration.md").read_text()
    assert page == reference_markdown()
    for key in ("batch.max_records", "kafka.settings", "table.identifier", "validation.suite", "catalog.properties"):
        assert f"`{key}`" in page


def test_kafka_settings_from_an_airflow_connection(monkeypatch, tmp_path):
    """`kafka.conn_id` resolves hosts, SASL credentials and librdkafka extras; spec settings win."""
    from tidewater.source.kafka import kafka_settings

    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    monkeypatch.setenv(
        "AIRFLOW_CONN_KAFKA_PROD",
        json.dumps(
            {
                "conn_type": "generic",
                "host": "b1:9092,b2:9092",
                "login": "svc",
                "password": "s3cret-pw",
                "extra": {"security.protocol": "SASL_SSL", "sasl.mechanisms": "PLAIN"},
            }
        ),
    )
    spec = parse_pipeline({**BASE, "kafka": {"conn_id": "kafka_prod", "settings": {"sasl.mechanisms": "SCRAM-SHA-512"}}})
    assert kafka_settings(spec) == {
        "bootstrap.servers": "b1:9092,b2:9092",
        "security.protocol": "SASL_SSL",
        "sasl.mechanisms": "SCRAM-SHA-512",
        "sasl.username": "svc",
        "sasl.password": "s3cret-pw",
    }
    missing = parse_pipeline({**BASE, "kafka": {"conn_id": "nope"}})
    with pytest.raises(ConfigError, match="kafka.conn_id: Airflow connection 'nope' not found"):
        kafka_settings(missing)


def test_catalog_properties_from_an_airflow_connection(monkeypatch, tmp_path):
    """`catalog.conn_id`: a postgres connection is a SQL catalog (its password in the URL), an https one a REST
    catalog (login and password as the OAuth2 credential), an aws one a Glue catalog; the extra JSON adds properties
    and the pipeline's own properties win. Parsing the pipeline does not ask for the connection (the DAG processor
    parses every file often); the environment the ingest DAG gives its Spark job is used before Airflow."""
    from tidewater.config import connections

    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    monkeypatch.setattr(connections, "_CACHE", {})
    conns = {
        "lake_pg": {
            "conn_type": "postgres",
            "host": "db.internal",
            "port": 5433,
            "login": "tw",
            "password": "p@ss/w",
            "schema": "iceberg",
            "extra": {"warehouse": "s3://lake/wh", "s3.secret-access-key": "s3-secret"},
        },
        "lake_rest": {
            "conn_type": "https",
            "host": "catalog.example.com",
            "login": "client",
            "password": "cs",
            "extra": {"warehouse": "prod"},
        },
        "lake_glue": {
            "conn_type": "aws",
            "login": "AKIAEXAMPLEEXAMPLE00",
            "password": "aws-secret",
            "extra": {"client.region": "eu-west-1"},
        },
    }
    for conn_id, conn in conns.items():
        monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(conn))
    pg = parse_pipeline({**BASE, "catalog": {"conn_id": "lake_pg", "properties": {"warehouse": "s3://other/wh"}}})
    assert pg.catalog_properties() == {
        "type": "sql",
        "uri": "postgresql+psycopg2://tw:p%40ss%2Fw@db.internal:5433/iceberg",
        "warehouse": "s3://other/wh",
        "s3.secret-access-key": "s3-secret",
    }
    rest = parse_pipeline({**BASE, "catalog": {"conn_id": "lake_rest"}})
    assert rest.catalog_properties() == {
        "type": "rest",
        "uri": "https://catalog.example.com",
        "credential": "client:cs",
        "warehouse": "prod",
    }
    glue = parse_pipeline({**BASE, "catalog": {"conn_id": "lake_glue"}})
    assert glue.catalog_properties() == {
        "type": "glue",
        "client.access-key-id": "AKIAEXAMPLEEXAMPLE00",
        "client.secret-access-key": "aws-secret",
        "client.region": "eu-west-1",
    }
    # Spark's Glue catalog: Iceberg's GlueCatalog on the same region; the keys, which Iceberg's Glue client does not
    # read from settings, in the driver JVM's environment and in no setting
    from tidewater.spark.conf import catalog_conf, jvm_env

    assert {k: v for k, v in catalog_conf(glue).items() if "access-key" in k or "secret" in k} == {}
    assert catalog_conf(glue)[f"spark.sql.catalog.{glue.catalog.name}.catalog-impl"] == "org.apache.iceberg.aws.glue.GlueCatalog"
    assert catalog_conf(glue)[f"spark.sql.catalog.{glue.catalog.name}.client.region"] == "eu-west-1"
    assert jvm_env(glue) == {"AWS_ACCESS_KEY_ID": "AKIAEXAMPLEEXAMPLE00", "AWS_SECRET_ACCESS_KEY": "aws-secret"}
    assert jvm_env(rest) == {} and jvm_env(pg) == {}
    missing = parse_pipeline({**BASE, "catalog": {"conn_id": "nope"}})  # parsed and validated without asking
    with pytest.raises(ConfigError, match="catalog.conn_id: Airflow connection 'nope' not found"):
        missing.catalog_properties()
    monkeypatch.setenv(connections.CATALOG_CONFIG_ENV, json.dumps({"type": "sql", "uri": "sqlite:////x.db"}))
    assert missing.catalog_properties() == {"type": "sql", "uri": "sqlite:////x.db"}


def test_an_aws_connection_maps_region_session_token_endpoints_and_assumes_its_role(monkeypatch, tmp_path):
    """An Airflow ``aws`` connection as people write it: ``region_name``, ``aws_session_token``, ``endpoint_url`` (one
    for every service, or per service under ``service_config``) become pyiceberg's Glue and FileIO properties, and
    Airflow's own keys are not passed on. ``role_arn`` is assumed through STS with the connection's keys and its
    temporary keys replace them; a refusal names the role.

    STS is a stand-in here (a fake ``boto3`` module that records the call and refuses one role): boto3's botocore
    requires python-dateutil < 3, and the environment Airflow 3.3 installs has 4.0.0, so boto3 is not in this
    environment. The role assumed through moto's real STS, and batches through Glue with its keys, run in the Glue
    test environment: tests/integration/test_glue_catalog.py."""
    import sys
    import types

    from tidewater.config import connections

    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    monkeypatch.setattr(connections, "_CACHE", {})
    base = {"conn_type": "aws", "login": "AKIAEXAMPLEEXAMPLE00", "password": "aws-secret"}
    monkeypatch.setenv(
        "AIRFLOW_CONN_GLUE_PLAIN",
        json.dumps(
            {
                **base,
                "extra": {
                    "region_name": "eu-west-1",
                    "aws_session_token": "session-tok",
                    "endpoint_url": "http://aws.local:5000",
                    "service_config": {"s3": {"endpoint_url": "http://s3.local:9000"}},
                    "s3.path-style-access": "true",
                },
            }
        ),
    )
    plain = parse_pipeline({**BASE, "catalog": {"conn_id": "glue_plain"}}).catalog_properties()
    assert plain == {
        "type": "glue",
        "client.access-key-id": "AKIAEXAMPLEEXAMPLE00",
        "client.secret-access-key": "aws-secret",
        "client.region": "eu-west-1",
        "client.session-token": "session-tok",
        "glue.endpoint": "http://aws.local:5000",
        "s3.endpoint": "http://s3.local:9000",
        "s3.path-style-access": "true",
    }

    asked: list[dict] = []

    class ClientError(Exception):
        def __init__(self, message: str) -> None:
            super().__init__(message)
            self.response = {"Error": {"Message": message}}

    class Session:
        def __init__(self, **kw: object) -> None:
            self.kw = kw

        def client(self, service: str, endpoint_url: str | None = None) -> object:
            session = self

            class Sts:
                def assume_role(self, **ask: str) -> dict:
                    asked.append({"service": service, "endpoint": endpoint_url, "session": session.kw, **ask})
                    if ask["RoleArn"].endswith("/denied"):
                        raise ClientError("User is not authorized to perform: sts:AssumeRole")
                    return {"Credentials": {"AccessKeyId": "ASIATEMP", "SecretAccessKey": "temp-secret", "SessionToken": "temp-tok"}}

            return Sts()

    monkeypatch.setitem(sys.modules, "boto3", types.SimpleNamespace(Session=Session))
    monkeypatch.setitem(sys.modules, "botocore", types.ModuleType("botocore"))
    monkeypatch.setitem(sys.modules, "botocore.exceptions", types.SimpleNamespace(ClientError=ClientError, BotoCoreError=OSError))
    role = "arn:aws:iam::123456789012:role/tidewater-ingest"
    monkeypatch.setenv(
        "AIRFLOW_CONN_GLUE_ROLE", json.dumps({**base, "extra": {"region_name": "eu-west-1", "role_arn": role, "external_id": "ext-1"}})
    )
    assumed = parse_pipeline({**BASE, "catalog": {"conn_id": "glue_role"}}).catalog_properties()
    assert assumed == {
        "type": "glue",
        "client.access-key-id": "ASIATEMP",
        "client.secret-access-key": "temp-secret",
        "client.session-token": "temp-tok",
        "client.region": "eu-west-1",
    }
    assert asked == [
        {
            "service": "sts",
            "endpoint": None,
            "RoleArn": role,
            "RoleSessionName": "tidewater",
            "ExternalId": "ext-1",
            "session": {
                "aws_access_key_id": "AKIAEXAMPLEEXAMPLE00",
                "aws_secret_access_key": "aws-secret",
                "aws_session_token": None,
                "region_name": "eu-west-1",
            },
        }
    ]
    monkeypatch.setenv("AIRFLOW_CONN_GLUE_DENIED", json.dumps({**base, "extra": {"role_arn": role[: -len("tidewater-ingest")] + "denied"}}))
    with pytest.raises(ConfigError, match=r"connection 'glue_denied': STS refused to assume role_arn .*role/denied: User is not"):
        parse_pipeline({**BASE, "catalog": {"conn_id": "glue_denied"}}).catalog_properties()
    monkeypatch.setitem(sys.modules, "boto3", None)  # not installed
    monkeypatch.setattr(connections, "_CACHE", {})
    with pytest.raises(ConfigError, match="names role_arn, and assuming it needs boto3"):
        parse_pipeline({**BASE, "catalog": {"conn_id": "glue_role"}}).catalog_properties()


def test_the_schema_registry_from_an_airflow_connection(monkeypatch, tmp_path):
    """`format.registry_conn_id`: the host (scheme and port) is the URL, login and password the basic auth, the extra
    JSON client settings; `registry_*` set in the pipeline win. Validation does not ask for the connection."""
    from tidewater.config import connections

    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    monkeypatch.setattr(connections, "_CACHE", {})
    monkeypatch.setenv(
        "AIRFLOW_CONN_SR",
        json.dumps(
            {
                "conn_type": "https",
                "host": "sr.example.com",
                "port": 8081,
                "login": "sr-user",
                "password": "sr-pw",
                "extra": {"ssl.ca.location": "/etc/ca.pem"},
            }
        ),
    )
    fmt = {"value": "avro", "registry_conn_id": "sr"}
    spec = parse_pipeline({**BASE, "format": fmt})
    assert spec.registry() == ("https://sr.example.com:8081", "sr-user:sr-pw", {"ssl.ca.location": "/etc/ca.pem"})
    mine = parse_pipeline(
        {**BASE, "format": {**fmt, "registry_url": "http://mine:8081", "registry_settings": {"ssl.ca.location": "/mine.pem"}}}
    )
    assert mine.registry() == ("http://mine:8081", "sr-user:sr-pw", {"ssl.ca.location": "/mine.pem"})
    from tidewater.decode.registry_client import RegistryClient  # a connection's settings are text: the numeric ones are typed
    from tidewater.errors import TerminalError

    assert RegistryClient("http://sr:8081", None, {"timeout": "7", "max.retries": "3"})._client is not None
    with pytest.raises(TerminalError, match="format.registry_settings.timeout: 'soon' is not a number"):
        RegistryClient("http://sr:8081", None, {"timeout": "soon"})
    monkeypatch.setenv("AIRFLOW_CONN_NOHOST", json.dumps({"conn_type": "http"}))
    with pytest.raises(ConfigError, match="format.registry_conn_id: Airflow connection 'nohost' has no host"):
        parse_pipeline({**BASE, "format": {"value": "avro", "registry_conn_id": "nohost"}}).registry()


def test_object_storage_credentials_from_an_airflow_connection(monkeypatch, tmp_path):
    """`batch.staging_conn_id`: an `aws` connection's keys, endpoint and region as FileIO settings over the catalog's,
    `staging_properties` winning; the spec the Spark tasks get carries them resolved, with no connection id left."""
    from tidewater.config import connections

    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    monkeypatch.setattr(connections, "_CACHE", {})
    monkeypatch.setenv(
        "AIRFLOW_CONN_STORE",
        json.dumps(
            {
                "conn_type": "aws",
                "login": "AKIAEXAMPLEEXAMPLE00",
                "password": "store-secret",
                "extra": {"endpoint_url": "http://minio:9000", "region_name": "eu-west-1", "s3.path-style-access": "true"},
            }
        ),
    )
    spec = parse_pipeline(
        {
            **BASE,
            "catalog": {"properties": {"type": "sql", "uri": "sqlite:////c.db", "s3.region": "us-east-1"}},
            "batch": {"staging_dir": "s3://b/staging", "staging_conn_id": "store", "staging_properties": {"s3.region": "ap-south-1"}},
        }
    )
    assert spec.staging_file_properties() == {
        "type": "sql",
        "uri": "sqlite:////c.db",
        "s3.access-key-id": "AKIAEXAMPLEEXAMPLE00",
        "s3.secret-access-key": "store-secret",
        "s3.endpoint": "http://minio:9000",
        "s3.region": "ap-south-1",
        "s3.path-style-access": "true",
    }
    shipped = spec.for_executors().batch
    assert shipped.staging_conn_id is None and shipped.staging_properties["s3.secret-access-key"] == "store-secret"
    assert shipped.staging_properties["s3.region"] == "ap-south-1"


def test_every_problem_of_a_pipeline_file_is_reported_at_once(tmp_path):
    """Unknown keys (with their "did you mean" hints) and values of the wrong type anywhere in the file come
    in one error, one line each; so do the cross-field problems of different sections."""
    import pytest
    import yaml

    from tidewater.config.parse import load_pipeline
    from tidewater.errors import ConfigError

    path = tmp_path / "p.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "p",
                "topics": ["t"],
                "kafka": {"bootstrap_server": "h:9092"},
                "table": {"identifier": "ns.t", "evolve_schema": "maybe"},
                "batch": {"max_records": "lots"},
                "sheduel": "@hourly",
            }
        )
    )
    with pytest.raises(ConfigError) as e:
        load_pipeline(path)
    problems = e.value.problems
    assert len(problems) == 4, problems
    assert "kafka.bootstrap_server: unknown key (did you mean 'bootstrap_servers'?)" in problems
    assert "sheduel: unknown key (did you mean 'schedule'?)" in problems
    assert any(p.startswith("table.evolve_schema: expected true or false") for p in problems)
    assert any(p.startswith("batch.max_records: expected an integer") for p in problems)
    assert str(e.value).startswith(f"{path}: 4 problems:")

    path.write_text(
        yaml.safe_dump({"name": "Bad Name", "topics": ["t"], "kafka": {"settings": {"group.id": "g"}}, "table": {"identifier": "ns.t"}})
    )
    with pytest.raises(ConfigError) as e:
        load_pipeline(path)
    assert [p.split(":")[0] for p in e.value.problems] == ["name", "kafka"], e.value.problems


def test_the_pipeline_schema_for_editors_matches_the_code_and_the_parser():
    """docs/pipeline.schema.json is generated from the spec classes (`make docs`); every example pipeline
    file validates against it, and it refuses an unknown key as the parser does."""
    import json

    import jsonschema
    import yaml

    from tidewater.config.schema import pipeline_schema

    schema = json.loads((REPO / "docs" / "pipeline.schema.json").read_text())
    assert schema == json.loads(json.dumps(pipeline_schema()))
    validator = jsonschema.Draft202012Validator(schema)
    files = [
        REPO / "include" / "pipelines" / "pizzas.yaml",
        *sorted((REPO / "docs" / "examples").glob("*.yaml")),
        *sorted((REPO / "docker" / "pipelines").glob("*.yaml")),
    ]
    assert len(files) >= 4
    for f in files:
        assert list(validator.iter_errors(yaml.safe_load(f.read_text()))) == [], f
    doc = yaml.safe_load(files[0].read_text())
    doc["kafka"]["bootstrap_server"] = "typo:9092"
    assert [e.message for e in validator.iter_errors(doc)] == ["Additional properties are not allowed ('bootstrap_server' was unexpected)"]
    assert "Comma-separated host:port list" in schema["$defs"]["KafkaSpec"]["properties"]["bootstrap_servers"]["description"]


# Each case: (key, value, secret?). Secret either by the key's name or by what the value carries.
SECRET_CASES = [
    ("sasl.password", "pw", True),
    ("spark.hadoop.javax.jdo.option.ConnectionURL", "jdbc:postgresql://u:UrlPw-5555@db/x", True),
    ("spark.kubernetes.driverEnv.DB_PASS", "DbP-8888", True),
    ("spark.hadoop.fs.s3a.access.key", "AK-2222", True),
    ("spark.hadoop.fs.s3a.session.token", "tok", True),
    ("spark.executorEnv.API_TOKEN", "t", True),
    ("spark.yarn.appMasterEnv.AWS_SECRET_ACCESS_KEY", "s", True),
    ("spark.hadoop.fs.azure.account.key.acct.dfs.core.windows.net", "az", True),
    ("spark.hadoop.fs.gs.auth.service.account.private.key", "pk", True),
    ("spark.hadoop.javax.jdo.option.ConnectionPassword", "hive", True),
    ("s3.access-key-id", "AKIA0123456789ABCDEF", True),
    ("spark.custom.endpoint", "https://user:Pw-1@host:8443/p", True),  # a password in a URL, any key
    ("spark.custom.jdbc", "jdbc:sqlserver://db;user=u;password=Pw-2", True),  # a JDBC property
    ("spark.custom.url", "https://host/x?sig=abc&token=Tk-3", True),  # a query string
    ("spark.custom.pem", "-----BEGIN RSA PRIVATE KEY-----\nMII", True),
    ("spark.custom.id", "AKIAABCDEFGHIJKLMNOP", True),  # an AWS access key id
    ("bootstrap.servers", "h:1", False),
    ("spark.executorEnv.PATH", "/usr/bin", False),
    ("spark.sql.shuffle.partitions", "4", False),
    ("spark.eventLog.dir", "s3a://logs/spark", False),
    ("spark.master", "spark://127.0.0.1:7077", False),
    ("uri", "postgresql+psycopg2://app@db:5432/catalog", False),  # a user name alone
]


@pytest.mark.parametrize("key,value,expected", SECRET_CASES, ids=[c[0] + "=" + c[1][:12] for c in SECRET_CASES])
def test_a_setting_is_secret_by_its_key_or_by_its_value(key, value, expected):
    """What counts as a secret (config/secrets.py): key names, known credential keys, environment-style
    names, and values that carry one whatever the key. Secret ones are redacted and kept off the command line."""
    from tidewater.config.secrets import is_secret, split_secrets

    assert is_secret(key, value) is expected
    assert (redact({key: value})[key] == "***") is expected
    public, secret = split_secrets({key: value})
    assert (key in secret and key not in public) is expected


def test_spark_redaction_covers_what_the_write_job_passes_as_secret():
    """Spark's own redaction (UI, event logs) widened to our rules: every secret case's key or value matches
    the regex the write job sets, so Spark redacts it."""
    import re

    from tidewater.config.secrets import SPARK_REDACTION_REGEX

    rx = re.compile(SPARK_REDACTION_REGEX.replace("(?i)", ""), re.I)
    missed = [(k, v) for k, v, secret in SECRET_CASES if secret and not (rx.search(k) or rx.search(v))]
    assert missed == []


@pytest.mark.parametrize(
    ("executor", "many"),
    [
        (None, False),
        ("", False),
        ("LocalExecutor", False),
        ("airflow.executors.local_executor.LocalExecutor", False),
        ("fast:LocalExecutor", False),
        ("CeleryExecutor", True),
        ("LocalExecutor,KubernetesExecutor", True),
        ("edge:airflow.providers.edge3.executors.EdgeExecutor", True),
        ("my_company.executors.CustomExecutor", True),
    ],
)
def test_which_executors_can_run_a_batchs_tasks_on_different_hosts(executor, many):
    from tidewater.config.validate import multi_host

    assert multi_host(executor) is many


SHARED_STATE = {
    "catalog": {"properties": {"type": "sql", "uri": "postgresql+psycopg2://db/catalog", "warehouse": "s3://lake/warehouse"}},
    "batch": {"staging_dir": "s3://lake/staging"},
    "validation": {"data_docs_dir": "s3://lake/docs"},
}


@pytest.mark.parametrize(
    ("change", "setting", "words"),
    [
        (
            {"catalog": {"properties": {"type": "sql", "uri": "sqlite:////tmp/catalog.db", "warehouse": "s3://lake/w"}}},
            "catalog.properties.uri",
            "is a SQLite file",
        ),
        (
            {"catalog": {"properties": {"type": "sql", "uri": "postgresql+psycopg2://db/c", "warehouse": "file:///tmp/w"}}},
            "catalog.properties.warehouse",
            "is a local folder",
        ),
        (
            {"catalog": {"properties": {"type": "sql", "uri": "postgresql+psycopg2://db/c", "warehouse": "/srv/lake"}}},
            "catalog.properties.warehouse",
            "is a local folder",
        ),
        ({"batch": {"staging_dir": "/tmp/staging"}}, "batch.staging_dir", "is a local folder"),
        ({"batch": {"staging_dir": "file:///mnt/other/staging"}}, "batch.staging_dir", "is a local folder"),
        ({"batch": {}}, "batch.staging_dir", "by default each host keeps it under its own $TIDEWATER_HOME/staging"),
        ({"validation": {}}, "validation.data_docs_dir", "by default each host keeps it under its own"),
        ({"validation": {"data_docs_dir": "/var/tidewater/docs"}}, "validation.data_docs_dir", "is a local folder"),
        ({"catalog": {}}, "catalog.properties", "each host has its own SQLite catalog"),
    ],
)
@pytest.mark.parametrize("executor", ["CeleryExecutor", "KubernetesExecutor", "LocalExecutor,KubernetesExecutor"])
def test_a_multi_host_executor_refuses_every_per_host_place_naming_its_setting(executor, change, setting, words):
    """Under any executor that can put a batch's steps on different hosts (Kubernetes included), each per-host place
    of the pipeline's state is refused by name; the same pipeline passes under the LocalExecutor."""
    from tidewater.config.validate import check_hosts

    spec = parse_pipeline({**BASE, **SHARED_STATE, **change})
    with pytest.raises(ConfigError) as refused:
        check_hosts(spec, executor)
    assert f"{setting}: Airflow's executor ({executor}) can run a batch's tasks on different hosts" in str(refused.value)
    assert words in str(refused.value)
    check_hosts(spec, "LocalExecutor")  # one host: the same places are fine


def test_shared_paths_admit_local_folders_every_host_mounts_but_never_a_sqlite_catalog():
    """`airflow.shared_paths` declares mounts every host has (NFS, a CSI volume): a warehouse, staging folder and Data
    Docs folder under one pass under Celery; a folder beside it (same prefix, other name) does not; SQLite never does."""
    from tidewater.config.validate import check_hosts

    mounted = {
        **BASE,
        "airflow": {"shared_paths": ["/mnt/lake/"]},
        "catalog": {"properties": {"type": "sql", "uri": "postgresql+psycopg2://db/c", "warehouse": "/mnt/lake/w"}},
        "batch": {"staging_dir": "file:///mnt/lake/staging"},
        "validation": {"data_docs_dir": "/mnt/lake"},
    }
    check_hosts(parse_pipeline(mounted), "CeleryExecutor")
    beside = {**mounted, "batch": {"staging_dir": "/mnt/lakehouse/staging"}}
    with pytest.raises(ConfigError, match=r"batch\.staging_dir: .* '/mnt/lakehouse/staging' is a local folder"):
        check_hosts(parse_pipeline(beside), "CeleryExecutor")
    sqlite = {**mounted, "catalog": {"properties": {"uri": "sqlite:////mnt/lake/c.db", "warehouse": "/mnt/lake/w"}}}
    with pytest.raises(ConfigError, match=r"catalog\.properties\.uri: .*SQLite's locks do not hold"):
        check_hosts(parse_pipeline(sqlite), "CeleryExecutor")


def test_a_rest_catalogs_warehouse_is_a_name_not_a_folder():
    from tidewater.config.validate import check_hosts

    rest = {**BASE, **SHARED_STATE, "catalog": {"properties": {"type": "rest", "uri": "https://cat", "warehouse": "lake"}}}
    check_hosts(parse_pipeline(rest), "KubernetesExecutor")
    untyped = {**rest, "catalog": {"properties": {"uri": "https://cat", "warehouse": "lake"}}}  # REST by its uri
    check_hosts(parse_pipeline(untyped), "CeleryExecutor")


def test_kafka_start_from_is_earliest_latest_or_a_time_and_anything_else_is_refused_naming_it():
    assert parse_pipeline(BASE).kafka.start_from == "earliest"
    for good in ("latest", "2026-11-01T00:00:00Z"):
        assert parse_pipeline({**BASE, "kafka": {**BASE["kafka"], "start_from": good}}).kafka.start_from == good
    for bad in ("Latest", "end", "yesterday", "2026-13-01"):
        with pytest.raises(ConfigError, match=rf"kafka.start_from \(earliest, latest, or an ISO-8601 time\): '{bad}' is not"):
            parse_pipeline({**BASE, "kafka": {**BASE["kafka"], "start_from": bad}})


MODES = [
    ("format.key", "none"),
    ("format.metadata", "none"),
    ("dead_letter.policy", "dead_letter"),
    ("table.truncate", "dead_letter"),
    ("table.key_source", "value"),
    ("routing.unmatched", "dead_letter"),
    ("validation.not_null_policy", "fail"),
    ("validation.unique_ids", "none"),
    ("validation.on_failure", "fail"),
    ("maintenance.rewrite_data_files.strategy", "auto"),
]


@pytest.mark.parametrize(("key", "default"), MODES)
def test_every_mode_setting_has_its_choices_in_one_place_and_refuses_others_naming_them(key, default):
    """A mode's choices are its type (config/spec.py: Literal): the parser refuses any other value naming the setting
    and its choices, the JSON Schema lists them as an enum, and the reference shows them; the default is one."""
    import typing

    from tidewater.config.schema import pipeline_schema
    from tidewater.config.spec import PipelineSpec

    *path, leaf = key.split(".")
    doc: dict = {}
    node = doc
    for part in path:
        node = node.setdefault(part, {})
    node[leaf] = "nonsense"
    with pytest.raises(ConfigError) as refused:
        parse_pipeline({**BASE, **doc})
    cls = PipelineSpec
    for part in path:
        cls = typing.get_type_hints(cls)[part]
    choices = typing.get_args(typing.get_type_hints(cls)[leaf])
    assert default in choices and len(choices) >= 2
    assert f"{key}: 'nonsense' is not one of {', '.join(choices)}" in str(refused.value)
    schema = pipeline_schema()
    target = schema if not path else schema["$defs"][cls.__name__]
    assert target["properties"][leaf]["enum"] == list(choices)
    assert " | ".join(f'"{c}"' for c in choices) in reference_markdown()
