"""TPC-DS queries whose multi-way joins hold outer joins (SF 0.01, DuckDB's data and query texts):
with UMJoin the same answers as without, and each outer join's non-preserved side an outer input of
the UMJoin of its joins (AQE off: the plans are fixed)."""

from __future__ import annotations

import decimal
from typing import Any

import pytest
from pyspark.sql import SparkSession

from umjoin import plans, tpcds
from umjoin.local import temporary_conf

TPCDS_SF = 0.01
#: query -> the outer inputs of its UMJoins, in plan order.
OUTER_INPUTS = {
    40: ["catalog_returns"],
    72: ["promotion", "catalog_returns"],
    75: ["catalog_returns", "store_returns", "web_returns"] * 2,
    78: ["store_returns", "web_returns", "catalog_returns"],
    80: ["store_returns", "catalog_returns", "web_returns"],
}


@pytest.fixture(scope="module")
def tpcds_spark(spark: SparkSession) -> SparkSession:
    """A session of its own: temporary views are per session, so TPC-DS's `customer` never hides TPC-H's."""
    session = spark.newSession()
    tpcds.register(session, tpcds.generate(TPCDS_SF, tpcds.TABLES), tpcds.TABLES)
    return session


def canonical(rows: list[Any]) -> list[tuple[Any, ...]]:
    """Rows as a sorted multiset; fractional numbers to 6 places (sums may add in another order)."""
    def value(v: Any) -> Any:
        return round(float(v), 6) if isinstance(v, (float, decimal.Decimal)) else v
    return sorted((tuple(value(v) for v in r) for r in rows), key=repr)


@pytest.mark.parametrize("number", sorted(OUTER_INPUTS))
def test_outer_joins_of_tpcds_queries_run_inside_umjoin_with_the_same_answer(tpcds_spark: SparkSession, number: int) -> None:
    spark = tpcds_spark
    sql = tpcds.query_text(number)
    with temporary_conf(spark, {"spark.sql.adaptive.enabled": "false"}):
        with temporary_conf(spark, {"spark.umjoin.enabled": "false"}):
            expected = canonical(spark.sql(sql).collect())
        df = spark.sql(sql)
        actual = canonical(df.collect())
        nodes = plans.umjoin_nodes(plans.physical_plan(df))
    assert actual == expected and len(expected) > 0
    assert [i.label for node in nodes for i in node.inputs if i.join_type == "LeftOuter"] == OUTER_INPUTS[number]
