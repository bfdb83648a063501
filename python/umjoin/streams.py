"""Tables as streams: each table's rows in a seeded random order, cut into Parquet files that a
file source reads one per micro-batch; and the join blocks of the paper's TPC-H queries.

Paper 000's Table 3 converts the multi-way joins of 11 TPC-H queries in streaming SQL. A query's
*join block* is its largest SELECT scope as a join alone: ``SELECT *`` over the scope's tables with
its join and filter predicates, predicates with subqueries dropped (and no grouping or ordering).
"""

from __future__ import annotations

import os
from pathlib import Path

import duckdb
import sqlglot
from pyspark.sql import SparkSession
from sqlglot import exp
from sqlglot.optimizer.scope import traverse_scope

from umjoin import tpch
from umjoin.datadir import generating

__all__ = ["PAPER_QUERIES", "cut_into_streams", "join_block", "read_streams", "split_into_batches", "tpch_streams"]

#: The TPC-H queries of paper 000's Table 3.
PAPER_QUERIES = (2, 3, 5, 7, 8, 9, 10, 11, 15, 18, 21)
_COMPLETE = "_COMPLETE"


def join_block(number: int) -> str:
    """The join block of TPC-H query ``number`` as Spark SQL (see the module's description)."""
    tree = sqlglot.parse_one(tpch.query_text(number), read="spark")
    selects = [scope for scope in traverse_scope(tree) if isinstance(scope.expression, exp.Select)]
    scope = max(selects, key=lambda s: len(s.selected_sources))
    select = scope.expression
    where = select.args.get("where")
    conjuncts = list(where.this.flatten()) if where is not None and isinstance(where.this, exp.And) else ([where.this] if where else [])
    kept = [exp.paren(c, copy=True).sql(dialect="spark") if isinstance(c, exp.Or) else c.sql(dialect="spark")
            for c in conjuncts if not c.find(exp.Subquery, exp.Exists, exp.Select)]
    # Comma-separated tables stay a comma list: Spark does not run an explicit CROSS JOIN between streams.
    sources = [select.args["from_"].this.sql(dialect="spark")]
    for join in select.args.get("joins") or []:
        comma = join.args.get("on") is None and not join.side and join.kind in ("", "CROSS")
        sources.append(", " + join.this.sql(dialect="spark") if comma else " " + join.sql(dialect="spark"))
    text = "SELECT *\nFROM " + "".join(sources) + ("\nWHERE " + "\n  AND ".join(kept) if kept else "")
    ctes = tree.args.get("with_")
    if ctes is not None and any(isinstance(source, exp.Table) and source.name in {cte.alias for cte in ctes.expressions}
                                for source, _ in scope.selected_sources.values()):
        text = ctes.sql(dialect="spark") + "\n" + text
    return text


def split_into_batches(source: Path, target: Path, batches: int, seed: int) -> None:
    """Writes the rows of the Parquet ``source`` in a seeded random order as ``batches`` files into
    the directory ``target``, with increasing modification times (the order a file source reads them)."""
    target.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect()
    con.execute(f"SELECT setseed({1 / (seed + 1)})")
    con.execute(f"CREATE TABLE shuffled AS SELECT *, row_number() OVER (ORDER BY random()) - 1 AS _row FROM '{source}'")
    rows = con.execute("SELECT count(*) FROM shuffled").fetchone()[0]  # type: ignore[index]
    for b in range(batches):
        path = target / f"batch-{b:04d}.parquet"
        con.execute(f"COPY (SELECT * EXCLUDE (_row) FROM shuffled WHERE _row * {batches} // {max(rows, 1)} = {b}) TO '{path}' (FORMAT parquet)")
        os.utime(path, (1_000_000 + b, 1_000_000 + b))
    con.close()


def tpch_streams(sf: float, batches: int, seed: int = 42, root: Path | None = None) -> Path:
    """Every TPC-H table at ``sf`` cut into ``batches`` stream files (once; later calls reuse them)."""
    return cut_into_streams(tpch.generate(sf, root), tpch.TABLES, batches, seed)


def cut_into_streams(source: Path, tables: tuple[str, ...], batches: int, seed: int = 42) -> Path:
    """Each of ``tables`` (``<table>.parquet`` in ``source``) cut into ``batches`` stream files, under
    ``source`` (once, under the data directory's lock; later calls reuse them)."""
    target = source / f"streams-{batches}-seed{seed}"
    with generating(target):
        if not (target / _COMPLETE).exists():
            for table in tables:
                split_into_batches(source / f"{table}.parquet", target / table, batches, seed)
            (target / _COMPLETE).write_text("ok\n")
    return target


def read_streams(spark: SparkSession, streams: Path, tables: tuple[str, ...], source: Path) -> None:
    """Makes each table a streaming view of its files, one file per micro-batch (schema from ``source``)."""
    for table in tables:
        schema = spark.read.parquet(str(source / f"{table}.parquet")).schema
        spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(streams / table)).createOrReplaceTempView(table)
