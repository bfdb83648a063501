"""`python -m bench tpch` (make bench): the 22 TPC-H queries with UMJoin off and on, measured in one run.

Two settings of Spark's broadcast threshold: its default (10 MB), and a low one (1 MB: how larger
data looks, where only small inputs are broadcast and Spark's other joins shuffle and sort their
intermediate results). Per setting and query, off and on alternate within each repetition (off
first in one, on first in the next), after one unmeasured warm-up run of each, each run on a freshly
collected heap, so both see the same machine state. Beside the times, each plan's
join work UMJoin can save: the bytes its joins read through shuffles of intermediate (joined) results
and the task time its sorts for joins took. Every run's answer is compared with every other's as a
multiset (``bench.outputs.digest`` of its collected rows). Results: Markdown, JSON and a plot of the
on/off ratios under the output directory.
"""

from __future__ import annotations

import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from bench import commit as bench_commit, outputs, spread
from umjoin import answers, plans, tpch
from umjoin.local import temporary_conf

__all__ = ["run_bench", "THRESHOLDS"]

# Broadcast threshold settings measured: name -> spark.sql.autoBroadcastJoinThreshold (None: Spark's default).
THRESHOLDS: dict[str, str | None] = {"default": None, "1MB": "1m"}


_JOINS = {"SortMergeJoinExec", "BroadcastHashJoinExec", "ShuffledHashJoinExec", "BroadcastNestedLoopJoinExec",
          "CartesianProductExec", "UMJoinExec"}
# Nodes between a join and the exchange or sort feeding it.
_BETWEEN = {"SortExec", "ProjectExec", "FilterExec", "ShuffleQueryStageExec", "AQEShuffleReadExec", "InputAdapter",
            "WholeStageCodegenExec", "ShuffleExchangeExec"}


def join_work(plan: plans.PlanNode) -> dict[str, float]:
    """What the executed `plan`'s joins cost beyond reading their inputs: MB of intermediate (already
    joined) results shuffled into a join, and the sorts for joins (how many, and their task time)."""
    shuffled = sort_ms = sorts = 0

    def visit(node: plans.PlanNode, feeds_join: bool) -> None:
        nonlocal shuffled, sort_ms, sorts
        if feeds_join and node.name == "SortExec":
            sorts += 1
            sort_ms += node.metrics.get("sort time", 0)
        if feeds_join and node.name == "ShuffleExchangeExec" and any(n.name in _JOINS for n in node.children[0].walk()):
            shuffled += node.metrics.get("data size", 0)
        for child in node.children:
            visit(child, node.name in _JOINS or (feeds_join and node.name in _BETWEEN))

    visit(plan, False)
    return {"intermediate_shuffled_mb": shuffled / 1e6, "join_sorts": sorts, "join_sort_s": sort_ms / 1e3}


def _timed(spark: SparkSession, sql: str, enabled: bool) -> tuple[float, list[tuple], dict[str, float]]:  # type: ignore[type-arg]
    """Seconds, rows and join work of one run, started on a collected heap (the driver's JVM runs the
    tasks too: otherwise a run pays for the garbage of the one before)."""
    spark.conf.set("spark.umjoin.enabled", str(enabled).lower())
    spark._jvm.java.lang.System.gc()  # type: ignore[union-attr]
    start = time.perf_counter()
    df = spark.sql(sql)
    rows = [tuple(r) for r in df.collect()]
    seconds = time.perf_counter() - start
    return seconds, rows, join_work(plans.physical_plan(df))


def _measure(spark: SparkSession, sf: float, repetitions: int, queries: list[int]) -> list[dict[str, Any]]:
    official = any(abs(sf - known) < 1e-9 for known in tpch.ANSWER_SCALE_FACTORS)
    results = []
    for number in queries:
        sql = tpch.query_text(number)
        # Every run's answer, warm-ups too, as an order-independent digest (taken after its timing).
        digests: dict[bool, list[str]] = {enabled: [outputs.digest(_timed(spark, sql, enabled)[1])] for enabled in (False, True)}
        times: dict[bool, list[float]] = {False: [], True: []}
        rows: dict[bool, list[tuple]] = {}  # type: ignore[type-arg]
        work: dict[bool, dict[str, float]] = {}
        for repetition in range(repetitions):
            # off-on, then on-off: neither setting always runs second, on a JIT-warmer JVM.
            for enabled in (False, True) if repetition % 2 == 0 else (True, False):
                seconds, rows[enabled], work[enabled] = _timed(spark, sql, enabled)
                times[enabled].append(seconds)
                digests[enabled].append(outputs.digest(rows[enabled]))
        spark.conf.set("spark.umjoin.enabled", "true")
        groups = [len(n.inputs) for n in plans.umjoin_nodes(plans.physical_plan(spark.sql(sql)))]
        same = len({*digests[False], *digests[True]}) == 1
        check = "n/a"
        if official:
            columns, expected = tpch.official_answer(number, sf)
            check = "ok" if not answers.compare(rows[True], expected, answers.order_by_columns(sql, columns)) else "WRONG"
        off, on = statistics.median(times[False]), statistics.median(times[True])
        results.append({
            "query": number, "umjoin_inputs": groups, "off_s": off, "on_s": on, "on_off_ratio": on / off,
            "off_runs_s": times[False], "on_runs_s": times[True], "same_answer": same, "official_answer": check,
            "off_digests": digests[False], "on_digests": digests[True],
            "off_join_work": work[False], "on_join_work": work[True],
        })
        print(f"Q{number:02d}  off {off:7.2f}s  on {on:7.2f}s  on/off {on / off:5.2f}  umjoin {groups}  same {same}  official {check}", flush=True)
    return results


def geometric_mean_converted(results: list[dict[str, Any]]) -> float:
    """Geometric mean of on/off over the queries UMJoin converts (NaN if none)."""
    ratios = [r["on_off_ratio"] for r in results if r["umjoin_inputs"]]
    return statistics.geometric_mean(ratios) if ratios else float("nan")


def _table(threshold: str, results: list[dict[str, Any]]) -> list[str]:
    converted = [r for r in results if r["umjoin_inputs"]]
    unconverted = [r for r in results if not r["umjoin_inputs"]]
    return [
        f"## Broadcast threshold: {threshold}",
        "",
        "| query | UMJoin inputs | off (s): min / median / max | on (s): min / median / max | on/off | joined rows shuffled off / on (MB) | join sorts off / on (s) | same answer | official answer |",
        "|---|---|---:|---:|---:|---:|---:|---|---|",
        *(
            f"| Q{r['query']:02d} | {r['umjoin_inputs'] or '-'} | {spread(r['off_runs_s'], 2)} | {spread(r['on_runs_s'], 2)} | {r['on_off_ratio']:.2f} | "
            f"{r['off_join_work']['intermediate_shuffled_mb']:.1f} / {r['on_join_work']['intermediate_shuffled_mb']:.1f} | "
            f"{r['off_join_work']['join_sort_s']:.2f} / {r['on_join_work']['join_sort_s']:.2f} | "
            f"{'yes' if r['same_answer'] else 'NO'} | {r['official_answer']} |"
            for r in results
        ),
        "",
        "Joined rows shuffled: bytes of already joined (intermediate) results shuffled into a join; join sorts: task "
        "time of the sorts feeding sort-merge joins (both from the last run's SQL metrics, summed over tasks). "
        "Same answer: every run's answer, UMJoin off and on, warm-ups included, compared as a multiset: an order-independent "
        "digest of its collected rows (SHA-256 over their sorted reprs, taken after the run's timing; in the JSON per run).",
        "",
        f"Total: off {sum(r['off_s'] for r in results):.1f}s, on {sum(r['on_s'] for r in results):.1f}s. "
        f"Geometric mean on/off over the {len(converted)} converted queries: {geometric_mean_converted(results):.2f}; "
        f"highest: {max((r['on_off_ratio'] for r in converted), default=float('nan')):.2f}. "
        # The queries UMJoin leaves alone run the same plan both ways: their spread is this run's noise.
        f"The {len(unconverted)} queries left alone (the same plan both ways): on/off "
        f"{min((r['on_off_ratio'] for r in unconverted), default=float('nan')):.2f}-"
        f"{max((r['on_off_ratio'] for r in unconverted), default=float('nan')):.2f}.",
        "",
    ]


def _plot(path: Path, measured: dict[str, list[dict[str, Any]]]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install -e '.[bench]'): no plot", file=sys.stderr)
        return
    figure, axes = plt.subplots(1, len(measured), figsize=(8 * len(measured), 5), squeeze=False)
    for ax, (threshold, results) in zip(axes[0], measured.items()):
        labels = [f"Q{r['query']:02d}" for r in results]
        colours = ["tab:blue" if r["umjoin_inputs"] else "tab:gray" for r in results]
        ax.bar(labels, [r["on_off_ratio"] for r in results], color=colours)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set(ylabel="time on / time off", title=f"broadcast threshold {threshold}: "
               f"geomean over converted (blue) {geometric_mean_converted(results):.2f}")
        ax.tick_params(axis="x", rotation=90)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def run_bench(spark: SparkSession, sf: float, repetitions: int, out: Path, queries: list[int],
              thresholds: list[str] | None = None) -> Path:
    directory = tpch.generate(sf)
    tpch.register(spark, directory)
    measured: dict[str, list[dict[str, Any]]] = {}
    for threshold in thresholds or list(THRESHOLDS):
        value = THRESHOLDS[threshold]
        print(f"broadcast threshold {threshold}", flush=True)
        settings = {} if value is None else {"spark.sql.autoBroadcastJoinThreshold": value}
        with temporary_conf(spark, settings):
            measured[threshold] = _measure(spark, sf, repetitions, queries)

    out.mkdir(parents=True, exist_ok=True)
    name = f"tpch_sf{sf:g}"
    command = (f"python -m bench tpch --sf {sf:g} --repetitions {repetitions}"
               + (f" --queries {','.join(map(str, queries))}" if list(queries) != list(tpch.QUERY_NUMBERS) else "")
               + (f" --thresholds {','.join(thresholds)}" if thresholds else ""))
    meta = {"command": command, "commit": bench_commit(), "sf": sf, "repetitions": repetitions, "spark": spark.version, "machine": f"{platform.machine()}, local[2]",
            "thresholds": {t: THRESHOLDS[t] or "Spark's default" for t in measured}}
    (out / f"{name}.json").write_text(json.dumps({"meta": meta, "thresholds": measured}, indent=1) + "\n")
    lines = [f"# TPC-H SF {sf:g}: UMJoin off vs on (median of {repetitions} runs, Spark {spark.version}, local[2])", "",
             f"`{command}` (`make bench`), on commit {meta['commit']}.", ""]
    for threshold, results in measured.items():
        lines += _table(threshold, results)
    (out / f"{name}.md").write_text("\n".join(lines))
    _plot(out / f"{name}.png", measured)
    print("\n".join(lines))
    return out / f"{name}.md"
