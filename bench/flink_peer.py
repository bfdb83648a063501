"""Flink 2.3's streaming MultiJoin on the enrichment workload, in a process (and JVM) of its own:
``python -m bench.flink_peer '<spec as JSON>'`` prints one JSON line of what it measured.

PyFlink from PyPI (``pip install -e '.[peers]'``) runs a local mini cluster in the Python process's
gateway JVM, parallelism 2, RocksDB state. The streams are the workload's CSV files, read by a file
source that keeps watching its directory (so the job keeps running and a savepoint can be taken
once every row is in). Flink's regular LEFT join puts out a NULL-padded row at once and retracts it
when a match comes, so the result is aggregated (``COUNT(*)`` over the chain and the other checks of
``enrichment.checks``: each stream's matched rows and column sums; one row of state): the run is
complete when the count equals the expected rows and stays there, and its output is checked by those
aggregates against DuckDB's (Flink has no xxhash64 to hash its rows as Spark does). Measured: the time
until the count last changed, the state's exact size (a savepoint's files), and the JVM's peak resident memory.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench import peak_rss_bytes

#: How long the count must stay at the expected value before the run counts as complete.
SETTLED_SECONDS = 10.0


def _columns(name: str) -> str:
    if name == "orders":
        return "o_orderkey BIGINT, o_custkey BIGINT, o_totalprice DECIMAL(15, 2), o_time TIMESTAMP(3)"
    if name == "reorder":
        return "reorder_custkey BIGINT, reorder_orderkey BIGINT, reorder_price DECIMAL(15, 2), reorder_time TIMESTAMP(3)"
    return f"{name}_orderkey BIGINT, {name}_quantity DECIMAL(15, 2), {name}_price DECIMAL(15, 2), {name}_time TIMESTAMP(3)"


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """Runs the chain of `spec` (files, tables, sql, checks, expected_rows, multi_join, timeout_s) and measures it."""
    from pyflink.common import RowKind
    from pyflink.java_gateway import get_gateway
    from pyflink.table import EnvironmentSettings, TableEnvironment

    env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    conf = env.get_config()
    conf.set("parallelism.default", "2")
    conf.set("state.backend.type", "rocksdb")
    # A savepoint written to files: the JobManager's memory takes at most 5 MB of state.
    savepoints = Path(tempfile.mkdtemp(prefix="flink-savepoint-"))
    conf.set("execution.checkpointing.storage", "filesystem")
    conf.set("execution.checkpointing.dir", savepoints.as_uri())
    conf.set("table.optimizer.multi-join.enabled", str(spec["multi_join"]).lower())
    # Updates of the count collected a batch at a time: row by row, the collect sink, not the join, sets the pace.
    for key, value in {"table.exec.mini-batch.enabled": "true", "table.exec.mini-batch.allow-latency": "1 s",
                       "table.exec.mini-batch.size": "10000"}.items():
        conf.set(key, value)
    for name in spec["tables"]:
        env.execute_sql(f"CREATE TABLE {name} ({_columns(name)}) WITH ('connector' = 'filesystem', "
                        f"'path' = '{Path(spec['files']) / 'csv' / name}', 'format' = 'csv', 'source.monitor-interval' = '1h')")
    query = f"SELECT {', '.join(spec['checks'])} FROM ({spec['sql']})"  # COUNT(*) first
    plan = env.explain_sql(query)
    start = time.perf_counter()
    result = env.execute_sql(query)
    counts: list[tuple[float, int]] = []
    checked: list[list[str]] = []

    def follow() -> None:
        with result.collect() as rows:
            for row in rows:
                if row.get_row_kind() in (RowKind.INSERT, RowKind.UPDATE_AFTER):
                    checked.append([str(v) for v in row])  # (before the count that says the run is complete)
                    counts.append((time.perf_counter() - start, int(row[0])))

    threading.Thread(target=follow, daemon=True).start()
    error = None
    while True:
        time.sleep(1)
        elapsed = time.perf_counter() - start
        if counts and counts[-1][1] == spec["expected_rows"] and elapsed - counts[-1][0] >= SETTLED_SECONDS:
            break
        if elapsed > spec["timeout_s"]:
            error = f"the count was {counts[-1][1] if counts else 'none'} after {spec['timeout_s']} s, not {spec['expected_rows']}"
            break
    client = result.get_job_client()
    state_bytes = None
    gateway = get_gateway()
    if error is None:
        # PyFlink 2.3's wrapper lacks the savepoint format Flink 2's JobClient takes: called on the Java object.
        canonical = gateway.jvm.org.apache.flink.core.execution.SavepointFormatType.CANONICAL
        location = str(client._j_job_client.triggerSavepoint(str(savepoints), canonical).get())
        state_bytes = sum(f.stat().st_size for f in Path(location.removeprefix("file:")).rglob("*") if f.is_file())
    client.cancel().result()
    shutil.rmtree(savepoints, ignore_errors=True)
    pid = gateway.jvm.java.lang.ProcessHandle.current().pid()
    rss = peak_rss_bytes(pid)
    return {"seconds": counts[-1][0] if counts and error is None else None, "error": error, "output_rows": counts[-1][1] if counts else None,
            "checks": checked[-1] if checked else None,
            "state_bytes": state_bytes, "peak_rss_bytes": rss, "multi_join_in_plan": "MultiJoin" in plan}


if __name__ == "__main__":
    print(json.dumps(run(json.loads(sys.argv[1]))), flush=True)
