"""Times given in settings and requests (ISO 8601), as Kafka's timestamps count them: epoch milliseconds."""

from __future__ import annotations

from datetime import datetime, timezone

from tidewater.errors import ConfigError


def parse_time(value: str, name: str) -> int:
    """Epoch milliseconds of an ISO-8601 time (naive: UTC); ConfigError naming ``name`` when it is not one."""
    try:
        t = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(f"{name}: {value!r} is not an ISO-8601 time (e.g. 2024-01-04T12:00:00Z)") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=timezone.utc)
    return int(t.timestamp() * 1000)
