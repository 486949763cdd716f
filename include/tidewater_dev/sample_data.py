"""Sample events of the users' scenarios, for the demo and tests (completed pizza orders)."""

from __future__ import annotations

import base64
import io
import json
import random
import struct
import threading
import uuid
from datetime import datetime, timedelta
from http.server import BaseHTTPRequestHandler, HTTPServer

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

SAUCES = ["regular", "light", "extra", "none", "bbq", "alfredo"]


CHEESES = ["mozzarella", "three cheese", "goat cheese", "extra", "none"]


MEATS = ["ham", "pepperoni", "sausage", "chicken", "bacon", "none"]


VEGGIES = ["onions & pineapple", "peppers", "mushrooms", "olives", "spinach", "none"]


def pizza_events(n: int, seed: int = 0, stores: int = 100, start: datetime | None = None) -> list[bytes]:
    """``n`` completed-pizza JSON events (Scenario 1), deterministic for a seed."""
    rnd = random.Random(seed)
    t = start or datetime(2024, 1, 4, 12, 0, 0)
    out = []
    for _ in range(n):
        t += timedelta(seconds=rnd.randint(0, 3))
        out.append(
            json.dumps(
                {
                    "order_id": str(uuid.UUID(int=rnd.getrandbits(128))),
                    "store_id": rnd.randint(1, stores) if rnd.random() < 0.7 else rnd.randint(1, 10),
                    "sauce": rnd.choice(SAUCES),
                    "cheese": rnd.choice(CHEESES),
                    "meats": rnd.choice(MEATS),
                    "veggies": rnd.choice(VEGGIES),
                    "date_ordered": t.strftime("%Y-%m-%d %H:%M:%S"),
                },
                separators=(", ", ": "),
            ).encode()
        )
    return out


def produce(bootstrap: str, topic: str, values: list[bytes], partitions: int = 6, create: bool = True,
            settings: dict[str, str] | None = None) -> dict[int, int]:
    """Produce ``values`` round-robin over ``partitions``; returns records per partition.

    The last record of every partition is flushed as its own produce request so that brokers that
    report the high watermark per batch (the embedded one) see the whole partition.
    """
    conf = {"bootstrap.servers": bootstrap, **(settings or {})}
    if create:
        admin = AdminClient(conf)
        existing = admin.list_topics(timeout=10).topics
        if topic not in existing:
            fut = admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])[topic]
            fut.result(timeout=15)
    producer = Producer({**conf, "linger.ms": 5, "enable.idempotence": True})
    per_part: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
    for i, v in enumerate(values):
        per_part[i % partitions].append(v)
    lasts = []
    for p, vals in per_part.items():
        for v in vals[:-1]:
            while True:
                try:
                    producer.produce(topic, v, partition=p)
                    break
                except BufferError:  # local queue full: let deliveries drain
                    producer.poll(0.2)
            producer.poll(0)
        if vals:
            lasts.append((p, vals[-1]))
    producer.flush(30)
    for p, v in lasts:
        producer.produce(topic, v, partition=p)
        producer.flush(30)
    return {p: len(v) for p, v in per_part.items()}


PIZZA_AVRO_SCHEMA = {
    "type": "record", "name": "CompletedPizza", "namespace": "rpc",
    "fields": [{"name": n, "type": t} for n, t in [
        ("order_id", "string"), ("store_id", "int"), ("sauce", "string"), ("cheese", "string"),
        ("meats", "string"), ("veggies", "string"), ("date_ordered", "string"),
    ]],
}


def avro_framed(values: list[bytes], schema_id: int = 1, schema: dict | None = None) -> list[bytes]:
    """JSON pizza events re-encoded as Confluent-framed Avro (magic byte, schema id, body)."""
    import fastavro

    parsed = fastavro.parse_schema(schema or PIZZA_AVRO_SCHEMA)
    head = b"\x00" + struct.pack(">I", schema_id)
    out = []
    for v in values:
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, json.loads(v))
        out.append(head + buf.getvalue())
    return out


class LocalSchemaRegistry:
    """A minimal in-process schema registry answering ``GET /schemas/ids/{id}`` like Confluent's, for the
    demo, tests and benchmarks on machines without a registry. Not for production use."""

    def __init__(self, schemas: dict[int, dict], basic_auth: str | None = None) -> None:
        self.schemas = dict(schemas)
        self.basic_auth = basic_auth  # "user:password" required when set (401 otherwise)
        self._server = None

    def start(self) -> str:
        schemas = self.schemas
        expected = "Basic " + base64.b64encode(self.basic_auth.encode()).decode() if self.basic_auth else None

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server API
                tail = self.path.rsplit("/", 1)[-1]
                sid = int(tail) if self.path.startswith("/schemas/ids/") and tail.isdigit() else -1
                if expected is not None and self.headers.get("Authorization") != expected:
                    body, code = json.dumps({"error_code": 401, "message": "Unauthorized"}).encode(), 401
                elif sid in schemas:
                    body, code = json.dumps({"schema": json.dumps(schemas[sid])}).encode(), 200
                else:
                    body, code = json.dumps({"error_code": 40403, "message": "Schema not found"}).encode(), 404
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self._server = HTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self._server.server_port}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server = None
