"""The grammar of routing (``routing.table_template`` and the names routes make), shared by configuration checks and
the router (``transform/routing.py``). Pure: regular expressions and names only."""

from __future__ import annotations

import re

NAME_PART = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")  # one part of `namespace.name`
ROUTE_VALUE = re.compile(r"[A-Za-z0-9_]{1,128}")  # what a record's route value may put into a table name
NOT_NAME = re.compile(r"[^A-Za-z0-9_]")  # what a topic's part loses when it names a table
TOPIC_PLACEHOLDER = re.compile(r"\{topic(?:\[(-?\d+)\])?\}")  # {topic}, {topic[N]}: the topic or its N-th dotted part
SOURCE_PLACEHOLDER = re.compile(r"\{source\.([A-Za-z_][A-Za-z0-9_]*)\}")  # a field of the Debezium envelope's source


MAX_IDENTIFIER = 255


def valid_identifier(ident: str) -> bool:
    """`namespace.name` made of letters, digits and `_` (no empty, dotted-away or over-long parts).
    Whole-string matches: a trailing newline is not a name character."""
    parts = ident.split(".")
    return len(ident) <= MAX_IDENTIFIER and len(parts) >= 2 and all(NAME_PART.fullmatch(p) for p in parts)
