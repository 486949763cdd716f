"""Topic patterns: daily-rotated topics matched by a regular expression are picked up at the next plan,
and every topic's offsets are tracked in the table (real broker and catalog)."""

from __future__ import annotations

import pytest

from tests.conftest import ingest_inline, stage_inline, table_of, write_pipeline
from tidewater.commit.batch import commit_batch
from tidewater.config.parse import load_pipeline
from tidewater.plan.ingest import plan_batch
from tidewater.steps.lifecycle import validate_step
from tidewater.table.catalog import load_catalog
from tidewater.table.summary import committed_state
from tidewater_dev.sample_data import pizza_events, produce

pytestmark = [pytest.mark.integration]


def test_daily_topics_are_picked_up_as_they_appear_and_a_retried_commit_adds_nothing(broker, home, topic):
    """`<prefix>.YYYYMMDD` topics: day 1 is ingested; day 2 appears (and day 1 grows) -> the next batch
    covers both; a topic that does not match is never read; committing the last batch again is a no-op."""
    prefix = topic.replace("-", "_")
    day1, day2, other = f"{prefix}.20240102", f"{prefix}.20240103", f"{prefix}.archive"
    path = write_pipeline(
        home, topics=[], topic_pattern=prefix.replace(".", r"\.") + r"\.\d{8}", kafka={"bootstrap_servers": broker.bootstrap}
    )
    spec = load_pipeline(path)
    assert plan_batch(spec)[1] is None  # nothing matches yet: empty plan, nothing staged

    produce(broker.bootstrap, day1, pizza_events(30, seed=81), partitions=2)
    produce(broker.bootstrap, other, pizza_events(7, seed=82), partitions=1)
    assert ingest_inline(spec).records == 30
    assert committed_state(table_of(path)).offsets == {day1: {0: 15, 1: 15}}

    produce(broker.bootstrap, day2, pizza_events(20, seed=83), partitions=2)
    produce(broker.bootstrap, day1, pizza_events(10, seed=84), partitions=2, create=False)
    plan, manifest = stage_inline(spec)
    validate_step(spec, plan, manifest)
    assert commit_batch(load_catalog(spec), plan, manifest).status == "committed"
    assert commit_batch(load_catalog(spec), plan, manifest).status == "already-committed"  # retry after success

    table = table_of(path)
    assert table.scan().to_arrow().num_rows == 60
    assert committed_state(table).offsets == {day1: {0: 20, 1: 20}, day2: {0: 10, 1: 10}}
    assert len(table.snapshots()) == 2
    assert plan_batch(spec)[1] is None  # caught up on every matching topic; the other topic stays unread
