"""Stream-stream joins with no equality between their sides (bands, inequalities, a Python UDF), bounded
by time ranges: Spark refuses them while planning; with UMJoin they run, their state one time slice
(`umjoin_time_slice`). Checked against a nested-loop join computed here, and micro-batch by micro-batch
against Spark's own stream-stream joins of the same rows, which Spark runs given an equality that always
holds (`constant_key`, UMJoin off), with users' data (NULL keys and prices, streams without rows, empty
micro-batches, late rows, rows at the watermark), a restart, HDFS and RocksDB state; joins UMJoin cannot
bound are refused with what is missing.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import itertools
import json
import math
import random
import re
from pathlib import Path
from typing import Callable

import pytest
from pyspark.accumulators import Accumulator
from pyspark.errors import AnalysisException, StreamingQueryException
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.types import BooleanType, TimestampType

import stream_data
from stream_data import Batches
from test_streaming import ROCKSDB, SPARK_JOINS, executed_plan, nulls_first, run_by_batch, stream, write_batches
from test_streaming_outer import hold_back_second_half
from umjoin.local import temporary_conf

BASE = datetime.datetime(2026, 1, 1)
NAMES = ("a", "b", "c")
NEAR = datetime.timedelta(minutes=5)
DELAY_MS = 10 * 60 * 1000  # every stream's watermark delay


def columns(name: str) -> str:
    return f"{name}_k BIGINT, {name}_p BIGINT, {name}_ts TIMESTAMP"


def random_rows(rng: random.Random, names: tuple[str, ...] = NAMES, users_data: bool = False,
                extremes: dict[str, str] | None = None) -> dict[str, list[tuple]]:  # type: ignore[type-arg]
    """Per stream, 15-30 rows over 30 minutes of event time on a 30-second grid (equal times, and rows exactly
    5 minutes apart: on a window's bound), in arrival order: out of order by up to 6 minutes. With `users_data`,
    each stream's key and price are NULL in a share of its rows drawn per stream (none, some or many). `extremes`:
    streams whose every key and price is NULL (stream_data.ALL_NULL: 5-10 rows) or that have no row (NO_ROWS)."""
    extremes = extremes or {}
    streams = {}
    for name in names:
        share = 1.0 if extremes.get(name) == stream_data.ALL_NULL else rng.choice([0.0, 0.1, 0.3]) if users_data else 0.0
        key, price = stream_data.key_drawer(rng, 3, share), stream_data.key_drawer(rng, 100, share)
        if extremes.get(name) == stream_data.NO_ROWS:
            streams[name] = []
            continue
        arrivals = []
        for _ in range(rng.randint(5, 10) if name in extremes else rng.randint(15, 30)):
            at = BASE + datetime.timedelta(seconds=30 * rng.randrange(60))
            arrivals.append((at + datetime.timedelta(minutes=rng.uniform(0, 6)), (key(), price(), at)))
        streams[name] = [row for _, row in sorted(arrivals)]
    return streams


def in_batches(streams: dict[str, list[tuple]], rng: random.Random, most_cuts: int = 4,  # type: ignore[type-arg]
               at_watermarks: bool = True) -> dict[str, Batches]:
    """Each stream's rows cut at random into micro-batches (at 2 to `most_cuts` places; an empty one now and then)
    with a row a day late in its second half, rows exactly at watermarks, and a last micro-batch two days on whose
    watermark ends every window (its row's key and price NULL where every other's are; none for a stream without
    rows: its watermark never moves, and the case runs with the maximum's watermark policy)."""
    cut: dict[str, Batches] = {}
    for n, (name, rows) in enumerate(streams.items()):
        if not rows:
            cut[name] = [[]]
            continue
        rows = list(rows)
        late = rng.randrange(len(rows) // 2, len(rows))
        rows[late] = (rows[late][0], rows[late][1], BASE - datetime.timedelta(days=1))
        batches = stream_data.cut(rng, rows, rng.randint(min(2, most_cuts), most_cuts), empty=0.25)
        null = all(row[0] is None and row[1] is None for row in rows)
        cut[name] = [*batches, [(None if null else 9, None if null else 0, BASE + datetime.timedelta(days=2, minutes=n))]]
    if at_watermarks:
        stream_data.put_at_watermarks(rng, cut, 2, {name: DELAY_MS for name in cut}, policy=stream_data.policy_for(cut))
    return cut


def write_in_batches(directory: Path, streams: dict[str, list[tuple]], rng: random.Random | None) -> dict[str, Batches]:  # type: ignore[type-arg]
    """Each stream in one file, or (with `rng`) in the micro-batches `in_batches` cuts. Returns the micro-batches written."""
    written = in_batches(streams, rng) if rng is not None else {name: [list(rows)] for name, rows in streams.items()}
    for name, batches in written.items():
        write_batches(directory / name, columns(name), batches)
    return written


def write_cut_at_random(directory: Path, streams: dict[str, list[tuple]], rng: random.Random) -> None:  # type: ignore[type-arg]
    """Each stream cut at 2-4 random places, a row a day late in its second half, and a last micro-batch two days
    on: the rows the test of the automatic slice counts measures its cost model's choice on (no empty micro-batch,
    no row at a watermark: `in_batches` draws those)."""
    for n, (name, rows) in enumerate(streams.items()):
        rows = list(rows)
        late = rng.randrange(len(rows) // 2, len(rows))
        rows[late] = (rows[late][0], rows[late][1], BASE - datetime.timedelta(days=1))
        cuts = sorted(rng.randint(0, len(rows)) for _ in range(rng.randint(2, 4)))
        batches = [rows[a:b] for a, b in zip([0, *cuts], [*cuts, len(rows)])]
        write_batches(directory / name, columns(name), [*batches, [(9, 0, BASE + datetime.timedelta(days=2, minutes=n))]])


def constant_key(condition: Column, left: str, right: str) -> Column:
    """`condition` and an equality of a value that is 0 in every row of either side: the same join, which Spark runs
    as a stream-stream join (it refuses one without an equality), all its state in one partition: Spark's answer."""
    def zero(name: str) -> Column:  # (keys are never negative; Spark's optimizer folds `coalesce(k, 0) * 0` to 0)
        return F.least(F.coalesce(F.col(f"{name}_k"), F.lit(0)), F.lit(0))
    return condition & (zero(left) == zero(right))


def band_query(spark: SparkSession, directory: Path, keyed: bool, slow: bool = False, for_spark: bool = False) -> DataFrame:
    """a and b within 5 minutes and 25 in price; their result and c within 5 minutes of b, c's price between
    theirs, and a Python UDF of a_p and c_p; with `keyed`, c also on a's key (a group mixing both); with `slow`,
    also a Scala UDF of a_k and c_k taking 200 µs a call (registered as `umjoin_slow`). `for_spark`: each join with
    an equality that always holds (`constant_key`), so that Spark runs it (UMJoin off: the reference)."""
    frames = {n: stream(spark, directory / n, columns(n)).withWatermark(f"{n}_ts", "10 minutes") for n in NAMES}
    runnable = constant_key if for_spark else lambda condition, _left, _right: condition

    def near(x: str, y: str):  # type: ignore[no-untyped-def]
        return F.col(x).between(F.col(y) - F.expr("interval 5 minutes"), F.col(y) + F.expr("interval 5 minutes"))

    ab = frames["a"].join(frames["b"], runnable(near("b_ts", "a_ts") & (F.abs(F.col("a_p") - F.col("b_p")) < 25), "a", "b"))
    ab = ab.withMetadata("a_ts", {})  # (Spark's joins take one event-time column per side)
    on = near("c_ts", "b_ts") & F.col("c_p").between(F.least("a_p", "b_p"), F.greatest("a_p", "b_p"))
    # A Python UDF, a stand-in for a costly similarity test (a lambda: Spark's Python workers cannot import this module).
    on = on & F.udf(lambda a_p, c_p: a_p is not None and c_p is not None and (a_p + c_p) % 3 != 0, BooleanType())("a_p", "c_p")
    if slow:
        on = on & F.expr("umjoin_slow(a_k, c_k)")
    return ab.join(frames["c"], runnable(on & (F.col("a_k") == F.col("c_k")) if keyed else on, "b", "c"))


def nested_loop(streams: dict[str, list[tuple]], keyed: bool) -> list[tuple]:  # type: ignore[type-arg]
    """The query's result over all rows, every combination tested (the reference)."""
    out = []
    for a, b, c in itertools.product(streams["a"], streams["b"], streams["c"]):
        if None in (a[1], b[1], c[1]) or keyed and None in (a[0], c[0]):  # (a comparison with NULL holds for no row)
            continue
        if abs(a[2] - b[2]) <= NEAR and abs(a[1] - b[1]) < 25 and abs(c[2] - b[2]) <= NEAR and \
                min(a[1], b[1]) <= c[1] <= max(a[1], b[1]) and (a[1] + c[1]) % 3 != 0 and (not keyed or a[0] == c[0]):
            out.append((*a, *b, *c))
    return sorted(out)


def chain_query(spark: SparkSession, directory: Path, names: list[str], calls: Accumulator[int]) -> DataFrame:
    """Each stream joined with the one before: within 5 minutes of it, and its price within 25 of it (odd
    positions) or above it less 10 (even positions): no equality anywhere. The last join also tests a Python
    UDF of the first and last streams' keys, counting its calls in `calls`."""
    joined = stream(spark, directory / names[0], columns(names[0])).withWatermark(f"{names[0]}_ts", "10 minutes")

    def similar(first_k: int, last_k: int) -> bool:
        calls.add(1)
        return first_k != (last_k + 1) % 3

    for before, name in zip(names, names[1:]):
        side = stream(spark, directory / name, columns(name)).withWatermark(f"{name}_ts", "10 minutes")
        near = F.col(f"{name}_ts").between(F.col(f"{before}_ts") - F.expr("interval 5 minutes"), F.col(f"{before}_ts") + F.expr("interval 5 minutes"))
        odd = names.index(name) % 2
        prices = F.abs(F.col(f"{name}_p") - F.col(f"{before}_p")) < 25 if odd else F.col(f"{name}_p") > F.col(f"{before}_p") - 10
        if name == names[-1]:
            prices = prices & F.udf(similar, BooleanType())(f"{names[0]}_k", f"{name}_k")
        joined = joined.join(side, near & prices).withMetadata(f"{before}_ts", {})  # (one event-time column per side)
    return joined


def chain_nested_loop(streams: dict[str, list[tuple]], names: list[str], udf: bool = True) -> list[tuple]:  # type: ignore[type-arg]
    """`chain_query`'s result over all rows: every row of each stream tested with every partial combination
    before it (without `udf`: what is left to the Python UDF to test)."""
    partial = [tuple(row) for row in streams[names[0]]]
    for position, name in enumerate(names[1:], start=1):
        def matches(first: tuple, before: tuple, row: tuple) -> bool:  # type: ignore[type-arg]
            prices = abs(row[1] - before[1]) < 25 if position % 2 else row[1] > before[1] - 10
            similar = not udf or position < len(names) - 1 or first[0] != (row[0] + 1) % 3
            return abs(row[2] - before[2]) <= NEAR and prices and similar
        partial = [(*combination, *row) for combination in partial for row in streams[name] if matches(combination[:3], combination[-3:], row)]
    return sorted(partial)


def restarted_to_files(spark: SparkSession, directory: Path, name: str, slices: tuple[str, str], query: Callable[[], DataFrame],
                       between: Callable[[Path], None] = lambda _: None) -> tuple[list[tuple], StreamingQuery]:  # type: ignore[type-arg]
    """`query` to a parquet file sink over the first half of the streams' files, then restarted from its checkpoint
    over all of them, with `spark.umjoin.timeSlices` set to slices[0], then slices[1]; `between` is given the
    checkpoint before the restart. The sink's rows, and the query as restarted."""
    put_back = hold_back_second_half(directory, list(NAMES))
    for half, count in enumerate(slices):
        if half:
            between(directory / f"ck-{name}")
            put_back()
        with temporary_conf(spark, {"spark.umjoin.timeSlices": count}):
            run = query().writeStream.format("parquet").option("checkpointLocation", str(directory / f"ck-{name}")) \
                .option("path", str(directory / f"out-{name}")).trigger(availableNow=True).start()
            run.awaitTermination()
    return sorted(tuple(row) for row in spark.read.parquet(str(directory / f"out-{name}")).collect()), run


def summed_metric(query: StreamingQuery, name: str) -> int:
    """The StreamingUMJoin's custom metric `name`, summed over the query's micro-batches."""
    return sum(p["stateOperators"][0]["customMetrics"][name] for p in query.recentProgress if p["stateOperators"])


def test_a_three_way_band_join_spark_refuses_runs_as_one_streaming_umjoin_and_equals_a_nested_loop(
        spark: SparkSession, tmp_path: Path) -> None:
    streams = random_rows(random.Random(7))
    write_in_batches(tmp_path, streams, None)
    with temporary_conf(spark, {"spark.sql.shuffle.partitions": "2"}):
        query, emitted = run_by_batch(band_query(spark, tmp_path, keyed=False), tmp_path / "ck")
        with temporary_conf(spark, SPARK_JOINS):
            with pytest.raises(Exception, match="Stream-stream join without equality predicate is not supported"):
                band_query(spark, tmp_path, keyed=False).explain()

    plan = executed_plan(query)
    assert plan.count("StreamingUMJoin inputs=") == 1 and "StreamingSymmetricHashJoin" not in plan, plan
    assert "umjoin_time_slice(a_ts" in plan and "umjoin_time_slice(c_ts" in plan, plan
    expected = nested_loop(streams, keyed=False)
    assert sorted(row for row, batches in emitted.items() for _ in batches) == expected
    assert 5 <= len(expected) < len(streams["a"]) * len(streams["b"])  # (the conditions drop most combinations, not all)


@pytest.mark.parametrize(("streams", "runs"), [
    (2, ((1, 1), (4, 4), (4, 1))),
    (3, ((1, 1), (3, 3), (5, 5), (8, 3))),
    (5, ((1, 1), (7, 7), (6, 2))),
])
def test_the_state_is_spread_over_the_partitions_by_time_slice_each_row_stored_once(
        spark: SparkSession, tmp_path: Path, streams: int, runs: tuple[tuple[int, int], ...]) -> None:
    """Paper 004's property: for any number of slices (1 to 7 here, over as many state partitions or more, up to 8) the result
    is the nested loop's, the rows stored over all slices are the same rows, none kept twice, and the Python
    UDF is called once per combination the other conditions leave, as a nested loop calls it."""
    names = [f"s{i}" for i in range(streams)]
    rows = random_rows(random.Random(10 + streams), tuple(names))
    write_in_batches(tmp_path, rows, None)
    expected = chain_nested_loop(rows, names)
    left_to_the_udf = len(chain_nested_loop(rows, names, udf=False))
    assert expected and left_to_the_udf > len(expected) and left_to_the_udf < math.prod(len(r) for r in rows.values())
    stored_by_run = {}
    tested = {}
    for partitions, slices in runs:
        calls = spark.sparkContext.accumulator(0)
        # (No spark.umjoin.minInputs: by default two streams joined without an equi-key are a StreamingUMJoin.)
        settings = {"spark.sql.shuffle.partitions": str(partitions), "spark.umjoin.timeSlices": str(slices)}
        with temporary_conf(spark, settings):
            name = f"{partitions}-{slices}"
            query, emitted = run_by_batch(chain_query(spark, tmp_path, names, calls), tmp_path / f"ck{name}")
        assert sorted(row for row, batches in emitted.items() for _ in batches) == expected, (partitions, slices)
        assert calls.value == left_to_the_udf, (partitions, slices)
        plan = executed_plan(query)
        assert plan.count("StreamingUMJoin inputs=") == 1 and "StreamingSymmetricHashJoin" not in plan, plan
        assert plan.count("hashpartitioning(umjoin_time_slice_ring(") == (streams if partitions > 1 else 0), plan
        assert ("=>~ #" in plan) == (partitions > 1), plan
        stores = json.loads(spark._jvm.umjoin.spark.testkit.StateSizes.perPartitionJson(query._jsq.streamingQuery().lastExecution(), 0))  # type: ignore[union-attr]
        held = {(s["store"], s["partition"]): s["rows"] for s in stores if "-index-" not in s["store"]}
        stored_by_run[(partitions, slices)] = {name: sum(r for (n, _), r in held.items() if n == name) for name, _ in held}
        # Slice s of a stream (its event times cut every `width` ms, as the plan shows) is in partition s mod partitions.
        widths = {name: int(ms) for name, ms in re.findall(r"umjoin_time_slice_ring\((\w+)_ts#\d+, (\d+) ms, " + str(partitions), plan)}
        assert sorted(widths) == (sorted(names) if partitions > 1 else []), plan
        for name in widths:
            micros = [(row[2] - datetime.datetime(1970, 1, 1)) // datetime.timedelta(microseconds=1) for row in rows[name]]
            ring = collections.Counter(us // (widths[name] * 1000) % partitions for us in micros)
            assert {p: held[(f"umjoin-input-{names.index(name)}", p)] for p in range(partitions)} == {p: ring[p] for p in range(partitions)}
        holding = {name: sum(1 for (n, _), r in held.items() if n == name and r > 0) for name, _ in held}
        if partitions > 1:
            first = next(p for p in query.recentProgress if p["batchId"] == 0)["stateOperators"][0]["customMetrics"]
            assert all(first[f"slicePartitionsInput{i}"] == holding[f"umjoin-input-{i}"] for i in range(streams)), (first, holding)
        tested[(partitions, slices)] = sum(summed_metric(query, f"conditionChecksInput{i}") for i in range(streams))
    # Every stream's rows once, in whichever slices: all of them (one micro-batch: nothing evicted yet).
    assert all(stored == {f"umjoin-input-{i}": len(rows[n]) for i, n in enumerate(names)} for stored in stored_by_run.values()), stored_by_run
    # A combination is tested only against the rows of the slices its time range overlaps (slices + 1 at most): in fewer
    # partitions than all of them, fewer rows than in one partition holding them all.
    assert all(tested[run] <= tested[(1, 1)] for run in runs), tested
    assert all(tested[run] < tested[(1, 1)] for run in runs if run[0] > run[1] + 1), tested


@pytest.mark.parametrize(("partitions", "slices"), [(3, 1), (3, 2), (8, 8)])
def test_a_scala_udf_written_first_is_called_only_for_the_combinations_the_simple_conditions_leave(
        spark: SparkSession, tmp_path: Path, partitions: int, slices: int) -> None:
    """A costly condition of all three streams written before the time ranges and bands: the last step of every
    route checks the conditions that cannot fail first (paper 004: cheap predicates before the expensive one), so
    the UDF is called once per combination they leave, as often as a nested loop testing it last calls it,
    whatever the number of time slices."""
    streams = random_rows(random.Random(21))
    write_in_batches(tmp_path, streams, None)
    spark.udf.registerJavaFunction("umjoin_similar", "umjoin.spark.testkit.CountedSimilarity", BooleanType())
    frames = {n: stream(spark, tmp_path / n, columns(n)).withWatermark(f"{n}_ts", "10 minutes") for n in NAMES}

    def near(x: str, y: str):  # type: ignore[no-untyped-def]
        return F.col(x).between(F.col(y) - F.expr("interval 5 minutes"), F.col(y) + F.expr("interval 5 minutes"))

    ab = frames["a"].join(frames["b"], near("b_ts", "a_ts") & (F.col("a_p") <= F.col("b_p"))).withMetadata("a_ts", {})
    similar = F.expr("umjoin_similar(a_k, b_k + c_k)")
    query = ab.join(frames["c"], similar & near("c_ts", "b_ts") & F.col("c_p").between(F.col("a_p"), F.col("b_p")))

    def simple(a: tuple, b: tuple, c: tuple) -> bool:  # type: ignore[type-arg]
        return abs(b[2] - a[2]) <= NEAR and a[1] <= b[1] and abs(c[2] - b[2]) <= NEAR and a[1] <= c[1] <= b[1]

    left_to_the_udf = [(*a, *b, *c) for a, b, c in itertools.product(*(streams[n] for n in NAMES)) if simple(a, b, c)]
    expected = sorted(row for row in left_to_the_udf if row[0] != (row[3] + row[6] + 1) % 3)
    assert expected and len(expected) < len(left_to_the_udf) < len(streams["a"]) * len(streams["b"]) * len(streams["c"]) / 10
    counted = spark._jvm.umjoin.spark.testkit.CountedSimilarity  # type: ignore[union-attr]
    counted.takeCalls()
    with temporary_conf(spark, {"spark.sql.shuffle.partitions": str(partitions), "spark.umjoin.timeSlices": str(slices)}):
        run, emitted = run_by_batch(query, tmp_path / "ck")
    assert sorted(row for row, batches in emitted.items() for _ in batches) == expected
    assert counted.takeCalls() == len(left_to_the_udf)
    # The metric of the conditions that can fail counts the UDF's calls (the query's other conditions cannot fail).
    assert sum(summed_metric(run, f"costlyConditionChecksInput{i}") for i in range(3)) == len(left_to_the_udf)
    plan = executed_plan(run)
    assert plan.count("StreamingUMJoin inputs=") == 1 and "umjoin_similar" in plan, plan
    assert plan.count(f"{slices} time slices per window") == 3, plan


def recorded_slicings(checkpoint: Path) -> dict[int, list[dict]]:  # type: ignore[type-arg]
    """Per micro-batch that changed the time slicing, each input's slicing as the checkpoint recorded it."""
    operator = next((checkpoint / "state").glob("*/_umjoin_layout.json")).parent
    return {int(f.stem.rsplit("_", 1)[1]): json.loads(f.read_text()) for f in operator.glob("_umjoin_slices_*.json")}


def restarted_from_6_to_3_slices(spark: SparkSession, directory: Path, between: Callable[[Path], None]) -> tuple[list[tuple], list[tuple], StreamingQuery]:  # type: ignore[type-arg]
    """The restart tests' run: random rows in random micro-batches (and a micro-batch more after the one whose
    watermark ends every window), the band query to a file sink over 6 partitions, restarted from 6 slices per window
    to 3 with `between` given the checkpoint; with UMJoin and with Spark's joins (`constant_key`). Both sinks' rows,
    and UMJoin's query as restarted."""
    rng = random.Random(4)
    write_in_batches(directory, random_rows(rng), rng)
    for n, name in enumerate(NAMES):
        write_batches(directory / name, columns(name), [[(9, 0, BASE + datetime.timedelta(days=3, minutes=n))]])

    def to_files(name: str, for_spark: bool) -> tuple[list[tuple], StreamingQuery]:  # type: ignore[type-arg]
        return restarted_to_files(spark, directory, name, ("6", "3"), lambda: band_query(spark, directory, keyed=False, for_spark=for_spark), between)

    with temporary_conf(spark, {"spark.sql.shuffle.partitions": "6"}):
        on, umjoin = to_files("on", False)
        with temporary_conf(spark, SPARK_JOINS):
            off, _ = to_files("off", True)
    return on, off, umjoin


def test_a_restart_with_other_time_slices_cuts_the_new_slices_past_the_stored_rows_and_puts_out_every_row_once_to_a_file_sink(
        spark: SparkSession, tmp_path: Path) -> None:
    """The query stops halfway with its rows spread over 6 slices per window and restarts with 3: once a micro-batch
    reported where the stored rows' event times end, the new slices start at a slice boundary past them; the stored
    rows stay where they are and are probed there until none is left. The file sink holds what Spark's own joins
    (`constant_key`) put out over the same restart, each row once. The layout record is as the version before
    slice counts wrote it (the width only, a slice per partition: read as 6 slices over the 6 partitions). (With
    RocksDB and `auto`: the test after this one.)"""
    def as_written_before(checkpoint: Path) -> None:
        for record in (checkpoint / "state").glob("*/_umjoin_layout.json"):
            layout = json.loads(record.read_text())
            for item in layout["inputs"]:
                del item["timeSlices"], item["timeSliceStretches"]
            record.write_text(json.dumps(layout))
            (record.parent / f".{record.name}.crc").unlink()  # (Hadoop's checksum of the file as it was)

    on, off, umjoin = restarted_from_6_to_3_slices(spark, tmp_path, as_written_before)
    assert on == off and on  # (the same rows, each as often)
    operator = next((tmp_path / "ck-on" / "state").glob("*/_umjoin_layout.json")).parent
    started = [item.get("timeSlices") for item in json.loads((operator / "_umjoin_layout.json").read_text())["inputs"]]
    assert started == [None] * 3  # (the layout as it started)
    restarted = min(p["batchId"] for p in umjoin.recentProgress)
    changes = recorded_slicings(tmp_path / "ck-on")
    assert min(changes) >= restarted, changes  # (so the restart read the layout record as the version before wrote it)
    counted = [batch for batch, slicing in sorted(changes.items()) if [item["timeSlices"] for item in slicing] == [3, 3, 3]]
    # The restarted run's first batch knows nothing of the stored rows' times: the change comes in its second.
    assert counted and counted[0] == restarted + 1, (restarted, changes)
    # New slices start at a boundary of the old ones past the stored rows' times: after BASE, and within a slice of the
    # latest event time of the rows written before the restart (the day-two rows come after it, in the second half).
    latest = TimestampType().toInternal(BASE + datetime.timedelta(seconds=30 * 59))
    for item in changes[counted[0]]:
        first, *later = item["timeSliceStretches"]
        for start, _, _ in later:
            assert (start - first[0]) % (first[1] * 1000) == 0 and TimestampType().toInternal(BASE) < start <= latest + first[1] * 1000, item
    # Once the rows of the first slicing were evicted, the slicing was one stretch again.
    assert all(len(item["timeSliceStretches"]) == 1 for item in changes[max(changes)]), changes
    plan = executed_plan(umjoin)
    assert plan.count("3 time slices per window") == 3 and "still probed there" not in plan, plan


def test_slices_past_a_burst_are_narrower_so_each_holds_as_many_rows_and_the_answer_stays_sparks(
        spark: SparkSession, tmp_path: Path) -> None:
    """Paper 004's load balancing: the slices' rows, not their time, kept even. The streams bring a row a minute for
    half an hour, then one every 2 seconds: past the burst's first micro-batch the slices are cut narrower, by the
    ratio of the rates the micro-batch before measured (stored rows against the rows it brought), so that each
    holds about as many rows and the burst's rows are spread over the partitions instead of filling one. Every
    micro-batch puts out what Spark's joins (`constant_key`) put out in it, and everything equals a nested loop."""
    rng = random.Random(11)
    minute = datetime.timedelta(minutes=1)
    slow = [BASE + i * minute for i in range(30)]
    burst = [[BASE + 30 * minute + k * minute + datetime.timedelta(seconds=2 * i) for i in range(30)] for k in range(3)]
    streams = {}
    for name in NAMES:
        batches = [slow[:10], slow[10:20], slow[20:], *burst]
        rows = [[(rng.randrange(3), rng.randrange(100), at) for at in batch] for batch in batches]
        streams[name] = [row for batch in rows for row in batch]
        write_batches(tmp_path / name, columns(name), [*rows, [(9, 0, BASE + datetime.timedelta(days=2))]])
    settings = {"spark.sql.shuffle.partitions": "4", "spark.umjoin.timeSlices": "2"}
    with temporary_conf(spark, settings):
        umjoin, on = run_by_batch(band_query(spark, tmp_path, keyed=False), tmp_path / "ck-on")
        with temporary_conf(spark, SPARK_JOINS):
            _, off = run_by_batch(band_query(spark, tmp_path, keyed=False, for_spark=True), tmp_path / "ck-off")

    assert on == off  # the same rows, each put out in the same micro-batch
    assert sorted(row for row, batches in on.items() for _ in batches) == nested_loop(streams, keyed=False)
    changes = recorded_slicings(tmp_path / "ck-on")
    # Planned after the burst's first batch (batch 3): every stream's slices past it, at least 4 times narrower.
    assert 4 in changes, changes
    for item in changes[4]:
        steady, *past = item["timeSliceStretches"]
        assert item["timeSlices"] == 2 and past and past[-1][1] * 4 <= steady[1], item
        assert past[-1][0] > TimestampType().toInternal(burst[0][-1]), item  # (past every row stored)


def test_a_change_of_slices_left_pending_by_the_version_before_stretches_probes_its_earlier_slices_until_none_is_left(
        spark: SparkSession, tmp_path: Path) -> None:
    """A checkpoint as the version before stretches left it when it stopped in the middle of a change from 6 slices
    per window to 3 (recorded for the next micro-batch: the new width, and the width before, whose rows it still
    probed): the restart places new rows by the new width, probes the stored rows where the width before placed
    them, counts those rows until none is left, and puts out what Spark's joins (`constant_key`) put out."""
    def as_left_mid_change(checkpoint: Path) -> None:
        following = 1 + max(int(f.name) for f in (checkpoint / "commits").iterdir() if f.name.isdigit())
        for record in (checkpoint / "state").glob("*/_umjoin_layout.json"):
            widths = [item["timeSliceMs"] for item in json.loads(record.read_text())["inputs"]]
            change = [{"timeSliceMs": 2 * ms, "timeSlices": 3, "earlierTimeSliceMs": [ms]} for ms in widths]
            (record.parent / f"_umjoin_slices_{following}.json").write_text(json.dumps(change))

    on, off, umjoin = restarted_from_6_to_3_slices(spark, tmp_path, as_left_mid_change)
    assert on == off and on  # (the same rows, each as often)
    progress = [p["stateOperators"][0]["customMetrics"] for p in umjoin.recentProgress if p["stateOperators"]]
    assert progress[0]["earlierSliceRowsInput0"] > 0 and progress[-1]["earlierSliceRowsInput0"] == 0, progress
    # Once a micro-batch counted none, the slicing was recorded without the width before.
    last = recorded_slicings(tmp_path / "ck-on")
    assert all("earlierTimeSliceMs" not in item for item in last[max(last)]), last
    assert "still probed there" not in executed_plan(umjoin)


def predicted_nanos(test: float, rows: float, send: float, n: int, cores: int, partitions: int) -> float:
    """Paper 004's cost of a combination sent to a store of n slices per span, as docs/streaming.md states it for
    Spark's stages: it tests the rows of the n + 1 slices its range overlaps ((n + 1) / n of a span's `rows`, `test`
    ns each), is sent to as many partitions (`send` ns each, all of them at most), which run on `cores` at once."""
    overlapped = max(1, min(n, partitions - 1))
    sends = min(n + 1, partitions)
    return (test * rows * (overlapped + 1) / overlapped + send * sends) / max(1, min(sends, cores))


def test_auto_time_slices_are_chosen_from_the_costs_the_micro_batch_before_measured(spark: SparkSession, tmp_path: Path) -> None:
    """Restarted from 1 slice per window with `spark.umjoin.timeSlices=auto`: from the second micro-batch of the run
    on, each stream's count is the one of least predicted time (within 20% of the current one it stays) by the
    costs its metrics measured in the batch before; with a Scala UDF of 200 µs in c's step, that is more slices for
    c. The file sink holds what Spark's joins (`constant_key`) put out over the same restart (RocksDB state)."""
    rng = random.Random(4)
    write_cut_at_random(tmp_path, random_rows(rng), rng)
    spark.udf.registerJavaFunction("umjoin_slow", "umjoin.spark.testkit.SlowSimilarity", BooleanType())
    partitions, cores = 6, spark.sparkContext.defaultParallelism
    with temporary_conf(spark, {"spark.sql.shuffle.partitions": str(partitions), **ROCKSDB}):
        on, umjoin = restarted_to_files(spark, tmp_path, "on", ("1", "auto"), lambda: band_query(spark, tmp_path, keyed=False, slow=True))
        with temporary_conf(spark, SPARK_JOINS):
            off, _ = restarted_to_files(spark, tmp_path, "off", ("1", "auto"), lambda: band_query(spark, tmp_path, keyed=False, slow=True, for_spark=True))
    assert on == off and on  # (the same rows, each as often)

    measured = {p["batchId"]: p["stateOperators"][0]["customMetrics"] for p in umjoin.recentProgress if p["stateOperators"]}
    # (Changes of the slices' widths alone, balancing their rows, may come before: the counts are what this test is about.)
    counts = {batch: [item["timeSlices"] for item in slicing] for batch, slicing in recorded_slicings(tmp_path / "ck-on").items()}
    changed = [batch for batch in sorted(counts) if counts[batch] != [1, 1, 1]]
    assert changed, f"no change of the slice counts recorded: {counts}"
    batch = changed[0]
    # The restarted run's first batch has nothing measured yet: the first change comes after it, from its measurements.
    assert min(measured) < batch and batch - 1 in measured, (sorted(measured), batch)
    before = measured[batch - 1]
    chosen = counts[batch]
    current = 1
    for i, count in enumerate(chosen):
        combinations, tested = before[f"sliceCombinationsInput{i}"], before[f"conditionChecksInput{i}"]
        if not (combinations and tested and before["partialCombinationsShipped"]):
            assert count == current, (i, before)
            continue
        overlapped = min(current, partitions - 1)
        costs = (before[f"sliceProbeNanosInput{i}"] / tested, tested / combinations * overlapped / (overlapped + 1),
                 before["partialCombinationsShipNanos"] / before["partialCombinationsShipped"])
        times = {n: predicted_nanos(*costs, n, cores, partitions) for n in range(1, partitions + 1)}
        fastest = min(times, key=lambda n: (times[n], n))
        assert count == (fastest if times[fastest] < 0.8 * times[current] else current), (i, count, times)
    assert chosen[2] > 1, chosen  # (each row of c tested costs a UDF call more often than a row of a or b does)
    plan = executed_plan(umjoin)
    assert f"{chosen[2]} time slices per window" in plan, plan


def outer_query(spark: SparkSession, directory: Path, how: str, ways: int, for_spark: bool = False) -> DataFrame:
    """a and b within 5 minutes and 10 in price; with 2 `ways` that join is `how` (left, right, left_semi), with 3 it
    is inner and its result is joined `how` with c, within 5 minutes of b and c's price above b's. No equality
    (`for_spark`: each join with one that always holds, `constant_key`, so that Spark runs it)."""
    frames = {n: stream(spark, directory / n, columns(n)).withWatermark(f"{n}_ts", "10 minutes") for n in NAMES[:ways]}
    runnable = constant_key if for_spark else lambda condition, _left, _right: condition
    on_b = runnable(F.col("b_ts").between(F.col("a_ts") - NEAR, F.col("a_ts") + NEAR) & (F.abs(F.col("a_p") - F.col("b_p")) < 10), "a", "b")
    if ways == 2:
        return frames["a"].join(frames["b"], on_b, how)
    ab = frames["a"].join(frames["b"], on_b).withMetadata("a_ts", {})  # (one event-time column per side)
    return ab.join(frames["c"], runnable(F.col("c_ts").between(F.col("b_ts") - NEAR, F.col("b_ts") + NEAR) & (F.col("c_p") > F.col("b_p")), "b", "c"), how)


def outer_nested_loop(streams: dict[str, list[tuple]], how: str, ways: int) -> list[tuple]:  # type: ignore[type-arg]
    """`outer_query`'s result over all rows, every combination tested; NULLs for the padded side (a NULL price matches nothing)."""
    def near_b(a: tuple, b: tuple) -> bool:  # type: ignore[type-arg]
        return None not in (a[1], b[1]) and abs(a[2] - b[2]) <= NEAR and abs(a[1] - b[1]) < 10

    if ways == 2:
        left, right, matches = [(a,) for a in streams["a"]], [(b,) for b in streams["b"]], lambda l, r: near_b(l[0], r[0])
    else:
        left = [(a, b) for a in streams["a"] for b in streams["b"] if near_b(a, b)]
        right = [(c,) for c in streams["c"]]
        matches = lambda l, r: None not in (r[0][1], l[1][1]) and abs(r[0][2] - l[1][2]) <= NEAR and r[0][1] > l[1][1]  # noqa: E731
    flat = lambda rows: tuple(v for row in rows for v in row)  # noqa: E731
    nulls = lambda width: (None,) * (3 * width)  # noqa: E731
    out = [flat(l) + flat(r) for l in left for r in right if matches(l, r)] if how != "left_semi" else []
    if how == "left":
        out += [flat(l) + nulls(1) for l in left if not any(matches(l, r) for r in right)]
    if how == "right":
        out += [nulls(1 if ways == 2 else 2) + flat(r) for r in right if not any(matches(l, r) for l in left)]
    if how == "left_semi":
        out += [flat(l) for l in left if any(matches(l, r) for r in right)]
    return sorted(out, key=nulls_first)


@pytest.mark.parametrize(("how", "ways"), [("left", 2), ("right", 3), ("left_semi", 3)])
def test_outer_and_semi_joins_without_an_equality_run_and_equal_a_nested_loop(spark: SparkSession, tmp_path: Path, how: str, ways: int) -> None:
    """Spark refuses them as it refuses inner ones. With UMJoin, all rows in one micro-batch, then one whose
    watermark ends every window: the nested loop's rows, each padded row once its window ended (NULL prices too:
    they match nothing). Against Spark's joins micro-batch by micro-batch: the random cases below."""
    rng = random.Random(ways)
    streams = random_rows(rng, users_data=True)
    ending = {name: [(9, 0, BASE + datetime.timedelta(days=2, minutes=n))] for n, name in enumerate(NAMES)}
    for name, rows in streams.items():
        write_batches(tmp_path / name, columns(name), [rows, ending[name]])
    with temporary_conf(spark, {"spark.sql.shuffle.partitions": "2"}):
        umjoin, whole = run_by_batch(outer_query(spark, tmp_path, how, ways), tmp_path / "ck")

    plan = executed_plan(umjoin)
    assert "StreamingUMJoin inputs=" in plan and "StreamingSymmetricHashJoin" not in plan, plan
    # Every padded row when the watermark ends its window: none while the first micro-batch sets no watermark.
    # The rows of the last micro-batch (key 9) wait for a later one.
    assert sorted((row for row, batches in whole.items() for _ in batches if 9 not in row), key=nulls_first) \
        == outer_nested_loop(streams, how, ways)
    # Padded: a side's event time NULL (never NULL in the data, unlike its keys and prices).
    padded = [row for row in whole if row[2] is None or row[-1] is None]
    # (as many times as the nested loop has them, above: each copy after the first micro-batch)
    assert all(batch > 0 for row in padded for batch in whole[row]) and (padded or how == "left_semi")


@dataclasses.dataclass(frozen=True)
class WindowCase:
    """A random case of the window joins: `how` the query's join (inner: `band_query`, `keyed` or not; else
    `outer_query` of `ways` streams), its streams' rows, and how it runs."""
    how: str
    ways: int
    keyed: bool
    provider: str
    restart: bool
    streams: dict[str, list[tuple]]  # type: ignore[type-arg]

    def query(self, spark: SparkSession, directory: Path, for_spark: bool) -> DataFrame:
        if self.how == "inner":
            return band_query(spark, directory, self.keyed, for_spark=for_spark)
        return outer_query(spark, directory, self.how, self.ways, for_spark)

    def preserved(self) -> tuple[str, ...]:
        """The stream no join filters by its prices or keys: an outer join's preserved side, where that is one stream."""
        return {(2, "left"): ("a",), (2, "right"): ("b",), (3, "right"): ("c",)}.get((self.ways, self.how), ())

    def counted(self, streams: dict[str, Batches]) -> dict[str, Batches]:
        """The streams as Spark's watermarks see them (stream_data.seen_by_watermarks over keys and prices)."""
        return stream_data.seen_by_watermarks(streams, [0, 1], self.preserved())

    def marks(self, streams: dict[str, Batches]) -> list[int]:
        counted = self.counted(streams)
        return stream_data.watermarks(counted, 2, {name: DELAY_MS for name in counted}, stream_data.policy_for(counted))

    def compared(self) -> list[tuple[str, str, str, list[int]]]:
        """Per join and side: its type, the side, a stream there and the columns of it the join compares (prices;
        a's and c's keys too in a keyed band join)."""
        first = [("inner" if self.ways == 3 else self.how, "left", "a", [1]), ("inner" if self.ways == 3 else self.how, "right", "b", [1])]
        if self.ways == 2:
            return first
        keys = [0, 1] if self.keyed and self.how == "inner" else [1]
        return [*first, (self.how, "left", "a", keys), (self.how, "left", "b", [1]), (self.how, "right", "c", keys)]


def extreme(seed: int) -> bool:
    """Whether a random window join's streams are users' data at its edges: each has every key and price NULL, or
    no row, in turn (few rows, in few micro-batches: such a case is cheap)."""
    return random.Random(700 + seed).random() < 0.4


def window_case(seed: int) -> WindowCase:
    rng = random.Random(seed)
    how = rng.choice(["inner", "inner", "left", "right", "left_semi"])
    ways = 3 if how == "inner" else rng.choice([2, 3])
    extremes: dict[str, str] = {}
    if extreme(seed):
        edges = [stream_data.ALL_NULL, stream_data.NO_ROWS]
        first = rng.randrange(2)
        extremes = {name: edges[(first + i) % 2] for i, name in enumerate(NAMES[:ways])}
    return WindowCase(how, ways, rng.random() < 0.5, rng.choice(["hdfs", "rocksdb"]), rng.random() < 0.4,
                      random_rows(rng, NAMES[:ways], users_data=True, extremes=extremes))


def window_streams(seed: int) -> dict[str, Batches]:
    """The case's rows in the micro-batches `in_batches` cuts (in at most 2 in an `extreme` case), each micro-batch's
    latest row with a key and a price (so that Spark's IS NOT NULL below the watermark never moves it), and rows put
    exactly at the watermarks Spark's joins run with (`WindowCase.marks`)."""
    case, rng = window_case(seed), random.Random(1000 + seed)
    streams = in_batches(case.streams, rng, 1 if extreme(seed) else 4, at_watermarks=False)
    for batches in streams.values():
        for batch in ([] if stream_data.all_null(batches, [0, 1]) else batches):
            stream_data.key_latest_row(batch, 2, lambda row: (rng.randrange(3), rng.randrange(100), row[2]))
    counted = case.counted(streams)
    stream_data.put_at_watermarks(rng, counted, 2, {name: DELAY_MS for name in counted}, policy=stream_data.policy_for(counted))
    return streams


def window_coverage(seeds: tuple[int, ...]) -> dict[tuple[str, str], set[str]]:
    """Per join type and side, what the seeds' streams there hold (stream_data.features over the compared columns)."""
    covered: dict[tuple[str, str], set[str]] = {}
    for seed in seeds:
        streams, case = window_streams(seed), window_case(seed)
        marks = case.marks(streams)
        for how, side, name, compared in case.compared():
            covered.setdefault((how, side), set()).update(stream_data.features(streams[name], compared, 2, marks))
    return covered


# Cases that together hold every feature of users' data on both sides of every join type, five of them not
# `extreme` of every join type, keyed and not, restarted and not, on either state store (found by a search over seeds).
WINDOW_SEEDS = (1, 2, 7, 11, 12, 17, 23, 30, 33, 80, 293)


def test_the_random_window_joins_hold_users_data_on_both_sides_of_every_join_type() -> None:
    cases = [window_case(seed) for seed in WINDOW_SEEDS if not extreme(seed)]
    assert {c.how for c in cases} == {"inner", "left", "right", "left_semi"} and {c.keyed for c in cases if c.how == "inner"} == {True, False}
    assert {c.restart for c in cases} == {True, False} and {c.provider for c in cases} == {"hdfs", "rocksdb"}
    wanted = {(how, side): stream_data.FEATURES for how in ("inner", "left", "right", "left_semi") for side in ("left", "right")}
    lacking = stream_data.missing(window_coverage(WINDOW_SEEDS), wanted)
    assert not lacking, lacking


@pytest.mark.parametrize("seed", WINDOW_SEEDS)
def test_random_window_joins_put_out_what_sparks_joins_put_out_micro_batch_by_micro_batch(spark: SparkSession, tmp_path: Path, seed: int) -> None:
    """Band joins of three streams (keyed or not) and outer and semi joins of two or three, over users' data (NULL
    keys and prices, all of them in some streams, streams without rows, late rows, rows at the watermark, empty
    micro-batches), random micro-batches, a restart from the checkpoint halfway or none, HDFS or RocksDB state.
    The reference is Spark's own joins of the same rows (UMJoin off, each join with an equality that always
    holds: `constant_key`), micro-batch by micro-batch. (The nested loops are the fixed tests' references.)"""
    case = window_case(seed)
    streams = window_streams(seed)
    for name, batches in streams.items():
        write_batches(tmp_path / name, columns(name), batches)
    settings = {"spark.sql.shuffle.partitions": "2", **(ROCKSDB if case.provider == "rocksdb" else {}), **stream_data.policy_settings(case.counted(streams))}

    def run(name: str, for_spark: bool) -> tuple:  # type: ignore[type-arg]
        if not case.restart:
            return run_by_batch(case.query(spark, tmp_path, for_spark), tmp_path / f"ck-{name}")
        put_back = hold_back_second_half(tmp_path, list(streams))
        _, first = run_by_batch(case.query(spark, tmp_path, for_spark), tmp_path / f"ck-{name}")
        put_back()
        return run_by_batch(case.query(spark, tmp_path, for_spark), tmp_path / f"ck-{name}", first)

    with temporary_conf(spark, settings):
        umjoin, on = run("on", False)
        with temporary_conf(spark, SPARK_JOINS):
            spark_joins, off = run("off", True)

    plan = executed_plan(umjoin)
    # (At least one: seed 293, a LEFT join above a band join, was one group in one run and two in another;
    # the rows were Spark's both times. Why the grouping varies is open.)
    assert plan.count("StreamingUMJoin inputs=") >= 1 and "StreamingSymmetricHashJoin" not in plan, plan
    spark_plan = executed_plan(spark_joins)
    assert spark_plan.count("StreamingSymmetricHashJoin") == case.ways - 1 and "StreamingUMJoin" not in spark_plan, spark_plan
    assert on == off  # the same rows, each put out in the same micro-batch
    if not case.restart:  # (a restart runs a micro-batch without new rows where the stop came: the watermarks shift by one batch)
        stream_data.assert_watermarks(spark_joins, case.marks(streams))  # the rows put at watermarks are at Spark's


def test_a_join_without_an_equality_or_a_time_bound_is_refused_with_what_is_missing(spark: SparkSession, tmp_path: Path) -> None:
    write_in_batches(tmp_path, random_rows(random.Random(3)), None)
    a, b = (stream(spark, tmp_path / n, columns(n)) for n in ("a", "b"))

    def refusal(df: DataFrame) -> str:
        query = df.writeStream.format("noop").option("checkpointLocation", str(tmp_path / f"ck{random.random()}")).trigger(availableNow=True).start()
        with pytest.raises(StreamingQueryException) as failed:
            query.awaitTermination()
        return str(failed.value)

    unbounded = a.withWatermark("a_ts", "10 minutes").join(b.withWatermark("b_ts", "10 minutes"), F.col("a_p") < F.col("b_p"))
    message = refusal(unbounded)
    assert "has no equality between its sides" in message and "does not bound the left side's event time by the other side's" in message, message
    assert "(a_p < b_p)" in message
    # An outer join: Spark's own check (as the query starts) names a missing bound of its preserved side; UMJoin the other side's.
    a_marked, b_marked = a.withWatermark("a_ts", "10 minutes"), b.withWatermark("b_ts", "10 minutes")
    with pytest.raises(AnalysisException, match="LeftOuter join .* not supported without a watermark in the join keys, or a watermark on the nullable side"):
        a_marked.join(b_marked, F.col("b_ts") > F.col("a_ts"), "left").writeStream.format("noop").start()
    message = refusal(a_marked.join(b_marked, F.col("b_ts") < F.col("a_ts"), "left"))
    assert "does not bound the right side's event time by the other side's" in message, message
    no_watermark = a.withWatermark("a_ts", "10 minutes").join(b, F.col("b_ts").between(F.col("a_ts"), F.col("a_ts") + F.expr("interval 1 minute")))
    message = refusal(no_watermark)
    assert "its right side has no event-time column with a watermark (withWatermark)" in message, message
