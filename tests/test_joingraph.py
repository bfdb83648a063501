"""Join graphs read from the SQL text alone: the groups the report expects, independent of Spark."""

from __future__ import annotations

import pytest

from umjoin import joingraph, tpch


@pytest.fixture(scope="module")
def schema() -> joingraph.Schema:
    return tpch.schema()


def _edges(graph: joingraph.ScopeGraph) -> set[frozenset[str]]:
    """Edges as unordered pairs of 'alias.column'."""
    return {frozenset({f"{a}.{x}", f"{b}.{y}"}) for a, x, b, y in graph.edges}


@pytest.mark.parametrize("number", tpch.QUERY_NUMBERS)
def test_every_tpch_query_gives_a_graph(schema: joingraph.Schema, number: int) -> None:
    graphs = joingraph.join_graphs(tpch.query_text(number), schema)
    assert graphs and all(g.sources for g in graphs)


def test_q3(schema: joingraph.Schema) -> None:
    (graph,) = joingraph.join_graphs(tpch.query_text(3), schema)
    assert graph.sources == {"customer": "customer", "orders": "orders", "lineitem": "lineitem"}
    assert _edges(graph) == {
        frozenset({"customer.c_custkey", "orders.o_custkey"}),
        frozenset({"lineitem.l_orderkey", "orders.o_orderkey"}),
    }


def test_q5(schema: joingraph.Schema) -> None:
    (graph,) = joingraph.join_graphs(tpch.query_text(5), schema)
    assert sorted(graph.sources.values()) == ["customer", "lineitem", "nation", "orders", "region", "supplier"]
    assert _edges(graph) == {
        frozenset({"customer.c_custkey", "orders.o_custkey"}),
        frozenset({"lineitem.l_orderkey", "orders.o_orderkey"}),
        frozenset({"lineitem.l_suppkey", "supplier.s_suppkey"}),
        frozenset({"customer.c_nationkey", "supplier.s_nationkey"}),
        frozenset({"supplier.s_nationkey", "nation.n_nationkey"}),
        frozenset({"nation.n_regionkey", "region.r_regionkey"}),
    }
    assert joingraph.expected_groups(tpch.query_text(5), schema) == [sorted(graph.sources.values())]


def test_q8(schema: joingraph.Schema) -> None:
    inner, outer = joingraph.join_graphs(tpch.query_text(8), schema)
    assert inner.sources == {
        "part": "part", "supplier": "supplier", "lineitem": "lineitem", "orders": "orders",
        "customer": "customer", "n1": "nation", "n2": "nation", "region": "region",
    }
    assert _edges(inner) == {
        frozenset({"part.p_partkey", "lineitem.l_partkey"}),
        frozenset({"supplier.s_suppkey", "lineitem.l_suppkey"}),
        frozenset({"lineitem.l_orderkey", "orders.o_orderkey"}),
        frozenset({"orders.o_custkey", "customer.c_custkey"}),
        frozenset({"customer.c_nationkey", "n1.n_nationkey"}),
        frozenset({"n1.n_regionkey", "region.r_regionkey"}),
        frozenset({"supplier.s_nationkey", "n2.n_nationkey"}),
    }
    assert outer.sources == {"all_nations": "(derived)"} and outer.edges == []


def test_q21(schema: joingraph.Schema) -> None:
    exists, not_exists, main = joingraph.join_graphs(tpch.query_text(21), schema)
    # The correlated subqueries read one table each; their correlation is not a join inside them.
    assert exists.sources == {"l2": "lineitem"} and exists.edges == []
    assert not_exists.sources == {"l3": "lineitem"} and not_exists.edges == []
    assert main.sources == {"supplier": "supplier", "l1": "lineitem", "orders": "orders", "nation": "nation"}
    assert _edges(main) == {
        frozenset({"supplier.s_suppkey", "l1.l_suppkey"}),
        frozenset({"orders.o_orderkey", "l1.l_orderkey"}),
        frozenset({"supplier.s_nationkey", "nation.n_nationkey"}),
    }


def test_outer_joined_tables_are_not_part_of_the_inner_graph() -> None:
    schema = {"a": {"x": "int", "y": "int"}, "b": {"x": "int"}, "c": {"y": "int", "z": "int"}, "d": {"z": "int"}}
    sql = "SELECT * FROM a LEFT JOIN b ON a.x = b.x JOIN c ON a.y = c.y JOIN d ON d.z = c.z"
    assert joingraph.expected_groups(sql, schema) == [["a", "c", "d"]]
    assert joingraph.expected_groups(sql, schema, min_inputs=4) == []


def test_disconnected_tables_form_separate_components() -> None:
    schema = {t: {"k": "int", "v": "int"} for t in "abcd"}
    sql = "SELECT * FROM a, b, c, d WHERE a.k = b.k AND c.k = d.k AND a.v < c.v"
    (graph,) = joingraph.join_graphs(sql, schema)
    assert sorted(map(sorted, graph.components())) == [["a", "b"], ["c", "d"]]
    assert joingraph.expected_groups(sql, schema, min_inputs=2) == [["a", "b"], ["c", "d"]]
