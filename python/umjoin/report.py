"""`umjoin tpch-report`: which TPC-H joins TSC converts, whether the answers stay right, and how fast.

The paper (000, section 4.3, Table 3) checked only that plans were converted. For every query this
report also derives the multi-way joins to expect from the SQL alone (sqlglot), matches them with
the UMJoin nodes Spark actually ran, compares the answers three ways (UMJoin off, on, official),
and times the query off and on. Outputs: ``report.json`` (schema: ``report.schema.json`` in this
package), ``report.md`` and a self-contained ``index.html``.
"""

from __future__ import annotations

import datetime
import json
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import jinja2
from pyspark.sql import SparkSession

from umjoin import answers, joingraph, plans, tpch
from umjoin.local import temporary_conf
from umjoin.svgtree import tree_svg

__all__ = ["SCHEMA_PATH", "match_groups", "run_report"]

SCHEMA_PATH = Path(__file__).parent / "report.schema.json"
_TEMPLATES = jinja2.Environment(
    loader=jinja2.PackageLoader("umjoin", "templates"), autoescape=jinja2.select_autoescape(["html", "j2"])
)


class Progress:
    """A progress bar on stderr: redrawn in place on a terminal, one line per step otherwise."""

    def __init__(self, total: int, width: int = 30) -> None:
        self.total, self.width, self.done = total, width, 0
        self.terminal = sys.stderr.isatty()

    def step(self, label: str) -> None:
        filled = self.width * self.done // self.total
        bar = f"[{'#' * filled}{'.' * (self.width - filled)}] {self.done}/{self.total} {label}"
        print(("\r" + bar) if self.terminal else bar, end="" if self.terminal else "\n", file=sys.stderr, flush=True)
        self.done += 1

    def finish(self) -> None:
        self.done = self.total
        self.step("done")
        if self.terminal:
            print(file=sys.stderr)


def _tables(labels: list[str]) -> Counter[str]:
    """The base tables an input list reads: labels are table names joined by '+'."""
    return Counter(table for label in labels for table in label.split("+"))


def match_groups(expected: list[list[str]], found: list[list[str]]) -> list[tuple[int, int]]:
    """Pairs (expected index, found index): each expected group goes to a distinct UMJoin whose inputs
    read all its tables, the tightest such UMJoin first; larger expected groups choose first."""
    pairs = []
    free = set(range(len(found)))
    for e in sorted(range(len(expected)), key=lambda i: -len(expected[i])):
        need = Counter(expected[e])
        covering = [f for f in free if not need - _tables(found[f])]
        if covering:
            best = min(covering, key=lambda f: (sum(_tables(found[f]).values()), f))
            pairs.append((e, best))
            free.remove(best)
    return sorted(pairs)


def _timed_rows(spark: SparkSession, sql: str, enabled: str) -> tuple[float, list[tuple]]:  # type: ignore[type-arg]
    with temporary_conf(spark, {"spark.umjoin.enabled": enabled}):
        start = time.perf_counter()
        rows = [tuple(r) for r in spark.sql(sql).collect()]
        return time.perf_counter() - start, rows


def _query(spark: SparkSession, number: int, sf: float, schema: joingraph.Schema, repetitions: int, min_inputs: int) -> tuple[dict[str, Any], plans.PlanComparison]:
    sql = tpch.query_text(number)
    expected = joingraph.expected_groups(sql, schema, min_inputs)
    comparison = plans.compare(spark, sql, execute=True)
    umjoins = comparison.umjoins
    found = [node.labels for node in umjoins]
    matched = match_groups(expected, found)

    runs: dict[str, list[float]] = {"false": [], "true": []}
    rows: dict[str, list[tuple]] = {}  # type: ignore[type-arg]
    for _ in range(repetitions):
        for enabled in ("false", "true"):
            seconds, rows[enabled] = _timed_rows(spark, sql, enabled)
            runs[enabled].append(seconds)
    same = sorted(map(repr, rows["false"])) == sorted(map(repr, rows["true"]))
    official, problems = "unavailable", []
    if any(abs(sf - known) < 1e-9 for known in tpch.ANSWER_SCALE_FACTORS):
        columns, reference = tpch.official_answer(number, sf)
        problems = answers.compare(rows["true"], reference, answers.order_by_columns(sql, columns))
        official = "differs" if problems else "match"
    off, on = statistics.median(runs["false"]), statistics.median(runs["true"])
    result = {
        "query": number,
        "sql": sql,
        "expected_groups": expected,
        "umjoin_groups": [
            {
                "inputs": node.labels,
                "placements": [i.placement for i in node.inputs],
                "probe_order": list(node.probe_order),
            }
            for node in umjoins
        ],
        "matched_groups": [list(pair) for pair in matched],
        "accuracy": len(matched) / len(expected) if expected else None,
        "joins": {**comparison.join_counts, "replaced": [j.text for j in comparison.replaced_joins]},
        "answers": {"rows": len(rows["true"]), "on_equals_off": same, "official": official, "official_problems": problems},
        "time_s": {"off": off, "on": on, "on_off_ratio": on / off, "runs_off": runs["false"], "runs_on": runs["true"]},
        "plans": {"off": plans.render(comparison.off.physical), "on": plans.render(comparison.on.physical)},
    }
    return result, comparison


def _summary(results: list[dict[str, Any]]) -> dict[str, Any]:
    expected = sum(len(r["expected_groups"]) for r in results)
    matched = sum(len(r["matched_groups"]) for r in results)
    return {
        "queries": len(results),
        "queries_with_expected_groups": sum(1 for r in results if r["expected_groups"]),
        "queries_converted": sum(1 for r in results if r["umjoin_groups"]),
        "expected_groups": expected,
        "matched_groups": matched,
        "accuracy": matched / expected if expected else None,
        "answers_on_equal_off": sum(r["answers"]["on_equals_off"] for r in results),
        "answers_match_official": sum(r["answers"]["official"] == "match" for r in results),
        "total_time_off_s": sum(r["time_s"]["off"] for r in results),
        "total_time_on_s": sum(r["time_s"]["on"] for r in results),
    }


def _markdown(report: dict[str, Any]) -> str:
    s = report["summary"]
    accuracy = "-" if s["accuracy"] is None else f"{100 * s['accuracy']:.0f}%"
    broadcast_groups = ("Groups Spark would broadcast in every join are converted too "
                        "(`spark.umjoin.convertBroadcastJoins=true`)." if report["settings"]["convert_broadcast_joins"]
                        else "Groups Spark would broadcast in every join stay Spark's (UMJoin's default).")
    lines = [
        f"# TPC-H conversion report (scale factor {report['settings']['sf']:g})",
        "",
        f"{s['queries_converted']} of {s['queries']} queries run with UMJoin; expected multi-way joins matched: "
        f"{s['matched_groups']}/{s['expected_groups']} ({accuracy}). Answers equal with UMJoin off and on: "
        f"{s['answers_on_equal_off']}/{s['queries']}; equal to the official answers: {s['answers_match_official']}/{s['queries']}. "
        f"Total time off {s['total_time_off_s']:.1f}s, on {s['total_time_on_s']:.1f}s. {broadcast_groups}",
        "",
        "| query | expected groups (from SQL) | UMJoin groups (Spark plan) | accuracy | binary joins off -> on | on = off | official | off (s) | on (s) | on/off |",
        "|---|---|---|---:|---|---|---|---:|---:|---:|",
    ]
    for r in report["queries"]:
        expected = "; ".join(", ".join(g) for g in r["expected_groups"]) or "-"
        found = "; ".join(", ".join(g["inputs"]) for g in r["umjoin_groups"]) or "-"
        acc = "-" if r["accuracy"] is None else f"{100 * r['accuracy']:.0f}%"
        j = r["joins"]
        joins = f"{j['binary_joins_off']} -> {j['binary_joins_on']} + {j['umjoins_on']} UMJoin"
        lines.append(
            f"| Q{r['query']:02d} | {expected} | {found} | {acc} | {joins} | {'yes' if r['answers']['on_equals_off'] else 'NO'} | "
            f"{r['answers']['official']} | {r['time_s']['off']:.2f} | {r['time_s']['on']:.2f} | {r['time_s']['on_off_ratio']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def _html(report: dict[str, Any], comparisons: dict[int, plans.PlanComparison]) -> str:
    drawings = {}
    for number, comparison in comparisons.items():
        replaced = {id(j) for j in comparison.replaced_joins}
        drawings[number] = {
            "off": tree_svg(comparison.off.physical, lambda n: "replaced" if id(n) in replaced else None),
            "on": tree_svg(comparison.on.physical, lambda n: "umjoin" if n.name == "UMJoinExec" else None),
        }
    return _TEMPLATES.get_template("report.html.j2").render(report=report, drawings=drawings)


def run_report(spark: SparkSession, sf: float, out: Path, queries: list[int], repetitions: int = 3) -> dict[str, Any]:
    """Runs the report over ``queries`` at scale factor ``sf`` and writes it to ``out`` (`umjoin tpch-report` runs
    it with `spark.umjoin.convertBroadcastJoins=true`: it measures which groups TSC recognizes, and at its small
    scale factors Spark broadcasts most tables)."""
    tpch.register(spark, tpch.generate(sf))
    schema = tpch.schema()
    setting = str(spark.conf.get("spark.umjoin.minInputs", "auto")).strip()
    min_inputs = 3 if setting.lower() == "auto" else int(setting)  # (auto: 3 in batch; 2 only for streams joined without an equi-key)
    progress = Progress(len(queries))
    results, comparisons = [], {}
    for number in queries:
        progress.step(f"Q{number:02d}")
        result, comparisons[number] = _query(spark, number, sf, schema, repetitions, min_inputs)
        results.append(result)
    progress.finish()
    report = {
        "schema_version": 1,
        "generated": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "settings": {"sf": sf, "repetitions": repetitions, "min_inputs": min_inputs,
                     "convert_broadcast_joins": plans.converts_broadcast_joins(spark),
                     "spark": spark.version,
                     "adaptive": spark.conf.get("spark.sql.adaptive.enabled")},
        "summary": _summary(results),
        "queries": results,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "report.md").write_text(_markdown(report))
    (out / "index.html").write_text(_html(report, comparisons))
    return report
