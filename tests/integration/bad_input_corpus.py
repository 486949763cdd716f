"""The bad-input corpus: values that have broken pipelines somewhere, with the outcome each must have.

``row``: the record lands as a row; otherwise the dead-letter class it must get. The outcome must be the
same whether the record is alone in a chunk or shares it with good and bad neighbours.
"""

from __future__ import annotations

import json

GOOD = {"order_id": "ok", "store_id": 1, "sauce": "regular"}


def obj(**kw: object) -> bytes:
    return json.dumps({**GOOD, **kw}).encode()


CORPUS: list[tuple[str, bytes | None, str]] = [
    ("truncated JSON", b'{"order_id": "x", "store_id": ', "InvalidJson"),
    ("not JSON", b"not json at all", "InvalidJson"),
    ("wrong type for a column", obj(store_id="forty-two"), "TypeMismatch"),
    ("empty value", b"", "EmptyValue"),
    ("whitespace only", b"  \t ", "EmptyValue"),
    ("tombstone", None, "Tombstone"),
    ("UTF-8 byte order mark", b"\xef\xbb\xbf" + obj(), "InvalidJson"),
    ("lone surrogate escape", b'{"order_id": "\\ud800", "store_id": 2}', "InvalidJson"),
    ("raw control character", b'{"order_id": "a\x01b", "store_id": 3}', "InvalidJson"),
    ("4 MB value", obj(order_id="x" * (4 * 1024 * 1024)), "row"),
    ("NaN", b'{"order_id": "n", "store_id": NaN}', "InvalidJson"),
    ("Infinity", b'{"order_id": "i", "store_id": Infinity}', "InvalidJson"),
    ("duplicate keys", b'{"order_id": "a", "order_id": "b", "store_id": 4}', "InvalidJson"),
    ("case-colliding names", b'{"order_id": "c", "Sauce": "x", "sauce": "y", "store_id": 5}', "row"),
    ("empty field name", b'{"order_id": "e", "": 1, "store_id": 6}', "row"),
    ("dotted field name", b'{"order_id": "d", "a.b": 1, "store_id": 7}', "row"),
    ("600 levels deep", b'{"x":' * 600 + b"1" + b"}" * 600, "TooDeep"),
    ("JSON null", b"null", "TypeMismatch"),
    ("JSON array", b"[1, 2]", "TypeMismatch"),
    ("JSON number", b"42", "TypeMismatch"),
    ("JSON string", b'"hello"', "TypeMismatch"),
    ("invalid UTF-8", b'{"order_id": "\xff\xfe", "store_id": 8}', "InvalidUtf8"),
    ("300-character field name", b'{"order_id": "l", "' + b"f" * 300 + b'": 1, "store_id": 9}', "FieldNameTooLong"),
    ("10,000 keys", obj(**{f"k{i}": i for i in range(10_000)}), "TooManyColumns"),
    ("new nested field", obj(meta={"x": 1}), "row"),
    ("pretty-printed", json.dumps(GOOD, indent=2).encode(), "row"),
    ("non-ASCII text", obj(order_id="ü€𝄞"), "row"),
    ("escaped non-ASCII", b'{"order_id": "\\u00fc", "store_id": 10}', "row"),
    ("whitespace around the object", b"   " + obj() + b"  ", "row"),
    ("trailing garbage", obj() + b" x", "InvalidJson"),
    ("two objects in one value", obj() + obj(), "InvalidJson"),
    ("integer beyond 64 bits", b'{"order_id": "b", "store_id": 99999999999999999999}', "NumberOutOfRange"),
    # Numbers JSON cannot hold exactly, in fields the table does not have yet (Arrow's reader takes them all)
    ("NaN in a new field", b'{"order_id": "n2", "store_id": 11, "score": NaN}', "InvalidJson"),
    ("-Infinity in a new list", b'{"order_id": "i2", "store_id": 12, "scores": [1.5, -Infinity]}', "InvalidJson"),
    ("200-digit integer in a new field", b'{"order_id": "b2", "store_id": 13, "huge": ' + b"7" * 200 + b"}", "NumberOutOfRange"),
    ("number beyond a double", b'{"order_id": "f", "store_id": 14, "ratio": 1e400}', "NumberOutOfRange"),
    ("largest 64-bit integer", b'{"order_id": "m", "store_id": 9223372036854775807}', "row"),
    ("long digits inside a string", b'{"order_id": "s: 99999999999999999999999, NaN", "store_id": 15}', "row"),
    ("null field value", obj(store_id=None), "row"),
    ("empty object", b"{}", "row"),
]
