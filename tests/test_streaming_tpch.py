"""The join blocks of the paper's 11 TPC-H queries (000, Table 3) run as streams: every table a
Parquet file stream read over 3 micro-batches at SF 0.01. Each block Spark can run as a stream
must run as one StreamingUMJoin, keeping no stream-stream join of Spark's, and give the batch answer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest
from pyspark.errors.exceptions.captured import AnalysisException
from pyspark.sql import SparkSession

from conftest import TPCH_SF
from test_streaming import executed_plan
from umjoin import streams, tpch
from umjoin.local import temporary_conf

MICRO_BATCHES = 3


@pytest.fixture(scope="module")
def streaming(spark: SparkSession, tpch_data: Path) -> Iterator[SparkSession]:
    """A session of its own (its own temporary views) where every TPC-H table is a file stream."""
    session = spark.newSession()
    session.conf.set("spark.sql.shuffle.partitions", "2")
    streams.read_streams(session, streams.tpch_streams(TPCH_SF, MICRO_BATCHES), tpch.TABLES, tpch_data)
    yield session


def test_join_blocks_are_the_queries_joins_without_subqueries() -> None:
    q21 = streams.join_block(21)
    assert q21.startswith("SELECT *\nFROM supplier, lineitem AS l1, orders, nation\n")
    assert "EXISTS" not in q21.upper() and "o_orderstatus = 'F'" in q21
    q7 = streams.join_block(7)  # the derived table's join, its OR kept whole
    assert "FROM supplier, lineitem, orders, customer, nation AS n1, nation AS n2" in q7
    assert "AND ((n1.n_name = 'FRANCE' AND n2.n_name = 'GERMANY') OR" in q7
    assert streams.join_block(15).startswith("WITH revenue AS")


@pytest.mark.parametrize("number", [q for q in streams.PAPER_QUERIES if q != 15])
def test_paper_join_block_runs_as_one_streaming_umjoin_with_the_batch_answer(spark: SparkSession, streaming: SparkSession, tmp_path: Path, number: int) -> None:
    sql = streams.join_block(number)
    query = (streaming.sql(sql).writeStream.format("memory").queryName(f"tpch_block_{number}")
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    query.awaitTermination()
    plan = executed_plan(query)
    assert plan.count("StreamingUMJoin inputs=") == 1 and "StreamingSymmetricHashJoin" not in plan, plan
    assert sum(1 for p in query.recentProgress if p["numInputRows"] > 0) >= MICRO_BATCHES

    streamed = streaming.table(f"tpch_block_{number}")
    # The reference: the same block over the tables as batch views, joined by Spark (UMJoin off in both
    # sessions, so neither the cached join nor a comparison that joined again would run UMJoin's code),
    # once for the comparisons: cached, and materialised by the count while UMJoin is off.
    with temporary_conf(spark, {"spark.umjoin.enabled": "false"}), temporary_conf(streaming, {"spark.umjoin.enabled": "false"}):
        batch = spark.sql(sql).persist()
        try:
            assert batch.count() > 0
            reference = batch._jdf.queryExecution().executedPlan().toString()  # (the cached join's plan under it)
            assert "Join" in reference and "UMJoin" not in reference, reference
            assert streamed.count() == batch.count()
            assert streamed.exceptAll(batch).count() == 0 and batch.exceptAll(streamed).count() == 0
        finally:
            batch.unpersist()  # (a failed block's cached join would otherwise stay in the session's memory for the rest of the suite)


def test_q15_block_is_refused_by_spark_itself_as_a_stream(streaming: SparkSession, tmp_path: Path) -> None:
    """Why Q15 does not convert: its block joins a view that aggregates a stream, which Spark does not
    run in append mode without a watermark (with UMJoin on or off, before any join is planned)."""
    with pytest.raises(AnalysisException, match="not supported for streaming aggregations without watermark"):
        streaming.sql(streams.join_block(15)).writeStream.format("memory").queryName("tpch_block_15") \
            .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start()
