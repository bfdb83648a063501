"""`umjoin bench` (make bench): the 22 TPC-H queries with UMJoin off and on, measured in one run.

Off and on alternate within each repetition, after one unmeasured warm-up run of each, so both
see the same machine state. Results: a Markdown table and JSON under the output directory.
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from pathlib import Path

from pyspark.sql import SparkSession

from umjoin import answers, plans, tpch

__all__ = ["run_bench"]


def _timed(spark: SparkSession, sql: str, enabled: bool) -> tuple[float, list[tuple]]:  # type: ignore[type-arg]
    spark.conf.set("spark.umjoin.enabled", str(enabled).lower())
    start = time.perf_counter()
    rows = [tuple(r) for r in spark.sql(sql).collect()]
    return time.perf_counter() - start, rows


def run_bench(spark: SparkSession, sf: float, repetitions: int, out: Path, queries: list[int]) -> Path:
    directory = tpch.generate(sf)
    tpch.register(spark, directory)
    official = any(abs(sf - known) < 1e-9 for known in tpch.ANSWER_SCALE_FACTORS)
    results = []
    for number in queries:
        sql = tpch.query_text(number)
        _timed(spark, sql, False)
        _timed(spark, sql, True)
        times: dict[bool, list[float]] = {False: [], True: []}
        rows: dict[bool, list[tuple]] = {}  # type: ignore[type-arg]
        for _ in range(repetitions):
            for enabled in (False, True):
                seconds, rows[enabled] = _timed(spark, sql, enabled)
                times[enabled].append(seconds)
        spark.conf.set("spark.umjoin.enabled", "true")
        groups = [len(n.inputs) for n in plans.umjoin_nodes(plans.physical_plan(spark.sql(sql)))]
        same = sorted(map(repr, rows[False])) == sorted(map(repr, rows[True]))
        check = "n/a"
        if official:
            columns, expected = tpch.official_answer(number, sf)
            check = "ok" if not answers.compare(rows[True], expected, answers.order_by_columns(sql, columns)) else "WRONG"
        off, on = statistics.median(times[False]), statistics.median(times[True])
        results.append({
            "query": number, "umjoin_inputs": groups, "off_s": off, "on_s": on, "on_off_ratio": on / off,
            "off_runs_s": times[False], "on_runs_s": times[True], "same_answer": same, "official_answer": check,
        })
        print(f"Q{number:02d}  off {off:7.2f}s  on {on:7.2f}s  on/off {on / off:5.2f}  umjoin {groups}  same {same}  official {check}", flush=True)

    out.mkdir(parents=True, exist_ok=True)
    name = f"tpch_sf{sf:g}"
    meta = {"sf": sf, "repetitions": repetitions, "spark": spark.version, "machine": f"{platform.machine()}, local[2]"}
    (out / f"{name}.json").write_text(json.dumps({"meta": meta, "queries": results}, indent=1) + "\n")
    converted = [r for r in results if r["umjoin_inputs"]]
    lines = [
        f"# TPC-H SF {sf:g}: UMJoin off vs on (median of {repetitions} runs, Spark {spark.version}, local[2])",
        "",
        "| query | UMJoin inputs | off (s) | on (s) | on/off | same answer | official answer |",
        "|---|---|---:|---:|---:|---|---|",
        *(
            f"| Q{r['query']:02d} | {r['umjoin_inputs'] or '-'} | {r['off_s']:.2f} | {r['on_s']:.2f} | "
            f"{r['on_off_ratio']:.2f} | {'yes' if r['same_answer'] else 'NO'} | {r['official_answer']} |"
            for r in results
        ),
        "",
        f"Total: off {sum(r['off_s'] for r in results):.1f}s, on {sum(r['on_s'] for r in results):.1f}s. "
        f"Geometric mean on/off over the {len(converted)} converted queries: "
        f"{statistics.geometric_mean([r['on_off_ratio'] for r in converted]) if converted else float('nan'):.2f}.",
    ]
    (out / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return out / f"{name}.md"
