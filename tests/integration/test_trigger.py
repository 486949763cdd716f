"""The lag trigger's check (`plan/pending.py`) and the trigger itself (`runtime/triggers.py`) against the
real broker and catalog; the scheduler test is in tests/e2e/test_ingest_dag.py."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.conftest import ingest_inline, produce_to_partition, write_pipeline
from tidewater.config.parse import load_pipeline
from tidewater.errors import ConfigError
from tidewater.plan.pending import pending
from tidewater_dev.sample_data import pizza_events

pytestmark = [pytest.mark.integration]


def test_pending_records_bytes_and_age_each_start_a_batch(broker, home, topic):
    """Each threshold, alone, says why a batch should start; a committed batch brings pending back to 0."""

    def spec_with(**trigger):
        return load_pipeline(write_pipeline(home, topics=[topic], kafka={"bootstrap_servers": broker.bootstrap}, trigger=trigger))

    records = spec_with(pending_records=50)
    produce_to_partition(broker.bootstrap, topic, 0, pizza_events(40, seed=130))
    now = pending(records)
    assert now.records == 40 and now.exceeded(records) is None
    produce_to_partition(broker.bootstrap, topic, 0, pizza_events(20, seed=131))
    assert pending(records).exceeded(records) == "60 pending records > trigger.pending_records 50"

    by_bytes = spec_with(pending_bytes=5_000)
    size = pending(by_bytes).bytes_estimate
    assert 60 * 100 < size < 60 * 400  # 60 pizza events of a few hundred bytes each
    assert pending(by_bytes).exceeded(by_bytes).startswith(f"about {size} pending bytes > trigger.pending_bytes 5000")

    by_age = spec_with(max_age_seconds=1)
    time.sleep(1.5)
    assert "old > trigger.max_age_seconds 1" in pending(by_age).exceeded(by_age)

    ingest_inline(records)
    after = pending(records)
    assert after.records == 0 and after.exceeded(records) is None and after.exceeded(by_age) is None
    with pytest.raises(ConfigError, match="trigger.pending_records: must be at least 1"):
        spec_with(pending_records=0)


def test_the_trigger_fires_once_per_batch(broker, home, topic):
    """The trigger fires when records pile up, stays quiet while the batch it started has not committed,
    and fires again after the commit when records pile up again."""
    from tidewater.runtime.triggers import PendingDataTrigger

    path = write_pipeline(
        home, topics=[topic], kafka={"bootstrap_servers": broker.bootstrap}, trigger={"pending_records": 10, "poll_seconds": 1}
    )
    produce_to_partition(broker.bootstrap, topic, 0, pizza_events(15, seed=132))
    trigger = PendingDataTrigger(str(path), poll_seconds=1)
    assert trigger.serialize() == ("tidewater.runtime.triggers.PendingDataTrigger", {"pipeline_path": str(path), "poll_seconds": 1})

    async def scenario() -> list[dict]:
        events = []
        run = trigger.run()
        events.append((await asyncio.wait_for(run.__anext__(), 30)).payload)
        following = asyncio.ensure_future(run.__anext__())
        done, _ = await asyncio.wait({following}, timeout=3)
        assert not done  # 15 records still pending, but no commit yet: no second batch
        await asyncio.to_thread(ingest_inline, load_pipeline(path))
        produce_to_partition(broker.bootstrap, topic, 0, pizza_events(12, seed=133))
        events.append((await asyncio.wait_for(following, 30)).payload)
        await run.aclose()
        return events

    first, second = asyncio.run(scenario())
    assert first == {"pipeline": "orders", "reason": "15 pending records > trigger.pending_records 10", "pending_records": 15}
    assert second["pending_records"] == 12
