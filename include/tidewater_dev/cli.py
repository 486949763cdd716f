"""The checkout's development commands of the ``tidewater`` command line: ``broker`` (the embedded Kafka broker),
``spark-connect`` (a local Spark Connect server) and ``produce-sample`` (the pizza events). They live here, beside the
tools they run, outside the product's wheel: ``tidewater.runtime.cli`` adds them when this package is importable (a
checkout), and says where they are when it is not."""

from __future__ import annotations

import argparse
from typing import Any


def cmd_broker(args: argparse.Namespace) -> int:
    from tidewater_dev import broker

    if args.action == "start":
        b = broker.start_background(args.port or 19092)
        print(f"embedded broker running: pid {b.pid}, bootstrap {b.bootstrap}, log {b.log_path}")
    elif args.action == "stop":
        print("embedded broker stopped" if broker.stop_background(args.port) else "no embedded broker was recorded")
    else:
        b = broker.read_state()
        if b is None or not b.alive() or (args.port is not None and b.port != args.port):
            print("embedded broker: not running" + (f" on port {args.port}" if args.port is not None else ""))
            return 1
        print(f"embedded broker: pid {b.pid}, bootstrap {b.bootstrap}")
    return 0


def cmd_spark_connect(args: argparse.Namespace) -> int:
    from tidewater_dev import spark_connect

    if args.action == "start":
        server = spark_connect.start_background(args.port)
        print(f"Spark Connect server running: pid {server.pid}, spark.connect_url {server.url}, log {server.log_path}")
    elif args.action == "stop":
        print("Spark Connect server stopped" if spark_connect.stop_background() else "no Spark Connect server was recorded")
    else:
        server = spark_connect.read_state()
        if server is None or not server.alive():
            print("Spark Connect server: not running")
            return 1
        print(f"Spark Connect server: pid {server.pid}, spark.connect_url {server.url}, log {server.log_path}")
    return 0


def add_spark_connect(sub: Any) -> None:
    p = sub.add_parser("spark-connect", help="a local Spark Connect server for the write step (`make spark-connect` installs it)")
    p.add_argument("action", choices=["start", "stop", "status"])
    p.add_argument("--port", type=int, default=15002, help="start: the port to listen on (default 15002)")
    p.set_defaults(fn=cmd_spark_connect)


def cmd_produce_sample(args: argparse.Namespace) -> int:
    from tidewater_dev import sample_data as sample

    counts = sample.produce(args.bootstrap, args.topic, sample.pizza_events(args.count, seed=args.seed), partitions=args.partitions)
    print(f"produced {sum(counts.values())} pizza events to {args.topic} ({args.partitions} partitions)")
    return 0


def add_broker(sub: Any) -> None:
    p = sub.add_parser("broker", help="the embedded Kafka-compatible broker (demo and tests)")
    p.add_argument("action", choices=["start", "stop", "status"])
    p.add_argument(
        "--port", type=int, default=None, help="start: the port to listen on (default 19092); stop and status: only the broker on this port"
    )
    p.set_defaults(fn=cmd_broker)


def add_produce_sample(sub: Any) -> None:
    p = sub.add_parser("produce-sample", help="produce Scenario 1 pizza events")
    p.add_argument("--bootstrap", default="127.0.0.1:19092")
    p.add_argument("--topic", default="completed-pizzas")
    p.add_argument("--count", type=int, default=1000)
    p.add_argument("--partitions", type=int, default=6)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(fn=cmd_produce_sample)


COMMANDS = (add_broker, add_spark_connect, add_produce_sample)
