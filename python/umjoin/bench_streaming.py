"""`umjoin bench-streaming` (make bench-streaming): the paper's main claim (000, title and 4.2) in
Structured Streaming, at this machine's scale. Not a test: it prints and writes what it measured.

The paper's 4-way TPC-DS join over four streams: each table's rows in random order, cut into
files that a file source reads one per micro-batch (the paper fed CSV through Kafka in random
order). Spark's chained stream-stream joins keep the lower joins' results as state; UMJoin keeps
only the four inputs. Both use the RocksDB state store. Each run has its own JVM and reports per
batch: duration, rows in and out, state rows and bytes (UMJoin per input), and at the end peak
memory and the result count, which must be 2,157,897 at SF 1 both ways. A memory-capped round
repeats the runs with less driver memory (paper Fig. 5a-c), with the in-memory state store too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["run_streaming_bench"]

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
HDFS_PROVIDER = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
RUNS = [  # (name, UMJoin on, state store provider, driver memory)
    ("spark-rocksdb", False, ROCKSDB_PROVIDER, "4g"),
    ("umjoin-rocksdb", True, ROCKSDB_PROVIDER, "4g"),
    ("spark-rocksdb", False, ROCKSDB_PROVIDER, "1g"),
    ("umjoin-rocksdb", True, ROCKSDB_PROVIDER, "1g"),
    ("umjoin-memory", True, HDFS_PROVIDER, "1g"),
]
STATE_PARTITIONS = 4


def stream_files(sf: float, batches: int, seed: int = 42) -> Path:
    """Each of the four tables' rows in random order, cut into `batches` files with increasing times."""
    import duckdb

    from umjoin import tpcds

    source = tpcds.generate(sf)
    target = source / f"streams-{batches}-seed{seed}"
    if (target / "_COMPLETE").exists():
        return target
    con = duckdb.connect()
    con.execute(f"SELECT setseed({1 / (seed + 1)})")
    for table in tpcds.FOUR_WAY_TABLES:
        (target / table).mkdir(parents=True, exist_ok=True)
        con.execute(f"CREATE OR REPLACE TABLE shuffled AS SELECT *, row_number() OVER (ORDER BY random()) - 1 AS _row FROM '{source / table}.parquet'")
        rows = con.execute("SELECT count(*) FROM shuffled").fetchone()[0]
        for b in range(batches):
            path = target / table / f"batch-{b:04d}.parquet"
            con.execute(f"COPY (SELECT * EXCLUDE (_row) FROM shuffled WHERE _row * {batches} // {rows} = {b}) TO '{path}' (FORMAT parquet)")
            os.utime(path, (1_000_000 + b, 1_000_000 + b))
    (target / "_COMPLETE").write_text("ok\n")
    return target


def _worker(spec: dict[str, Any]) -> dict[str, Any]:
    """One streaming run in this process's JVM."""
    from umjoin import tpcds
    from umjoin.local import local_builder

    builder = local_builder("umjoin-bench-streaming", shuffle_partitions=STATE_PARTITIONS, driver_memory=spec["driver_memory"])
    spark = builder.config("spark.sql.streaming.stateStore.providerClass", spec["provider"]).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark.conf.set("spark.umjoin.enabled", str(spec["umjoin"]).lower())
    streams = Path(spec["streams"])
    for table in tpcds.FOUR_WAY_TABLES:
        schema = spark.read.parquet(str(streams / table)).schema
        spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(streams / table)).createOrReplaceTempView(table)
    query = (spark.sql(tpcds.FOUR_WAY_QUERY).writeStream.format("noop")
             .option("checkpointLocation", spec["checkpoint"]).trigger(availableNow=True).start())
    start = time.perf_counter()
    error = None
    try:
        query.awaitTermination()
    except Exception as e:  # the run failed: report why (the paper's operators "terminated prematurely")
        error = next((l for l in str(e).splitlines() if "Error" in l or "Exception" in l), str(e).splitlines()[0])[:300]
    seconds = time.perf_counter() - start
    batches = []
    for p in query.recentProgress:
        operators = p["stateOperators"]
        umjoin = [op for op in operators if op["operatorName"] == "umJoin"]
        batches.append({
            "batch": p["batchId"],
            "duration_ms": p["durationMs"].get("triggerExecution", 0),
            "input_rows": p["numInputRows"],
            "output_rows": p["sink"].get("numOutputRows", -1),
            "state_rows": sum(op["numRowsTotal"] for op in operators),
            "state_memory_bytes": sum(op["memoryUsedBytes"] for op in operators),
            "state_disk_bytes": sum(op["customMetrics"].get("rocksdbSstFileSize", 0) for op in operators),
            "state_rows_per_input": [umjoin[0]["customMetrics"].get(f"stateRowsInput{i}", 0) for i in range(4)] if umjoin else None,
        })
    plan = query._jsq.streamingQuery().lastExecution()
    jvm = spark._jvm
    pid = jvm.java.lang.ProcessHandle.current().pid()
    rss = next(int(l.split()[1]) * 1024 for l in Path(f"/proc/{pid}/status").read_text().splitlines() if l.startswith("VmHWM"))
    return {"seconds": seconds, "error": error, "batches": batches, "peak_rss_bytes": rss,
            "umjoin_in_plan": plan is not None and "StreamingUMJoin " in plan.executedPlan().toString()}


def run_streaming_bench(sf: float, batches: int, out: Path) -> Path:
    from umjoin import tpcds

    streams = stream_files(sf, batches)
    checkpoints = out / "streaming-checkpoints"
    results = []
    for name, umjoin, provider, memory in RUNS:
        checkpoint = checkpoints / f"{name}-{memory}"
        subprocess.run(["rm", "-rf", str(checkpoint)], check=True)
        spec = {"streams": str(streams), "umjoin": umjoin, "provider": provider, "driver_memory": memory, "checkpoint": str(checkpoint)}
        outcome = subprocess.run([sys.executable, "-m", "umjoin.bench_streaming", json.dumps(spec)], capture_output=True, text=True, timeout=7200)
        lines = [l for l in outcome.stdout.splitlines() if l.startswith("{")]
        if lines:
            result = json.loads(lines[-1])
        else:
            tail = " | ".join(outcome.stderr.strip().splitlines()[-3:])
            result = {"seconds": None, "error": f"JVM ended: {tail}"[:300], "batches": [], "peak_rss_bytes": None, "umjoin_in_plan": False}
        result.update({"run": name, "driver_memory": memory, "provider": provider.rsplit(".", 1)[-1]})
        result["output_rows"] = sum(b["output_rows"] for b in result["batches"])
        result["final_state_rows"] = result["batches"][-1]["state_rows"] if result["batches"] else None
        result["max_state_rows"] = max((b["state_rows"] for b in result["batches"]), default=None)
        results.append(result)
        print(f"{name:>15} {memory:>4}: {'ok' if not result['error'] else 'FAILED ' + result['error']}  "
              f"{result['seconds'] or 0:.0f}s  output {result['output_rows']}  state rows at end {result['final_state_rows']}  "
              f"max {result['max_state_rows']}  peak RSS {(result['peak_rss_bytes'] or 0) / 2**20:.0f}MB", flush=True)
    subprocess.run(["rm", "-rf", str(checkpoints)], check=True)

    out.mkdir(parents=True, exist_ok=True)
    name = f"streaming_tpcds_sf{sf:g}"
    expected = tpcds.FOUR_WAY_ROWS_SF1 if sf == 1 else None
    (out / f"{name}.json").write_text(json.dumps({"sf": sf, "batches": batches, "expected_rows": expected, "runs": results}, indent=1) + "\n")
    (out / f"{name}.md").write_text(_markdown(sf, batches, expected, results))
    _plots(out / f"{name}.png", results)
    print(f"written: {out / name}.md, .json and .png")
    return out / f"{name}.md"


def _mb(value: Any) -> str:
    return "-" if value is None else f"{value / 2**20:.0f}MB"


def _markdown(sf: float, batches: int, expected: int | None, results: list[dict[str, Any]]) -> str:
    lines = [
        f"# Streaming: the paper's 4-way TPC-DS join at SF {sf:g} over {batches} micro-batches (local[2], {STATE_PARTITIONS} state partitions)",
        "",
        f"Expected result rows: {expected if expected is not None else 'n/a'}.",
        "",
        "| run | driver memory | state store | result | time (s) | output rows | rows/s | mean batch (s) | max batch (s) | state rows at end | max state rows | state memory at end | state on disk at end | peak RSS |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        durations = [b["duration_ms"] / 1000 for b in r["batches"]] or [0]
        last = r["batches"][-1] if r["batches"] else {}
        rate = r["output_rows"] / r["seconds"] if r["seconds"] else 0
        lines.append(
            f"| {r['run']} | {r['driver_memory']} | {r['provider']} | {'ok' if not r['error'] else 'failed: ' + r['error'][:100]} | "
            f"{r['seconds'] or 0:.0f} | {r['output_rows']} | {rate:.0f} | {sum(durations) / len(durations):.2f} | {max(durations):.2f} | "
            f"{r['final_state_rows']} | {r['max_state_rows']} | {_mb(last.get('state_memory_bytes'))} | {_mb(last.get('state_disk_bytes'))} | "
            f"{_mb(r['peak_rss_bytes'])} |")
    umjoin = next((r for r in results if r["run"] == "umjoin-rocksdb" and r["batches"] and r["batches"][-1]["state_rows_per_input"]), None)
    if umjoin:
        lines += ["", f"UMJoin's state at the end, per input (store_returns, customer, web_returns, catalog_returns): "
                  f"{umjoin['batches'][-1]['state_rows_per_input']}."]
    return "\n".join(lines) + "\n"


def _plots(path: Path, results: list[dict[str, Any]]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install -e '.[bench]'): no plots", file=sys.stderr)
        return
    figure, (state, output, durations) = plt.subplots(1, 3, figsize=(17, 5))
    for r in results:
        if not r["batches"]:
            continue
        label = f"{r['run']} {r['driver_memory']}"
        elapsed, total = [], 0.0
        for b in r["batches"]:
            total += b["duration_ms"] / 1000
            elapsed.append(total)
        state.plot([b["batch"] for b in r["batches"]], [b["state_rows"] for b in r["batches"]], marker=".", label=label)
        cumulative, produced = [], 0
        for b in r["batches"]:
            produced += max(b["output_rows"], 0)
            cumulative.append(produced)
        output.plot(elapsed, cumulative, marker=".", label=label)
        durations.plot([b["batch"] for b in r["batches"]], [b["duration_ms"] / 1000 for b in r["batches"]], marker=".", label=label)
    state.set(xlabel="micro-batch", ylabel="state rows (all stateful operators)", title="State over time")
    output.set(xlabel="elapsed time (s)", ylabel="result rows produced", title="Output over time (paper Fig. 5d)")
    durations.set(xlabel="micro-batch", ylabel="batch duration (s)", title="Batch durations")
    for ax in (state, output, durations):
        ax.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)


if __name__ == "__main__":
    print(json.dumps(_worker(json.loads(sys.argv[1]))))
