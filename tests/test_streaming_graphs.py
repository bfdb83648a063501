"""Streaming UMJoin over any connected graph of inner equi-joins: random chains, stars, cycles and
snowflakes of 3-6 streams over 2-4 key classes, sometimes with a static table or a condition that is
not an equi-join, split at random into micro-batches. Each case must run as one StreamingUMJoin and give exactly the batch join of all the
data (UMJoin off). Without watermarks, Spark's own chained stream-stream joins put out that batch join
too, so it is the oracle here at half the cost of running them; where a watermark makes Spark's
joins drop rows, the suites compare with them micro-batch by micro-batch (test_streaming_event_time).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import stream_data
from test_streaming import ROCKSDB, executed_plan, run_to_end, sorted_rows, stream, write_batches
from umjoin.local import temporary_conf

KEYS = 4  # every table has key columns k0..k3; an edge on class c joins two tables' k<c>


@dataclass
class Case:
    shape: str
    tables: list[str]
    static: set[str]
    edges: list[tuple[str, str, int]]  # (table, table, key column)
    batches: dict[str, list[list[tuple[Any, ...]]]]  # stream -> rows per micro-batch; static -> [rows]
    residual: bool = False  # a condition that is not an equi-join, between the first table and the last

    def columns(self, table: str) -> str:
        return ", ".join([f"{table}_k{c} BIGINT" for c in range(KEYS)] + [f"{table}_v BIGINT"])


def random_case(seed: int) -> Case:
    rng = random.Random(seed)
    shape = ["chain", "star", "cycle", "snowflake"][seed % 4]
    n = rng.randint(3, 6)
    tables = [chr(ord("a") + i) for i in range(n)]
    classes = rng.randint(2, min(4, n))
    if shape == "chain":
        pairs = [(tables[i], tables[i + 1]) for i in range(n - 1)]
    elif shape == "star":
        pairs = [(tables[0], t) for t in tables[1:]]
    elif shape == "cycle":
        pairs = [(tables[i], tables[(i + 1) % n]) for i in range(n)]
    else:  # a tree: each table joins one before it
        pairs = [(tables[rng.randrange(i)], tables[i]) for i in range(1, n)]
    # Every class used at least once, then at random.
    labels = list(range(classes)) + [rng.randrange(classes) for _ in range(len(pairs) - classes)]
    rng.shuffle(labels)
    edges = [(a, b, c) for (a, b), c in zip(pairs, labels)]
    # A static table in some cases; in every fourth, every table but the first (one stream joined with static tables,
    # stored in the StreamingUMJoin's state where they are too large to broadcast: the case runs with broadcasts off).
    static = set(tables[1:]) if seed % 4 == 3 else {rng.choice(tables[1:])} if rng.random() < 0.35 else set()
    micro_batches = rng.randint(1, 5)
    together = rng.random() < 0.25  # all inputs in one batch
    batches: dict[str, list[list[tuple[Any, ...]]]] = {}
    for t in tables:
        key = stream_data.key_drawer(rng, rng.randint(2, 5), stream_data.null_share(rng))
        rows = [tuple(key() for _ in range(KEYS)) + (rng.randrange(1000),) for _ in range(rng.choice([0, *range(1, 15)]))]
        if t in static or together:
            batches[t] = [rows]
            continue
        batches[t] = [[] for _ in range(rng.randint(0, 2))] + stream_data.cut(rng, rows, micro_batches - 1)  # some streams start later
    return Case(shape, tables, static, edges, batches, residual=seed % 3 == 0)


def join_query(case: Case, read: Any) -> DataFrame:
    """The tables joined as a user writes it: breadth-first from the first one, each join with every
    condition linking the new table to those joined before."""
    frames = {t: read(t) for t in case.tables}
    joined_tables = [case.tables[0]]
    result = frames[case.tables[0]]
    while len(joined_tables) < len(case.tables):
        nxt = next(t for t in case.tables if t not in joined_tables and any(
            (a == t and b in joined_tables) or (b == t and a in joined_tables) for a, b, _ in case.edges))
        conditions = [
            F.col(f"{a}_k{c}") == F.col(f"{b}_k{c}")
            for a, b, c in case.edges
            if {a, b} <= set(joined_tables) | {nxt} and nxt in (a, b)
        ]
        condition = conditions[0]
        for more in conditions[1:]:
            condition = condition & more
        result = result.join(frames[nxt], condition)
        joined_tables.append(nxt)
    if case.residual:  # Spark pushes it into the join that brings in the second of the two tables
        first, last = case.tables[0], case.tables[-1]
        result = result.where(F.col(f"{first}_v") > F.col(f"{last}_v") - 500)
    return result


def run_case(spark: SparkSession, tmp_path: Path, case: Case, name: str, settings: dict[str, str]) -> tuple[list[tuple], list[tuple], str]:  # type: ignore[type-arg]
    for t in case.tables:
        write_batches(tmp_path / t, case.columns(t), case.batches[t])

    def read_stream(t: str) -> DataFrame:
        if t in case.static:
            return spark.read.parquet(str(tmp_path / t))
        return stream(spark, tmp_path / t, case.columns(t))

    with temporary_conf(spark, settings):
        on, running = run_to_end(join_query(case, read_stream), f"{name}_on", tmp_path / "ck-on")
        plan = executed_plan(running)
        with temporary_conf(spark, {"spark.umjoin.enabled": "false"}):
            batch = sorted_rows(join_query(case, lambda t: spark.read.parquet(str(tmp_path / t))))
    return on, batch, plan


# Eight cases, two of each shape, whose data holds every feature the generator's test asks for on every side
# (seeds 48-55: 0-7 lack a stream with every key NULL beside static tables); graphs with watermarks and time ranges
# are test_streaming_event_time's.
SEEDS = range(48, 56)


@pytest.mark.parametrize("seed", SEEDS)
def test_random_join_graphs_as_streams_give_the_batch_join(spark: SparkSession, tmp_path: Path, seed: int) -> None:
    case = random_case(seed)
    settings = {"spark.sql.shuffle.partitions": str(2 + seed % 3), **(ROCKSDB if seed % 2 else {})}
    if len(case.static) > 1:  # the tables stored (whatever their size: see spark.umjoin.staticTables)
        settings |= {"spark.sql.autoBroadcastJoinThreshold": "-1", "spark.umjoin.staticTables": "store"}
    if seed % 5 == 4:  # routes chosen again between micro-batches, within what the state's layout can probe
        settings |= {"spark.umjoin.probeOrder": ["dpPick", "greedy", "selectivityFirst"][seed % 3], "spark.umjoin.dpPick.period": "1ms"}
    on, batch, plan = run_case(spark, tmp_path, case, f"graph_{seed}", settings)
    assert plan.count("StreamingUMJoin inputs=") == 1, plan
    assert "StreamingSymmetricHashJoin" not in plan and "BroadcastHashJoin" not in plan and "SortMergeJoin" not in plan, plan
    assert on == batch, (case.shape, case.edges, case.static, len(on), len(batch))


def test_the_generator_covers_every_shape_static_tables_several_key_classes_and_users_data() -> None:
    cases = [random_case(seed) for seed in SEEDS]
    assert {c.shape for c in cases} == {"chain", "star", "cycle", "snowflake"}
    assert sum(1 for c in cases if c.static) >= 3 and any(len(c.static) == len(c.tables) - 1 for c in cases)
    assert {len({cls for _, _, cls in c.edges}) for c in cases} >= {2, 3}
    assert {len(c.tables) for c in cases} >= {3, 4, 5, 6}
    assert {c.residual for c in cases} == {True, False} and {c.shape for c in cases if c.residual} == {"chain", "snowflake", "cycle"}
    # On both sides of a join of two streams and of a stream with a static table, the key column compared holds
    # users' data (no watermarks here: no row is late).
    covered: dict[tuple[str, str], set[str]] = {}
    for case in cases:
        for a, b, c in case.edges:
            how = "stream-static" if {a, b} & case.static else "stream-stream"
            for side, table in (("left", a), ("right", b)) if how == "stream-stream" else (("stream", a if b in case.static else b), ("static", b if b in case.static else a)):
                covered.setdefault((how, side), set()).update(stream_data.features(case.batches[table], [c]))
    wanted = {("stream-stream", "left"): stream_data.FEATURES_WITHOUT_EVENT_TIME, ("stream-stream", "right"): stream_data.FEATURES_WITHOUT_EVENT_TIME,
              ("stream-static", "stream"): stream_data.FEATURES_WITHOUT_EVENT_TIME, ("stream-static", "static"): stream_data.TABLE_FEATURES}
    assert not stream_data.missing(covered, wanted), stream_data.missing(covered, wanted)
