"""Stores beyond memory (paper 000, 3.1.2): RocksDB and auto give Spark's answers and leave nothing behind."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import duckdb
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from conftest import TPCH_SF, UMJOIN_TPCH_QUERIES
from umjoin import answers, plans, tpch
from umjoin.local import temporary_conf

NO_BROADCAST = {"spark.sql.autoBroadcastJoinThreshold": "-1"}  # stores built by the tasks, with the backend
BACKENDS = {
    "rocksdb": {"spark.umjoin.stateBackend": "rocksdb"},
    "auto-spilling": {"spark.umjoin.stateBackend": "auto", "spark.umjoin.auto.maxStoreMemory": "16k"},
}


def store_dirs(root: Path) -> list[Path]:
    stores = root / "umjoin-stores"
    return list(stores.iterdir()) if stores.exists() else []


@pytest.mark.parametrize("adaptive", ["false", "true"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_tpch_official_answers(spark: SparkSession, tpch_data: Path, tmp_path: Path, backend: str, adaptive: str) -> None:
    settings = {**NO_BROADCAST, **BACKENDS[backend], "spark.sql.adaptive.enabled": adaptive, "spark.umjoin.rocksdb.localDir": str(tmp_path)}
    moved = written = 0
    with temporary_conf(spark, settings):
        for number in UMJOIN_TPCH_QUERIES:
            sql = tpch.query_text(number)
            df = spark.sql(sql)
            rows = [tuple(r) for r in df.collect()]
            columns, expected = tpch.official_answer(number, TPCH_SF)
            assert answers.compare(rows, expected, answers.order_by_columns(sql, columns)) == [], f"Q{number}"
            for node in plans.umjoin_nodes(plans.physical_plan(df)):
                moved += sum(v for k, v in node.metrics.items() if k.endswith("stores moved to RocksDB"))
                written += sum(v for k, v in node.metrics.items() if k.endswith("RocksDB memtable bytes"))
    # The stores really were in RocksDB (and, for auto, moved there), and are all gone.
    assert written > 0
    assert (moved > 0) == (backend == "auto-spilling")
    assert store_dirs(tmp_path) == []


@pytest.fixture(scope="module")
def star(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Tables s, t, u joined on one key: a co-partitioned UMJoin whose stores the tasks build."""
    directory = tmp_path_factory.mktemp("star")
    con = duckdb.connect()
    for name, rows in (("s", 4000), ("t", 300), ("u", 300)):
        con.execute(f"COPY (SELECT i % 97 AS k, i AS {name}_v FROM range({rows}) r(i)) TO '{directory / name}.parquet' (FORMAT parquet)")
        spark.read.parquet(str(directory / f"{name}.parquet")).createOrReplaceTempView(name)


STAR_SQL = "SELECT s.s_v, t.t_v, u.u_v FROM s JOIN t ON s.k = t.k JOIN u ON s.k = u.k"


def star_rows() -> int:
    """Rows STAR_SQL returns, counted from the tables' definition: each s row meets every t and u row of its key."""
    per_key = lambda rows: [sum(1 for i in range(rows) if i % 97 == k) for k in range(97)]  # noqa: E731
    s, t, u = per_key(4000), per_key(300), per_key(300)
    return sum(s[k] * t[k] * u[k] for k in range(97))


def test_successful_query_leaves_no_store(spark: SparkSession, star: None, tmp_path: Path) -> None:
    settings = {**NO_BROADCAST, "spark.umjoin.stateBackend": "rocksdb", "spark.umjoin.rocksdb.localDir": str(tmp_path), "spark.sql.adaptive.enabled": "false"}
    with temporary_conf(spark, settings):
        df = spark.sql(STAR_SQL)
        assert df.count() == star_rows()
        (node,) = plans.umjoin_nodes(plans.physical_plan(df))
        assert {i.placement for i in node.inputs} == {"streamed", "partitioned"}
    assert (tmp_path / "umjoin-stores").is_dir() and store_dirs(tmp_path) == []


def test_stores_of_a_killed_jvm_are_removed_by_the_next_store(spark: SparkSession, star: None, tmp_path: Path) -> None:
    """A JVM killed outright leaves its store directories; the next store created on the host removes them."""
    host = re.sub(r"[^A-Za-z0-9.]", "_", spark._jvm.java.net.InetAddress.getLocalHost().getHostName())  # as the store names it
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True).stdout.strip()
    stores = tmp_path / "umjoin-stores"
    dead = stores / f"{host}-pid{ended}-stage1-part0-attempt0-input2-123"
    alive = stores / f"{host}-pid{os.getpid()}-stage1-part0-attempt0-input2-456"
    other_host = stores / f"{host}x-pid{ended}-stage1-part0-attempt0-input2-789"
    for directory in (dead, alive, other_host):
        directory.mkdir(parents=True)
        (directory / "000001.sst").write_bytes(b"left behind")
    settings = {**NO_BROADCAST, "spark.umjoin.stateBackend": "rocksdb", "spark.umjoin.rocksdb.localDir": str(tmp_path), "spark.sql.adaptive.enabled": "false"}
    with temporary_conf(spark, settings):
        assert spark.sql(STAR_SQL).count() == star_rows()
    assert sorted(store_dirs(tmp_path)) == sorted([alive, other_host])


def test_cancelled_query_leaves_no_store(spark: SparkSession, star: None, tmp_path: Path) -> None:
    """A query cancelled while its tasks probe: the killed tasks close and delete their stores."""
    slow = F.udf(lambda v: (time.sleep(0.002), v)[1], "long")
    settings = {**NO_BROADCAST, "spark.umjoin.stateBackend": "rocksdb", "spark.umjoin.rocksdb.localDir": str(tmp_path), "spark.sql.adaptive.enabled": "false"}
    failures: list[BaseException] = []

    def run() -> None:
        spark.sparkContext.setJobGroup("cancel-me", "UMJoin cancellation test", interruptOnCancel=True)
        try:
            spark.sql(STAR_SQL).select(slow("s_v")).collect()
        except BaseException as e:  # the cancellation
            failures.append(e)

    with temporary_conf(spark, settings):
        worker = threading.Thread(target=run)
        worker.start()
        deadline = time.time() + 60
        while not store_dirs(tmp_path) and time.time() < deadline:
            time.sleep(0.05)
        assert store_dirs(tmp_path), "the query never opened a store"
        spark.sparkContext.cancelJobGroup("cancel-me")
        worker.join(timeout=120)
    assert failures and "cancel" in str(failures[0]).lower()
    deadline = time.time() + 30
    while store_dirs(tmp_path) and time.time() < deadline:
        time.sleep(0.1)
    assert store_dirs(tmp_path) == []


def test_failed_and_retried_task_leaves_no_store(tmp_path: Path) -> None:
    """A task that fails after opening its stores (injected once) is retried; the answer is whole."""
    script = textwrap.dedent(
        f"""
        import json, sys
        from pathlib import Path
        import duckdb
        from pyspark import TaskContext
        from pyspark.sql import functions as F
        from umjoin.local import local_builder
        root = Path({str(tmp_path)!r})
        spark = local_builder("umjoin-retry").master("local[2,2]").getOrCreate()  # 2 attempts per task
        con = duckdb.connect()
        for name, rows in (("s", 4000), ("t", 300), ("u", 300)):
            con.execute(f"COPY (SELECT i % 97 AS k, i AS {{name}}_v FROM range({{rows}}) r(i)) TO '{{root / name}}.parquet' (FORMAT parquet)")
            spark.read.parquet(str(root / f"{{name}}.parquet")).createOrReplaceTempView(name)
        def fail_once(v):
            ctx = TaskContext.get()
            if ctx.attemptNumber() == 0 and ctx.partitionId() == 0:
                (root / "failed-once").touch()
                raise RuntimeError("injected failure")
            return v
        for k, v in {{"spark.sql.autoBroadcastJoinThreshold": "-1", "spark.umjoin.stateBackend": "rocksdb",
                     "spark.umjoin.rocksdb.localDir": str(root / "local"), "spark.sql.adaptive.enabled": "false"}}.items():
            spark.conf.set(k, v)
        df = spark.sql({STAR_SQL!r}).select(F.udf(fail_once, "long")("s_v").alias("v"), "t_v", "u_v")
        rows = sorted(tuple(r) for r in df.collect())
        spark.conf.set("spark.umjoin.enabled", "false")
        expected = sorted(tuple(r) for r in spark.sql({STAR_SQL!r}).collect())
        left = sorted(p.name for p in (root / "local" / "umjoin-stores").iterdir())
        print(json.dumps({{"same": rows == expected, "rows": len(rows), "left": left}}))
        """
    )
    outcome = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert outcome.returncode == 0, outcome.stderr[-3000:]
    result = json.loads(outcome.stdout.strip().splitlines()[-1])
    assert (tmp_path / "failed-once").exists(), "the failure was not injected"
    assert result == {"same": True, "rows": star_rows(), "left": []}




def test_a_jvm_closes_its_streaming_stores_before_it_exits(tpch_data: Path, tmp_path: Path) -> None:
    """A JVM that ran a streaming UMJoin with RocksDB state closes its state stores when it exits, before
    the JVM's own exit (a compaction still running then deadlocked the exit: StoresClosedAtExit). Spark's
    StateStore logs "StateStore stopped" when it has closed them; the JVM writes its log until it ends."""
    script = textwrap.dedent(
        f"""
        import json
        from pathlib import Path
        from umjoin import streams, tpch
        from umjoin.local import local_builder
        spark = (local_builder("umjoin-exit", shuffle_partitions=2).config("spark.sql.streaming.stateStore.providerClass",
                 "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        jvm = spark._jvm
        jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(
            "org.apache.spark.sql.execution.streaming.state.StateStore", jvm.org.apache.logging.log4j.Level.INFO)
        streams.read_streams(spark, streams.tpch_streams({TPCH_SF}, 3), tpch.TABLES, Path({str(tpch_data)!r}))
        query = (spark.sql(streams.join_block(3)).writeStream.format("noop")
                 .option("checkpointLocation", {str(tmp_path / "checkpoint")!r}).trigger(availableNow=True).start())
        query.awaitTermination()
        plan = query._jsq.streamingQuery().lastExecution().executedPlan().toString()
        spark.stop()
        print(json.dumps({{"umjoin": "StreamingUMJoin " in plan}}))
        """
    )
    # The JVM outlives the Python process; reading its error stream to the end waits for the JVM too.
    outcome = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert outcome.returncode == 0, outcome.stderr[-3000:]
    assert json.loads(outcome.stdout.strip().splitlines()[-1]) == {"umjoin": True}
    assert "StateStore stopped" in outcome.stderr, outcome.stderr[-3000:]


def test_unwritable_local_dir_names_the_knob(spark: SparkSession, star: None, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with temporary_conf(spark, {"spark.umjoin.rocksdb.localDir": str(blocker / "stores")}):
        with pytest.raises(Exception) as failure:
            spark.sql(STAR_SQL).collect()
    message = str(failure.value)
    assert "spark.umjoin.rocksdb.localDir" in message and "a directory UMJoin can create or write to" in message
