"""Join graphs read from SQL text alone (sqlglot), independently of Spark's plan.

For every SELECT scope: its inner-joined sources (FROM items, inner and cross joins; not the
tables of outer joins) and its equi-join predicates ``a.x = b.y`` between two of them. Each
connected set of at least ``min_inputs`` sources is a multi-way join TSC is expected to convert.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import sqlglot
from sqlglot import exp
from sqlglot.optimizer.qualify import qualify
from sqlglot.optimizer.scope import traverse_scope

__all__ = ["ScopeGraph", "expected_groups", "join_graphs"]

Schema = dict[str, dict[str, str]]


@dataclass(frozen=True)
class ScopeGraph:
    """One SELECT scope: source alias -> table name (``(derived)`` for subqueries), and its equi-joins."""

    sources: dict[str, str]
    edges: list[tuple[str, str, str, str]] = field(default_factory=list)  # (alias, column, alias, column)

    def components(self) -> list[list[str]]:
        """Aliases grouped by equi-join connectivity, in the order the sources appear."""
        parent = {alias: alias for alias in self.sources}

        def find(a: str) -> str:
            while parent[a] != a:
                parent[a] = parent[parent[a]]
                a = parent[a]
            return a

        for left, _, right, _ in self.edges:
            parent[find(left)] = find(right)
        groups: dict[str, list[str]] = {}
        for alias in self.sources:
            groups.setdefault(find(alias), []).append(alias)
        return list(groups.values())


def _is_inner(join: exp.Join) -> bool:
    return not join.side and join.kind.upper() in ("", "INNER", "CROSS")


def _conjuncts(condition: exp.Expression | None) -> list[exp.Expression]:
    if condition is None:
        return []
    return list(condition.flatten()) if isinstance(condition, exp.And) else [condition]


def join_graphs(sql: str, schema: Schema, dialect: str = "spark") -> list[ScopeGraph]:
    """The join graph of every SELECT scope of ``sql`` (innermost scopes first)."""
    tree = qualify(sqlglot.parse_one(sql, read=dialect), schema=schema, dialect=dialect)
    graphs = []
    for scope in traverse_scope(tree):
        select = scope.expression
        if not isinstance(select, exp.Select):
            continue
        joins = select.args.get("joins") or []
        outer = {j.this.alias_or_name for j in joins if not _is_inner(j)}
        sources = {
            alias: source.name if isinstance(source, exp.Table) else "(derived)"
            for alias, (_, source) in scope.selected_sources.items()
            if alias not in outer
        }
        conditions = _conjuncts(select.args.get("where") and select.args["where"].this)
        for j in joins:
            if _is_inner(j):
                conditions += _conjuncts(j.args.get("on"))
        edges = []
        for condition in conditions:
            if isinstance(condition, exp.EQ):
                left, right = condition.this, condition.expression
                if (
                    isinstance(left, exp.Column)
                    and isinstance(right, exp.Column)
                    and left.table in sources
                    and right.table in sources
                    and left.table != right.table
                ):
                    edges.append((left.table, left.name, right.table, right.name))
        graphs.append(ScopeGraph(sources, edges))
    return graphs


def expected_groups(sql: str, schema: Schema, min_inputs: int = 3, dialect: str = "spark") -> list[list[str]]:
    """Sorted source names of every connected set of at least ``min_inputs`` inner-joined sources."""
    groups = []
    for graph in join_graphs(sql, schema, dialect):
        for component in graph.components():
            if len(component) >= min_inputs:
                groups.append(sorted(graph.sources[alias] for alias in component))
    return groups
