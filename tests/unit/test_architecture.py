"""The package's shape, checked: no import cycles, no private names used across modules, long functions
explain themselves. Pure: reads the source with ``ast``, imports nothing of the package."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import tomllib

PKG = Path(__file__).resolve().parents[2] / "include" / "tidewater"
# A function's length in statements (the lines a statement starts on), not in lines: the formatter (ruff format)
# lays one call over as many lines as it has arguments. 45 is the most any function had when the limit was 60 lines,
# before the code was formatted.
MAX_STATEMENTS = 45
LENGTH_NOTE = "Length:"  # a paragraph of the docstring that says why a function needs more than MAX_STATEMENTS


def module_name(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def imports_of(name: str) -> set[str]:
    """Every package module that ``name`` imports, at module level, inside functions and under TYPE_CHECKING: an
    import only the type checker reads still ties the two modules."""
    tree = ast.parse(MODULES[name].read_text())
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in MODULES)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tidewater"):
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                out.add(sub if sub in MODULES else node.module)
    out.discard(name)
    return {m for m in out if m in MODULES}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m) :] + [m]
            if m not in state and (found := visit(m)):
                return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state and (found := visit(n)):
            return found
    return None


def test_the_package_has_no_import_cycle() -> None:
    """Function-level and TYPE_CHECKING imports count: a cycle hidden inside a function or behind the type checker is
    still a cycle."""
    graph = {m: imports_of(m) for m in MODULES}
    assert sum(len(v) for v in graph.values()) > 50, "the import graph was not read"
    assert find_cycle(graph) is None, f"import cycle: {' -> '.join(find_cycle(graph) or [])}"


# The rooms of the package from the bottom up: a room imports only rooms below it (and its own modules). The
# place of a room is part of its meaning: configuration is pure grammar; the source, decoding and transforms
# know nothing of tables; the batch's stages (write, quality, plan, commit) sit on the table room; the audit
# reads what the commits left (its ledger beside it); Spark's environment (configuration, jars, sessions, the Connect
# session cache, the spark-submit launcher) serves the steps; the batch's steps string the stages together; operations
# run steps; interop, the shipped example (data, for `tidewater init`) and the runtime (Airflow tasks, the CLI,
# Spark entry points) are the entry points.
ROOMS = (
    "errors",
    "staging",
    "batch",
    "config",
    "source",
    "decode",
    "transform",
    "table",
    "write",
    "quality",
    "plan",
    "commit",
    "audit",
    "spark",
    "steps",
    "ops",
    "interop",
    "examples",
    "runtime",
)


def room_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "tidewater"


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Imports that run up the room order (inside functions included; the package's ``__init__`` is no room)."""
    rank = {r: i for i, r in enumerate(ROOMS)}
    return [
        f"{m} -> {d}"
        for m, deps in sorted(graph.items())
        for d in sorted(deps)
        if "tidewater" not in (room_of(m), room_of(d)) and rank[room_of(d)] > rank[room_of(m)]
    ]


def test_rooms_import_downward_only() -> None:
    """Every module lives in a declared room, and no import (at module level or inside a function) reaches up."""
    assert sorted({room_of(m) for m in MODULES} - {"tidewater"}) == sorted(ROOMS), "a room is missing from ROOMS"
    graph = {m: imports_of(m) for m in MODULES}
    assert upward_imports(graph) == []


def test_the_room_check_finds_an_upward_import() -> None:
    assert upward_imports({"tidewater.audit.ledger": {"tidewater.ops.status"}}) == ["tidewater.audit.ledger -> tidewater.ops.status"]
    assert upward_imports({"tidewater.ops.status": {"tidewater.table.summary"}}) == []


def test_the_cycle_finder_finds_cycles() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_private_name_is_imported_from_another_module(name: str) -> None:
    tree = ast.parse(MODULES[name].read_text())
    private = [
        f"{n.module}.{a.name}"
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("tidewater")
        for a in n.names
        if a.name.startswith("_") and not a.name.startswith("__")
    ]  # dunders (__version__) are public
    assert private == []


def test_long_functions_say_why_in_their_docstring() -> None:
    long_ones = []
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = len({s.lineno for s in ast.walk(node) if isinstance(s, ast.stmt) and s is not node})
                if length > MAX_STATEMENTS and LENGTH_NOTE not in (ast.get_docstring(node) or ""):
                    long_ones.append(f"{name}.{node.name} ({length} statements)")
    assert long_ones == []


def test_stages_are_packages_named_after_the_pipeline() -> None:
    """Where offsets are decided, where the one commit is, how a record travels: from file names alone."""
    for module in (
        "tidewater.plan.planner",
        "tidewater.commit.primitive",
        "tidewater.commit.batch",
        "tidewater.config.targets",
        "tidewater.table.targets",
        "tidewater.audit.ledger",
        "tidewater.source.kafka",
        "tidewater.decode.registry",
        "tidewater.config.formats",
        "tidewater.write.task",
        "tidewater.table.catalog",
        "tidewater.quality.gate",
    ):
        assert module in MODULES
    assert not [
        m
        for m in MODULES
        if m.count(".") == 1 and m not in ("tidewater.batch", "tidewater.errors") and not MODULES[m].name == "__init__.py"
    ], "flat modules are back"


def test_the_connect_workers_daemon_preloads_modules_that_exist():
    """`spark.python.daemon.module` of the Spark Connect server: a name in its PRELOAD list that does not import
    would make every Python worker of the server fail. Each is imported here."""
    import importlib
    import sys

    from tidewater.runtime.worker_daemon import PRELOAD, preload

    preload()
    assert all(name in sys.modules for name in PRELOAD)
    assert all(importlib.util.find_spec(name) is not None for name in PRELOAD)


# The plain-or-routed question: one shape for N tables answers it in config/ and table/targets.py, not in every room.
# A condition site is the test of an if, a conditional expression, a while, an assert or a comprehension's filter that
# names one of these. The ceiling only comes down: 80 when it was first counted (2026-11-26), 77 on 2026-11-27 (the
# gate's one shape), 54 on 2026-11-27 (a target's role, ``table/targets.py: TargetRole``; one append-missing), 43 on 2026-11-27 (a
# task's destination, ``write/destinations.py``: one table or routes), 39 on 2026-11-27 (the offsets holder's part of a
# commit, ``commit/holders.py``; a replay's modes, ``PipelineSpec.replay_modes``), 36 on 2026-11-27 (the table a
# person names, ``TargetSet.named``), 22 on 2026-11-28 (the audit's and the view's questions asked of each target's
# role or of the set: ``TargetRole.reported_as``, ``TargetSet.own_table``, ``takes_rows``, ``holder_rows``;
# ``table.targets.quarantine_candidates``); the goal was 25.
# Words that ask whether a pipeline is plain or routed: the target set's shape (fused, routed, router, single) and
# the same question under other names (holds, own_table, takes_rows, reported_as). config/ and table/targets.py
# answer it; everywhere else a condition that asks it, directly or through a local name bound to the question
# (``plain = spec.targets.fused``, then ``if plain:``), counts. The count only falls.
SHAPE_WORDS = {"fused", "routed", "router", "single", "holds", "own_table", "takes_rows", "reported_as"}
MAX_SHAPE_CONDITIONS = 25


def _words(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} | {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}


def _is_question(value: ast.AST) -> bool:
    """``value`` is the question itself: a name, an attribute, a comparison, a negation or a boolean of them naming a
    shape word, or a call of a question (``takes_rows``, ``holds``); a call of anything else only uses the answer."""
    if isinstance(value, ast.Call):
        return isinstance(value.func, ast.Attribute) and value.func.attr in SHAPE_WORDS
    return isinstance(value, (ast.Attribute, ast.Name, ast.Compare, ast.BoolOp, ast.UnaryOp)) and bool(_words(value) & SHAPE_WORDS)


def shape_condition_sites(source: str | None = None) -> list[str]:
    """Every condition outside config/ and table/targets.py that asks the shape (of ``source`` alone when given)."""
    files = {"given.py": source} if source is not None else {p.relative_to(PKG).as_posix(): p.read_text() for p in MODULES.values()}
    sites = set()
    for rel, text in files.items():
        if rel.startswith("config/") or rel == "table/targets.py":
            continue
        tree = ast.parse(text)
        for scope in [tree, *(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))]:
            nodes = list(ast.walk(scope))
            bound = {
                t.id for n in nodes if isinstance(n, ast.Assign) and _is_question(n.value) for t in n.targets if isinstance(t, ast.Name)
            }
            for node in nodes:
                if isinstance(node, (ast.If, ast.IfExp, ast.While, ast.Assert)):
                    conditions = [node.test]
                elif isinstance(node, ast.comprehension):
                    conditions = list(node.ifs)
                else:
                    continue
                sites.update(f"{rel}:{c.lineno}" for c in conditions if _words(c) & (SHAPE_WORDS | bound))
    return sorted(sites)


def test_the_shape_finder_counts_renamed_questions_and_local_names() -> None:
    source = (
        "def f(spec, t):\n"
        "    plain = spec.targets.fused\n"
        "    rows = spec.targets.takes_rows(t)\n"
        "    name = spec.router_name()\n"
        "    if plain:\n        pass\n"
        "    if rows:\n        pass\n"
        "    x = 1 if spec.targets.own_table else 2\n"
        "    y = [r for r in t if r.reported_as]\n"
        "    if name:\n        pass\n"
    )
    assert shape_condition_sites(source) == sorted(["given.py:5", "given.py:7", "given.py:9", "given.py:10"])


def test_the_plain_or_routed_question_is_asked_in_no_more_places_than_before():
    sites = shape_condition_sites()
    assert len(sites) <= MAX_SHAPE_CONDITIONS, (
        f"{len(sites)} conditions ask whether a pipeline is plain or routed outside config/ and table/targets.py "
        f"(at most {MAX_SHAPE_CONDITIONS}): ask the target set or a target's value object instead. " + ", ".join(sites)
    )


def test_the_spark_submit_driver_starts_without_the_task_libraries():
    """Every spark-submit batch waits for its driver's imports before Spark starts: the entry point loads the plan, the
    pipeline and the Kafka settings, not pyarrow, pyiceberg or pandas (the executors import the task code; the
    driver opens the catalog only for a schema change or a failed task). Checked in a fresh interpreter."""
    import json
    import subprocess
    import sys

    code = (
        "import json, sys\nimport tidewater.runtime.spark_app.ingest_batch\n"
        "print(json.dumps([m for m in ('pyarrow', 'pyiceberg', 'pandas', 'great_expectations', 'pyspark.sql') "
        "if m in sys.modules]))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


# make lint runs mypy on the files [tool.mypy] lists in pyproject.toml: the whole package. The count only grows; the
# first five areas stay in.
MIN_TYPED_MODULES = 153
FIRST_TYPED = ("tidewater.batch", "tidewater.commit", "tidewater.table", "tidewater.config", "tidewater.decode")


def typed_modules() -> set[str]:
    root = PKG.parents[1]
    files = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["mypy"]["files"]
    out: set[str] = set()
    for f in files:
        path = root / f
        out.update(module_name(p) for p in ([path] if path.suffix == ".py" else path.rglob("*.py")))
    return out


def test_the_type_checker_covers_the_first_areas_and_no_fewer_modules_than_before() -> None:
    typed = typed_modules()
    assert typed <= set(MODULES), f"[tool.mypy] files names what is not in the package: {sorted(typed - set(MODULES))}"
    assert all(any(m == a or m.startswith(a + ".") for m in typed) for a in FIRST_TYPED), "a first area left the type check"
    missing = [m for m in MODULES if any(m == a or m.startswith(a + ".") for a in FIRST_TYPED) and m not in typed]
    assert not missing, f"modules of the first areas outside the type check: {missing}"
    assert len(typed) >= MIN_TYPED_MODULES, f"{len(typed)} modules type-checked, fewer than {MIN_TYPED_MODULES}"


MAX_MODULE_LINES = 800  # past this a module holds more than one subject: split it by meaning (config/sections, cli_*)


def test_no_module_is_over_800_lines() -> None:
    lengths = {m: len(p.read_text().splitlines()) for m, p in MODULES.items()}
    assert max(lengths.values()) > 300, "the modules were not read"
    over = {m: n for m, n in lengths.items() if n > MAX_MODULE_LINES}
    assert not over, f"modules over {MAX_MODULE_LINES} lines: {over}"
