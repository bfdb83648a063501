"""`python -m bench psp` (make bench-psp): paper 004's setting, a multi-way window join without an equi-join
key, in Structured Streaming. Not a test: it prints and writes what it measured.

Three streams a, b, c (`--rows` rows each, `--per-second` a second of event time, each row a vector of
`--dim` random floats), cut into `--batches` files in event-time order. The join: b within 10 s of a;
c within 10 s of b and similar to a (the dot product of the two vectors above a threshold: a Python
UDF, then a SQL expression). Spark refuses it ("Stream-stream join without equality predicate is not
supported"). Runs, each in a JVM of its own: UMJoin with N = 1, 2, 4 and 8 time slices per window
over as many state partitions (paper 004's ring of N nodes), UMJoin as a user runs it by default (8
partitions, `spark.umjoin.timeSlices=auto`: as many slices as cores at first, then per stream the count the cost
model favours), and what a Spark user can do today: a `foreachBatch` over the three streams' union that keeps each stream's window and
joins, every micro-batch, the windows with the new rows (the combinations with at least one new row:
the delta rule by hand). Per run: total time, median and largest micro-batch, output rows and the
output's fingerprint (bench/outputs.py: every run's output, compared as a multiset, must be the same),
predicate calls (the Python UDF's, counted by an accumulator), UMJoin's partial combinations sent
between partitions and rows tested by its conditions, state rows per partition at the middle
micro-batch, peak RSS.

Then two streams a and b, denser (`PAIR_ROWS` at `PAIR_PER_SECOND`), b within 10 s of a and similar to it, over 8
partitions: Spark's join keyed by the slice (`spark.umjoin.minInputs=3`: all its state in one partition) against the
default, a StreamingUMJoin spread over the partitions by time slice.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

from bench import outputs, reported_on_fresh_checkpoint

__all__ = ["PREDICATES", "SLICE_COUNTS", "run_pair_bench", "run_psp_bench"]

SLICE_COUNTS = (1, 2, 4, 8)
NAMES = ("a", "b", "c")
WINDOW_SECONDS = 10
#: How the similarity is computed: a Python UDF (Spark evaluates it above the join, in Python workers), or the same
#: dot product as a SQL expression (higher-order functions over the arrays, evaluated inside the join, in the JVM).
PREDICATES = ("python", "sql")
#: The dot product a similar pair must exceed (a few pairs in a hundred of random vectors of 256 floats in [-1, 1]).
THRESHOLD = 8.0


def write_streams(directory: Path, rows: int, per_second: int, batches: int, dim: int, seed: int = 4) -> None:
    """Each stream's rows (`per_second` rows a second of event time, at random within it; a random vector) as one
    Parquet file per micro-batch, in event-time order, dated in batch order (the order a file source reads them)."""
    import duckdb

    con = duckdb.connect()
    con.execute(f"SELECT setseed({1 / (seed + 1)})")
    per = -(-rows // batches)
    for name in NAMES:
        (directory / name).mkdir(parents=True, exist_ok=True)
        for b in range(batches):
            path = directory / name / f"batch-{b:04d}.parquet"
            con.execute(f"""COPY (SELECT i AS {name}_id, i // {per_second} + random() AS {name}_seconds,
                                list_transform(range({dim}), x -> random() * 2 - 1) AS {name}_vec
                         FROM range({b * per}, {min(rows, (b + 1) * per)}) t(i)) TO '{path}' (FORMAT parquet)""")
            os.utime(path, (1_000_000 + b, 1_000_000 + b))
    con.close()


def _similar(x: list[float], y: list[float]) -> bool:
    return sum(p * q for p, q in zip(x, y)) > THRESHOLD


def _worker(spec: dict[str, Any]) -> dict[str, Any]:
    """One run in this process's JVM."""
    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F
    from pyspark.sql.types import BooleanType

    from bench import peak_rss_bytes, with_testkit
    from umjoin.local import local_builder

    partitions = spec["partitions"]
    builder = local_builder("umjoin-bench-psp", shuffle_partitions=partitions, driver_memory="4g").config("spark.umjoin.timeSlices", spec["slices"]) \
        .config("spark.umjoin.minInputs", spec.get("min_inputs", "auto"))
    if spec["slices"] == "auto":  # (Spark's default parallelism, which `auto` reads, is then the cores, as where nobody set it)
        builder = builder.config("spark.default.parallelism", "2")
    spark = with_testkit(builder).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    calls = spark.sparkContext.accumulator(0)

    def similar(x: list[float], y: list[float]) -> bool:
        calls.add(1)
        return _similar(x, y)

    similar_udf = F.udf(similar, BooleanType())

    def similarity(x: str, y: str):  # type: ignore[no-untyped-def]
        if spec["predicate"] == "python":
            return similar_udf(x, y)
        return F.expr(f"aggregate(zip_with({x}, {y}, (p, q) -> p * q), 0D, (total, v) -> total + v) > {THRESHOLD}")
    directory = Path(spec["streams"])

    def source(name: str) -> DataFrame:
        schema = f"{name}_id BIGINT, {name}_seconds DOUBLE, {name}_vec ARRAY<DOUBLE>"
        df = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(directory / name))
        return df.withColumn(f"{name}_ts", F.timestamp_seconds(f"{name}_seconds")).drop(f"{name}_seconds")

    def near(x: str, y: str):  # type: ignore[no-untyped-def]
        return F.col(x).between(F.col(y) - F.expr(f"interval {WINDOW_SECONDS} seconds"), F.col(y) + F.expr(f"interval {WINDOW_SECONDS} seconds"))

    started = time.time()
    if spec["run"] == "pair":  # a joined with b: Spark's join keyed by the slice, or a StreamingUMJoin, as spark.umjoin.minInputs says
        w = {n: source(n).withWatermark(f"{n}_ts", "5 seconds") for n in NAMES[:2]}
        joined = w["a"].join(w["b"], near("b_ts", "a_ts") & similarity("a_vec", "b_vec")).select("a_id", "b_id")
        query = (outputs.observed(joined).writeStream.format("memory").queryName("pair").option("checkpointLocation", spec["checkpoint"])
                 .trigger(availableNow=True).start())
        query.awaitTermination()
        output = outputs.observed_output(query.recentProgress)
        middle = query.recentProgress[len(query.recentProgress) // 2]["batchId"]
        stores = json.loads(spark._jvm.umjoin.spark.testkit.StateSizes.perPartitionJson(query._jsq.streamingQuery().lastExecution(), middle))  # type: ignore[union-attr]
        # The stored rows: UMJoin's input stores; Spark's stores of rows by key and index (the others count keys).
        kept = [s for s in stores if (s["store"].startswith("umjoin-input-") and "-index-" not in s["store"]) or s["store"].endswith("keyWithIndexToValue")]
        per_partition = [sum(s["rows"] for s in kept if s["partition"] == p) for p in range(partitions)]
        plan = query._jsq.streamingQuery().lastExecution().executedPlan().toString()
        sliced = "umjoin_time_slice_ring(" in plan
        shipped = tested = slices = None
    elif spec["run"] == "umjoin":
        w = {n: source(n).withWatermark(f"{n}_ts", "5 seconds") for n in NAMES}
        ab = w["a"].join(w["b"], near("b_ts", "a_ts")).withMetadata("a_ts", {})
        joined = ab.join(w["c"], near("c_ts", "b_ts") & similarity("a_vec", "c_vec")).select("a_id", "b_id", "c_id")
        query = (outputs.observed(joined).writeStream.format("memory").queryName("psp").option("checkpointLocation", spec["checkpoint"])
                 .trigger(availableNow=True).start())
        query.awaitTermination()
        output = outputs.observed_output(query.recentProgress)
        middle = query.recentProgress[len(query.recentProgress) // 2]["batchId"]
        stores = json.loads(spark._jvm.umjoin.spark.testkit.StateSizes.perPartitionJson(query._jsq.streamingQuery().lastExecution(), middle))  # type: ignore[union-attr]
        # (The inputs' stores: with RocksDB column families of one store, whose default family counts their rows.)
        per_partition = [sum(s["rows"] for s in stores if s["partition"] == p and s["store"].startswith("umjoin-input-")
                             and "-index-" not in s["store"]) for p in range(partitions)]
        plan = query._jsq.streamingQuery().lastExecution().executedPlan().toString()
        sliced = "umjoin_time_slice_ring(" in plan
        metrics = [p["stateOperators"][0]["customMetrics"] for p in query.recentProgress if p["stateOperators"]]
        slices = [int(n) for n in re.findall(r"(\d+) time slices per window", plan)]
        shipped = sum(m["partialCombinationsShipped"] for m in metrics)
        tested = sum(m[f"conditionChecksInput{i}"] for m in metrics for i in range(len(NAMES)))
    else:
        windows: dict[str, DataFrame] = {}
        found: list[dict[str, int]] = []

        def join_with_windows(batch: DataFrame, batch_id: int) -> None:
            """The combinations with at least one new row: each stream's window so far, plus its new rows, flagged."""
            sides = {}
            for n in NAMES:
                new = batch.where(F.col("src") == n).select(F.col("id").alias(f"{n}_id"), F.col("ts").alias(f"{n}_ts"),
                                                              F.col("vec").alias(f"{n}_vec"), F.lit(True).alias(f"{n}_new"))
                sides[n] = new if n not in windows else windows[n].unionByName(new)
                sides[n] = sides[n].localCheckpoint()
            ab = sides["a"].join(sides["b"], near("b_ts", "a_ts"))
            abc = ab.join(sides["c"], near("c_ts", "b_ts") & (F.col("a_new") | F.col("b_new") | F.col("c_new")))
            # Fingerprinted as UMJoin's output is observed: the hash is part of both runs' work.
            found.append(outputs.fingerprint_of(abc.where(similarity("a_vec", "c_vec")).select("a_id", "b_id", "c_id")))
            newest = batch.agg(F.max("ts")).first()[0]
            for n in NAMES:  # Rows more than two windows before the newest can join no later row (no row is late here).
                kept = sides[n].withColumn(f"{n}_new", F.lit(False))
                windows[n] = (kept.where(F.col(f"{n}_ts") >= F.lit(newest) - F.expr(f"interval {2 * WINDOW_SECONDS} seconds")) if newest else kept).localCheckpoint()

        union = None
        for n in NAMES:
            frame = source(n).select(F.lit(n).alias("src"), F.col(f"{n}_id").alias("id"), F.col(f"{n}_ts").alias("ts"), F.col(f"{n}_vec").alias("vec"))
            union = frame if union is None else union.unionByName(frame)
        assert union is not None
        query = union.writeStream.foreachBatch(join_with_windows).option("checkpointLocation", spec["checkpoint"]).trigger(availableNow=True).start()
        query.awaitTermination()
        output = outputs.union(found)
        per_partition = [sum(windows[n].count() for n in NAMES)]
        sliced = False
        shipped = tested = slices = None
    seconds = time.time() - started
    durations = [p["durationMs"]["triggerExecution"] for p in query.recentProgress]
    return {"seconds": seconds, "output": output, "output_rows": output["rows"] if output else None,
            "predicate_calls": calls.value if spec["predicate"] == "python" else None, "batch_ms": durations,
            "state_rows_per_partition": per_partition, "sliced": sliced, "slices": slices, "shipped": shipped, "rows_tested": tested, "peak_rss": peak_rss_bytes(spark.sparkContext._jvm.ProcessHandle.current().pid())}  # type: ignore[union-attr]


@contextlib.contextmanager
def _scratch_streams(rows: int, per_second: int, batches: int, dim: int) -> Iterator[dict[str, str]]:
    """The streams written to a scratch directory; yields where they are and where a run's checkpoint goes."""
    with tempfile.TemporaryDirectory(prefix="umjoin-bench-psp-") as scratch:
        write_streams(Path(scratch) / "streams", rows, per_second, batches, dim)
        yield {"streams": str(Path(scratch) / "streams"), "checkpoint": str(Path(scratch) / "checkpoint")}


def _run(spec: dict[str, Any]) -> dict[str, Any]:
    reported = reported_on_fresh_checkpoint("bench.psp", spec)
    if "ended" in reported:
        raise RuntimeError(f"bench-psp run {spec['name']} failed: {reported['ended']}")
    result: dict[str, Any] = {"run": spec["name"], "predicate": spec["predicate"], "partitions": spec["partitions"], **reported}
    result["median_batch_ms"] = statistics.median(result["batch_ms"])
    print(f"{spec['predicate']:>6} {spec['name']:>22}: {result['seconds']:.1f} s, median batch {result['median_batch_ms']:.0f} ms, largest "
          f"{max(result['batch_ms'])} ms, output {result['output_rows']} (hash {outputs.shown(result['output'])}), "
          f"predicate calls {result['predicate_calls']}, "
          f"state rows per partition {result['state_rows_per_partition']}", flush=True)
    return result


def run_psp_bench(out: Path, rows: int, per_second: int, batches: int, dim: int) -> Path:
    """Runs, per predicate, the foreachBatch baseline and UMJoin with each slice count; writes psp.md and psp.json into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    results = []
    with _scratch_streams(rows, per_second, batches, dim) as scratch:
        for predicate in PREDICATES:
            base = {**scratch, "predicate": predicate}
            runs = [_run({**base, "name": "foreachBatch by hand", "run": "baseline", "partitions": 2, "slices": "auto"})]
            runs += [_run({**base, "name": f"UMJoin, {n} slice{'s' if n > 1 else ''}", "run": "umjoin", "partitions": n, "slices": str(n)})
                     for n in SLICE_COUNTS]
            runs.append(_run({**base, "name": "UMJoin, 8 partitions, slices auto", "run": "umjoin", "partitions": 8, "slices": "auto"}))
            results.append({"predicate": predicate, "runs": runs})
    (out / "psp.json").write_text(json.dumps({"rows": rows, "per_second": per_second, "batches": batches, "dim": dim,
                                              "window_seconds": WINDOW_SECONDS, "threshold": THRESHOLD, "results": results}, indent=1) + "\n")
    lines = ["# A window join without an equi-join key (paper 004's setting)", "",
             f"`python -m bench psp --rows {rows} --per-second {per_second} --batches {batches} --dim {dim}`: streams a, b, c of {rows} rows "
             f"each ({per_second} a second of event time, each with a vector of {dim} floats), {batches} micro-batches; b within "
             f"{WINDOW_SECONDS} s of a, c within {WINDOW_SECONDS} s of b and similar to a (dot product above {THRESHOLD}): as a Python UDF "
             "(evaluated by Spark above the join, in Python workers) and as a SQL expression (evaluated in the join). One JVM per run, "
             "local[2]. UMJoin with N slices: N slices per window over N state partitions; 'slices auto': 8 partitions, at first as many "
             "slices as cores (2), then per stream the count paper 004's cost model favours for the costs measured in the micro-batch "
             "before (docs/streaming.md); 'slices at the end': each stream's count in the last micro-batch. Ratios: against UMJoin with one slice. Sent: partial combinations sent between partitions; tested: rows tested "
             "by UMJoin's conditions. The foreachBatch's state: the rows it holds after the last batch (each "
             f"stream's last {2 * WINDOW_SECONDS} s).", ""]
    for result in results:
        runs = result["runs"]
        one = runs[1]
        lines += [f"Similarity as {'a Python UDF' if result['predicate'] == 'python' else 'a SQL expression'}:", "",
                  "| run | total s | / 1 slice | throughput (input rows/s) | median batch ms (/ 1 slice) | largest batch ms | output rows | "
                  "output hash | predicate calls | sent | tested | slices at the end (a, b, c) | state rows per partition (middle batch) | peak RSS |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in runs:
            calls = r["predicate_calls"] if r["predicate_calls"] is not None else "not counted"
            lines.append(f"| {r['run']} | {r['seconds']:.1f} | {r['seconds'] / one['seconds']:.2f} | {3 * rows / r['seconds']:.0f} | "
                         f"{r['median_batch_ms']:.0f} ({r['median_batch_ms'] / one['median_batch_ms']:.2f}) | {max(r['batch_ms'])} | "
                         f"{r['output_rows']} | {outputs.shown(r['output'])} | {calls} | {r.get('shipped') if r.get('shipped') is not None else '-'} | "
                         f"{r.get('rows_tested') if r.get('rows_tested') is not None else '-'} | "
                         f"{', '.join(map(str, r['slices'])) if r.get('slices') else '-'} | {', '.join(map(str, r['state_rows_per_partition']))} | {r['peak_rss'] / 2**20:.0f} MB |")
        lines.append("")
    runs = [r for result in results for r in result["runs"]]
    equal = all(outputs.equal(r["output"], runs[0]["output"]) for r in runs)
    lines.append(f"Outputs equal in every run: {'yes' if equal else 'NO'} ({outputs.COMPARED}).")
    (out / "psp.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return out / "psp.md"


#: The two-stream runs' density: each row of a is within 10 s of about 800 rows of b, so that the similarity tests, not
#: each micro-batch's fixed costs, take most of the time.
PAIR_ROWS, PAIR_PER_SECOND, PAIR_PARTITIONS = 2400, 40, 8


def run_pair_bench(out: Path, batches: int, dim: int) -> Path:
    """Two streams joined without an equi-join key: Spark's join keyed by the slice (spark.umjoin.minInputs=3, all its state
    in one partition) against the default (a StreamingUMJoin spread over the partitions by time slice); psp_pair.md/.json."""
    out.mkdir(parents=True, exist_ok=True)
    results = []
    with _scratch_streams(PAIR_ROWS, PAIR_PER_SECOND, batches, dim) as scratch:
        for predicate in PREDICATES:
            base = {**scratch, "predicate": predicate, "run": "pair", "partitions": PAIR_PARTITIONS, "slices": "auto"}
            results += [_run({**base, "name": "Spark's join (minInputs=3)", "min_inputs": "3"}),
                        _run({**base, "name": "UMJoin (default)", "min_inputs": "auto"})]
    (out / "psp_pair.json").write_text(json.dumps({"rows": PAIR_ROWS, "per_second": PAIR_PER_SECOND, "batches": batches, "dim": dim,
                                                   "partitions": PAIR_PARTITIONS, "window_seconds": WINDOW_SECONDS, "results": results}, indent=1) + "\n")
    lines = ["# Two streams joined without an equi-join key", "",
             f"Part of `make bench-psp`: streams a and b of {PAIR_ROWS} rows each ({PAIR_PER_SECOND} a second of event time, a vector "
             f"of {dim} floats each), {batches} micro-batches, {PAIR_PARTITIONS} shuffle partitions, local[2]; b within {WINDOW_SECONDS} s "
             "of a and similar to it (as in psp.md). Spark's join keyed by the slice, all its state in one partition (what UMJoin did "
             "with two inputs before `spark.umjoin.minInputs=auto`), against a StreamingUMJoin (the default now: slices `auto`, 2).", "",
             "| similarity | run | total s | / Spark's join | median batch ms | output rows | output hash | predicate calls | "
             "stored rows per partition (middle batch) | peak RSS |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for spark_join, umjoin in zip(results[::2], results[1::2]):
        for r in (spark_join, umjoin):
            calls = r["predicate_calls"] if r["predicate_calls"] is not None else "not counted"
            lines.append(f"| {r['predicate']} | {r['run']} | {r['seconds']:.1f} | {r['seconds'] / spark_join['seconds']:.2f} | "
                         f"{r['median_batch_ms']:.0f} | {r['output_rows']} | {outputs.shown(r['output'])} | {calls} | {', '.join(map(str, r['state_rows_per_partition']))} | "
                         f"{r['peak_rss'] / 2**20:.0f} MB |")
    equal = all(outputs.equal(r["output"], results[0]["output"]) for r in results)
    lines += ["", f"Outputs equal in every run: {'yes' if equal else 'NO'} ({outputs.COMPARED})."]
    (out / "psp_pair.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return out / "psp_pair.md"


if __name__ == "__main__":
    print(json.dumps(_worker(json.loads(sys.argv[1]))))
