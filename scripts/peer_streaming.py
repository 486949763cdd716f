"""The Structured Streaming peer of `make bench-peers`: Kafka into an Iceberg table with a checkpoint, the shape a
Spark shop writes (Spark's Kafka source, ``from_json`` with the table's schema, the Iceberg sink in append mode).

Run by spark-submit (scripts/peers.py ``StreamingQuery``) with Spark's Kafka source and Iceberg's Spark runtime on
the classpath and the shared JDBC catalog configured as ``spark.sql.catalog.peers``. Runs until it is stopped.

    peer_streaming.py BOOTSTRAP TOPIC TABLE CHECKPOINT TRIGGER_SECONDS

``TRIGGER_SECONDS`` 0 is Spark's default trigger (the next micro-batch as soon as the last one ends).
"""

from __future__ import annotations

import sys

from pyspark.sql import SparkSession
from pyspark.sql import functions as F


def main() -> None:
    bootstrap, topic, table, checkpoint, trigger = sys.argv[1:6]
    spark = SparkSession.builder.appName(f"peer-streaming-{topic}").getOrCreate()
    columns = [f for f in spark.table(table).schema.fields if not f.name.startswith("_kafka_")]
    value_schema = ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in columns)
    source = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("kafka.isolation.level", "read_committed")
        .option("failOnDataLoss", "true")
        .load()
    )
    rows = source.select(
        F.from_json(F.col("value").cast("string"), value_schema).alias("v"),
        F.col("topic").alias("_kafka_topic"),
        F.col("partition").alias("_kafka_partition"),
        F.col("offset").alias("_kafka_offset"),
        F.col("timestamp").alias("_kafka_timestamp"),
    ).select("v.*", "_kafka_topic", "_kafka_partition", "_kafka_offset", "_kafka_timestamp")
    writer = rows.writeStream.format("iceberg").outputMode("append").option("checkpointLocation", checkpoint)
    if float(trigger) > 0:
        writer = writer.trigger(processingTime=f"{float(trigger):g} seconds")
    writer.toTable(table).awaitTermination()


if __name__ == "__main__":
    main()
