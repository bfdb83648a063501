"""LEFT and RIGHT OUTER joins inside a batch UMJoin: an outer join's non-preserved side is one input,
probed once what its ON clause reads is bound, padded with NULLs where none of its rows matches.

Randomised differential cases: 3-5 tables joined left-deep by inner, LEFT OUTER and RIGHT OUTER
joins at random positions (an ON key to any table joined before, including an earlier outer join's
side: chains of outer joins; sometimes a non-equi ON conjunct, one on the preserved side alone, or
one on the padded side alone), sometimes WHERE conditions reading a padded side (IS NULL, coalesce)
and an EXISTS or NOT EXISTS, on t0's key or reading a padded side. Keys from a small domain
(duplicates); each table's keys NULL with a share of none, 10%, 30% or all of them, and any table,
t0 included, sometimes empty: the preserved and the padded side of LEFT and of RIGHT joins each meet
every one of KEY_FEATURES over the seeds. UMJoin off, and on in every configuration over the seeds
(each seed in half of them, `configs_of_seed`); and the shapes that must stay as Spark plans them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pytest
from pyspark.sql import SparkSession

from test_random_joins import broadcasts, configs_of_seed, join_groups, joins_dropped_by_aqe, key_features, uncovered
from test_semi_anti import CONFIGS, load, register_tables
from umjoin import plans
from umjoin.local import temporary_conf

SEEDS = range(14)
# CONFIGS: the semi/anti suite's, the random join suite's settings with an interpreted loop and an
# adaptive order, which reorders inner joins only: a group with an outer join keeps it as Spark plans it.


@dataclass(frozen=True)
class Case:
    tables: list[list[tuple]]  # t0..t{n-1}, rows (id, a, b, v)
    relation: str  # the FROM clause
    where: list[str]
    # Per join as written: its type (INNER, LEFT, RIGHT) and the (table, column) of its ON key on the preserved
    # side (an inner join's left) and on the padded side (its right); a side that is a join tree, by its key's table.
    joins: tuple[tuple[str, tuple[int, str], tuple[int, str]], ...] = ()

    @property
    def sql(self) -> str:
        columns = ", ".join(f"t{i}.id AS id{i}, t{i}.v AS v{i}" for i in range(len(self.tables)))
        return f"SELECT {columns} FROM {self.relation}" + (f" WHERE {' AND '.join(self.where)}" if self.where else "")


def make_case(seed: int) -> Case:
    rng = random.Random(seed)
    n = rng.randint(3, 5)
    domain = rng.randint(3, 6)

    def rows(count: int) -> list[tuple]:  # type: ignore[type-arg]
        null_share = rng.choices([0.0, 0.1, 0.3, 1.0], weights=[4, 4, 3, 2])[0]  # of the keys: none, some, many, all

        def key():  # type: ignore[no-untyped-def]
            return None if rng.random() < null_share else rng.randrange(domain)
        return [(i, key(), key(), rng.randint(0, 20)) for i in range(count)]

    # Any table may be empty, t0 included, on a preserved side or a padded one.
    tables = [[] if rng.random() < 0.06 else rows(rng.randint(5, 14)) for _ in range(n)]
    relation = "t0"
    padded: list[int] = []  # tables on the NULL-padded side of an outer join, as one table
    joins = []
    for i in range(1, n):
        kind = rng.choices(["inner", "left", "right", "right of a tree"], weights=[2, 5, 2, 1])[0]
        j = rng.randrange(i)  # an earlier table, possibly an earlier outer join's padded side
        tree_key, new_key = (j, rng.choice("ab")), (i, rng.choice("ab"))
        on = [f"t{j}.{tree_key[1]} = t{i}.{new_key[1]}"]
        extra = rng.random()
        if extra < 0.2:
            on.append(f"t{i}.v < t{rng.randrange(i)}.v + 8")  # not an equi key
        elif extra < 0.35:
            on.append(f"t{j}.v > 6")  # the preserved side alone: decides what matches, drops nothing
        elif extra < 0.45:
            on.append(f"t{i}.v > 6")  # the padded side alone
        condition = " AND ".join(on)
        tree = f"({relation})" if " " in relation else relation
        if kind == "inner":
            relation = f"{relation} JOIN t{i} ON {condition}"
        elif kind == "left":
            relation = f"{relation} LEFT JOIN t{i} ON {condition}"
            padded.append(i)
        elif kind == "right":  # t{i} padded, the tree so far preserved
            relation = f"t{i} RIGHT JOIN {tree} ON {condition}"
            padded.append(i)
        else:  # the tree so far padded: a join tree on the non-preserved side stays one input
            relation = f"{tree} RIGHT JOIN t{i} ON {condition}"
        joins.append((kind.split()[0].upper(), *((new_key, tree_key) if kind == "right of a tree" else (tree_key, new_key))))
    where = []
    if padded and rng.random() < 0.4:
        p = rng.choice(padded)
        where.append(rng.choice([f"t{p}.id IS NULL", f"coalesce(t{p}.a, -1) <> t0.b", f"(t{p}.v IS NULL OR t{p}.v < 12)"]))
    if rng.random() < 0.2:
        where.append(f"EXISTS (SELECT 1 FROM t{rng.randrange(n)} AS e WHERE e.a = t0.a)")
    if padded and rng.random() < 0.35:  # a semi or anti join reading a padded side (NULL there: nothing matches)
        p = rng.choice(padded)
        condition = rng.choice([f"e.a = t{p}.{rng.choice('ab')}", f"e.a = t0.a AND e.v > t{p}.v"])
        where.append(f"{rng.choice(['', 'NOT '])}EXISTS (SELECT 1 FROM t{rng.randrange(n)} AS e WHERE {condition})")
    return Case(tables, relation, where, tuple(joins))


def tables_of(case: Case) -> dict[str, list[tuple]]:  # type: ignore[type-arg]
    return {f"t{i}": r for i, r in enumerate(case.tables)}


def register(spark: SparkSession, case: Case, directory: Path) -> None:
    register_tables(spark, tables_of(case), directory)


def rows_of(df) -> list[tuple]:  # type: ignore[no-untyped-def, type-arg]
    return sorted((tuple(r) for r in df.collect()), key=repr)


def outer_inputs(nodes: list[plans.UMJoinNode]) -> int:
    return sum(1 for node in nodes for i in node.inputs if i.join_type == "LeftOuter")


def spark_outer_joins_on_one_table(df) -> int:  # type: ignore[no-untyped-def]
    """Outer joins in Spark's optimized plan whose non-preserved side is one table: each can be an outer input."""
    found = 0
    for node in plans.logical_plan(df).walk():
        kind = node.text.split(",")[0] if node.name == "Join" else ""
        side = node.children[1] if kind == "Join LeftOuter" else node.children[0] if kind == "Join RightOuter" else None
        found += side is not None and not any(n.name == "Join" for n in side.walk())
    return found


@pytest.mark.parametrize("seed", SEEDS)
def test_same_rows_with_umjoin_on_and_off(spark: SparkSession, tmp_path: Path, seed: int) -> None:
    case = make_case(seed)
    register(spark, case, tmp_path)
    with temporary_conf(spark, {"spark.umjoin.enabled": "false"}):
        reference = spark.sql(case.sql)
        expected = rows_of(reference)
        # Spark's joins as UMJoin groups them: each group of at least spark.umjoin.minInputs (3) inputs is one UMJoin.
        groups = sorted((inputs, sum(t in ("LeftOuter", "RightOuter") for t in types))
                        for inputs, types in join_groups(plans.logical_plan(reference)) if inputs >= 3)
    for name, settings in configs_of_seed(CONFIGS, seed, ("aqe-off", "dpPick")).items():
        with temporary_conf(spark, {**settings, "spark.umjoin.enabled": "true"}):
            df = spark.sql(case.sql)
            actual = rows_of(df)
            plan = plans.physical_plan(df)
        nodes = plans.umjoin_nodes(plan)
        assert actual == expected, f"seed {seed} ({name}): {case.sql}"
        if broadcasts(settings) and settings["spark.sql.adaptive.enabled"] == "false":
            # Exactly those groups, each with as many outer inputs as it has outer joins Spark kept (it turns some
            # into inner joins); a padded side that is a join tree is one input, that tree a group of its own.
            assert sorted((len(n.inputs), outer_inputs([n])) for n in nodes) == groups, f"seed {seed} ({name}): {case.sql}"
        elif broadcasts(settings) and name != "dpPick" and groups:
            # Under AQE the groups may change as stages finish (an input already broadcast), but one stays, unless
            # no join is left at all. (Without broadcasts a group splits where its inputs share no key class; an
            # adaptive order keeps outer joins as Spark plans them, as below.)
            assert nodes or joins_dropped_by_aqe(settings, plan, expected, case.tables), f"seed {seed} ({name}): {case.sql}"
        if name == "dpPick":
            assert outer_inputs(nodes) == 0


def test_generated_cases_pad_rows_and_keep_outer_joins(spark: SparkSession, tmp_path: Path) -> None:
    """The comparisons only mean something if the cases' outer joins stay outer joins in Spark's plan
    (outer inputs to convert) and pad some rows with NULLs (DuckDB's answer, outside Spark), and if the
    preserved and the padded side of LEFT and of RIGHT joins each meet every one of KEY_FEATURES."""
    con = duckdb.connect()
    padding = kept = 0
    seen: dict[tuple[str, str], set[str]] = {(kind, side): set() for kind in ("LEFT", "RIGHT") for side in ("preserved", "padded")}
    for seed in SEEDS:
        case = make_case(seed)
        register(spark, case, tmp_path)
        kept += spark_outer_joins_on_one_table(spark.sql(case.sql))
        load(con, tables_of(case))
        ids = " OR ".join(f"id{i} IS NULL" for i in range(len(case.tables)))
        padding += con.execute(f"SELECT count(*) FROM ({case.sql}) WHERE {ids}").fetchone()[0] > 0  # type: ignore[index]
        for kind, (preserved, preserved_column), (padded, padded_column) in case.joins:
            if kind != "INNER":
                seen[kind, "preserved"] |= key_features(case.tables[preserved], preserved_column)
                seen[kind, "padded"] |= key_features(case.tables[padded], padded_column)
    assert padding >= 0.5 * len(SEEDS) and kept >= len(SEEDS)
    assert uncovered(seen) == {}


def test_rows_padded_with_nulls_are_not_claimed_partitioned_by_the_padded_key(spark: SparkSession, tmp_path: Path) -> None:
    """l and r co-partitioned on their key, r LEFT OUTER: a padded row's r.k is NULL and lies where its l.k
    hashes to, so a GROUP BY r.k above needs an exchange (else NULL forms a group per partition)."""
    rng = random.Random(3)
    tables = {"l": ("id INTEGER, k INTEGER, c INTEGER", [(i, rng.randrange(50), rng.randrange(5)) for i in range(400)]),
              "r": ("id INTEGER, k INTEGER", [(i, 20 + rng.randrange(100)) for i in range(300)]),
              "d": ("c INTEGER, name VARCHAR", [(c, f"c{c}") for c in range(5)])}
    con = duckdb.connect()
    for name, (columns, rows) in tables.items():
        con.execute(f"CREATE TABLE {name} ({columns})")
        con.executemany(f"INSERT INTO {name} VALUES ({', '.join('?' * len(rows[0]))})", rows)
        con.execute(f"COPY {name} TO '{tmp_path / name}.parquet' (FORMAT parquet)")
        spark.read.parquet(str(tmp_path / f"{name}.parquet")).createOrReplaceTempView(name)
    sql = "SELECT r.k, count(*) AS n FROM l JOIN d ON l.c = d.c LEFT JOIN r ON l.k = r.k GROUP BY r.k"
    expected = sorted(con.execute(sql).fetchall(), key=repr)
    sizes = {name: (tmp_path / f"{name}.parquet").stat().st_size for name in tables}
    threshold = str((sizes["d"] + min(sizes["l"], sizes["r"])) // 2)  # d is broadcast, l and r are not
    with temporary_conf(spark, {"spark.sql.adaptive.enabled": "false", "spark.sql.autoBroadcastJoinThreshold": threshold}):
        df = spark.sql(sql)
        actual = rows_of(df)
        (node,) = plans.umjoin_nodes(plans.physical_plan(df))
        text = df._jdf.queryExecution().executedPlan().toString()
    assert [(i.label, i.placement, i.join_type) for i in node.inputs] == [
        ("l", "streamed", "Inner"), ("d", "broadcast", "Inner"), ("r", "partitioned", "LeftOuter")]
    assert actual == expected and any(k is None for k, _ in expected)
    # explain() names the step; the metric counts the rows of l (joined with d) that no row of r matched.
    assert "probeOrder=[#0 -> #1 -> #2 (outer)]" in text, text
    (padded,) = [n for k, n in expected if k is None]
    assert node.metrics["input #2 r: rows padded with NULLs"] == padded


def test_a_join_tree_on_the_padded_side_is_one_input_and_a_full_outer_join_stays(spark: SparkSession, tmp_path: Path) -> None:
    """A LEFT join whose non-preserved side is a join tree: that tree is planned on its own and probed as one
    input (the padding is per combination of the preserved side, whatever that input is). A FULL OUTER join
    pads both sides: it stays as Spark plans it, the inner joins beside it still one UMJoin."""
    rng = random.Random(8)
    tables = [[(i, rng.randrange(4), rng.randrange(4), rng.randrange(20)) for i in range(8)] for _ in range(2)]
    tables += [[(i, 2 + rng.randrange(6), 2 + rng.randrange(6), rng.randrange(20)) for i in range(8)] for _ in range(2)]  # some keys unmatched
    register(spark, Case(tables, "t0", []), tmp_path)
    queries = {
        "tree": "SELECT t0.id, t1.id, t2.id, t3.id FROM t0 JOIN t1 ON t0.a = t1.a LEFT JOIN (t2 JOIN t3 ON t2.b = t3.b) ON t1.b = t2.a",
        "full": "SELECT t0.id, t1.id, t2.id, t3.id FROM t0 JOIN t1 ON t0.a = t1.a JOIN t2 ON t1.b = t2.b FULL JOIN t3 ON t2.a = t3.a",
    }
    for name, sql in queries.items():
        with temporary_conf(spark, {"spark.umjoin.enabled": "false"}):
            expected = rows_of(spark.sql(sql))
        with temporary_conf(spark, {"spark.sql.adaptive.enabled": "false"}):
            df = spark.sql(sql)
            actual = rows_of(df)
            nodes = plans.umjoin_nodes(plans.physical_plan(df))
            text = df._jdf.queryExecution().executedPlan().toString()
        assert actual == expected and any(None in r for r in expected), name
        if name == "tree":
            (node,) = nodes
            assert [(i.label, i.join_type) for i in node.inputs] == [("t0", "Inner"), ("t1", "Inner"), ("t2+t3", "LeftOuter")]
        else:
            (node,) = nodes
            assert sorted(i.label for i in node.inputs) == ["t0", "t1", "t2"] and "FullOuter" in text, text


@pytest.mark.parametrize("exists", ["EXISTS", "NOT EXISTS"])
def test_a_semi_or_anti_join_reading_a_padded_side_runs_inside_the_group(spark: SparkSession, tmp_path: Path, exists: str) -> None:
    """[NOT] EXISTS keyed by a padded table's column, and one comparing with it: NULL where padded, so
    nothing matches there (the semi join drops the padded combination, the anti join keeps it), as
    Spark's joins and DuckDB decide. Each runs as a filter input of the group, after the outer step."""
    rng = random.Random(11)
    tables = [[(i, rng.randrange(5), rng.randrange(5), rng.randrange(20)) for i in range(12)] for _ in range(2)]
    tables.append([(i, 2 + rng.randrange(5), rng.randrange(9), rng.randrange(20)) for i in range(10)])  # keys 0-1 padded
    filtering = {"e": [(i, rng.randrange(8), rng.randrange(8), rng.randrange(20)) for i in range(8)]}
    case = Case(tables, "t0 JOIN t1 ON t0.b = t1.b LEFT JOIN t2 ON t0.a = t2.a", [])
    register_tables(spark, tables_of(case) | filtering, tmp_path)
    con = duckdb.connect()
    load(con, tables_of(case) | filtering)
    for condition in ("e.a = t2.b", "e.a = t0.a AND e.v > t2.v"):
        sql = f"{case.sql} WHERE {exists} (SELECT 1 FROM e WHERE {condition})"
        expected = sorted(con.execute(sql).fetchall(), key=repr)
        with temporary_conf(spark, {"spark.sql.adaptive.enabled": "false"}):
            df = spark.sql(sql)
            actual = rows_of(df)
            (node,) = plans.umjoin_nodes(plans.physical_plan(df))
        assert actual == expected, (condition, sql)
        assert [(i.label, i.join_type) for i in node.inputs] == [
            ("t0", "Inner"), ("t1", "Inner"), ("t2", "LeftOuter"), ("e", "LeftSemi" if exists == "EXISTS" else "LeftAnti")], condition
        padded = [row for row in expected if row[4] is None]
        assert (padded != []) == (exists == "NOT EXISTS") and len(padded) < len(expected), condition
