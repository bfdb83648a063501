"""Issue 68: a query that ran Spark's stream-stream joins, restarted with UMJoin on, switches over to one
StreamingUMJoin with the joins' state carried over (from the restart's second micro-batch: Spark checks the
checkpoint's operators against the first's plan), and answers as Spark's joins would have, micro-batch by
micro-batch. The reference is the same query with Spark's joins throughout, from its own checkpoint."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from umjoin import plans

from test_static_stores import umjoin_metric
from test_streaming import ROCKSDB, executed_plan, nulls_first, run_by_batch, stream, write_batches
from umjoin.local import temporary_conf

A, B, C = "a_k BIGINT, a_v BIGINT", "b_k BIGINT, b_j BIGINT, b_v BIGINT", "c_j BIGINT, c_v BIGINT"


def chain(spark: SparkSession, directory: Path, watermark: bool = False) -> DataFrame:
    """a JOIN b ON a_k = b_k JOIN c ON b_j = c_j, three file streams; with `watermark`, a watermark on a time
    column of a's (no join condition reads it: Spark's joins evict nothing all the same)."""
    a, b, c = (stream(spark, directory / n, cols) for n, cols in (("a", A), ("b", B), ("c", C)))
    if watermark:
        a = a.withColumn("a_t", F.timestamp_seconds("a_v")).withWatermark("a_t", "1 minute")
    return a.join(b, a.a_k == b.b_k).join(c, b.b_j == c.c_j)


def draw(rng: random.Random, batches: int) -> dict[str, list[list[tuple[int | None, ...]]]]:
    """Rows of a, b and c per micro-batch: few key values (duplicates), NULL keys, empty micro-batches."""
    def key() -> int | None:
        return rng.choice([None, *range(5)])

    def rows(width: int) -> list[tuple[int | None, ...]]:
        count = rng.choice([0, 1, 3, 6])
        return [tuple(key() for _ in range(width - 1)) + (rng.randrange(3),) for _ in range(count)]

    return {"a": [rows(2) for _ in range(batches)], "b": [rows(3) for _ in range(batches)],
            "c": [rows(2) for _ in range(batches)]}


def write_runs(directory: Path, drawn: dict[str, list[list[tuple[int | None, ...]]]], start: int, end: int) -> None:
    for name, columns in (("a", A), ("b", B), ("c", C)):
        write_batches(directory / name, columns, drawn[name][start:end])


#: The micro-batches of each run: Spark's joins, then a restart with UMJoin on, then another.
RUNS = [(0, 2), (2, 5), (5, 6)]


def run_in_three(spark: SparkSession, tmp_path: Path, drawn: dict[str, list[list[tuple[int | None, ...]]]],
                 watermark: bool = False) -> tuple[dict, dict, list[StreamingQuery]]:
    """The chain with Spark's joins throughout, and in the three RUNS (UMJoin off, then on twice): each one's
    rows by micro-batch, and the three runs' queries."""
    with temporary_conf(spark, {"spark.umjoin.enabled": "false"}):
        write_runs(tmp_path / "all", drawn, 0, RUNS[-1][1])
        _, expected = run_by_batch(chain(spark, tmp_path / "all", watermark), tmp_path / "ck-spark")
    emitted: dict = {}
    queries = []
    for run, (start, end) in enumerate(RUNS):
        write_runs(tmp_path / "in", drawn, start, end)
        with temporary_conf(spark, {"spark.umjoin.enabled": str(run > 0).lower()}):
            query, emitted = run_by_batch(chain(spark, tmp_path / "in", watermark), tmp_path / "ck", emitted)
        queries.append(query)
    return expected, emitted, queries


@pytest.mark.parametrize("state_format", ["2", "3", "4"])
def test_an_inner_chain_that_ran_sparks_joins_switches_over_on_restart_micro_batch_by_micro_batch_like_spark(
        spark: SparkSession, tmp_path: Path, state_format: str) -> None:
    drawn = draw(random.Random(int(state_format)), RUNS[-1][1])
    settings = {**ROCKSDB, "spark.sql.streaming.join.stateFormatVersion": state_format, "spark.sql.shuffle.partitions": "3"}
    with temporary_conf(spark, settings):
        expected, emitted, queries = run_in_three(spark, tmp_path, drawn)
    executed = [executed_plan(q) for q in queries]
    assert emitted == expected and len(expected) > 0
    assert ["StreamingUMJoin" in p for p in executed] == [False, True, True]
    assert ["StreamingSymmetricHashJoin" in p for p in executed] == [True, False, False]
    # Every input's rows with non-NULL keys are in UMJoin's stores at the end (Spark's inner joins keep
    # no row with a NULL key), those of the micro-batches before the switch carried over.
    kept = [sum(1 for batch in drawn[n] for row in batch if None not in row[:-1]) for n in "abc"]
    last = queries[-1].recentProgress[-1]["stateOperators"][0]["customMetrics"]
    assert [last[f"stateRowsInput{i}"] for i in range(3)] == kept
    assert umjoin_metric(queries[-1], "stateRowsInput0") > 0
    # Spark's second join's state left the state directory; UMJoin's operator kept the first's id.
    assert sorted(p.name for p in (tmp_path / "ck" / "state").iterdir()) == ["0"]


#: Where UMJoin does not take Spark's joins' state over yet: the settings, whether a watermark, the reason.
KEPT = {"HDFS-backed state store": ({"spark.sql.shuffle.partitions": "3"}, False, "HDFS-backed state store"),
        "a watermark": ({**ROCKSDB, "spark.sql.shuffle.partitions": "3"}, True, "the query has watermarks")}


@pytest.mark.parametrize("case", list(KEPT))
def test_a_chain_that_ran_sparks_joins_keeps_them_where_umjoin_cannot_take_their_state_over_and_says_why(
        spark: SparkSession, tmp_path: Path, case: str) -> None:
    settings, watermark, reason = KEPT[case]
    with temporary_conf(spark, settings):
        expected, emitted, queries = run_in_three(spark, tmp_path, draw(random.Random(7), RUNS[-1][1]), watermark)
    assert emitted == expected and len(expected) > 0
    assert not any("StreamingUMJoin" in executed_plan(q) for q in queries)
    reasons = plans.unconverted_streaming_joins(spark, queries[1])
    assert any(reason in r for r in reasons), reasons


def test_a_switch_over_micro_batch_that_fails_after_the_take_over_runs_again_from_the_taken_over_state(
        spark: SparkSession, tmp_path: Path) -> None:
    """The sink fails in the micro-batch that took Spark's joins' state over (its stores written, the checkpoint's
    metadata switched, the micro-batch not committed): the restart runs that micro-batch again as a StreamingUMJoin
    from the state taken over, and each micro-batch's rows, as the sink last received them, are Spark's."""
    drawn = draw(random.Random(11), RUNS[-1][1])
    settings = {**ROCKSDB, "spark.sql.shuffle.partitions": "3"}
    failed: list[int] = []

    def fail_once_in_the_switch_over(batch_id: int) -> None:
        if batch_id == RUNS[1][0] + 1 and not failed:
            failed.append(batch_id)
            raise RuntimeError("the sink fails once")

    with temporary_conf(spark, settings):
        with temporary_conf(spark, {"spark.umjoin.enabled": "false"}):
            write_runs(tmp_path / "all", drawn, 0, RUNS[-1][1])
            _, expected = run_by_batch(chain(spark, tmp_path / "all"), tmp_path / "ck-spark")
            write_runs(tmp_path / "in", drawn, *RUNS[0])
            _, first = run_by_batch(chain(spark, tmp_path / "in"), tmp_path / "ck")
        write_runs(tmp_path / "in", drawn, RUNS[1][0], RUNS[-1][1])
        last: dict[int, list] = {}

        def keep(batch: DataFrame, batch_id: int) -> None:
            last[batch_id] = [tuple(r) for r in batch.collect()]
            fail_once_in_the_switch_over(batch_id)

        for attempt in range(2):
            query = (chain(spark, tmp_path / "in").writeStream.foreachBatch(keep)
                     .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
            try:
                query.awaitTermination()
            except Exception:  # the sink's failure, once
                assert attempt == 0
        assert failed == [RUNS[1][0] + 1]
        assert "StreamingUMJoin" in executed_plan(query)
    rows_by_batch = {b: rows for b, rows in last.items() if rows}
    expected_by_batch: dict[int, list] = {}
    for row, batches in expected.items():
        for b in batches:
            expected_by_batch.setdefault(b, []).append(row)
    for row, batches in first.items():
        for b in batches:
            rows_by_batch.setdefault(b, []).append(row)
    assert ({b: sorted(r, key=nulls_first) for b, r in rows_by_batch.items()}
            == {b: sorted(r, key=nulls_first) for b, r in expected_by_batch.items()})
