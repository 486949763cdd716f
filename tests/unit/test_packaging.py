"""The package's metadata (pyproject.toml) against its code: every third-party module the package imports is declared
by the distribution that provides it, in the core dependencies or in an extra, and no core dependency goes unused."""

from __future__ import annotations

import ast
import re
import sys
from importlib.metadata import packages_distributions

import tomllib

from tests.conftest import REPO

PKG = REPO / "include" / "tidewater"
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def _name(requirement: str) -> str:
    """The distribution's normalized name (PEP 503) of a requirement string."""
    return re.sub(r"[-_.]+", "-", re.split(r"[\[<>=!~; ]", requirement, maxsplit=1)[0]).lower()


def _imported() -> dict[str, set[str]]:
    """Top-level third-party modules the package imports, with the files that import each."""
    found: dict[str, set[str]] = {}
    for path in PKG.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module]
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0
                else []
            )
            for name in names:
                top = name.split(".")[0]
                if top != "tidewater" and top not in sys.stdlib_module_names:
                    found.setdefault(top, set()).add(str(path.relative_to(PKG)))
    return found


# modules of an extra that cannot be installed beside the test environment, with the extra that declares them and
# why: only these may be missing here, and only while their extra names the distribution that brings them
NOT_INSTALLABLE_HERE = {
    "boto3": ("glue", "pyiceberg", "botocore requires python-dateutil<3; Airflow 3.3's environment has 4.0.0"),
    "botocore": ("glue", "pyiceberg", "as boto3"),
}


def test_every_imported_module_is_declared_by_its_distribution():
    declared = {_name(r) for r in PROJECT["dependencies"]}
    declared |= {_name(r) for extra in PROJECT["optional-dependencies"].values() for r in extra}
    providers = packages_distributions()
    missing = {}
    for module, files in sorted(_imported().items()):
        dists = {_name(d) for d in providers.get(module, [])}
        if not dists and module in NOT_INSTALLABLE_HERE:
            extra, dist, _why = NOT_INSTALLABLE_HERE[module]
            assert dist in {_name(r) for r in PROJECT["optional-dependencies"][extra]}, (module, extra)
            continue
        assert dists, f"{module} (imported by {sorted(files)}) is not installed here"
        if not dists & declared:
            missing[module] = (sorted(dists), sorted(files))
    assert missing == {}, missing


def test_every_core_dependency_is_imported_or_says_why_not():
    """A core dependency the code does not import carries a comment on its line saying what needs it."""
    providers = packages_distributions()
    imported = {_name(d) for m in _imported() for d in providers.get(m, [])}
    text = (REPO / "pyproject.toml").read_text()
    unexplained = []
    for requirement in PROJECT["dependencies"]:
        name = _name(requirement)
        line = next(ln for ln in text.splitlines() if f'"{requirement}"' in ln)
        if name not in imported and "#" not in line:
            unexplained.append(requirement)
    assert unexplained == []
