"""A stateful operator above a StreamingUMJoin: Spark gives it the watermark the joins put out (each join's
lower state watermark, going up its tree), and a windowed aggregation in append mode puts a window out in
the micro-batch that watermark passes its end. The StreamingUMJoin must put out the watermark Spark's top
join would, whatever its joins' time ranges and however its state is kept (by key, or time-sliced for a
join without an equality); else the aggregation above puts windows out in other micro-batches, or drops
other rows as late. Checked micro-batch by micro-batch against Spark's joins (UMJoin off), users' data.
"""

from __future__ import annotations

import random
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import stream_data
import test_streaming_chains as chains
import test_streaming_window_joins as windows
from test_streaming import ROCKSDB, SPARK_JOINS, executed_plan, run_by_batch
from umjoin.local import temporary_conf


def counted_by_window(df: DataFrame, time: str, value: str, minutes: int = 10) -> DataFrame:
    """Rows and a sum per window of `time`: Spark puts a window out once the watermark passes its end."""
    return df.groupBy(F.window(time, f"{minutes} minutes").alias("w")).agg(F.count("*").alias("n"), F.sum(value).alias("total"))


def test_an_aggregation_above_a_chain_puts_out_each_window_in_sparks_micro_batch(spark: SparkSession, tmp_path: Path) -> None:
    """x joined inner with y, a LEFT join with z1 padded by the watermark, an inner join with z2: each on keys and a
    time range (test_streaming_chains.chain_query), the aggregation by x's event time."""
    sides, with_y = [("left", "k"), ("inner", "j")], True
    names = chains.chain_names(sides, with_y, frozenset())
    streams = chains.draw_streams(names, random.Random(21), most_cuts=4, null_keys=None)
    chains.write_streams(tmp_path, streams)

    def query() -> DataFrame:
        return counted_by_window(chains.chain_query(spark, tmp_path, sides, with_y), "x_ts", "x_v")

    settings = {"spark.sql.shuffle.partitions": "2", **ROCKSDB, **stream_data.policy_settings(streams)}
    with temporary_conf(spark, settings):
        umjoin, on = run_by_batch(query(), tmp_path / "ck-on")
        with temporary_conf(spark, SPARK_JOINS):
            _, off = run_by_batch(query(), tmp_path / "ck-off")
    plan = executed_plan(umjoin)
    assert plan.count("StreamingUMJoin inputs=") == 1 and "StreamingSymmetricHashJoin" not in plan, plan
    assert len({batch for batches in off.values() for batch in batches}) >= 2, off  # windows put out in several micro-batches
    assert on == off  # each window's row, in the micro-batch Spark's aggregation puts it out


def test_an_aggregation_above_a_time_sliced_band_join_puts_out_each_window_in_sparks_micro_batch(
        spark: SparkSession, tmp_path: Path) -> None:
    """The band join of three streams without an equality (its state time-sliced); Spark runs it given an equality
    that always holds. The aggregation counts by c's event time, whose watermark the top join puts out (2-minute
    windows: the rows span 30 minutes, and the joins' output watermark trails them by the 10-minute delay and
    the joins' time ranges)."""
    rng = random.Random(3)
    streams = windows.in_batches(windows.random_rows(rng, users_data=True), rng)
    for name, batches in streams.items():
        windows.write_batches(tmp_path / name, windows.columns(name), batches)

    def query(for_spark: bool) -> DataFrame:
        return counted_by_window(windows.band_query(spark, tmp_path, keyed=False, for_spark=for_spark), "c_ts", "c_p", 2)

    with temporary_conf(spark, {"spark.sql.shuffle.partitions": "2", **stream_data.policy_settings(streams)}):
        umjoin, on = run_by_batch(query(False), tmp_path / "ck-on")
        with temporary_conf(spark, SPARK_JOINS):
            _, off = run_by_batch(query(True), tmp_path / "ck-off")
    plan = executed_plan(umjoin)
    assert "umjoin_time_slice" in plan and "StreamingSymmetricHashJoin" not in plan, plan
    assert len({batch for batches in off.values() for batch in batches}) >= 2, off
    assert on == off
