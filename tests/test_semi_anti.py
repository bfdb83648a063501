"""LEFT SEMI and LEFT ANTI joins inside a batch UMJoin: EXISTS / NOT EXISTS subqueries as filter inputs.

Randomised differential cases: an inner join graph of 3-4 tables with 1-2 correlated EXISTS or NOT
EXISTS subqueries on further tables (equi keys on one or two columns, sometimes a non-equi
correlated condition, duplicate and NULL keys, empty subquery tables), with UMJoin off, and on in
every configuration over the seeds (each seed in half of them, `configs_of_seed`); and the shapes
that must stay as Spark plans them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pytest
from pyspark.sql import SparkSession

from test_random_joins import CONFIGS as RANDOM_JOIN_CONFIGS, configs_of_seed
from umjoin import plans
from umjoin.local import temporary_conf

SEEDS = range(12)
# The random join suite's settings: broadcast or not, AQE, generated or interpreted loop, RocksDB ...
CONFIGS = {name: RANDOM_JOIN_CONFIGS[name] for name in
           ("aqe-off", "aqe-on", "aqe-off-no-broadcast", "aqe-on-no-broadcast", "interpreted-no-broadcast", "rocksdb")}
CONFIGS["interpreted"] = {"spark.sql.adaptive.enabled": "false", "spark.sql.codegen.wholeStage": "false"}
# ... and an adaptive order, which reorders inner joins only: a group with a filter keeps the semi/anti joins as Spark plans them.
CONFIGS["dpPick"] = RANDOM_JOIN_CONFIGS["dpPick"]


@dataclass(frozen=True)
class Case:
    tables: list[list[tuple]]  # t0..t{n-1}: the joined tables, rows (id, a, b, v)
    filters: list[list[tuple]]  # f0..: the subqueries' tables
    inner: list[str]
    subqueries: list[str]

    @property
    def sql(self) -> str:
        columns = ", ".join(f"t{i}.id AS id{i}, t{i}.v AS v{i}" for i in range(len(self.tables)))
        names = ", ".join(f"t{i}" for i in range(len(self.tables)))
        return f"SELECT {columns} FROM {names} WHERE {' AND '.join(self.inner + self.subqueries)}"


def make_case(seed: int) -> Case:
    rng = random.Random(seed)
    n = rng.randint(3, 4)
    star = rng.random() < 0.5
    inner = [f"t0.a = t{i}.a" for i in range(1, n)] if star else [f"t{i}.{rng.choice('ab')} = t{i + 1}.{rng.choice('ab')}" for i in range(n - 1)]
    domain = rng.randint(3, 8)
    null_share = rng.choice([0.0, 0.1])

    def rows(count: int) -> list[tuple]:  # type: ignore[type-arg]
        def key():  # type: ignore[no-untyped-def]
            return None if rng.random() < null_share else rng.randrange(domain)
        return [(i, key(), key(), rng.randint(0, 20)) for i in range(count)]

    tables = [rows(rng.randint(4, 14)) for _ in range(n)]
    filters, subqueries = [], []
    for f in range(rng.randint(1, 2)):
        filters.append([] if rng.random() < 0.15 else rows(rng.randint(1, 12)))
        t = rng.randrange(n)
        correlated = [f"f{f}.a = t{t}.{rng.choice('ab')}"]
        if rng.random() < 0.3:  # a second key, on another table
            correlated.append(f"f{f}.b = t{rng.randrange(n)}.b")
        if rng.random() < 0.4:  # a condition that is not a key
            correlated.append(rng.choice([f"f{f}.v <> t{t}.v", f"f{f}.v < t{rng.randrange(n)}.v + 5"]))
        kind = rng.choice(["EXISTS", "NOT EXISTS"])
        subqueries.append(f"{kind} (SELECT 1 FROM f{f} WHERE {' AND '.join(correlated)})")
    return Case(tables, filters, inner, subqueries)


def load(con: duckdb.DuckDBPyConnection, tables: dict[str, list[tuple]]) -> None:  # type: ignore[type-arg]
    """Each table of (id, a, b, v) rows into DuckDB."""
    for name, rows in tables.items():
        con.execute(f"CREATE OR REPLACE TABLE {name} (id INTEGER, a INTEGER, b INTEGER, v INTEGER)")
        if rows:
            con.executemany(f"INSERT INTO {name} VALUES (?, ?, ?, ?)", rows)


def register_tables(spark: SparkSession, tables: dict[str, list[tuple]], directory: Path) -> None:  # type: ignore[type-arg]
    """Each table as a Parquet file and a temporary view of its name."""
    con = duckdb.connect()
    load(con, tables)
    for name in tables:
        con.execute(f"COPY {name} TO '{directory / name}.parquet' (FORMAT parquet)")
        spark.read.parquet(str(directory / f"{name}.parquet")).createOrReplaceTempView(name)
    con.close()


def tables_of(case: Case) -> dict[str, list[tuple]]:  # type: ignore[type-arg]
    return {f"t{i}": r for i, r in enumerate(case.tables)} | {f"f{i}": r for i, r in enumerate(case.filters)}


def register(spark: SparkSession, case: Case, directory: Path) -> None:
    register_tables(spark, tables_of(case), directory)


def rows_of(spark: SparkSession, sql: str) -> list[tuple]:  # type: ignore[type-arg]
    return sorted((tuple(r) for r in spark.sql(sql).collect()), key=repr)


def filter_inputs(nodes: list[plans.UMJoinNode]) -> list[str]:
    return [i.join_type for node in nodes for i in node.inputs if i.join_type != "Inner"]


@pytest.mark.parametrize("seed", SEEDS)
def test_same_rows_with_umjoin_on_and_off(spark: SparkSession, tmp_path: Path, seed: int) -> None:
    case = make_case(seed)
    register(spark, case, tmp_path)
    with temporary_conf(spark, {"spark.umjoin.enabled": "false"}):
        expected = rows_of(spark, case.sql)
    for name, settings in configs_of_seed(CONFIGS, seed, ("aqe-off", "dpPick")).items():
        with temporary_conf(spark, {**settings, "spark.umjoin.enabled": "true"}):
            df = spark.sql(case.sql)
            actual = sorted((tuple(r) for r in df.collect()), key=repr)
            nodes = plans.umjoin_nodes(plans.physical_plan(df))
        assert actual == expected, f"seed {seed} ({name}): {case.sql}"
        if name == "aqe-off":
            # Every subquery is a semi or anti join whose right side is one table: each is a filter input.
            assert len(filter_inputs(nodes)) == len(case.subqueries), f"seed {seed}: {case.sql}"
        if name == "dpPick":
            assert filter_inputs(nodes) == []


def test_generated_cases_filter_rows() -> None:
    """The comparisons only mean something if subqueries keep some combinations and drop others."""
    con = duckdb.connect()
    kept_some = dropped_some = 0
    for seed in SEEDS:
        case = make_case(seed)
        load(con, tables_of(case))
        names = ", ".join(f"t{i}" for i in range(len(case.tables)))
        joined = con.execute(f"SELECT count(*) FROM {names} WHERE {' AND '.join(case.inner)}").fetchone()[0]  # type: ignore[index]
        filtered = con.execute(f"SELECT count(*) FROM ({case.sql})").fetchone()[0]  # type: ignore[index]
        kept_some += filtered > 0
        dropped_some += filtered < joined
    assert kept_some >= 0.6 * len(SEEDS) and dropped_some >= 0.6 * len(SEEDS)


def test_tpch_q21_is_one_group_with_its_exists_and_not_exists(spark: SparkSession, tpch_data: Path) -> None:
    from umjoin import tpch

    with temporary_conf(spark, {"spark.sql.adaptive.enabled": "false"}):
        df = spark.sql(tpch.query_text(21))
        (node,) = plans.umjoin_nodes(plans.physical_plan(df))
        text = df._jdf.queryExecution().executedPlan().toString()
    assert sorted(i.label for i in node.inputs) == ["lineitem", "lineitem", "lineitem", "nation", "orders", "supplier"]
    assert sorted(filter_inputs([node])) == ["LeftAnti", "LeftSemi"]
    # The filters are probed last and named in the plan.
    semi, anti = (next(k for k, i in enumerate(node.inputs) if i.join_type == t) for t in ("LeftSemi", "LeftAnti"))
    assert set(node.probe_order[-2:]) == {semi, anti}
    assert f"#{semi} (semi)" in text and f"#{anti} (anti)" in text


def test_not_in_and_a_joined_right_side_stay_as_spark_plans_them(spark: SparkSession, tmp_path: Path) -> None:
    """NOT IN is a null-aware anti join (NULLs change its answer); a subquery over a join is no single store."""
    case = make_case(3)
    register(spark, case, tmp_path)
    base = "SELECT t0.id, t1.id, t2.id FROM t0, t1, t2 WHERE t0.a = t1.a AND t1.b = t2.b"
    queries = {
        "not-in": f"{base} AND t0.b NOT IN (SELECT f0.a FROM f0)",
        "exists-over-a-join": f"{base} AND EXISTS (SELECT 1 FROM f0 JOIN t1 x ON f0.a = x.a WHERE f0.b = t2.b)",
    }
    for name, sql in queries.items():
        with temporary_conf(spark, {"spark.umjoin.enabled": "false"}):
            expected = rows_of(spark, sql)
        with temporary_conf(spark, {"spark.sql.adaptive.enabled": "false"}):
            df = spark.sql(sql)
            actual = sorted((tuple(r) for r in df.collect()), key=repr)
            nodes = plans.umjoin_nodes(plans.physical_plan(df))
            text = df._jdf.queryExecution().executedPlan().toString()
        assert actual == expected, name
        assert nodes, f"{name}: the inner joins should still be one UMJoin"
        if name == "not-in":
            assert filter_inputs(nodes) == [] and "LeftAnti" in text, text
        else:
            # The subquery's join is planned on its own; the semi join probes its result as one input.
            (semi,) = [i for node in nodes for i in node.inputs if i.join_type == "LeftSemi"]
            assert semi.label != "f0", text
