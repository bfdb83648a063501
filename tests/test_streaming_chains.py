"""Chains of outer and semi stream-stream joins as one StreamingUMJoin: a stream x (joined inner with
y, or alone) enriched by side streams z1..zn, each LEFT OUTER joined (or RIGHT OUTER, sides swapped,
INNER, LEFT SEMI or LEFT ANTI, above or below the others) on a key of x and a time range around x's
event time, as Flink's MultiJoin runs enrichments. Every micro-batch must put out exactly what Spark's
chain of joins puts out in it: the matches, the NULL-padded rows (when each join's watermark rules
out a match), the semi join's rows at their first match, and nothing Spark drops as late; across
a restart from the checkpoint too. (Spark refuses a left anti join of two streams: its reference is
the left outer join's padded rows, as Spark runs that join.)
"""

from __future__ import annotations

import datetime
import random
import re
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import stream_data
from stream_data import Batches
from test_static_stores import umjoin_metric
from test_streaming import ROCKSDB, SPARK_JOINS, by_batch, executed_plan, nulls_first, run_by_batch, sorted_rows, start_by_batch, stream, write_batches
from test_streaming_outer import hold_back_second_half
from umjoin.local import temporary_conf

BASE = datetime.datetime(2026, 1, 1)
DELAY = "10 minutes"
DELAY_MS = 10 * 60 * 1000


def columns(name: str) -> str:
    return f"{name}_k BIGINT, {name}_j BIGINT, {name}_ts TIMESTAMP, {name}_v BIGINT"


def draw_streams(names: list[str], rng: random.Random, minutes: int = 60, most_cuts: int = 6, null_keys: float | None = 0.0,
                 extremes: dict[str, str] | None = None) -> dict[str, Batches]:
    """Rows of each stream over `minutes` of event time, out of order within the watermark's delay, one a day
    late, cut at random into micro-batches (at 2 to `most_cuts` places); then one far-future row per stream,
    whose watermark lets every waiting combination go. Each key is NULL in a `null_keys` share of a stream's
    rows; None: a share drawn per stream (none, some or many), an empty micro-batch now and then, and rows
    exactly at watermarks. `extremes`: streams whose every key is NULL (stream_data.ALL_NULL) or that bring no
    row at all (stream_data.NO_ROWS: its watermark never moves; the cases run with the maximum's policy then)."""
    extremes = extremes or {}
    streams: dict[str, Batches] = {}
    for n, name in enumerate(names):
        share = 1.0 if extremes.get(name) == stream_data.ALL_NULL else rng.choice([0.0, 0.1, 0.3]) if null_keys is None else null_keys
        key_k, key_j = stream_data.key_drawer(rng, 5, share), stream_data.key_drawer(rng, 3, share)
        if extremes.get(name) == stream_data.NO_ROWS:
            streams[name] = [[] for _ in range(rng.randint(1, 3))]
            continue
        rows = []
        for _ in range(rng.randint(15, 40)):
            at = BASE + datetime.timedelta(minutes=rng.uniform(0, minutes))
            rows.append((at + datetime.timedelta(minutes=rng.uniform(0, 6)), (key_k(), key_j(), at, rng.randrange(100))))
        rows.sort(key=lambda r: r[0])
        data = [r[1] for r in rows]
        for i in rng.sample(range(len(data) // 2, len(data)), 1):
            data[i] = (data[i][0], data[i][1], BASE - datetime.timedelta(days=1), data[i][3])
        batches = stream_data.cut(rng, data, rng.randint(2, most_cuts), empty=0.25 if null_keys is None else 0.0)
        far = None if share == 1 else 1000 + n  # (it joins nothing either way)
        streams[name] = [*batches, [(far, far, BASE + datetime.timedelta(days=2), 0)]]
    if null_keys is None:
        stream_data.put_at_watermarks(rng, streams, 2, {name: DELAY_MS for name in names}, policy=stream_data.policy_for(streams))
    return streams


def write_streams(directory: Path, streams: dict[str, Batches]) -> None:
    for name, batches in streams.items():
        write_batches(directory / name, columns(name), batches)


def random_streams(directory: Path, names: list[str], rng: random.Random, minutes: int = 60, most_cuts: int = 6,
                   null_keys: float = 0.0) -> None:
    """The streams `draw_streams` draws, written under `directory`."""
    write_streams(directory, draw_streams(names, rng, minutes, most_cuts, null_keys))


def watermarked_stream(spark: SparkSession, directory: Path, name: str) -> DataFrame:
    """Stream `name` (its files under `directory`), its event time `<name>_ts` watermarked by DELAY."""
    return stream(spark, directory / name, columns(name)).withWatermark(f"{name}_ts", DELAY)


def near(a: str, b: str):  # type: ignore[no-untyped-def]
    """Column a's time within 5 minutes of column b's."""
    return F.col(a).between(F.col(b) - F.expr("interval 5 minutes"), F.col(b) + F.expr("interval 5 minutes"))


def chain_query(spark: SparkSession, directory: Path, sides: list[tuple[str, str]], with_y: bool, trees: frozenset[int] = frozenset(),
                y_after: int = 0) -> DataFrame:
    """x (inner joined with y on x_k when `with_y`), then per side (how, key): zi joined `how` ("left"
    or "right" outer, zi on the preserved side's right, "inner", "semi", or "anti": a left anti join, which
    Spark refuses between streams; with UMJoin off, the left outer join's NULL-padded rows, as Spark would run it) on x's `key` ("k", "j", or "kj": both)
    and zi_ts within 5 minutes of x_ts (a semi join also on zi_v and y's value, where y is joined). Each zi_ts loses its watermark after its join: Spark's joins above
    take one event-time column per side. Side i in `trees` is a join tree: zi joined inner with a stream ui
    on zi_j and ui_ts within 5 minutes of zi_ts, before its join with x. With `y_after` n > 0, y is joined
    after the first n sides, and x_ts loses its watermark there: the sides after it are timed by y_ts
    (their outer joins padded when the watermark passes y's time, those before by x's)."""
    def watermarked(name: str) -> DataFrame:  # (the query's streams are all under `directory`)
        return watermarked_stream(spark, directory, name)

    def join_y(df: DataFrame) -> DataFrame:
        df = df.join(watermarked("y"), (F.col("x_k") == F.col("y_k")) & near("y_ts", "x_ts"))
        return df.withMetadata("x_ts", {}) if y_after else df.drop("y_ts")

    df = join_y(watermarked("x")) if with_y and not y_after else watermarked("x")
    time = "x_ts"
    for i, (how, key) in enumerate(sides, start=1):
        if with_y and y_after and i == y_after + 1:
            df, time = join_y(df), "y_ts"
        z = watermarked(f"z{i}")
        if i in trees:
            z = z.join(watermarked(f"u{i}"), (F.col(f"z{i}_j") == F.col(f"u{i}_j")) & near(f"u{i}_ts", f"z{i}_ts")).drop(f"u{i}_ts")
        on = near(f"z{i}_ts", time)
        for column in ("k", "j") if key == "kj" else (key,):
            on = (F.col(f"x_{column}") == F.col(f"z{i}_{column}")) & on
        if how == "anti":
            umjoin_on = spark.conf.get("spark.umjoin.enabled", "true") == "true"
            df = df.join(z, on, "left_anti") if umjoin_on else df.join(z, on, "left_outer").where(F.col(f"z{i}_k").isNull()).select(*df.columns)
            continue
        if how == "semi":
            # Reading y keeps Spark's optimizer from pushing the semi join down to x. (Not a side joined before: Spark
            # moves the semi join below the projection that takes that side's watermark off, and then fails the query
            # for its two event-time columns, MULTIPLE_EVENT_TIME_COLUMNS.)
            y_joined = with_y and (not y_after or i > y_after)
            df = df.join(z, on & (F.col(f"z{i}_v") + F.col("y_v") > 60) if y_joined else on, "left_semi")
            continue
        df = {"left": lambda: df.join(z, on, "left_outer"), "right": lambda: z.join(df, on, "right_outer"), "inner": lambda: df.join(z, on)}[how]()
        df = df.withMetadata(f"z{i}_ts", {})
    return df


def run_both(spark: SparkSession, tmp_path: Path, query, settings: dict[str, str], restart: list[str] | None = None):  # type: ignore[no-untyped-def]
    """The query with UMJoin on and off (`SPARK_JOINS`: Spark's joins in the state they write fewest files for),
    each row's micro-batches. With `restart` (stream names), each runs on the first half of those streams' files,
    stops, and restarts from its checkpoint on all of them."""
    def run(checkpoint: Path):  # type: ignore[no-untyped-def]
        if not restart:
            return run_by_batch(query(), checkpoint)
        put_back = hold_back_second_half(tmp_path, restart)
        _, first = run_by_batch(query(), checkpoint)
        put_back()
        return run_by_batch(query(), checkpoint, first)

    with temporary_conf(spark, {"spark.sql.shuffle.partitions": "2", **settings}):
        umjoin, on = run(tmp_path / "ck-on")
        with temporary_conf(spark, SPARK_JOINS):
            _, off = run(tmp_path / "ck-off")
    return umjoin, on, off


def extreme(seed: int) -> bool:
    """Whether a random chain's streams are users' data at its edges: each stream but y and the join trees' has
    every key NULL or no row at all (see `chain_streams`)."""
    return random.Random(700 + seed).random() < 0.3


def random_chain(seed: int) -> tuple[list[tuple[str, str]], bool, frozenset[int], int]:
    """3-4 sides (all five in an `extreme` case), each of another join type (LEFT, RIGHT, INNER, LEFT SEMI, LEFT
    ANTI) on k or j (an anti join on k: on j, with 3 values, it leaves few rows to the joins above); whether y is
    joined; the sides that are join trees (about one in three); and, where y is joined, after how many sides (0:
    first; the sides after it timed by y's event time, so outer joins are padded by two streams' times)."""
    rng = random.Random(seed)
    kinds = rng.sample(["left", "right", "inner", "semi", "anti"], 5 if extreme(seed) else rng.randint(3, 4))
    sides = [(how, "k" if how == "anti" else rng.choice(["k", "k", "j"])) for how in kinds]
    with_y = rng.random() < 0.5
    trees = frozenset(i for i in range(1, len(sides) + 1) if rng.random() < 0.35)
    y_after = rng.randint(1, len(sides) - 1) if with_y and rng.random() < 0.6 else 0
    return sides, with_y, trees, y_after


# Five cases, two of them `extreme`, that together hold every feature of users' data on both sides of every
# join type, and the shapes `test_the_random_chains_mix_every_join_type` asks for (found by a search over seeds).
CHAIN_SEEDS = (87, 113, 140, 166, 254)


def chain_names(sides: list[tuple[str, str]], with_y: bool, trees: frozenset[int]) -> list[str]:
    return ["x", *(["y"] if with_y else []), *(f"z{i}" for i in range(1, len(sides) + 1)), *(f"u{i}" for i in sorted(trees))]


def chain_streams(seed: int, names: list[str]) -> dict[str, Batches]:
    """A random chain's streams as users' data has them (see `draw_streams`): NULL keys in a share drawn per
    stream, empty micro-batches, rows at watermarks; in an `extreme` case, x's keys all NULL or no x row, and
    each side stream zi the one or the other in turn."""
    rng = random.Random(seed)
    extremes: dict[str, str] = {}
    if extreme(seed):
        edges = [stream_data.ALL_NULL, stream_data.NO_ROWS]
        first = rng.randrange(2)
        extremes = {name: edges[(first + i) % 2] for i, name in enumerate(n for n in names if n == "x" or n.startswith("z"))}
    return draw_streams(names, rng, most_cuts=4, null_keys=None, extremes=extremes)


def chain_coverage(seeds: tuple[int, ...]) -> dict[tuple[str, str], set[str]]:
    """Per join type and side ("preserved": x, whose key the join reads; "other": zi), what the seeds' streams
    there hold (stream_data.features, over the key columns the join compares)."""
    covered: dict[tuple[str, str], set[str]] = {}
    for seed in seeds:
        sides, with_y, trees, _ = random_chain(seed)
        streams = chain_streams(seed, chain_names(sides, with_y, trees))
        marks = stream_data.watermarks(streams, 2, {name: DELAY_MS for name in streams}, stream_data.policy_for(streams))
        for i, (how, key) in enumerate(sides, start=1):
            compared = {"k": [0], "j": [1], "kj": [0, 1]}[key]
            for side, name in (("preserved", "x"), ("other", f"z{i}")):
                covered.setdefault((how, side), set()).update(stream_data.features(streams[name], compared, 2, marks))
    return covered


def test_the_random_chains_mix_every_join_type() -> None:
    drawn = [random_chain(seed) for seed in CHAIN_SEEDS]
    chains = [sides for sides, _, _, _ in drawn]
    kinds = [{how for how, _ in sides} for sides in chains]
    tree_sides = {sides[i - 1][0] for sides, _, trees, _ in drawn for i in trees}
    assert {"left", "right", "semi"} <= tree_sides  # a join tree on the non-preserved side of each
    assert any("semi" in k and {"left", "right"} & k for k in kinds)  # a semi join beside outer ones
    assert any("semi" not in k and {"left", "right"} & k for k in kinds)
    assert {"left", "right", "inner", "semi", "anti"} <= set().union(*kinds)
    assert any(sides[i - 1][0] == "anti" for sides, _, trees, _ in drawn for i in trees)  # a join tree on an anti join's right
    assert any(len(sides) >= 4 for sides in chains)
    restarted = [k for seed, k in zip(CHAIN_SEEDS, kinds) if seed % 3 == 2]
    assert any("semi" in k and {"left", "right"} & k for k in restarted) and any("semi" not in k for k in restarted)
    # outer joins padded by x's time and by y's in one chain
    assert any(y_after and {"left", "right"} & {how for how, _ in sides[:y_after]} and {"left", "right"} & {how for how, _ in sides[y_after:]}
               for sides, _, _, y_after in drawn)
    assert sum(not extreme(seed) for seed in CHAIN_SEEDS) >= 2 and any(extreme(seed) for seed in CHAIN_SEEDS)


def test_the_random_chains_hold_users_data_on_both_sides_of_every_join_type() -> None:
    wanted = {(how, side): stream_data.FEATURES for how in ("left", "right", "inner", "semi", "anti") for side in ("preserved", "other")}
    lacking = stream_data.missing(chain_coverage(CHAIN_SEEDS), wanted)
    assert not lacking, lacking


@pytest.mark.parametrize("seed", CHAIN_SEEDS)
def test_a_random_chain_of_outer_and_semi_joins_runs_as_one_streaming_umjoin_micro_batch_by_micro_batch_like_spark(
        spark: SparkSession, tmp_path: Path, seed: int) -> None:
    sides, with_y, trees, y_after = random_chain(seed)
    names = chain_names(sides, with_y, trees)
    streams = chain_streams(seed, names)
    write_streams(tmp_path, streams)
    # (Two inputs are enough for a group: a join tree on an outer or semi join's non-preserved side runs as a StreamingUMJoin of its own.)
    settings = {**(ROCKSDB if seed % 4 in (1, 2) else {}), "spark.umjoin.minInputs": "2", **stream_data.policy_settings(streams)}
    restart = names if seed % 3 == 2 else None  # stopped halfway, with combinations waiting to be padded or matched
    umjoin, on, off = run_both(spark, tmp_path, lambda: chain_query(spark, tmp_path, sides, with_y, trees, y_after), settings, restart)
    if not restart:  # (a restart runs a micro-batch without new rows where the stop came: the watermarks shift by one batch)
        stream_data.assert_watermarks(umjoin, stream_data.watermarks(streams, 2, {name: DELAY_MS for name in names}, stream_data.policy_for(streams)))

    plan = executed_plan(umjoin)
    # Each join tree on a non-preserved side is cut off, its output one input of the group above; an inner side's is in the group.
    cut_off = sum(sides[i - 1][0] != "inner" for i in trees)
    assert plan.count("StreamingUMJoin inputs=") == 1 + cut_off and "StreamingSymmetricHashJoin" not in plan, (sides, trees, plan)
    # (A left anti join runs as the left outer join keeping its padded rows.)
    assert plan.count("padded with NULLs once the watermark rules out a match") == sum(how in ("left", "right", "anti") for how, _ in sides), plan
    assert plan.count("left semi: unmatched combinations wait for it") == sum(how == "semi" for how, _ in sides), plan
    outer_before_y, outer_after_y = ({how for how, _ in part} & {"left", "right"} for part in (sides[:y_after], sides[y_after:]))
    if y_after and outer_before_y and outer_after_y:  # padded by x's time and by y's, each stream's rows rescanned
        assert len(set(re.findall(r"rules out a match \(by #(\d+)'s event time\)", plan))) == 2, plan
    assert on == off, (sides, with_y)  # the same rows, each put out in the same micro-batch as many times
    if extreme(seed):  # (x's keys all NULL, or no x row: nothing matches, or nothing comes out)
        return
    names_out = chain_query(spark, tmp_path, sides, with_y, trees, y_after).columns
    padded_trees = [i for i in trees if sides[i - 1][0] in ("left", "right")]
    # Some join tree on a padded side matched through both its streams (each one's side streams have NULL keys in a share of their own).
    assert not padded_trees or any(row[names_out.index(f"u{i}_v")] is not None for i in padded_trees for row in on), (padded_trees, sides)
    # A row padded by some join: NULL in a stream's value column (never NULL in the data, unlike its keys).
    values = [names_out.index(c) for c in names_out if c.endswith("_v")]
    padded_somewhere = [row for row in on if any(row[c] is None for c in values)]
    # Some rows every join matched (but a RIGHT join's stream may meet no combination of the joins below it).
    assert len(padded_somewhere) < len(on) or any(how == "right" for how, _ in sides), (sides, with_y)
    assert padded_somewhere or any(how in ("inner", "semi", "anti") for how, _ in sides)  # (inner joins above may drop every padded row)


def compiled_classes(spark: SparkSession) -> int:
    """How many classes Spark's code generation has compiled in this JVM so far."""
    return spark.sparkContext._jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME().getCount()  # type: ignore[union-attr]


def test_a_ten_way_chain_of_left_joins_runs_as_one_streaming_umjoin(spark: SparkSession, tmp_path: Path) -> None:
    """The enrichment Flink's MultiJoin is built for: one stream and nine side streams on its key. Its 10 routes of
    9 steps need more generated classes than Spark's code cache keeps (100): its tasks take them from the ones
    before (compiled anew in every task, they were about 5,500 over 9 micro-batches, 600 reused). Each stream is cut
    in 3 parts at most: a micro-batch of ten file sources costs about 4 s, whatever its rows."""
    rng = random.Random(10)
    sides = [("left", "k")] * 9
    random_streams(tmp_path, ["x", *(f"z{i}" for i in range(1, 10))], rng, minutes=40, most_cuts=2)
    with temporary_conf(spark, {"spark.sql.shuffle.partitions": "2", **ROCKSDB}):
        before = compiled_classes(spark)
        umjoin, on = run_by_batch(chain_query(spark, tmp_path, sides, False), tmp_path / "ck-on")
        compiled = compiled_classes(spark) - before
        with temporary_conf(spark, SPARK_JOINS):
            _, off = run_by_batch(chain_query(spark, tmp_path, sides, False), tmp_path / "ck-off")

    plan = executed_plan(umjoin)
    assert plan.count("StreamingUMJoin inputs=") == 1 and "StreamingSymmetricHashJoin" not in plan, plan
    assert on == off
    assert any(row[4] is not None and row[-4] is None for row in on)  # matched by z1, padded for z9
    batches = len(umjoin.recentProgress)
    assert compiled < 100 * batches, (compiled, batches)


def test_outer_joins_on_one_column_of_a_stream_partitioned_by_another_share_one_index(spark: SparkSession, tmp_path: Path) -> None:
    """x JOIN y ON x_k, then LEFT JOINs of z1 and of z2 both on x_j. Many x and y rows, few z rows: x is stored
    partitioned by k, and each side's new rows look x up in all partitions by x_j. Each ON key is a class of its
    own, and x kept an index per join on the one column (twice the entries); one index serves both now."""
    rng = random.Random(3)
    for n, (name, size) in enumerate({"x": 60, "y": 60, "z1": 3, "z2": 3}.items()):
        batches = [[(rng.randrange(30), rng.randrange(3), BASE + datetime.timedelta(minutes=10 * b + rng.uniform(0, 10)), rng.randrange(100))
                    for _ in range(size)] for b in range(2)]
        write_batches(tmp_path / name, columns(name), [*batches, [(1000 + n, 1000 + n, BASE + datetime.timedelta(days=2), 0)]])
    sides = [("left", "j"), ("left", "j")]
    umjoin, on, off = run_both(spark, tmp_path, lambda: chain_query(spark, tmp_path, sides, True), ROCKSDB)

    (line,) = [l for l in executed_plan(umjoin).splitlines() if "StreamingUMJoin inputs=" in l]
    assert re.search(r"#0 \w+ \(partitioned by x_k#\d+L, indexed by x_j#\d+L\)", line), line
    assert "#2: #2 =>* #0" in line and "#3: #3 =>* #0" in line, line  # both sides probe x's index in all partitions
    stored = [(op["customMetrics"]["stateRowsInput0"], op["customMetrics"]["stateIndexEntriesInput0"])
              for p in umjoin.recentProgress for op in p["stateOperators"] if op["operatorName"] == "umJoin"]
    assert all(rows == entries for rows, entries in stored) and max(stored)[0] > 60, stored
    assert on == off
    names_out = chain_query(spark, tmp_path, sides, True).columns
    for side in ("z1_v", "z2_v"):  # each side matched x rows through the shared index, and padded others
        values = [row[names_out.index(side)] for row in on]
        assert None in values and any(v is not None for v in values), side


def test_micro_batches_that_drop_late_rows_evict_and_pad_as_the_ones_before_compile_no_code(spark: SparkSession, tmp_path: Path) -> None:
    """x LEFT JOIN z1 LEFT JOIN z2 over 8 micro-batches of 10 minutes of event time each, each with a row a day late per
    stream: later batches drop those rows, evict stored rows and pad combinations, as the ones before them did, with
    the watermark the batch brings. What holds the watermark is interpreted, or read from the generated code's
    references: written into the code, it made new code to compile in every batch (11 classes here)."""
    rng = random.Random(7)
    names = ["x", "z1", "z2"]
    for name in names:
        batches = []
        for b in range(8):
            start = BASE + datetime.timedelta(minutes=10 * b)
            rows = [(rng.randrange(4), rng.randrange(3), start + datetime.timedelta(minutes=rng.uniform(0, 10)), rng.randrange(100))
                    for _ in range(6)]
            batches.append([*rows, (rng.randrange(4), 0, BASE - datetime.timedelta(days=1), 0)])
        write_batches(tmp_path / name, columns(name), batches)

    def query() -> DataFrame:
        return chain_query(spark, tmp_path, [("left", "k"), ("left", "k")], False)

    compiled_after: list[int] = []
    with temporary_conf(spark, {"spark.sql.shuffle.partitions": "2", **ROCKSDB}):
        umjoin, emitted = start_by_batch(query(), tmp_path / "ck-on", after_batch=lambda _: compiled_after.append(compiled_classes(spark)))
        umjoin.awaitTermination()
        with temporary_conf(spark, SPARK_JOINS):
            _, off = run_by_batch(query(), tmp_path / "ck-off")
    on = by_batch(emitted)

    plan = executed_plan(umjoin)
    assert plan.count("StreamingUMJoin inputs=") == 1 and "StreamingSymmetricHashJoin" not in plan, plan
    assert on == off
    progress = umjoin.recentProgress
    assert [p["numInputRows"] for p in progress] == [21] * 8 + [0]  # and a last batch for the watermark
    later = range(1, 8)  # the data's batches after the first
    assert [progress[b]["stateOperators"][0]["numRowsDroppedByWatermark"] for b in later] == [0] + [3] * 6
    assert all(progress[b]["stateOperators"][0]["numRowsRemoved"] > 0 for b in range(3, 8)), [p["stateOperators"] for p in progress]
    padded = {b for row, batches in on.items() if row[-4] is None for b in batches}
    assert {5, 6, 7} <= padded, padded
    # The first batch compiles the routes; the later ones run the same code again (the last batch, the watermark's, also rescans).
    assert [compiled_after[b] - compiled_after[b - 1] for b in later] == [0] * 7, compiled_after


def test_an_outer_join_whose_on_clause_reads_another_outer_joins_stream_is_a_group_of_its_own(spark: SparkSession, tmp_path: Path) -> None:
    """x LEFT JOIN z1 LEFT JOIN z2 ON z2_v > z1_v: z2's padding depends on z1's match, so the chain is
    cut there: x LEFT JOIN z1 is one StreamingUMJoin, and its output LEFT JOIN z2 another, with Spark's answer."""
    rng = random.Random(20)
    random_streams(tmp_path, ["x", "z1", "z2"], rng)

    def query() -> DataFrame:
        df = chain_query(spark, tmp_path, [("left", "k")], False)
        z2 = watermarked_stream(spark, tmp_path, "z2")
        return df.join(z2, (F.col("x_k") == F.col("z2_k")) & near("z2_ts", "x_ts") & (F.col("z2_v") > F.col("z1_v")), "left_outer")

    with temporary_conf(spark, {"spark.umjoin.minInputs": "2"}):
        umjoin, on, off = run_both(spark, tmp_path, query, {})
    plan = executed_plan(umjoin)
    assert plan.count("StreamingUMJoin inputs=") == 2 and "StreamingSymmetricHashJoin" not in plan, plan
    assert "ON #1: (z2_v" in plan, plan
    assert on == off and any(row[-1] is None and row[4] is not None for row in on)


def test_outer_and_semi_joins_on_two_keys_run_in_the_streaming_umjoin_like_sparks_joins(spark: SparkSession, tmp_path: Path) -> None:
    """Each side joined on x's two keys (x_k = zi_k AND x_j = zi_j): a StreamingUMJoin keys each non-preserved
    side by the first, and checks the second with the rest of the ON clause; Spark's rows in every micro-batch."""
    sides = [("left", "kj"), ("semi", "kj"), ("right", "kj")]
    random_streams(tmp_path, ["x", "z1", "z2", "z3"], random.Random(40), minutes=20, most_cuts=3)
    umjoin, on, off = run_both(spark, tmp_path, lambda: chain_query(spark, tmp_path, sides, False), {})

    plan = executed_plan(umjoin)
    assert plan.count("StreamingUMJoin inputs=") == 1 and "StreamingSymmetricHashJoin" not in plan, plan
    assert plan.count("padded with NULLs once the watermark rules out a match") == 2, plan
    for i in (1, 3):  # each outer join's second key, checked with its ON clause
        assert re.search(rf"ON #\d+: \((x_[kj]#\d+L = z{i}_[kj]|z{i}_[kj]#\d+L = x_[kj])#", plan), plan
    assert on == off
    for padded in ([row for row in on if row[0] is None], [row for row in on if row[-4] is None]):  # no z3 (first), no z1 (last) row on both keys
        assert padded and len(padded) < len(on), on


@pytest.mark.parametrize(("sides", "provider", "restart"), [
    ([("left", "k")] * 4, "rocksdb", False),
    ([("right", "k"), ("left", "j")], "hdfs", True),
    ([("left", "kj"), ("inner", "k"), ("left", "k")], "rocksdb", True),
])
def test_preserved_rows_with_null_keys_come_out_padded_when_sparks_outer_joins_evict_them(
        spark: SparkSession, tmp_path: Path, sides: list[tuple[str, str]], provider: str, restart: bool) -> None:
    """A LEFT (or RIGHT) join keeps every row of its preserved side whatever its key: Spark's stream-stream join
    stores a row whose ON key is NULL (it matches nothing) and puts it out padded when the watermark evicts it.
    x and every side have NULL keys in a fifth of their rows: the StreamingUMJoin puts out the same rows in the
    same micro-batches, at any place of the chain, on either key class and on two keys, after a restart too."""
    names = ["x", *(f"z{i}" for i in range(1, len(sides) + 1))]
    random_streams(tmp_path, names, random.Random(90 + len(sides)), minutes=30, most_cuts=4, null_keys=0.2)
    umjoin, on, off = run_both(spark, tmp_path, lambda: chain_query(spark, tmp_path, sides, False),
                               ROCKSDB if provider == "rocksdb" else {}, names if restart else None)

    plan = executed_plan(umjoin)
    assert plan.count("StreamingUMJoin inputs=") == 1 and "StreamingSymmetricHashJoin" not in plan, plan
    assert on == off
    columns_out = chain_query(spark, tmp_path, sides, False).columns
    x_k, x_j = columns_out.index("x_k"), columns_out.index("x_j")
    keys = {"k": [x_k], "j": [x_j], "kj": [x_k, x_j]}
    # Rows of x whose key into a padded side is NULL, put out padded (before the fix they never came out).
    first_outer = next(i for i, (how, _) in enumerate(sides) if how in ("left", "right"))
    assert any(any(row[c] is None for c in keys[sides[first_outer][1]]) for row in on), on


def side_by_side_semis_query(spark: SparkSession, directory: Path) -> DataFrame:
    """(x SEMI z1 on k) JOIN (y SEMI z2 on k) on k: neither semi join is above the other."""
    def semi(name: str, z: str) -> DataFrame:
        on = (F.col(f"{name}_k") == F.col(f"{z}_k")) & near(f"{z}_ts", f"{name}_ts")
        return watermarked_stream(spark, directory, name).join(watermarked_stream(spark, directory, z), on, "left_semi")
    return semi("x", "z1").join(semi("y", "z2"), (F.col("x_k") == F.col("y_k")) & near("y_ts", "x_ts"))


@pytest.mark.parametrize(("sides", "restart"), [
    ([("semi", "k"), ("semi", "k")], False),
    ([("semi", "k"), ("left", "k"), ("semi", "k")], True),
    ([("semi", "k"), ("semi", "j")], False),
    ("side by side", False),
])
def test_semi_joins_one_above_the_other_or_side_by_side_on_any_keys_run_in_one_streaming_umjoin_like_sparks_joins(
        spark: SparkSession, tmp_path: Path, sides: list[tuple[str, str]] | str, restart: bool) -> None:
    """x JOIN y, then semi joins on x's keys one above the other (with an outer join above them: Spark moves the upper below it),
    or (x SEMI z1) JOIN (y SEMI z2): a combination a semi join lets through, at its first match, goes on to the next one,
    in the same micro-batch, to its partition where its key is another; each waits in its own store. Spark's rows micro-batch
    by micro-batch, across a restart too."""
    count = 2 if isinstance(sides, str) else len(sides)
    names = ["x", "y", *(f"z{i}" for i in range(1, count + 1))]
    random_streams(tmp_path, names, random.Random(70 + count), most_cuts=4)
    query = (lambda: side_by_side_semis_query(spark, tmp_path)) if isinstance(sides, str) else lambda: chain_query(spark, tmp_path, sides, True)
    umjoin, on, off = run_both(spark, tmp_path, query, ROCKSDB if restart else {}, names if restart else None)

    plan = executed_plan(umjoin)
    assert plan.count("StreamingUMJoin inputs=") == 1 and "StreamingSymmetricHashJoin" not in plan, plan
    semis = [int(i) for i in re.findall(r"#(\d+) [^#(]*\(left semi: unmatched combinations wait for it", plan)]
    assert len(semis) == (2 if isinstance(sides, str) else sum(how == "semi" for how, _ in sides)), plan
    for route in re.search(r"routes=\[([^]]*)\]", plan).group(1).split("; "):  # type: ignore[union-attr]
        probed = [int(i) for i in re.findall(r"#(\d+)", route.split(": ")[1])]
        assert probed[-len(semis):] == sorted(semis), route  # the semi joins last, lowest first, as Spark applies them
    assert on == off and on
    dropped = {name for p in umjoin.recentProgress for op in p["stateOperators"] for name in op["customMetrics"] if name.startswith("semiDropped")}
    per_batch = [(p["batchId"], p["numInputRows"], {name: op["customMetrics"].get(name) for op in p["stateOperators"]
                  for name in op["customMetrics"] if name.startswith(("semi", "unmatched"))}) for p in umjoin.recentProgress]
    # Each semi join dropped some (the metrics per micro-batch shown where one did not).
    assert len(dropped) == len(semis) and all(umjoin_metric(umjoin, name) > 0 for name in dropped), per_batch


def test_a_semi_joins_first_match_batches_after_its_row_comes_out_then_through_the_join_above_like_spark(
        spark: SparkSession, tmp_path: Path) -> None:
    """(x SEMI z1) JOIN z2: x and z2 of key 1 arrive in batch 0, z1's match only in batch 3, after the watermark
    passed x's time (20 minutes in, x at 17): Spark's semi join still holds x (no z1 row within 5 minutes of it
    is late yet) and puts it out then; the join above, whose watermark trails by those 5 minutes, joins it with
    z2. Key 2's match arrives with x in batch 0. The StreamingUMJoin's waiting combination comes out in batch 3."""
    at = lambda minutes: BASE + datetime.timedelta(minutes=minutes)  # noqa: E731
    far = [(9, 9, at(30), 0)]  # every stream's watermark then reaches 20 minutes
    batches = {
        "x": [[(1, 0, at(17), 1), (2, 0, at(17), 2)], far, [], []],
        "z1": [[(2, 0, at(18), 3)], far, [], [(1, 0, at(21), 4)]],
        "z2": [[(1, 0, at(17), 5), (2, 0, at(17), 6)], far, [], []],
    }
    for name, rows in batches.items():
        write_batches(tmp_path / name, columns(name), rows)
    umjoin, on, off = run_both(spark, tmp_path, lambda: chain_query(spark, tmp_path, [("semi", "k"), ("inner", "k")], False), {})

    plan = executed_plan(umjoin)
    assert plan.count("StreamingUMJoin inputs=") == 1 and "left semi: unmatched combinations wait for it" in plan, plan
    assert sorted((row[0], batches) for row, batches in on.items()) == [(1, [3]), (2, [0]), (9, [1])], on  # (the far rows match each other)
    assert on == off


def test_a_combination_reaching_a_semi_join_below_its_state_watermark_matches_no_row_of_that_micro_batch_like_spark(
        spark: SparkSession, tmp_path: Path) -> None:
    """x SEMI z1 SEMI z2: x's day-late row arrives in batch 0 (no watermark yet) and waits for z1; z1's and z2's
    day-late rows arrive in batch 1, when the watermark is at the first minute. The lower join lets x's row through
    (its state held it); the upper join's state watermark rules it out, so Spark's join does not store it and z2's
    row of the same batch does not find it: the row never comes out. Key 0's rows match in batch 0."""
    late = BASE - datetime.timedelta(days=1)
    at = lambda minutes: BASE + datetime.timedelta(minutes=minutes)  # noqa: E731
    batches = {
        "x": [[(2, 1, late, 7), (0, 1, at(10), 13)], [], [(9, 9, at(60 * 48), 0)]],
        "z1": [[(0, 0, at(12), 1)], [(2, 2, late, 2)], [(9, 9, at(60 * 48), 0)]],
        "z2": [[(0, 0, at(13), 1)], [(2, 1, late, 3)], [(9, 9, at(60 * 48), 0)]],
    }
    for name, rows in batches.items():
        write_batches(tmp_path / name, columns(name), rows)
    umjoin, on, off = run_both(spark, tmp_path, lambda: chain_query(spark, tmp_path, [("semi", "k"), ("semi", "k")], False), {})

    assert executed_plan(umjoin).count("StreamingUMJoin inputs=") == 1
    assert sorted((row[0], batches) for row, batches in on.items()) == [(0, [0]), (9, [2])], on  # (the far rows match each other)
    assert on == off


def padded_by_two_streams_query(spark: SparkSession, directory: Path) -> DataFrame:
    """(x LEFT z1) JOIN (y LEFT z2): two LEFT joins whose preserved sides are evicted by different streams'
    event times, x's for z1 (z1_ts within 5 minutes of x_ts), y's for z2; each side of the inner join keeps
    its own time. (A chain whose later joins are timed by y's time is among the random chains: seed 5.)"""
    def watermarked(name: str) -> DataFrame:  # (the query's streams are all under `directory`)
        return watermarked_stream(spark, directory, name)

    x = watermarked("x").join(watermarked("z1"), (F.col("x_k") == F.col("z1_k")) & near("z1_ts", "x_ts"), "left_outer").withMetadata("z1_ts", {})
    y = watermarked("y").join(watermarked("z2"), (F.col("y_j") == F.col("z2_j")) & near("z2_ts", "y_ts"), "left_outer").withMetadata("z2_ts", {})
    return x.join(y, (F.col("x_k") == F.col("y_k")) & near("y_ts", "x_ts"))


def test_outer_joins_padded_by_different_streams_event_times_run_in_one_streaming_umjoin_like_sparks_joins(
        spark: SparkSession, tmp_path: Path) -> None:
    """z1's padding is due when x's time is ruled out, z2's when y's is: the StreamingUMJoin rescans each of the two
    streams' stored rows for the combinations it pads, each put out once, in the micro-batch Spark's joins put it out."""
    random_streams(tmp_path, ["x", "y", "z1", "z2"], random.Random(52), minutes=30, most_cuts=4)
    umjoin, on, off = run_both(spark, tmp_path, lambda: padded_by_two_streams_query(spark, tmp_path), ROCKSDB)

    plan = executed_plan(umjoin)
    assert plan.count("StreamingUMJoin inputs=") == 1 and "StreamingSymmetricHashJoin" not in plan, plan
    assert plan.count("padded with NULLs once the watermark rules out a match") == 2, plan
    assert len(set(re.findall(r"rules out a match \(by #(\d+)'s event time\)", plan))) == 2, plan  # x's and y's
    assert on == off
    names = padded_by_two_streams_query(spark, tmp_path).columns
    z1, z2 = names.index("z1_v"), names.index("z2_v")
    for padded in (z1, z2):  # each join pads some rows, and not every row
        assert any(row[padded] is None and row[names.index("x_v")] < 1000 for row in on), (padded, on)
        assert any(row[padded] is not None for row in on), (padded, on)


def anti_query(spark: SparkSession, directory: Path, position: str, by_hand: bool,
               tables: dict[str, DataFrame] | None = None) -> DataFrame:
    """x LEFT ANTI z (z on x_k, z_ts within 5 minutes of x_ts), joined inner with y on x_k: above the anti join
    ("below": (x ANTI z) JOIN y) or below it ("top": (x JOIN y) ANTI z). `by_hand`: the anti join written as Spark
    runs it between streams, a left outer join keeping the rows padded with NULLs, x's (and y's) columns. With
    `tables`, the same joins of those (batch) tables instead of the streams."""
    def watermarked(name: str) -> DataFrame:  # (the query's streams are all under `directory`)
        return tables[name] if tables is not None else watermarked_stream(spark, directory, name)

    def anti(df: DataFrame) -> DataFrame:
        on = (F.col("x_k") == F.col("z_k")) & near("z_ts", "x_ts")
        if not by_hand:
            return df.join(watermarked("z"), on, "left_anti")
        return df.join(watermarked("z"), on, "left_outer").where(F.col("z_k").isNull()).select(*df.columns)

    def with_y(df: DataFrame) -> DataFrame:
        return df.join(watermarked("y"), (F.col("x_k") == F.col("y_k")) & near("y_ts", "x_ts")).drop("y_ts")

    return with_y(anti(watermarked("x"))) if position == "below" else anti(with_y(watermarked("x")))


@pytest.mark.parametrize(("position", "seed"), [("top", 60), ("below", 61)])
def test_a_left_anti_join_of_two_streams_runs_as_the_left_outer_join_keeping_its_padded_rows(
        spark: SparkSession, tmp_path: Path, position: str, seed: int) -> None:
    """Spark refuses a left anti join of two streams; with UMJoin it puts out each unmatched row once, in the
    micro-batch Spark's left outer join pads it (compared with that join written by hand, batch by batch), inside
    the StreamingUMJoin, below the inner join or above it. Every row it puts out has no z row within its time range,
    and every row the batch anti join of the rows Spark does not drop as late (those at or behind the watermark
    the micro-batch they came in filters by) puts out comes out: none is lost by the rewrite both runs share."""
    streams = draw_streams(["x", "y", "z"], random.Random(seed), minutes=30, most_cuts=4)
    write_streams(tmp_path, streams)
    with temporary_conf(spark, {"spark.sql.shuffle.partitions": "2"}):
        umjoin, on = run_by_batch(anti_query(spark, tmp_path, position, False), tmp_path / "ck-on")
        with temporary_conf(spark, SPARK_JOINS):
            _, off = run_by_batch(anti_query(spark, tmp_path, position, True), tmp_path / "ck-off")
            with pytest.raises(Exception, match="LeftAnti joins with a streaming DataFrame/Dataset on the right are not supported"):
                run_by_batch(anti_query(spark, tmp_path, position, False), tmp_path / "ck-spark")
            marks = stream_data.watermarks(streams, 2, {name: DELAY_MS for name in streams})
            on_time = {name: [row for b, batch in enumerate(batches) for row in batch
                              if stream_data.millis(row[2]) > stream_data.late_before(marks, b)] for name, batches in streams.items()}
            tables = {name: spark.createDataFrame(rows, columns(name)) for name, rows in on_time.items()}
            completed = sorted_rows(anti_query(spark, tmp_path, position, False, tables))

    plan = executed_plan(umjoin)
    assert plan.count("StreamingUMJoin inputs=") == 1 and "StreamingSymmetricHashJoin" not in plan, plan
    stream_data.assert_watermarks(umjoin, marks)
    assert on == off
    assert sorted((row for row, batches in on.items() for _ in batches), key=nulls_first) == completed
    assert sum(len(rows) for rows in on_time.values()) < sum(len(batch) for batches in streams.values() for batch in batches)  # (late rows)
    names = anti_query(spark, tmp_path, position, False).columns
    z = [(r["z_k"], r["z_ts"]) for r in spark.read.parquet(str(tmp_path / "z")).collect()]
    window = datetime.timedelta(minutes=5)
    real = [row for row in on if row[names.index("x_v")] < 1000]  # (not the far-future rows that end the streams)
    assert real and all(not any(k == row[names.index("x_k")] and abs(ts - row[names.index("x_ts")]) <= window for k, ts in z)
                        for row in real), real
    if position == "below":
        # Below the inner join its filter is the StreamingUMJoin's (on top it stays Spark's Filter above it): the
        # probe of z ends at the first matching row, which no other would let through either. So at most one match
        # per probe (before the change: 197 matches in 144 probes).
        assert "isnull(z_k#" in plan.split("StreamingUMJoin inputs=")[1].split("\n")[0], plan
        (z_input,) = re.findall(r"#(\d+) [^(]*\(left outer", plan)
        probes, matches = (umjoin_metric(umjoin, f"{metric}Input{z_input}") for metric in ("probes", "matches"))
        assert 0 < matches <= probes, (matches, probes)


def test_a_left_anti_join_of_two_streams_without_a_time_bound_is_refused_saying_what_is_missing(spark: SparkSession, tmp_path: Path) -> None:
    random_streams(tmp_path, ["x", "z"], random.Random(62), minutes=10, most_cuts=2)
    x = stream(spark, tmp_path / "x", columns("x")).withWatermark("x_ts", DELAY)
    z = stream(spark, tmp_path / "z", columns("z")).withWatermark("z_ts", DELAY)
    with pytest.raises(Exception, match="UMJoin cannot run the LEFT ANTI join of two streams ON .*no watermark in its join keys"):
        x.join(z, F.col("x_k") == F.col("z_k"), "left_anti").schema


def broadcasts_so_far(spark: SparkSession) -> int:
    """The id the next broadcast variable of the application gets: ids count every broadcast made."""
    probe = spark.sparkContext.broadcast(0)
    next_id = int(probe._jbroadcast.id())  # type: ignore[attr-defined]
    probe.destroy()
    return next_id


def test_a_converted_chain_is_planned_without_sparks_joins_so_its_micro_batches_broadcast_no_hadoop_configuration(
        spark: SparkSession, tmp_path: Path) -> None:
    """Spark's stream-stream join broadcasts the Hadoop configuration each time it is constructed, and Spark
    constructs each join several times while it plans a micro-batch. The streaming planner plans the group from the
    logical plan, so Spark never constructs the joins it replaces: progress lists one state operator, and the
    micro-batches broadcast at least eight times fewer per join than with Spark's joins."""
    rng = random.Random(66)
    sides = [("left", "k")] * 5
    random_streams(tmp_path, ["x", *(f"z{i}" for i in range(1, 6))], rng, minutes=30, most_cuts=2)
    counts = {}
    with temporary_conf(spark, {"spark.sql.shuffle.partitions": "2"}):
        for label, conf in (("umjoin", {}), ("spark", SPARK_JOINS)):
            with temporary_conf(spark, conf):
                before = broadcasts_so_far(spark)
                query, rows = run_by_batch(chain_query(spark, tmp_path, sides, False), tmp_path / f"ck-{label}")
                counts[label] = (broadcasts_so_far(spark) - before - 1, len(query.recentProgress), query, rows)

    umjoin_broadcasts, umjoin_batches, umjoin, on = counts["umjoin"]
    spark_broadcasts, spark_batches, _, off = counts["spark"]
    assert on == off
    assert [op["operatorName"] for op in umjoin.lastProgress["stateOperators"]] == ["umJoin"]
    assert "StreamingSymmetricHashJoin" not in executed_plan(umjoin)
    # Spark constructs each join 8-13 times a micro-batch, each construction one broadcast (measured: 65 broadcasts in
    # 5 micro-batches with UMJoin, 353 with Spark's five joins).
    assert spark_broadcasts - umjoin_broadcasts >= 8 * 5 * spark_batches, (umjoin_broadcasts, spark_broadcasts, spark_batches)
