"""`python -m bench memory` (make bench-memory): the paper's memory experiment (000, 4.2, Fig. 5-7), at this
machine's scale. Not a test: it prints and writes what it measured.

The paper's 4-way TPC-DS join (2,157,897 rows at SF 1) is hashed row by row without keeping
anything (the paper's black hole; the rows' fingerprint of bench/outputs.py, by which every run's
output is compared with Spark's as a multiset), in these settings:

- Spark's own plan (UMJoin off), and UMJoin with each state backend: memory, rocksdb, auto;
- a sweep of driver memory caps (Fig. 5a-c, 6), and, since the state of SF 1 fits even the smallest
  cap Spark accepts, a sweep of the execution memory Spark grants at 1g (``spark.memory.fraction``)
  that pushes the stores beyond memory;
- for each run: completed or failed (with the error), run time, peak resident memory of the JVM and
  its peak heap, result rows and their hash, bytes shuffled and spilled, and the stores' RocksDB figures;
- memtable and block-cache sweeps of the RocksDB store (Fig. 7a, 7b).

Every run starts its own JVM, so memory figures are per run.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench import outputs, peak_rss_bytes

__all__ = ["MODES", "run_memory_bench"]

MODES: dict[str, dict[str, str]] = {
    "spark": {"spark.umjoin.enabled": "false"},
    "umjoin-memory": {"spark.umjoin.stateBackend": "memory"},
    "umjoin-rocksdb": {"spark.umjoin.stateBackend": "rocksdb"},
    "umjoin-auto": {"spark.umjoin.stateBackend": "auto"},
}
DRIVER_MEMORY = ["512m", "1g", "2g", "4g"]
MEMORY_FRACTIONS = [0.03, 0.06, 0.12, 0.25, 0.6]
WRITE_BUFFERS = ["64k", "256k", "1m", "4m", "16m", "64m"]
BLOCK_CACHES = ["0", "1m", "4m", "16m", "64m", "256m"]
SHUFFLE_PARTITIONS = 2  # one per core: each task holds as much state as it can


def _worker(spec: dict[str, Any]) -> dict[str, Any]:
    """One run in this process's own JVM: ``spec`` has sf, driver_memory, conf, repetitions."""
    from umjoin import plans, tpcds
    from umjoin.local import local_builder

    builder = local_builder("umjoin-bench-memory", shuffle_partitions=SHUFFLE_PARTITIONS, driver_memory=spec["driver_memory"])
    for key, value in spec.get("static_conf", {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    tpcds.register(spark, Path(spec["data"]))
    runs = []
    for conf in spec["confs"]:
        for key, value in conf.items():
            spark.conf.set(key, value)
        times, hashed, error, df = [], [], None, None
        for _ in range(spec["repetitions"]):
            joined = spark.sql(tpcds.FOUR_WAY_QUERY)
            df = joined.agg(*outputs.aggregates(joined))
            start = time.perf_counter()
            try:
                hashed.append(outputs.fingerprint(df.collect()[0]))  # every row produced and hashed, none kept
                times.append(time.perf_counter() - start)
            except Exception as e:  # the run failed: report why, as the paper reports early termination
                error = next((line for line in str(e).splitlines() if "Error" in line or "Exception" in line), str(e).splitlines()[0])
                break
        metrics = _metrics(plans.physical_plan(df)) if df is not None else {}
        runs.append({"conf": conf, "seconds": times, "outputs": hashed, "error": error, "metrics": metrics})
        for key in conf:
            spark.conf.unset(key)
    jvm = spark._jvm
    pools = jvm.java.lang.management.ManagementFactory.getMemoryPoolMXBeans()
    heap_peak = sum(p.getPeakUsage().getUsed() for p in pools if p.getType().toString() == "Heap memory")
    pid = jvm.java.lang.ProcessHandle.current().pid()
    rss_peak = peak_rss_bytes(pid)
    return {"runs": runs, "peak_rss_bytes": rss_peak, "peak_heap_bytes": heap_peak}


def _metrics(plan: Any) -> dict[str, int]:
    """Bytes shuffled and spilled, intermediate join rows, and the UMJoin stores' figures, from the plan's metrics."""
    from umjoin import plans

    totals = {"shuffle_bytes": 0, "spill_bytes": 0, "intermediate_join_rows": 0, "store_bytes": 0,
              "rocksdb_memtable_bytes": 0, "rocksdb_disk_bytes": 0, "rocksdb_cache_hits": 0, "rocksdb_cache_misses": 0,
              "stores_moved_to_rocksdb": 0}
    joins = [n for n in plan.walk() if n.name in plans.BINARY_JOINS or n.name == "UMJoinExec"]
    for node in plan.walk():
        m = node.metrics
        totals["shuffle_bytes"] += m.get("data size", 0) if node.name == "ShuffleExchangeExec" else 0
        totals["spill_bytes"] += m.get("spill size", 0)
        for name, value in m.items():
            for suffix, key in ((": store size", "store_bytes"), ("RocksDB memtable bytes", "rocksdb_memtable_bytes"),
                                ("RocksDB bytes on disk", "rocksdb_disk_bytes"), ("RocksDB block cache hits", "rocksdb_cache_hits"),
                                ("RocksDB block cache misses", "rocksdb_cache_misses"), ("stores moved to RocksDB", "stores_moved_to_rocksdb")):
                if name.endswith(suffix):
                    totals[key] += value
    # Rows produced by joins below the top one: the intermediate results a binary join tree makes.
    totals["intermediate_join_rows"] = sum(j.metrics.get("number of output rows", 0) for j in joins[1:])
    return totals


def _spawn(spec: dict[str, Any], timeout: int = 1800) -> dict[str, Any]:
    outcome = subprocess.run([sys.executable, "-m", "bench.memory", json.dumps(spec)], capture_output=True, text=True, timeout=timeout)
    lines = [l for l in outcome.stdout.splitlines() if l.startswith("{")]
    if outcome.returncode != 0 or not lines:
        tail = outcome.stderr.strip().splitlines()[-3:]
        return {"runs": [{"conf": c, "seconds": [], "outputs": [], "error": f"JVM ended: {' | '.join(tail)}", "metrics": {}} for c in spec["confs"]],
                "peak_rss_bytes": None, "peak_heap_bytes": None}
    return json.loads(lines[-1])


def _row(point: dict[str, Any], mode: str, result: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    return {**point, "mode": mode, "completed": run["error"] is None, "error": run["error"],
            "rows": run["outputs"][-1]["rows"] if run["outputs"] else None, "outputs": run["outputs"],
            "seconds": statistics.median(run["seconds"]) if run["seconds"] else None,
            "peak_rss_bytes": result["peak_rss_bytes"], "peak_heap_bytes": result["peak_heap_bytes"], **run["metrics"]}


def run_memory_bench(sf: float, out: Path, repetitions: int = 2) -> Path:
    from umjoin import tpcds

    data = str(tpcds.generate(sf))
    rows: list[dict[str, Any]] = []

    def report(row: dict[str, Any]) -> None:
        rows.append(row)
        state = "ok" if row["completed"] else f"FAILED: {row['error']}"
        seconds = f"{row['seconds']:.1f}s" if row["seconds"] else "-"
        print(f"{row['sweep']:>9} {row['setting']:>10} {row['mode']:>15}  {seconds:>7}  rows {row['rows']} "
              f"(hash {outputs.shown(row['outputs'][-1] if row['outputs'] else None)})  "
              f"rss {_mb(row['peak_rss_bytes'])}  shuffled {_mb(row.get('shuffle_bytes'))}  spilled {_mb(row.get('spill_bytes'))}  {state}", flush=True)

    for memory in DRIVER_MEMORY:  # Fig. 5a-c, 6: the JVM's memory
        for mode, conf in MODES.items():
            result = _spawn({"data": data, "driver_memory": memory, "confs": [conf], "repetitions": repetitions})
            report(_row({"sweep": "driver", "setting": memory}, mode, result, result["runs"][0]))
    for fraction in MEMORY_FRACTIONS:  # the memory Spark's operators and stores may use, at 1g
        for mode, conf in MODES.items():
            result = _spawn({"data": data, "driver_memory": "1g", "static_conf": {"spark.memory.fraction": str(fraction)},
                             "confs": [conf], "repetitions": repetitions})
            report(_row({"sweep": "execution", "setting": f"{fraction:g}"}, mode, result, result["runs"][0]))
    rocksdb = MODES["umjoin-rocksdb"]
    memtables = [{**rocksdb, "spark.umjoin.rocksdb.writeBufferSize": w, "spark.umjoin.rocksdb.blockCacheSize": "16m"} for w in WRITE_BUFFERS]
    caches = [{**rocksdb, "spark.umjoin.rocksdb.writeBufferSize": "256k", "spark.umjoin.rocksdb.blockCacheSize": c} for c in BLOCK_CACHES]
    for sweep, confs, key in (("memtable", memtables, "spark.umjoin.rocksdb.writeBufferSize"), ("cache", caches, "spark.umjoin.rocksdb.blockCacheSize")):
        result = _spawn({"data": data, "driver_memory": "2g", "confs": confs, "repetitions": repetitions})
        for run in result["runs"]:  # one JVM for the sweep: its memory figures are for the whole sweep
            report(_row({"sweep": sweep, "setting": run["conf"][key]}, "umjoin-rocksdb", result, run))

    # Every repetition of every run against the first output of Spark's plan.
    reference = next((r["outputs"][0] for r in rows if r["mode"] == "spark" and r["outputs"]), None)
    for row in rows:
        row["same_output"] = bool(row["outputs"]) and all(outputs.equal(o, reference) for o in row["outputs"])
    out.mkdir(parents=True, exist_ok=True)
    name = f"memory_tpcds_sf{sf:g}"
    (out / f"{name}.json").write_text(json.dumps({"sf": sf, "expected_rows": tpcds.FOUR_WAY_ROWS_SF1 if sf == 1 else None,
                                                  "repetitions": repetitions, "rows": rows}, indent=1) + "\n")
    (out / f"{name}.md").write_text(_markdown(sf, rows))
    _plots(out, name, rows)
    print(f"written: {out / name}.md, .json and plots")
    return out / f"{name}.md"


def _mb(value: Any) -> str:
    return "-" if value is None else f"{value / 2**20:.0f}MB"


def _markdown(sf: float, rows: list[dict[str, Any]]) -> str:
    lines = [f"# The paper's 4-way TPC-DS join at SF {sf:g}: memory, state and time (local[2], {SHUFFLE_PARTITIONS} partitions)", "",
             f"Each run hashes the join's rows and keeps none. Same output: every repetition's as the first of Spark's plan, "
             f"{outputs.COMPARED}.", ""]
    titles = {"driver": "Driver memory caps (Fig. 5a-c, 6)", "execution": "Execution memory at 1g driver memory (spark.memory.fraction)",
              "memtable": "RocksDB memtable size, block cache 16m (Fig. 7b)", "cache": "RocksDB block cache size, memtable 256k (Fig. 7a)"}
    for sweep, title in titles.items():
        lines += [f"## {title}", "", "| setting | mode | result | time (s) | rows | output hash | same output | peak RSS | peak heap | shuffled | spilled | "
                  "intermediate join rows | store bytes | RocksDB memtable | RocksDB disk | cache hits | cache misses | moved to RocksDB |",
                  "|---|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in (r for r in rows if r["sweep"] == sweep):
            result = "ok" if r["completed"] else f"failed: {r['error'][:120]}"
            lines.append(
                f"| {r['setting']} | {r['mode']} | {result} | {r['seconds']:.1f} | {r['rows']} | {outputs.shown(r['outputs'][-1])} | "
                f"{'yes' if r['same_output'] else 'NO'} | {_mb(r['peak_rss_bytes'])} | {_mb(r['peak_heap_bytes'])} | "
                f"{_mb(r.get('shuffle_bytes'))} | {_mb(r.get('spill_bytes'))} | {r.get('intermediate_join_rows', '-')} | {_mb(r.get('store_bytes'))} | "
                f"{_mb(r.get('rocksdb_memtable_bytes'))} | {_mb(r.get('rocksdb_disk_bytes'))} | {r.get('rocksdb_cache_hits', '-')} | "
                f"{r.get('rocksdb_cache_misses', '-')} | {r.get('stores_moved_to_rocksdb', '-')} |"
                if r["seconds"] is not None else
                f"| {r['setting']} | {r['mode']} | {result} | - | - | - | - | {_mb(r['peak_rss_bytes'])} | {_mb(r['peak_heap_bytes'])} | | | | | | | | | |"
            )
        lines.append("")
    return "\n".join(lines)


def _plots(out: Path, name: str, rows: list[dict[str, Any]]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install -e '.[bench]'): no plots", file=sys.stderr)
        return
    figure, axes = plt.subplots(2, 3, figsize=(17, 9))
    for ax, sweep, xlabel in ((axes[0][0], "driver", "driver memory"), (axes[0][1], "execution", "spark.memory.fraction at 1g")):
        for mode in MODES:
            points = [r for r in rows if r["sweep"] == sweep and r["mode"] == mode]
            xs = list(range(len(points)))
            ax.plot([x for x, p in zip(xs, points) if p["completed"]], [p["seconds"] for p in points if p["completed"]], marker="o", label=mode)
            failed = [x for x, p in zip(xs, points) if not p["completed"]]
            ax.scatter(failed, [0] * len(failed), marker="x", s=80, color=ax.lines[-1].get_color())
            ax.set_xticks(xs, [p["setting"] for p in points])
        ax.set_xlabel(xlabel + " (x: failed)")
        ax.set_ylabel("run time (s)")
        ax.legend()
    ax = axes[0][2]
    for mode in MODES:
        points = [r for r in rows if r["sweep"] == "driver" and r["mode"] == mode]
        ax.plot(range(len(points)), [(p["peak_rss_bytes"] or 0) / 2**20 for p in points], marker="o", label=mode)
        ax.set_xticks(range(len(points)), [p["setting"] for p in points])
    ax.set_xlabel("driver memory")
    ax.set_ylabel("peak resident memory of the JVM (MB)")
    ax.legend()
    ax = axes[1][0]
    at = [r for r in rows if r["sweep"] == "driver" and r["setting"] == DRIVER_MEMORY[-1] and r["completed"]]
    ax.bar([r["mode"] for r in at], [(r["shuffle_bytes"] + r["spill_bytes"]) / 2**20 for r in at])
    ax.set_ylabel(f"bytes shuffled + spilled (MB), {DRIVER_MEMORY[-1]}")
    for ax, sweep, xlabel in ((axes[1][1], "memtable", "RocksDB memtable (write buffer) per store"), (axes[1][2], "cache", "RocksDB block cache per store")):
        points = [r for r in rows if r["sweep"] == sweep and r["completed"]]
        ax.plot(range(len(points)), [p["seconds"] for p in points], marker="o")
        ax.set_xticks(range(len(points)), [p["setting"] for p in points])
        ax.set_xlabel(xlabel)
        ax.set_ylabel("run time (s)")
    figure.suptitle("UMJoin vs Spark's binary join tree: the paper's 4-way TPC-DS join")
    figure.tight_layout()
    figure.savefig(out / f"{name}.png", dpi=110)


if __name__ == "__main__":
    print(json.dumps(_worker(json.loads(sys.argv[1]))))
