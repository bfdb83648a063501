"""Batch UMJoin's generated probe loop against the interpreted one: same rows, same metrics.

Spark runs a UMJoin inside a whole-stage codegen stage unless `spark.sql.codegen.wholeStage` is
false or the probe order is adaptive; then it runs the interpreted loop. Both must give the rows
Spark gives without UMJoin and count every probe, match and early stop alike.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from umjoin import plans, tpch
from umjoin.local import temporary_conf

COUNTED = ("rows in", "probes", "matches", "early stops")
SETTINGS = {
    "broadcast": {"spark.sql.adaptive.enabled": "false"},
    # Every input partitioned: stores built by each task, in RocksDB.
    "partitioned-rocksdb": {"spark.sql.adaptive.enabled": "false", "spark.sql.autoBroadcastJoinThreshold": "-1",
                            "spark.umjoin.stateBackend": "rocksdb"},
    "partitioned-memory-aqe": {"spark.sql.adaptive.enabled": "true", "spark.sql.autoBroadcastJoinThreshold": "-1",
                               "spark.umjoin.stateBackend": "memory"},
}


def generated_umjoins(plan: plans.PlanNode) -> list[bool]:
    """Per UMJoin (pre-order): whether it runs inside a whole-stage codegen stage, not behind an InputAdapter."""
    found: list[bool] = []

    def visit(node: plans.PlanNode, in_stage: bool) -> None:
        if node.name == "WholeStageCodegenExec":
            in_stage = True
        elif node.name == "InputAdapter":
            in_stage = False
        elif node.name == "UMJoinExec":
            found.append(in_stage)
        for child in node.subqueries + node.children:
            visit(child, in_stage)

    visit(plan, False)
    return found


def counted_metrics(plan: plans.PlanNode) -> list[dict[str, int]]:
    """Per UMJoin: its output rows and, per input, rows in, probes, matches and early stops."""
    return [
        {name: value for name, value in node.metrics.items()
         if name == "number of output rows" or name.endswith(COUNTED)}
        for node in plans.umjoin_nodes(plan)
    ]


def run(spark: SparkSession, sql: str, settings: dict[str, str]) -> tuple[Counter, plans.PlanNode]:
    with temporary_conf(spark, settings):
        df = spark.sql(sql)
        rows = Counter(tuple(r) for r in df.collect())
        return rows, plans.physical_plan(df)


# Queries with a UMJoin under each setting (without broadcasts fewer groups share a key class).
CASES = [(n, "broadcast") for n in (2, 5, 8, 9, 18, 21)] + [(n, s) for n in (2, 5, 9) for s in SETTINGS if s != "broadcast"]


@pytest.mark.parametrize(("number", "setting"), CASES)
def test_generated_loop_counts_and_answers_as_the_interpreted_one(
        spark: SparkSession, tpch_data: Path, number: int, setting: str) -> None:
    sql = tpch.query_text(number)
    generated_rows, generated_plan = run(spark, sql, SETTINGS[setting])
    interpreted_rows, interpreted_plan = run(spark, sql, {**SETTINGS[setting], "spark.sql.codegen.wholeStage": "false"})
    spark_rows, _ = run(spark, sql, {**SETTINGS[setting], "spark.umjoin.enabled": "false"})

    assert generated_umjoins(generated_plan) and all(generated_umjoins(generated_plan))
    assert not any(generated_umjoins(interpreted_plan))
    assert generated_rows == interpreted_rows == spark_rows
    generated, interpreted = counted_metrics(generated_plan), counted_metrics(interpreted_plan)
    assert generated == interpreted
    assert all(m["number of output rows"] > 0 for m in generated)


def test_adaptive_probe_order_runs_the_interpreted_loop(spark: SparkSession, tpch_data: Path) -> None:
    """A route that may change between rows is not compiled into one loop nest."""
    settings = {"spark.sql.adaptive.enabled": "false", "spark.umjoin.probeOrder": "dpPick"}
    rows, plan = run(spark, tpch.query_text(5), settings)
    spark_rows, _ = run(spark, tpch.query_text(5), {**settings, "spark.umjoin.enabled": "false"})
    assert generated_umjoins(plan) == [False]
    assert rows == spark_rows


@pytest.mark.parametrize("placement", [{}, {"spark.sql.autoBroadcastJoinThreshold": "-1", "spark.umjoin.stateBackend": "auto"}],
                         ids=["broadcast", "partitioned-auto"])
def test_unique_and_repeated_keys_nulls_and_conditions(spark: SparkSession, tmp_path: Path, placement: dict[str, str]) -> None:
    """Stores with unique keys (single-row lookups) and repeated ones on one key class, NULL keys, a non-equi condition;
    broadcast hash tables, and stores each task builds in Spark's memory-managed map (`auto`)."""
    tables = {
        "cg_fact": ([(i % 7 if i % 11 else None, i % 5, i) for i in range(300)], "k int, j int, v int"),
        "cg_unique": ([(k, f"d{k}") for k in range(6)], "k int, name string"),
        "cg_repeated": ([(j % 4, j) for j in range(12)] + [(None, 99)], "j int, w int"),
    }
    for name, (rows, schema) in tables.items():
        # Parquet files, so Spark knows their sizes and broadcasts the small ones.
        spark.createDataFrame(rows, schema).write.parquet(str(tmp_path / name))
        spark.read.parquet(str(tmp_path / name)).createOrReplaceTempView(name)
    sql = """SELECT f.v, u.name, r.w FROM cg_fact f JOIN cg_unique u ON f.k = u.k
             JOIN cg_repeated r ON f.k = r.j AND r.w < f.v"""
    generated_rows, generated_plan = run(spark, sql, {"spark.sql.adaptive.enabled": "false", **placement})
    interpreted_rows, interpreted_plan = run(spark, sql, {"spark.sql.adaptive.enabled": "false", **placement,
                                                          "spark.sql.codegen.wholeStage": "false"})
    spark_rows, _ = run(spark, sql, {"spark.umjoin.enabled": "false", **placement})
    assert generated_umjoins(generated_plan) == [True]
    assert generated_rows == interpreted_rows == spark_rows
    assert sum(generated_rows.values()) > 100
    assert counted_metrics(generated_plan) == counted_metrics(interpreted_plan)


def test_a_generated_union_of_a_umjoin_and_a_table(spark: SparkSession, tpch_data: Path) -> None:
    """Spark generates one loop for a Union's children; in a partition of the other child the UMJoin's
    stores are not there, and its code must not look for them (EXCEPT ALL is planned as such a Union)."""
    block = """SELECT o_orderkey, c_custkey, l_linenumber FROM customer, orders, lineitem
               WHERE c_custkey = o_custkey AND l_orderkey = o_orderkey AND c_mktsegment = 'BUILDING'"""
    sql = f"""{block} UNION ALL SELECT o_orderkey, o_custkey, 0 FROM orders WHERE o_orderkey < 100
              EXCEPT ALL SELECT o_orderkey, o_custkey, 0 FROM orders WHERE o_orderkey < 50"""
    generated_rows, generated_plan = run(spark, sql, {"spark.sql.adaptive.enabled": "false"})
    spark_rows, _ = run(spark, sql, {"spark.umjoin.enabled": "false"})
    assert generated_umjoins(generated_plan) == [True]
    assert any(node.name == "UnionExec" for node in generated_plan.walk())
    assert generated_rows == spark_rows and sum(spark_rows.values()) > 100


def generated_sources(spark: SparkSession, sql: str) -> list[str]:
    """The generated Java source of each whole-stage codegen stage of one planning of `sql`, comments
    (which quote the plan, expression ids and all) removed."""
    df = spark.sql(sql)
    stages = df._jdf.queryExecution().debug().codegenToSeq()
    sources = [stages.apply(i)._2() for i in range(stages.size())]
    return [re.sub(r"/\*.*?\*/", "", source, flags=re.S) for source in sources]


def test_generated_source_is_the_same_for_every_planning(spark: SparkSession, tpch_data: Path) -> None:
    """Spark compiles a source once and finds it in its code cache after: nothing that changes from one
    planning to the next (plan ids, expression ids) may be written into UMJoin's generated code."""
    with temporary_conf(spark, {"spark.sql.adaptive.enabled": "false"}):
        first, second = (generated_sources(spark, tpch.query_text(5)) for _ in range(2))
    assert any("StoredInputs" in source for source in first)
    assert first == second


def test_streamed_columns_are_read_after_the_probes_that_drop_rows(spark: SparkSession, tpch_data: Path) -> None:
    """A streamed row the first probe drops costs no reads of the columns only the output needs: the
    generated code reads lineitem's decimals after the lookup in part, not before (as Spark's
    broadcast hash join does; reading them for every row cost TPC-H Q8 a sixth of its time). And the
    lookup takes the key's value (a key row written and tested for NULLs per probe made TPC-H Q11 slower than Spark)."""
    sql = """SELECT l_extendedprice * (1 - l_discount) AS volume, s_nationkey FROM lineitem, part, supplier
             WHERE l_partkey = p_partkey AND l_suppkey = s_suppkey AND p_type = 'ECONOMY ANODIZED STEEL'"""
    with temporary_conf(spark, {"spark.sql.adaptive.enabled": "false"}):
        sources = [source for source in generated_sources(spark, sql) if "StoredInputs" in source]
        rows, plan = run(spark, sql, {"spark.sql.adaptive.enabled": "false"})
    spark_rows, _ = run(spark, sql, {"spark.sql.adaptive.enabled": "false", "spark.umjoin.enabled": "false"})
    assert generated_umjoins(plan) == [True] and rows == spark_rows and sum(rows.values()) > 100
    [source] = sources
    methods = re.split(r"\n\s*(?:private|protected|public) [\w.\[\]]+ \w+\(", source)
    [probing] = [method for method in methods if ".getOne" in method]
    # The integral keys are looked up by their values, as Spark's hash joins look up a long key: no key
    # row is written and tested for NULLs per probe.
    assert ".getOneLong(" in probing and ".anyNull()" not in probing
    lookup = probing.index(".getOneLong(")
    assert "getDecimal(" in probing[lookup:]
    assert "getDecimal(" not in probing[:lookup] and "getDecimal(" not in "".join(m for m in methods if m is not probing)


def task_bytes(spark: SparkSession, sql: str) -> int:
    """What one task of each stage of `sql` carries, summed: the Java-serialized RDD of the result
    stage and of every shuffle's map stage (Spark broadcasts exactly that once per stage, and each
    task deserializes it)."""
    serialize = spark.sparkContext._jvm.org.apache.spark.util.Utils.serialize  # type: ignore[union-attr]
    plan = spark.sql(sql)._jdf.queryExecution().executedPlan()
    stage_roots = [plan]

    def visit(node) -> None:  # type: ignore[no-untyped-def]
        if node.getClass().getSimpleName() == "ShuffleExchangeExec":
            stage_roots.append(node.children().apply(0))
        children = node.children()
        for i in range(children.size()):
            visit(children.apply(i))

    visit(plan)
    return sum(len(serialize(root.execute())) for root in stage_roots)


@pytest.mark.parametrize("number", [5, 8, 21])
def test_a_umjoin_of_six_or_more_inputs_adds_little_to_its_tasks(spark: SparkSession, tpch_data: Path, number: int) -> None:
    """A UMJoin's tasks carry what they need to build and probe the stores (keys, columns, metrics):
    at most a fifth more than Spark's own tasks for the same joins (measured 1.10-1.14; Spark's own
    tasks already hold the plan below an aggregate, whose generated code refers to its node)."""
    sql = tpch.query_text(number)
    with temporary_conf(spark, {"spark.sql.adaptive.enabled": "false"}):
        with temporary_conf(spark, {"spark.umjoin.enabled": "false"}):
            spark_bytes = task_bytes(spark, sql)
        umjoin_bytes = task_bytes(spark, sql)
        groups = [len(node.inputs) for node in plans.umjoin_nodes(plans.physical_plan(spark.sql(sql)))]
    assert max(groups) >= 6
    assert umjoin_bytes < 1.2 * spark_bytes
