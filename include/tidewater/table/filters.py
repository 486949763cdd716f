"""Iceberg row filters from column names and values, typed.

pyiceberg's predicates are pydantic models: their own ``__init__`` takes a column name and a plain value
(``EqualTo("pipeline", name)``), but a type checker reads the model's fields instead (``term: UnboundTerm``,
``value: Literal``) and refuses that call. The filters are built here in the fields' terms, so every caller is
checked, and a filter reads as what it asks (``equal``, ``all_of``, ``any_of``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pyiceberg.expressions import (
    AlwaysFalse,
    AlwaysTrue,
    And,
    BooleanExpression,
    EqualTo,
    GreaterThanOrEqual,
    In,
    LessThan,
    LessThanOrEqual,
    Or,
    Reference,
)
from pyiceberg.expressions.literals import literal


def equal(column: str, value: Any) -> BooleanExpression:
    """``column = value``."""
    return EqualTo(term=Reference(column), value=literal(value))


def at_least(column: str, value: Any) -> BooleanExpression:
    """``column >= value``."""
    return GreaterThanOrEqual(term=Reference(column), value=literal(value))


def below(column: str, value: Any) -> BooleanExpression:
    """``column < value``."""
    return LessThan(term=Reference(column), value=literal(value))


def at_most(column: str, value: Any) -> BooleanExpression:
    """``column <= value``."""
    return LessThanOrEqual(term=Reference(column), value=literal(value))


def one_of(column: str, values: Iterable[Any]) -> BooleanExpression:
    """``column IN values``."""
    return In(term=Reference(column), values={literal(v) for v in values})


def all_of(terms: Iterable[BooleanExpression]) -> BooleanExpression:
    """Every term holds (none: always true)."""
    out: BooleanExpression = AlwaysTrue()
    for term in terms:
        out = And(out, term)
    return out


def any_of(terms: Iterable[BooleanExpression]) -> BooleanExpression:
    """Some term holds (none: always false)."""
    out: BooleanExpression = AlwaysFalse()
    for term in terms:
        out = Or(out, term)
    return out
