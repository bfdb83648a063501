"""Randomised differential tests: generated join graphs give the same multiset with UMJoin on and off.

Each seed draws 3-6 tables, a join graph (chain, star, cycle; sometimes two-column keys, a non-equi
condition, or a table joined by a non-equi condition only) and a key type (int, bigint, string,
decimal, double with -0.0/0.0/NaN). Each table's keys come from one small domain (duplicate keys,
sometimes a hot key) and are NULL with a share of 0, 10% or 30%; in about one seed in four one
table, any of them, is empty or has only NULL keys. Both sides of the equi-joins meet each of
KEY_FEATURES over the seeds (test_generated_cases_are_strong).
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


#: What users' join keys have; each randomised suite draws every one on every side of every join type it tests
#: (each checked on that side's key column: NULL keys are some but not all of them).
KEY_FEATURES = frozenset({"NULL keys", "all keys NULL", "duplicate keys", "empty input"})


def key_features(rows: list[tuple], column: str) -> set[str]:  # type: ignore[type-arg]
    """Which KEY_FEATURES key column a or b of an input's rows (id, a, b, v) has."""
    keys = [row["ab".index(column) + 1] for row in rows]
    present = [k for k in keys if k is not None]
    found = {"empty input"} if not keys else {"all keys NULL"} if not present else set()
    found |= {"NULL keys"} if 0 < len(present) < len(keys) else set()
    return found | ({"duplicate keys"} if len(set(present)) < len(present) else set())


def uncovered(seen: dict[tuple[str, str], set[str]]) -> dict[tuple[str, str], set[str]]:
    """Per (join type, side), the KEY_FEATURES no case drew there."""
    return {side: KEY_FEATURES - found for side, found in seen.items() if KEY_FEATURES - found}


def degenerate(rows: list[tuple]) -> bool:  # type: ignore[type-arg]
    """An input (id, a, b, v) with no row, or with key column a or b NULL in every row."""
    return not rows or any(all(row[c] is None for row in rows) for c in (1, 2))


def largest_key_class(equalities: list[tuple[tuple[object, str], tuple[object, str]]]) -> int:
    """The most tables one key class, the (table, column)s the equalities make equal, reaches."""
    classes: list[set[tuple[object, str]]] = []
    for left, right in equalities:
        joined = [c for c in classes if left in c or right in c]
        classes = [c for c in classes if c not in joined] + [set().union({left, right}, *joined)]
    return max((len({table for table, _ in c}) for c in classes), default=0)


def broadcasts(settings: dict[str, str]) -> bool:
    return settings.get("spark.sql.autoBroadcastJoinThreshold") != "-1"


def joins_dropped_by_aqe(settings: dict[str, str], plan: plans.PlanNode, rows: list,  # type: ignore[type-arg]
                         inputs: list[list[tuple]]) -> bool:  # type: ignore[type-arg]
    """Whether AQE ran the query without any join: an input found empty (no row, or no row with a key: Spark
    filters NULL keys out below a join) lets AQEPropagateEmptyRelation replace the joins above it by an empty
    relation, so nothing was left for UMJoin to convert. Exact: no join in the plan, no row out."""
    return (settings["spark.sql.adaptive.enabled"] == "true" and not plans.binary_joins(plan) and not rows
            and any(degenerate(i) for i in inputs))


def _ids(fields: object) -> set[int]:
    """The attribute ids anywhere in a plan node's JSON fields."""
    if isinstance(fields, dict):
        own = {fields["exprId"]["id"]} if isinstance(fields.get("exprId"), dict) else set()
        return own.union(*(_ids(v) for v in fields.values()))
    return set().union(*(_ids(v) for v in fields)) if isinstance(fields, list) else set()


def _join_type(node: plans.PlanNode) -> str | None:
    return node.fields["joinType"]["object"].rsplit(".", 1)[-1].rstrip("$") if node.name == "Join" else None


def _has_equi_key(join: plans.PlanNode) -> bool:
    """A conjunct `l = r` of the join's condition, l reading one side's attributes only and r the other's."""
    left, right = ({i for n in side.walk() for i in _ids(n.fields)} for side in join.children)
    nodes = iter(join.fields.get("condition") or [])

    def tree() -> tuple[dict, list]:  # type: ignore[type-arg]  # the condition's pre-order node list as a tree
        node = next(nodes)
        return node, [tree() for _ in range(node["num-children"])]

    def ids(expression: tuple[dict, list]) -> set[int]:  # type: ignore[type-arg]
        return _ids(expression[0]).union(*(ids(e) for e in expression[1]))

    def conjuncts(expression: tuple[dict, list]) -> list[tuple[dict, list]]:  # type: ignore[type-arg]
        node, operands = expression
        return [c for e in operands for c in conjuncts(e)] if node["class"].endswith(".And") else [expression]

    def across(a: set[int], b: set[int]) -> bool:
        return bool(a and b) and (a <= left and b <= right or a <= right and b <= left)
    return bool(join.fields.get("condition")) and any(
        node["class"].endswith((".EqualTo", ".EqualNullSafe")) and across(ids(operands[0]), ids(operands[1]))
        for node, operands in conjuncts(tree()))


def join_groups(plan: plans.PlanNode) -> list[tuple[int, list[str]]]:
    """The groups README's rule makes of an optimized logical plan's joins, each as its number of inputs and its
    joins' types: inner, semi, anti and outer joins with an equi-join key, through projections of columns and
    filters between them; a semi or anti join's right side and an outer join's padded side are one input."""
    groups: list[tuple[list[plans.PlanNode], list[str]]] = []

    def role(node: plans.PlanNode) -> str | None:  # rules/batch.yaml's (no query here has a join hint)
        if node.name == "Join":
            member = _join_type(node) in {"Inner", "Cross", "LeftSemi", "LeftAnti", "LeftOuter", "RightOuter"}
            return "join" if member and _has_equi_key(node) else None
        columns_only = node.name == "Project" and all(
            len(e) == 1 and e[0]["class"].endswith(".AttributeReference") for e in node.fields["projectList"])
        return "pass" if (columns_only or node.name == "Filter") and node.children and role(node.children[0]) else None

    def visit(node: plans.PlanNode, group: tuple[list[plans.PlanNode], list[str]] | None) -> None:
        kind = role(node)
        if kind is None or group is None and kind == "pass":
            if group is not None:
                group[0].append(node)
            for child in node.children:
                visit(child, None)
            return
        if group is None:
            group = ([], [])
            groups.append(group)
        join_type = _join_type(node)
        if join_type:
            group[1].append(join_type)
        for side, child in enumerate(node.children):
            kept = side == 1 and join_type in {"LeftSemi", "LeftAnti", "LeftOuter"} or side == 0 and join_type == "RightOuter"
            if kept:  # one input, whatever it holds
                group[0].append(child)
            visit(child, None if kept else group)

    visit(plan, None)
    return [(len(inputs), types) for inputs, types in groups]


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

    @property
    def equi_keys(self) -> list[tuple[tuple[int, str], tuple[int, str]]]:
        """Each equi-join key as its left and right side's (table, column), read from the predicates."""
        matches = (re.fullmatch(r"t(\d+)\.([ab]) = t(\d+)\.([ab])", p) for p in self.predicates)
        return [((int(m[1]), m[2]), (int(m[3]), m[4])) for m in matches if m]


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
    null_shares = [rng.choice([0.0, 0.1, 0.3]) for _ in range(n)]
    # In about one seed in four one table, any of them, is empty or has only NULL keys: it leaves an inner join
    # no row, so one table at most.
    draw = rng.random()
    if draw < 0.12:
        sizes[rng.randrange(n)] = 0
    elif draw < 0.24:
        null_shares[rng.randrange(n)] = 1.0
    # One key domain for all tables, chosen so that the join keeps a few hundred rows (of the keys not NULL).
    equalities = sum(" = " in p for p in predicates)
    keyed = math.prod(max(1, r * (1 - share)) for r, share in zip(sizes, null_shares))
    domain = max(2, min(60, round((keyed / 300) ** (1 / max(1, equalities)))))
    hot_tables = set(rng.sample(range(n), k=rng.randint(0, 2)))
    tables = []
    for t, rows in enumerate(sizes):
        data = []
        for i in range(rows):
            keys = []
            for _ in range(2):
                if rng.random() < null_shares[t]:
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
            plan = plans.physical_plan(df)
        nodes = plans.umjoin_nodes(plan)
        assert actual == expected, f"seed {seed} ({case.shape}, {case.key_type}, {name}): {case.sql}"
        # The comparison must exercise UMJoin, not only Spark's own joins, in every setting: a connected equi-join
        # graph is one group; without broadcasts its stores are co-partitioned, so some key class must reach three
        # tables (spark.umjoin.minInputs; a chain of three on two classes splits into joins of two).
        if case.equi_connected and (broadcasts(settings) or largest_key_class(case.equi_keys) >= 3):
            assert nodes or joins_dropped_by_aqe(settings, plan, expected, case.tables), (
                f"seed {seed} ({name}): no UMJoin for a connected equi-join graph: {case.sql}"
            )
        if name == "aqe-off-no-broadcast" and case.single_key_class:
            assert any(i.placement == "partitioned" for node in nodes for i in node.inputs), (
                f"seed {seed}: one key class, yet no co-partitioned UMJoin: {case.sql}"
            )


def test_generated_cases_are_strong(tmp_path: Path) -> None:
    """The comparisons above only mean something if most cases join rows and filter some, and if both sides of
    the equi-joins meet every one of KEY_FEATURES in some case."""
    degenerates = nonempty = with_condition = partitionable = 0
    seen: dict[tuple[str, str], set[str]] = {("inner", "left"): set(), ("inner", "right"): set()}
    for seed in SEEDS:
        case = make_case(seed)
        directory = tmp_path / str(seed)
        directory.mkdir()
        write_tables(case, directory)
        if any(degenerate(rows) for rows in case.tables):
            degenerates += 1
        else:
            nonempty += result_size(case, directory) > 0
        with_condition += any("<" in p or "%" in p for p in case.predicates)
        partitionable += case.single_key_class
        for (left, left_column), (right, right_column) in case.equi_keys:
            seen["inner", "left"] |= key_features(case.tables[left], left_column)
            seen["inner", "right"] |= key_features(case.tables[right], right_column)
    # An empty table, or one whose keys are all NULL, leaves an inner join no row: the other cases must join rows.
    assert nonempty >= 0.75 * (len(SEEDS) - degenerates) and degenerates <= 0.3 * len(SEEDS)
    assert with_condition >= 0.4 * len(SEEDS)
    assert partitionable >= 5
    assert uncovered(seen) == {}
