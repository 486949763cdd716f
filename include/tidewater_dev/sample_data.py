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
from typing import Any
from urllib.parse import unquote, urlsplit

from confluent_kafka import KafkaError, KafkaException, Producer
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


class Deliveries:
    """A producer's delivery callback that keeps the first failed delivery, so that producing test or demo data never
    loses a record silently (a broker refuses one larger than its ``message.max.bytes``, say); ``check`` raises it."""

    def __init__(self) -> None:
        self.failed: tuple[Any, Any] | None = None

    def __call__(self, err: Any, msg: Any) -> None:
        if err is not None and self.failed is None:
            self.failed = (err, msg)

    def check(self) -> None:
        if self.failed is not None:
            err, msg = self.failed
            raise RuntimeError(f"a record was not delivered to {msg.topic()}[{msg.partition()}]: {err.str()}")


def ensure_topic(conf: dict[str, Any], topic: str, partitions: int) -> None:
    """Create ``topic`` unless it exists. A topic just created elsewhere may be missing from this client's
    metadata for a moment, so the broker's TOPIC_ALREADY_EXISTS answer counts as success."""
    admin = AdminClient(conf)
    if topic in admin.list_topics(timeout=10).topics:
        return
    try:
        admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])[topic].result(timeout=15)
    except KafkaException as e:
        if e.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise


def produce(
    bootstrap: str, topic: str, values: list[bytes], partitions: int = 6, create: bool = True, settings: dict[str, str] | None = None
) -> dict[int, int]:
    """Produce ``values`` round-robin over ``partitions``; returns records per partition.

    The last record of every partition is flushed as its own produce request so that brokers that
    report the high watermark per batch (the embedded one) see the whole partition.
    """
    conf = {"bootstrap.servers": bootstrap, **(settings or {})}
    if create:
        ensure_topic(conf, topic, partitions)
    deliveries = Deliveries()
    producer = Producer({**conf, "linger.ms": 5, "enable.idempotence": True, "on_delivery": deliveries})
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
    deliveries.check()
    return {p: len(v) for p, v in per_part.items()}


PIZZA_AVRO_SCHEMA = {
    "type": "record",
    "name": "CompletedPizza",
    "namespace": "rpc",
    "fields": [
        {"name": n, "type": t}
        for n, t in [
            ("order_id", "string"),
            ("store_id", "int"),
            ("sauce", "string"),
            ("cheese", "string"),
            ("meats", "string"),
            ("veggies", "string"),
            ("date_ordered", "string"),
        ]
    ],
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


PIZZA_JSON_SCHEMA = {
    "type": "object",
    "title": "CompletedPizza",
    "properties": {
        n: {"type": t}
        for n, t in [
            ("order_id", "string"),
            ("store_id", "integer"),
            ("sauce", "string"),
            ("cheese", "string"),
            ("meats", "string"),
            ("veggies", "string"),
            ("date_ordered", "string"),
        ]
    },
    "required": ["order_id", "store_id"],
}


def json_schema_framed(values: list[bytes], schema_id: int) -> list[bytes]:
    """JSON pizza events in Confluent's JSON Schema wire format (magic byte, schema id, the document as it is)."""
    head = b"\x00" + struct.pack(">I", schema_id)
    return [head + v for v in values]


def pizza_proto() -> Any:
    """``rpc.CompletedPizza`` (the Avro schema's fields, numbered in order) as a serialized ``FileDescriptorProto``,
    the form confluent-kafka registers, and its message class (built from the descriptor, as protoc would)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    kinds = {"string": descriptor_pb2.FieldDescriptorProto.TYPE_STRING, "int": descriptor_pb2.FieldDescriptorProto.TYPE_INT32}
    fd = descriptor_pb2.FileDescriptorProto(name="rpc/pizza.proto", package="rpc", syntax="proto3")
    m = fd.message_type.add(name="CompletedPizza")
    for number, f in enumerate(PIZZA_AVRO_SCHEMA["fields"], start=1):
        m.field.add(name=f["name"], number=number, type=kinds[f["type"]], label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return fd.SerializeToString(), message_factory.GetMessageClass(pool.FindMessageTypeByName("rpc.CompletedPizza"))


def protobuf_framed(values: list[bytes], schema_id: int) -> list[bytes]:
    """JSON pizza events re-encoded in Confluent's Protobuf wire format (magic byte, schema id, message index 0, the
    message)."""
    _, cls = pizza_proto()
    head = b"\x00" + struct.pack(">I", schema_id) + b"\x00"
    return [head + cls(**json.loads(v)).SerializeToString() for v in values]


class LocalSchemaRegistry:
    """A minimal in-process schema registry answering like Confluent's, for the demo, tests and benchmarks on machines
    without a registry. Not for production use. It serves what confluent-kafka's clients and serializers ask:

    - ``GET /schemas/ids/{id}``: the schema text, its ``schemaType`` (left out for Avro, as Confluent does) and its
      ``references`` (imported files, each by name, subject and version);
    - ``POST /subjects/{subject}/versions`` (register: the same text under a subject keeps its id and version),
      ``POST /subjects/{subject}`` (look one up), ``GET /subjects``, ``GET /subjects/{subject}/versions`` and
      ``GET /subjects/{subject}/versions/{version|latest}``.

    ``schemas``: Avro schemas by id (as dicts), served as given; registered schemas get the next ids."""

    def __init__(self, schemas: dict[int, dict], basic_auth: str | None = None) -> None:
        self.schemas = dict(schemas)
        self.basic_auth = basic_auth  # "user:password" required when set (401 otherwise)
        self.registered: dict[int, dict] = {}  # id -> {"schema", "schemaType", "references"}
        self.subjects: dict[str, list[int]] = {}  # subject -> ids, version 1 first
        self._lock = threading.Lock()
        self._server = None

    def by_id(self, sid: int) -> dict | None:
        """A schema as ``GET /schemas/ids/{id}`` answers it, or None."""
        if sid in self.schemas:
            return {"schema": json.dumps(self.schemas[sid])}
        found = self.registered.get(sid)
        if found is None:
            return None
        typed = {"schemaType": found["schemaType"]} if found["schemaType"] != "AVRO" else {}
        return {"schema": found["schema"], **typed, **({"references": found["references"]} if found["references"] else {})}

    def register(self, subject: str, doc: dict) -> dict:
        """Register ``doc`` (``schema``, ``schemaType``, ``references``) under ``subject``: its id (the same schema
        anywhere keeps its id; under the same subject, its version)."""
        entry = {"schema": doc["schema"], "schemaType": doc.get("schemaType") or "AVRO", "references": list(doc.get("references") or [])}
        with self._lock:
            sid = next((i for i, e in self.registered.items() if e == entry), None)
            if sid is None:
                sid = max([*self.schemas, *self.registered, 0]) + 1
                self.registered[sid] = entry
            versions = self.subjects.setdefault(subject, [])
            if sid not in versions:
                versions.append(sid)
        return {"id": sid}

    def version(self, subject: str, which: str) -> dict | None:
        """``GET /subjects/{subject}/versions/{which}`` (a number or ``latest``), or None."""
        ids = self.subjects.get(subject) or []
        n = len(ids) if which == "latest" else int(which) if which.isdigit() else 0
        if not 1 <= n <= len(ids):
            return None
        sid = ids[n - 1]
        return {
            "subject": subject,
            "id": sid,
            "version": n,
            "schemaType": self.registered[sid]["schemaType"],
            "schema": self.registered[sid]["schema"],
            "references": self.registered[sid]["references"],
        }

    def lookup(self, subject: str, doc: dict) -> dict | None:
        """``POST /subjects/{subject}``: the version of ``doc`` under ``subject``, or None."""
        entry = {"schema": doc["schema"], "schemaType": doc.get("schemaType") or "AVRO", "references": list(doc.get("references") or [])}
        for n, sid in enumerate(self.subjects.get(subject) or [], start=1):
            if self.registered[sid] == entry:
                return self.version(subject, str(n))
        return None

    def answer(self, method: str, path: str, body: dict | None) -> tuple[int, object]:
        """(status, JSON) for one request; a miss is Confluent's error document."""
        parts = [unquote(p) for p in urlsplit(path).path.strip("/").split("/")]
        found: object = None
        if method == "GET" and parts[:2] == ["schemas", "ids"] and len(parts) == 3 and parts[2].isdigit():
            found = self.by_id(int(parts[2]))
        elif method == "GET" and parts == ["subjects"]:
            found = sorted(self.subjects)
        elif method == "GET" and len(parts) == 3 and parts[0] == "subjects" and parts[2] == "versions":
            found = list(range(1, len(self.subjects[parts[1]]) + 1)) if parts[1] in self.subjects else None
        elif method == "GET" and len(parts) == 4 and parts[0] == "subjects" and parts[2] == "versions":
            found = self.version(parts[1], parts[3])
        elif method == "POST" and len(parts) == 3 and parts[0] == "subjects" and parts[2] == "versions" and body:
            found = self.register(parts[1], body)
        elif method == "POST" and len(parts) == 2 and parts[0] == "subjects" and body:
            found = self.lookup(parts[1], body)
        if found is None:
            return 404, {"error_code": 40403, "message": "Schema not found"}
        return 200, found

    def start(self) -> str:
        registry = self
        expected = "Basic " + base64.b64encode(self.basic_auth.encode()).decode() if self.basic_auth else None

        class Handler(BaseHTTPRequestHandler):
            def _reply(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                if expected is not None and self.headers.get("Authorization") != expected:
                    code, doc = 401, {"error_code": 401, "message": "Unauthorized"}
                else:
                    code, doc = registry.answer(method, self.path, body)
                raw = json.dumps(doc).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def do_GET(self) -> None:
                self._reply("GET")

            def do_POST(self) -> None:
                self._reply("POST")

            def log_message(self, *args: object) -> None:
                pass

        self._server = HTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self._server.server_port}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server = None
