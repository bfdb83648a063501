"""TPC-DS tables from DuckDB's TPC-DS extension (PyPI package), kept as one Parquet file per table."""

from __future__ import annotations

from pathlib import Path

import duckdb
import duckdb_extension_tpcds
from pyspark.sql import SparkSession

from umjoin.datadir import data_root, generating

__all__ = ["FOUR_WAY_QUERY", "FOUR_WAY_ROWS_SF1", "FOUR_WAY_TABLES", "TABLES", "generate", "query_text", "register"]

#: The paper's 4-way join (000, section 4.1): three returns tables meet customers on the address key.
FOUR_WAY_QUERY = """SELECT *
FROM store_returns sr, customer cu, web_returns wr, catalog_returns cr
WHERE cu.c_current_addr_sk = cr.cr_refunded_addr_sk
  AND cu.c_current_addr_sk = sr.sr_addr_sk
  AND cu.c_current_addr_sk = wr.wr_refunded_addr_sk"""
FOUR_WAY_TABLES = ("store_returns", "customer", "web_returns", "catalog_returns")
#: Its result size at scale factor 1 (DESIGN.md; checked again by every experiment run).
FOUR_WAY_ROWS_SF1 = 2_157_897
#: Every TPC-DS table.
TABLES = ("call_center", "catalog_page", "catalog_returns", "catalog_sales", "customer", "customer_address",
          "customer_demographics", "date_dim", "household_demographics", "income_band", "inventory", "item", "promotion",
          "reason", "ship_mode", "store", "store_returns", "store_sales", "time_dim", "warehouse", "web_page", "web_returns",
          "web_sales", "web_site")
_COMPLETE = "_COMPLETE"


def _connect_with_extension() -> duckdb.DuckDBPyConnection:
    """DuckDB with the TPC-DS extension of the duckdb-extension-tpcds package loaded (its download does not work offline)."""
    files = sorted((Path(duckdb_extension_tpcds.__file__).parent).glob("extensions/*/tpcds.duckdb_extension"))
    if not files:
        raise FileNotFoundError("tpcds.duckdb_extension not found; reinstall duckdb-extension-tpcds==1.5.5")
    con = duckdb.connect()
    con.execute(f"LOAD '{files[-1]}'")
    return con


def query_text(number: int) -> str:
    """TPC-DS query ``number`` (1-99) as the extension has it, in Spark SQL (sqlglot's transpilation from DuckDB's dialect)."""
    import sqlglot

    con = _connect_with_extension()
    (text,) = con.execute("SELECT query FROM tpcds_queries() WHERE query_nr = ?", [number]).fetchone()  # type: ignore[misc]
    con.close()
    return sqlglot.transpile(text, read="duckdb", write="spark")[0]


def generate(sf: float, tables: tuple[str, ...] = FOUR_WAY_TABLES, root: Path | None = None) -> Path:
    """Generates TPC-DS at ``sf`` with ``CALL dsdgen`` and writes ``tables`` as Parquet (once)."""
    target = (root or data_root()) / "tpcds" / f"sf{sf:g}"
    with generating(target):
        if (target / _COMPLETE).is_file() and all((target / f"{t}.parquet").exists() for t in tables):
            return target
        target.mkdir(parents=True, exist_ok=True)
        con = _connect_with_extension()
        con.execute(f"CALL dsdgen(sf={sf})")
        for table in tables:
            con.execute(f"COPY {table} TO '{target / (table + '.parquet')}' (FORMAT parquet)")
        (target / _COMPLETE).write_text(f"TPC-DS sf={sf} tables {', '.join(tables)}\n")
        return target


def register(spark: SparkSession, directory: Path, tables: tuple[str, ...] = FOUR_WAY_TABLES) -> None:
    for table in tables:
        spark.read.parquet(str(directory / f"{table}.parquet")).createOrReplaceTempView(table)
