"""TSC (paper 000, 3.2) on hand-built plans: groups found, plans converted, and plans left alone."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from umjoin.local import temporary_conf
from umjoin import plans

TABLES = "abcdef"


@pytest.fixture(scope="module")
def tables(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> dict[str, DataFrame]:
    """Six small Parquet tables a..f with columns <t>_k (key), <t>_j (second key), <t>_v."""
    directory = tmp_path_factory.mktemp("tsc")
    con = duckdb.connect()
    frames = {}
    for t in TABLES:
        path = directory / f"{t}.parquet"
        con.execute(
            f"COPY (SELECT i % 7 AS {t}_k, i % 5 AS {t}_j, i AS {t}_v FROM range(20) r(i)) TO '{path}' (FORMAT parquet)"
        )
        frames[t] = spark.read.parquet(str(path))
    return frames


def join(left: DataFrame, right: DataFrame, lt: str, rt: str, key: str = "k") -> DataFrame:
    return left.join(right, left[f"{lt}_{key}"] == right[f"{rt}_{key}"])


def groups_of(df: DataFrame) -> list[list[str]]:
    groups, _ = plans.tsc_groups(df, stage="analyzed")
    return [g["inputs"] for g in groups]


def multijoins(df: DataFrame) -> list[plans.PlanNode]:
    _, converted = plans.tsc_groups(df, stage="analyzed")
    return [n for n in converted.walk() if n.name == "MultiJoin"]


def test_figure_4_style_plan_gives_two_nested_groups(tables: dict[str, DataFrame]) -> None:
    """Joins with a projection and a filter between them form one group; an aggregate ends it, so the
    joins above the aggregate form a second group with the aggregate as one of its inputs."""
    a, b, c, d, e = (tables[t] for t in "abcde")
    lower = join(a, b, "a", "b").select("a_k", "a_v", "b_k").filter(F.col("a_v") > 2)
    lower = join(lower, c, "a", "c")
    aggregated = lower.groupBy("c_k").agg(F.sum("a_v").alias("total"))
    upper = join(join(aggregated.withColumnRenamed("c_k", "x_k"), d, "x", "d"), e, "d", "e")
    assert groups_of(upper) == [["a+b+c", "d", "e"], ["a", "b", "c"]]
    outer, inner = multijoins(upper)
    assert len(outer.children) == 3 and len(inner.children) == 3
    # Step 2 put the inner MultiJoin below the aggregate that feeds the outer one.
    assert any(n.name == "MultiJoin" for n in outer.children[0].walk())


def test_members_and_roots(tables: dict[str, DataFrame]) -> None:
    a, b, c = (tables[t] for t in "abc")
    df = join(join(a, b, "a", "b").select("a_k", "b_k", "a_v").filter(F.col("b_k") > 1), c, "a", "c")
    groups, _ = plans.tsc_groups(df, stage="analyzed")
    (group,) = groups
    assert group["members"] == ["Join", "Filter", "Project", "Join"]  # breadth-first from the root
    assert group["inputs"] == ["a", "b", "c"]


def test_computed_projection_splits_groups(tables: dict[str, DataFrame]) -> None:
    """A projection that computes a column is not a member: the joins on each side group apart."""
    a, b, c, d = (tables[t] for t in "abcd")
    lower = join(join(a, b, "a", "b"), c, "b", "c").select("a_k", (F.col("a_v") * 2).alias("x_k"))
    df = join(lower, d, "x", "d")
    assert groups_of(df) == [["a+b+c", "d"], ["a", "b", "c"]]


def test_full_outer_join_is_an_input_not_a_member(tables: dict[str, DataFrame]) -> None:
    a, b, c, d = (tables[t] for t in "abcd")
    outer = a.join(b, a["a_k"] == b["b_k"], "full")
    df = join(join(outer, c, "a", "c"), d, "c", "d")
    assert groups_of(df) == [["a+b", "c", "d"]]


def test_left_outer_join_is_a_member_its_right_side_one_input(tables: dict[str, DataFrame]) -> None:
    """The non-preserved side of a LEFT (or RIGHT) outer join is one input of the group, even a join tree."""
    a, b, c, d = (tables[t] for t in "abcd")
    df = join(join(a.join(b, a["a_k"] == b["b_k"], "left"), c, "a", "c"), d, "c", "d")
    assert groups_of(df) == [["a", "b", "c", "d"]]
    right = join(a, b, "a", "b").join(c, F.col("a_k") == F.col("c_k"), "right")
    assert groups_of(join(right, d, "c", "d")) == [["a+b", "c", "d"], ["a", "b"]]


def test_user_hint_keeps_the_join_out(tables: dict[str, DataFrame]) -> None:
    """Spark attaches a hint to its join while optimizing: the batch hook sees it there."""
    a, b, c = (tables[t] for t in "abc")
    hinted = join(a, b.hint("broadcast"), "a", "b")
    groups, _ = plans.tsc_groups(join(hinted, c, "a", "c"), stage="optimized")
    assert [g["inputs"] for g in groups] == [["a+b", "c"]]
    plain, _ = plans.tsc_groups(join(join(a, b, "a", "b"), c, "a", "c"), stage="optimized")
    assert [sorted(g["inputs"]) for g in plain] == [["a", "b", "c"]]


def test_plan_without_joins_comes_back_unchanged(tables: dict[str, DataFrame]) -> None:
    df = tables["a"].filter(F.col("a_v") > 3).groupBy("a_k").count()
    groups, converted = plans.tsc_groups(df, stage="analyzed")
    assert groups == []
    assert [n.text for n in converted.walk()] == [n.text for n in _analyzed(df).walk()]


def test_plan_with_only_full_outer_joins_comes_back_unchanged(tables: dict[str, DataFrame]) -> None:
    a, b, c = (tables[t] for t in "abc")
    df = a.join(b, a["a_k"] == b["b_k"], "full").join(c, F.col("a_k") == c["c_k"], "full")
    groups, converted = plans.tsc_groups(df, stage="analyzed")
    assert groups == []
    assert [n.text for n in converted.walk()] == [n.text for n in _analyzed(df).walk()]


def test_binary_join_is_a_group_but_not_converted_below_min_inputs(spark: SparkSession, tables: dict[str, DataFrame]) -> None:
    """TSC groups any join (Algorithm 2); the planner converts groups of spark.umjoin.minInputs or more."""
    a, b = tables["a"], tables["b"]
    assert groups_of(join(a, b, "a", "b")) == [["a", "b"]]
    with temporary_conf(spark, {"spark.sql.adaptive.enabled": "false"}):
        # A new DataFrame for each setting: Spark keeps a DataFrame's physical plan once made.
        assert plans.umjoin_nodes(plans.physical_plan(join(a, b, "a", "b"))) == []
        with temporary_conf(spark, {"spark.umjoin.minInputs": "2"}):
            (node,) = plans.umjoin_nodes(plans.physical_plan(join(a, b, "a", "b")))
            assert node.labels == ["a", "b"]


def test_self_join_inputs_are_distinct_nodes(tables: dict[str, DataFrame]) -> None:
    """Equal subtrees are different nodes: a table joined three times gives three inputs."""
    a = tables["a"]
    a1, a2, a3 = a.alias("a1"), a.alias("a2"), a.alias("a3")
    df = a1.join(a2, F.col("a1.a_k") == F.col("a2.a_j")).join(a3, F.col("a2.a_k") == F.col("a3.a_j"))
    groups, _ = plans.tsc_groups(df, stage="optimized")
    assert [g["inputs"] for g in groups] == [["a", "a", "a"]]


def _analyzed(df: DataFrame) -> plans.PlanNode:
    return plans.logical_plan(df, stage="analyzed")


def test_nondeterministic_filter_splits_the_group(spark: SparkSession, tables: dict[str, DataFrame]) -> None:
    """A filter on rand() between joins must run once per row, where Spark put it: the group splits there."""
    a, b, c = (tables[t] for t in "abc")

    def query() -> DataFrame:
        return join(join(a, b, "a", "b").filter(F.rand(7) < 0.5), c, "a", "c")

    assert [sorted(g) for g in groups_of(query())] == [["a", "b", "c"]]  # TSC alone groups across it
    # Spark's ReorderJoin would lift the filter above all joins; keep it between them for this test.
    settings = {
        "spark.sql.adaptive.enabled": "false",
        "spark.umjoin.minInputs": "2",
        "spark.sql.optimizer.excludedRules": "org.apache.spark.sql.catalyst.optimizer.ReorderJoin",
    }
    with temporary_conf(spark, settings):
        plan = plans.physical_plan(query())
    assert [node.labels for node in plans.umjoin_nodes(plan)] == [["a+b", "c"], ["a", "b"]]
    assert any(n.name == "FilterExec" and "rand(" in n.text for n in plan.walk())
