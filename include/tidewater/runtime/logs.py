"""Logging set-up for command-line and Spark entry points (library code only uses getLogger)."""

from __future__ import annotations

import logging
import os


def configure_logging(level: str | None = None) -> None:
    logging.basicConfig(
        level=(level or os.environ.get("TIDEWATER_LOG_LEVEL", "INFO")).upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("great_expectations", "py4j", "urllib3", "pyiceberg"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
