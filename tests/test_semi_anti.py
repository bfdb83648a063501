"""LEFT SEMI and LEFT ANTI joins inside a batch UMJoin: EXISTS / NOT EXISTS subqueries as filter inputs.

Randomised differential cases: an inner join graph of 3-4 tables with 1-2 correlated EXISTS or NOT
EXISTS subqueries on further tables (equi keys on one or two columns, sometimes a non-equi
correlated condition), with UMJoin off, and on in every configuration over the seeds (each seed in
half of them, `configs_of_seed`); and the shapes that must stay as Spark plans them. Keys come from
a domain small enough for duplicates, each table's NULL with a share of 0, 10% or 30%; half the
seeds put an empty input or one whose key is all NULL on a side of a semi or an anti join
(ANOMALIES), so that the preserved and the subquery side of both meet every one of KEY_FEATURES.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pytest
from pyspark.sql import SparkSession

from test_random_joins import CONFIGS as RANDOM_JOIN_CONFIGS
from test_random_joins import broadcasts, configs_of_seed, joins_dropped_by_aqe, key_features, largest_key_class, uncovered
from umjoin import plans
from umjoin.local import temporary_conf

SEEDS = range(12)
# The first six seeds of every twelve give their subqueries these kinds and anomalies (on one side of each), the
# others draw 1-2 subqueries without. Drawn at random, twelve seeds would need so many anomalies to meet every
# (kind, side) with an empty input and an all-NULL key that few cases would still filter rows (an anomaly on a
# semi join's side, or an empty preserved table, leaves none); here each meets them once, where no other
# subquery hides it.
ANOMALIES: list[list[tuple[str, str]]] = [
    [("EXISTS", "subquery empty")],
    [("EXISTS", "subquery all NULL")],
    [("NOT EXISTS", "subquery empty"), ("NOT EXISTS", "subquery all NULL")],  # each keeps every row
    [("NOT EXISTS", "preserved all NULL"), ("", "")],  # beside a subquery drawn as usual
    [("EXISTS", "preserved all NULL")],
    [("EXISTS", "preserved empty"), ("NOT EXISTS", "preserved empty")],  # both on the one empty table
]
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
    # Per subquery: semi (EXISTS) or anti (NOT EXISTS), the (table, column) of each key on the preserved side, and
    # the subquery table's key columns.
    filter_joins: tuple[tuple[str, tuple[tuple[int, str], ...], tuple[str, ...]], ...] = ()

    @property
    def sql(self) -> str:
        columns = ", ".join(f"t{i}.id AS id{i}, t{i}.v AS v{i}" for i in range(len(self.tables)))
        names = ", ".join(f"t{i}" for i in range(len(self.tables)))
        return f"SELECT {columns} FROM {names} WHERE {' AND '.join(self.inner + self.subqueries)}"

    @property
    def equalities(self) -> list[tuple[tuple[object, str], tuple[object, str]]]:
        """Each equi-join key, inner or correlated, as the (table, column) of its two sides."""
        inner = (re.fullmatch(r"t(\d+)\.([ab]) = t(\d+)\.([ab])", p) for p in self.inner)
        correlated = [((f"f{f}", column), key) for f, (_, keys, columns) in enumerate(self.filter_joins)
                      for column, key in zip(columns, keys)]
        return [((int(m[1]), m[2]), (int(m[3]), m[4])) for m in inner if m] + correlated


def make_case(seed: int) -> Case:
    rng = random.Random(seed)
    n = rng.randint(3, 4)
    star = rng.random() < 0.5
    inner = [f"t0.a = t{i}.a" for i in range(1, n)] if star else [f"t{i}.{rng.choice('ab')} = t{i + 1}.{rng.choice('ab')}" for i in range(n - 1)]
    sizes, null_shares = [rng.randint(4, 14) for _ in range(n)], [rng.choice([0.0, 0.1, 0.3]) for _ in range(n)]
    # One key domain, chosen so that the inner join keeps a few dozen rows (of the keys not NULL).
    domain = max(2, round((math.prod(r * (1 - share) for r, share in zip(sizes, null_shares)) / 30) ** (1 / (n - 1))))

    def rows(count: int, null_share: float) -> list[tuple]:  # type: ignore[type-arg]
        def key():  # type: ignore[no-untyped-def]
            return None if rng.random() < null_share else rng.randrange(domain)
        return [(i, key(), key(), rng.randint(0, 20)) for i in range(count)]

    tables = [rows(r, share) for r, share in zip(sizes, null_shares)]
    anomalies = ANOMALIES[seed % 12] if seed % 12 < len(ANOMALIES) else [("", "")] * rng.randint(1, 2)
    unjoined = [(t, c) for t in range(n) for c in "ab" if f"t{t}.{c}" not in " ".join(inner)]
    filters, subqueries, filter_joins = [], [], []
    for f, (kind, anomaly) in enumerate(anomalies):
        filters.append(rows(rng.randint(1, domain), rng.choice([0.0, 0.1, 0.3])))  # some of the keys, NULL or not
        if anomaly == "preserved all NULL":  # a column no inner join reads: the inner join still has rows
            t, column = rng.choice(unjoined)
        elif not (anomaly == "preserved empty" and f > 0):  # (the second on the first one's table)
            t, column = rng.randrange(n), rng.choice("ab")
        keys = [(t, column)]
        correlated = [f"f{f}.a = t{t}.{column}"]
        if rng.random() < 0.3:  # a second key, on another table
            keys.append((rng.randrange(n), "b"))
            correlated.append(f"f{f}.b = t{keys[1][0]}.b")
        if rng.random() < 0.4:  # a condition that is not a key
            correlated.append(rng.choice([f"f{f}.v <> t{t}.v", f"f{f}.v < t{rng.randrange(n)}.v + 5"]))
        kind = kind or rng.choice(["EXISTS", "NOT EXISTS"])
        subqueries.append(f"{kind} (SELECT 1 FROM f{f} WHERE {' AND '.join(correlated)})")
        filter_joins.append(("semi" if kind == "EXISTS" else "anti", tuple(keys), ("a", "b")[:len(keys)]))
        if anomaly == "subquery empty":
            filters[f] = []
        elif anomaly == "subquery all NULL":
            filters[f] = [(i, None, None, v) for i, _, _, v in filters[f]]
        elif anomaly == "preserved empty":
            tables[t] = []
        elif anomaly == "preserved all NULL":
            tables[t] = [(i, None, b, v) if column == "a" else (i, a, None, v) for i, a, b, v in tables[t]]
    return Case(tables, filters, inner, subqueries, tuple(filter_joins))


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
            plan = plans.physical_plan(df)
        nodes = plans.umjoin_nodes(plan)
        assert actual == expected, f"seed {seed} ({name}): {case.sql}"
        # In every setting the inner joins (with the filters, but under an adaptive order) are a UMJoin; without
        # broadcasts its inputs are co-partitioned, on a key class that must reach three inputs.
        if broadcasts(settings) or largest_key_class(case.equalities) >= 3:
            assert nodes or joins_dropped_by_aqe(settings, plan, expected, case.tables + case.filters), (
                f"seed {seed} ({name}): no UMJoin: {case.sql}"
            )
        if name == "aqe-off":
            # Every subquery is a semi or anti join whose right side is one table: each is a filter input.
            assert len(filter_inputs(nodes)) == len(case.subqueries), f"seed {seed}: {case.sql}"
        if name == "dpPick":
            assert filter_inputs(nodes) == []


def test_generated_cases_filter_rows() -> None:
    """The comparisons only mean something if subqueries keep some combinations and drop others, and if the
    preserved and the subquery side of semi and of anti joins each meet every one of KEY_FEATURES."""
    con = duckdb.connect()
    kept_some = dropped_some = 0
    seen: dict[tuple[str, str], set[str]] = {(kind, side): set() for kind in ("semi", "anti") for side in ("preserved", "subquery")}
    for seed in SEEDS:
        case = make_case(seed)
        load(con, tables_of(case))
        names = ", ".join(f"t{i}" for i in range(len(case.tables)))
        joined = con.execute(f"SELECT count(*) FROM {names} WHERE {' AND '.join(case.inner)}").fetchone()[0]  # type: ignore[index]
        filtered = con.execute(f"SELECT count(*) FROM ({case.sql})").fetchone()[0]  # type: ignore[index]
        kept_some += filtered > 0
        dropped_some += filtered < joined
        for f, (kind, preserved, columns) in enumerate(case.filter_joins):
            for t, column in preserved:
                seen[kind, "preserved"] |= key_features(case.tables[t], column)
            for column in columns:
                seen[kind, "subquery"] |= key_features(case.filters[f], column)
    assert kept_some >= 0.6 * len(SEEDS) and dropped_some >= 0.6 * len(SEEDS)
    assert uncovered(seen) == {}


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


def test_a_stored_input_keeps_only_the_rows_its_semi_join_lets_through(spark: SparkSession, tpch_data: Path) -> None:
    """TPC-H Q18: customer, orders and lineitem joined, IN the orders whose lines sum above 300 (2 of 15,000 at
    SF 0.01). Streamed by lineitem, the UMJoin stores orders; an order the IN subquery does not let through is in
    no result, so it is not stored (Yannakakis' semi-join reduction), and the answer stays Spark's."""
    from umjoin import tpch

    sql = tpch.query_text(18)
    # customer broadcast, orders too large for it: the plan Spark's default threshold gives at SF 1.
    settings = {"spark.sql.adaptive.enabled": "false", "spark.sql.autoBroadcastJoinThreshold": "100k"}
    with temporary_conf(spark, {**settings, "spark.umjoin.enabled": "false"}):
        expected = rows_of(spark, sql)
        let_through = spark.sql("SELECT count(*) FROM orders WHERE o_orderkey IN (SELECT l_orderkey FROM lineitem "
                                "GROUP BY l_orderkey HAVING sum(l_quantity) > 300)").collect()[0][0]
        all_orders = spark.table("orders").count()
    with temporary_conf(spark, settings):
        df = spark.sql(sql)
        actual = sorted((tuple(r) for r in df.collect()), key=repr)
        (node,) = plans.umjoin_nodes(plans.physical_plan(df))
    assert actual == expected and expected
    (orders,) = [i for i, inp in enumerate(node.inputs) if inp.label == "orders"]
    assert node.inputs[orders].placement == "partitioned", node.inputs
    assert node.metrics[f"input #{orders} orders: rows in"] == all_orders
    assert node.metrics[f"input #{orders} orders: rows no semi join's input matches, not stored"] == all_orders - let_through
    assert 0 < let_through < all_orders / 100


def test_not_in_and_a_joined_right_side_stay_as_spark_plans_them(spark: SparkSession, tmp_path: Path) -> None:
    """NOT IN is a null-aware anti join (NULLs change its answer); a subquery over a join is no single store."""
    case = make_case(9)  # NULL keys in t0.b, none in f0.a: NOT IN keeps some rows, not those
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
