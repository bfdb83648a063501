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


def run_in(spark: SparkSession, tmp_path: Path, drawn: dict[str, list[list[tuple[int | None, ...]]]],
           runs: list[tuple[int, int, bool]], watermark: bool = False
           ) -> tuple[dict, dict, StreamingQuery, list[StreamingQuery]]:
    """The chain with Spark's joins throughout (its rows by micro-batch and its query), and in `runs` (first and
    last micro-batch, whether UMJoin is on) from one checkpoint: their rows by micro-batch, and their queries."""
    with temporary_conf(spark, {"spark.umjoin.enabled": "false"}):
        write_runs(tmp_path / "all", drawn, 0, runs[-1][1])
        reference, expected = run_by_batch(chain(spark, tmp_path / "all", watermark), tmp_path / "ck-spark")
    emitted: dict = {}
    queries = []
    for start, end, on in runs:
        write_runs(tmp_path / "in", drawn, start, end)
        with temporary_conf(spark, {"spark.umjoin.enabled": str(on).lower()}):
            query, emitted = run_by_batch(chain(spark, tmp_path / "in", watermark), tmp_path / "ck", emitted)
        queries.append(query)
    return expected, emitted, reference, queries


def run_in_three(spark: SparkSession, tmp_path: Path, drawn: dict[str, list[list[tuple[int | None, ...]]]],
                 watermark: bool = False) -> tuple[dict, dict, list[StreamingQuery]]:
    """The chain with Spark's joins throughout, and in the three RUNS (UMJoin off, then on twice)."""
    expected, emitted, _, queries = run_in(
        spark, tmp_path, drawn, [(start, end, run > 0) for run, (start, end) in enumerate(RUNS)], watermark)
    return expected, emitted, queries


#: There and back: Spark's joins (2 micro-batches); UMJoin on (3: Spark's joins, the take-over, a StreamingUMJoin);
#: UMJoin off (3: the StreamingUMJoin, the take-back, Spark's joins); UMJoin off again (1: Spark's joins).
ROUND_TRIP = [(0, 2, False), (2, 5, True), (5, 8, False), (8, 9, False)]


def join_state(spark: SparkSession, checkpoint: Path) -> dict[tuple[int, str], list[tuple]]:
    """Each of Spark's two joins' sides as Spark's own state reader reads them from the checkpoint: the rows, sorted."""
    return {(operator, side): sorted((tuple(r) for r in spark.read.format("statestore")
                                      .option("operatorId", operator).option("joinSide", side)
                                      .load(str(checkpoint)).drop("partition_id").collect()), key=repr)
            for operator in (0, 1) for side in ("left", "right")}


@pytest.mark.parametrize("state_format", ["2", "3", "4"])
def test_an_inner_chain_switches_over_to_umjoin_on_restart_and_back_with_its_state_micro_batch_by_micro_batch_like_spark(
        spark: SparkSession, tmp_path: Path, state_format: str) -> None:
    drawn = draw(random.Random(int(state_format)), ROUND_TRIP[-1][1])
    settings = {**ROCKSDB, "spark.sql.streaming.join.stateFormatVersion": state_format, "spark.sql.shuffle.partitions": "3"}
    with temporary_conf(spark, settings):
        expected, emitted, _, queries = run_in(spark, tmp_path, drawn, ROUND_TRIP)
    executed = [executed_plan(q) for q in queries]
    assert emitted == expected and len(expected) > 0
    assert ["StreamingUMJoin" in p for p in executed] == [False, True, False, False]
    assert ["StreamingSymmetricHashJoin" in p for p in executed] == [True, False, True, True]
    # After the switch over, every input's rows with non-NULL keys are in UMJoin's stores (Spark's inner joins keep
    # no row with a NULL key), those of the micro-batches before the switch carried over.
    kept = [sum(1 for batch in drawn[n][:ROUND_TRIP[1][1]] for row in batch if None not in row[:-1]) for n in "abc"]
    umjoin = queries[1].recentProgress[-1]["stateOperators"][0]["customMetrics"]
    assert [umjoin[f"stateRowsInput{i}"] for i in range(3)] == kept
    assert umjoin_metric(queries[1], "stateRowsInput0") > 0
    # After the switch back, Spark's joins hold what they hold without UMJoin, as Spark's state reader reads them.
    held = join_state(spark, tmp_path / "ck")
    assert held == join_state(spark, tmp_path / "ck-spark") and all(held.values())
    assert sorted(p.name for p in (tmp_path / "ck" / "state").iterdir()) == ["0", "1"]
    assert sorted(p.name for p in (tmp_path / "ck" / "umjoin").iterdir()) == ["taken-back-6", "taken-over-3"]


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


@pytest.mark.parametrize("switch", ["over", "back"])
def test_a_switch_micro_batch_that_fails_after_the_state_moved_runs_again_from_the_moved_state(
        spark: SparkSession, tmp_path: Path, switch: str) -> None:
    """The sink fails in the micro-batch that took the state over to UMJoin (or back to Spark's joins): its stores
    written, the checkpoint's metadata switched, the micro-batch not committed. The restart runs that micro-batch
    again from the state moved (as a StreamingUMJoin, or Spark's joins), and each micro-batch's rows, as the sink
    last received them, are Spark's."""
    back = switch == "back"
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
        with temporary_conf(spark, {"spark.umjoin.enabled": str(back).lower()}):
            _, first = run_by_batch(chain(spark, tmp_path / "in"), tmp_path / "ck")
        write_runs(tmp_path / "in", drawn, RUNS[1][0], RUNS[-1][1])
        last: dict[int, list] = {}

        def keep(batch: DataFrame, batch_id: int) -> None:
            last[batch_id] = [tuple(r) for r in batch.collect()]
            fail_once_in_the_switch_over(batch_id)

        for attempt in range(2):
            with temporary_conf(spark, {"spark.umjoin.enabled": str(not back).lower()}):
                query = (chain(spark, tmp_path / "in").writeStream.foreachBatch(keep)
                         .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
                try:
                    query.awaitTermination()
                except Exception:  # the sink's failure, once
                    assert attempt == 0
        assert failed == [RUNS[1][0] + 1]
        assert ("StreamingUMJoin" in executed_plan(query)) != back
        assert (tmp_path / "ck" / "umjoin" / f"taken-{switch}-{RUNS[1][0] + 1}").is_dir()
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


def test_a_chain_umjoin_ran_with_a_watermark_restarted_with_umjoin_off_is_refused_with_the_reason_and_the_fix(
        spark: SparkSession, tmp_path: Path) -> None:
    """Spark's joins do not take the state of a StreamingUMJoin with watermarks back yet: the restart with UMJoin off
    fails on its first micro-batch, before anything is written, saying why and what to do; UMJoin on goes on."""
    drawn = {"a": [[(1, 1), (2, 1)], [(1, 2)]], "b": [[(1, 1, 0)], [(2, 1, 1)]], "c": [[(1, 0)], [(1, 1)]]}
    with temporary_conf(spark, {**ROCKSDB, "spark.sql.shuffle.partitions": "3"}):
        write_runs(tmp_path / "in", drawn, 0, 1)
        query, emitted = run_by_batch(chain(spark, tmp_path / "in", watermark=True), tmp_path / "ck")
        assert "StreamingUMJoin" in executed_plan(query)
        write_runs(tmp_path / "in", drawn, 1, 2)
        with temporary_conf(spark, {"spark.umjoin.enabled": "false"}):
            with pytest.raises(Exception) as failure:
                run_by_batch(chain(spark, tmp_path / "in", watermark=True), tmp_path / "ck")
        message = str(failure.value)
        assert "holds StreamingUMJoin state for operator 0" in message
        assert "cannot take that state back: the query has watermarks" in message
        assert "Restart with spark.umjoin.enabled=true" in message
        assert not (tmp_path / "ck" / "umjoin").exists()
        query, emitted = run_by_batch(chain(spark, tmp_path / "in", watermark=True), tmp_path / "ck", emitted)
        assert "StreamingUMJoin" in executed_plan(query)
    # a (1, 1), (2, 1) and (1, 2), b (1, 1, 0) and (2, 1, 1), c (1, 0) and (1, 1): every a-b-c triple once.
    assert all(len(batches) == 1 for batches in emitted.values())
    assert sorted(row[:2] + row[3:] for row in emitted) == sorted(
        (a_k, a_v, b_k, 1, b_v, 1, c_v) for a_k, a_v, b_k, b_v in [(1, 1, 1, 0), (1, 2, 1, 0), (2, 1, 2, 1)]
        for c_v in (0, 1))
