"""Streaming UMJoin against Spark's chained stream-stream joins under watermarks, micro-batch by
micro-batch: random join trees of 3-6 event-time streams (each with its own watermark delay),
equi-joins with and without time ranges (both directions, strict and non-strict bounds), event-time
columns kept, renamed, dropped or stripped of their watermark with ``withMetadata`` between joins,
computed columns, static tables, an outer or semi join on top; files out of event-time order, cut into
micro-batches, holding users' data on every side of every join type (stream_data: NULL keys, every
key NULL, no row, duplicates, empty micro-batches, late rows, rows exactly at the watermark, which
each case checks against Spark's progress; the coverage test asserts each per join type and side).
Every case must give the rows Spark's joins give (UMJoin off) in the same micro-batches, and either
run as one StreamingUMJoin or stay as Spark planned it with the expected reason. The suite runs the seeds of
``EVENT_TIME_SEEDS``; ``--event-time-seeds N`` runs seeds 0 to N-1 instead.

The end-of-run state rows with UMJoin on and off are written per case to
``build/event-time-state.tsv`` (what the closing notes of this work report).
"""

from __future__ import annotations

import datetime
import random
import re
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.errors import StreamingQueryException
from pyspark.sql.streaming import StreamingQuery

from test_streaming import ROCKSDB, by_batch, executed_plan, run_by_batch, start_by_batch, stream, write_batches
import stream_data
from umjoin import plans
from umjoin.local import temporary_conf

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import ad_attribution  # noqa: E402

BASE = datetime.datetime(2026, 5, 1)
STATE_REPORT = Path(__file__).resolve().parents[1] / "build" / "event-time-state.tsv"


#: The fewest cases that meet every assertion of `test_the_generator_covers_what_the_suite_promises` at the least cost
#: (streams x micro-batches), found by a greedy search over seeds 0-119: 208 such units where seeds 0-14 took 276.
EVENT_TIME_SEEDS = (0, 1, 2, 3, 7, 8, 9, 10, 14, 29, 38, 100)


def event_time_seeds(config: pytest.Config) -> tuple[int, ...]:
    """The seeds this run compares: ``--event-time-seeds N`` (seeds 0 to N-1), else EVENT_TIME_SEEDS."""
    wider = config.getoption("--event-time-seeds")
    return tuple(range(int(wider))) if wider is not None else EVENT_TIME_SEEDS


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "event_time_seed" in metafunc.fixturenames:
        metafunc.parametrize("event_time_seed", event_time_seeds(metafunc.config))


@dataclass
class Side:
    """A subtree of the join tree as the query has it so far: its frame, its streams, and the column
    Spark takes as its event time (None: none left)."""
    frame: DataFrame
    inputs: list[str]
    time: str | None
    keys: dict[str, str]  # input -> the name of its k0 column in the frame (renamed sometimes)


@dataclass
class Case:
    seed: int
    streams: list[str]
    static: str | None
    delays: dict[str, int]  # minutes
    batches: dict[str, list[list[tuple[Any, ...]]]]
    top: str  # inner, left_outer or left_semi
    bushy: bool
    nondeterministic: bool  # a projection between two joins computes a non-deterministic column
    rng_state: int = 0
    shape: list[str] = field(default_factory=list)
    #: Per join the query has (filled by `query`): its type, and per side ("left"/"right") the input and key column it compares.
    joins: list[tuple[str, tuple[str, int], tuple[str, int]]] = field(default_factory=list)

    def counted(self) -> dict[str, list[list[tuple[Any, ...]]]]:
        """The streams as Spark's watermarks see them (stream_data.seen_by_watermarks): every stream is compared on a
        key by an inner or semi join or as an outer join's padded side (the query's shapes), none is preserved."""
        return stream_data.seen_by_watermarks({s: self.batches[s] for s in self.streams}, [0, 1])

    def marks(self) -> list[int]:
        """The watermark of each micro-batch (stream_data.watermarks over `counted`)."""
        counted = self.counted()
        return stream_data.watermarks(counted, 2, {s: self.delays[s] * 60_000 for s in counted}, stream_data.policy_for(counted))


def columns(name: str) -> str:
    return f"{name}_k0 BIGINT, {name}_k1 BIGINT, {name}_ts TIMESTAMP, {name}_v BIGINT"


ALL_NULL, NO_ROWS = stream_data.ALL_NULL, stream_data.NO_ROWS
#: The cases whose first stream (compared by the top join and by the static table) or last stream (the top join's
#: right side) has every key NULL or no row: by seed, found by a search over assignments so that, with the other
#: cases, every join type's sides get each feature (test_the_generator_covers_what_the_suite_promises).
EXTREME_STREAMS = {0: (None, ALL_NULL), 1: (ALL_NULL, None), 2: (NO_ROWS, ALL_NULL), 3: (None, NO_ROWS), 7: (NO_ROWS, ALL_NULL),
                   8: (ALL_NULL, None), 10: (None, NO_ROWS), 14: (None, NO_ROWS)}


def random_case(seed: int) -> Case:
    """The case's shape (streams, static table, delays, top join, bushiness) from one generator and its rows from
    another, so that what the rows hold does not move the shapes the coverage test asks for. Each stream draws a
    share of NULL keys (none, some or many; now and then all of them, or no row at all), duplicates, late rows, rows
    moved to a later micro-batch, empty micro-batches, and a copy of one of its rows exactly at a watermark."""
    shape = random.Random(seed)
    rng = random.Random(f"event-time rows {seed}")
    n = 3 + seed % 4
    streams = [chr(ord("a") + i) for i in range(n)]
    top = ["inner", "left_outer", "left_semi"][seed % 3]
    static = "s" if seed % 4 in (1, 2) else None
    delays = {s: shape.choice([0, 5, 10, 20]) for s in streams}
    bushy, rng_state = seed % 5 in (0, 2, 4), shape.randrange(1 << 30)
    extremes = dict(zip((streams[0], streams[-1]), EXTREME_STREAMS.get(seed, (None, None))))
    micro_batches = rng.randint(3, 4)
    batches: dict[str, list[list[tuple[Any, ...]]]] = {}
    for s in streams:
        draw = random.Random(f"event-time rows {seed} {s}")  # (a stream's rows do not move when another's are extreme)
        if extremes.get(s) == NO_ROWS:
            batches[s] = [[] for _ in range(micro_batches)]
            continue
        share = 1.0 if extremes.get(s) == ALL_NULL else draw.choice([0.0, 0.05, 0.1, 0.3])
        domain = draw.randint(2, 4)
        key = stream_data.key_drawer(draw, domain, share)
        rows: list[tuple[int, tuple[Any, ...]]] = []
        for b in range(micro_batches):
            for _ in range(draw.randint(0, 7)):
                at = BASE + datetime.timedelta(minutes=10 * b + draw.randint(0, 14), seconds=draw.choice([0, 0, 30]))
                if b > 1 and draw.random() < 0.2:  # a late row
                    at -= datetime.timedelta(minutes=draw.randint(30, 90))
                rows.append((b, (key(), key(), at, draw.randrange(100))))
            if rows and draw.random() < 0.15:  # a duplicate of an earlier row
                rows.append((b, draw.choice(rows)[1]))
        # Micro-batches out of event-time order: a row moves one batch later now and then.
        cut = [[row for bb, row in rows if min(micro_batches - 1, bb + (1 if draw.random() < 0.15 else 0)) == b] for b in range(micro_batches)]
        for part in cut:
            draw.shuffle(part)
            if share < 1:
                stream_data.key_latest_row(part, 2, lambda row: (draw.randrange(domain), draw.randrange(domain), *row[2:]))
        batches[s] = [[] for _ in range(draw.randint(0, 1))] + cut
    case = Case(seed, streams, static, delays, batches, top=top, bushy=bushy, nondeterministic=seed % 13 == 12, rng_state=rng_state)
    counted = case.counted()
    stream_data.put_at_watermarks(rng, counted, 2, {s: delays[s] * 60_000 for s in counted}, share=1.0, policy=stream_data.policy_for(counted))
    if static:
        table_key = stream_data.key_drawer(rng, 3, rng.choice([0.0, 0.2, 1.0]))
        batches[static] = [[(table_key(), table_key(), BASE, rng.randrange(100)) for _ in range(rng.choice([0, 2, 3, 5]))]]
    return case


def minutes(m: int) -> Any:
    return F.expr(f"INTERVAL {m} MINUTES")


def query(spark: SparkSession, case: Case, directory: Path) -> DataFrame:
    """The case's join tree as a user writes it for Spark: one event-time column per join side."""
    rng = random.Random(case.rng_state)
    case.shape.clear()
    case.joins.clear()

    def leaf(s: str) -> Side:
        frame = stream(spark, directory / s, columns(s)).withColumn(f"{s}_at", F.col(f"{s}_ts"))
        return Side(frame.withWatermark(f"{s}_ts", f"{case.delays[s]} minutes"), [s], f"{s}_ts", {s: f"{s}_k0"})

    def key_condition(left: Side, right: Side, how: str, inputs: tuple[str, str] | None) -> Any:
        a, b = inputs or (rng.choice(left.inputs), rng.choice(right.inputs))
        if rng.random() < 0.5:
            case.joins.append((how, (a, 0), (b, 0)))
            return F.col(left.keys[a]) == F.col(right.keys[b])
        case.joins.append((how, (a, 1), (b, 1)))
        return F.col(f"{a}_k1") == F.col(f"{b}_k1")

    def time_range(left: Side, right: Side) -> Any:
        """right's event time within [left's - before, left's + after], written from either side, bounds strict or not."""
        lt, rt = F.col(left.time), F.col(right.time)
        before, after = rng.choice([0, 5, 15, 30]), rng.choice([0, 5, 10, 30])
        low = (rt > lt - minutes(before)) if rng.random() < 0.3 else (rt >= lt - minutes(before))
        high = (rt < lt + minutes(after)) if rng.random() < 0.3 else (rt <= lt + minutes(after))
        if rng.random() < 0.5:  # the same range said from the left side's time
            low = (lt < rt + minutes(before)) if rng.random() < 0.3 else (lt <= rt + minutes(before))
        case.shape.append(f"range[-{before},+{after}]")
        return low & high

    def between_joins(side: Side, other: str | None) -> Side:
        """After a join: one event-time column stays marked (maybe renamed), the other is dropped or stripped; maybe a computed column."""
        frame, time = side.frame, side.time
        if other is not None:
            if rng.random() < 0.5:
                frame = frame.drop(other)
                case.shape.append("drop")
            else:
                frame = frame.withMetadata(other, {})
                case.shape.append("withMetadata")
        if time is not None and rng.random() < 0.25:
            frame = frame.withColumnRenamed(time, f"{time}_r")
            time = f"{time}_r"
            case.shape.append("rename")
        if time is not None and rng.random() < 0.08:  # no event time left on this side
            frame = frame.withMetadata(time, {})
            time = None
            case.shape.append("strip-all")
        if rng.random() < 0.25:
            frame = frame.withColumn(f"c{len(case.shape)}", F.col(f"{rng.choice(side.inputs)}_v") * 3 + 1)
            case.shape.append("computed")
        keys = dict(side.keys)
        if rng.random() < 0.2:
            renamed = rng.choice(side.inputs)
            frame = frame.withColumnRenamed(keys[renamed], f"{keys[renamed]}_r")
            keys[renamed] = f"{keys[renamed]}_r"
            case.shape.append("rename-key")
        return Side(frame, side.inputs, time, keys)

    def join(left: Side, right: Side, how: str = "inner", inputs: tuple[str, str] | None = None) -> Side:
        condition = key_condition(left, right, how, inputs)
        bounded = left.time is not None and right.time is not None and (how != "inner" or rng.random() < 0.65)
        if bounded:
            condition = condition & time_range(left, right)
        else:
            case.shape.append("unbounded")
        frame = left.frame.join(right.frame, condition, how)
        if how == "left_semi":
            return Side(frame, left.inputs, left.time, left.keys)
        if left.time is None or right.time is None:
            return between_joins(Side(frame, left.inputs + right.inputs, left.time or right.time, left.keys | right.keys), None)
        keep, other = (left.time, right.time) if rng.random() < 0.5 else (right.time, left.time)
        return between_joins(Side(frame, left.inputs + right.inputs, keep, left.keys | right.keys), other)

    sides = [leaf(s) for s in case.streams]
    # The outer or semi join's right side is the last stream alone, joined on top.
    last = sides.pop() if case.top != "inner" else None
    nondeterministic = case.nondeterministic
    while len(sides) > 1:
        i = rng.randrange(len(sides) - 1) if case.bushy and len(sides) > 2 else 0
        sides[i:i + 2] = [join(sides[i], sides[i + 1])]
        if nondeterministic and len(sides) > 1:
            # Always 0, but not deterministic; it reads both sides of the join below, so it stays above it.
            first, second = sides[i].inputs[0], sides[i].inputs[-1]
            sides[i].frame = sides[i].frame.withColumn("flag", F.floor(F.rand(7)) * (F.col(f"{first}_v") + F.col(f"{second}_v")))
            nondeterministic = False
            case.shape.append("rand")
    tree = sides[0]
    if case.static is not None:
        table = spark.read.parquet(str(directory / case.static))
        probing = case.streams[0]
        case.joins.append(("static", (probing, 1), (case.static, 1)))
        tree = Side(tree.frame.join(table, F.col(f"{probing}_k1") == F.col("s_k1")), tree.inputs, tree.time, tree.keys)
        case.shape.append("static")
    if last is not None:
        # Spark's outer and semi joins need an event time on both sides: without one on the left, an inner join.
        top = case.top if tree.time is not None else "inner"
        case.shape.append(top)
        tree = join(tree, last, top, (case.streams[0], last.inputs[0]))
    return tree.frame


@pytest.fixture(scope="module")
def state_report() -> Iterator[list[str]]:
    lines: list[str] = []
    yield lines
    STATE_REPORT.parent.mkdir(exist_ok=True)
    STATE_REPORT.write_text("case\tstreams\tshape\toutcome\tstate rows UMJoin\tstate rows Spark\n" + "".join(lines))


def run_case(spark: SparkSession, tmp_path: Path, case: Case, settings: dict[str, str]) -> tuple[StreamingQuery, dict, StreamingQuery, dict, str]:  # type: ignore[type-arg]
    """The case's query with UMJoin on, and at the same time in a session of its own with UMJoin off."""
    for name, batches in case.batches.items():
        write_batches(tmp_path / name, columns(name), batches)
    without = spark.newSession()
    for key, value in {**settings, "spark.umjoin.enabled": "false"}.items():
        without.conf.set(key, value)
    with temporary_conf(spark, settings):
        umjoin, on = start_by_batch(query(spark, case, tmp_path), tmp_path / "ck-on")
        spark_joins, off = start_by_batch(query(without, case, tmp_path), tmp_path / "ck-off")
        for running in (umjoin, spark_joins):
            running.awaitTermination()
    return umjoin, by_batch(on), spark_joins, by_batch(off), executed_plan(umjoin)


def spark_refusal(spark: SparkSession, tmp_path: Path, case: Case, settings: dict[str, str]) -> str | None:
    """The error class Spark's own joins (UMJoin off) fail the case's query with, if they do."""
    for name, batches in case.batches.items():
        write_batches(tmp_path / name, columns(name), batches[:1])
    with temporary_conf(spark, {**settings, "spark.umjoin.enabled": "false"}):
        try:
            run_by_batch(query(spark, case, tmp_path), tmp_path / "ck-refusal")
        except StreamingQueryException as failure:
            found = re.search(r"terminated with exception: \[([A-Z_]+)\]", str(failure))
            return found.group(1) if found else str(failure)[:500]
    return None


def test_random_event_time_joins_give_sparks_rows_micro_batch_by_micro_batch(
        spark: SparkSession, tmp_path: Path, event_time_seed: int, state_report: list[str]) -> None:
    case = random_case(event_time_seed)
    settings = {"spark.sql.shuffle.partitions": "2", **(ROCKSDB if event_time_seed % 2 else {}), **stream_data.policy_settings(case.counted())}
    try:
        umjoin, on, spark_joins, off, plan = run_case(spark, tmp_path, case, settings)
    except StreamingQueryException as failure:
        # Spark refuses some queries the generator writes (its optimizer pushes a semi join below the
        # projection that dropped a second event-time column): then so must the query with UMJoin on.
        refusal = spark_refusal(spark, tmp_path / "refusal", case, settings)
        assert refusal is not None and f"terminated with exception: [{refusal}]" in str(failure), (refusal, str(failure)[:2000])
        state_report.append(f"{event_time_seed}\t{len(case.streams)}\t{' '.join(case.shape)}\trefused by Spark: {refusal}\t-\t-\n")
        return
    described = (case.streams, case.static, case.delays, case.top, case.shape)
    assert on == off, (described, len(on), len(off), Counter(b for bs in on.values() for b in bs), Counter(b for bs in off.values() for b in bs))
    stream_data.assert_watermarks(spark_joins, case.marks())  # (the rows put at watermarks are at Spark's)
    reasons = plans.unconverted_streaming_joins(spark, umjoin)
    # (A semi or outer join Spark's optimizer pushed below the inner joins runs in the StreamingUMJoin all the same.)
    if "rand" in case.shape:
        outcome = "refused: non-deterministic projection"
        assert any("the projection [" in r and "not deterministic" in r for r in reasons), (reasons, plan)
        assert "StreamingSymmetricHashJoin" in plan, plan
    else:
        outcome = "one StreamingUMJoin"
        assert plan.count("StreamingUMJoin inputs=") == 1, (described, reasons, plan)
        assert "StreamingSymmetricHashJoin" not in plan and not reasons, (described, reasons, plan)
    state_report.append(f"{event_time_seed}\t{len(case.streams)}\t{' '.join(case.shape)}\t{outcome}\t{ad_attribution.state_rows(umjoin)}\t{ad_attribution.state_rows(spark_joins)}\n")


def test_the_generator_covers_what_the_suite_promises(spark: SparkSession, tmp_path: Path, pytestconfig: pytest.Config) -> None:
    """Over the cases this run compares (``--event-time-seeds``)."""
    shapes: Counter[str] = Counter()
    cases = [random_case(seed) for seed in event_time_seeds(pytestconfig)]
    for case in cases:
        for name, batches in case.batches.items():
            write_batches(tmp_path / str(case.seed) / name, columns(name), batches[:1])
        query(spark, case, tmp_path / str(case.seed))
        shapes.update({word.split("[")[0] for word in case.shape})
    assert {len(c.streams) for c in cases} == {3, 4, 5, 6}
    assert sum(1 for c in cases if c.static) >= 4 and sum(1 for c in cases if c.bushy) >= 5
    assert {c.top for c in cases} == {"inner", "left_outer", "left_semi"}
    assert len({d for c in cases for d in c.delays.values()}) >= 3
    for shape in ("range", "unbounded", "drop", "withMetadata", "rename", "strip-all", "computed", "rename-key", "rand", "static"):
        assert shapes[shape] >= 1, (shape, shapes)
    lacking = stream_data.missing(coverage(cases), {
        **{(how, side): stream_data.FEATURES for how, sides in JOIN_SIDES.items() if how != "static" for side in sides},
        ("static", "stream"): stream_data.FEATURES, ("static", "table"): stream_data.TABLE_FEATURES})
    assert not lacking, lacking


#: Each join type's two sides, in the order `Case.joins` records them.
JOIN_SIDES = {"inner": ("left", "right"), "left_outer": ("preserved", "padded"), "left_semi": ("preserved", "subquery"),
              "static": ("stream", "table")}


def coverage(cases: list[Case]) -> dict[tuple[str, str], set[str]]:
    """Per join type and side, what the cases' inputs there hold (stream_data.features over the key column the join
    compares; late rows and rows at a watermark counted only among rows with both keys, which every join sees)."""
    covered: dict[tuple[str, str], set[str]] = {}
    for case in cases:
        marks = case.marks()
        for how, *compared in case.joins:
            for side, (name, column) in zip(JOIN_SIDES[how], compared):
                batches = case.batches[name]
                found = stream_data.features(batches, [column])
                if name != case.static:
                    keyed = [[row for row in batch if row[0] is not None and row[1] is not None] for batch in batches]
                    found |= stream_data.features(keyed, [column], 2, marks) & {stream_data.LATE, stream_data.AT_WATERMARK}
                covered.setdefault((how, side), set()).update(found)
    return covered


@pytest.mark.parametrize("profile", ["unbounded", "bounded"])
def test_the_ad_attribution_example_gives_sparks_rows_in_every_micro_batch_with_less_state(
        spark: SparkSession, tmp_path: Path, profile: str) -> None:
    """examples/ad_attribution.py: four event-time streams and a static table, the profile joined on the
    user id alone (unbounded) or within two hours (bounded). Spark drops the impressions a late profile
    update pairs with at the click join; UMJoin drops the same combinations."""
    ad_attribution.generate(tmp_path / "data", micro_batches=8)
    with temporary_conf(spark, {"spark.sql.shuffle.partitions": "2"}):
        result = ad_attribution.compare(spark, tmp_path, profile)
    assert result.plan_on.count("StreamingUMJoin inputs=") == 1 and "ads (static, broadcast)" in result.plan_on, result.plan_on
    assert not re.search(r"StreamingSymmetricHashJoin|BroadcastHashJoin|SortMergeJoin", result.plan_on), result.plan_on
    assert result.rows_on == result.rows_off
    assert sum(map(len, result.rows_on.values())) > 50 and len(result.rows_on) >= 5
    assert result.state_on < result.state_off
