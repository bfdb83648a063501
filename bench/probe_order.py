"""`python -m bench probe-order` (make bench-probe-order): paper 001's experiments (5.2-5.4) at this
machine's scale. Not a test: it prints and writes what it measured.

The paper's 4-way TPC-DS join, its four inputs' rows arriving interleaved in one seeded random
order (the JVM's ArrivalReplay: each arriving row probes the rows that arrived before it along
its input's route, then is stored). Every run starts from one of the 24 initial orders of Cu, Cr,
Wr, Sr (each input probes the others in that order) under one policy; the adaptive ones choose
again every T arrivals from the forecast of the last L cycles. Runs of one initial order share a
task, one after the other, so they see the same machine state; every run must produce the same
result rows as Spark without UMJoin, compared as multisets: the count and the replay's checksum
(the sum of a hash of every row, with each input's NULL mask hashed ahead of its columns). Time is the replay's own (first arrival to last); probe work
(probes + matches) is reported beside it because it does not depend on the machine's noise.
"""

from __future__ import annotations

import itertools
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from bench import outputs
from umjoin import tpcds
from umjoin.local import temporary_conf

__all__ = ["run_probe_order_bench"]

#: The paper's short names for the four inputs (5.2), in the paper's order.
SHORT = {"customer": "Cu", "catalog_returns": "Cr", "web_returns": "Wr", "store_returns": "Sr"}
#: The paper's policies and ablations (5.2, 5.3) as spark.umjoin.* settings.
POLICIES: dict[str, dict[str, str]] = {
    "fixedOrder": {"spark.umjoin.probeOrder": "fixed"},
    "selectivityFirst": {"spark.umjoin.probeOrder": "selectivityFirst"},
    "greedy_MSJ": {"spark.umjoin.probeOrder": "greedy"},
    "dpPick": {"spark.umjoin.probeOrder": "dpPick"},
    "dpPick_queryCost": {"spark.umjoin.probeOrder": "dpPick", "spark.umjoin.dpPick.matchCost": "0"},
    "dpPick_matchCost": {"spark.umjoin.probeOrder": "dpPick", "spark.umjoin.dpPick.queryCost": "0"},
    "dpPick_noSmooth": {"spark.umjoin.probeOrder": "dpPick", "spark.umjoin.dpPick.smoothing": "false"},
}
#: The two initial orders of the paper's sweeps (5.4), where dpPick gained most over fixedOrder.
SWEEP_ORDERS = ("CrWrSrCu", "WrCuCrSr")
#: The paper's headline (5.2, 5.3) to compare with.
PAPER = {"dpPick fastest (of 24)": 22, "dpPick vs fixedOrder": -31.2, "dpPick vs greedy_MSJ": -20.4,
         "dpPick vs selectivityFirst": -56.1, "dpPick_queryCost faster than fixedOrder (of 24)": 16,
         "dpPick_matchCost faster than fixedOrder (of 24)": 18, "dpPick faster than dpPick_noSmooth (of 24)": 22}


def _register_with_null_masks(spark: SparkSession, directory: Path) -> None:
    """The 4-way join's tables, each with its NULL masks (bench/outputs.py) as its first columns: the replay's checksum, the
    testkit's, hashes the result's columns with xxhash64, which skips NULLs; each input's masks, never NULL, ahead of its
    columns say which of them follow, so that the checksum tells (1, NULL) from (NULL, 1). One BIGINT more per stored row."""
    for table in tpcds.FOUR_WAY_TABLES:
        df = spark.read.parquet(str(directory / f"{table}.parquet"))
        masks = [mask.alias(f"{table}_nulls{k}") for k, mask in enumerate(outputs.null_masks([df[c] for c in df.columns]))]
        df.select(*masks, "*").createOrReplaceTempView(table)


def _sparks_output(spark: SparkSession, columns: str) -> dict[str, int]:
    """Spark's own result (UMJoin off): its rows, and the replay's checksum over the same `columns` (`<input>.<column>`, the
    replay's order)."""
    names = [c.split(".", 1)[1] for c in columns.split(",")]
    with temporary_conf(spark, {"spark.umjoin.enabled": "false"}):
        low_bits = F.xxhash64(*names).bitwiseAND(F.lit(0xFFFFFFFF))
        rows, checksum = spark.sql(tpcds.FOUR_WAY_QUERY).agg(F.count(F.lit(1)), F.sum(low_bits)).first()
    return {"rows": rows, "checksum": checksum or 0}


def _name(order: tuple[str, ...]) -> str:
    return "".join(SHORT[t] for t in order)


def run_probe_order_bench(spark: SparkSession, sf: float, out: Path, backend: str, cycle_rows: int, history: int,
                          periods: list[int], histories: list[int], repetitions: int, seed: int = 42) -> Path:
    spark.conf.set("spark.sql.adaptive.enabled", "false")  # the replay reads the final plan
    _register_with_null_masks(spark, tpcds.generate(sf))
    spark.conf.set("spark.umjoin.enabled", "true")
    replay = spark.sparkContext._jvm.umjoin.spark.testkit.ArrivalReplay.prepare(spark.sql(tpcds.FOUR_WAY_QUERY)._jdf)
    columns = replay.resultColumns()
    expected = _sparks_output(spark, columns)
    base = {"spark.umjoin.stateBackend": backend, "spark.umjoin.dpPick.cycleRows": str(cycle_rows),
            "spark.umjoin.dpPick.history": str(history)}
    arrivals = spark.sql("SELECT " + " + ".join(f"(SELECT count(*) FROM {t})" for t in tpcds.FOUR_WAY_TABLES)).first()[0]
    print(f"TPC-DS SF {sf:g}: {arrivals} arrivals, {expected['rows']} result rows, checksum {expected['checksum']} "
          f"(Spark without UMJoin); backend {backend}, "
          f"T = {cycle_rows} arrivals, L = {history} cycles", flush=True)

    def run(order: tuple[str, ...], runs: list[tuple[str, dict[str, str]]]) -> list[dict[str, Any]]:
        """The runs from one initial order in one task, `repetitions` times; per run the median time."""
        request = {"seed": seed, "checksum": True, "runs": [{"initialOrder": list(order), "conf": {**base, **conf}} for _, conf in runs]}
        rounds = [json.loads(replay.replayJson(json.dumps(request))) for _ in range(repetitions)]
        results = []
        for k, (label, conf) in enumerate(runs):
            measured = [r[k] for r in rounds]
            found = [{"rows": m["rows"], "checksum": m["checksum"]} for m in measured]
            if any(f != expected for f in found):
                raise AssertionError(f"{_name(order)} {label}: result rows and checksums {found}, Spark's {expected}: not the same rows")
            result = dict(measured[0], seconds=statistics.median(m["seconds"] for m in measured),
                          all_seconds=[m["seconds"] for m in measured], policy=label, order=_name(order),
                          work=measured[0]["probes"] + measured[0]["matches"], conf=conf)
            results.append(result)
        return results

    started = time.perf_counter()
    paper_order = tuple(SHORT)
    run(paper_order, [("warm-up", POLICIES["fixedOrder"]), ("warm-up", POLICIES["dpPick"])])  # JIT and caches, discarded
    comparative = []
    for order in itertools.permutations(paper_order):
        results = run(order, list(POLICIES.items()))
        comparative += results
        print(f"{_name(order)}: " + "  ".join(f"{r['policy']} {r['seconds']:.2f}s" for r in results), flush=True)
    period_sweep, history_sweep = [], []
    for short in SWEEP_ORDERS:
        order = tuple(next(t for t, s in SHORT.items() if s == short[i:i + 2]) for i in range(0, 8, 2))
        for t in periods:
            conf = {"spark.umjoin.dpPick.cycleRows": str(t)}
            for r in run(order, [("fixedOrder", {**POLICIES["fixedOrder"], **conf}), ("dpPick", {**POLICIES["dpPick"], **conf})]):
                period_sweep.append(dict(r, T=t))
            print(f"{short} T={t}: " + "  ".join(f"{r['policy']} {r['seconds']:.2f}s" for r in period_sweep[-2:]), flush=True)
        for length in histories:
            r = run(order, [("dpPick", {**POLICIES["dpPick"], "spark.umjoin.dpPick.history": str(length)})])[0]
            history_sweep.append(dict(r, L=length))
            print(f"{short} L={length}: dpPick {r['seconds']:.2f}s", flush=True)
    replay.release()

    summary = _summary(comparative)
    out.mkdir(parents=True, exist_ok=True)
    name = f"probe_order_tpcds_sf{sf:g}_{backend}"
    setup = {"sf": sf, "backend": backend, "arrivals": arrivals, "expected_rows": expected["rows"], "expected_checksum": expected["checksum"],
             "checksum_columns": columns, "T": cycle_rows, "L": history,
             "repetitions": repetitions, "seed": seed, "minutes": round((time.perf_counter() - started) / 60, 1)}
    (out / f"{name}.json").write_text(json.dumps({"setup": setup, "summary": summary, "paper": PAPER, "comparative": comparative,
                                                  "period_sweep": period_sweep, "history_sweep": history_sweep}, indent=1) + "\n")
    (out / f"{name}.md").write_text(_markdown(setup, summary, comparative, period_sweep, history_sweep))
    _plots(out / f"{name}.png", comparative, period_sweep, history_sweep)
    print("\n".join(f"{key}: measured {summary[key]}  paper {PAPER[key]}" for key in PAPER))
    print(f"written: {out / name}.md, .json and .png")
    return out / f"{name}.md"


def _by(results: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """Initial order -> policy -> result."""
    table: dict[str, dict[str, dict[str, Any]]] = {}
    for r in results:
        table.setdefault(r["order"], {})[r["policy"]] = r
    return table


def _change(results: dict[str, dict[str, Any]], policy: str, baseline: str, measure: str = "seconds") -> float:
    return 100 * (results[policy][measure] / results[baseline][measure] - 1)


def _summary(comparative: list[dict[str, Any]]) -> dict[str, Any]:
    table = _by(comparative)
    main = ("fixedOrder", "selectivityFirst", "greedy_MSJ", "dpPick")

    def mean(values: list[float]) -> float:
        return round(sum(values) / len(values), 1)

    def faster(policy: str, baseline: str) -> int:
        return sum(1 for r in table.values() if r[policy]["seconds"] < r[baseline]["seconds"])

    return {
        "dpPick fastest (of 24)": sum(1 for r in table.values() if min(main, key=lambda p: r[p]["seconds"]) == "dpPick"),
        **{f"dpPick vs {b}": mean([_change(r, "dpPick", b) for r in table.values()]) for b in main[:3]},
        **{f"dpPick work vs {b}": mean([_change(r, "dpPick", b, "work") for r in table.values()]) for b in main[:3]},
        "dpPick_queryCost faster than fixedOrder (of 24)": faster("dpPick_queryCost", "fixedOrder"),
        "dpPick_matchCost faster than fixedOrder (of 24)": faster("dpPick_matchCost", "fixedOrder"),
        "dpPick faster than dpPick_noSmooth (of 24)": faster("dpPick", "dpPick_noSmooth"),
    }


def _markdown(setup: dict[str, Any], summary: dict[str, Any], comparative: list[dict[str, Any]],
              period_sweep: list[dict[str, Any]], history_sweep: list[dict[str, Any]]) -> str:
    table = _by(comparative)
    lines = [
        f"# Probe order (paper 001): the 4-way TPC-DS join at SF {setup['sf']:g}, arrivals replayed in random order",
        "",
        f"{setup['arrivals']} arrivals (seed {setup['seed']}), {setup['expected_rows']} result rows with checksum {setup['expected_checksum']} "
        "in every run, the same rows as Spark's without UMJoin (outputs compared as multisets: the testkit's order-independent checksum "
        "of every row, the sum of xxhash64's low 32 bits over its columns, each input's led by its NULL mask so that the hash tells "
        "where the NULLs are; computed in each replay's timed loop, the same work in every run); "
        f"stores: `{setup['backend']}`; T = {setup['T']} arrivals, L = {setup['L']} cycles; median of {setup['repetitions']} "
        f"replay(s) per cell; whole experiment {setup['minutes']} min. Command: `make bench-probe-order`.",
        "",
        "## Headline, measured beside the paper's",
        "",
        "| figure | measured | paper |",
        "|---|---:|---:|",
    ]
    lines += [f"| {key} | {summary[key]}{'%' if 'vs' in key else ''} | {PAPER[key]}{'%' if 'vs' in key else ''} |" for key in PAPER]
    lines += [f"| {key} (probes + matches) | {summary[key]}% | - |" for key in summary if "work" in key]
    policies = list(POLICIES)
    lines += ["", "## Time (s) per initial order and policy (Fig. 2 and 3)", "",
              "| initial order | " + " | ".join(policies) + " | dpPick routes at the end |",
              "|---|" + "---:|" * len(policies) + "---|"]
    for order, results in table.items():
        best = min(("fixedOrder", "selectivityFirst", "greedy_MSJ", "dpPick"), key=lambda p: results[p]["seconds"])
        cells = [f"**{results[p]['seconds']:.2f}**" if p == best else f"{results[p]['seconds']:.2f}" for p in policies]
        routes = "; ".join("".join(SHORT[t] for t in o) for o in results["dpPick"]["finalOrders"].values())
        lines.append(f"| {order} | " + " | ".join(cells) + f" | {routes} |")
    lines += ["", "## Probe work (probes + matches, millions) per initial order and policy", "",
              "| initial order | " + " | ".join(policies) + " | dpPick route changes |",
              "|---|" + "---:|" * len(policies) + "---:|"]
    for order, results in table.items():
        lines.append(f"| {order} | " + " | ".join(f"{results[p]['work'] / 1e6:.2f}" for p in policies) + f" | {results['dpPick']['routeChanges']} |")
    lines += ["", "## Period T (arrivals per cycle; Fig. 4)", "", "| initial order | T | fixedOrder (s) | dpPick (s) | dpPick cycles |", "|---|---:|---:|---:|---:|"]
    for fixed, dp in zip(period_sweep[0::2], period_sweep[1::2]):
        lines.append(f"| {dp['order']} | {dp['T']} | {fixed['seconds']:.2f} | {dp['seconds']:.2f} | {dp['cycles']} |")
    lines += ["", "## History length L (cycles forecast from; Fig. 5)", "", "| initial order | L | dpPick (s) |", "|---|---:|---:|"]
    lines += [f"| {r['order']} | {r['L']} | {r['seconds']:.2f} |" for r in history_sweep]
    return "\n".join(lines) + "\n"


def _plots(path: Path, comparative: list[dict[str, Any]], period_sweep: list[dict[str, Any]], history_sweep: list[dict[str, Any]]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install -e '.[bench]'): no plots", file=sys.stderr)
        return
    table = _by(comparative)
    orders = list(table)
    figure, axes = plt.subplots(2, 2, figsize=(18, 10))
    for ax, policies, title in (
            (axes[0][0], ("fixedOrder", "selectivityFirst", "greedy_MSJ", "dpPick"), "Policies (paper Fig. 2)"),
            (axes[0][1], ("fixedOrder", "dpPick", "dpPick_queryCost", "dpPick_matchCost", "dpPick_noSmooth"), "Ablations (paper Fig. 3)")):
        width = 0.8 / len(policies)
        for k, policy in enumerate(policies):
            ax.bar([i + k * width for i in range(len(orders))], [table[o][policy]["seconds"] for o in orders], width, label=policy)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(orders))], orders, rotation=70, fontsize=8)
        ax.set(ylabel="replay time (s)", title=title)
        ax.legend(fontsize=8)
    for ax, rows, key, title, label in ((axes[1][0], period_sweep, "T", "Period T (paper Fig. 4)", "T (arrivals per cycle)"),
                                        (axes[1][1], history_sweep, "L", "History length L (paper Fig. 5)", "L (cycles)")):
        for order in SWEEP_ORDERS:
            for policy in ("fixedOrder", "dpPick"):
                points = [r for r in rows if r["order"] == order and r["policy"] == policy]
                if points:
                    ax.plot([r[key] for r in points], [r["seconds"] for r in points], marker="o", label=f"{order}_{policy}")
        ax.set(xlabel=label, ylabel="replay time (s)", title=title, xscale="log")
        ax.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
