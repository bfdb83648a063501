"""Randomised differential tests: generated join graphs give the same multiset with UMJoin on and off.

Each seed draws 3-6 tables (duplicate keys, NULL keys, empty tables, a hot key), a join graph
(chain, star, cycle; sometimes two-column keys, a non-equi condition, or a table joined by a
non-equi condition only) and a key type (int, bigint, string, decimal, double with -0.0/0.0/NaN).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pytest
from pyspark.sql import SparkSession

from umjoin.local import temporary_conf
from umjoin import plans

SEEDS = range(20)
MAX_RESULT_ROWS = 20_000
KEY_TYPES = {"int": "INTEGER", "bigint": "BIGINT", "string": "VARCHAR", "decimal": "DECIMAL(10,2)", "double": "DOUBLE"}
NO_BROADCAST = {"spark.sql.autoBroadcastJoinThreshold": "-1"}  # stores built by the tasks, with the backend
CONFIGS = {
    "aqe-off": {"spark.sql.adaptive.enabled": "false"},
    "aqe-on": {"spark.sql.adaptive.enabled": "true"},
    "aqe-off-no-broadcast": {"spark.sql.adaptive.enabled": "false", **NO_BROADCAST, "spark.umjoin.stateBackend": "memory"},
    "aqe-on-no-broadcast": {"spark.sql.adaptive.enabled": "true", **NO_BROADCAST},
    # The interpreted probe loop (fixed routes otherwise run as generated code).
    "interpreted-no-broadcast": {"spark.sql.adaptive.enabled": "false", **NO_BROADCAST, "spark.sql.codegen.wholeStage": "false"},
    "rocksdb": {"spark.sql.adaptive.enabled": "false", **NO_BROADCAST, "spark.umjoin.stateBackend": "rocksdb"},
    # auto, with stores forced out of memory after 4 KB.
    "auto-spilling": {"spark.sql.adaptive.enabled": "true", **NO_BROADCAST, "spark.umjoin.stateBackend": "auto",
                      "spark.umjoin.auto.maxStoreMemory": "4k"},
    # The adaptive probe orders, choosing the route again after every row or two.
    "selectivityFirst": {"spark.sql.adaptive.enabled": "false", "spark.umjoin.probeOrder": "selectivityFirst",
                         "spark.umjoin.dpPick.cycleRows": "2"},
    "greedy-no-broadcast": {"spark.sql.adaptive.enabled": "true", **NO_BROADCAST, "spark.umjoin.probeOrder": "greedy",
                            "spark.umjoin.dpPick.cycleRows": "1"},
    "dpPick": {"spark.sql.adaptive.enabled": "true", "spark.umjoin.probeOrder": "dpPick", "spark.umjoin.dpPick.cycleRows": "1",
               "spark.umjoin.dpPick.history": "2"},
    "dpPick-rocksdb-no-smoothing": {"spark.sql.adaptive.enabled": "false", **NO_BROADCAST, "spark.umjoin.stateBackend": "rocksdb",
                                    "spark.umjoin.probeOrder": "dpPick", "spark.umjoin.dpPick.smoothing": "false",
                                    "spark.umjoin.dpPick.cycleRows": "1"},
}


def configs_of_seed(configs: dict[str, dict[str, str]], seed: int, always: tuple[str, ...]) -> dict[str, dict[str, str]]:
    """The settings a seed's query runs in: `always` (those the test asserts more on), and of the rest every
    other one, by the seed's parity. Each setting meets half the seeds, of every shape and key type."""
    chosen = [name for name in configs if name not in always][seed % 2::2]
    return {name: settings for name, settings in configs.items() if name in always or name in chosen}


@dataclass(frozen=True)
class Case:
    seed: int
    shape: str
    key_type: str
    tables: list[list[tuple]]  # rows (id, a, b, v) per table
    predicates: list[str]
    equi_connected: bool  # every table reached through equi-join keys
    single_key_class: bool  # every equi-join predicate on the same key class

    @property
    def sql(self) -> str:
        columns = ", ".join(f"t{i}.id AS id{i}, t{i}.v AS v{i}" for i in range(len(self.tables)))
        names = ", ".join(f"t{i}" for i in range(len(self.tables)))
        return f"SELECT {columns} FROM {names} WHERE {' AND '.join(self.predicates)}"


def _key(rng: random.Random, value: int, key_type: str):  # type: ignore[no-untyped-def]
    if key_type == "string":
        return f"k{value}"
    if key_type == "decimal":
        return value / 4
    if key_type == "double":
        if value == 0:
            return rng.choice([0.0, -0.0])  # SQL: -0.0 = 0.0
        if value == 1:
            return math.nan  # Spark SQL: NaN = NaN
        return value / 2
    return value


def make_case(seed: int) -> Case:
    rng = random.Random(seed)
    n = rng.randint(3, 6)
    key_type = rng.choice(list(KEY_TYPES))
    shape = rng.choice(["chain", "star", "cycle", "star-one-column"])
    if shape == "chain":
        edges = [(i, i + 1) for i in range(n - 1)]
    elif shape == "cycle":
        edges = [(i, i + 1) for i in range(n - 1)] + [(n - 1, 0)]
    else:
        edges = [(0, i) for i in range(1, n)]
    cross = rng.random() < 0.15  # the last table joins by a non-equi condition only

    def col(t: int) -> str:
        return f"t{t}.{'a' if shape == 'star-one-column' else rng.choice('ab')}"

    predicates = []
    for left, right in edges:
        if cross and right == n - 1 and left != n - 1:
            predicates.append(f"t{left}.v > t{right}.v")
            continue
        predicates.append(f"{col(left)} = {col(right)}")
        if shape != "star-one-column" and rng.random() < 0.2:  # a two-column key
            predicates.append(f"t{left}.b = t{right}.b")
    if rng.random() < 0.6:  # a condition that is not an equi-join key, over two tables
        i, j = rng.sample(range(n), 2)
        predicates.append(rng.choice([f"t{i}.v < t{j}.v", f"(t{i}.v + t{j}.v) % 3 <> 0"]))

    sizes = [rng.randint(5, 30) for _ in range(n)]
    if rng.random() < 0.15:
        sizes[rng.randrange(n)] = 0
    # One key domain for all tables, chosen so that the join keeps a few hundred rows.
    equalities = sum(" = " in p for p in predicates)
    domain = max(2, min(60, round((math.prod(max(1, r) for r in sizes) / 300) ** (1 / max(1, equalities)))))
    hot_tables = set(rng.sample(range(n), k=rng.randint(0, 2)))
    null_share = rng.choice([0.0, 0.05, 0.2])
    tables = []
    for t, rows in enumerate(sizes):
        data = []
        for i in range(rows):
            keys = []
            for _ in range(2):
                if rng.random() < null_share:
                    keys.append(None)
                elif t in hot_tables and rng.random() < 0.25:
                    keys.append(_key(rng, 2, key_type))  # the hot key
                else:
                    keys.append(_key(rng, rng.randrange(domain), key_type))
            data.append((i, keys[0], keys[1], rng.randint(0, 100)))
        tables.append(data)
    return Case(seed, shape, key_type, tables, predicates, not cross, shape == "star-one-column" and not cross)


def write_tables(case: Case, directory: Path) -> None:
    """One Parquet file per table, written by DuckDB (NaN and -0.0 kept)."""
    con = duckdb.connect()
    key = KEY_TYPES[case.key_type]
    for t, rows in enumerate(case.tables):
        con.execute(f"CREATE TABLE t{t} (id INTEGER, a {key}, b {key}, v INTEGER)")
        if rows:
            con.executemany(f"INSERT INTO t{t} VALUES (?, ?, ?, ?)", rows)
        con.execute(f"COPY t{t} TO '{directory / f't{t}.parquet'}' (FORMAT parquet)")
    con.close()


def result_size(case: Case, directory: Path) -> int:
    con = duckdb.connect()
    for t in range(len(case.tables)):
        con.execute(f"CREATE VIEW t{t} AS SELECT * FROM '{directory / f't{t}.parquet'}'")
    return con.execute(f"SELECT count(*) FROM ({case.sql})").fetchone()[0]


def canonical(rows: list) -> list[tuple[str, ...]]:  # type: ignore[type-arg]
    return sorted(tuple(repr(v) for v in row) for row in rows)


@pytest.mark.parametrize("seed", SEEDS)
def test_same_multiset_with_umjoin_on_and_off(spark: SparkSession, tmp_path: Path, seed: int) -> None:
    case = make_case(seed)
    write_tables(case, tmp_path)
    assert result_size(case, tmp_path) <= MAX_RESULT_ROWS, "generator produced a result too large to compare"
    for t in range(len(case.tables)):
        spark.read.parquet(str(tmp_path / f"t{t}.parquet")).createOrReplaceTempView(f"t{t}")

    with temporary_conf(spark, {"spark.umjoin.enabled": "false"}):
        expected = canonical(spark.sql(case.sql).collect())
    for name, settings in configs_of_seed(CONFIGS, seed, ("aqe-off", "aqe-off-no-broadcast")).items():
        with temporary_conf(spark, {**settings, "spark.umjoin.enabled": "true"}):
            df = spark.sql(case.sql)
            actual = canonical(df.collect())
            nodes = plans.umjoin_nodes(plans.physical_plan(df))
        assert actual == expected, f"seed {seed} ({case.shape}, {case.key_type}, {name}): {case.sql}"
        # The comparison must exercise UMJoin, not only Spark's own joins.
        if name == "aqe-off" and case.equi_connected:
            assert nodes, f"seed {seed}: no UMJoin for a connected equi-join graph: {case.sql}"
        if name == "aqe-off-no-broadcast" and case.single_key_class:
            assert any(i.placement == "partitioned" for node in nodes for i in node.inputs), (
                f"seed {seed}: one key class, yet no co-partitioned UMJoin: {case.sql}"
            )


def test_generated_cases_are_strong(tmp_path: Path) -> None:
    """The comparisons above only mean something if most cases join rows and filter some."""
    nonempty = with_condition = partitionable = 0
    for seed in SEEDS:
        case = make_case(seed)
        directory = tmp_path / str(seed)
        directory.mkdir()
        write_tables(case, directory)
        nonempty += result_size(case, directory) > 0
        with_condition += any("<" in p or "%" in p for p in case.predicates)
        partitionable += case.single_key_class
    assert nonempty >= 0.75 * len(SEEDS)
    assert with_condition >= 0.4 * len(SEEDS)
    assert partitionable >= 5
