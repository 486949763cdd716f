"""Tidewater: exactly-once micro-batch ingestion from Kafka into Apache Iceberg, run by Airflow."""

from __future__ import annotations

# The one place the version is kept (the package's metadata reads it). Between releases main is the next version's
# development release (PEP 440 ``.devN``): a wheel built from main never claims to be a release.
__version__ = "0.3.0.dev0"
