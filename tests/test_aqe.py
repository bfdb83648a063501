"""UMJoin under Spark's defaults (issue 30): adaptive query execution keeps re-planning queries that carry a
UMJoin, the plans of a query are the same in every run, and null-safe keys join groups."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest
from pyspark.sql import SparkSession

from umjoin import plans, tpch
from umjoin.local import temporary_conf

AQE = {"spark.sql.adaptive.enabled": "true"}


def join_names(plan: plans.PlanNode) -> list[str]:
    return sorted(node.name for node in plan.walk() if node.name.endswith("JoinExec"))


@pytest.fixture(scope="module")
def runtime_views(spark: SparkSession) -> Iterator[None]:
    """A big streamed table `a` with two small ones (`b`, `c`) a UMJoin broadcasts, and `w`, whose filter
    keeps 1 row in 997: Spark's static estimate (no column statistics) is all of `w`, too big to broadcast;
    at run time AQE sees a few kB."""
    spark.range(60000).selectExpr("id AS a_id", "id % 100 AS a_b", "id % 50 AS a_c").createOrReplaceTempView("a")
    spark.range(100).selectExpr("id AS b_id", "id % 7 AS b_g").createOrReplaceTempView("b")
    spark.range(50).selectExpr("id AS c_id", "id % 3 AS c_h").createOrReplaceTempView("c")
    spark.range(300000).selectExpr("id AS w_id", "id % 7 AS w_g", "id % 997 AS w_sel").createOrReplaceTempView("w")
    # 200 kB: b and c are broadcast, a and w are not (by the plan's estimates).
    with temporary_conf(spark, {**AQE, "spark.sql.autoBroadcastJoinThreshold": "200k"}):
        yield


RUNTIME_SQL = """
    SELECT b_g, c_h, count(*) AS n, sum(d) AS d
    FROM (SELECT a_id * 2 AS d, a_b, a_c FROM a JOIN w ON a.a_id = w.w_id WHERE w_sel = 0) t
    JOIN b ON t.a_b = b.b_id JOIN c ON t.a_c = c.c_id
    GROUP BY b_g, c_h"""


def test_a_join_outside_the_group_changes_strategy_at_run_time_as_without_umjoin(spark: SparkSession, runtime_views: None) -> None:
    """The join of `a` and `w` (outside the group: the computed column cuts it off) is a sort-merge join by
    the plan's estimates; AQE turns it into a broadcast join once it has seen how few rows of `w` pass the
    filter. It does so with UMJoin on too, in the same query stage as the UMJoin: the UMJoin's broadcast
    inputs, which run first, no longer make AQE drop its re-plans."""
    results = {}
    for enabled in ("false", "true"):
        with temporary_conf(spark, {"spark.umjoin.enabled": enabled}):
            df = spark.sql(RUNTIME_SQL)
            initial = join_names(plans.physical_plan(df))
            rows = sorted(tuple(r) for r in df.collect())
            final = plans.physical_plan(df)
            results[enabled] = (rows, initial, join_names(final), plans.umjoin_nodes(final))
    off, on = results["false"], results["true"]
    assert on[0] == off[0] and len(off[0]) > 5
    assert off[1] == ["BroadcastHashJoinExec", "BroadcastHashJoinExec", "SortMergeJoinExec"], off[1]
    assert off[2] == ["BroadcastHashJoinExec"] * 3, off[2]
    assert [len(n.inputs) for n in on[3]] == [3] and [i.placement for i in on[3][0].inputs].count("broadcast") == 2, on[3]
    # The join of a and w: a sort-merge join at first, a broadcast join in the end, as without UMJoin.
    assert on[1] == ["SortMergeJoinExec", "UMJoinExec"], on[1]
    assert on[2] == ["BroadcastHashJoinExec", "UMJoinExec"], on[2]


@pytest.mark.parametrize("convert_broadcast_joins", ["true", "false"])
def test_an_input_aqe_finds_small_at_run_time_is_broadcast(spark: SparkSession, runtime_views: None,
                                                           convert_broadcast_joins: str) -> None:
    """By the plan's estimates `a` and the filtered `w` are too big to broadcast, so the group first
    co-partitions them; once AQE has seen their shuffled sizes, the re-planned UMJoin broadcasts what is
    small enough, as AQE would for a join of Spark's, with Spark's answer. So under UMJoin's default too
    (`spark.umjoin.convertBroadcastJoins=false`), where Spark would now broadcast in both joins: the decision
    taken when the query was first planned stands (Spark's joins could not take the input the UMJoin already
    broadcast as their streamed side; AQE would drop such a re-plan and keep the first plan's placements)."""
    sql = "SELECT b_g, count(*) AS n FROM a JOIN b ON a.a_b = b.b_id JOIN w ON a.a_id = w.w_id WHERE w_sel = 0 GROUP BY b_g"
    with temporary_conf(spark, {"spark.umjoin.enabled": "false"}):
        expected = sorted(tuple(r) for r in spark.sql(sql).collect())
    with temporary_conf(spark, {"spark.umjoin.convertBroadcastJoins": convert_broadcast_joins}):
        df = spark.sql(sql)
        (initial,) = plans.umjoin_nodes(plans.physical_plan(df))
        rows = sorted(tuple(r) for r in df.collect())
        (final,) = plans.umjoin_nodes(plans.physical_plan(df))
    assert rows == expected and len(expected) == 7
    assert sorted(i.placement for i in initial.inputs) == ["broadcast", "partitioned", "streamed"], initial
    assert sorted(i.placement for i in final.inputs) == ["broadcast", "broadcast", "streamed"], final


PLAN_STABILITY_QUERIES = (5, 8, 20, 21)


@pytest.mark.parametrize("number", PLAN_STABILITY_QUERIES)
def test_a_query_has_the_same_plan_in_every_run(spark: SparkSession, tpch_data: Path, number: int) -> None:
    """Five runs of one TPC-H query in one session under AQE: the same UMJoin groups and the same joins."""
    sql = tpch.query_text(number)
    shapes = set()
    with temporary_conf(spark, {**AQE, "spark.umjoin.enabled": "true"}):
        for _ in range(5):
            df = spark.sql(sql)
            df.collect()
            final = plans.physical_plan(df)
            shapes.add((tuple(tuple(n.labels) for n in plans.umjoin_nodes(final)), tuple(join_names(final))))
    assert len(shapes) == 1, shapes
    ((groups, _),) = shapes
    assert groups, f"Q{number} has no UMJoin"


@pytest.fixture(scope="module")
def nullable_views(spark: SparkSession) -> Iterator[None]:
    """Keys with NULLs (every 4th) and the value NULL is coalesced to (0) among the others."""
    for name, rows in (("nx", 40), ("ny", 30), ("nz", 20)):
        spark.range(rows).selectExpr(f"id AS {name}_id", f"CASE WHEN id % 4 = 0 THEN NULL ELSE id % 5 END AS {name}_k") \
            .createOrReplaceTempView(name)
    with temporary_conf(spark, {"spark.sql.autoBroadcastJoinThreshold": "-1"}):
        yield


@pytest.mark.parametrize(("sql", "null_keys_match"), [
    ("SELECT * FROM nx JOIN ny ON nx.nx_k <=> ny.ny_k JOIN nz ON ny.ny_k <=> nz.nz_k", True),
    ("SELECT * FROM nx JOIN ny ON nx.nx_k <=> ny.ny_k JOIN nz ON nx.nx_k <=> nz.nz_k AND ny.ny_id % 3 = nz.nz_id % 3", True),
    ("SELECT * FROM nx JOIN ny ON nx.nx_k <=> ny.ny_k JOIN nz ON ny.ny_k <=> nz.nz_k WHERE nx.nx_k = ny.ny_k", False),
], ids=["null-safe", "null-safe-and-equal", "null-safe-then-equal"])
@pytest.mark.parametrize("adaptive", ["true", "false"])
def test_null_safe_keys_join_a_group(spark: SparkSession, nullable_views: None, sql: str, null_keys_match: bool, adaptive: str) -> None:
    """`<=>` matches NULL with NULL (and never NULL with 0), `=` never matches NULL: the group converts,
    co-partitioned on the key, with Spark's answer."""
    answers = {}
    with temporary_conf(spark, {"spark.sql.adaptive.enabled": adaptive}):
        for enabled in ("false", "true"):
            with temporary_conf(spark, {"spark.umjoin.enabled": enabled}):
                df = spark.sql(sql)
                answers[enabled] = sorted((tuple(r) for r in df.collect()), key=repr)
                if enabled == "true":
                    nodes = plans.umjoin_nodes(plans.physical_plan(df))
    assert answers["true"] == answers["false"]
    assert any(None in row for row in answers["false"]) == null_keys_match
    assert [len(n.inputs) for n in nodes] == [3], nodes
