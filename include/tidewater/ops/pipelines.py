"""Many pipelines at once, one line each, as the Tidewater navigation page and the dashboard panel list them: lag,
freshness, the last audit's verdict, quarantined batches and open dead letters.

The cost is one metadata request (DescribeTopics) and one pair of ListOffsets requests per broker (the pipelines that share a broker's
librdkafka settings are asked together), plus each pipeline's own table metadata (its offsets, its kept dead-letter
counts, the ledger's last verdict): no pipeline's data is scanned. The page asked for one pipeline's whole overview per
pipeline before, a consumer and an admin client each (``make bench-scale``, curve 1).
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Any

from tidewater.audit import ledger
from tidewater.config.spec import PipelineSpec
from tidewater.errors import TidewaterError
from tidewater.ops import quarantine
from tidewater.ops.status import PartitionStatus
from tidewater.source.kafka import cluster_topics, kafka_settings, pipeline_topics, watermarks
from tidewater.table.catalog import load_catalog
from tidewater.table.letters import counts as letter_counts
from tidewater.table.targets import holder_state

log = logging.getLogger(__name__)

Ends = dict[tuple[str, int], tuple[int, int]]


def summaries(specs: list[PipelineSpec]) -> list[dict[str, Any]]:
    """One line per pipeline of ``specs``, in their order. A pipeline whose broker or catalog cannot be read has its
    ``error`` (and ``transient``: whether asking again may answer) and None for what could not be read; the others are
    unaffected."""
    lines: dict[str, dict[str, Any]] = {}
    brokers: dict[tuple[tuple[str, str], ...], tuple[dict[str, str], list[PipelineSpec]]] = {}
    for spec in specs:
        try:
            settings = kafka_settings(spec)
        except TidewaterError as e:
            lines[spec.name] = _line(spec, None, e)
            continue
        # the key holds the settings' secrets: it stays in this function, never logged or returned
        brokers.setdefault(tuple(sorted(settings.items())), (settings, []))[1].append(spec)
    for settings, members in brokers.values():
        try:
            ends = _ends_by_pipeline(settings, members)
        except TidewaterError as e:
            lines.update({spec.name: _line(spec, None, e) for spec in members})
            continue
        lines.update({spec.name: _line(spec, ends[spec.name], None) for spec in members})
    return [lines[spec.name] for spec in specs]


def _ends_by_pipeline(settings: dict[str, str], specs: list[PipelineSpec]) -> dict[str, tuple[Ends, list[str]]]:
    """Each pipeline's (log start, end) per partition and the listed topics the broker does not have: one metadata
    request (for the named topics, or every topic when one of ``specs`` has a topic pattern) and one ListOffsets pair
    for all of ``specs`` (one broker's)."""
    named = None if any(spec.topic_pattern for spec in specs) else sorted({t for spec in specs for t in spec.topics})
    cluster = cluster_topics(settings, named)
    found = {spec.name: pipeline_topics(spec, cluster) for spec in specs}
    wanted = sorted({(t, p) for topics, _ in found.values() for t in topics for p in cluster[t]})
    ends = watermarks(settings, wanted)
    return {name: ({(t, p): ends[(t, p)] for t in topics for p in cluster[t]}, missing) for name, (topics, missing) in found.items()}


def _line(spec: PipelineSpec, ends: tuple[Ends, list[str]] | None, failure: TidewaterError | None) -> dict[str, Any]:
    """The pipeline's line: its partitions' lag against the offsets its holder committed, and what its tables keep."""
    line: dict[str, Any] = {
        "name": spec.name,
        "lag": None,
        "partitions": None,
        "freshness_s": None,
        "audit": None,
        "quarantined": None,
        "open_dead_letters": None,
        "problems": [],
        "error": None,
        "transient": None,
    }
    if failure is not None or ends is None:
        return {**line, "error": str(failure), "transient": getattr(failure, "transient", None)}
    try:
        catalog = load_catalog(spec)
        _, state = holder_state(catalog, spec)
        committed = state.offsets if state is not None else {}
        parts = [PartitionStatus(t, p, committed.get(t, {}).get(p), lo, hi) for (t, p), (lo, hi) in sorted(ends[0].items())]
        vt = state.valid_through_ms if state is not None else None
        line.update(
            lag=sum(p.lag for p in parts),
            partitions=len(parts),
            freshness_s=round(datetime.now(timezone.utc).timestamp() - vt / 1000, 1) if vt is not None else None,
            audit=ledger.last_verdict(catalog, spec),
            quarantined=len(quarantine.list_all(spec)),
            open_dead_letters=letter_counts(spec, catalog)["open"],
            problems=[f"topics: topic {t!r} is not available on the broker" for t in ends[1]] + [p.problem for p in parts if p.problem],
        )
    except TidewaterError as e:
        line.update(error=str(e), transient=e.transient)
    except Exception as e:
        log.warning("pipeline %s: its line for the view failed: %s", spec.name, e, exc_info=True)
        line.update(error=f"{type(e).__name__}: {e}")
    return line
