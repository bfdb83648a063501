"""Comparing a query's rows with a reference answer given as text (TPC-H's official answers).

Columns are typed by the reference: integers must match exactly, other numbers within
``ABS_TOLERANCE + REL_TOLERANCE * |reference|`` (Spark's decimal averages and ratios carry six
decimals, the reference more), everything else as text. Rows are compared as a multiset; the row
order is checked only on the columns the query's ORDER BY names.
"""

from __future__ import annotations

import datetime
import decimal
from collections import defaultdict
from typing import Any, Callable, Sequence

import sqlglot
from sqlglot import exp

__all__ = ["ABS_TOLERANCE", "REL_TOLERANCE", "compare", "order_by_columns"]

ABS_TOLERANCE = 1e-6
REL_TOLERANCE = 1e-9
_MAX_PROBLEMS = 5


def order_by_columns(sql: str, columns: Sequence[str]) -> list[int]:
    """Positions in ``columns`` of the outermost ORDER BY's items (output names or aliases)."""
    tree = sqlglot.parse_one(sql, read="spark")
    order = tree.args.get("order")
    if order is None:
        return []
    names = [c.lower() for c in columns]
    positions = []
    for item in order.expressions:
        target = item.this
        name = target.alias_or_name.lower() if isinstance(target, (exp.Column, exp.Alias)) else target.sql().lower()
        if name not in names:
            raise ValueError(f"ORDER BY item {target.sql()} is not an output column of {list(columns)}")
        positions.append(names.index(name))
    return positions


def _is_int(text: str) -> bool:
    return text.lstrip("-").isdigit()


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def _as_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, (datetime.date, datetime.datetime)):
        return value.isoformat()
    return str(value)


def _column_kind(reference: list[list[str]], column: int) -> str:
    values = [row[column] for row in reference if row[column] != ""]
    if values and all(_is_int(v) for v in values):
        return "int"
    if values and all(_is_number(v) for v in values):
        return "number"
    return "text"


def _same_number(actual: Any, expected: str) -> bool:
    if actual is None or expected == "":
        return actual is None and expected == ""
    a, e = float(decimal.Decimal(str(actual))), float(expected)
    return abs(a - e) <= ABS_TOLERANCE + REL_TOLERANCE * abs(e)


def _same_exact(actual: Any, expected: str, kind: str) -> bool:
    if kind == "int" and actual is not None and expected != "":
        return decimal.Decimal(str(actual)) == decimal.Decimal(expected)
    return _as_text(actual) == expected


def compare(actual: Sequence[Sequence[Any]], reference: list[list[str]], ordered_by: Sequence[int] = ()) -> list[str]:
    """Problems found comparing ``actual`` rows with the ``reference`` text rows (none: equal)."""
    if len(actual) != len(reference):
        return [f"{len(actual)} rows, expected {len(reference)}"]
    if not reference:
        return []
    width = len(reference[0])
    if any(len(row) != width for row in actual):
        return [f"rows have {len(actual[0])} columns, expected {width}"]
    kinds = [_column_kind(reference, c) for c in range(width)]

    def same(a: Any, e: str, c: int) -> bool:
        return _same_number(a, e) if kinds[c] == "number" else _same_exact(a, e, kinds[c])

    problems: list[str] = []
    # Multiset: bucket rows by their exact columns, then pair the numeric columns within a bucket.
    exact = [c for c in range(width) if kinds[c] != "number"]
    numeric = [c for c in range(width) if kinds[c] == "number"]

    def exact_key(row: Sequence[Any], render: Callable[[Any, int], str]) -> tuple[str, ...]:
        return tuple(render(row[c], c) for c in exact)

    def render_actual(value: Any, c: int) -> str:
        if kinds[c] == "int" and value is not None:
            number = decimal.Decimal(str(value))
            return str(int(number)) if number == number.to_integral_value() else str(number)
        return _as_text(value)

    buckets: dict[tuple[str, ...], list[list[Any]]] = defaultdict(list)
    for row in actual:
        buckets[exact_key(row, render_actual)].append(list(row))
    for ref in reference:
        key = exact_key(ref, lambda v, c: str(int(v)) if kinds[c] == "int" and v != "" else v)
        candidates = buckets.get(key, [])
        match = next((i for i, row in enumerate(candidates) if all(same(row[c], ref[c], c) for c in numeric)), None)
        if match is None:
            problems.append(f"expected row {ref} not found")
        else:
            candidates.pop(match)
        if len(problems) >= _MAX_PROBLEMS:
            return problems
    for position, (row, ref) in enumerate(zip(actual, reference)):
        if not all(same(row[c], ref[c], c) for c in ordered_by):
            problems.append(f"row {position} is out of ORDER BY order: got {list(row)}, expected {ref}")
            break
    return problems
