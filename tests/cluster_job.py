"""Spark applications on a local cluster of separate executor JVMs, run by test_cluster.py.

`local-cluster[2,1,1024]` starts a standalone master and two workers inside the driver JVM, each
worker launching its executor as its own JVM (as on a real cluster: tasks, broadcasts and the
UMJoin node are serialised between JVMs; state stores are loaded by whichever executor runs the
task). Everything binds to 127.0.0.1 (SPARK_LOCAL_IP, set by the test). Usage:

    python tests/cluster_job.py <job> <scratch directory>

prints one JSON line with what the job observed; the test asserts on it. The job `all` runs the
others one after another in one application (each cluster start costs about 15 s): the TPC-H
answers, the streaming restart, and last the killed executor.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from pyspark.sql import SparkSession

import umjoin
from umjoin import answers, plans, tpch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conftest import TPCH_SF  # noqa: E402
from test_streaming import ROCKSDB, chain, executed_plan, sorted_rows, stream, write_batches  # noqa: E402

EXECUTORS = 2
#: (broadcast threshold, store backend): broadcast hash tables shared by each executor's tasks, and
#: stores every task builds from its partition, in memory and in RocksDB (broadcast-only groups converted,
#: as in the suite's session: at SF 0.01 Spark broadcasts every table).
TPCH_SETTINGS = {
    "broadcast-memory": {"spark.umjoin.stateBackend": "memory", "spark.umjoin.convertBroadcastJoins": "true"},
    "broadcast-rocksdb": {"spark.umjoin.stateBackend": "rocksdb", "spark.umjoin.convertBroadcastJoins": "true"},
    "partitioned-memory": {"spark.sql.autoBroadcastJoinThreshold": "-1", "spark.umjoin.stateBackend": "memory"},
    "partitioned-rocksdb": {"spark.sql.autoBroadcastJoinThreshold": "-1", "spark.umjoin.stateBackend": "rocksdb"},
}
#: The query each setting runs: 5, 3, 6 and 6 tables, whose joins ship rows and stores between the JVMs
#: (a query on cold executors takes seconds). Every query in every setting runs in one JVM in test_state_backends.
TPCH_QUERY = {"broadcast-memory": 2, "broadcast-rocksdb": 3, "partitioned-memory": 5, "partitioned-rocksdb": 9}


def cluster_session(scratch: Path) -> SparkSession:
    builder = (
        SparkSession.builder.master(f"local-cluster[{EXECUTORS},1,1024]")
        .appName("umjoin-cluster-test")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.local.dir", str(scratch / "local"))
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
    )
    spark = umjoin.configure(builder).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    deadline = time.time() + 120
    while _executor_count(spark) < EXECUTORS:  # executors register a few seconds after the driver starts
        if time.time() > deadline:
            raise RuntimeError(f"only {_executor_count(spark)} of {EXECUTORS} executors registered")
        time.sleep(0.2)
    return spark


def _executor_count(spark: SparkSession) -> int:
    return spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1  # minus the driver


def _executor_pids(spark: SparkSession) -> list[int]:
    """The process ids of this application's executor JVMs."""
    marker = f"--app-id\0{spark.sparkContext.applicationId}\0".encode()
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes()
        except OSError:
            continue
        if b"CoarseGrainedExecutorBackend" in text and marker in text:
            pids.append(int(cmdline.parent.name))
    return pids


def tpch_answers(spark: SparkSession, scratch: Path) -> dict[str, Any]:
    """A TPC-H query with a UMJoin at SF 0.01 in each setting, against the official answer."""
    tpch.register(spark, tpch.generate(TPCH_SF))
    outcome: dict[str, Any] = {"executor_pids": len(_executor_pids(spark))}
    for name, settings in TPCH_SETTINGS.items():
        for key, value in settings.items():
            spark.conf.set(key, value)
        number = TPCH_QUERY[name]
        sql = tpch.query_text(number)
        df = spark.sql(sql)
        rows = [tuple(r) for r in df.collect()]
        columns, expected = tpch.official_answer(number, TPCH_SF)
        nodes = plans.umjoin_nodes(plans.physical_plan(df))
        outcome[name] = {
            "wrong": [number] if answers.compare(rows, expected, answers.order_by_columns(sql, columns)) else [],
            "umjoins": len(nodes),
            "rocksdb_bytes": sum(v for node in nodes for k, v in node.metrics.items() if k.endswith("RocksDB memtable bytes")),
            "placements": sorted({i.placement for node in nodes for i in node.inputs}),
        }
        for key in settings:
            spark.conf.unset(key)
    # RocksDB stores went under the directories the workers gave the executors (the application's).
    local = Path(spark.sparkContext.getConf().get("spark.local.dir"))
    outcome["store_roots"] = sorted(str(p.relative_to(local)) for p in local.rglob("umjoin-stores"))
    return outcome


def streaming_restart(spark: SparkSession, scratch: Path) -> dict[str, Any]:
    """A chain of three streams over two keys (routes between partitions), stopped mid-stream and restarted."""
    for key, value in ROCKSDB.items():
        spark.conf.set(key, value)
    columns = {n: f"{n}_k BIGINT, {n}_j BIGINT, {n}_v BIGINT" for n in "xyz"}
    data = {n: [[((b * 7 + i * 3 + ord(n)) % 6, (b + i) % 4, b * 100 + i) for i in range(8)] for b in range(6)] for n in "xyz"}
    for name, batches in data.items():
        write_batches(scratch / name, columns[name], batches[:4])

    def start() -> Any:
        frames = {n: stream(spark, scratch / n, columns[n]) for n in "xyz"}
        return (chain(frames).writeStream.format("parquet").option("path", str(scratch / "out"))
                .option("checkpointLocation", str(scratch / "ck")).trigger(processingTime="100 milliseconds").start())

    running = start()
    deadline = time.time() + 180
    while (running.lastProgress or {}).get("batchId", -1) < 1 and time.time() < deadline:
        time.sleep(0.1)
    stopped_after = (running.lastProgress or {}).get("batchId", -1)
    running.stop()
    for name, batches in data.items():
        write_batches(scratch / name, columns[name], batches[4:])
    restarted = start()
    restarted.processAllAvailable()
    plan = executed_plan(restarted)
    restarted.stop()
    written = sorted_rows(spark.read.parquet(str(scratch / "out")))
    spark.conf.set("spark.umjoin.enabled", "false")
    expected = sorted_rows(chain({n: spark.read.parquet(str(scratch / n)) for n in "xyz"}))
    for key in [*ROCKSDB, "spark.umjoin.enabled"]:
        spark.conf.unset(key)
    return {"stopped_after_batch": stopped_after, "streaming_umjoins": plan.count("StreamingUMJoin inputs="),
            "spark_joins": plan.count("StreamingSymmetricHashJoin"), "written": len(written), "expected": len(expected),
            "same": written == expected}


def killed_executor(spark: SparkSession, scratch: Path) -> dict[str, Any]:
    """A UMJoin query whose executor holding a RocksDB store is killed (SIGKILL) while it probes."""
    import duckdb

    con = duckdb.connect()
    for name, rows in (("s", 2000), ("t", 300), ("u", 300)):
        con.execute(f"COPY (SELECT i % 97 AS k, i AS {name}_v FROM range({rows}) r(i)) TO '{scratch / name}.parquet' (FORMAT parquet)")
        spark.read.parquet(str(scratch / f"{name}.parquet")).createOrReplaceTempView(name)
    stores = scratch / "stores" / "umjoin-stores"
    for key, value in {"spark.sql.autoBroadcastJoinThreshold": "-1", "spark.umjoin.stateBackend": "rocksdb",
                       "spark.umjoin.rocksdb.localDir": str(scratch / "stores"), "spark.sql.adaptive.enabled": "false"}.items():
        spark.conf.set(key, value)
    # Thread.sleep(1) per result row, evaluated above the UMJoin in its stage: the stores stay open meanwhile.
    df = spark.sql("SELECT s.s_v, t.t_v, u.u_v, java_method('java.lang.Thread', 'sleep', 1L) AS pause "
                   "FROM s JOIN t ON s.k = t.k JOIN u ON s.k = u.k")
    killed: list[int] = []
    executors = set(_executor_pids(spark))

    def kill_a_store_owner() -> None:
        deadline = time.time() + 120
        while not killed and time.time() < deadline:
            for store in stores.iterdir() if stores.is_dir() else []:
                pid = int(store.name.split("-pid")[1].split("-")[0])
                if pid in executors:
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                    return
            time.sleep(0.05)

    killer = threading.Thread(target=kill_a_store_owner)
    killer.start()
    rows = sorted((s, t, u) for s, t, u, _ in df.collect())
    killer.join()
    left_after_query = sorted(p.name for p in stores.iterdir()) if stores.is_dir() else []
    is_umjoin = len(plans.umjoin_nodes(plans.physical_plan(df))) == 1
    return {"killed": killed, "killed_still_running": any(Path(f"/proc/{pid}").exists() for pid in killed),
            "rows": rows, "umjoin": is_umjoin, "stores_left": left_after_query}


#: In the order `all` runs them: the killed executor last (the cluster then runs on the one left and a replacement).
JOBS: dict[str, Callable[[SparkSession, Path], dict[str, Any]]] = {
    "tpch-answers": tpch_answers, "streaming-restart": streaming_restart, "killed-executor": killed_executor}


def run(names: list[str], scratch: Path) -> dict[str, Any]:
    """The jobs in one application, each in a directory of its own under `scratch`; their outcomes by name."""
    spark = cluster_session(scratch)
    outcomes = {}
    for name in names:
        (scratch / name).mkdir()
        outcomes[name] = JOBS[name](spark, scratch / name)
    spark.stop()
    return outcomes


if __name__ == "__main__":
    print(json.dumps(run(list(JOBS) if sys.argv[1] == "all" else [sys.argv[1]], Path(sys.argv[2]))))
