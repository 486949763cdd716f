"""The navigation page's and the dashboard panel's lines (``tidewater.ops.pipelines.summaries``), on the real broker
and catalog: many pipelines on one broker cost one metadata request and one pair of ListOffsets requests, and each
line says what ``status`` says of its pipeline."""

from __future__ import annotations

import pytest

from tests.conftest import ingest_inline, write_pipeline
from tidewater.config.parse import load_pipeline
from tidewater.ops import pipelines
from tidewater.ops.status import status
from tidewater_dev.sample_data import pizza_events, produce

pytestmark = [pytest.mark.integration]


def test_pipelines_on_one_broker_are_asked_together_and_each_line_matches_its_status(broker, home, topic, monkeypatch):
    """Three pipelines on the embedded broker (one ingested then behind by 10 records, one by a topic pattern and
    never ingested, one naming a topic the broker lacks) and one whose librdkafka settings are refused. The three are
    read with one metadata and one watermarks call (d, with settings of its own, is asked apart); each line's lag is
    ``status``'s, the missing topic is a problem of its own line, and the refused settings are a terminal error of
    their line only. Without the pattern pipeline, the named topics alone are described, with the same lines."""
    produce(broker.bootstrap, topic, pizza_events(30, seed=1), partitions=2)
    produce(broker.bootstrap, f"{topic}-x", pizza_events(25, seed=2), partitions=3)
    kafka = {"bootstrap_servers": broker.bootstrap}
    specs = [
        load_pipeline(write_pipeline(home, name="a", topics=[topic], kafka=kafka, table={"identifier": "rpc.a"})),
        load_pipeline(write_pipeline(home, name="b", topics=[], topic_pattern=f"{topic}-.*", kafka=kafka, table={"identifier": "rpc.b"})),
        load_pipeline(write_pipeline(home, name="c", topics=[f"{topic}-missing"], kafka=kafka, table={"identifier": "rpc.c"})),
        load_pipeline(
            write_pipeline(
                home,
                name="d",
                topics=[topic],
                table={"identifier": "rpc.d"},
                kafka={**kafka, "settings": {"no.such.librdkafka.setting": "1"}},
            )
        ),
    ]
    ingest_inline(specs[0])
    produce(broker.bootstrap, topic, pizza_events(10, seed=3), partitions=2)

    calls = {"cluster_topics": 0, "watermarks": 0}
    for name in calls:
        real = getattr(pipelines, name)

        def counted(*args, _real=real, _name=name, **kwargs):
            calls[_name] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(pipelines, name, counted)
    a, b, c, d = pipelines.summaries(specs)

    # one metadata request per set of librdkafka settings: the three on the broker, and d's own (refused, so d
    # reaches no watermarks request); one watermarks request for the three
    assert calls == {"cluster_topics": 2, "watermarks": 1}
    assert (a["lag"], a["partitions"], a["error"], a["problems"]) == (10, 2, None, [])
    assert a["lag"] == status(specs[0])["total_lag"] and a["freshness_s"] is not None and a["freshness_s"] >= 0
    assert (a["quarantined"], a["open_dead_letters"], a["audit"]) == (0, 0, None)
    assert (b["lag"], b["partitions"], b["error"]) == (25, 3, None) and b["lag"] == status(specs[1])["total_lag"]
    assert b["freshness_s"] is None  # never ingested
    assert c["error"] is None and c["lag"] == 0
    assert c["problems"] == [f"topics: topic '{topic}-missing' is not available on the broker"]
    assert d["lag"] is None and d["transient"] is False and "no.such.librdkafka.setting" in d["error"]
    # without a topic pattern among them, the broker is asked for the named topics only (DescribeTopics)
    again = pipelines.summaries([specs[0], specs[2]])
    assert [(x["lag"], x["partitions"], x["problems"]) for x in again] == [(10, 2, []), (0, 0, c["problems"])]
    assert calls == {"cluster_topics": 3, "watermarks": 2}
