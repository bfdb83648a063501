"""TPC-H at SF 0.01 with UMJoin on: official answers, expected conversions, readable plans, metrics."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from conftest import GOLDEN, TPCH_SF, UMJOIN_TPCH_QUERIES
from umjoin.local import temporary_conf
from umjoin import answers, plans, tpch

CONFIGS = {
    "aqe-on": {"spark.sql.adaptive.enabled": "true"},
    "aqe-off": {"spark.sql.adaptive.enabled": "false"},
    # No broadcasts: every input is hash-partitioned, groups split where inputs share no key class.
    "aqe-on-no-broadcast": {"spark.sql.adaptive.enabled": "true", "spark.sql.autoBroadcastJoinThreshold": "-1"},
    "aqe-off-no-broadcast": {"spark.sql.adaptive.enabled": "false", "spark.sql.autoBroadcastJoinThreshold": "-1"},
    # UMJoin's interpreted probe loop, as without whole-stage codegen: broadcast stores, then stores built per task.
    "interpreted": {"spark.sql.codegen.wholeStage": "false"},
    "interpreted-no-broadcast": {"spark.sql.codegen.wholeStage": "false", "spark.sql.autoBroadcastJoinThreshold": "-1"},
}
# The queries of the paper's Table 3 whose Spark plan has adjacent joins (Q15's has a single join).
PAPER_TABLE_3 = (2, 3, 5, 7, 8, 9, 10, 11, 18, 21)
QUERIES = tpch.QUERY_NUMBERS


def umjoin_groups(spark: SparkSession, number: int) -> list[list[str]]:
    """The input labels of every UMJoin in the query's plan (default settings, AQE off)."""
    with temporary_conf(spark, {"spark.sql.adaptive.enabled": "false"}):
        df = spark.sql(tpch.query_text(number))
        return [node.labels for node in plans.umjoin_nodes(plans.physical_plan(df))]


#: Every query in Spark's default setting (AQE on); in the others, the queries with a UMJoin. The rest are Spark's own
#: plans in every setting (test_queries_without_a_umjoin_get_none_in_any_setting), whose answers the first setting checks.
ANSWERED = [(number, config) for config in CONFIGS for number in QUERIES if config == "aqe-on" or number in UMJOIN_TPCH_QUERIES]


@pytest.mark.parametrize(("number", "config"), ANSWERED)
def test_official_answer_with_umjoin(spark: SparkSession, tpch_data: Path, number: int, config: str) -> None:
    columns, expected = tpch.official_answer(number, TPCH_SF)
    sql = tpch.query_text(number)
    with temporary_conf(spark, {**CONFIGS[config], "spark.umjoin.enabled": "true"}):
        rows = [tuple(r) for r in spark.sql(sql).collect()]
    problems = answers.compare(rows, expected, answers.order_by_columns(sql, columns))
    assert problems == [], f"Q{number} ({config}) differs from the official answer: {problems}"


@pytest.mark.parametrize("config", CONFIGS)
def test_queries_without_a_umjoin_get_none_in_any_setting(spark: SparkSession, tpch_data: Path, config: str) -> None:
    without = [n for n in QUERIES if n not in UMJOIN_TPCH_QUERIES]
    assert without, "every TPC-H query has a UMJoin: the official answers in every setting cover them all"
    with temporary_conf(spark, {**CONFIGS[config], "spark.umjoin.enabled": "true"}):
        converted = [n for n in without if plans.umjoin_nodes(plans.physical_plan(spark.sql(tpch.query_text(n))))]
    assert converted == [], f"{config}: these queries now have a UMJoin; run their answers in every setting (ANSWERED)"


def test_umjoin_groups_match_golden_file(spark: SparkSession, tpch_data: Path) -> None:
    found = {f"q{n:02d}": umjoin_groups(spark, n) for n in QUERIES}
    if os.environ.get("UMJOIN_UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(json.dumps(found, indent=1) + "\n")
    expected = json.loads(GOLDEN.read_text())
    assert found == expected, "UMJoin groups changed; if intended, regenerate with UMJOIN_UPDATE_GOLDEN=1"


def _has_adjacent_inner_joins(plan: plans.PlanNode) -> bool:
    """Whether Spark's own plan has a join UMJoin computes (inner, cross, left semi, left anti) right
    above another (through projections/filters)."""

    def inner(node: plans.PlanNode) -> bool:
        kind = node.text.split(",")[0]
        null_aware = kind == "Join LeftAnti" and "isnull(" in node.text  # NOT IN: stays Spark's
        return node.name == "Join" and kind in ("Join Inner", "Join Cross", "Join LeftSemi", "Join LeftAnti") and not null_aware

    def joins_below(node: plans.PlanNode) -> bool:
        return inner(node) or (node.name in ("Project", "Filter") and any(joins_below(c) for c in node.children))

    return any(inner(n) and any(joins_below(c) for c in n.children) for n in plan.walk())


@pytest.mark.parametrize("number", QUERIES)
def test_adjacent_inner_joins_are_converted(spark: SparkSession, tpch_data: Path, number: int) -> None:
    adjacent = _has_adjacent_inner_joins(plans.logical_plan(spark.sql(tpch.query_text(number))))
    groups = umjoin_groups(spark, number)
    if number in PAPER_TABLE_3:
        assert adjacent, f"Q{number} is in the paper's Table 3 but Spark's plan has no adjacent inner joins"
    if adjacent:
        assert groups, f"Q{number} has adjacent inner joins but no UMJoin"
        assert all(len(g) >= 3 for g in groups)
    else:
        assert groups == [], f"Q{number} has no adjacent inner joins, yet UMJoin groups {groups}"


def test_explain_shows_inputs_keys_and_probe_order(spark: SparkSession, tpch_data: Path) -> None:
    with temporary_conf(spark, {"spark.sql.adaptive.enabled": "false"}):
        execution = spark.sql(tpch.query_text(5))._jdf.queryExecution()
        simple = execution.explainString(_mode(spark, "simple"))
        formatted = execution.explainString(_mode(spark, "formatted"))
    line = next(l for l in simple.splitlines() if "UMJoin" in l)
    for table in ("customer", "orders", "lineitem", "supplier", "nation", "region"):
        assert table in line
    assert "(streamed)" in line and "(broadcast)" in line
    assert "joinKeys=[" in line and "o_orderkey" in line and "l_orderkey" in line
    assert "probeOrder=[#2 -> " in line
    assert "Probe order: #2 lineitem -> " in formatted
    assert "Join keys: " in formatted


def _mode(spark: SparkSession, name: str):  # type: ignore[no-untyped-def]
    return spark._jvm.org.apache.spark.sql.execution.ExplainMode.fromString(name)


def test_metrics_follow_the_probe_order(spark: SparkSession, tpch_data: Path) -> None:
    """Each match at one step probes the next store; the last step's matches are the output rows."""
    with temporary_conf(spark, {"spark.sql.adaptive.enabled": "false"}):
        df = spark.sql(tpch.query_text(5))
        df.collect()
        (node,) = plans.umjoin_nodes(plans.physical_plan(df))
    metric = lambda i, name: node.metrics[f"input #{i} {node.inputs[i].label}: {name}"]  # noqa: E731
    order = node.probe_order
    streamed = order[0]
    assert node.inputs[streamed].label == "lineitem"
    assert metric(streamed, "rows in") == 60175  # every lineitem row streams through once
    assert metric(order[1], "probes") == metric(streamed, "rows in")
    for before, after in zip(order[1:], order[2:]):
        assert metric(after, "probes") == metric(before, "matches")
    for step in order[1:]:
        stops = metric(step, "early stops")
        assert 0 <= stops <= metric(step, "probes")
        assert metric(step, "store size") > 0
    assert node.metrics["number of output rows"] == metric(order[-1], "matches")
    assert node.metrics["number of output rows"] > 0


def test_small_partitioned_stores_hold_little_memory(spark: SparkSession, tpch_data: Path) -> None:
    """`auto` stores take memory in pages of at most 1 MB, not Spark's page size (32-64 MB) per task."""
    with temporary_conf(spark, {"spark.sql.adaptive.enabled": "false", "spark.sql.autoBroadcastJoinThreshold": "-1"}):
        df = spark.sql(tpch.query_text(5))
        df.collect()
        nodes = plans.umjoin_nodes(plans.physical_plan(df))
        tasks = int(spark.conf.get("spark.sql.shuffle.partitions"))
    sizes = [node.metrics[f"input #{i} {inp.label}: store size"]
             for node in nodes for i, inp in enumerate(node.inputs) if inp.placement == "partitioned"]
    assert sizes and all(0 < size <= tasks * 4 * 2**20 for size in sizes), sizes
