"""Where the development tools look for what `make setup` installed: beside this checkout."""

from __future__ import annotations

from pathlib import Path

from tidewater_dev import spark_connect
from tidewater_dev.broker import CHECKOUT

REPO = Path(__file__).resolve().parents[2]


def test_the_spark_connect_distribution_is_looked_for_in_this_checkout(monkeypatch) -> None:
    """`make spark-connect` and `make bench` start the server from the default folder: it is the checkout's
    .data/spark-connect (it once pointed one folder above the checkout), unless the environment names another."""
    monkeypatch.delenv(spark_connect.DIST_ENV, raising=False)
    assert CHECKOUT == REPO
    assert spark_connect.default_dist() == REPO / ".data" / "spark-connect"
    monkeypatch.setenv(spark_connect.DIST_ENV, "/opt/pyspark-4")
    assert spark_connect.default_dist() == Path("/opt/pyspark-4")
