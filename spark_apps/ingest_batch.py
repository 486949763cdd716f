"""spark-submit entry point of the write step: read a planned offset range, write data files, never commit.

Usage: spark-submit ... spark_apps/ingest_batch.py --plan STAGING/<pipeline>/<batch>/plan.json
"""

from __future__ import annotations

import sys

from tidewater.write.job import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
