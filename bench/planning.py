"""`python -m bench planning`: what planning a micro-batch costs, UMJoin against Spark's chained stream-stream joins.
Not a test: it prints and writes what it measured.

Two chains of JSON file streams (each stream a key, an event time and a value; 50 rows per stream and micro-batch,
10-minute watermarks, each stream within 20 minutes of the first on the key): three streams joined INNER, six joined
LEFT OUTER. Runs, each in a JVM of its own (local[2], 4 shuffle partitions, a noop sink with the output's fingerprint
observed, bench/outputs.py), alternating the settings within each repetition: Spark's joins with Spark's default state
store, Spark's joins at their best (RocksDB, join state format 4), UMJoin with the default store and with RocksDB. Per
run, the medians over its micro-batches (the first two left out: the JVM warms up) of `durationMs.queryPlanning` and of
`durationMs.triggerExecution` (the micro-batch's latency) and of the state operators' `commitTimeMs` summed (their
stores' commits, summed over the tasks), the first micro-batch's `queryPlanning` and latency (a new checkpoint's, in a
JVM that just started, so slower for every run; UMJoin chooses its layout in it), the state store instances, the state
operators the progress lists and whether the executed plan holds a StreamingSymmetricHashJoinExec; per setting, the
min/median/max of those figures over the repetitions. With `--baseline-jar JAR --baseline-name NAME`, a fifth
setting runs UMJoin with RocksDB from another build of the shim (an earlier commit's jar), so that a change is
measured against what it replaced in the same run.
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench import commit, outputs, reported_on_fresh_checkpoint, spread

ROWS_PER_BATCH = 50
#: The micro-batches' first ones, left out of the medians.
WARM_UP = 2
ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
#: (chain, streams, join type).
CHAINS = [("3 streams, INNER", 3, "inner"), ("6 streams, LEFT", 6, "left")]
#: (run, UMJoin on, state store provider or None for Spark's default, join state format or None for Spark's default).
SETTINGS = [
    ("Spark's joins", False, None, None),
    ("Spark's joins, RocksDB, format 4", False, ROCKSDB_PROVIDER, "4"),
    ("UMJoin", True, None, None),
    ("UMJoin, RocksDB", True, ROCKSDB_PROVIDER, None),
]


def write_streams(directory: Path, streams: int, batches: int, seed: int = 1) -> None:
    """One JSON file per stream and micro-batch, event times advancing a minute per micro-batch."""
    rng = random.Random(seed)
    for s in range(streams):
        (directory / f"s{s}").mkdir(parents=True)
        for b in range(batches):
            rows = ({"k": rng.randrange(200), "ts": 1_700_000_000 + b * 60 + rng.randrange(60), "v": rng.randrange(1000)}
                    for _ in range(ROWS_PER_BATCH))
            (directory / f"s{s}" / f"{b:03d}.json").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _worker(spec: dict[str, Any]) -> dict[str, Any]:
    """One run in this process's JVM."""
    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F

    from umjoin.local import local_builder

    builder = local_builder("umjoin-bench-planning", shuffle_partitions=4).config("spark.umjoin.enabled", str(spec["umjoin"]).lower())
    if spec.get("jar"):
        builder = builder.config("spark.jars", spec["jar"])
    if spec["provider"]:
        builder = builder.config("spark.sql.streaming.stateStore.providerClass", spec["provider"])
    if spec["format"]:
        builder = builder.config("spark.sql.streaming.join.stateFormatVersion", spec["format"])
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")

    def stream(s: int) -> DataFrame:
        rows = (spark.readStream.schema("k INT, ts LONG, v INT").option("maxFilesPerTrigger", 1)
                .json(str(Path(spec["streams"]) / f"s{s}")))
        return (rows.select(F.col("k").alias(f"k{s}"), F.timestamp_seconds("ts").alias(f"t{s}"), F.col("v").alias(f"v{s}"))
                .withWatermark(f"t{s}", "10 minutes"))

    joined = stream(0)
    for s in range(1, spec["streams_count"]):
        within = F.expr(f"k0 = k{s} AND t{s} BETWEEN t0 - INTERVAL 20 MINUTES AND t0 + INTERVAL 20 MINUTES")
        # The joined stream's event time off its watermark: Spark's join refuses two (MULTIPLE_EVENT_TIME_COLUMNS).
        joined = joined.join(stream(s), within, spec["how"]).withMetadata(f"t{s}", {})
    query = (outputs.observed(joined).writeStream.format("noop").option("checkpointLocation", spec["checkpoint"])
             .trigger(availableNow=True).start())
    query.awaitTermination()
    progress = query.recentProgress
    measured = progress[WARM_UP:]
    plan = query._jsq.streamingQuery().lastExecution().executedPlan().toString()  # type: ignore[attr-defined]
    return {"batches": len(progress), "planning_ms": statistics.median(p["durationMs"].get("queryPlanning", 0) for p in measured),
            "latency_ms": statistics.median(p["durationMs"]["triggerExecution"] for p in measured),
            "commit_ms": statistics.median(sum(op["commitTimeMs"] for op in p["stateOperators"]) for p in measured),
            "first_planning_ms": progress[0]["durationMs"].get("queryPlanning", 0),
            "first_latency_ms": progress[0]["durationMs"]["triggerExecution"],
            "store_instances": sum(op["numStateStoreInstances"] for op in progress[-1]["stateOperators"]),
            "state_operators": [op["operatorName"] for op in progress[-1]["stateOperators"]],
            "sparks_join_planned": "StreamingSymmetricHashJoin" in plan, "output": outputs.observed_output(progress)}


def run_planning_bench(out: Path, batches: int, repetitions: int, baseline: tuple[Path, str] | None = None) -> Path:
    """Runs every setting on both chains, `repetitions` times alternating; writes planning.md and planning.json into `out`.

    `baseline`: (a jar of the shim, its name), run as one more setting (UMJoin, RocksDB)."""
    out.mkdir(parents=True, exist_ok=True)
    settings = [(name, umjoin, provider, state_format, None) for name, umjoin, provider, state_format in SETTINGS]
    if baseline is not None:
        jar, label = baseline
        if not jar.is_file():
            raise SystemExit(f"bench planning: no jar at {jar}; build one with `python jvm-shim/build_jar.py {jar}` in a "
                             "checkout of the commit to compare with")
        settings.append((f"UMJoin, RocksDB, {label}", True, ROCKSDB_PROVIDER, None, str(jar.resolve())))
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="umjoin-bench-planning-") as scratch:
        for chain, streams, how in CHAINS:
            directory = Path(scratch) / f"streams{streams}"
            write_streams(directory, streams, batches)
            for repetition in range(repetitions):
                for name, umjoin, provider, state_format, jar in settings:
                    spec = {"streams": str(directory), "streams_count": streams, "how": how, "umjoin": umjoin, "provider": provider,
                            "format": state_format, "jar": jar, "checkpoint": str(Path(scratch) / "checkpoint")}
                    reported = reported_on_fresh_checkpoint("bench.planning", spec)
                    if "ended" in reported:
                        raise RuntimeError(f"bench planning run {chain} / {name} failed: {reported['ended']}")
                    print(f"{chain:>17} {name:>33} #{repetition + 1}: planning {reported['planning_ms']:.0f} ms, micro-batch "
                          f"{reported['latency_ms']:.0f} ms, commits {reported['commit_ms']:.0f} ms, state operators "
                          f"{reported['state_operators']}, output "
                          f"{outputs.shown(reported['output'])}", flush=True)
                    results.append({"chain": chain, "run": name, "repetition": repetition + 1, **reported})
    measured = commit()
    (out / "planning.json").write_text(json.dumps({"commit": measured, "batches": batches, "repetitions": repetitions,
                                                   "baseline": baseline and [str(baseline[0]), baseline[1]],
                                                   "rows_per_batch": ROWS_PER_BATCH, "results": results}, indent=1) + "\n")
    command = f"python -m bench planning --batches {batches} --repetitions {repetitions}" + (
        f" --baseline-jar {baseline[0]} --baseline-name '{baseline[1]}'" if baseline else "")
    lines = ["# Planning a micro-batch: UMJoin against Spark's chained stream-stream joins", "",
             f"`{command}` at commit {measured}: "
             f"{__doc__.split(chr(10), 2)[2].strip()}", "",
             "Figures in ms, min / median / max over the repetitions of each run's median (the first micro-batch's: of its "
             "figure); ratios of medians against Spark's joins (default store).", "",
             "| chain | run | queryPlanning | / Spark's | micro-batch | / Spark's | commitTimeMs | first micro-batch: queryPlanning "
             "| first micro-batch | store instances | state operators | Spark's join planned |",
             "|---|---|---|---|---|---|---|---|---|---:|---|---|"]
    for chain, _, _ in CHAINS:
        of_chain = [r for r in results if r["chain"] == chain]
        base = [r for r in of_chain if r["run"] == SETTINGS[0][0]]
        base_planning = statistics.median(r["planning_ms"] for r in base)
        base_latency = statistics.median(r["latency_ms"] for r in base)
        for name, *_ in settings:
            runs = [r for r in of_chain if r["run"] == name]
            planning = [r["planning_ms"] for r in runs]
            latency = [r["latency_ms"] for r in runs]
            lines.append(f"| {chain} | {name} | {spread(planning, 0)} | {statistics.median(planning) / base_planning:.2f} | "
                         f"{spread(latency, 0)} | {statistics.median(latency) / base_latency:.2f} | "
                         f"{spread([r['commit_ms'] for r in runs], 0)} | {spread([r['first_planning_ms'] for r in runs], 0)} | "
                         f"{spread([r['first_latency_ms'] for r in runs], 0)} | {runs[-1]['store_instances']} | "
                         f"{', '.join(runs[-1]['state_operators'])} | {'yes' if runs[-1]['sparks_join_planned'] else 'no'} |")
    equal = all(outputs.equal(r["output"], next(b for b in results if b["chain"] == r["chain"])["output"]) for r in results)
    lines += ["", f"Outputs equal within each chain in every run: {'yes' if equal else 'NO'} ({outputs.COMPARED})."]
    (out / "planning.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return out / "planning.md"


if __name__ == "__main__":
    print(json.dumps(_worker(json.loads(sys.argv[1]))))
