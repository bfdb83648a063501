"""`python -m bench static` (make bench-static): paper 003's setting in Structured Streaming. Not a test:
it prints and writes what it measured.

A stream of TPC-H ``orders`` rows (in random order, cut into one file per micro-batch) joined with
``customer`` and ``nation`` as static tables; each order's customer is drawn anew with Zipf skew
0, 0.5 and 1 over the customers (ranked in a seeded random order), so a few customers get most
orders under skew. The broadcast threshold is lowered so that ``nation`` is broadcast and
``customer`` is not. Per skew: Spark's stream-static join (it reads and shuffles ``customer`` every
micro-batch), UMJoin with its default settings (``spark.umjoin.staticTables=auto``: it stores a
table only where Spark estimates it far larger than a micro-batch, not ``customer`` here, so the
query stays Spark's), and UMJoin made to store ``customer`` (``staticTables=store``) with
``spark.umjoin.staticCache`` = off, ssbj and all (``customer`` loaded once into RocksDB stores;
probed through the cache). Each configuration runs `repetitions` times, in a JVM of its own, the
order of the configurations rotated from one repetition to the next; the figures are min / median
/ max over the repetitions of the total time and of the median micro-batch, the rest from the
last repetition: cache hits and misses, cached keys and bytes, bytes read from RocksDB; and the
output's fingerprint, observed inside the query (bench/outputs.py), by which each run's output is
compared with Spark's as a multiset.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench import commit as bench_commit, outputs, reported_on_fresh_checkpoint, spread

__all__ = ["SKEWS", "run_static_bench"]

SKEWS = (0.0, 0.5, 1.0)
#: (name, UMJoin's settings; None: UMJoin off): Spark, UMJoin as it runs by default, and UMJoin storing customer
#: with each cache mode.
RUNS: list[tuple[str, dict[str, str] | None]] = [
    ("spark", None), ("umjoin-default", {}),
    *((f"umjoin-store-{cache}", {"spark.umjoin.staticTables": "store", "spark.umjoin.staticCache": cache}) for cache in ("off", "ssbj", "all"))]
ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
STATE_PARTITIONS = 4
#: nation (about 2 kB) is broadcast, customer (about 12 MB of Parquet at SF 1) is not.
BROADCAST_THRESHOLD = "1m"
QUERY = """
SELECT o_orderkey, o_totalprice, c_name, c_acctbal, n_name
FROM orders o JOIN customer c ON o.o_custkey = c.c_custkey JOIN nation n ON c.c_nationkey = n.n_nationkey
"""


def skewed_orders(sf: float, batches: int, skew: float, seed: int = 42) -> Path:
    """``orders`` with each o_custkey drawn with Zipf skew `skew` over the customers, cut into `batches` files."""
    import duckdb

    from umjoin import tpch
    from umjoin.datadir import generating
    from umjoin.streams import split_into_batches

    source = tpch.generate(sf)
    target = source / f"static-bench-{batches}-zipf{skew:g}-seed{seed}"
    with generating(target):
        if not (target / "_COMPLETE").exists():
            con = duckdb.connect()
            con.execute(f"SELECT setseed({1 / (seed + 1)})")
            # Customers ranked in a random order; rank r has weight r^-skew; cum_before is the CDF below it.
            con.execute(f"""CREATE TABLE cdf AS
                WITH ranked AS (SELECT c_custkey, row_number() OVER (ORDER BY hash(c_custkey + {seed})) AS r FROM '{source / "customer.parquet"}'),
                     weighted AS (SELECT c_custkey, r, pow(r, -{skew}) AS w FROM ranked)
                SELECT c_custkey, (sum(w) OVER (ORDER BY r) - w) / sum(w) OVER () AS cum_before FROM weighted""")
            con.execute(f"""CREATE TABLE drawn AS SELECT o.* REPLACE (c.c_custkey AS o_custkey)
                FROM (SELECT *, random() AS u FROM '{source / "orders.parquet"}') o ASOF JOIN cdf c ON o.u >= c.cum_before""")
            con.execute(f"COPY (SELECT * EXCLUDE (u) FROM drawn) TO '{target.parent / f'{target.name}.parquet'}' (FORMAT parquet)")
            con.close()
            split_into_batches(target.parent / f"{target.name}.parquet", target / "orders", batches, seed)
            (target.parent / f"{target.name}.parquet").unlink()
            (target / "_COMPLETE").write_text("ok\n")
    return target


def _worker(spec: dict[str, Any]) -> dict[str, Any]:
    """One configuration's streaming run in this process's JVM."""
    from umjoin import tpch
    from umjoin.local import local_builder

    spark = (local_builder("umjoin-bench-static", shuffle_partitions=STATE_PARTITIONS, driver_memory="4g")
             .config("spark.sql.streaming.stateStore.providerClass", ROCKSDB_PROVIDER).getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark.conf.set("spark.sql.autoBroadcastJoinThreshold", BROADCAST_THRESHOLD)
    spark.conf.set("spark.umjoin.enabled", str(spec["settings"] is not None).lower())
    for key, value in (spec["settings"] or {}).items():
        spark.conf.set(key, value)
    data = tpch.generate(spec["sf"])
    for table in ("customer", "nation"):
        spark.read.parquet(str(data / f"{table}.parquet")).createOrReplaceTempView(table)
    orders = Path(spec["stream"]) / "orders"
    schema = spark.read.parquet(str(next(orders.glob("*.parquet")))).schema
    spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(orders)).createOrReplaceTempView("orders")
    query = (outputs.observed(spark.sql(QUERY)).writeStream.format("noop").option("checkpointLocation", spec["checkpoint"])
             .trigger(availableNow=True).start())
    start = time.perf_counter()
    query.awaitTermination()
    seconds = time.perf_counter() - start
    batches = []
    progress = query.recentProgress
    for p in progress:
        umjoin = [op for op in p["stateOperators"] if op["operatorName"] == "umJoin"]
        custom = umjoin[0]["customMetrics"] if umjoin else {}

        def metric(prefix: str) -> int:
            return sum(v for k, v in custom.items() if k.startswith(prefix))
        batches.append({
            "batch": p["batchId"], "duration_ms": p["durationMs"].get("triggerExecution", 0), "input_rows": p["numInputRows"],
            "output_rows": p["sink"].get("numOutputRows", -1), "output": outputs.observed_fingerprint(p),
            "hits": metric("staticCacheHitsInput"), "misses": metric("staticCacheMissesInput"),
            "cached_keys": metric("staticCachedKeysInput"), "cached_bytes": metric("staticCachedBytesInput"),
            "disk_bytes": metric("staticDiskBytesInput"), "loads": metric("staticLoadsInput"),
            "rocksdb_bytes_read": custom.get("rocksdbTotalBytesReadThroughIterator", 0) + custom.get("rocksdbTotalBytesRead", 0),
        })
    executed = query._jsq.streamingQuery().lastExecution().executedPlan().toString()
    spark.stop()
    return {"seconds": seconds, "batches": batches, "output": outputs.observed_output(progress), "umjoin_in_plan": "StreamingUMJoin " in executed}


def _run(spec: dict[str, Any]) -> dict[str, Any]:
    result = reported_on_fresh_checkpoint("bench.static", spec)
    if "ended" in result:
        raise RuntimeError(f"bench-static run {spec['name']} failed: {result['ended']}")
    b = result["batches"]
    probes = sum(x["hits"] + x["misses"] for x in b)
    result.update({
        "run": spec["name"], "output_rows": sum(x["output_rows"] for x in b),
        "median_batch_ms": statistics.median(x["duration_ms"] for x in b) if b else None,
        "hit_ratio": sum(x["hits"] for x in b) / probes if probes else None,
        "cached_keys": b[-1]["cached_keys"] if b else 0, "cached_bytes": b[-1]["cached_bytes"] if b else 0,
        "disk_bytes": b[-1]["disk_bytes"] if b else 0, "loads": sum(x["loads"] for x in b),
        "rocksdb_bytes_read": sum(x["rocksdb_bytes_read"] for x in b),
    })
    print(f"zipf {spec['skew']:<3g} {spec['name']:>18}: {result['seconds']:.1f} s, "
          f"output {result['output_rows']} (hash {outputs.shown(result['output'])}), "
          f"hit ratio {_pct(result['hit_ratio'])}, cached keys {result['cached_keys']}, cache {_mb(result['cached_bytes'])}, "
          f"read from RocksDB {_mb(result['rocksdb_bytes_read'])}", flush=True)
    return result


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f} %"


def _mb(value: float | None) -> str:
    return "-" if value is None else f"{value / 1e6:.1f} MB"


def run_static_bench(sf: float, batches: int, repetitions: int, out: Path) -> Path:
    """Runs every skew and configuration `repetitions` times, rotating their order; writes static_sf<sf>.md and .json into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    customers = 150_000 * sf
    commit = bench_commit()
    results = []
    for skew in SKEWS:
        stream = skewed_orders(sf, batches, skew)
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in RUNS}
        for repetition in range(repetitions):
            for name, settings in RUNS[repetition % len(RUNS):] + RUNS[:repetition % len(RUNS)]:
                runs[name].append(_run({"name": name, "settings": settings, "skew": skew, "sf": sf, "stream": str(stream),
                                        "checkpoint": str(out / "static-checkpoints" / f"{name}-{skew:g}")}))
        spark_output = runs["spark"][0]["output"]
        for name, of_run in runs.items():
            for run in of_run:
                run["same_output"] = outputs.equal(run["output"], spark_output)
        results.append({"skew": skew, "runs": runs})
    subprocess.run(["rm", "-rf", str(out / "static-checkpoints")], check=True)
    stem = f"static_sf{sf:g}"
    command = f"python -m bench static --sf {sf:g} --batches {batches} --repetitions {repetitions}"
    (out / f"{stem}.json").write_text(json.dumps({"command": command, "commit": commit, "sf": sf, "batches": batches,
                                                  "repetitions": repetitions, "state_partitions": STATE_PARTITIONS,
                                                  "broadcast_threshold": BROADCAST_THRESHOLD, "results": results}, indent=1) + "\n")
    lines = [f"# Stream-static join: TPC-H orders as a stream, customer and nation static (SF {sf:g})", "",
             f"`{command}` (`make bench-static`), on commit {commit}: {batches} micro-batches of orders in random order, each order's "
             f"customer drawn with Zipf skew; `nation` broadcast, `customer` not (`spark.sql.autoBroadcastJoinThreshold={BROADCAST_THRESHOLD}`, "
             f"AQE on as by default); RocksDB state store, {STATE_PARTITIONS} state partitions; each run in a JVM of its own, {repetitions} "
             "times, the order of the runs rotated between repetitions. umjoin-default: UMJoin with its default settings "
             "(`spark.umjoin.staticTables=auto` reads `customer` again, as Spark does: the query stays Spark's); umjoin-store-*: "
             "`customer` stored (`staticTables=store`) with each `spark.umjoin.staticCache` mode.", "",
             f"Times: min / median / max over the {repetitions} runs; / Spark: ratio of medians. Same output: every run's as Spark's "
             f"first run's, {outputs.COMPARED}. The rest from each configuration's last run.", "",
             "| Zipf | run | StreamingUMJoin | total s | / Spark | median batch ms | / Spark | output rows | output hash | same output | "
             "hit ratio | cached keys (% of customers) | cache memory | store on disk | read from RocksDB | loads |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        spark_total = statistics.median(run["seconds"] for run in r["runs"]["spark"])
        spark_batch = statistics.median(run["median_batch_ms"] for run in r["runs"]["spark"])
        for name, of_run in r["runs"].items():
            last = of_run[-1]
            stored = last["umjoin_in_plan"]
            totals = [run["seconds"] for run in of_run]
            batch_ms = [run["median_batch_ms"] for run in of_run]
            lines.append(f"| {r['skew']:g} | {name} | {'yes' if stored else 'no'} | {spread(totals, 1)} | {statistics.median(totals) / spark_total:.2f} | "
                         f"{spread(batch_ms, 0)} | {statistics.median(batch_ms) / spark_batch:.2f} | {last['output_rows']} | "
                         f"{outputs.shown(last['output'])} | {'yes' if all(run['same_output'] for run in of_run) else 'NO'} | "
                         f"{_pct(last['hit_ratio']) if stored else '-'} | "
                         f"{last['cached_keys']} ({100 * last['cached_keys'] / customers:.1f} %) | {_mb(last['cached_bytes']) if stored else '-'} | "
                         f"{_mb(last['disk_bytes']) if stored else '-'} | {_mb(last['rocksdb_bytes_read']) if stored else '-'} | {last['loads'] if stored else '-'} |")
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"written: {out / stem}.md (and .json)")
    return out / f"{stem}.md"


if __name__ == "__main__":
    print(json.dumps(_worker(json.loads(sys.argv[1]))))
