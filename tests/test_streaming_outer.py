"""Streaming UMJoin with an outer join on top: three streams joined inner, a fourth LEFT OUTER (or
RIGHT OUTER, sides swapped) on a key and a time range, with watermarks. The whole tree must run as
one StreamingUMJoin and give what Spark's chained stream-stream joins give (UMJoin off): the same
rows, the NULL-padded ones too, each put out no later than Spark puts it out and never before the
watermark rules out a match; a restart mid-stream writes every row once.
"""

from __future__ import annotations

import datetime
import random
from collections.abc import Callable
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from test_streaming import ROCKSDB, SPARK_JOINS, executed_plan, run_by_batch, run_to_end, sorted_rows, stream, write_batches
from umjoin.local import temporary_conf

BASE = datetime.datetime(2026, 1, 1)
DELAY = "15 minutes"  # every stream's watermark delay
NEAR_MINUTES = 5  # the joins' time range: within 5 minutes of x_ts


def columns(name: str) -> str:
    return f"{name}_k BIGINT, {name}_j BIGINT, {name}_ts TIMESTAMP, {name}_v BIGINT"


def random_streams(directory: Path, seed: int, minutes: int = 90) -> None:
    """Rows of w, x, y and z over `minutes` of event time, a few minutes out of order within their watermark's delay (a few a day
    late), cut at random into micro-batches (one file each), then one batch per stream far in the
    future that joins nothing: its watermark lets every waiting combination go."""
    rng = random.Random(seed)
    for n, name in enumerate("wxyz"):
        rows = []
        for _ in range(rng.randint(30, 60)):
            at = BASE + datetime.timedelta(minutes=rng.uniform(0, minutes))
            rows.append((at, (rng.randrange(6), rng.randrange(3), at, rng.randrange(1000))))
        # Out of order within the delay: sorted by a jittered time, rows up to 8 minutes late stay in.
        rows.sort(key=lambda r: r[0] + datetime.timedelta(minutes=rng.uniform(0, 8)))
        data = [r[1] for r in rows]
        late = rng.sample(range(len(data)), 2)
        for i in late:
            if i > len(data) // 2:
                data[i] = (data[i][0], data[i][1], BASE - datetime.timedelta(days=1), data[i][3])
        # 3-5 micro-batches (they were 4-9): enough for watermarks to evict, pad and drop late rows; each one a
        # micro-batch of both queries, seconds each.
        cuts = sorted(rng.randint(0, len(data)) for _ in range(rng.randint(2, 4)))
        batches = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)])]
        far = (1000 + n, 1000 + n, BASE + datetime.timedelta(days=2), 0)
        write_batches(directory / name, columns(name), [*batches, [far]])


def outer_query(spark: SparkSession, directory: Path, how: str) -> DataFrame:
    """x, y and w within 5 minutes of x (y on k, w on j), then z on k within 5 minutes of x: `left` or
    `right` outer, or `semi` (the combinations some z row matches with z_v + w_v > y_v, once each)."""
    f = {n: stream(spark, directory / n, columns(n)).withWatermark(f"{n}_ts", DELAY) for n in "wxyz"}
    near = lambda a, b: a.between(b - F.expr(f"interval {NEAR_MINUTES} minutes"), b + F.expr(f"interval {NEAR_MINUTES} minutes"))  # noqa: E731
    # Spark's outer join needs one event-time column on its preserved side: y's and w's are dropped.
    inner = (f["x"].join(f["y"], (F.col("x_k") == F.col("y_k")) & near(F.col("y_ts"), F.col("x_ts"))).drop("y_ts")
             .join(f["w"], (F.col("x_j") == F.col("w_j")) & near(F.col("w_ts"), F.col("x_ts"))).drop("w_ts"))
    on = (F.col("x_k") == F.col("z_k")) & near(F.col("z_ts"), F.col("x_ts"))
    if how == "semi":  # reading y and w keeps Spark's optimizer from pushing the semi join below the inner ones
        return inner.join(f["z"], on & (F.col("z_v") + F.col("w_v") > F.col("y_v")), "left_semi")
    if how == "semi pushed down":  # the semi join reads x alone: Spark joins x with z first
        return inner.join(f["z"], on, "left_semi")
    return inner.join(f["z"], on, "left_outer") if how == "left" else f["z"].join(inner, on, "right_outer")


def hold_back_second_half(directory: Path, names: list[str]) -> Callable[[], None]:
    """Moves the second half of each stream's files (by name: batch order) out of `directory`; returns what puts them back."""
    held = []
    for name in names:
        files = sorted((directory / name).glob("*.parquet"))
        for f in files[len(files) // 2:]:
            target = directory / "held" / name / f.name
            target.parent.mkdir(parents=True, exist_ok=True)
            held.append((f.rename(target), f))

    def put_back() -> None:
        for target, f in held:
            target.rename(f)
    return put_back


def umjoin_operator(query: StreamingQuery) -> dict:  # type: ignore[type-arg]
    """The StreamingUMJoin's entry in the query's last progress (the replaced joins' ids have entries of their own)."""
    return next(op for op in query.lastProgress["stateOperators"] if op["operatorName"] == "umJoin")


@pytest.mark.parametrize(("seed", "how", "provider"), [(0, "left", "hdfs"), (2, "right", "rocksdb")])
def test_an_outer_join_on_top_runs_inside_the_streaming_umjoin_like_sparks_joins(
        spark: SparkSession, tmp_path: Path, seed: int, how: str, provider: str) -> None:
    random_streams(tmp_path, seed)
    settings = {"spark.sql.shuffle.partitions": "2", **(ROCKSDB if provider == "rocksdb" else {})}
    with temporary_conf(spark, settings):
        umjoin, on = run_by_batch(outer_query(spark, tmp_path, how), tmp_path / "ck-on")
        with temporary_conf(spark, SPARK_JOINS):
            spark_joins, off = run_by_batch(outer_query(spark, tmp_path, how), tmp_path / "ck-off")

    plan = executed_plan(umjoin)
    assert plan.count("StreamingUMJoin inputs=") == 1 and "StreamingSymmetricHashJoin" not in plan, plan
    assert "left outer: padded with NULLs once the watermark rules out a match" in plan and "ON #" in plan, plan
    z_ts = 3 if how == "right" else -2  # where z's event time is in a result row: NULL where no z row matched
    padded = [row for row in on if row[z_ts] is None]
    matched = [row for row in on if row[z_ts] is not None]
    assert padded and matched

    # Every row comes out in the micro-batch Spark's joins put it out in: a match when its last row
    # arrived, a NULL-padded combination when the outer join evicts it, once the watermark is past its x_ts + 5 minutes.
    assert on == off
    watermark = {p["batchId"]: datetime.datetime.fromisoformat(p["eventTime"]["watermark"].rstrip("Z")) for p in umjoin.recentProgress}
    x_ts = 2 if how == "left" else 6
    assert all(row[x_ts] + datetime.timedelta(minutes=NEAR_MINUTES) <= watermark[b] for row in padded for b in on[row])

    def metric(query: StreamingQuery, name: str) -> int:
        return sum(op["customMetrics"].get(name, 0) for p in query.recentProgress for op in p["stateOperators"])

    outer_input = 0 if how == "right" else 3
    assert metric(umjoin, f"nullPaddedInput{outer_input}") == sum(len(on[row]) for row in padded)

    def dropped(query: StreamingQuery) -> int:
        return sum(op["numRowsDroppedByWatermark"] for p in query.recentProgress for op in p["stateOperators"])

    assert dropped(umjoin) == dropped(spark_joins) > 0


def test_a_semi_join_on_top_puts_each_combination_out_once_at_its_first_match_like_spark(spark: SparkSession, tmp_path: Path) -> None:
    random_streams(tmp_path, 4, minutes=60)
    settings = {"spark.sql.shuffle.partitions": "2", **ROCKSDB}
    with temporary_conf(spark, settings):
        umjoin, on = run_by_batch(outer_query(spark, tmp_path, "semi"), tmp_path / "ck-on")
        with temporary_conf(spark, SPARK_JOINS):
            _, off = run_by_batch(outer_query(spark, tmp_path, "semi"), tmp_path / "ck-off")

    plan = executed_plan(umjoin)
    assert plan.count("StreamingUMJoin inputs=") == 1 and "StreamingSymmetricHashJoin" not in plan, plan
    assert "left semi: unmatched combinations wait for it" in plan and "#3: #3" not in plan, plan  # z starts no route
    assert on == off and on  # the same rows, as many times, each in the same micro-batch as Spark's join puts it out
    dropped = sum(op["customMetrics"].get("semiDroppedInput3", 0) for p in umjoin.recentProgress for op in p["stateOperators"])
    assert dropped > 0


def test_a_semi_join_spark_pushed_below_the_inner_joins_runs_inside_the_streaming_umjoin_like_spark(spark: SparkSession, tmp_path: Path) -> None:
    """Spark's optimizer pushes a semi join reading x alone below the inner joins: (x SEMI z) JOIN y JOIN w.
    The whole tree is one StreamingUMJoin, and every micro-batch puts out what Spark's joins put out in it:
    a combination in the batch of its last row or of its x row's first z match, whichever is later (Spark's
    semi join puts x out then), and not where the joins above drop that x row as late."""
    random_streams(tmp_path, 8, minutes=60)
    with temporary_conf(spark, {"spark.sql.shuffle.partitions": "2"}):
        umjoin, on = run_by_batch(outer_query(spark, tmp_path, "semi pushed down"), tmp_path / "ck-on")
        with temporary_conf(spark, SPARK_JOINS):
            spark_joins, off = run_by_batch(outer_query(spark, tmp_path, "semi pushed down"), tmp_path / "ck-off")
    plan = executed_plan(umjoin)
    spark_plan = executed_plan(spark_joins)
    top_join = next(line for line in spark_plan.splitlines() if "Join " in line)
    assert "LeftSemi" in spark_plan and "LeftSemi" not in top_join, spark_plan  # pushed down, as the test means
    assert plan.count("StreamingUMJoin inputs=") == 1 and "StreamingSymmetricHashJoin" not in plan, plan
    assert "left semi: unmatched combinations wait for it" in plan, plan
    assert on == off and len(on) > 5


def test_an_outer_join_restarted_mid_stream_writes_every_row_once(spark: SparkSession, tmp_path: Path) -> None:
    """Stopped after half of the micro-batches (combinations wait to be padded then), restarted from the
    checkpoint: the file sink holds every row once, the NULL-padded ones too, as Spark's joins give them."""
    data = tmp_path / "data"
    random_streams(data, 5, minutes=40)
    put_back = hold_back_second_half(data, list("wxyz"))

    def start(trigger: dict[str, object]) -> StreamingQuery:
        return (outer_query(spark, data, "left").writeStream.format("parquet").option("path", str(tmp_path / "out"))
                .option("checkpointLocation", str(tmp_path / "ck")).trigger(**trigger).start())

    with temporary_conf(spark, {"spark.sql.shuffle.partitions": "2", **ROCKSDB}):
        running = start({"processingTime": "100 milliseconds"})
        running.processAllAvailable()
        running.stop()
        padded_before_stop = umjoin_operator(running)["customMetrics"]["nullPaddedInput3"]
        put_back()
        restarted = start({"availableNow": True})
        restarted.awaitTermination()
        plan = executed_plan(restarted)
        with temporary_conf(spark, SPARK_JOINS):
            expected, _ = run_to_end(outer_query(spark, data, "left"), "outer_restart_off", tmp_path / "ck-off")

    written = sorted_rows(spark.read.parquet(str(tmp_path / "out")))
    assert plan.count("StreamingUMJoin inputs=") == 1 and "StreamingSymmetricHashJoin" not in plan
    padded_after_restart = sum(row[-2] is None for row in written) - padded_before_stop
    assert padded_after_restart > 0  # the stop left combinations waiting to be padded in the checkpoint
    assert written == expected


def test_an_outer_join_whose_non_preserved_side_is_a_join_takes_that_join_as_one_input(spark: SparkSession, tmp_path: Path) -> None:
    """(w JOIN x) LEFT OUTER JOIN (y JOIN z): the side padded with NULLs is a join tree. The group is cut
    there: y JOIN z runs on its own (here Spark's join; a StreamingUMJoin of two inputs with spark.umjoin.minInputs=2,
    as the random chains of test_streaming_chains.py run their join-tree sides) and its output is one stream input of
    the StreamingUMJoin of w, x and it, padded where Spark's outer join pads."""
    random_streams(tmp_path, 7)

    def query() -> DataFrame:
        f = {n: stream(spark, tmp_path / n, columns(n)).withWatermark(f"{n}_ts", DELAY) for n in "wxyz"}
        near = lambda a, b: a.between(b - F.expr("interval 5 minutes"), b + F.expr("interval 5 minutes"))  # noqa: E731
        left = f["w"].join(f["x"], (F.col("w_k") == F.col("x_k")) & near(F.col("x_ts"), F.col("w_ts"))).drop("x_ts")
        right = f["y"].join(f["z"], (F.col("y_j") == F.col("z_j")) & near(F.col("z_ts"), F.col("y_ts"))).drop("z_ts")
        return left.join(right, (F.col("w_k") == F.col("y_k")) & near(F.col("y_ts"), F.col("w_ts")), "left_outer")

    with temporary_conf(spark, {"spark.sql.shuffle.partitions": "2", "spark.umjoin.minInputs": "3"}):
        running, on = run_by_batch(query(), tmp_path / "ck-on")
        with temporary_conf(spark, SPARK_JOINS):
            _, off = run_by_batch(query(), tmp_path / "ck-off")
    plan = executed_plan(running)
    assert plan.count("StreamingSymmetricHashJoin") == 1, plan
    assert plan.count("StreamingUMJoin inputs=") == 1, plan
    assert plan.count("padded with NULLs once the watermark rules out a match") == 1, plan
    assert on == off  # each row put out in the micro-batch Spark's joins put it out
    assert any(row[-1] is None for row in on) and any(row[-1] is not None for row in on)


@pytest.mark.parametrize(("seed", "second_key"), [(11, "j"), (12, "k")])
def test_a_full_outer_join_above_a_streaming_umjoin_reads_its_rows_partitioned_by_its_key(
        spark: SparkSession, tmp_path: Path, seed: int, second_key: str) -> None:
    """Spark put no exchange under the full outer join (which no StreamingUMJoin takes): the inner joins below put out
    their rows partitioned by its key. A StreamingUMJoin on two keys (w and z on j) puts a result out where its last
    store probed is, so its rows are shuffled for the join above (without that: rows missing, rows padded that
    matched). One on one key (all on k) puts each result out in the partition of its key (every route runs where its
    start row is), so, as over Spark's joins, there is no exchange between."""
    random_streams(tmp_path, seed)
    near = lambda a, b: F.col(a).between(F.col(b) - F.expr("interval 5 minutes"), F.col(b) + F.expr("interval 5 minutes"))  # noqa: E731
    on_key = lambda a, b: F.col(f"{a}_{second_key}") == F.col(f"{b}_{second_key}")  # noqa: E731

    def query() -> DataFrame:
        f = {n: stream(spark, tmp_path / n, columns(n)).withWatermark(f"{n}_ts", DELAY) for n in "wxyz"}
        inner = (f["x"].join(f["y"], (F.col("x_k") == F.col("y_k")) & near("y_ts", "x_ts")).drop("y_ts")
                 .join(f["w"], on_key("x", "w") & near("w_ts", "x_ts")).drop("w_ts"))
        return inner.join(f["z"], on_key("w", "z") & near("z_ts", "x_ts"), "full_outer")

    with temporary_conf(spark, {"spark.sql.shuffle.partitions": "2"}):
        umjoin, on = run_by_batch(query(), tmp_path / "ck-on")
        with temporary_conf(spark, SPARK_JOINS):
            _, off = run_by_batch(query(), tmp_path / "ck-off")

    assert any(None in row for row in on) and on == off  # (each row put out in the same micro-batch)
    plan = executed_plan(umjoin)
    assert plan.count("StreamingUMJoin inputs=") == 1 and "FullOuter" in plan, plan
    between = plan[plan.index("FullOuter"):plan.index("StreamingUMJoin inputs=")]
    assert ("Exchange hashpartitioning(w_j" in between) if second_key == "j" else ("Exchange" not in between), plan
