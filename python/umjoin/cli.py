"""The `umjoin` command: jar, tpch-report, plan-diff, demo. (The benchmarks run from a clone: `python -m bench`.)"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import sys
from pathlib import Path

from umjoin import jar_path, tpch
from umjoin.datadir import DATA_DIR_ENV
from umjoin.errors import UserError

__all__ = ["check_extra", "data_dir_parser", "main", "positive_number", "query_numbers", "whole_number", "whole_numbers"]


def query_numbers(text: str) -> list[int]:
    try:
        numbers = list(tpch.QUERY_NUMBERS) if text == "all" else [int(n) for n in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'all' or numbers like 3,5,9, got {text!r}") from None
    bad = [n for n in numbers if n not in tpch.QUERY_NUMBERS]
    if bad:
        raise argparse.ArgumentTypeError(f"TPC-H has queries 1-22, not {bad}")
    return numbers


def whole_number(text: str) -> int:
    """A whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text}")
    return value


def whole_numbers(text: str) -> list[int]:
    """Comma-separated whole numbers of at least 1, e.g. 500,2000,10000."""
    return [whole_number(part) for part in text.split(",")]


def positive_number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


#: The modules each optional-dependency group (pyproject.toml's extras) brings, and the commands that need it.
_REPORT_MODULES = ("duckdb", "duckdb_extension_tpch", "duckdb_extension_tpcds", "sqlglot", "jinja2")
EXTRA_MODULES = {"report": _REPORT_MODULES, "bench": (*_REPORT_MODULES, "matplotlib")}
COMMAND_EXTRA = {"tpch-report": "report", "plan-diff": "report", "demo": "report"}


def check_extra(command: str, extra: str | None = None) -> None:
    """Fails with the install command when ``command``'s extra is not installed (before Spark starts)."""
    extra = extra or COMMAND_EXTRA.get(command)
    missing = [m for m in EXTRA_MODULES.get(extra, ()) if importlib.util.find_spec(m) is None]
    if missing:
        raise UserError(f"this command needs {', '.join(missing)}, from the {extra!r} extra: "
                        f"pip install 'umjoin-spark[{extra}]'")


def data_dir_parser() -> argparse.ArgumentParser:
    """The --data-dir option every command that generates TPC-H or TPC-DS data takes."""
    data = argparse.ArgumentParser(add_help=False)
    data.add_argument("--data-dir", type=Path, metavar="DIR",
                      help=f"where generated data is kept (default ${DATA_DIR_ENV}, else ~/.cache/umjoin)")
    return data


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="umjoin", description="UMJoin for Spark: multi-way joins on Spark.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    data = data_dir_parser()

    commands.add_parser("jar", help="print the path of the UMJoin jar (for spark-submit --jars)")

    report = commands.add_parser("tpch-report", parents=[data],
                                 help="TPC-H conversion report: groups expected and found, answers, times")
    report.add_argument("--sf", type=positive_number, default=0.1, help="TPC-H scale factor (default 0.1)")
    report.add_argument("--out", type=Path, help="output directory (default reports/tpch, with --streaming reports/tpch-streaming)")
    report.add_argument("--queries", type=query_numbers, help="e.g. 3,5,9 (default all; with --streaming the paper's 11)")
    report.add_argument("--repetitions", type=int, default=3, help="timed runs per query and setting (default 3)")
    report.add_argument("--streaming", action="store_true",
                        help="the join blocks of the paper's queries as streams, UMJoin vs Spark's stream-stream joins "
                             "(writes streaming.html, streaming.md, streaming.json)")
    report.add_argument("--micro-batches", type=whole_number, help="with --streaming: micro-batches each table is read in (default 5)")

    diff = commands.add_parser("plan-diff", parents=[data], help="a query's plans with UMJoin off and on, converted groups highlighted")
    diff.add_argument("query", nargs="?", help="SQL text or a .sql file")
    diff.add_argument("--tpch", type=int, metavar="N", choices=tpch.QUERY_NUMBERS, help="TPC-H query N instead of QUERY")
    diff.add_argument("--data", type=Path, metavar="DIR", help="directory of Parquet tables, each a view named by its file")
    diff.add_argument("--tpch-sf", type=positive_number, metavar="X", help="TPC-H data at scale factor X (generated once)")
    diff.add_argument("--dialect", metavar="NAME", help="the query's SQL dialect (sqlglot name, e.g. postgres); transpiled to Spark SQL")
    diff.add_argument("--format", choices=("text", "json", "html"), default="text", help="output format (default text)")
    diff.add_argument("--layout", choices=("side-by-side", "unified"), default="side-by-side", help="text layout")
    diff.add_argument("--color", choices=("auto", "always", "never"), default="auto", help="colour (auto: on a terminal)")
    diff.add_argument("--no-execute", action="store_true", help="show the plans before execution (AQE may change them)")
    diff.add_argument("--out", type=Path, help="write to this file instead of standard output")

    demo = commands.add_parser("demo", parents=[data], help="one TPC-H query with UMJoin off and on: plans and answers")
    demo.add_argument("--query", type=int, default=5, choices=tpch.QUERY_NUMBERS, help="TPC-H query (default 5)")
    demo.add_argument("--sf", type=positive_number, default=0.01, help="TPC-H scale factor (default 0.01)")

    return parser


def _run(args: argparse.Namespace) -> int:
    if args.command == "jar":
        print(jar_path())
        return 0
    # Spark starts only once the arguments are known to be valid and the command's extra is installed.
    check_extra(args.command)
    if args.data_dir is not None:
        os.environ[DATA_DIR_ENV] = str(args.data_dir.resolve())
    from umjoin.local import local_builder

    if args.command == "plan-diff":
        from umjoin.plandiff import load_query, register_data, run_plan_diff

        sql = load_query(args.query, args.tpch, args.dialect)
        spark = local_builder("umjoin-plan-diff").getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        tpch_sf = args.tpch_sf if args.tpch_sf is not None or args.data is not None or args.tpch is None else 0.01
        register_data(spark, args.data, tpch_sf)
        color = args.color == "always" or (args.color == "auto" and args.out is None and sys.stdout.isatty())
        output = run_plan_diff(spark, sql, args.format, args.layout, color, execute=not args.no_execute)
        if args.out is None:
            print(output)
        else:
            args.out.write_text(output + "\n")
        return 0
    if args.command == "tpch-report" and args.streaming:
        from umjoin.stream_report import run_streaming_report
        from umjoin.streams import PAPER_QUERIES

        queries = args.queries or list(PAPER_QUERIES)
        unknown = [q for q in queries if q not in PAPER_QUERIES]
        if unknown:
            raise UserError(f"--streaming covers the join blocks of the paper's queries {', '.join(map(str, PAPER_QUERIES))}, not {unknown}")
        spark = local_builder("umjoin-tpch-report").getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        out = args.out or Path("reports/tpch-streaming")
        streaming = run_streaming_report(spark, args.sf, out, queries, args.micro_batches or 5)
        s = streaming["summary"]
        print(f"Report written to {out}/streaming.html, streaming.md, streaming.json: {s['converted_wholly']}/{s['queries']} join blocks "
              f"run as one StreamingUMJoin, {s['refused_by_spark']} refused by Spark, {s['umjoin_failed']} failed with UMJoin; answers equal "
              f"to batch: {s['answers_equal_batch']} (UMJoin), {s['spark_answers_equal_batch']} (Spark); state rows at the end: Spark "
              f"{s['state_rows_spark']}, UMJoin {s['state_rows_umjoin']}.")
        for q in streaming["queries"]:
            if q["umjoin"]["failed"]:
                print(f"umjoin tpch-report: Q{q['query']:02d} failed with UMJoin (Spark's own run did not): {q['umjoin']['failed']}", file=sys.stderr)
        # A UMJoin failure, or an answer of a block UMJoin ran that differs from the batch answer, fails the command.
        ran = [q for q in streaming["queries"] if not q["umjoin"]["refused"] and not q["umjoin"]["failed"]]
        return 0 if s["umjoin_failed"] == 0 and all(q["umjoin"]["answer_equals_batch"] for q in ran) else 1
    if args.command == "tpch-report":
        from umjoin.report import run_report

        if args.micro_batches is not None:
            raise UserError("--micro-batches applies to the streaming report only: add --streaming")
        # It measures which groups TSC recognizes; at its scale factors Spark broadcasts most tables.
        spark = local_builder("umjoin-tpch-report").config("spark.umjoin.convertBroadcastJoins", "true").getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        out = args.out or Path("reports/tpch")
        report = run_report(spark, args.sf, out, args.queries or list(tpch.QUERY_NUMBERS), args.repetitions)
        s = report["summary"]
        print(f"Report written to {out}/index.html, report.md, report.json: {s['queries_converted']}/{s['queries']} queries "
              f"converted, {s['matched_groups']}/{s['expected_groups']} expected groups matched, answers on = off "
              f"{s['answers_on_equal_off']}/{s['queries']}, official {s['answers_match_official']}/{s['queries']}.")
        return 0 if s["answers_on_equal_off"] == s["queries"] and "differs" not in {q["answers"]["official"] for q in report["queries"]} else 1
    if args.command == "demo":
        from umjoin.demo import run_demo

        # At the demo's scale factors Spark broadcasts every table.
        spark = local_builder("umjoin-demo").config("spark.umjoin.convertBroadcastJoins", "true").getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        return 0 if run_demo(spark, args.query, args.sf) else 1
    raise AssertionError(f"unknown command {args.command}")  # argparse accepts only the commands above


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    # PySpark logs every SQL error with its JVM stack trace; the CLI reports such errors in one line.
    for name in ("SQLQueryContextLogger", "DataFrameQueryContextLogger"):
        logging.getLogger(name).disabled = True
    try:
        return _run(args)
    except (UserError, FileNotFoundError) as e:
        print(f"umjoin {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
