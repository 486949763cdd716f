"""How Tidewater names datasets in OpenLineage events, and what it never puts in them (no broker, no Airflow)."""

from __future__ import annotations

from types import SimpleNamespace

from tidewater.runtime.lineage import _location_name, _strip_user_info, gate_assertions, kafka_namespace


def test_table_locations_name_datasets_as_openlineage_names_iceberg_tables_without_user_info():
    assert _location_name("/data/warehouse/rpc.db/orders") == ("file", "/data/warehouse/rpc.db/orders")
    assert _location_name("file:///data/warehouse/rpc/orders") == ("file", "/data/warehouse/rpc/orders")
    assert _location_name("s3://lake/warehouse/rpc/orders") == ("s3://lake", "warehouse/rpc/orders")
    assert _location_name("s3a://AKIA123:SeCrEt@lake:9000/w/t") == ("s3a://lake:9000", "w/t")
    assert _strip_user_info("postgresql://tw:pw-123@db:5432/catalog") == "postgresql://db:5432/catalog"
    assert _strip_user_info("s3://lake/warehouse") == "s3://lake/warehouse"


def test_kafka_namespace_is_the_first_bootstrap_server_without_a_listener_name():
    spec = SimpleNamespace(
        kafka=SimpleNamespace(conn_id=None, bootstrap_servers="SASL_SSL://b1:9093, b2:9093", settings={"sasl.password": "pw"})
    )
    assert kafka_namespace(spec) == "kafka://b1:9093"


def test_gate_checks_become_assertions_with_their_column_and_observed_values():
    report = {
        "checks": [
            {"expectation": "expect_column_values_to_not_be_null", "kwargs": {"column": "order_id"}, "success": True, "observed": {}},
            {
                "expectation": "expect_column_values_to_be_between",
                "kwargs": {"column": "store_id", "max_value": 5},
                "success": False,
                "observed": {"unexpected_count": 7},
            },
        ]
    }
    ok, bad = gate_assertions(report)
    assert (ok.assertion, ok.column, ok.success, ok.actual) == ("expect_column_values_to_not_be_null", "order_id", True, None)
    assert (bad.column, bad.success, bad.params, bad.actual) == ("store_id", False, {"max_value": "5"}, '{"unexpected_count": 7}')
    assert gate_assertions(None) is None
