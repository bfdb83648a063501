"""`umjoin tpch-report --streaming`: paper 000's Table 3 for streams.

The join block of each of the paper's TPC-H queries (``umjoin.streams.join_block``) runs as a
Structured Streaming query over file streams, once with UMJoin and once with Spark's own
stream-stream joins. Per query: the StreamingUMJoin groups, the stream-stream joins Spark plans and
those left with UMJoin on, the state rows and bytes at the end both ways, and whether each answer
equals the block run as a batch query. Outputs ``streaming.json`` (schema:
``stream_report.schema.json``), ``streaming.md`` and ``streaming.html``.
"""

from __future__ import annotations

import datetime
import json
import re
import tempfile
import time
from pathlib import Path
from typing import Any

import jinja2
from pyspark.sql import DataFrame, SparkSession

from umjoin import streams, tpch
from umjoin.local import temporary_conf
from umjoin.report import Progress

__all__ = ["SCHEMA_PATH", "run_streaming_report"]

SCHEMA_PATH = Path(__file__).parent / "stream_report.schema.json"
_TEMPLATES = jinja2.Environment(
    loader=jinja2.PackageLoader("umjoin", "templates"), autoescape=jinja2.select_autoescape(["html", "j2"])
)


def _same_rows(a: DataFrame, b: DataFrame) -> bool:
    return a.count() == b.count() and a.exceptAll(b).count() == 0 and b.exceptAll(a).count() == 0


def _run(session: SparkSession, sql: str, name: str, umjoin: bool, batch: DataFrame) -> dict[str, Any]:
    """One streaming run of a block to its end: what was planned, the state at the end, the answer."""
    with tempfile.TemporaryDirectory(prefix="umjoin-stream-report-") as checkpoint, temporary_conf(session, {"spark.umjoin.enabled": str(umjoin).lower()}):
        start = time.perf_counter()
        try:
            query = (session.sql(sql).writeStream.format("memory").queryName(name).option("checkpointLocation", checkpoint)
                     .trigger(availableNow=True).start())
            query.awaitTermination()
        except Exception as e:  # Spark refuses some blocks as streams; say why
            return {"refused": str(e).strip().splitlines()[0][:400]}
        seconds = time.perf_counter() - start
        plan = query._jsq.streamingQuery().lastExecution().executedPlan().toString()
        progress = query.recentProgress
        last = progress[-1]["stateOperators"] if progress else []
        umjoins = [line.strip() for line in plan.splitlines() if "StreamingUMJoin inputs=" in line]
        return {
            "refused": None,
            "seconds": seconds,
            "micro_batches": sum(1 for p in progress if p["numInputRows"] > 0),
            "stream_stream_joins": plan.count("StreamingSymmetricHashJoin"),
            "umjoin_groups": [re.findall(r"#\d+ ([^ ]+) \(", line.split("inputs=[", 1)[1].split("], keys=", 1)[0]) for line in umjoins],
            "umjoin_plans": umjoins,
            "state_rows": sum(op["numRowsTotal"] for op in last),
            "state_index_entries": sum(v for op in last for k, v in op["customMetrics"].items() if k.startswith("stateIndexEntriesInput")),
            "state_bytes": sum(op["memoryUsedBytes"] for op in last),
            "state_rows_over_time": [sum(op["numRowsTotal"] for op in p["stateOperators"]) for p in progress],
            "output_rows": session.table(name).count(),
            "answer_equals_batch": _same_rows(session.table(name), batch),
        }


def _block(spark: SparkSession, streaming: SparkSession, number: int) -> dict[str, Any]:
    sql = streams.join_block(number)
    batch = spark.sql(sql)
    on = _run(streaming, sql, f"stream_report_q{number}_on", True, batch)
    off = _run(streaming, sql, f"stream_report_q{number}_off", False, batch)
    ratio = off["state_rows"] / on["state_rows"] if not on["refused"] and not off["refused"] and on["state_rows"] else None
    return {"query": number, "sql": sql, "umjoin": on, "spark": off, "state_rows_spark_over_umjoin": ratio}


def _summary(results: list[dict[str, Any]]) -> dict[str, Any]:
    ran = [r for r in results if not r["umjoin"]["refused"]]
    return {
        "queries": len(results),
        "refused_by_spark": sum(1 for r in results if r["umjoin"]["refused"]),
        "converted_wholly": sum(1 for r in ran if len(r["umjoin"]["umjoin_groups"]) == 1 and r["umjoin"]["stream_stream_joins"] == 0),
        "answers_equal_batch": sum(1 for r in ran if r["umjoin"]["answer_equals_batch"]),
        "spark_answers_equal_batch": sum(1 for r in results if not r["spark"]["refused"] and r["spark"]["answer_equals_batch"]),
        "state_rows_umjoin": sum(r["umjoin"]["state_rows"] for r in ran if not r["spark"]["refused"]),
        "state_rows_spark": sum(r["spark"]["state_rows"] for r in ran if not r["spark"]["refused"]),
    }


def _markdown(report: dict[str, Any]) -> str:
    s, settings = report["summary"], report["settings"]
    lines = [
        f"# TPC-H join blocks as streams (scale factor {settings['sf']:g}, {settings['micro_batches']} micro-batches per table)",
        "",
        f"Paper 000's Table 3 for Structured Streaming: {s['converted_wholly']} of {s['queries']} join blocks run as one StreamingUMJoin "
        f"with no stream-stream join of Spark's left; {s['refused_by_spark']} refused by Spark itself as streams. Answers equal to the "
        f"batch answer: UMJoin {s['answers_equal_batch']}, Spark {s['spark_answers_equal_batch']}. State rows at the end, all blocks "
        f"Spark and UMJoin both ran: Spark {s['state_rows_spark']}, UMJoin {s['state_rows_umjoin']}.",
        "",
        "| query | StreamingUMJoin groups (inputs) | Spark's stream-stream joins: off -> on | state rows at end: Spark / UMJoin (ratio) | UMJoin index entries | answer = batch: UMJoin / Spark | time (s): Spark / UMJoin |",
        "|---|---|---|---|---:|---|---|",
    ]
    for r in report["queries"]:
        on, off = r["umjoin"], r["spark"]
        if on["refused"]:
            lines.append(f"| Q{r['query']:02d} | refused by Spark: {on['refused'][:160]} | - | - | - | - | - |")
            continue
        groups = "; ".join(", ".join(g) for g in on["umjoin_groups"]) or "-"
        ratio = "-" if r["state_rows_spark_over_umjoin"] is None else f"{r['state_rows_spark_over_umjoin']:.2f}"
        spark_joins = "refused" if off["refused"] else str(off["stream_stream_joins"])
        spark_state = "-" if off["refused"] else str(off["state_rows"])
        spark_answer = "-" if off["refused"] else ("yes" if off["answer_equals_batch"] else "NO")
        spark_time = "-" if off["refused"] else f"{off['seconds']:.1f}"
        lines.append(f"| Q{r['query']:02d} | {groups} | {spark_joins} -> {on['stream_stream_joins']} | {spark_state} / {on['state_rows']} ({ratio}) | {on['state_index_entries']} | "
                     f"{'yes' if on['answer_equals_batch'] else 'NO'} / {spark_answer} | {spark_time} / {on['seconds']:.1f} |")
    return "\n".join(lines) + "\n"


def run_streaming_report(spark: SparkSession, sf: float, out: Path, queries: list[int], micro_batches: int = 5) -> dict[str, Any]:
    """Runs every block of ``queries`` (of the paper's) as streams at ``sf`` and writes the report to ``out``."""
    source = tpch.generate(sf)
    tpch.register(spark, source)
    streaming = spark.newSession()  # its own temporary views: the tables as streams
    streams.read_streams(streaming, streams.tpch_streams(sf, micro_batches), tpch.TABLES, source)
    progress = Progress(len(queries))
    results = []
    for number in queries:
        progress.step(f"Q{number:02d}")
        results.append(_block(spark, streaming, number))
    progress.finish()
    report = {
        "schema_version": 1,
        "generated": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "settings": {"sf": sf, "micro_batches": micro_batches, "spark": spark.version,
                     "state_store": spark.conf.get("spark.sql.streaming.stateStore.providerClass"),
                     "state_partitions": int(spark.conf.get("spark.sql.shuffle.partitions"))},
        "summary": _summary(results),
        "queries": results,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "streaming.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "streaming.md").write_text(_markdown(report))
    (out / "streaming.html").write_text(_TEMPLATES.get_template("stream_report.html.j2").render(report=report))
    return report
