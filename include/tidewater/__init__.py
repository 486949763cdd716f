"""Tidewater: exactly-once micro-batch ingestion from Kafka into Apache Iceberg, run by Airflow."""

from __future__ import annotations

__version__ = "0.2.0"
