"""The provider metadata Airflow lists for the package (its ``apache_airflow_provider`` entry point). Airflow calls it
while its own configuration is still loading, so this module imports nothing of Airflow (or anything heavy)."""

from __future__ import annotations

from typing import Any

from tidewater import __version__
from tidewater.config.airflow_section import OPTIONS, SECTION


def get_provider_info() -> dict[str, Any]:
    """What ``airflow providers list`` shows of the package, and the connections its DAGs use."""
    return {
        "package-name": "airflow-provider-tidewater",
        "name": "Tidewater",
        # shown by `airflow providers list`, which renders it as Markdown: no names with underscores
        "description": (
            "Exactly-once micro-batch ingestion from Kafka into Apache Iceberg, orchestrated by Airflow. The ingest "
            "DAGs submit their write step through a Spark connection (type spark, from the Apache Spark provider; "
            "its id is the pipeline's spark.conn_id setting); the brokers and the catalog come from the pipeline files."
        ),
        "versions": [__version__],
        "triggers": [{"integration-name": "Tidewater", "python-modules": ["tidewater.runtime.triggers"]}],
        "config": {
            SECTION: {
                "description": "Tidewater's deployment settings; a TIDEWATER_* variable of the same meaning wins.",
                "options": {
                    option: {
                        "description": f"{text} (The variable {env} overrides it.)",
                        "version_added": "0.3.0",
                        "type": "string",
                        "example": None,
                        "default": None,
                    }
                    for option, (env, text) in OPTIONS.items()
                },
            }
        },
    }
