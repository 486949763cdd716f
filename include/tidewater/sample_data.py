"""Sample events of the users' scenarios, for the demo and tests (completed pizza orders)."""

from __future__ import annotations

import json
import random
import uuid
from datetime import datetime, timedelta

SAUCES = ["regular", "light", "extra", "none", "bbq", "alfredo"]
CHEESES = ["mozzarella", "three cheese", "goat cheese", "extra", "none"]
MEATS = ["ham", "pepperoni", "sausage", "chicken", "bacon", "none"]
VEGGIES = ["onions & pineapple", "peppers", "mushrooms", "olives", "spinach", "none"]


def pizza_events(n: int, seed: int = 0, stores: int = 100, start: datetime | None = None) -> list[bytes]:
    """``n`` completed-pizza JSON events (Scenario 1), deterministic for a seed."""
    rnd = random.Random(seed)
    t = start or datetime(2024, 1, 4, 12, 0, 0)
    out = []
    for i in range(n):
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
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

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
