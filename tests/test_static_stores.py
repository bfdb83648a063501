"""Stored static tables (issue 14): a table too big to broadcast, joined with streams, is written into the
StreamingUMJoin's stores when the query starts and again only when it changes, and probed there through
each executor's cache (spark.umjoin.staticCache). Answers are checked against Spark's own stream-static
join and against the join computed here row by row, phase by phase, with the table as it was then."""

from __future__ import annotations

import gc
import json
import os
import random
import re
import time
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from umjoin import plans
from umjoin.local import temporary_conf

import stream_data
from test_streaming import ROCKSDB, executed_plan, nulls_first, sorted_rows, stream, write_batches

X_COLUMNS = "x_k BIGINT, x_v BIGINT"
Y_COLUMNS = "y_k BIGINT, y_j BIGINT"
T_SCHEMA = "t_j BIGINT, t_v BIGINT, t_pad STRING"
T_LENGTH = 1024

Row = tuple  # type: ignore[type-arg]


def write_table(path: Path, rows: list[tuple[int | None, int]], mtime: int) -> None:
    """The static table as one CSV file of T_LENGTH bytes: its rows, then one row with a NULL key whose
    last field pads the file. Spark lists a table's files once, when the query starts, and reads each
    file up to the length listed then: a change keeps the file's name and length (and, as any rewrite
    does, moves its modification time)."""
    body = "".join(f"{'' if j is None else j},{v},\n" for j, v in rows)
    pad = T_LENGTH - len(body) - len(",,\n")
    assert pad >= 0
    path.write_text(body + ",," + "p" * pad + "\n")
    os.utime(path, (mtime, mtime))


def table_rows(rows: list[tuple[int | None, int]]) -> list[Row]:
    body = "".join(f"{'' if j is None else j},{v},\n" for j, v in rows)
    return [(j, v, None) for j, v in rows] + [(None, None, "p" * (T_LENGTH - len(body) - 3))]


def random_table(rng: random.Random) -> list[tuple[int | None, int]]:
    """Keys 0-5 with 0-3 rows each (key 6 and 7 never: stream rows find no master row), and NULL keys."""
    rows: list[tuple[int | None, int]] = [(k, rng.randrange(1000)) for k in range(6) for _ in range(rng.randrange(4))]
    return rows + [(None, rng.randrange(1000)) for _ in range(2)]


def phase_data(rng: random.Random, extra: str | None = None) -> tuple[list[Row], list[Row]]:
    """One phase's stream rows; y's keys into t are skewed towards 0 and 1 (hot keys), some are NULL, and so
    are some of x's keys. `extra` (PHASE_EXTRAS): every x key NULL, or no y row (an empty micro-batch)."""
    xs = [(None if extra == X_ALL_NULL else rng.choice([None, *range(6)]), rng.randrange(1000)) for _ in range(12)]
    ys = [(rng.randrange(6), rng.choice([None, 0, 0, 0, 1, 1, 2, 3, 4, 5, 6, 7])) for _ in range(0 if extra == Y_EMPTY else 12)]
    return xs, ys


X_ALL_NULL, Y_EMPTY = "every x key NULL", "no y row"
#: The five phases of test_a_stored_table_gives_spark_answers_across_its_changes: besides NULL and duplicate keys in
#: every phase, x's keys all NULL in one and y without a row in another (not in phases 3 and 4: the cache learns
#: there, then serves). The first table's keys are all NULL (only its padding row), the rewrite's some.
PHASE_EXTRAS: dict[int, str] = {1: X_ALL_NULL, 2: Y_EMPTY}


def changing_table_case(seed: int = 14) -> tuple[list[list[tuple[int | None, int]]], list[tuple[list[Row], list[Row], list[Row]]]]:
    """The table in each of the five phases (rewritten before phase 1, the same rows touched before phase 2) and each
    phase's stream rows with the table's rows then."""
    rng = random.Random(seed)
    first, rewritten = [(None, rng.randrange(1000)) for _ in range(3)], random_table(rng)
    tables = [first, rewritten, rewritten, rewritten, rewritten]
    return tables, [(*phase_data(rng, PHASE_EXTRAS.get(p)), table_rows(tables[p])) for p in range(5)]


def expected_join(phases: list[tuple[list[Row], list[Row], list[Row]]]) -> list[Row]:
    """x JOIN y ON x_k = y_k JOIN t ON y_j = t_j, where a pair of stream rows meets the table as it was in
    the phase the later of the two arrived in (every phase's rows are processed before the table changes)."""
    out = []
    for px, (xs, _, _) in enumerate(phases):
        for py, (_, ys, _) in enumerate(phases):
            table = phases[max(px, py)][2]
            for x in xs:
                for y in ys:
                    if x[0] is not None and x[0] == y[0]:
                        out += [x + y + t for t in table if y[1] is not None and t[0] == y[1]]
    return sorted(out, key=nulls_first)


def process_all(query: StreamingQuery, files: int) -> None:
    """Waits until the query has read the first `files` files of each stream: processAllAvailable alone may return
    while a file written just before is not listed yet (then the table would change before its batch). Files, not
    rows: a file whose join keys are all NULL reads as no row (Spark's pushed IS NOT NULL skips its row groups)."""
    def last_files() -> list[int]:  # per stream, the number of the last file read (its source's end offset)
        ends = [source["endOffset"] for p in query.recentProgress[-1:] for source in p["sources"]]
        return [int(json.loads(end)["logOffset"]) if isinstance(end, str) else -1 if end is None else int(end["logOffset"]) for end in ends]
    deadline = time.time() + 60
    while (read := last_files()) != [files - 1] * len(read) or not read:
        if time.time() >= deadline:
            raise AssertionError(f"the query read files {read} of each stream, not all {files}")
        query.processAllAvailable()
        time.sleep(0.1)


def join(x: DataFrame, y: DataFrame, t: DataFrame) -> DataFrame:
    return x.join(y, x.x_k == y.y_k).join(t, y.y_j == t.t_j)


def umjoin_metric(query: StreamingQuery, name: str) -> int:
    return sum(op["customMetrics"].get(name, 0) for p in query.recentProgress for op in p["stateOperators"] if op["operatorName"] == "umJoin")


def static_input(plan: str) -> tuple[str, str]:
    """The static table's input number and how the plan places it."""
    (found,) = re.findall(r"#(\d+) [^(]*\((static, [^)]*)partitioned by t_j", plan)
    return found


#: t too big to broadcast, and stored whatever its size (by default only tables Spark estimates far larger than a
#: micro-batch are: test_by_default_only_a_table_estimated_far_larger_than_a_micro_batch_is_stored).
SETTINGS = {"spark.sql.autoBroadcastJoinThreshold": "-1", "spark.sql.shuffle.partitions": "2", "spark.umjoin.staticTables": "store"}


def test_the_changing_tables_phases_hold_users_data_on_every_side_of_both_joins() -> None:
    """x JOIN y ON x_k = y_k (stream-stream) JOIN t ON y_j = t_j (stream-static, t stored): per join and side, what
    the phases hold there (stream_data.features: each stream's phases are its micro-batches; t's rows over its versions)."""
    tables, phases = changing_table_case()
    xs, ys = [list(phase[0]) for phase in phases], [list(phase[1]) for phase in phases]
    covered = {("x-y", "x"): stream_data.features(xs, [0]), ("x-y", "y"): stream_data.features(ys, [0]),
               ("y-t", "y"): stream_data.features(ys, [1]),
               ("y-t", "t"): set().union(*(stream_data.features([[row for row in table_rows(t) if row[2] is None]], [0]) for t in tables))}
    wanted = {("x-y", "x"): [stream_data.NULL_KEYS, stream_data.DUPLICATE_KEYS], ("x-y", "y"): [stream_data.DUPLICATE_KEYS, stream_data.EMPTY_BATCH],
              ("y-t", "y"): [stream_data.NULL_KEYS, stream_data.DUPLICATE_KEYS, stream_data.EMPTY_BATCH],
              ("y-t", "t"): [stream_data.NULL_KEYS, stream_data.ALL_NULL, stream_data.DUPLICATE_KEYS]}
    assert not stream_data.missing(covered, wanted), stream_data.missing(covered, wanted)
    assert all(x[0] is None for x in xs[1]) and xs[1]  # every x key NULL in one micro-batch (stream_data.ALL_NULL holds over a whole stream)


@pytest.mark.parametrize(("mode", "provider"), [
    ("spark", "hdfs"), ("off", "rocksdb-snapshots"), ("ssbj", "rocksdb"), ("all", "rocksdb"), ("ssbj", "hdfs")])
def test_a_stored_table_gives_spark_answers_across_its_changes(spark: SparkSession, tmp_path: Path, mode: str, provider: str) -> None:
    """Streams x and y joined with a static table t too big to broadcast over five phases; between phases t is
    rewritten (other rows), then only touched, then left alone twice (so a cache has a batch to learn in and one to serve). Spark's stream-static join (mode 'spark') and
    UMJoin with each cache mode give the join of each phase's rows with t as it was then; UMJoin loads t into
    its stores three times (start, rewrite, touch) and probes the stores otherwise. RocksDB stores commit with
    changelog checkpointing unless the session turns it off ('rocksdb-snapshots'): then the rows are in SST files."""
    tables, phases = changing_table_case()
    (tmp_path / "t").mkdir()
    t_file = tmp_path / "t" / "t.csv"
    view = f"stored_{mode}_{provider}".replace("-", "_")
    settings = {**SETTINGS, **(ROCKSDB if provider.startswith("rocksdb") else {})}
    if provider == "rocksdb-snapshots":
        settings["spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"] = "false"
    settings.update({"spark.umjoin.enabled": "false"} if mode == "spark" else {"spark.umjoin.staticCache": mode})
    with temporary_conf(spark, settings):
        write_table(t_file, tables[0], 2_000_000)
        for name, columns, rows in (("x", X_COLUMNS, phases[0][0]), ("y", Y_COLUMNS, phases[0][1])):
            write_batches(tmp_path / name, columns, [rows])
        t = spark.read.schema(T_SCHEMA).csv(str(tmp_path / "t"))
        frame = join(stream(spark, tmp_path / "x", X_COLUMNS), stream(spark, tmp_path / "y", Y_COLUMNS), t)
        query = frame.writeStream.format("memory").queryName(view).option("checkpointLocation", str(tmp_path / "ck")).start()
        try:
            process_all(query, 1)
            for p in range(1, 5):
                if p < 3:  # a rewrite with other rows, then the same rows touched
                    write_table(t_file, tables[p], 2_000_000 + p)
                write_batches(tmp_path / "x", X_COLUMNS, [phases[p][0]])
                write_batches(tmp_path / "y", Y_COLUMNS, [phases[p][1]])
                process_all(query, p + 1)
            plan = executed_plan(query)
        finally:
            query.stop()
        rows = sorted_rows(spark.table(view))
    expected = expected_join(phases)
    assert len({r[5] for r in expected}) > 5  # the rewrite shows: t's values differ between phases
    assert rows == expected
    if mode == "spark":
        assert "StreamingUMJoin" not in plan
        return
    number, placement = static_input(plan)
    assert placement == f"static, stored, cache {mode}, "
    probes = umjoin_metric(query, f"probesInput{number}")
    hits, misses = (umjoin_metric(query, f"staticCache{kind}Input{number}") for kind in ("Hits", "Misses"))
    assert umjoin_metric(query, f"staticLoadsInput{number}") == 3
    assert probes > 0 and hits + misses <= probes
    if mode == "off":
        assert hits == 0 and umjoin_metric(query, f"staticCachedKeysInput{number}") == 0
    else:
        assert hits > 0 and umjoin_metric(query, f"staticCachedBytesInput{number}") > 0
    changelogs = list((tmp_path / "ck" / "state").rglob("*.changelog"))
    assert bool(changelogs) == (provider == "rocksdb")
    if provider == "rocksdb-snapshots":
        assert umjoin_metric(query, f"staticDiskBytesInput{number}") > 0


def test_a_restart_loads_the_table_again_and_writes_every_row_once(spark: SparkSession, tmp_path: Path) -> None:
    """Two runs on one checkpoint with t rewritten between them: the second run loads t again (an executor's
    cache and the driver's record of t's files belong to their query run) and joins its rows with the new t;
    the output holds every row once."""
    rng = random.Random(3)
    (tmp_path / "t").mkdir()
    t_file = tmp_path / "t" / "t.csv"
    tables = [random_table(rng), random_table(rng)]
    phases = [(*phase_data(rng), table_rows(tables[p])) for p in range(2)]
    loads = []
    with temporary_conf(spark, {**SETTINGS, **ROCKSDB, "spark.umjoin.staticCache": "ssbj"}):
        for p in range(2):
            write_table(t_file, tables[p], 2_000_000 + p)
            write_batches(tmp_path / "x", X_COLUMNS, [phases[p][0]])
            write_batches(tmp_path / "y", Y_COLUMNS, [phases[p][1]])
            t = spark.read.schema(T_SCHEMA).csv(str(tmp_path / "t"))
            frame = join(stream(spark, tmp_path / "x", X_COLUMNS), stream(spark, tmp_path / "y", Y_COLUMNS), t)
            query = (frame.writeStream.format("parquet").option("path", str(tmp_path / "out"))
                     .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
            query.awaitTermination()
            number, _ = static_input(executed_plan(query))
            loads.append(umjoin_metric(query, f"staticLoadsInput{number}"))
        rows = sorted_rows(spark.read.parquet(str(tmp_path / "out")))
    assert loads == [1, 1]
    assert rows == expected_join(phases) and len(rows) > 0


def test_what_a_query_run_keeps_on_the_driver_goes_with_the_query(spark: SparkSession, tmp_path: Path) -> None:
    """What a run's StreamingUMJoins keep between micro-batches (its StreamingRun: notes, routes, a stored table's
    load) is held for the session Spark runs the query's micro-batches in, and does not keep that session: once the
    query ended and its object is dropped, the session is collected (a stored table's load keeps a plan, which
    keeps the session: the load goes when the query ends)."""
    rng = random.Random(5)
    (tmp_path / "t").mkdir()
    write_table(tmp_path / "t" / "t.csv", random_table(rng), 2_000_000)
    x_rows, y_rows = phase_data(rng)
    write_batches(tmp_path / "x", X_COLUMNS, [x_rows])
    write_batches(tmp_path / "y", Y_COLUMNS, [y_rows])
    jvm = spark._jvm  # type: ignore[union-attr]
    with temporary_conf(spark, {**SETTINGS, "spark.umjoin.staticCache": "ssbj"}):
        t = spark.read.schema(T_SCHEMA).csv(str(tmp_path / "t"))
        frame = join(stream(spark, tmp_path / "x", X_COLUMNS), stream(spark, tmp_path / "y", Y_COLUMNS), t)
        query = frame.writeStream.format("noop").option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start()
        query.awaitTermination()
    assert "static, stored" in executed_plan(query), executed_plan(query)
    session = query._jsq.streamingQuery().sparkSessionForStream()
    assert jvm.umjoin.spark.streaming.StreamingRun.existing(session).isDefined()
    collected = jvm.java.lang.ref.WeakReference(session)
    del query, session, frame, t
    gc.collect()  # (py4j then lets the JVM's references go)
    deadline = time.time() + 30
    # (refersTo, not get: what get returns py4j would hold on to)
    while not collected.refersTo(None) and time.time() < deadline:
        jvm.java.lang.System.gc()
        time.sleep(0.5)
    assert collected.refersTo(None), "the query run's session was kept after the query ended and was dropped"


@pytest.mark.parametrize("why", ["nondeterministic", "staticTables=reread"])
def test_a_table_that_is_not_stored_is_read_every_batch(spark: SparkSession, tmp_path: Path, why: str) -> None:
    """A static side with a nondeterministic expression cannot be stored (its rows may differ in every batch),
    and spark.umjoin.staticTables=reread stores none: such a table is read and partitioned in every batch,
    as Spark does, with Spark's answers."""
    rng = random.Random(8)
    (tmp_path / "t").mkdir()
    write_table(tmp_path / "t" / "t.csv", random_table(rng), 2_000_000)
    phases = [(*phase_data(rng), None) for _ in range(2)]
    settings = {**SETTINGS, **({"spark.umjoin.staticTables": "reread"} if why == "staticTables=reread" else {})}
    with temporary_conf(spark, settings):
        for name, columns, part in (("x", X_COLUMNS, 0), ("y", Y_COLUMNS, 1)):
            write_batches(tmp_path / name, columns, [phase[part] for phase in phases])
        t = spark.read.schema(T_SCHEMA).csv(str(tmp_path / "t"))
        if why == "nondeterministic":
            t = t.where(F.rand() + F.col("t_v") >= 0)  # true, but not folded away
        frame = join(stream(spark, tmp_path / "x", X_COLUMNS), stream(spark, tmp_path / "y", Y_COLUMNS), t)
        name = f"unstored_{why.replace('=', '_')}"
        query = frame.writeStream.format("memory").queryName(name).option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start()
        query.awaitTermination()
        rows = sorted_rows(spark.table(name))
        with temporary_conf(spark, {"spark.umjoin.enabled": "false"}):
            expected = sorted_rows(join(spark.read.parquet(str(tmp_path / "x")), spark.read.parquet(str(tmp_path / "y")), t))
    _, placement = static_input(executed_plan(query))
    assert placement == "static, read every batch, "
    assert rows == expected and len(rows) > 0


@pytest.mark.parametrize(("mode", "adaptive"), [
    ("spark", "on,on,on"), ("ssbj", "on,on,on"), ("off", "on,off,on"), ("all", "off,on,off")])
def test_one_stream_joined_with_static_tables_keeps_only_the_stored_tables(spark: SparkSession, tmp_path: Path, mode: str, adaptive: str) -> None:
    """One stream x joined with a stored table t and a broadcast table u: Spark keeps no state for such
    stream-static joins, but scans and shuffles t every micro-batch. The StreamingUMJoin takes a new operator
    id, stores t once per run (three runs on one checkpoint here, t rewritten before the second), keeps none of
    x's rows, and gives the join of each run's rows with t as it was then, as Spark's stream-static join (mode
    'spark') does. Spark plans such micro-batches adaptively when AQE is on, its default: the StreamingUMJoin
    runs all the same, and a checkpoint continues when a restart switches AQE on or off (`adaptive`: per run)."""
    rng = random.Random(21)
    (tmp_path / "t").mkdir()
    t_file = tmp_path / "t" / "t.csv"
    first, rewritten = random_table(rng), random_table(rng)
    tables = [first, rewritten, rewritten]
    u_rows = [(k, f"u{k}") for k in range(4)]
    write_batches(tmp_path / "u", "u_k BIGINT, u_name VARCHAR", [u_rows])
    phases = [[(rng.choice([None, *range(8)]), rng.randrange(6)) for _ in range(15)] for _ in range(3)]
    executed, loads, stream_rows = [], [], []
    settings = {**SETTINGS, **ROCKSDB, **({"spark.umjoin.enabled": "false"} if mode == "spark" else {"spark.umjoin.staticCache": mode})}
    with temporary_conf(spark, settings):
        for p, aqe in enumerate(adaptive.split(",")):
            write_table(t_file, tables[p], 2_000_000 + p)
            write_batches(tmp_path / "x", X_COLUMNS, [phases[p]])
            with temporary_conf(spark, {"spark.sql.adaptive.enabled": str(aqe == "on").lower()}):
                t = spark.read.schema(T_SCHEMA).csv(str(tmp_path / "t"))
                u = F.broadcast(spark.read.parquet(str(tmp_path / "u")))
                x = stream(spark, tmp_path / "x", X_COLUMNS)
                frame = x.join(t, x.x_k == t.t_j).join(u, x.x_v == u.u_k)
                query = (frame.writeStream.format("parquet").option("path", str(tmp_path / "out"))
                         .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
                query.awaitTermination()
            plan = executed_plan(query)
            executed.append(plan)
            if mode == "spark":
                assert plans.unconverted_streaming_joins(spark, query) == []  # UMJoin off has nothing to say
                continue
            number, _ = static_input(plan)
            loads.append(umjoin_metric(query, f"staticLoadsInput{number}"))
            stream_input = re.findall(r"#(\d+) x \(partitioned by", plan)[0]
            stream_rows.append(umjoin_metric(query, f"stateRowsInput{stream_input}"))
        rows = sorted_rows(spark.read.parquet(str(tmp_path / "out")))
    expected = sorted(
        ((xk, xv, *trow, uk, name) for p in range(3) for xk, xv in phases[p] for trow in table_rows(tables[p])
         for uk, name in u_rows if xk is not None and xk == trow[0] and xv == uk),
        key=nulls_first)
    assert rows == expected and len(rows) > 0
    if mode == "spark":
        assert not any("StreamingUMJoin" in plan for plan in executed)
        return
    assert all("StreamingUMJoin" in plan and "(static, broadcast)" in plan for plan in executed), executed[0]
    assert loads == [1, 1, 1] and stream_rows == [0, 0, 0]


#: How the first run of a checkpoint joins one stream with the table: Spark's stream-static join either way.
FIRST_RUNS = {"reread": {"spark.umjoin.staticTables": "reread"}, "UMJoin off": {"spark.umjoin.enabled": "false"}}


@pytest.mark.parametrize("first", list(FIRST_RUNS))
def test_one_stream_with_a_table_stored_from_a_later_micro_batch_on_converts_there(spark: SparkSession, tmp_path: Path, first: str) -> None:
    """One stream joined with a table as Spark's stream-static join (no state: the table read again every batch, or
    UMJoin off), then restarted to store the table, on RocksDB: the restart's first micro-batch stays Spark's join
    (Spark checks the checkpoint's operators then), its second converts with the stores starting empty at its version
    and the table loaded into them, and a further restart goes on with UMJoin from its first micro-batch; the output
    holds every row once."""
    table, phases = _table_u_and_two_phases(tmp_path, random.Random(30))
    # Run 2 reads two files of x (two micro-batches), run 3 one more.
    runs = [(FIRST_RUNS[first], [phases[0]]), ({}, [phases[1][:5], phases[1][5:8]]), ({}, [phases[1][8:]])]
    executed, batches = [], []
    with temporary_conf(spark, {**SETTINGS, **ROCKSDB}):
        for settings, files in runs:
            write_batches(tmp_path / "x", X_COLUMNS, files)
            with temporary_conf(spark, settings):
                query = _stored_and_broadcast_join(spark, tmp_path)
            executed.append(executed_plan(query))
            batches.append([p["batchId"] for p in query.recentProgress if p["numInputRows"] > 0])
        rows = sorted_rows(spark.read.parquet(str(tmp_path / "out")))
    assert rows == _expected_with_u(phases, table) and len(rows) > 0
    assert batches == [[0], [1, 2], [3]], batches
    assert ["StreamingUMJoin" in plan for plan in executed] == [False, True, True]


def test_one_stream_with_static_tables_whose_state_missed_batches_stays_as_spark_planned_it_on_hdfs(spark: SparkSession, tmp_path: Path) -> None:
    """The same on Spark's default state store (HDFS-backed, kept by the checkpoint), which cannot start a store at a
    later version: the join stays as Spark planned it (no stack trace), says why, and the output holds every row once."""
    table, phases = _table_u_and_two_phases(tmp_path, random.Random(30))
    executed, reasons = [], []
    with temporary_conf(spark, SETTINGS):
        for p, mode in enumerate(["reread", "store"]):
            write_batches(tmp_path / "x", X_COLUMNS, [phases[p]])
            with temporary_conf(spark, {"spark.umjoin.staticTables": mode}):
                query = _stored_and_broadcast_join(spark, tmp_path)
            executed.append(executed_plan(query))
            reasons.append(plans.unconverted_streaming_joins(spark, query))
        rows = sorted_rows(spark.read.parquet(str(tmp_path / "out")))
    assert rows == _expected_with_u(phases, table) and len(rows) > 0
    assert ["StreamingUMJoin" in plan for plan in executed] == [False, False]
    assert any("without UMJoin's state" in r and "HDFS-backed" in r for r in reasons[1]), reasons[1]


def test_one_stream_with_a_stored_table_restarted_without_umjoin_switches_back_to_sparks_join(spark: SparkSession, tmp_path: Path) -> None:
    """A StreamingUMJoin of one stream and a stored table is a stateful operator in the checkpoint's metadata, as
    Spark's own are (Spark's restart check refuses one the plan lacks): restarted with UMJoin off, the run's first
    micro-batch continues it, and from the second Spark's stream-static join (which keeps no state) runs in its
    place, the StreamingUMJoin's state moved away; a further restart runs Spark's join from its first micro-batch.
    Every row once."""
    table, _ = _table_u_and_two_phases(tmp_path, random.Random(31))
    rng = random.Random(32)
    phases = [[(rng.choice([None, *range(8)]), rng.randrange(6)) for _ in range(10)] for _ in range(4)]
    executed = []
    with temporary_conf(spark, {**SETTINGS, **ROCKSDB}):
        for run, (batches, on) in enumerate([(phases[:1], True), (phases[1:3], False), (phases[3:], False)]):
            write_batches(tmp_path / "x", X_COLUMNS, batches)
            with temporary_conf(spark, {"spark.umjoin.enabled": str(on).lower()}):
                executed.append(executed_plan(_stored_and_broadcast_join(spark, tmp_path)))
        rows = sorted_rows(spark.read.parquet(str(tmp_path / "out")))
    assert rows == _expected_with_u(phases, table) and len(rows) > 0
    assert ["StreamingUMJoin" in plan for plan in executed] == [True, False, False]
    assert [p.name for p in (tmp_path / "ck" / "umjoin").iterdir()] == ["taken-back-2"]
    assert not (tmp_path / "ck" / "state" / "1000000" / "_metadata").exists()


def _table_u_and_two_phases(tmp_path: Path, rng: random.Random) -> tuple[list[tuple[int | None, int]], list[list[tuple[int | None, int]]]]:
    """Writes t (a random table) and u (keys 0-3 named u<k>) under tmp_path; x's rows of two runs (not written)."""
    (tmp_path / "t").mkdir()
    table = random_table(rng)
    write_table(tmp_path / "t" / "t.csv", table, 2_000_000)
    write_batches(tmp_path / "u", "u_k BIGINT, u_name VARCHAR", [[(k, f"u{k}") for k in range(4)]])
    phases = [[(rng.choice([None, *range(8)]), rng.randrange(6)) for _ in range(10)] for _ in range(2)]
    return table, phases


def _stored_and_broadcast_join(spark: SparkSession, tmp_path: Path) -> StreamingQuery:
    """x JOIN t ON x_k = t_j JOIN broadcast(u) ON x_v = u_k into Parquet files, run to the end of x's files."""
    t = spark.read.schema(T_SCHEMA).csv(str(tmp_path / "t"))
    u = F.broadcast(spark.read.parquet(str(tmp_path / "u")))
    x = stream(spark, tmp_path / "x", X_COLUMNS)
    query = (x.join(t, x.x_k == t.t_j).join(u, x.x_v == u.u_k).writeStream.format("parquet").option("path", str(tmp_path / "out"))
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    query.awaitTermination()
    return query


def _expected_with_u(phases: list[list[tuple[int | None, int]]], table: list[tuple[int | None, int]]) -> list[Row]:
    """x JOIN t JOIN u computed here, row by row (u: keys 0-3 named u<k>)."""
    return sorted(
        ((xk, xv, *trow, uk, f"u{uk}") for phase in phases for xk, xv in phase for trow in table_rows(table)
         for uk in range(4) if xk is not None and xk == trow[0] and xv == uk),
        key=nulls_first)


def test_one_stream_with_tables_small_enough_to_broadcast_stays_adaptive_and_says_why(spark: SparkSession, tmp_path: Path) -> None:
    """Under AQE, a micro-batch joining one stream with tables Spark broadcasts has nothing for UMJoin to
    store: it is planned adaptively, as without UMJoin, with Spark's answer, and the reason is told."""
    rng = random.Random(5)
    (tmp_path / "t").mkdir()
    table = random_table(rng)
    write_table(tmp_path / "t" / "t.csv", table, 2_000_000)
    write_batches(tmp_path / "u", "u_k BIGINT, u_name VARCHAR", [[(k, f"u{k}") for k in range(4)]])
    rows_in = [(rng.choice([None, *range(8)]), rng.randrange(6)) for _ in range(10)]
    write_batches(tmp_path / "x", X_COLUMNS, [rows_in])
    with temporary_conf(spark, {"spark.sql.adaptive.enabled": "true", "spark.sql.shuffle.partitions": "2"}):
        t = spark.read.schema(T_SCHEMA).csv(str(tmp_path / "t"))
        u = spark.read.parquet(str(tmp_path / "u"))
        x = stream(spark, tmp_path / "x", X_COLUMNS)
        query = (x.join(t, x.x_k == t.t_j).join(u, x.x_v == u.u_k).writeStream.format("parquet").option("path", str(tmp_path / "out"))
                 .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
        query.awaitTermination()
        rows = sorted_rows(spark.read.parquet(str(tmp_path / "out")))
        reasons = plans.unconverted_streaming_joins(spark, query)
    expected = sorted(
        ((xk, xv, *trow, uk, f"u{uk}") for xk, xv in rows_in for trow in table_rows(table) for uk in range(4)
         if xk is not None and xk == trow[0] and xv == uk),
        key=nulls_first)
    assert rows == expected and len(rows) > 0
    assert "StreamingUMJoin" not in executed_plan(query) and "AdaptiveSparkPlan" in executed_plan(query)
    assert any("planned as without UMJoin" in r for r in reasons), reasons


def test_by_default_only_a_table_estimated_far_larger_than_a_micro_batch_is_stored(spark: SparkSession, tmp_path: Path) -> None:
    """spark.umjoin.staticTables=auto (the default) stores a static table only where Spark's estimate of its rows is
    at least 1,000,000 and 100 times the micro-batch's stream rows; a smaller table is read every micro-batch, and a
    stream joined only with such tables stays Spark's stream-static join, the reason giving the estimates. Big: 40,000
    rows of 1,300 uncompressed bytes (52 MB: about 1.2 million rows by Spark's estimate of 44 bytes a row); small:
    a few rows. Answers as Spark's."""
    import duckdb

    (tmp_path / "big").mkdir()
    duckdb.sql("COPY (SELECT (i % 50)::BIGINT AS b_k, i::BIGINT AS b_v, repeat(md5(i::VARCHAR), 40) || 'pad' AS b_pad "
               f"FROM range(40000) AS r(i)) TO '{tmp_path / 'big' / 'big.parquet'}' (FORMAT parquet, COMPRESSION uncompressed)")
    for name in ("u", "w"):
        (tmp_path / name).mkdir()
        (tmp_path / name / f"{name}.csv").write_text("".join(f"{k},{k * 10}\n" for k in [*range(5), 3]) + ",7\n")
    rng = random.Random(5)
    write_batches(tmp_path / "x", X_COLUMNS, [[(rng.choice([None, *range(60)]), rng.randrange(7)) for _ in range(40)] for _ in range(2)])
    big = spark.read.parquet(str(tmp_path / "big")).select("b_k", "b_v")
    u, w = (spark.read.schema(f"{n}_k BIGINT, {n}_v BIGINT").csv(str(tmp_path / n)) for n in ("u", "w"))

    def with_big(x: DataFrame) -> DataFrame:
        return x.join(big, x.x_k == big.b_k).join(u, x.x_v == u.u_k)

    def small_only(x: DataFrame) -> DataFrame:
        return x.join(u, x.x_v == u.u_k).join(w, x.x_v == w.w_k)

    outcome = {}
    with temporary_conf(spark, {"spark.sql.autoBroadcastJoinThreshold": "-1", "spark.sql.shuffle.partitions": "2",
                                "spark.sql.adaptive.enabled": spark.conf.get("spark.sql.adaptive.enabled")}):
        for name, query_of, adaptive in (("with_big", with_big, "true"), ("small_only", small_only, "true"),
                                         ("small_only_not_adaptive", small_only, "false")):
            spark.conf.set("spark.sql.adaptive.enabled", adaptive)
            query = (query_of(stream(spark, tmp_path / "x", X_COLUMNS)).writeStream.format("memory").queryName(f"auto_{name}")
                     .option("checkpointLocation", str(tmp_path / f"ck-{name}")).trigger(availableNow=True).start())
            query.awaitTermination()
            with temporary_conf(spark, {"spark.umjoin.enabled": "false"}):
                expected = sorted_rows(query_of(spark.read.parquet(str(tmp_path / "x"))))
            outcome[name] = (executed_plan(query), plans.unconverted_streaming_joins(spark, query), sorted_rows(spark.table(f"auto_{name}")), expected)
    plan, reasons, rows, expected = outcome["with_big"]
    assert re.search(r"\(static, stored, [^)]*partitioned by b_k", plan) and re.search(r"\(static, read every batch, [^)]*partitioned by u_k", plan), plan
    assert reasons == [] and rows == expected and len(rows) > 10
    plan, reasons, rows, expected = outcome["small_only"]
    assert "StreamingUMJoin" not in plan, plan
    assert reasons == ["the stream-static joins of this query stay as Spark planned them, adaptively: no join of a stream with at "
                       "least spark.umjoin.minInputs inputs reads a table UMJoin would store (one read from files, too large to "
                       "broadcast, with spark.umjoin.staticTables=store; with auto, the default, also estimated by Spark at "
                       "1000000 rows or more and 100 times the micro-batch's stream rows), so its micro-batches are planned as "
                       "without UMJoin"], reasons
    assert rows == expected and len(rows) > 10
    # Planned without AQE, the group is tried, and the reason gives Spark's estimates.
    plan, reasons, rows, expected = outcome["small_only_not_adaptive"]
    assert "StreamingUMJoin" not in plan and rows == expected, plan
    # (Groups split from it are tried too, each saying why.)
    assert any(re.search(r"Spark's estimates: the table about \d+ rows, the micro-batch's streams about \d+ rows; "
                         r"spark.umjoin.staticTables=auto stores a table only from 1000000 rows", r) for r in reasons), reasons
