"""umjoin.plans: Spark's plans as Python trees, compared with UMJoin off and on."""

from __future__ import annotations

import re
from pathlib import Path

from pyspark.sql import SparkSession

from umjoin import plans, tpch
from umjoin.local import temporary_conf


def test_compare_q5(spark: SparkSession, tpch_data: Path) -> None:
    comparison = plans.compare(spark, tpch.query_text(5), execute=True)
    # The hook is a planner strategy: both settings share Spark's optimized logical plan.
    assert [n.text for n in comparison.off.logical.walk()] == [n.text for n in comparison.on.logical.walk()]
    assert comparison.join_counts == {"binary_joins_off": 5, "binary_joins_on": 0, "umjoins_on": 1}
    assert [j.name for j in comparison.replaced_joins] == ["BroadcastHashJoinExec"] * 5
    (node,) = comparison.umjoins
    assert node.labels == ["customer", "orders", "lineitem", "supplier", "nation", "region"]
    assert node.inputs[node.probe_order[0]].placement == "streamed"
    assert all(node.inputs[i].store_keys and len(node.inputs[i].store_keys) == len(node.inputs[i].probe_keys) for i in node.probe_order[1:])
    assert node.metrics["number of output rows"] > 0  # executed: AQE's final plan, with its metrics
    # Supplier joins lineitem on its key and customer on the nation: its store is keyed on both
    # (as Spark's broadcast hash join is), so a probe finds exactly the one matching supplier.
    supplier = node.inputs[node.labels.index("supplier")]
    names = lambda keys: [k.split("#")[0] for k in keys]  # noqa: E731
    assert sorted(zip(names(supplier.store_keys), names(supplier.probe_keys))) == [
        ("s_nationkey", "c_nationkey"), ("s_suppkey", "l_suppkey")]


def test_broadcast_inputs_travel_as_hash_tables_unless_several_indexes(spark: SparkSession, tpch_data: Path) -> None:
    """Fixed order: every broadcast input is one hash table on its store key, as for Spark's own
    broadcast hash join. Adaptive: an input joined on two keys (customer: customer key and nation)
    may be probed through either, so it travels as rows that each task indexes twice; region, joined
    on one key only, stays a hash table."""
    def broadcast_modes(probe_order: str) -> list[str]:
        with temporary_conf(spark, {"spark.sql.adaptive.enabled": "false", "spark.umjoin.probeOrder": probe_order}):
            df = spark.sql(tpch.query_text(5))
            df.collect()
            text = df._jdf.queryExecution().executedPlan().toString()
        return re.findall(r"BroadcastExchange (\w+)", text)

    fixed = broadcast_modes("fixed")
    assert len(fixed) >= 4 and set(fixed) == {"HashedRelationBroadcastMode"}
    adaptive = broadcast_modes("dpPick")
    assert len(adaptive) == len(fixed)
    assert adaptive.count("HashedRelationBroadcastMode") == 1  # region
    assert adaptive.count("IdentityBroadcastMode") == len(fixed) - 1


def test_compare_without_execution_keeps_metrics_at_zero(spark: SparkSession, tpch_data: Path) -> None:
    comparison = plans.compare(spark, tpch.query_text(3), execute=False)
    (node,) = comparison.umjoins
    assert not comparison.executed and node.metrics["number of output rows"] == 0


def test_subquery_plans_are_walked(spark: SparkSession, tpch_data: Path) -> None:
    """Q11's HAVING subquery joins three tables of its own; its UMJoin is found too."""
    comparison = plans.compare(spark, tpch.query_text(11), execute=True)
    assert [n.labels for n in comparison.umjoins] == [["partsupp", "supplier", "nation"]] * 2


def test_render_hides_codegen_wrappers(spark: SparkSession, tpch_data: Path) -> None:
    df = spark.sql(tpch.query_text(5))
    text = plans.render(plans.physical_plan(df))
    assert "UMJoin inputs=[" in text and "WholeStageCodegen" not in text and "InputAdapter" not in text


def test_bench_join_work_counts_the_joined_rows_spark_shuffles_and_sorts_and_umjoin_does_not(spark: SparkSession, tpch_data: Path) -> None:
    """Q5 without broadcasts: Spark's sort-merge joins shuffle and sort what the joins below produced;
    with UMJoin, Spark's joins of customer, orders and lineitem stay (no key class fits all) and the rest is one
    UMJoin, which shuffles less of it and sorts less often (counted: the sorts' time depends on the machine's load)."""
    from bench.tpch import join_work

    def work(enabled: bool) -> dict[str, float]:
        settings = {"spark.sql.adaptive.enabled": "false", "spark.sql.autoBroadcastJoinThreshold": "-1", "spark.umjoin.enabled": str(enabled).lower()}
        with temporary_conf(spark, settings):
            df = spark.sql(tpch.query_text(5))
            df.collect()
            return join_work(plans.physical_plan(df))

    off, on = work(False), work(True)
    assert off["intermediate_shuffled_mb"] > on["intermediate_shuffled_mb"] >= 0
    assert off["join_sorts"] > on["join_sorts"] >= 0
