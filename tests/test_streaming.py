"""Streaming UMJoin: real Structured Streaming queries over file sources, with checkpoints.

Each stream is a directory of Parquet files read one file per micro-batch (maxFilesPerTrigger=1,
files ordered by modification time), so a test decides exactly which rows arrive in which batch.
"""

from __future__ import annotations

import datetime
import json
import os
import random
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import pytest
from pyspark import TaskContext
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

import stream_data
from umjoin import plans
from umjoin.local import temporary_conf

CHANGELOG = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"
#: RocksDB state stores. With changelog commits, which UMJoin's stores make by default, for Spark's joins
#: too: a snapshot commit uploads every store's files (a random chain's reference ran 1.5x as long). And
#: Spark's joins in their best state format, 4: one store per join and partition (with column families)
#: instead of four, each commit a file or more on Hadoop's local file system, a `chmod` process each.
#: Answers depend neither on how a store commits nor on the join's state format.
ROCKSDB = {"spark.sql.streaming.stateStore.providerClass": "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
           CHANGELOG: "true", "spark.sql.streaming.join.stateFormatVersion": "4"}
#: The reference of the streaming tests that compare with Spark's stream-stream joins: UMJoin off, and
#: Spark's state where it writes the fewest files, RocksDB with one store per join and partition (state
#: format 4) instead of four, whatever state the run with UMJoin keeps. How Spark keeps a join's state does
#: not change what the join puts out, and Hadoop's local file system starts a process per file written.
SPARK_JOINS = {"spark.umjoin.enabled": "false", **ROCKSDB}
WRITE_BUFFER = "spark.sql.streaming.stateStore.rocksdb.writeBufferSizeMB"


def write_batches(directory: Path, columns: str, batches: list[list[tuple]]) -> None:  # type: ignore[type-arg]
    """One Parquet file per micro-batch (possibly empty), in batch order by modification time."""
    def fill(con: duckdb.DuckDBPyConnection, rows: list[tuple]) -> None:  # type: ignore[type-arg]
        con.execute(f"CREATE OR REPLACE TABLE t ({columns})")
        if rows:
            con.executemany(f"INSERT INTO t VALUES ({', '.join('?' * len(rows[0]))})", rows)
    write_files(directory, [lambda con, rows=rows: fill(con, rows) for rows in batches])  # type: ignore[misc]


def write_files(directory: Path, fills: list[Any]) -> None:
    """One Parquet file per micro-batch of table t, which each of `fills` fills in DuckDB, in batch order by modification time."""
    directory.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect()
    existing = len(list(directory.glob("*.parquet")))
    for b, fill in enumerate(fills, start=existing):
        fill(con)
        # Written under a hidden name and renamed once complete and dated: a running query's file source
        # must never list it half-written, or with today's date (its 7-day file age would then skip every
        # later file, dated as batch order).
        path = directory / f"batch-{b:04d}.parquet"
        hidden = directory / f".{path.name}.tmp"
        con.execute(f"COPY t TO '{hidden}' (FORMAT parquet)")
        os.utime(hidden, (1_000_000 + b, 1_000_000 + b))
        hidden.rename(path)
    con.close()


def stream(spark: SparkSession, directory: Path, schema: str) -> DataFrame:
    return spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(directory))


def nulls_first(row: tuple) -> tuple:  # type: ignore[type-arg]
    """A sort key for rows with NULLs (None sorts before every value of its column)."""
    return tuple((1, v) if v is not None else (0, 0) for v in row)


def sorted_rows(df: DataFrame) -> list[tuple]:  # type: ignore[type-arg]
    """A DataFrame's rows as a sorted list (NULLs first), to compare results as multisets."""
    return sorted((tuple(r) for r in df.collect()), key=nulls_first)


def run_to_end(df: DataFrame, name: str, checkpoint: Path) -> tuple[list[tuple], StreamingQuery]:  # type: ignore[type-arg]
    query = df.writeStream.format("memory").queryName(name).option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()
    query.awaitTermination()
    return sorted_rows(df.sparkSession.table(name)), query


#: Per distinct result row, the micro-batches that put it out (once per copy).
Emitted = dict[tuple[Any, ...], list[int]]


def start_by_batch(df: DataFrame, checkpoint: Path, emitted: Emitted | None = None,
                   after_batch: Callable[[int], None] = lambda batch_id: None) -> tuple[StreamingQuery, Emitted]:
    """Starts the query; each micro-batch's rows are collected into `emitted` as it runs, then
    `after_batch` called. A query restarted from its checkpoint passes the run before's `emitted` to add
    to it (a micro-batch run again after the restart is recorded again, as a sink without exactly-once
    would write it). Collected, not written to files: a write per micro-batch is a job of its own, and
    a batch-id column new generated code in every micro-batch."""
    emitted = {} if emitted is None else emitted

    def collect(batch: DataFrame, batch_id: int) -> None:
        for row in batch.collect():
            emitted.setdefault(tuple(row), []).append(batch_id)
        after_batch(batch_id)

    return df.writeStream.foreachBatch(collect).option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start(), emitted


def by_batch(emitted: Emitted) -> Emitted:
    return {row: sorted(batches) for row, batches in emitted.items()}


def run_by_batch(df: DataFrame, checkpoint: Path, emitted: Emitted | None = None) -> tuple[StreamingQuery, Emitted]:
    """Runs the query to the end (see start_by_batch)."""
    running, emitted = start_by_batch(df, checkpoint, emitted)
    running.awaitTermination()
    return running, by_batch(emitted)


def executed_plan(query: StreamingQuery) -> str:
    return query._jsq.streamingQuery().lastExecution().executedPlan().toString()


def star(frames: dict[str, DataFrame], names: str) -> DataFrame:
    """Streams joined on one key (`<name>_k`), chained left to right as a user writes it."""
    joined = frames[names[0]]
    for other in names[1:]:
        joined = joined.join(frames[other], F.col(f"{names[0]}_k") == F.col(f"{other}_k"))
    return joined


def test_state_of_each_input_is_reported_in_progress(spark: SparkSession, tmp_path: Path) -> None:
    rng = random.Random(3)
    for name in "xyz":
        write_batches(tmp_path / name, f"{name}_k BIGINT, {name}_v BIGINT", [[(rng.randrange(5), i) for i in range(10)] for _ in range(3)])
    frames = {n: stream(spark, tmp_path / n, f"{n}_k BIGINT, {n}_v BIGINT") for n in "xyz"}
    _, query = run_to_end(star(frames, "xyz"), "umjoin_progress", tmp_path / "ck")
    last = query.lastProgress["stateOperators"]
    (umjoin,) = [op for op in last if op["operatorName"] == "umJoin"]
    per_input = [umjoin["customMetrics"][f"stateRowsInput{i}"] for i in range(3)]
    assert per_input == [30, 30, 30]  # every row of every input, and no intermediate result
    assert umjoin["numRowsTotal"] == sum(per_input)
    assert all(umjoin["customMetrics"][f"stateBytesInput{i}"] > 0 for i in range(3))
    # Spark's own fields of a stateful operator's progress, as its joins fill them: a micro-batch's commits
    # of 3 stores in each of 4 partitions take milliseconds (each writes files), never 0.
    assert all(p["stateOperators"][0]["commitTimeMs"] > 0 for p in query.recentProgress if p["numInputRows"] > 0), \
        [p["stateOperators"][0] for p in query.recentProgress]


def chain(frames: dict[str, DataFrame]) -> DataFrame:
    """x and y joined on k, y and z on j: no key all three share."""
    x, y, z = frames["x"], frames["y"], frames["z"]
    return x.join(y, x.x_k == y.y_k).join(z, y.y_j == z.z_j)


@pytest.mark.parametrize("shape", ["star", "chain"])
def test_restart_from_checkpoint_writes_every_row_once(spark: SparkSession, tmp_path: Path, shape: str) -> None:
    """Stop a running query mid-stream, restart it from its checkpoint: the file sink holds every row once."""
    rng = random.Random(11)
    data = {n: [[(rng.randrange(6), rng.randrange(4), rng.randrange(1000)) for _ in range(8)] for _ in range(6)] for n in "xyz"}
    columns = {n: f"{n}_k BIGINT, {n}_j BIGINT, {n}_v BIGINT" for n in "xyz"}
    join = (lambda frames: star(frames, "xyz")) if shape == "star" else chain
    for name, batches in data.items():
        write_batches(tmp_path / name, columns[name], batches[:4])

    def start() -> StreamingQuery:
        frames = {n: stream(spark, tmp_path / n, columns[n]) for n in "xyz"}
        return (join(frames).writeStream.format("parquet").option("path", str(tmp_path / "out"))
                .option("checkpointLocation", str(tmp_path / "ck")).trigger(processingTime="100 milliseconds").start())

    running = start()
    deadline = time.time() + 120
    while (running.lastProgress or {}).get("batchId", -1) < 1 and time.time() < deadline:
        time.sleep(0.1)
    running.stop()  # mid-stream: files of batches 2-3 may not have been read yet
    for name, batches in data.items():
        write_batches(tmp_path / name, columns[name], batches[4:])
    restarted = start()
    restarted.processAllAvailable()
    plan = executed_plan(restarted)
    restarted.stop()

    written = sorted_rows(spark.read.parquet(str(tmp_path / "out")))
    with temporary_conf(spark, {"spark.umjoin.enabled": "false"}):
        expected = sorted_rows(join({n: spark.read.parquet(str(tmp_path / n)) for n in "xyz"}))
    assert plan.count("StreamingUMJoin inputs=") == 1 and "StreamingSymmetricHashJoin" not in plan
    assert written == expected and len(expected) > 0


def test_a_converted_chain_constructs_none_of_sparks_joins(spark: SparkSession, tmp_path: Path) -> None:
    """Spark's stream-stream join broadcasts the Hadoop configuration when it is constructed (an eager field), and
    Spark constructs several copies of each join while it prepares a micro-batch. Broadcast ids are taken in
    order, so a run's broadcasts are counted by them; less one per stage submitted (its tasks' binary), they are
    Hadoop configurations: one per file scan run, as the same streams' union without a join runs them, and with
    UMJoin one more per micro-batch (the StreamingUMJoin's) and, in the first, one per input measured again. With
    Spark's joins, more (the joins')."""
    columns = {n: f"{n}_k BIGINT, {n}_j BIGINT, {n}_v BIGINT" for n in "xyz"}
    for name in "xyz":
        write_batches(tmp_path / name, columns[name], [[(i % 4, i % 3, 10 * b + i) for i in range(6)] for b in range(3)])

    def configurations_broadcast(df: DataFrame, name: str) -> int:
        counts = spark._jvm.org.apache.spark.umjoin.testkit.SchedulerCounts.start(spark._jsc.sc())
        before = spark.sparkContext.broadcast(0)
        _, query = run_to_end(df, name, tmp_path / f"ck-{name}")
        after = spark.sparkContext.broadcast(0)
        stages = counts.stop().stagesSubmitted()
        assert len([p for p in query.recentProgress if p["numInputRows"] > 0]) == 3
        return after._jbroadcast.id() - before._jbroadcast.id() - 1 - stages

    frames = lambda: {n: stream(spark, tmp_path / n, columns[n]) for n in "xyz"}  # noqa: E731
    f = frames()
    union = configurations_broadcast(f["x"].unionByName(f["y"], allowMissingColumns=True)
                                     .unionByName(f["z"], allowMissingColumns=True), "union_of_three")
    umjoin = configurations_broadcast(chain(frames()), "umjoin_chain")
    with temporary_conf(spark, SPARK_JOINS):
        spark_joins = configurations_broadcast(chain(frames()), "spark_chain")
    assert union == 3 * 3 and umjoin == union + 3 + 3, (union, umjoin)
    assert spark_joins > union + 2 * 3, (union, spark_joins)  # every join at least once per micro-batch


def test_a_chain_shows_its_layout_and_ships_partial_combinations(spark: SparkSession, tmp_path: Path) -> None:
    """explain() names each input's partitioning key and index, every stream's route and the predicted
    probe cost; the progress counts the partial combinations shipped between stores and the index entries."""
    for name in "xyz":
        write_batches(tmp_path / name, f"{name}_k BIGINT, {name}_j BIGINT, {name}_v BIGINT", [[(i % 4, i % 3, i) for i in range(12)]] * 2)
    frames = {n: stream(spark, tmp_path / n, f"{n}_k BIGINT, {n}_j BIGINT, {n}_v BIGINT") for n in "xyz"}
    with temporary_conf(spark, {"spark.sql.shuffle.partitions": "3"}):
        rows, query = run_to_end(chain(frames), "chain_layout", tmp_path / "ck")
    (line,) = [l for l in executed_plan(query).splitlines() if "StreamingUMJoin inputs=" in l]
    assert "#1 y (partitioned by y_k" in line and "indexed by y_j" in line  # y is stored once, by k, and indexed by j
    assert "#0 x (partitioned by x_k" in line and "#2 z (partitioned by z_j" in line
    assert "routes=[#0: #0 -> #1 => #2; #1: #1 -> #0 => #2; #2: #2 =>* #1 -> #0]" in line
    assert re.search(r"predictedProbeCost=[0-9.e+]+", line)
    (umjoin,) = [op for op in query.lastProgress["stateOperators"] if op["operatorName"] == "umJoin"]
    metrics = umjoin["customMetrics"]
    assert [metrics[f"stateRowsInput{i}"] for i in range(3)] == [24, 24, 24]
    assert [metrics[f"stateIndexEntriesInput{i}"] for i in range(3)] == [0, 24, 0]
    assert umjoin["numRowsTotal"] == 24 * 3  # the rows kept; index entries are not rows
    shipped = sum(op["customMetrics"]["partialCombinationsShipped"] for p in query.recentProgress for op in p["stateOperators"] if op["operatorName"] == "umJoin")
    assert shipped > 0
    with temporary_conf(spark, {"spark.umjoin.enabled": "false"}):
        assert rows == sorted_rows(chain({n: spark.read.parquet(str(tmp_path / n)) for n in "xyz"}))


def two_key_join(frames: dict[str, DataFrame]) -> DataFrame:
    """x joins w on p; y joins w on a and b together (as TPC-H's lineitem joins partsupp on part and supplier)."""
    x, w, y = frames["x"], frames["w"], frames["y"]
    return x.join(w, x.x_p == w.w_p).join(y, (w.w_a == y.y_a) & (w.w_b == y.y_b))


def two_key_data(tmp_path: Path, batches: range) -> dict[str, str]:
    """Many x and w rows, few y rows: w is partitioned on p (x's probes stay in one partition) and y's go to all."""
    columns = {"x": "x_p BIGINT, x_v BIGINT", "w": "w_p BIGINT, w_a BIGINT, w_b BIGINT, w_v BIGINT", "y": "y_a BIGINT, y_b BIGINT, y_v BIGINT"}
    rng = random.Random(17)
    rows = {
        "x": lambda: (rng.randrange(30), rng.randrange(100)),
        "w": lambda: (rng.randrange(30), rng.randrange(4), rng.randrange(6), rng.randrange(100)),
        "y": lambda: (rng.randrange(4), rng.randrange(6), rng.randrange(100)),
    }
    sizes = {"x": 60, "w": 60, "y": 3}
    for name in columns:
        write_batches(tmp_path / name, columns[name], [[rows[name]() for _ in range(sizes[name])] for _ in batches])
    return columns


def test_a_store_reached_with_several_keys_is_indexed_on_all_of_them(spark: SparkSession, tmp_path: Path) -> None:
    """A row sent to every partition of a store looks it up by every key of the store it carries: one index on
    (a, b), so a lookup finds exactly the rows agreeing on both. Its entries are one per stored row."""
    columns = two_key_data(tmp_path, range(3))
    frames = {n: stream(spark, tmp_path / n, columns[n]) for n in columns}
    with temporary_conf(spark, {**ROCKSDB, "spark.sql.shuffle.partitions": "3"}):
        rows, query = run_to_end(two_key_join(frames), "two_keys", tmp_path / "ck")
    (line,) = [l for l in executed_plan(query).splitlines() if "StreamingUMJoin inputs=" in l]
    assert re.search(r"#1 w \(partitioned by w_p#\d+L, indexed by \(w_a#\d+L, w_b#\d+L\)\)", line), line
    assert "#2: #2 =>* #1 -> #0" in line, line
    (umjoin,) = [op for op in query.lastProgress["stateOperators"] if op["operatorName"] == "umJoin"]
    assert umjoin["customMetrics"]["stateIndexEntriesInput1"] == umjoin["customMetrics"]["stateRowsInput1"] == 180
    with temporary_conf(spark, {"spark.umjoin.enabled": "false"}):
        assert rows == sorted_rows(two_key_join({n: spark.read.parquet(str(tmp_path / n)) for n in columns})) and len(rows) > 0


def test_a_checkpoint_of_the_previous_layout_format_continues_under_an_adaptive_order(spark: SparkSession, tmp_path: Path) -> None:
    """A checkpoint whose layout record has format 1 (an index named by its one key, as the previous version
    wrote it) continues; restarted under dpPick, routes change within what the recorded layout can probe,
    and every row is written once."""
    columns = {n: f"{n}_k BIGINT, {n}_j BIGINT, {n}_v BIGINT" for n in "xyz"}
    rng = random.Random(23)
    data = {n: [[(rng.randrange(5), rng.randrange(4), rng.randrange(100)) for _ in range(10)] for _ in range(5)] for n in "xyz"}
    for name in "xyz":
        write_batches(tmp_path / name, columns[name], data[name][:2])

    def run_once() -> StreamingQuery:
        frames = {n: stream(spark, tmp_path / n, columns[n]) for n in "xyz"}
        query = (chain(frames).writeStream.format("parquet").option("path", str(tmp_path / "out"))
                 .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
        query.awaitTermination()
        return query

    with temporary_conf(spark, {"spark.sql.shuffle.partitions": "3"}):
        run_once()
        (layout,) = (tmp_path / "ck" / "state").glob("*/_umjoin_layout.json")
        recorded = layout.read_text()
        assert '"format":5' in recorded and '"indexedBy":[["y_j"]]' in recorded, recorded
        layout.write_text(recorded.replace('"format":5', '"format":1').replace('"indexedBy":[["y_j"]]', '"indexedBy":["y_j"]'))
        (layout.parent / f".{layout.name}.crc").unlink()  # Hadoop's local checksum of the file as written
        for name in "xyz":
            write_batches(tmp_path / name, columns[name], data[name][2:])
        with temporary_conf(spark, {"spark.umjoin.probeOrder": "dpPick", "spark.umjoin.dpPick.period": "1ms"}):
            restarted = run_once()
    assert "probeOrder=dpPick" in executed_plan(restarted)
    with temporary_conf(spark, {"spark.umjoin.enabled": "false"}):
        expected = sorted_rows(chain({n: spark.read.parquet(str(tmp_path / n)) for n in "xyz"}))
    assert sorted_rows(spark.read.parquet(str(tmp_path / "out"))) == expected and len(expected) > 0


def test_an_adaptive_order_keeps_recorded_routes_where_multi_key_indexes_leave_no_other(spark: SparkSession, tmp_path: Path) -> None:
    """s and t join each other on d, and w on a and b (one each); w is partitioned on c (u's key) and indexed
    on (a, b), which only a combination of s and t carries. Restarted under dpPick, the policy could reach w
    from no single input: the recorded routes stay (explain says fixed), and every row is written once."""
    columns = {"s": "s_a BIGINT, s_d BIGINT, s_v BIGINT", "t": "t_b BIGINT, t_d BIGINT, t_v BIGINT",
               "w": "w_a BIGINT, w_b BIGINT, w_c BIGINT, w_v BIGINT", "u": "u_c BIGINT, u_v BIGINT"}
    rng = random.Random(1)
    rows = {"s": lambda: (rng.randrange(4), rng.randrange(5), rng.randrange(99)), "t": lambda: (rng.randrange(4), rng.randrange(5), rng.randrange(99)),
            "w": lambda: (rng.randrange(4), rng.randrange(4), rng.randrange(30), rng.randrange(99)), "u": lambda: (rng.randrange(30), rng.randrange(99))}
    sizes = {"s": 3, "t": 3, "w": 40, "u": 40}
    data = {n: [[rows[n]() for _ in range(sizes[n])] for _ in range(4)] for n in columns}

    def join(f: dict[str, DataFrame]) -> DataFrame:
        return (f["s"].join(f["t"], f["s"].s_d == f["t"].t_d).join(f["w"], (f["w"].w_a == f["s"].s_a) & (f["w"].w_b == f["t"].t_b))
                .join(f["u"], f["u"].u_c == f["w"].w_c))

    def run_once() -> StreamingQuery:
        frames = {n: stream(spark, tmp_path / n, columns[n]) for n in columns}
        query = (join(frames).writeStream.format("parquet").option("path", str(tmp_path / "out"))
                 .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
        query.awaitTermination()
        return query

    with temporary_conf(spark, {"spark.sql.shuffle.partitions": "3"}):
        for name in columns:
            write_batches(tmp_path / name, columns[name], data[name][:2])
        (line,) = [l for l in executed_plan(run_once()).splitlines() if "StreamingUMJoin inputs=" in l]
        assert re.search(r"#2 w \(partitioned by w_c#\d+L, indexed by \(w_a#\d+L, w_b#\d+L\)\)", line), line
        for name in columns:
            write_batches(tmp_path / name, columns[name], data[name][2:])
        with temporary_conf(spark, {"spark.umjoin.probeOrder": "dpPick", "spark.umjoin.dpPick.period": "1ms"}):
            restarted = run_once()
    assert "probeOrder=fixed" in executed_plan(restarted)
    with temporary_conf(spark, {"spark.umjoin.enabled": "false"}):
        expected = sorted_rows(join({n: spark.read.parquet(str(tmp_path / n)) for n in columns}))
    assert sorted_rows(spark.read.parquet(str(tmp_path / "out"))) == expected and len(expected) > 0


def test_the_layout_is_chosen_from_the_first_micro_batch_as_measured(spark: SparkSession, tmp_path: Path) -> None:
    """The probe-cost model's figures are the first micro-batch's rows after filters and its key values, counted
    by tasks that carry the session's SQL settings as the query's own do; where an input keeps state of its own
    (a deduplication) it is not run twice, and Spark's plan estimates serve. The operator measures them when it
    runs the micro-batch: planning it starts no job (every job belongs to the micro-batch's execution)."""
    for name in "xyz":
        write_batches(tmp_path / name, f"{name}_k BIGINT, {name}_j BIGINT, {name}_v BIGINT", [[(i % 4, i % 3, 100 * b + i) for i in range(12)] for b in range(2)])
    frames = {n: stream(spark, tmp_path / n, f"{n}_k BIGINT, {n}_j BIGINT, {n}_v BIGINT") for n in "xyz"}

    def below_three_with_the_session_settings(v: int) -> bool:  # z_v < 3, in a task given the session's settings
        return v < 3 and TaskContext.get().getLocalProperty("spark.sql.shuffle.partitions") == "3"
    frames["z"] = frames["z"].where(F.udf(below_three_with_the_session_settings, "boolean")("z_v"))  # keeps 3 of the first batch's 12 rows
    with temporary_conf(spark, {"spark.sql.shuffle.partitions": "3"}):
        counts = spark._jvm.org.apache.spark.umjoin.testkit.SchedulerCounts.start(spark._jsc.sc())
        rows, query = run_to_end(chain(frames), "measured_layout", tmp_path / "ck")
        assert counts.stop().jobsOutsideExecutions() == 0  # (the measuring job once ran while the micro-batch was planned)
        (line,) = [l for l in executed_plan(query).splitlines() if "StreamingUMJoin inputs=" in l]
        # x, y and z's rows (z filtered); k takes 4 values, j 3 (z's 3 rows have j 0, 1, 2).
        assert re.search(r"statistics=\[first micro-batch: rows \[12, 12, 3\], key values \[(4, 3|3, 4)\]\]", line), line
        assert query.recentProgress[0]["numInputRows"] == 36  # measuring read the batch again, but counted it once

        deduplicated = {**frames, "y": frames["y"].dropDuplicates(["y_k", "y_j", "y_v"])}
        deduplicated_rows, deduplicated_query = run_to_end(chain(deduplicated), "estimated_layout", tmp_path / "ck-dedup")
        (line,) = [l for l in executed_plan(deduplicated_query).splitlines() if "StreamingUMJoin inputs=" in l]
        assert "statistics=[Spark's plan estimates: rows [" in line, line
    with temporary_conf(spark, {"spark.umjoin.enabled": "false"}):
        expected = sorted_rows(chain({n: spark.read.parquet(str(tmp_path / n)) for n in "xyz"}).where("z_v < 3"))
    assert rows == deduplicated_rows == expected and len(expected) > 0


def test_measuring_the_first_micro_batch_reads_only_the_columns_its_keys_and_filters_read(spark: SparkSession, tmp_path: Path) -> None:
    """The layout's figures need each input's keys, not its rows: the job measuring the first micro-batch reads its
    files again, but only the keys' columns and what the input's filters read (not a wide text column); the
    figures and the answer stay the same."""
    for name in "xyz":
        write_batches(tmp_path / name, f"{name}_k BIGINT, {name}_j BIGINT, {name}_v BIGINT, {name}_text VARCHAR",
                      [[(i % 4, i % 3, i, f"text {i}") for i in range(12)]])
    schemas = {n: f"{n}_k BIGINT, {n}_j BIGINT, {n}_v BIGINT, {n}_text STRING" for n in "xyz"}
    filtered = spark.read.schema(schemas["z"]).parquet(str(tmp_path / "z")).where("z_v < 6")  # (a filter no key reads)
    columns = spark._jvm.umjoin.spark.testkit.FirstBatchColumns  # type: ignore[union-attr]
    assert sorted(columns.read(filtered._jdf, ["z_j"])) == ["z_j", "z_v"]

    frames = {n: stream(spark, tmp_path / n, schemas[n]) for n in "xyz"}
    frames["z"] = frames["z"].where("z_v < 6")
    rows, query = run_to_end(chain(frames), "measured_columns", tmp_path / "ck")
    (line,) = [l for l in executed_plan(query).splitlines() if "StreamingUMJoin inputs=" in l]
    assert re.search(r"statistics=\[first micro-batch: rows \[12, 12, 6\], key values \[(4, 3|3, 4)\]\]", line), line
    with temporary_conf(spark, {"spark.umjoin.enabled": "false"}):
        expected = sorted_rows(chain({n: spark.read.parquet(str(tmp_path / n)) for n in "xyz"}).where("z_v < 6"))
    assert rows == expected and len(expected) > 0


@pytest.mark.parametrize("cache_rows", ["100000", "0"])
def test_small_stored_inputs_are_probed_in_memory_with_the_same_answer(spark: SparkSession, tmp_path: Path, cache_rows: str) -> None:
    """With the RocksDB state store, a partition's stored rows of an input are read into memory once per task
    when they are few (spark.umjoin.stateCacheRows; 0: never): the answer is the same either way."""
    rng = random.Random(5)
    for name in "xyz":
        write_batches(tmp_path / name, f"{name}_k BIGINT, {name}_j BIGINT, {name}_v BIGINT",
                      [[(rng.randrange(5), rng.randrange(4), rng.randrange(100)) for _ in range(10)] for _ in range(4)])
    frames = {n: stream(spark, tmp_path / n, f"{n}_k BIGINT, {n}_j BIGINT, {n}_v BIGINT") for n in "xyz"}
    with temporary_conf(spark, {**ROCKSDB, "spark.sql.shuffle.partitions": "2", "spark.umjoin.stateCacheRows": cache_rows}):
        rows, query = run_to_end(chain(frames), f"state_cache_{cache_rows}", tmp_path / "ck")
    metrics = [op["customMetrics"] for p in query.recentProgress for op in p["stateOperators"] if op["operatorName"] == "umJoin"]
    read = [m["stateRowsReadIntoMemory"] for m in metrics]
    if cache_rows == "0":
        assert sum(read) == 0
    else:  # from the second batch on, the stores the first batches committed are read into memory
        assert read[0] == 0 and sum(read[1:]) > 0
    # A few rows take a few kB in memory, not one of Spark's memory pages (at least 1 MB) per index and task.
    index_bytes = [m["memoryIndexBytes"] for m in metrics]
    assert all(0 < b < 100_000 for b in index_bytes[:4]), index_bytes
    with temporary_conf(spark, {"spark.umjoin.enabled": "false"}):
        assert rows == sorted_rows(chain({n: spark.read.parquet(str(tmp_path / n)) for n in "xyz"})) and len(rows) > 0


def test_rows_indexed_in_memory_take_memory_by_their_bytes_not_by_spark_pages(spark: SparkSession, tmp_path: Path) -> None:
    """A partition's rows indexed in memory for a micro-batch, over 1 MB, are held in pages of 1 MB: a task holds
    about their bytes, not a page of Spark's (64 MB here) per index. The static table t, read every micro-batch,
    is probed on t_a by s's route and on t_b by r's: in the second micro-batch it is indexed on both in a task,
    the second index reading the first. The answer is Spark's."""
    for name, key in (("s", "a"), ("r", "b")):
        write_files(tmp_path / name, [
            lambda con, b=b, name=name, key=key: con.execute(
                f"CREATE OR REPLACE TABLE t AS SELECT (hash(i, {b}, '{name}') % 3000)::BIGINT AS {name}_{key}, "
                f"(hash(i, {b}, '{name}k') % 300)::BIGINT AS {name}_k FROM range(3000) AS r(i)")
            for b in range(2)])
    (tmp_path / "t").mkdir()
    duckdb.sql(f"COPY (SELECT (hash(i, 'a') % 3000)::BIGINT AS t_a, (hash(i, 'b') % 3000)::BIGINT AS t_b, repeat('p', 80) AS t_pad "
               f"FROM range(40000) AS r(i)) TO '{tmp_path / 't' / 't.parquet'}' (FORMAT parquet)")

    def join(s: DataFrame, r: DataFrame, t: DataFrame) -> DataFrame:
        return (s.join(r, F.col("s_k") == F.col("r_k"))
                .join(t, (F.col("s_a") == F.col("t_a")) & (F.col("r_b") == F.col("t_b")))
                .select("s_a", "r_b", "s_k", F.length("t_pad").alias("padding")))

    t = spark.read.parquet(str(tmp_path / "t"))
    with temporary_conf(spark, {"spark.sql.shuffle.partitions": "2", "spark.sql.autoBroadcastJoinThreshold": "-1",
                                "spark.umjoin.staticTables": "reread", "spark.umjoin.probeOrder": "dpPick"}):
        streams = [stream(spark, tmp_path / n, f"{n}_{k} BIGINT, {n}_k BIGINT") for n, k in (("s", "a"), ("r", "b"))]
        rows, query = run_to_end(join(*streams, t), "paged_indexes", tmp_path / "ck")
    index_bytes = [op["customMetrics"]["memoryIndexBytes"] for p in query.recentProgress for op in p["stateOperators"]
                   if op["operatorName"] == "umJoin"]
    # Per batch: t's 40,000 rows of 112 bytes (4.5 MB) in each index built (one in the first batch, two in the
    # second), and the streams' new rows.
    assert len(index_bytes) == 2 and all(8 * 2**20 < b < 64 * 2**20 for b in index_bytes), index_bytes
    with temporary_conf(spark, {"spark.umjoin.enabled": "false"}):
        expected = sorted_rows(join(*(spark.read.parquet(str(tmp_path / n)) for n in "sr"), t))
    assert rows == expected and len(expected) > 100


def test_umjoin_stores_default_to_changelog_commits_and_small_memtables_unless_the_session_sets_them(spark: SparkSession) -> None:
    """A changelog commit leaves a RocksDB store's memtable unflushed, so UMJoin's stores take 16 MB
    memtables (RocksDB's default is 64 MB, two per store). The conf UMJoin opens its stores with, as
    Spark's RocksDB provider reads it."""
    def store_confs() -> list[dict[str, str | None]]:
        """The two keys, as the rows' store and the index stores are opened with them."""
        session_conf = spark._jsparkSession.sessionState().conf()  # type: ignore[union-attr]
        opened = spark.sparkContext._jvm.umjoin.spark.streaming.InputStateConf.apply(session_conf)  # type: ignore[union-attr]
        return [{key: (value.get() if value.isDefined() else None) for key in (CHANGELOG, WRITE_BUFFER) for value in [store.sqlConfs().get(key)]}
                for store in (opened.rows(), opened.indexes())]

    assert store_confs() == [{CHANGELOG: "true", WRITE_BUFFER: "16"}] * 2
    assert spark.conf.get(WRITE_BUFFER, None) is None  # (the session itself is left as it was)
    with temporary_conf(spark, {CHANGELOG: "false", WRITE_BUFFER: "48"}):
        assert store_confs() == [{CHANGELOG: "false", WRITE_BUFFER: "48"}] * 2


def test_a_checkpoint_laid_out_for_another_join_is_refused(spark: SparkSession, tmp_path: Path) -> None:
    """The layout of UMJoin's state is kept in the checkpoint; a restart with a join on other keys names the problem."""
    columns = {n: f"{n}_k BIGINT, {n}_j BIGINT, {n}_v BIGINT" for n in "xyz"}
    for name in "xyz":
        write_batches(tmp_path / name, columns[name], [[(1, 2, 3)]])

    def run_once(join: Any) -> None:
        frames = {n: stream(spark, tmp_path / n, columns[n]) for n in "xyz"}
        query = (join(frames).writeStream.format("parquet").option("path", str(tmp_path / "out"))
                 .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
        query.awaitTermination()

    run_once(chain)
    for name in "xyz":
        write_batches(tmp_path / name, columns[name], [[(1, 2, 4)]])
    with pytest.raises(Exception) as failure:
        run_once(lambda f: f["x"].join(f["y"], f["x"].x_j == f["y"].y_j).join(f["z"], f["y"].y_k == f["z"].z_k))
    message = str(failure.value)
    assert "holds StreamingUMJoin state for operator 0 that this query cannot continue: input #" in message
    assert "which this join does not join it on" in message and "use a new checkpoint location" in message


def test_a_checkpoint_whose_umjoin_state_was_deleted_is_refused_saying_so(spark: SparkSession, tmp_path: Path) -> None:
    """A restart from a checkpoint whose StreamingUMJoin state is gone (the layout record and the stores; Spark's
    operator metadata, which Spark checks itself, kept) is refused with what is missing, not read as state Spark's
    joins wrote, nor started again from nothing."""
    columns = {n: f"{n}_k BIGINT, {n}_j BIGINT, {n}_v BIGINT" for n in "xyz"}

    def run_once() -> None:
        frames = {n: stream(spark, tmp_path / n, columns[n]) for n in "xyz"}
        query = (chain(frames).writeStream.format("parquet").option("path", str(tmp_path / "out"))
                 .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
        query.awaitTermination()

    for value in (3, 4):
        for name in "xyz":
            write_batches(tmp_path / name, columns[name], [[(1, 2, value)]])
        if value == 4:
            for kept in (tmp_path / "ck" / "state" / "0").iterdir():
                if kept.name != "_metadata":
                    shutil.rmtree(kept) if kept.is_dir() else kept.unlink()
            with pytest.raises(Exception) as failure:
                run_once()
        else:
            run_once()
    message = str(failure.value)
    assert "has no state for operator 0" in message and "_umjoin_layout.json" in message, message
    assert "it was deleted or moved" in message and "use a new checkpoint location" in message, message


#: RocksDB checkpoints of the x-y-z chain that earlier versions of UMJoin wrote (tests/checkpoints/make_rocksdb_checkpoint.py),
#: each with its file-source logs naming the data under OLDER_CHECKPOINT_DATA, and the data it read: per fixture, the commit
#: that wrote it, its layout format, the stores of each partition, and the store instances a micro-batch opens.
OLDER_CHECKPOINTS = {
    # Format 3: a store of its own per input and index (y indexed on y_j), two partitions.
    "rocksdb-separate-stores": ("678d4e5", 3, ["_metadata", "umjoin-input-0", "umjoin-input-1", "umjoin-input-1-index-0", "umjoin-input-2"], 2 * 4),
    # Format 4: one store per partition, each input's rows a column family of it, an entry per row.
    "rocksdb-column-families": ("df2ddcc", 4, ["_metadata", "umjoin"], 2),
}
OLDER_CHECKPOINT_DATA = "/tmp/umjoin-checkpoint-fixture"
OLDER_CHECKPOINT_COLUMNS = {n: f"{n}_k BIGINT, {n}_j BIGINT, {n}_v BIGINT" for n in "xyz"}
#: Micro-batches each fixture's run read, of the ones `older_checkpoint_batches` draws.
OLDER_CHECKPOINT_BEFORE = 3


def older_checkpoint(name: str) -> Path:
    return Path(__file__).resolve().parent / "checkpoints" / name


def older_checkpoint_batches() -> dict[str, list[list[tuple[int, int, int]]]]:
    rng = random.Random(29)
    return {n: [[(rng.randrange(5), rng.randrange(4), rng.randrange(100)) for _ in range(8)] for _ in range(5)] for n in "xyz"}


@pytest.mark.parametrize("fixture", OLDER_CHECKPOINTS)
def test_a_rocksdb_checkpoint_of_an_earlier_layout_continues_keeping_its_stores_so(spark: SparkSession, tmp_path: Path, fixture: str) -> None:
    """A RocksDB checkpoint of the x-y-z chain written by an earlier UMJoin (a store per input and index; or one store per
    partition with an entry per row), restarted by this version with RocksDB: its record says how its stores are kept,
    the new micro-batches write and probe them so, and every result comes out once. A new checkpoint keeps each key's
    rows as one list (test_the_benchmarks_state_sizes_count_every_stored_key_and_value)."""
    _, layout_format, stores, instances = OLDER_CHECKPOINTS[fixture]
    work = tmp_path / "work"
    shutil.copytree(older_checkpoint(fixture), work, ignore=shutil.ignore_patterns("*.py", "*.md"))
    # The file-source logs name the files read by absolute path (and Hadoop keeps a checksum of each log file).
    for log in (work / "ck" / "sources").rglob("*"):
        if log.is_file() and not log.name.endswith(".crc"):
            log.write_text(log.read_text().replace(OLDER_CHECKPOINT_DATA, str(work)))
            (log.parent / f".{log.name}.crc").unlink(missing_ok=True)
    (layout,) = (work / "ck" / "state").glob("*/_umjoin_layout.json")
    assert f'"format":{layout_format}' in layout.read_text()
    assert sorted(os.listdir(layout.parent / "0")) == stores
    data = older_checkpoint_batches()
    for name, batches in data.items():
        write_batches(work / name, OLDER_CHECKPOINT_COLUMNS[name], batches[OLDER_CHECKPOINT_BEFORE:])
    frames = {n: stream(spark, work / n, OLDER_CHECKPOINT_COLUMNS[n]) for n in "xyz"}
    with temporary_conf(spark, ROCKSDB):
        query, emitted = run_by_batch(chain(frames), work / "ck")
    assert "StreamingUMJoin inputs=" in executed_plan(query)
    assert [p["batchId"] for p in query.recentProgress] == [3, 4]
    assert all(p["stateOperators"][0]["numStateStoreInstances"] == instances for p in query.recentProgress)
    assert sorted(os.listdir(layout.parent / "0")) == stores
    assert f'"format":{layout_format}' in layout.read_text()
    earlier = [tuple(row) for row in json.loads((older_checkpoint(fixture) / "rows-before.json").read_text())]
    written = sorted(earlier + [row for row, batches in emitted.items() for _ in batches], key=nulls_first)
    with temporary_conf(spark, {"spark.umjoin.enabled": "false"}):
        expected = sorted_rows(chain({n: spark.read.parquet(str(work / n)) for n in "xyz"}))
    assert written == expected and len(emitted) > 0


@pytest.mark.parametrize("change", ["older format", "no layout record"])
def test_state_of_another_umjoin_version_is_refused(spark: SparkSession, tmp_path: Path, change: str) -> None:
    """A checkpoint whose UMJoin state another version wrote (another layout format, or the stores of a version
    that recorded no layout) is refused with a message, not read as if it were this version's."""
    columns = {n: f"{n}_k BIGINT, {n}_j BIGINT, {n}_v BIGINT" for n in "xyz"}

    def run_once() -> None:
        for name in "xyz":
            write_batches(tmp_path / name, columns[name], [[(1, 2, 3)]])
        frames = {n: stream(spark, tmp_path / n, columns[n]) for n in "xyz"}
        query = (chain(frames).writeStream.format("parquet").option("path", str(tmp_path / "out"))
                 .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
        query.awaitTermination()

    run_once()
    (layout,) = (tmp_path / "ck" / "state").glob("*/_umjoin_layout.json")
    assert [p.name for p in (layout.parent / "0").iterdir() if p.name.startswith("umjoin-input-1")] != []
    if change == "older format":
        layout.write_text(layout.read_text().replace('"format":5', '"format":0'))
        (layout.parent / f".{layout.name}.crc").unlink()  # Hadoop's local checksum of the file as written
        expected = "written by another version of UMJoin (state layout format 0; this version reads formats 1 to 5)"
    else:
        layout.unlink()
        expected = "written by an earlier version of UMJoin, whose state layout this version cannot read"
    with pytest.raises(Exception) as failure:
        run_once()
    assert expected in str(failure.value) and "new checkpoint location" in str(failure.value)


def test_the_benchmarks_state_sizes_count_every_stored_key_and_value(spark: SparkSession, tmp_path: Path) -> None:
    """The benchmarks' exact state measure (bench.streaming.state_sizes, read back from the checkpoint) against the rows Spark's
    two joins and UMJoin keep, counted here from the data: without watermarks every row stays. Every column is a BIGINT, so each
    stored key or value of n fields is an UnsafeRow of 8 + 8n bytes."""
    from bench.streaming import state_sizes

    rng = random.Random(5)
    data = {n: [[(rng.randrange(5), i) for i in range(6)] for _ in range(3)] for n in "xyz"}
    for name, batches in data.items():
        write_batches(tmp_path / name, f"{name}_k BIGINT, {name}_v BIGINT", batches)

    def query() -> DataFrame:
        return star({n: stream(spark, tmp_path / n, f"{n}_k BIGINT, {n}_v BIGINT") for n in "xyz"}, "xyz")

    def row(fields: int) -> int:
        return 8 + 8 * fields

    partitions = int(spark.conf.get("spark.sql.shuffle.partitions"))
    with temporary_conf(spark, ROCKSDB):
        _, umjoin = run_to_end(query(), "sizes_on", tmp_path / "ck-on")
        # (state_sizes reads the four stores of Spark's join state formats 1 and 2, the default)
        with temporary_conf(spark, {"spark.umjoin.enabled": "false", "spark.sql.streaming.join.stateFormatVersion": "2"}):
            _, joins = run_to_end(query(), "sizes_off", tmp_path / "ck-off")
    for query_run in (umjoin, joins):
        assert [p["batchId"] for p in query_run.recentProgress] == [0, 1, 2]
    measured_umjoin = state_sizes(spark, umjoin._jsq.streamingQuery().lastExecution(), [0, 1, 2])
    measured_joins = state_sizes(spark, joins._jsq.streamingQuery().lastExecution(), [0, 1, 2])
    for b in range(3):
        seen = {n: [r for batch in data[n][: b + 1] for r in batch] for n in "xyz"}
        count = {n: {k: sum(1 for r in seen[n] if r[0] == k) for k in range(5)} for n in "xyz"}
        # UMJoin: each input's rows listed by key (the key, one field, once; each row with its sequence number and the
        # time it was stored: a row of 3 fields, the first the row itself), and no index on a single key; with RocksDB
        # the inputs are column families of one store per partition, whose default family holds each input's count of
        # rows: a key of the input's store name ("umjoin-input-<i>", 14 bytes of a string field) and a LONG.
        (operator,) = [op for op in umjoin.recentProgress[b]["stateOperators"] if op["operatorName"] == "umJoin"]
        assert all(operator["customMetrics"][f"stateIndexEntriesInput{i}"] == 0 for i in range(3))
        assert operator["numStateStoreInstances"] == partitions
        stored = sum(len(seen[n]) for n in "xyz")
        keys = sum(1 for n in "xyz" for c in count[n].values() if c)
        counts = partitions * 3
        assert measured_umjoin[b] == (stored + counts,
                                      stored * (row(3) + row(2)) + keys * row(1) + counts * ((8 + 8 + 16) + row(1)))
        # Spark's joins: per side, each row keyed by (key, index) with its `matched` flag, and each key's count of rows.
        xy = sum(count["x"][k] * count["y"][k] for k in range(5))
        sides = [(len(seen["x"]), 2, count["x"]), (len(seen["y"]), 2, count["y"]), (len(seen["z"]), 2, count["z"]),
                 (xy, 4, {k: count["x"][k] * count["y"][k] for k in range(5)})]
        rows = sum(n + sum(1 for c in keys.values() if c) for n, _, keys in sides)
        size = sum(n * (row(2) + row(fields + 1)) + sum(1 for c in keys.values() if c) * (row(1) + row(1)) for n, fields, keys in sides)
        assert measured_joins[b] == (rows, size)


def event_time_data(tmp_path: Path, names: str = "xyz", batches: int = 8) -> None:
    """Streams whose event times advance 10 minutes a batch; a few rows arrive a day late (from the fourth batch)."""
    rng = random.Random(7)
    base = datetime.datetime(2026, 1, 1)
    for name in names:
        written = []
        for b in range(batches):
            rows = []
            for _ in range(rng.randint(5, 15)):
                at = base + datetime.timedelta(minutes=10 * b + rng.randint(0, 9))
                if b > 2 and rng.random() < 0.1:
                    at = base - datetime.timedelta(days=1)
                rows.append((rng.randrange(6), rng.randrange(3), at, rng.randrange(1000)))
            written.append(rows)
        write_batches(tmp_path / name, f"{name}_k BIGINT, {name}_j BIGINT, {name}_ts TIMESTAMP, {name}_v BIGINT", written)


def time_bounded_join(spark: SparkSession, tmp_path: Path, keys: str) -> DataFrame:
    """y and z within 5 minutes of x; Spark needs one event-time column per join side, so y's is dropped.
    z joins y on k (`shared`: all three on k) or on j (`chain`: two key classes)."""
    frames = {
        n: stream(spark, tmp_path / n, f"{n}_k BIGINT, {n}_j BIGINT, {n}_ts TIMESTAMP, {n}_v BIGINT").withWatermark(f"{n}_ts", "15 minutes")
        for n in "xyz"
    }
    x, y, z = frames["x"], frames["y"], frames["z"]
    near = lambda a, b: a.between(b - F.expr("interval 5 minutes"), b + F.expr("interval 5 minutes"))  # noqa: E731
    key = "k" if keys == "shared" else "j"
    return (x.join(y, (x.x_k == y.y_k) & near(y.y_ts, x.x_ts)).select("x_k", "x_ts", "x_v", "y_k", "y_j", "y_v")
            .join(z, (F.col(f"y_{key}") == z[f"z_{key}"]) & near(z.z_ts, F.col("x_ts"))))


@pytest.mark.parametrize(("provider", "keys"), [("hdfs", "shared"), ("rocksdb", "chain")])
def test_watermarks_shrink_state_and_drop_late_rows_like_spark(spark: SparkSession, tmp_path: Path, provider: str, keys: str) -> None:
    event_time_data(tmp_path)
    with temporary_conf(spark, {"spark.sql.shuffle.partitions": "2", **(ROCKSDB if provider == "rocksdb" else {})}):
        on, umjoin = run_to_end(time_bounded_join(spark, tmp_path, keys), f"wm_on_{provider}_{keys}", tmp_path / "ck-on")
        # (Spark's joins with the same store and its default state format: the state compared below)
        with temporary_conf(spark, {"spark.umjoin.enabled": "false"}):
            off, spark_joins = run_to_end(time_bounded_join(spark, tmp_path, keys), f"wm_off_{provider}_{keys}", tmp_path / "ck-off")

    def totals(query: StreamingQuery, key: str) -> list[int]:
        return [sum(op[key] for op in p["stateOperators"]) for p in query.recentProgress]

    assert "StreamingUMJoin inputs=" in executed_plan(umjoin)
    assert on == off and len(on) > 0
    assert sum(totals(umjoin, "numRowsDroppedByWatermark")) == sum(totals(spark_joins, "numRowsDroppedByWatermark")) > 0
    state = totals(umjoin, "numRowsTotal")
    assert sum(totals(umjoin, "numRowsRemoved")) > 0 and state[-1] < max(state)  # expired rows were evicted
    assert state[-1] <= totals(spark_joins, "numRowsTotal")[-1]  # and no intermediate results are kept


def test_a_full_outer_join_stays_as_spark_planned_it_and_says_why_once(spark: SparkSession, tmp_path: Path) -> None:
    """w, x and y joined inner (one StreamingUMJoin), then z FULL OUTER: Spark's outer join stays on top,
    its reason is recorded once for the query run although every micro-batch is planned again.
    (Left and right outer joins on top convert: tests/test_streaming_outer.py.)"""
    event_time_data(tmp_path, "wxyz", batches=5)
    # A last batch far in the future that joins nothing: its watermark lets every row waiting for a match go
    # (the joins under Spark's outer join hold its watermark back less when they are one StreamingUMJoin).
    for n, name in enumerate("wxyz"):
        write_batches(tmp_path / name, f"{name}_k BIGINT, {name}_j BIGINT, {name}_ts TIMESTAMP, {name}_v BIGINT",
                      [[(1000 + n, 1000 + n, datetime.datetime(2026, 1, 3), 0)]])

    def query() -> DataFrame:
        f = {n: stream(spark, tmp_path / n, f"{n}_k BIGINT, {n}_j BIGINT, {n}_ts TIMESTAMP, {n}_v BIGINT").withWatermark(f"{n}_ts", "15 minutes")
             for n in "wxyz"}
        near = lambda a, b: a.between(b - F.expr("interval 5 minutes"), b + F.expr("interval 5 minutes"))  # noqa: E731
        inner = (f["x"].join(f["y"], (F.col("x_k") == F.col("y_k")) & near(F.col("y_ts"), F.col("x_ts"))).drop("y_ts")
                 .join(f["w"], (F.col("x_j") == F.col("w_j")) & near(F.col("w_ts"), F.col("x_ts"))).drop("w_ts"))
        return inner.join(f["z"], (F.col("x_k") == F.col("z_k")) & near(F.col("z_ts"), F.col("x_ts")), "full_outer")

    with temporary_conf(spark, {"spark.sql.shuffle.partitions": "2"}):
        on, running = run_to_end(query(), "outer_on", tmp_path / "ck-on")
        with temporary_conf(spark, SPARK_JOINS):
            off, _ = run_to_end(query(), "outer_off", tmp_path / "ck-off")
    plan = executed_plan(running)
    assert plan.count("StreamingUMJoin inputs=") == 1 and plan.count("StreamingSymmetricHashJoin") == 1, plan
    (reason,) = plans.unconverted_streaming_joins(spark, running)
    assert re.fullmatch(r"the FULL OUTER stream-stream join on x_k = z_k stays as Spark planned it: "
                        r"rules/streaming.yaml admits no FULL OUTER stream-stream joins \(both its sides are padded: .*\)", reason), reason
    assert on == off and any(row[-1] is None for row in on) and any(row[-1] is not None for row in on)


def test_state_ttl_bounds_state_and_changes_results(spark: SparkSession, tmp_path: Path) -> None:
    """With a TTL shorter than a batch, rows only meet rows of their own batch (documented: TTL changes results)."""
    for name in "xyz":
        write_batches(tmp_path / name, f"{name}_k BIGINT, {name}_v BIGINT", [[(1, b * 10 + i) for i in range(2)] for b in range(3)])
    frames = {n: stream(spark, tmp_path / n, f"{n}_k BIGINT, {n}_v BIGINT") for n in "xyz"}
    with temporary_conf(spark, {"spark.umjoin.stateTtl": "1ms"}):
        rows, query = run_to_end(star(frames, "xyz"), "ttl", tmp_path / "ck")
    assert len(rows) == 3 * 2**3  # per batch: 2 rows of each stream with key 1; nothing across batches
    assert all(r[1] // 10 == r[3] // 10 == r[5] // 10 for r in rows)
    # Only the last batch's rows remain (2 per stream): earlier ones expired before each batch probed.
    (umjoin,) = [op for op in query.lastProgress["stateOperators"] if op["operatorName"] == "umJoin"]
    assert umjoin["numRowsTotal"] == 6 and umjoin["numRowsRemoved"] == 6


@pytest.mark.parametrize(("value", "message"), [("forever", "a positive duration such as 30s, 10m or 2h"), ("-1s", "a positive duration")])
def test_invalid_state_ttl_fails_with_a_clear_error(spark: SparkSession, tmp_path: Path, value: str, message: str) -> None:
    for name in "xyz":
        write_batches(tmp_path / name, f"{name}_k BIGINT", [[(1,)]])
    frames = {n: stream(spark, tmp_path / n, f"{n}_k BIGINT") for n in "xyz"}
    with temporary_conf(spark, {"spark.umjoin.stateTtl": value}):
        with pytest.raises(Exception) as failure:
            run_to_end(star(frames, "xyz"), f"bad_ttl_{len(value)}", tmp_path / "ck")
    assert "spark.umjoin.stateTtl" in str(failure.value) and message in str(failure.value)


def _run_star_to_files(spark: SparkSession, directory: Path) -> StreamingQuery:
    frames = {n: stream(spark, directory / n, f"{n}_k BIGINT") for n in "xyz"}
    query = (star(frames, "xyz").writeStream.format("parquet").option("path", str(directory / "out"))
             .option("checkpointLocation", str(directory / "ck")).trigger(availableNow=True).start())
    query.awaitTermination()
    return query


def test_a_checkpoint_of_a_streaming_umjoin_on_hdfs_stores_restarted_without_umjoin_is_refused_clearly(spark: SparkSession, tmp_path: Path) -> None:
    """Spark's joins take a StreamingUMJoin's state back on RocksDB only (Spark's HDFS-backed store cannot start a
    store at a later version): on Spark's default store, a restart with UMJoin off is refused with the reason."""
    for name in "xyz":
        write_batches(tmp_path / name, f"{name}_k BIGINT", [[(1,), (2,)]])
    _run_star_to_files(spark, tmp_path)
    for name in "xyz":
        write_batches(tmp_path / name, f"{name}_k BIGINT", [[(1,)]])
    with temporary_conf(spark, {"spark.umjoin.enabled": "false"}):
        with pytest.raises(Exception) as failure:
            _run_star_to_files(spark, tmp_path)
    assert "holds StreamingUMJoin state for operator 0" in str(failure.value)
    assert "HDFS-backed state store" in str(failure.value)
    assert "Restart with spark.umjoin.enabled=true" in str(failure.value)


def test_a_join_umjoin_leaves_to_spark_keeps_sparks_operator_ids_so_its_checkpoint_restarts_without_umjoin(spark: SparkSession, tmp_path: Path) -> None:
    """A stream-stream join of two streams stays Spark's (fewer inputs than spark.umjoin.minInputs): UMJoin takes
    no operator id for it, so Spark's own restart check passes when the query goes on without UMJoin, every row once."""
    keys = {name: [[1, 2], [1, 2]] for name in "xy"}
    for name, batches in keys.items():
        write_batches(tmp_path / name, f"{name}_k BIGINT", [[(k,) for k in batches[0]]])

    def run() -> StreamingQuery:
        frames = {n: stream(spark, tmp_path / n, f"{n}_k BIGINT") for n in "xy"}
        query = (star(frames, "xy").writeStream.format("parquet").option("path", str(tmp_path / "out"))
                 .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
        query.awaitTermination()
        return query

    assert "StreamingUMJoin" not in executed_plan(run())
    for name, batches in keys.items():
        write_batches(tmp_path / name, f"{name}_k BIGINT", [[(k,) for k in batches[1]]])
    with temporary_conf(spark, {"spark.umjoin.enabled": "false"}):
        run()
    rows = sorted(tuple(r) for r in spark.read.parquet(str(tmp_path / "out")).collect())
    every = {name: [k for batch in batches for k in batch] for name, batches in keys.items()}
    assert rows == sorted((x, y) for x in every["x"] for y in every["y"] if x == y) and len(rows) == 8


def test_a_checkpoint_of_sparks_joins_restarted_with_umjoin_runs_its_first_micro_batch_with_sparks_joins_and_says_why(spark: SparkSession, tmp_path: Path) -> None:
    """Written with UMJoin off (or by a version that did not convert the join), the state is Spark's joins':
    restarted with UMJoin on, the run's first micro-batch (the only one here) runs them as they ran (Spark checks
    the checkpoint's operators against its plan), every row once, and the reason is reported (the take-over in
    the next micro-batch: tests/test_switch_over.py)."""
    keys = {name: [[1, 2], [1]] for name in "xyz"}
    for name, batches in keys.items():
        write_batches(tmp_path / name, f"{name}_k BIGINT", [[(k,) for k in batches[0]]])
    with temporary_conf(spark, {"spark.umjoin.enabled": "false"}):
        _run_star_to_files(spark, tmp_path)
    for name, batches in keys.items():
        write_batches(tmp_path / name, f"{name}_k BIGINT", [[(k,) for k in batches[1]]])
    query = _run_star_to_files(spark, tmp_path)

    assert "StreamingUMJoin" not in executed_plan(query)
    rows = sorted(tuple(r) for r in spark.read.parquet(str(tmp_path / "out")).collect())
    every = {name: [k for batch in batches for k in batch] for name, batches in keys.items()}
    assert rows == sorted((x, y, z) for x in every["x"] for y in every["y"] for z in every["z"] if x == y == z)
    reasons = plans.unconverted_streaming_joins(spark, query)
    assert any("holds the state of operator" in r and "written when its join ran as Spark's join" in r
               and "takes their state over in the next micro-batch" in r for r in reasons), reasons


def test_umjoin_state_under_the_metadata_of_sparks_join_is_refused_with_the_fix(spark: SparkSession, tmp_path: Path) -> None:
    """Versions before the planner replaced Spark's joins after Spark had planned them, so the checkpoint's metadata
    names Spark's join where UMJoin's state is. Such a checkpoint (here: Spark's joins' checkpoint with a StreamingUMJoin
    layout record written beside the top join's state, as those versions kept it) is refused on the run's first
    micro-batch, saying which version can finish it, rather than run as Spark's joins over UMJoin's stores."""
    for directory in (tmp_path, tmp_path / "umjoin"):
        for name in "xyz":
            write_batches(directory / name, f"{name}_k BIGINT", [[(1,), (2,)]])
    with temporary_conf(spark, {"spark.umjoin.enabled": "false"}):
        _run_star_to_files(spark, tmp_path)
    _run_star_to_files(spark, tmp_path / "umjoin")
    (layout,) = (tmp_path / "umjoin" / "ck" / "state").glob("*/_umjoin_layout.json")
    (tmp_path / "ck" / "state" / "0" / layout.name).write_text(layout.read_text())
    for name in "xyz":
        write_batches(tmp_path / name, f"{name}_k BIGINT", [[(1,)]])
    with pytest.raises(Exception) as failure:
        _run_star_to_files(spark, tmp_path)
    assert "written by an earlier version of UMJoin" in str(failure.value)
    assert "Finish the query with the UMJoin version that wrote it, or use a new checkpoint location" in str(failure.value)


def test_adaptive_probe_order_keeps_statistics_across_batches_and_the_answer(spark: SparkSession, tmp_path: Path) -> None:
    """dpPick re-chooses every stream's route between micro-batches from the batches before; the
    routes change (y matches few keys, z all of them) and the answer stays the batch join's."""
    rng = random.Random(5)
    domains = {"x": 40, "y": 3, "z": 40, "w": 20}
    for name, domain in domains.items():
        batches = [[(rng.randrange(domain), rng.randrange(1000)) for _ in range(12)] for _ in range(6)]
        write_batches(tmp_path / name, f"{name}_k BIGINT, {name}_v BIGINT", batches)
    names = "".join(domains)
    frames = {n: stream(spark, tmp_path / n, f"{n}_k BIGINT, {n}_v BIGINT") for n in names}
    settings = {"spark.umjoin.probeOrder": "dpPick", "spark.umjoin.dpPick.period": "1ms", "spark.sql.shuffle.partitions": "2"}
    with temporary_conf(spark, settings):
        on, query = run_to_end(star(frames, names), "umjoin_dppick", tmp_path / "ck")
    changes = [op["customMetrics"]["probeRouteChanges"] for p in query.recentProgress for op in p["stateOperators"] if op["operatorName"] == "umJoin"]
    with temporary_conf(spark, {"spark.umjoin.enabled": "false"}):
        expected = sorted_rows(star({n: spark.read.parquet(str(tmp_path / n)) for n in names}, names))
    assert on == expected and len(expected) > 0
    assert len(changes) == 6 and changes[0] == 0  # the first batch has no statistics yet: the plan's order
    assert sum(changes) > 0, changes
