"""`umjoin tpch-report --streaming`: paper 000's Table 3 for streams.

The join block of each of the paper's TPC-H queries (``umjoin.streams.join_block``) runs as a
Structured Streaming query over file streams, once with Spark's own stream-stream joins and once with
UMJoin. Per query: the StreamingUMJoin groups, the stream-stream joins Spark plans and those left with
UMJoin on, the state rows and bytes at the end both ways, and whether each answer equals the block
run as a batch query with UMJoin off. A block is *refused by Spark* where both runs raise the same
error; an error of the UMJoin run alone is a *failure*. Outputs ``streaming.json`` (schema:
``stream_report.schema.json``), ``streaming.md`` and ``streaming.html``.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import re
import tempfile
import time
from pathlib import Path
from typing import Any

import jinja2
from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession

from umjoin import streams, tpch
from umjoin.local import temporary_conf
from umjoin.report import Progress

__all__ = ["SCHEMA_PATH", "run_streaming_report"]

SCHEMA_PATH = Path(__file__).parent / "stream_report.schema.json"
SCHEMA_VERSION = 2  # 2: a run's "failed", the summary's "umjoin_failed", settings' "umjoin_settings"; a run that raised has no figures
_TEMPLATES = jinja2.Environment(
    loader=jinja2.PackageLoader("umjoin", "templates"), autoescape=jinja2.select_autoescape(["html", "j2"])
)
_UMJOIN_OFF = {"spark.umjoin.enabled": "false"}
_UUID = re.compile(r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b")
_EXPRESSION_ID = re.compile(r"#\d+L?\b")


@dataclasses.dataclass(frozen=True)
class _Error:
    """An error a streaming run raised: its message's first line (as reported) and its ``signature``,
    the line with what differs between two runs of one block made neutral (see ``_refused_by_spark``)."""

    line: str
    signature: str


def _error(e: Exception, name: str, checkpoint: str) -> _Error:
    """The error ``e`` of the run named ``name`` with ``checkpoint``."""
    # A JVM exception PySpark does not convert comes as a Py4JJavaError, whose message starts "An error
    # occurred while calling o123.start.": the JVM exception's own "class: message" says what it is.
    lines = str(e.java_exception.toString() if isinstance(e, Py4JJavaError) else e).strip().splitlines()
    line = lines[0].strip() if lines else type(e).__name__
    condition = e.getCondition() if isinstance(e, PySparkException) else None
    neutral = _EXPRESSION_ID.sub("#", _UUID.sub("<uuid>", line.replace(checkpoint, "<checkpoint>").replace(name, "<query>")))
    return _Error(line[:400], f"{type(e).__name__}|{condition}|{neutral}")


def _refused_by_spark(spark: _Error | None, umjoin: _Error) -> bool:
    """Whether UMJoin's run's error ``umjoin`` is Spark's refusal of the block, not UMJoin's failure.

    It is when Spark's run (UMJoin off) raised the same error: the same exception class (the JVM
    exception PySpark captured), the same error condition (Spark's error class, ``getCondition()``, e.g.
    ``STREAMING_OUTPUT_MODE.UNSUPPORTED_OPERATION``; none for a plain JVM exception) and the same first
    line of the message once what differs between two runs of one block is made neutral: the run's
    query name and checkpoint directory, UUIDs (query and run ids) and expression ids (``#123``). The
    lines below the first (stack traces, causes) are not compared: they name the code that threw, which
    is not the same with UMJoin on. Anything else that differs makes the errors different, so an error
    that is not exactly Spark's is a failure. So is one naming a ``spark.umjoin.*`` setting, even if
    Spark's run raised it too: the extension reads its settings with UMJoin off as well.
    """
    return spark is not None and spark.signature == umjoin.signature and "spark.umjoin." not in umjoin.line


def _same_rows(a: DataFrame, b: DataFrame) -> bool:
    """Whether ``a`` and ``b`` hold the same rows as multisets (each row as often in both)."""
    return a.count() == b.count() and a.exceptAll(b).count() == 0 and b.exceptAll(a).count() == 0


def _run(session: SparkSession, sql: str, name: str, settings: dict[str, str]) -> dict[str, Any] | _Error:
    """One streaming run of a block to its end with ``settings``: what was planned, the state at the end
    (the answer, table ``name``, is compared by ``_block``); or the error it raised."""
    with tempfile.TemporaryDirectory(prefix="umjoin-stream-report-") as checkpoint, temporary_conf(session, settings):
        start = time.perf_counter()
        try:
            query = (session.sql(sql).writeStream.format("memory").queryName(name).option("checkpointLocation", checkpoint)
                     .trigger(availableNow=True).start())
            query.awaitTermination()
        except Exception as e:  # Spark refuses some blocks as streams; _block tells a refusal from a failure
            # A query still running writes into its checkpoint, which goes when this returns: stopped first
            # (its thread joined). Seen once: a failing run's source wrote its offsets while the directory went.
            for active in session.streams.active:
                if active.name == name:
                    active.stop()
            return _error(e, name, checkpoint)
        seconds = time.perf_counter() - start
        plan = query._jsq.streamingQuery().lastExecution().executedPlan().toString()
        progress = query.recentProgress
        last = progress[-1]["stateOperators"] if progress else []
        umjoins = [line.strip() for line in plan.splitlines() if "StreamingUMJoin inputs=" in line]
        return {
            "refused": None,
            "failed": None,
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
        }


def _ran(run: dict[str, Any]) -> bool:
    return not run["refused"] and not run["failed"]


def _block(spark: SparkSession, streaming: SparkSession, number: int, umjoin_settings: dict[str, str]) -> dict[str, Any]:
    sql = streams.join_block(number)
    names = {"spark": f"stream_report_q{number}_off", "umjoin": f"stream_report_q{number}_on"}
    # Spark's run first: an error of UMJoin's run is Spark's refusal only if Spark's run raised it too.
    off_run = _run(streaming, sql, names["spark"], _UMJOIN_OFF)
    on_run = _run(streaming, sql, names["umjoin"], {**umjoin_settings, "spark.umjoin.enabled": "true"})
    off = {"refused": off_run.line, "failed": None} if isinstance(off_run, _Error) else off_run
    if isinstance(on_run, _Error):
        refused = _refused_by_spark(off_run if isinstance(off_run, _Error) else None, on_run)
        on = {"refused": on_run.line if refused else None, "failed": None if refused else on_run.line}
    else:
        on = on_run
    runs = {"umjoin": on, "spark": off}
    if any(_ran(run) for run in runs.values()):
        # The reference answer is Spark's own: the batch join and both comparisons are planned with
        # UMJoin off in either session (the comparisons read the cached answer, or else join again).
        with temporary_conf(spark, _UMJOIN_OFF), temporary_conf(streaming, _UMJOIN_OFF):
            batch = spark.sql(sql).persist()
            try:
                batch.count()  # (materialised here, while UMJoin is off)
                for side, run in runs.items():
                    if _ran(run):
                        run["answer_equals_batch"] = _same_rows(streaming.table(names[side]), batch)
            finally:
                batch.unpersist()
    ratio = off["state_rows"] / on["state_rows"] if _ran(on) and _ran(off) and on["state_rows"] else None
    return {"query": number, "sql": sql, "umjoin": on, "spark": off, "state_rows_spark_over_umjoin": ratio}


def _summary(results: list[dict[str, Any]]) -> dict[str, Any]:
    ran = [r for r in results if _ran(r["umjoin"])]
    return {
        "queries": len(results),
        "refused_by_spark": sum(1 for r in results if r["umjoin"]["refused"]),
        "umjoin_failed": sum(1 for r in results if r["umjoin"]["failed"]),
        "converted_wholly": sum(1 for r in ran if len(r["umjoin"]["umjoin_groups"]) == 1 and r["umjoin"]["stream_stream_joins"] == 0),
        "answers_equal_batch": sum(1 for r in ran if r["umjoin"]["answer_equals_batch"]),
        "spark_answers_equal_batch": sum(1 for r in results if _ran(r["spark"]) and r["spark"]["answer_equals_batch"]),
        "state_rows_umjoin": sum(r["umjoin"]["state_rows"] for r in ran if _ran(r["spark"])),
        "state_rows_spark": sum(r["spark"]["state_rows"] for r in ran if _ran(r["spark"])),
    }


def _cell(text: str) -> str:
    """An error message as a Markdown table cell: cut short, its pipes escaped."""
    return text[:160].replace("|", "\\|")


def _markdown(report: dict[str, Any]) -> str:
    s, settings = report["summary"], report["settings"]
    lines = [
        f"# TPC-H join blocks as streams (scale factor {settings['sf']:g}, {settings['micro_batches']} micro-batches per table)",
        "",
        f"Paper 000's Table 3 for Structured Streaming: {s['converted_wholly']} of {s['queries']} join blocks run as one StreamingUMJoin "
        f"with no stream-stream join of Spark's left; {s['refused_by_spark']} refused by Spark itself as streams; UMJoin failed on "
        f"{s['umjoin_failed']} (an error Spark's own run did not raise). Answers equal to the batch answer: UMJoin "
        f"{s['answers_equal_batch']}, Spark {s['spark_answers_equal_batch']}. State rows at the end, all blocks Spark and UMJoin both "
        f"ran: Spark {s['state_rows_spark']}, UMJoin {s['state_rows_umjoin']}.",
        "",
        "| query | StreamingUMJoin groups (inputs) | Spark's stream-stream joins: off -> on | state rows at end: Spark / UMJoin (ratio) | UMJoin index entries | answer = batch: UMJoin / Spark | time (s): Spark / UMJoin |",
        "|---|---|---|---|---:|---|---|",
    ]
    for r in report["queries"]:
        on, off = r["umjoin"], r["spark"]
        if on["refused"]:
            lines.append(f"| Q{r['query']:02d} | refused by Spark: {_cell(on['refused'])} | - | - | - | - | - |")
            continue
        spark_joins = "refused" if off["refused"] else str(off["stream_stream_joins"])
        spark_state = "-" if off["refused"] else str(off["state_rows"])
        spark_answer = "-" if off["refused"] else ("yes" if off["answer_equals_batch"] else "NO")
        spark_time = "-" if off["refused"] else f"{off['seconds']:.1f}"
        if on["failed"]:
            lines.append(f"| Q{r['query']:02d} | **UMJoin failed**: {_cell(on['failed'])} | {spark_joins} -> - | {spark_state} / - (-) | - | "
                         f"FAILED / {spark_answer} | {spark_time} / - |")
            continue
        groups = "; ".join(", ".join(g) for g in on["umjoin_groups"]) or "-"
        ratio = "-" if r["state_rows_spark_over_umjoin"] is None else f"{r['state_rows_spark_over_umjoin']:.2f}"
        lines.append(f"| Q{r['query']:02d} | {groups} | {spark_joins} -> {on['stream_stream_joins']} | {spark_state} / {on['state_rows']} ({ratio}) | {on['state_index_entries']} | "
                     f"{'yes' if on['answer_equals_batch'] else 'NO'} / {spark_answer} | {spark_time} / {on['seconds']:.1f} |")
    return "\n".join(lines) + "\n"


def run_streaming_report(spark: SparkSession, sf: float, out: Path, queries: list[int], micro_batches: int = 5,
                         umjoin_settings: dict[str, str] | None = None) -> dict[str, Any]:
    """Runs every block of ``queries`` (of the paper's) as streams at ``sf`` and writes the report to ``out``.

    ``umjoin_settings`` (e.g. ``{"spark.umjoin.probeOrder": "dpPick"}``) are set for UMJoin's runs
    only: Spark's runs and the batch answers run with UMJoin off, and without them, since the extension
    reads its settings even when off (an invalid value would fail them too).
    """
    umjoin_settings = dict(umjoin_settings or {})
    if "spark.umjoin.enabled" in umjoin_settings:
        raise ValueError("umjoin_settings: spark.umjoin.enabled is the report's to set (on for UMJoin's runs, off for Spark's)")
    source = tpch.generate(sf)
    tpch.register(spark, source)
    streaming = spark.newSession()  # its own temporary views: the tables as streams
    streams.read_streams(streaming, streams.tpch_streams(sf, micro_batches), tpch.TABLES, source)
    progress = Progress(len(queries))
    results = []
    for number in queries:
        progress.step(f"Q{number:02d}")
        results.append(_block(spark, streaming, number, umjoin_settings))
    progress.finish()
    report = {
        "schema_version": SCHEMA_VERSION,
        "generated": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "settings": {"sf": sf, "micro_batches": micro_batches, "spark": spark.version,
                     "state_store": spark.conf.get("spark.sql.streaming.stateStore.providerClass"),
                     "state_partitions": int(spark.conf.get("spark.sql.shuffle.partitions")), "umjoin_settings": umjoin_settings},
        "summary": _summary(results),
        "queries": results,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "streaming.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "streaming.md").write_text(_markdown(report))
    (out / "streaming.html").write_text(_TEMPLATES.get_template("stream_report.html.j2").render(report=report))
    return report
