"""Until the streaming hook exists, Structured Streaming joins must stay exactly as Spark plans them."""

from __future__ import annotations

from pathlib import Path

import duckdb
from pyspark.sql import SparkSession

from umjoin.local import temporary_conf


def test_stream_stream_joins_keep_spark_operators_and_answers(spark: SparkSession, tmp_path: Path) -> None:
    con = duckdb.connect()
    for name in "xyz":
        (tmp_path / name).mkdir()
        con.execute(
            f"COPY (SELECT i % 5 AS {name}_k, i AS {name}_v FROM range(30) r(i)) "
            f"TO '{tmp_path / name / 'part-0.parquet'}' (FORMAT parquet)"
        )
    streams = {n: spark.readStream.schema(f"{n}_k BIGINT, {n}_v BIGINT").parquet(str(tmp_path / n)) for n in "xyz"}
    x, y, z = streams["x"], streams["y"], streams["z"]
    joined = x.join(y, x["x_k"] == y["y_k"]).join(z, y["y_k"] == z["z_k"])

    query = (
        joined.writeStream.format("memory")
        .queryName("three_streams")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    plan = query._jsq.streamingQuery().lastExecution().executedPlan().toString()
    streamed = sorted(tuple(r) for r in spark.table("three_streams").collect())

    assert "StreamingSymmetricHashJoin" in plan and "UMJoin" not in plan
    batch = {n: spark.read.parquet(str(tmp_path / n)) for n in "xyz"}
    bx, by, bz = batch["x"], batch["y"], batch["z"]
    with temporary_conf(spark, {"spark.umjoin.enabled": "false"}):
        expected = sorted(tuple(r) for r in bx.join(by, bx["x_k"] == by["y_k"]).join(bz, by["y_k"] == bz["z_k"]).collect())
    assert streamed == expected and len(expected) == 30 * 6 * 6
