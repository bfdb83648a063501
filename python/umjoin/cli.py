"""The `umjoin` command."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from umjoin import tpch

__all__ = ["main"]


def _query_numbers(text: str) -> list[int]:
    numbers = [int(n) for n in text.split(",")] if text != "all" else list(tpch.QUERY_NUMBERS)
    bad = [n for n in numbers if n not in tpch.QUERY_NUMBERS]
    if bad:
        raise argparse.ArgumentTypeError(f"TPC-H has queries 1-22, not {bad}")
    return numbers


def _positive(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="umjoin", description="UMJoin for Spark: multi-way joins on Spark.")
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser("demo", help="run one TPC-H query with UMJoin off and on; print plans and answers")
    demo.add_argument("--query", type=int, default=5, choices=tpch.QUERY_NUMBERS, help="TPC-H query (default 5)")
    demo.add_argument("--sf", type=_positive, default=0.01, help="TPC-H scale factor (default 0.01)")

    bench = commands.add_parser("bench", help="time the TPC-H queries with UMJoin off and on")
    bench.add_argument("--sf", type=_positive, default=1.0, help="TPC-H scale factor (default 1)")
    bench.add_argument("--repetitions", type=int, default=3, help="measured runs per query and setting (default 3)")
    bench.add_argument("--queries", type=_query_numbers, default=list(tpch.QUERY_NUMBERS), help="e.g. 3,5,9 (default all)")
    bench.add_argument("--out", type=Path, default=Path("bench/results"), help="output directory")
    bench.add_argument("--driver-memory", default="6g", help="Spark driver memory (default 6g)")

    args = parser.parse_args(argv)
    from umjoin.local import local_builder  # Spark starts only once the arguments are valid

    if args.command == "demo":
        from umjoin.demo import run_demo

        spark = local_builder("umjoin-demo").getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        return 0 if run_demo(spark, args.query, args.sf) else 1
    if args.command == "bench":
        from umjoin.bench import run_bench

        spark = local_builder("umjoin-bench", shuffle_partitions=8, driver_memory=args.driver_memory).getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        run_bench(spark, args.sf, args.repetitions, args.out, args.queries)
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
