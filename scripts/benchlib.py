"""Shared pieces of the benchmark scripts: a fresh data directory, and replacing a marked section of
BENCHMARKS.md."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def command_line(make_target: str) -> str:
    """How the benchmark was run, for the report (the make target when run by make)."""
    return make_target if os.environ.get("MAKELEVEL") else " ".join(["python", *sys.argv])


def fresh_home(name: str) -> Path:
    """An empty ``$TIDEWATER_HOME/<name>`` (sharing the repaired Iceberg jars), made the process's home."""
    work = Path(os.environ.get("TIDEWATER_HOME", REPO / ".data")) / name
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    if (REPO / ".data" / "jars").is_dir():
        (work / "jars").symlink_to(REPO / ".data" / "jars")
    os.environ["TIDEWATER_HOME"] = str(work)
    return work


def write_section(output: str | Path, begin: str, end: str, section: str) -> None:
    """Replace the text between ``begin`` and ``end`` in ``output`` (appended when the markers are missing)."""
    out = Path(output)
    text = out.read_text() if out.is_file() else ""
    if begin in text and end in text:
        text = text.split(begin)[0] + section + text.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    out.write_text(text)
    print(section)
