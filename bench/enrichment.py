"""The enrichment workload of ``python -m bench streaming --workload enrichment``: one stream of
TPC-H orders extended by other streams keyed by the order, as a chain of LEFT joins (the shape
Flink's MultiJoin is built for, FLIP-516's published benchmark).

The side streams are the order's events: ``ship<i>`` the shipment of line i (l_shipdate, 1 to 121
days after the order) and ``delivery<i>`` its receipt (l_receiptdate, up to 151 days after). An
order has one to seven lines, so some side streams have no row for an order and its result row is
NULL-padded there. Each side joins ``orders`` on the order key and on its time lying within the
order's window, so Spark's watermarks can evict both sides. The chain on two keys replaces the
fifth side by ``reorder``, the same customer's orders placed within 30 days of the order (joined
on the customer key: the order itself and any next one).

Every stream is cut by event time into the same ``batches`` windows (a file per window, read one
per micro-batch), so no row is late. A last file per stream holds one sentinel row (order key -1,
in the year 2100; the orders' one with customer key -1 too) that moves every watermark past all real rows: the last micro-batches then put
out every order still waiting for a side row, so the query's output is the whole LEFT join's
result plus the sentinels' one row, which DuckDB computes from the same files.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

__all__ = ["CHAINS", "SIDES", "chain", "checks", "dataframe", "expected_checks", "expected_rows", "sql", "stream_files"]

#: The days after the order within which a side row belongs to it (TPC-H: ship 1-121 days after,
#: receipt 1-30 after that; a reorder: the customer's orders within 30 days).
WINDOW_DAYS = {"ship": 121, "delivery": 151, "reorder": 30}
WATERMARK_DELAY = "1 day"
SENTINEL_KEY = -1
_COMPLETE = "_COMPLETE"


#: Every side stream keyed by the order, as (name, event, line number): shipments of lines 1-7, then deliveries of lines 1-3.
SIDES = [(f"ship{i}", "ship", i) for i in range(1, 8)] + [(f"delivery{i}", "delivery", i) for i in range(1, 4)]
#: The side stream keyed by the customer.
REORDER = ("reorder", "reorder", 0)
#: The chains measured, by name: orders enriched by 5 and by 10 side streams on the order key, and by 5 on two keys.
CHAINS = {"5 sides": SIDES[:5], "10 sides": SIDES, "5 sides, 2 keys": [*SIDES[:4], REORDER]}


def chain(name: str) -> list[tuple[str, str, int]]:
    """The side streams of the chain `name`."""
    if name not in CHAINS:
        raise ValueError(f"the enrichment chains are {', '.join(repr(c) for c in CHAINS)}, not {name!r}")
    return CHAINS[name]


def stream_files(sf: float, batches: int, root: Path | None = None) -> Path:
    """Orders and all side streams at `sf`, as Parquet (Spark) and CSV (Flink) files, one per event-time window (once)."""
    from umjoin import tpch
    from umjoin.datadir import generating

    source = tpch.generate(sf, root)
    target = source / f"enrichment-{batches}-v3"
    with generating(target):
        if not (target / _COMPLETE).exists():
            _write_stream_files(source, target, batches)
    return target


def _write_stream_files(source: Path, target: Path, batches: int) -> None:
    import duckdb

    con = duckdb.connect()
    con.execute(f"CREATE VIEW o AS SELECT o_orderkey, o_custkey, o_totalprice, CAST(o_orderdate AS TIMESTAMP) AS o_time "
                f"FROM '{source / 'orders.parquet'}'")
    tables = {"orders": "SELECT * FROM o"}
    tables["reorder"] = "SELECT o_custkey AS reorder_custkey, o_orderkey AS reorder_orderkey, o_totalprice AS reorder_price, o_time AS reorder_time FROM o"
    for name, event, line in SIDES:
        date = "l_shipdate" if event == "ship" else "l_receiptdate"
        tables[name] = (f"SELECT l_orderkey AS {name}_orderkey, l_quantity AS {name}_quantity, l_extendedprice AS {name}_price, "
                        f"CAST({date} AS TIMESTAMP) AS {name}_time FROM '{source / 'lineitem.parquet'}' WHERE l_linenumber = {line}")
    for name, query in tables.items():
        con.execute(f"CREATE TABLE {name} AS {query}")
    first, last = con.execute("SELECT min(o_time), max(o_time) FROM orders").fetchone()  # type: ignore[misc]
    ends = [con.execute(f"SELECT max({name}_time) FROM {name}").fetchone()[0] for name in tables if name != "orders"]  # type: ignore[index]
    span = (max([last, *ends]) - first).total_seconds() + 1
    for name in tables:
        time = "o_time" if name == "orders" else f"{name}_time"
        window = f"CAST(floor(epoch({time} - TIMESTAMP '{first}') * {batches} / {span}) AS INTEGER)"
        for form in ("parquet", "csv"):
            directory = target / form / name
            directory.mkdir(parents=True, exist_ok=True)
            options = "FORMAT parquet" if form == "parquet" else "FORMAT csv, HEADER false"
            for b in range(batches):
                path = directory / f"batch-{b:04d}.{form}"
                con.execute(f"COPY (SELECT * FROM {name} WHERE {window} = {b}) TO '{path}' ({options})")
                os.utime(path, (1_000_000 + b, 1_000_000 + b))
            sentinel = directory / f"batch-{batches:04d}.{form}"
            # (The orders' sentinel has the customer key of reorder's: it matches every side's sentinel, and comes out.)
            keys = f"{SENTINEL_KEY} AS {_key(name)}" + (f", {SENTINEL_KEY} AS o_custkey" if name == "orders" else "")
            con.execute(f"COPY (SELECT * REPLACE ({keys}, TIMESTAMP '2100-01-01' AS {time}) "
                        f"FROM {name} LIMIT 1) TO '{sentinel}' ({options})")
            os.utime(sentinel, (1_000_000 + batches, 1_000_000 + batches))
    con.close()
    (target / _COMPLETE).write_text("ok\n")


def _key(name: str) -> str:
    """The stream's join key (the sentinel's is -1)."""
    return "o_orderkey" if name == "orders" else f"{name}_custkey" if name == REORDER[0] else f"{name}_orderkey"


def _condition(name: str, event: str) -> str:
    key = "custkey" if event == "reorder" else "orderkey"
    return f"{name}_{key} = o_{key} AND {name}_time BETWEEN o_time AND o_time + INTERVAL {WINDOW_DAYS[event]} DAYS"


def sql(sides: list[tuple[str, str, int]]) -> str:
    """The chain of `sides` as SQL (Spark's and Flink's, and DuckDB's over the same tables)."""
    joins = "".join(f"\nLEFT JOIN {name} ON {_condition(name, event)}" for name, event, _ in sides)
    return f"SELECT * FROM orders{joins}"


def checks(sides: list[tuple[str, str, int]]) -> list[str]:
    """Aggregates over the chain's result that Flink and DuckDB compute alike and exactly: its rows, each stream's matched rows
    (its key's count) and the sums of its numeric columns. What Flink's output is checked by: its regular LEFT join retracts the
    padded rows it put out, so its result is aggregated, and it has no xxhash64 to hash its rows as Spark does."""
    columns = {"orders": ["o_orderkey", "o_custkey", "o_totalprice"], REORDER[0]: ["reorder_custkey", "reorder_orderkey", "reorder_price"]}
    aggregates = ["COUNT(*)"]
    for name in ["orders", *(s[0] for s in sides)]:
        numeric = columns.get(name, [f"{name}_orderkey", f"{name}_quantity", f"{name}_price"])
        aggregates += [f"COUNT({numeric[0]})"] * (name != "orders") + [f"SUM({c})" for c in numeric]
    return aggregates


def expected_checks(files: Path, sides: list[tuple[str, str, int]]) -> list[str]:
    """:func:`checks` over the chain's result over every file, sentinels included, computed by DuckDB (as text: exact)."""
    import duckdb

    con = duckdb.connect()
    for name in ["orders", *(s[0] for s in sides)]:
        con.execute(f"CREATE VIEW {name} AS SELECT * FROM '{files / 'parquet' / name}/*.parquet'")
    values = con.execute(f"SELECT {', '.join(checks(sides))} FROM ({sql(sides)})").fetchone()
    con.close()
    return [str(v) for v in values]  # type: ignore[union-attr]


def expected_rows(files: Path, sides: list[tuple[str, str, int]]) -> int:
    """The chain's result rows over every file, sentinels included, counted by DuckDB."""
    return int(expected_checks(files, sides)[0])


def dataframe(spark: Any, files: Path, sides: list[tuple[str, str, int]]) -> Any:
    """The chain as Spark's streaming DataFrame: every stream with a watermark; each side's time loses its
    watermark once joined (a join's side may carry one event-time column)."""
    from pyspark.sql import functions as F

    def stream(name: str) -> Any:
        schema = spark.read.parquet(str(files / "parquet" / name)).schema
        time = "o_time" if name == "orders" else f"{name}_time"
        rows = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(files / "parquet" / name))
        # The files' times have no time zone (the CSV's too, for Flink); a watermark needs Spark's TIMESTAMP (the session's zone is UTC).
        return rows.withColumn(time, F.col(time).cast("timestamp")).withWatermark(time, WATERMARK_DELAY)

    joined = stream("orders")
    for name, event, _ in sides:
        joined = joined.join(stream(name), F.expr(_condition(name, event)), "left_outer").withMetadata(f"{name}_time", {})
    return joined
