"""Streaming UMJoin over any connected graph of inner equi-joins: random chains, stars, cycles and
snowflakes of 3-6 streams over 2-4 key classes, sometimes with a static table, split at random into
micro-batches. Each case must run as one StreamingUMJoin and give exactly the batch join of all the
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
    static = {rng.choice(tables[1:])} if rng.random() < 0.35 else set()
    micro_batches = rng.randint(1, 5)
    together = rng.random() < 0.25  # all inputs in one batch
    batches: dict[str, list[list[tuple[Any, ...]]]] = {}
    for t in tables:
        domain = rng.randint(2, 5)
        rows = [
            tuple(None if rng.random() < 0.07 else rng.randrange(domain) for _ in range(KEYS)) + (rng.randrange(1000),)
            for _ in range(rng.randint(0 if t not in static else 1, 14))
        ]
        if t in static or together:
            batches[t] = [rows]
            continue
        cuts = sorted(rng.randint(0, len(rows)) for _ in range(micro_batches - 1))
        split = [rows[a:b] for a, b in zip([0, *cuts], [*cuts, len(rows)])]
        batches[t] = [[] for _ in range(rng.randint(0, 2))] + split  # some streams start later
    return Case(shape, tables, static, edges, batches)


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


# Eight cases, two of each shape; graphs with watermarks and time ranges are test_streaming_event_time's.
@pytest.mark.parametrize("seed", range(8))
def test_random_join_graphs_as_streams_give_the_batch_join(spark: SparkSession, tmp_path: Path, seed: int) -> None:
    case = random_case(seed)
    settings = {"spark.sql.shuffle.partitions": str(2 + seed % 3), **(ROCKSDB if seed % 2 else {})}
    if seed % 5 == 4:  # routes chosen again between micro-batches, within what the state's layout can probe
        settings |= {"spark.umjoin.probeOrder": ["dpPick", "greedy", "selectivityFirst"][seed % 3], "spark.umjoin.dpPick.period": "1ms"}
    on, batch, plan = run_case(spark, tmp_path, case, f"graph_{seed}", settings)
    assert plan.count("StreamingUMJoin inputs=") == 1, plan
    assert "StreamingSymmetricHashJoin" not in plan and "BroadcastHashJoin" not in plan and "SortMergeJoin" not in plan, plan
    assert on == batch, (case.shape, case.edges, case.static, len(on), len(batch))


def test_the_generator_covers_every_shape_static_tables_and_several_key_classes() -> None:
    cases = [random_case(seed) for seed in range(16)]
    assert {c.shape for c in cases} == {"chain", "star", "cycle", "snowflake"}
    assert sum(1 for c in cases if c.static) >= 3
    assert {len({cls for _, _, cls in c.edges}) for c in cases} >= {2, 3}
    assert {len(c.tables) for c in cases} >= {3, 4, 5, 6}
