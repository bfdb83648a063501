"""`python -m bench tpch|memory|streaming|static|psp|probe-order|planning`: the benchmarks (run from the repository's root)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from bench.streaming import TPCH_BLOCKS, WORKLOADS
from umjoin import tpch
from umjoin.cli import check_extra, data_dir_parser, positive_number, query_numbers, whole_number, whole_numbers
from umjoin.datadir import DATA_DIR_ENV
from umjoin.errors import UserError

RESULTS = Path("bench/results")


def _thresholds(text: str) -> list[str]:
    from bench.tpch import THRESHOLDS

    names = text.split(",")
    unknown = [n for n in names if n not in THRESHOLDS]
    if unknown:
        raise argparse.ArgumentTypeError(f"broadcast thresholds are {', '.join(THRESHOLDS)}, not {', '.join(unknown)}")
    return names


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench", description="UMJoin's benchmarks: measured figures side by side.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="BENCHMARK")
    data = data_dir_parser()

    bench = commands.add_parser("tpch", parents=[data], help="time the TPC-H queries with UMJoin off and on")
    bench.add_argument("--sf", type=positive_number, default=1.0, help="TPC-H scale factor (default 1)")
    bench.add_argument("--repetitions", type=int, default=5, help="measured runs per query and setting (default 5)")
    bench.add_argument("--queries", type=query_numbers, default=list(tpch.QUERY_NUMBERS), help="e.g. 3,5,9 (default all)")
    bench.add_argument("--out", type=Path, default=RESULTS, help="output directory")
    bench.add_argument("--driver-memory", default="6g", help="Spark driver memory (default 6g)")
    bench.add_argument("--thresholds", type=_thresholds, default=None,
                       help="broadcast thresholds measured, comma-separated: default (Spark's) and 1MB (when omitted: default,1MB)")

    memory = commands.add_parser("memory", parents=[data], help="the paper's memory experiment: TPC-DS 4-way join, backends, memory sweeps")
    memory.add_argument("--sf", type=positive_number, default=1.0, help="TPC-DS scale factor (default 1)")
    memory.add_argument("--repetitions", type=int, default=2, help="measured runs per setting (default 2)")
    memory.add_argument("--out", type=Path, default=RESULTS, help="output directory")

    streaming = commands.add_parser("streaming", parents=[data], help="joins as streams, UMJoin vs Spark's stream-stream joins: "
                                    "the 4-way TPC-DS join, TPC-H join blocks, enrichment chains (with Flink)")
    streaming.add_argument("--sf", type=positive_number, default=1.0, help="TPC-DS and TPC-H scale factor (default 1)")
    streaming.add_argument("--batches", type=whole_number, default=20, help="micro-batches the streams are cut into (default 20)")
    streaming.add_argument("--workload", choices=("all", *WORKLOADS), default="all",
                           help="tpcds: the paper's 4-way join; tpch: the join blocks of Q3, Q5, Q9, Q10; enrichment: orders LEFT JOIN "
                           "5 and 10 side streams, with Flink 2.3's MultiJoin beside where PyFlink is installed (default all)")
    streaming.add_argument("--blocks", type=query_numbers, default=list(TPCH_BLOCKS), help="the TPC-H join blocks of --workload tpch, "
                           f"e.g. 3,10 (default {','.join(map(str, TPCH_BLOCKS))})")
    streaming.add_argument("--conf", type=_setting, action="append", default=[], metavar="KEY=VALUE",
                           help="a session setting for the UMJoin runs, e.g. spark.umjoin.stateCacheRows=0 (repeatable)")
    streaming.add_argument("--repetitions", type=whole_number, default=3,
                           help="runs of the TPC-DS join and of each TPC-H block per configuration, turning their order (default 3)")
    streaming.add_argument("--out", type=Path, default=RESULTS, help="output directory")

    static = commands.add_parser("static", parents=[data], help="paper 003's setting: a stream of orders joined with customer "
                                 "and nation as static tables, Spark vs UMJoin by default and storing customer with each cache mode, "
                                 "Zipf skew 0, 0.5, 1")
    static.add_argument("--sf", type=positive_number, default=1.0, help="TPC-H scale factor (default 1)")
    static.add_argument("--batches", type=whole_number, default=20, help="micro-batches the orders are cut into (default 20)")
    static.add_argument("--repetitions", type=whole_number, default=3, help="runs per skew and configuration, rotating their order (default 3)")
    static.add_argument("--out", type=Path, default=RESULTS, help="output directory")

    psp = commands.add_parser("psp", parents=[data], help="paper 004's setting: a 3-way window join without an equi-join key "
                              "(a similarity UDF), UMJoin with 1, 2, 4, 8 time slices against a foreachBatch that joins by hand; then two streams, "
                              "Spark's join keyed by the slice against a StreamingUMJoin")
    psp.add_argument("--rows", type=whole_number, default=1200, help="rows per stream (default 1200)")
    psp.add_argument("--per-second", type=whole_number, default=2, help="rows per second of event time (default 2)")
    psp.add_argument("--batches", type=whole_number, default=20, help="micro-batches the streams are cut into (default 20)")
    psp.add_argument("--dim", type=whole_number, default=256, help="floats per row's vector (default 256)")
    psp.add_argument("--out", type=Path, default=RESULTS, help="output directory")

    order = commands.add_parser("probe-order", parents=[data], help="paper 001's probe-order experiments: 24 initial orders x policies, T and L sweeps")
    order.add_argument("--sf", type=positive_number, default=1.0, help="TPC-DS scale factor (default 1)")
    order.add_argument("--backend", choices=("memory", "rocksdb"), default="memory", help="the stores (default memory)")
    order.add_argument("--cycle-rows", type=whole_number, default=2000, help="T: arrivals per statistics cycle (default 2000)")
    order.add_argument("--history", type=whole_number, default=20, help="L: cycles the forecast reads (default 20)")
    order.add_argument("--periods", type=whole_numbers, default=[500, 2000, 10000, 50000], help="T values swept")
    order.add_argument("--histories", type=whole_numbers, default=[1, 5, 20, 100], help="L values swept")
    order.add_argument("--repetitions", type=whole_number, default=1, help="replays per cell; the median is reported (default 1)")
    order.add_argument("--out", type=Path, default=RESULTS, help="output directory")
    planning = commands.add_parser("planning", help="planning per micro-batch: a 3-stream INNER and a 6-stream LEFT chain, "
                                   "UMJoin against Spark's stream-stream joins (default store; RocksDB with join state format 4)")
    planning.add_argument("--batches", type=whole_number, default=12, help="micro-batches of 50 rows per stream (default 12)")
    planning.add_argument("--repetitions", type=whole_number, default=3, help="runs per chain and setting, alternating (default 3)")
    planning.add_argument("--out", type=Path, default=RESULTS, help="output directory")
    planning.add_argument("--baseline-jar", type=Path, help="also run UMJoin (RocksDB) from this jar of the shim, e.g. an earlier commit's")
    planning.add_argument("--baseline-name", default="baseline", help="what the baseline jar is, for the result's table")
    return parser


def _setting(text: str) -> tuple[str, str]:
    key, equals, value = text.partition("=")
    if not equals or not key.startswith("spark."):
        raise argparse.ArgumentTypeError(f"a setting is KEY=VALUE with a spark.* key, not {text!r}")
    return key, value


def _run(args: argparse.Namespace) -> None:
    check_extra(args.command, "bench")
    if getattr(args, "data_dir", None) is not None:  # (benchmarks that read no TPC data have none)
        os.environ[DATA_DIR_ENV] = str(args.data_dir.resolve())  # also for the benchmarks' worker processes
    from umjoin.local import local_builder

    if args.command == "streaming":
        from bench.streaming import run_streaming_bench

        run_streaming_bench(args.sf, args.batches, args.out, WORKLOADS if args.workload == "all" else (args.workload,),
                            tuple(args.blocks), dict(args.conf), args.repetitions)
    elif args.command == "static":
        from bench.static import run_static_bench

        run_static_bench(args.sf, args.batches, args.repetitions, args.out)
    elif args.command == "psp":
        from bench.psp import run_pair_bench, run_psp_bench

        run_psp_bench(args.out, args.rows, args.per_second, args.batches, args.dim)
        run_pair_bench(args.out, args.batches, args.dim)
    elif args.command == "planning":
        from bench.planning import run_planning_bench

        baseline = (args.baseline_jar, args.baseline_name) if args.baseline_jar else None
        run_planning_bench(args.out, args.batches, args.repetitions, baseline)
    elif args.command == "probe-order":
        from bench.probe_order import run_probe_order_bench

        from bench import with_testkit

        spark = with_testkit(local_builder("umjoin-bench-probe-order", shuffle_partitions=2, driver_memory="6g")).getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        run_probe_order_bench(spark, args.sf, args.out, args.backend, args.cycle_rows, args.history, args.periods,
                              args.histories, args.repetitions)
    elif args.command == "memory":
        from bench.memory import run_memory_bench

        run_memory_bench(args.sf, args.out, args.repetitions)
    else:
        from bench.tpch import run_bench

        spark = local_builder("umjoin-bench", shuffle_partitions=8, driver_memory=args.driver_memory).getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        run_bench(spark, args.sf, args.repetitions, args.out, args.queries, args.thresholds)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        _run(args)
    except (UserError, FileNotFoundError) as e:
        print(f"python -m bench {args.command}: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
