"""The enrichment workload's streams (bench/enrichment.py): every row once, in event-time windows, and
the expected result DuckDB computes from them against the join computed here from TPC-H's own tables; and the
fingerprint every benchmark compares its runs' outputs by (bench/outputs.py): a multiset's, not a row count."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from bench import enrichment, outputs
from conftest import TPCH_SF

BATCHES = 4


@pytest.fixture(scope="module")
def files(tpch_data: Path) -> Path:
    return enrichment.stream_files(TPCH_SF, BATCHES)


def test_every_stream_row_once_in_windows_that_follow_each_other(files: Path, tpch_data: Path) -> None:
    con = duckdb.connect()
    orders = con.execute(f"SELECT count(*) FROM '{tpch_data / 'orders.parquet'}'").fetchone()[0]  # type: ignore[index]
    lines = con.execute(f"SELECT count(*) FROM '{tpch_data / 'lineitem.parquet'}' WHERE l_linenumber = 3").fetchone()[0]  # type: ignore[index]
    for name, time, rows in (("orders", "o_time", orders), ("ship3", "ship3_time", lines)):
        for form in ("parquet", "csv"):
            files_of = sorted((files / form / name).iterdir())
            assert len(files_of) == BATCHES + 1, "a file per window and the sentinel's"
            column = time if form == "parquet" else "column3"  # the CSV has no header (Flink's tables name the columns)
            ranges = [con.execute(f"SELECT count(*), min({column}), max({column}) FROM '{f}'").fetchone() for f in files_of]
            assert sum(r[0] for r in ranges[:-1]) == rows  # type: ignore[index]
            assert ranges[-1][0] == 1  # type: ignore[index]
            assert all(a[2] < b[1] for a, b in zip(ranges, ranges[1:])), f"{name}'s {form} windows overlap: {ranges}"  # type: ignore[index]


def test_expected_rows_are_the_left_joins_of_the_tpch_tables_and_the_sentinels_row(files: Path, tpch_data: Path) -> None:
    con = duckdb.connect()
    joined = con.execute(f"""
        SELECT count(*) FROM '{tpch_data / 'orders.parquet'}' o
        LEFT JOIN (SELECT * FROM '{tpch_data / 'lineitem.parquet'}' WHERE l_linenumber = 1) s1
          ON s1.l_orderkey = o.o_orderkey AND s1.l_shipdate BETWEEN o.o_orderdate AND o.o_orderdate + INTERVAL 121 DAYS
        LEFT JOIN (SELECT * FROM '{tpch_data / 'lineitem.parquet'}' WHERE l_linenumber = 2) s2
          ON s2.l_orderkey = o.o_orderkey AND s2.l_shipdate BETWEEN o.o_orderdate AND o.o_orderdate + INTERVAL 121 DAYS
    """).fetchone()[0]  # type: ignore[index]
    assert enrichment.expected_rows(files, enrichment.SIDES[:2]) == joined + 1
    padded = con.execute(f"SELECT count(*) FROM '{tpch_data / 'orders.parquet'}' o WHERE NOT EXISTS (SELECT 1 FROM "
                         f"'{tpch_data / 'lineitem.parquet'}' WHERE l_orderkey = o_orderkey AND l_linenumber = 2)").fetchone()[0]  # type: ignore[index]
    assert padded > 0, "some orders have no second line: the chain pads"


def test_the_chain_on_two_keys_finds_a_customers_next_orders(files: Path, tpch_data: Path) -> None:
    """Its fifth side joins on the customer key: each order finds itself and its customer's orders of the next 30 days."""
    con = duckdb.connect()
    joined = con.execute(f"""
        SELECT count(*) FROM '{tpch_data / 'orders.parquet'}' o
        JOIN '{tpch_data / 'orders.parquet'}' r ON r.o_custkey = o.o_custkey AND r.o_orderdate BETWEEN o.o_orderdate AND o.o_orderdate + INTERVAL 30 DAYS
    """).fetchone()[0]  # type: ignore[index]
    orders = con.execute(f"SELECT count(*) FROM '{tpch_data / 'orders.parquet'}'").fetchone()[0]  # type: ignore[index]
    assert joined > orders, "some customers order again within 30 days"
    assert enrichment.expected_rows(files, [enrichment.REORDER]) == joined + 1


def test_an_unknown_chain_is_refused_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match="the enrichment chains are '5 sides', '10 sides', '5 sides, 2 keys', not '7 sides'"):
        enrichment.chain("7 sides")


@pytest.mark.parametrize("chain", list(enrichment.CHAINS))
def test_the_orders_sentinel_matches_every_sides_sentinel(files: Path, chain: str) -> None:
    """No watermark ever passes the sentinels' time: the orders' one must come out matched, never waiting to be padded."""
    sides = enrichment.chain(chain)
    con = duckdb.connect()
    for name in ["orders", *(s[0] for s in sides)]:
        con.execute(f"CREATE VIEW {name} AS SELECT * FROM '{files / 'parquet' / name}/*.parquet'")
    matched = " AND ".join(f"{name}_time IS NOT NULL" for name, _, _ in sides)
    assert con.execute(f"SELECT count(*) FROM ({enrichment.sql(sides)}) WHERE o_orderkey = -1 AND {matched}").fetchone()[0] == 1  # type: ignore[index]


# --- How every benchmark compares outputs (bench/outputs.py) ------------------------------------
# (Here, beside the enrichment workload's tests, as the one test module of the benchmarks' helpers.)

def _fingerprint(spark: SparkSession, rows: list[tuple[int | None, int | None]], partitions: int = 1) -> dict[str, int]:
    return outputs.fingerprint_of(spark.createDataFrame(rows, "a BIGINT, b BIGINT").repartition(partitions))


def test_the_output_hash_ignores_the_rows_order_and_their_cut_into_parts(spark: SparkSession) -> None:
    rows = [(k, k % 3 or None) for k in range(50)]
    whole = _fingerprint(spark, rows)
    assert whole == _fingerprint(spark, rows[::-1], partitions=4)
    assert outputs.union([_fingerprint(spark, rows[:20]), _fingerprint(spark, rows[20:])]) == whole
    assert whole["rows"] == 50


def test_the_output_hash_counts_each_rows_copies(spark: SparkSession) -> None:
    rows = [(1, 2), (3, 4), (5, 6)]
    once, twice = _fingerprint(spark, rows), _fingerprint(spark, [*rows, (3, 4)])
    assert twice["rows"] == once["rows"] + 1 and twice["hash"] != once["hash"]
    # Same count, other rows: a row count alone cannot tell these apart.
    assert _fingerprint(spark, [(1, 2), (3, 4), (3, 4)]) != once


def test_the_output_hash_tells_where_a_rows_nulls_are(spark: SparkSession) -> None:
    one_null = spark.createDataFrame([(1, None), (None, 1)], "a BIGINT, b BIGINT")
    plain = [r[0] for r in one_null.select(F.xxhash64("a", "b")).collect()]
    assert plain[0] == plain[1], "xxhash64 skips NULLs: the values alone hash alike"
    assert _fingerprint(spark, [(1, None)]) != _fingerprint(spark, [(None, 1)])
    assert _fingerprint(spark, [(None, None)]) != _fingerprint(spark, [(0, 0)])


def test_the_null_masks_span_wide_rows(spark: SparkSession) -> None:
    """A BIGINT per 63 columns: the 64th column's NULL is in the second mask."""
    names = [f"c{k}" for k in range(70)]
    df = spark.createDataFrame([tuple(None if k in (0, 63, 69) else k for k in range(70))], ", ".join(f"{n} BIGINT" for n in names))
    masks = df.select(*outputs.null_masks([F.col(n) for n in names])).first()
    assert tuple(masks) == (1, 1 | 1 << 6)  # type: ignore[arg-type]


def test_an_output_hash_sums_past_a_bigint_without_overflow(spark: SparkSession) -> None:
    """Spark runs with ANSI mode on: a BIGINT sum of 64-bit hashes would fail; the DECIMAL(38,0) sum is exact."""
    rows = [(k, k) for k in range(2000)]
    hashes = [r[0] for r in spark.createDataFrame(rows, "a BIGINT, b BIGINT").select(outputs.row_hash([F.col("a"), F.col("b")])).collect()]
    assert _fingerprint(spark, rows, partitions=3) == {"rows": 2000, "hash": sum(hashes)}


def test_a_micro_batchs_observed_fingerprint_is_read_from_its_progress() -> None:
    assert outputs.observed_fingerprint({"observedMetrics": {"output": {"rows": 3, "hash": -12345678901234567890123}}}) == \
        {"rows": 3, "hash": -12345678901234567890123}
    assert outputs.observed_fingerprint({"observedMetrics": {"output": {"rows": 0, "hash": None}}}) == {"rows": 0, "hash": 0}
    assert outputs.observed_fingerprint({"observedMetrics": {}}) is None


def test_the_digest_of_collected_rows_is_a_multisets() -> None:
    rows = [(1, None, "x"), (None, 1, "x"), (2, 2.5, None)]
    assert outputs.digest(rows) == outputs.digest(rows[::-1])
    assert outputs.digest([*rows, rows[0]]) != outputs.digest(rows)
    assert outputs.digest([(1, None)]) != outputs.digest([(None, 1)])
