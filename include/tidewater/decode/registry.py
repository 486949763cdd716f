"""The decoders' registry: a value format's decoder, found through ``config.formats.FORMATS``
(``transform/chunk.py`` runs it on a chunk, then shapes and converts the rows).

Each format module exposes ``decode(chunk, ctx) -> (Arrow rows, bad records)`` and does its work on the
whole chunk (Arrow), isolating bad records on the error path only. A new format is one new module in
``decode/`` plus one line here (and its name is then accepted by ``format.value``), in the manner of
pyiceberg's catalog registry. Modules are imported when a format is used, so a pipeline never pays
for the others' imports.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from tidewater.config.formats import FORMATS
from tidewater.decode.records import BadRecord, DecodeContext


def decoder(fmt: str) -> Callable[[Any, DecodeContext], tuple[Any, list[BadRecord]]]:
    return importlib.import_module(FORMATS[fmt].module).decode
