"""`python -m bench streaming` (make bench-streaming): the paper's main claim (000, title and 4.2) in
Structured Streaming, at this machine's scale. Not a test: it prints and writes what it measured.

Two workloads, each table's rows in random order, cut into files that a file source reads one per
micro-batch (the paper fed CSV through Kafka in random order), all runs with the RocksDB state store:

- ``tpcds``: the paper's 4-way TPC-DS join over four streams, all on one key (the address).
  Spark's chained stream-stream joins keep the lower joins' results as state; UMJoin keeps only the
  four inputs. A memory-capped round repeats the runs with less driver memory (paper Fig. 5a-c), with
  the in-memory state store too. The result must be 2,157,897 rows at SF 1, the same rows both ways.
- ``tpch``: the join blocks of TPC-H Q3, Q5, Q9 and Q10 (``umjoin.streams.join_block``) as streams,
  joined over several key classes: UMJoin's stores partitioned by the probe-cost model's choice
  against Spark's chained stream-stream joins.

Each run has its own JVM and reports per batch: duration, rows in and out, state rows, index
entries and bytes (UMJoin per input), partial combinations shipped between stores, and at the end
peak memory (the JVM's resident set high-water mark). Each run's output is fingerprinted inside the
query, per micro-batch (bench/outputs.py), and Spark's and UMJoin's compared as multisets.
"""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench import commit, enrichment, outputs, peak_rss_bytes, reported_by, reported_on_fresh_checkpoint, with_testkit

__all__ = ["TPCH_BLOCKS", "WORKLOADS", "run_streaming_bench"]

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
#: The TPC-DS join's and TPC-H blocks' runs, each in a JVM of its own with RocksDB and 4g: Spark's joins at its default join state
#: format (2) and at its best (4: one store per join with column families, eviction by event time), and one StreamingUMJoin.
FORMAT_RUNS = [  # (name, UMJoin on, the run's session settings)
    ("spark-format2", False, {"spark.sql.streaming.join.stateFormatVersion": "2"}),
    ("spark-format4", False, {"spark.sql.streaming.join.stateFormatVersion": "4"}),
    ("umjoin", True, {}),
]
#: The TPC-H join blocks measured as streams (the issue's choice: one to six inputs, two to four key classes).
TPCH_BLOCKS = (3, 5, 9, 10)
WORKLOADS = ("tpcds", "tpch", "enrichment")
STATE_PARTITIONS = 4
#: What issue 67 asks of every TPC-H block: UMJoin's median time at most this much of Spark's best format's.
TIME_TARGET = 0.7


def tpcds_stream_files(sf: float, batches: int, seed: int = 42) -> Path:
    """The 4-way join's tables, each cut into `batches` files of its rows in a seeded random order."""
    from umjoin import tpcds
    from umjoin.streams import cut_into_streams

    return cut_into_streams(tpcds.generate(sf), tpcds.FOUR_WAY_TABLES, batches, seed)


def _streaming_query(spark: Any, spec: dict[str, Any]) -> Any:
    """The workload's query over its tables as streams, a streaming DataFrame."""
    from umjoin import streams, tpcds, tpch

    files = Path(spec["streams"])
    if spec["workload"] == "enrichment":
        return enrichment.dataframe(spark, files, enrichment.chain(spec["chain"]))
    if spec["workload"] == "tpcds":
        streams.read_streams(spark, files, tpcds.FOUR_WAY_TABLES, tpcds.generate(spec["sf"]))
        return spark.sql(tpcds.FOUR_WAY_QUERY)
    streams.read_streams(spark, files, tpch.TABLES, tpch.generate(spec["sf"]))
    return spark.sql(streams.join_block(spec["query"]))


def _worker(spec: dict[str, Any]) -> dict[str, Any]:
    """One streaming run in this process's JVM."""
    from umjoin.local import local_builder

    builder = with_testkit(local_builder("umjoin-bench-streaming", shuffle_partitions=STATE_PARTITIONS, driver_memory=spec["driver_memory"]))
    spark = builder.config("spark.sql.streaming.stateStore.providerClass", spec["provider"]).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark.conf.set("spark.umjoin.enabled", str(spec["umjoin"]).lower())
    for key, value in spec["settings"].items():  # the run's own (Spark's join state format), and --conf's for UMJoin runs
        spark.conf.set(key, value)
    query = (outputs.observed(_streaming_query(spark, spec)).writeStream.format("noop")
             .option("checkpointLocation", spec["checkpoint"]).trigger(availableNow=True).start())
    start = time.perf_counter()
    error = None
    try:
        query.awaitTermination()
    except Exception as e:  # the run failed: report why (the paper's operators "terminated prematurely")
        error = next((l for l in str(e).splitlines() if "Error" in l or "Exception" in l), str(e).splitlines()[0])[:300]
    seconds = time.perf_counter() - start
    batches = []
    progress = query.recentProgress
    for p in progress:
        operators = p["stateOperators"]
        umjoin = [op for op in operators if op["operatorName"] == "umJoin"]
        custom = umjoin[0]["customMetrics"] if umjoin else {}
        inputs = sorted(int(name[len("stateRowsInput"):]) for name in custom if name.startswith("stateRowsInput"))
        batches.append({
            "batch": p["batchId"],
            "duration_ms": p["durationMs"].get("triggerExecution", 0),
            "input_rows": p["numInputRows"],
            "output_rows": p["sink"].get("numOutputRows", -1),
            "output": outputs.observed_fingerprint(p),
            "state_rows": sum(op["numRowsTotal"] for op in operators),
            "state_index_entries": sum(custom.get(f"stateIndexEntriesInput{i}", 0) for i in inputs),
            "state_memory_bytes": sum(op["memoryUsedBytes"] for op in operators),
            "state_disk_bytes": sum(op["customMetrics"].get("rocksdbSstFileSize", 0) for op in operators),
            "state_rows_per_input": [custom[f"stateRowsInput{i}"] for i in inputs] if umjoin else None,
            "shipped": custom.get("partialCombinationsShipped", 0),
        })
    plan = query._jsq.streamingQuery().lastExecution()
    executed = plan.executedPlan().toString() if plan is not None else ""
    pid = spark._jvm.java.lang.ProcessHandle.current().pid()
    rss = peak_rss_bytes(pid)
    # Where the resident memory is: the JVM heap (its pools' highest use, and what it holds from the OS) or outside it (RocksDB, buffers).
    management = spark._jvm.java.lang.management.ManagementFactory
    heap_pools = [p for p in management.getMemoryPoolMXBeans() if p.getType().toString() == "Heap memory"]
    peak_heap = sum(p.getPeakUsage().getUsed() for p in heap_pools)
    heap_committed = management.getMemoryMXBean().getHeapMemoryUsage().getCommitted()
    # Read back from the checkpoint after the peaks above were taken, so that reading does not count in them.
    sizes_error = None
    if plan is not None and batches and not error:
        try:
            sizes = state_sizes(spark, plan, [b["batch"] for b in batches])
        except Exception as e:  # the run's own figures stand; say why its exact state size is missing
            sizes, sizes_error = {}, str(e).splitlines()[0][:300]
        for b in batches:
            b["state_data_rows"], b["state_data_bytes"] = sizes.get(b["batch"], (None, None))
    # Stopped here, not by the JVM's exit. (JVMs with RocksDB stores open used to hang in their exit,
    # a compaction's log call blocked by the exiting JVM; StoresClosedAtExit in the shim now closes them first.)
    spark.stop()
    return {"seconds": seconds, "error": error, "batches": batches, "output": outputs.observed_output(progress), "peak_rss_bytes": rss,
            "peak_heap_bytes": peak_heap, "heap_committed_bytes": heap_committed, "state_sizes_error": sizes_error,
            "umjoin_in_plan": "StreamingUMJoin " in executed, "stream_stream_joins": executed.count("StreamingSymmetricHashJoin")}


def state_sizes(spark: Any, execution: Any, batch_ids: list[int]) -> dict[int, tuple[int, int]]:
    """Per micro-batch, the rows and exact bytes (keys and values as stored) of the query's join state, read back from its checkpoint
    by the testkit's StateSizes: one measure for Spark's joins and UMJoin, comparable with a Flink savepoint's size."""
    ids = spark.sparkContext._gateway.new_array(spark._jvm.long, len(batch_ids))
    for k, batch in enumerate(batch_ids):
        ids[k] = batch
    measured = json.loads(spark._jvm.umjoin.spark.testkit.StateSizes.perBatchJson(execution, ids))
    return {m["batch"]: (m["rows"], m["bytes"]) for m in measured}


def _run_in_jvm(spec: dict[str, Any], name: str) -> dict[str, Any]:
    """Runs `spec` in a JVM of its own; the summary figures added to what it reported."""
    result = reported_on_fresh_checkpoint("bench.streaming", spec)
    if "error" not in result:
        result = {"seconds": None, "error": f"JVM ended: {result['ended']}", "batches": [], "output": None, "peak_rss_bytes": None,
                  "umjoin_in_plan": False, "stream_stream_joins": None}
    batches = result["batches"]
    last = batches[-1] if batches else {}
    result.update({
        "run": name,
        "driver_memory": spec["driver_memory"],
        "provider": spec["provider"].rsplit(".", 1)[-1],
        "output_rows": sum(b["output_rows"] for b in batches),
        "final_state_rows": last.get("state_rows"),
        "max_state_rows": max((b["state_rows"] for b in batches), default=None),
        "final_state_bytes": last["state_memory_bytes"] + last["state_disk_bytes"] if last else None,
        "max_state_bytes": max((b["state_memory_bytes"] + b["state_disk_bytes"] for b in batches), default=None),
        "shipped": sum(b["shipped"] for b in batches),
        "max_state_data_bytes": max((b.get("state_data_bytes") or 0 for b in batches), default=0) or None,
        "max_state_data_rows": max((b.get("state_data_rows") or 0 for b in batches), default=0) or None,
    })
    print(f"{spec.get('label', spec['workload']):>8} {name:>15} {spec['driver_memory']:>4}: "
          f"{'ok' if not result['error'] else 'FAILED ' + result['error']}  {result['seconds'] or 0:.0f}s  output {result['output_rows']} "
          f"(hash {outputs.shown(result['output'])})  "
          f"state rows at end {result['final_state_rows']}  state bytes {_mb(result['final_state_bytes'])}  "
          f"peak RSS {_mb(result['peak_rss_bytes'])} (heap: peak use {_mb(result.get('peak_heap_bytes'))}, held {_mb(result.get('heap_committed_bytes'))})",
          flush=True)
    return result


def run_streaming_bench(sf: float, batches: int, out: Path, workloads: tuple[str, ...] = WORKLOADS,
                        tpch_blocks: tuple[int, ...] = TPCH_BLOCKS, settings: dict[str, str] | None = None,
                        repetitions: int = 3) -> list[Path]:
    """Runs the workloads (the TPC-DS join and the TPC-H blocks of `tpch_blocks` by Spark's joins at state formats 2 and 4 and
    by UMJoin, each `repetitions` times) and writes
    streaming_<workload>_sf<sf>.md / .json / .png into `out`; `settings` are session settings of the UMJoin runs."""
    settings = settings or {}
    out.mkdir(parents=True, exist_ok=True)
    checkpoints = out / "streaming-checkpoints"
    written = []
    if "tpcds" in workloads:
        from umjoin import tpcds

        files = tpcds_stream_files(sf, batches)
        runs = _repeated_runs({"workload": "tpcds", "sf": sf, "streams": str(files)}, checkpoints / "tpcds", settings, repetitions)
        expected = tpcds.FOUR_WAY_ROWS_SF1 if sf == 1 else None
        blocks = [{"label": "TPC-DS 4-way", "runs": runs, **_comparison(runs)}]
        stem = f"streaming_tpcds_sf{sf:g}"
        command = (f"python -m bench streaming --workload tpcds --sf {sf:g} --batches {batches} --repetitions {repetitions}"
                   + "".join(f" --conf {k}={v}" for k, v in settings.items()))
        (out / f"{stem}.json").write_text(json.dumps({"command": command, "commit": commit(), "sf": sf, "batches": batches,
                                                      "expected_rows": expected, "state_partitions": STATE_PARTITIONS,
                                                      "repetitions": repetitions, "umjoin_settings": settings, "blocks": blocks},
                                                     indent=1) + "\n")
        title = f"Streaming: the paper's 4-way TPC-DS join at SF {sf:g} over {batches} micro-batches"
        described = (f"The paper's join of store_returns, customer, web_returns and catalog_returns (expected result rows: "
                     f"{expected if expected is not None else 'n/a'}), where the join multiplies rows")
        (out / f"{stem}.md").write_text(_format_markdown(title, described, batches, repetitions, command, blocks)
                                        + _settings_line(settings))
        _format_plots(out / f"{stem}.png", blocks)
        written.append(out / f"{stem}.md")
    if "tpch" in workloads:
        from umjoin import streams

        files = streams.tpch_streams(sf, batches)
        blocks = []
        for number in tpch_blocks:
            runs = _repeated_runs({"workload": "tpch", "query": number, "label": f"Q{number:02d}", "sf": sf, "streams": str(files)},
                                  checkpoints / f"tpch-q{number}", settings, repetitions)
            blocks.append({"label": f"Q{number:02d}", "query": number, "sql": streams.join_block(number), "runs": runs,
                           **_comparison(runs)})
        stem = f"streaming_tpch_sf{sf:g}"
        command = (f"python -m bench streaming --workload tpch --sf {sf:g} --batches {batches} --blocks {','.join(map(str, tpch_blocks))} "
                   f"--repetitions {repetitions}" + "".join(f" --conf {k}={v}" for k, v in settings.items()))
        (out / f"{stem}.json").write_text(json.dumps({"command": command, "commit": commit(), "sf": sf, "batches": batches,
                                                      "state_partitions": STATE_PARTITIONS, "repetitions": repetitions,
                                                      "umjoin_settings": settings, "blocks": blocks}, indent=1) + "\n")
        title = f"Streaming: TPC-H join blocks at SF {sf:g} over {batches} micro-batches"
        described = ("Each block (`SELECT *` over the query's tables with its join and filter predicates), key/foreign-key joins "
                     "with several key classes")
        (out / f"{stem}.md").write_text(_format_markdown(title, described, batches, repetitions, command, blocks)
                                        + _settings_line(settings))
        _format_plots(out / f"{stem}.png", blocks)
        written.append(out / f"{stem}.md")
    if "enrichment" in workloads:
        written.append(_enrichment_bench(sf, batches, out, checkpoints, settings, repetitions))
    subprocess.run(["rm", "-rf", str(checkpoints)], check=True)
    print("written: " + ", ".join(str(p) for p in written) + " (and .json, .png beside each)")
    return written


def _repeated_runs(workload: dict[str, Any], checkpoint: Path, settings: dict[str, str], repetitions: int) -> list[dict[str, Any]]:
    """The `workload` run by each of FORMAT_RUNS `repetitions` times, each in its own JVM, the order turned by one each round;
    `settings` for the UMJoin runs."""
    runs = []
    for repetition in range(repetitions):
        turn = repetition % len(FORMAT_RUNS)
        for name, umjoin, run_settings in FORMAT_RUNS[turn:] + FORMAT_RUNS[:turn]:
            run = _run_in_jvm({**workload, "umjoin": umjoin, "provider": ROCKSDB_PROVIDER, "driver_memory": "4g",
                               "checkpoint": f"{checkpoint}-{name}-{repetition}", "settings": {**run_settings, **(settings if umjoin else {})}},
                              name)
            runs.append({**run, "repetition": repetition})
    return runs


def _enrichment_bench(sf: float, batches: int, out: Path, checkpoints: Path, settings: dict[str, str], repetitions: int) -> Path:
    """The enrichment chains (orders LEFT JOIN 5 and 10 side streams, and 5 on two keys) run as the TPC-H blocks are (Spark's joins at
    state formats 2 and 4, UMJoin), and by Flink 2.3 with MultiJoin and with its binary joins where PyFlink is installed, each
    `repetitions` times; writes streaming_enrichment_sf<sf>.md / .json / .png."""
    import importlib.util

    files = enrichment.stream_files(sf, batches)
    flink = importlib.util.find_spec("pyflink") is not None
    if not flink:
        print("PyFlink is not installed (pip install -e '.[peers]'): the enrichment chains run without Flink beside them")
    chains = []
    for label, sides in enrichment.CHAINS.items():
        expected_checks = enrichment.expected_checks(files, sides)
        expected = int(expected_checks[0])
        runs = _repeated_runs({"workload": "enrichment", "chain": label, "label": label, "sf": sf, "streams": str(files)},
                              checkpoints / f"enrichment-{len(chains)}", settings, repetitions)
        comparison = _comparison(runs)
        # (Every run's output against DuckDB's count too: equal outputs could all miss rows.)
        comparison["same_output"] = comparison["same_output"] and all(r["output_rows"] == expected for r in runs)
        flink_runs = []
        for repetition in range(repetitions if flink else 0):
            peers = FLINK_RUNS[repetition % 2:] + FLINK_RUNS[:repetition % 2]
            flink_runs += [{**_flink_run(files, label, expected, multi_join, name), "repetition": repetition} for name, multi_join in peers]
        chains.append({"label": label, "sql": enrichment.sql(sides), "expected_rows": expected, "checks": enrichment.checks(sides),
                       "expected_checks": expected_checks, "runs": runs, "flink_runs": flink_runs, **comparison})
    stem = f"streaming_enrichment_sf{sf:g}"
    command = (f"python -m bench streaming --workload enrichment --sf {sf:g} --batches {batches} --repetitions {repetitions}"
               + "".join(f" --conf {k}={v}" for k, v in settings.items()))
    (out / f"{stem}.json").write_text(json.dumps({"command": command, "commit": commit(), "sf": sf, "batches": batches,
                                                  "state_partitions": STATE_PARTITIONS, "repetitions": repetitions,
                                                  "umjoin_settings": settings, "chains": chains}, indent=1) + "\n")
    title = f"Streaming: enrichment chains of LEFT joins at TPC-H SF {sf:g} over {batches} event-time micro-batches"
    described = ("One stream of orders LEFT JOINed with 5 and with 10 side streams keyed by the order (shipments of lines 1-7, "
                 "deliveries of lines 1-3), each on the order key and a time window after the order, and with 5 on two keys (the "
                 "fifth: the same customer's orders within 30 days, on the customer key) (`bench/enrichment.py`), watermarks of 1 "
                 "day; every run's output rows also checked against the chain's result as DuckDB computes it from the same files")
    (out / f"{stem}.md").write_text(_format_markdown(title, described, batches, repetitions, command, chains)
                                    + _flink_markdown(chains) + _settings_line(settings))
    _format_plots(out / f"{stem}.png", chains)
    return out / f"{stem}.md"


#: Flink 2.3's runs of the enrichment chains: (name, MultiJoin on).
FLINK_RUNS = [("flink-multijoin", True), ("flink-binary", False)]


def _flink_run(files: Path, label: str, expected: int, multi_join: bool, name: str) -> dict[str, Any]:
    """One Flink run of the chain `label` in a process of its own (see bench.flink_peer)."""
    sides = enrichment.chain(label)
    spec = {"files": str(files), "tables": ["orders", *(s[0] for s in sides)], "sql": enrichment.sql(sides),
            "checks": enrichment.checks(sides), "expected_rows": expected, "multi_join": multi_join, "timeout_s": 3600}
    result = reported_by("bench.flink_peer", spec)
    if "error" not in result:
        result = {"seconds": None, "error": f"Flink ended: {result['ended']}", "output_rows": None, "checks": None, "state_bytes": None,
                  "peak_rss_bytes": None, "multi_join_in_plan": False}
    result["run"] = name
    print(f"{label:>8} {name:>15}: {'ok' if not result['error'] else 'FAILED ' + result['error']}  {result['seconds'] or 0:.0f}s  "
          f"output {result['output_rows']}  state bytes (savepoint) {_mb(result['state_bytes'])}  peak RSS {_mb(result['peak_rss_bytes'])}",
          flush=True)
    return result


def _flink_markdown(chains: list[dict[str, Any]]) -> str:
    """The Flink runs' table, where there were any: not the same work as Spark's and UMJoin's runs (said in the table)."""
    if not any(chain["flink_runs"] for chain in chains):
        return ""
    lines = [
        "",
        "Flink 2.3 beside them (PyFlink, local mini cluster, parallelism 2, RocksDB), its regular joins over the same rows as CSV, "
        "with `table.optimizer.multi-join.enabled` (MultiJoin) and without (binary joins). **Not the same work**: Flink runs "
        "without checkpoints during the run and never evicts (regular joins keep every row; only a state TTL in processing time "
        "would, which changes the answer on a replay), where Spark and UMJoin commit their state every micro-batch and evict by "
        "watermark. Its output is checked by its row count, each stream's matched rows and the sums of its numeric columns "
        "against DuckDB's (`enrichment.checks`: Flink's regular LEFT join retracts the padded rows it put out, so its result "
        "is aggregated over the chain). Time: until the result's count settled, min / median / max.",
        "",
        "| chain | run | plan | output as DuckDB's | time (s) | state bytes: savepoint once every row is in (median) | "
        "peak RSS (median) | UMJoin / this run: median time |",
        "|---|---|---|---|---:|---:|---:|---:|",
    ]
    for chain in chains:
        for name, _ in FLINK_RUNS:
            group = [r for r in chain["flink_runs"] if r["run"] == name]
            failed = [r["error"] for r in group if r["error"]]
            if not group or failed:
                lines.append(f"| {chain['label']} | {name} | failed: {'; '.join(failed)[:150]} | | | | | |")
                continue
            seconds = _spread([r["seconds"] for r in group])
            umjoin = (chain["seconds"] or {}).get("umjoin")
            same = all(r["checks"] == chain["expected_checks"] for r in group)
            lines.append(f"| {chain['label']} | {name} | {'MultiJoin' if group[0]['multi_join_in_plan'] else 'binary joins'} | "
                         f"{'yes' if same else 'NO'} | {seconds[0]:.0f} / {seconds[1]:.0f} / {seconds[2]:.0f} | "
                         f"{_mb(statistics.median(r['state_bytes'] or 0 for r in group))} | "
                         f"{_mb(statistics.median(r['peak_rss_bytes'] or 0 for r in group))} | "
                         f"{_ratio(umjoin[1] / seconds[1]) if umjoin else '-'} |")
    return "\n".join(lines) + "\n"


def _settings_line(settings: dict[str, str]) -> str:
    return "\nThe UMJoin runs with " + ", ".join(f"`{k}={v}`" for k, v in settings.items()) + " (`--conf`).\n" if settings else ""


def _by_run(runs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """A block's runs by FORMAT_RUNS name, in repetition order."""
    return {name: [r for r in runs if r["run"] == name] for name, _, _ in FORMAT_RUNS}


def _spread(values: list[float]) -> tuple[float, float, float]:
    return min(values), statistics.median(values), max(values)


def _comparison(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One block's figures: per run name its times' min / median / max; UMJoin's median over Spark's best format's; whether every
    run put out the same rows (None where a run failed)."""
    if any(r["error"] or not r["batches"] for r in runs):
        return {"same_output": False, "seconds": None, "best_spark": None, "time_ratio": None}
    named = _by_run(runs)
    seconds = {name: _spread([r["seconds"] for r in group]) for name, group in named.items()}
    best = min((name for name in named if name.startswith("spark")), key=lambda name: seconds[name][1])
    return {
        "same_output": all(outputs.equal(runs[0]["output"], r["output"]) for r in runs),
        "seconds": seconds,
        "best_spark": best,
        "time_ratio": seconds["umjoin"][1] / seconds[best][1],
    }


def _mb(value: Any) -> str:
    return "-" if value is None else f"{value / 2**20:.0f}MB"



def _ratio(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _format_markdown(title: str, described: str, batches: int, repetitions: int, command: str, blocks: list[dict[str, Any]]) -> str:
    names = [name for name, _, _ in FORMAT_RUNS]
    lines = [
        f"# {title} (local[2], {STATE_PARTITIONS} state partitions, RocksDB state store)",
        "",
        f"`{command}` at commit {commit()}.",
        "",
        f"{described}, runs as Spark's chained stream-stream joins at join state format 2 (Spark's default: four stores per join) "
        "and 4 (Spark at its best: one store per join with column families) and as one StreamingUMJoin, "
        f"{repetitions} times each, each run in its own JVM with 4g, the order turned by one each round. Times are min / median / "
        "max over the runs; UMJoin / Spark's best divides medians. State at the end (of the first run of each): rows kept "
        "(UMJoin: its inputs' rows; Spark: its inputs' rows and every intermediate result) and bytes (state memory + SST files "
        "on disk); the state's exact bytes at their highest (every stored key and value, read back from the checkpoint after the "
        "run; Spark's format 2 and UMJoin only: the testkit reads Spark's formats 1 and 2); peak RSS: the median.",
        "",
        f"Same output: every run's {outputs.COMPARED}. Target (issue 67): UMJoin's median time at most {TIME_TARGET:g}x Spark's best format's.",
        "",
        "| join | Spark's joins -> UMJoin | same output | output rows | " + " | ".join(f"time (s): {n}" for n in names) +
        " | UMJoin / Spark's best | state rows at end: " + " / ".join(names) + " | state bytes at end: " + " / ".join(names) +
        " | max state bytes, exact: " + " / ".join(names) + " | peak RSS: " + " / ".join(names) + " |",
        "|---|---|---|---:|" + "---:|" * len(names) + "---:|---|---|---|---|",
    ]
    for block in blocks:
        failed = [f"{r['run']} #{r['repetition'] + 1}: {r['error']}" for r in block["runs"] if r["error"]]
        if failed:
            lines.append(f"| {block['label']} | failed: {'; '.join(failed)[:200]} |" + " |" * (len(names) + 7))
            continue
        named = _by_run(block["runs"])
        first = {name: group[0] for name, group in named.items()}
        spark, umjoin = first["spark-format2"], first["umjoin"]
        times = " | ".join("{:.0f} / {:.0f} / {:.0f}".format(*block["seconds"][n]) for n in names)
        lines.append(
            f"| {block['label']} | {spark['stream_stream_joins']} -> {'1 StreamingUMJoin' if umjoin['umjoin_in_plan'] else 'none'}"
            f" + {umjoin['stream_stream_joins']} | {'yes' if block['same_output'] else 'NO'} | {umjoin['output_rows']} | {times} | "
            f"{_ratio(block['time_ratio'])} (of {block['best_spark']}) | {' / '.join(str(first[n]['final_state_rows']) for n in names)} | "
            f"{' / '.join(_mb(first[n]['final_state_bytes']) for n in names)} | "
            f"{' / '.join(_mb(first[n].get('max_state_data_bytes')) for n in names)} | "
            f"{' / '.join(_mb(statistics.median(r['peak_rss_bytes'] or 0 for r in named[n])) for n in names)} |")
    measured = [b for b in blocks if b["time_ratio"] is not None]
    if len(measured) > 1:
        geomean = math.exp(sum(math.log(b["time_ratio"]) for b in measured) / len(measured))
        met = sum(1 for b in measured if b["time_ratio"] <= TIME_TARGET)
        lines += ["", f"Meeting the time target: {met} of {len(measured)}; geometric mean of UMJoin / Spark's best {geomean:.2f}."]
    return "\n".join(lines) + "\n"


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install -e '.[bench]'): no plots", file=sys.stderr)
        return None
    return plt


def _format_plots(path: Path, blocks: list[dict[str, Any]]) -> None:
    plt = _pyplot()
    if plt is None:
        return
    figure, axes = plt.subplots(2, len(blocks), figsize=(5 * len(blocks), 8), squeeze=False)
    for column, block in enumerate(blocks):
        state, durations = axes[0][column], axes[1][column]
        for r in block["runs"]:
            if not r["batches"] or r["repetition"] > 0:
                continue
            numbers = [b["batch"] for b in r["batches"]]
            state.plot(numbers, [b["state_rows"] for b in r["batches"]], marker=".", label=f"{r['run']}: rows")
            if r["run"].startswith("umjoin"):
                state.plot(numbers, [b["state_rows"] + b["state_index_entries"] for b in r["batches"]], linestyle="--",
                           label=f"{r['run']}: rows + index entries")
            durations.plot(numbers, [b["duration_ms"] / 1000 for b in r["batches"]], marker=".", label=r["run"])
        state.set(xlabel="micro-batch", ylabel="state rows", title=f"{block['label']}: state over time")
        durations.set(xlabel="micro-batch", ylabel="batch duration (s)", title=f"{block['label']}: batch durations")
        state.legend()
        durations.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)


if __name__ == "__main__":
    print(json.dumps(_worker(json.loads(sys.argv[1]))))
