"""Every batch join that stays as Spark plans it says why: `umjoin.plans.why_not(df)` and explain("extended")."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Iterator

import pytest
from pyspark.sql import SparkSession

from test_aqe import join_names
from umjoin import plans, tpch
from umjoin.local import temporary_conf

TABLES = {"x": "id AS a, id % 5 AS k", "y": "id AS b, id % 5 AS k, id % 3 AS j", "z": "id AS c, id % 3 AS j, id % 5 AS k"}


@pytest.fixture(scope="module")
def views(spark: SparkSession) -> Iterator[None]:
    for name, columns in TABLES.items():
        spark.range(200).selectExpr(*columns.split(", ")).createOrReplaceTempView(name)
    # Nothing is broadcast unless a case says so: the refusals then come from the joins' shapes alone.
    with temporary_conf(spark, {"spark.sql.autoBroadcastJoinThreshold": "-1"}):
        yield


@pytest.mark.parametrize(("sql", "join", "reason"), [
    ("SELECT * FROM x JOIN y ON x.a < y.b JOIN z ON y.j = z.j AND y.k = z.k",
     "the INNER join of ", "it has no equality between its two sides"),
    ("SELECT * FROM x FULL OUTER JOIN y ON x.k = y.k FULL OUTER JOIN z ON y.j = z.j",
     "the FULL OUTER join of ", "UMJoin does not compute its join type"),
    ("SELECT /*+ MERGE(y) */ * FROM x JOIN y ON x.k = y.k JOIN z ON y.k = z.k",
     "the INNER join of ", "it carries a join strategy hint, which Spark follows"),
    ("SELECT * FROM x JOIN y ON x.k = y.k",
     "the INNER join of ", "its group has 2 inputs, fewer than spark.umjoin.minInputs (3)"),
    ("SELECT * FROM x JOIN y ON x.k = y.k JOIN z ON y.j = z.j",
     "the INNER join of ", "cannot run as one UMJoin"),
], ids=["non-equi", "full-outer", "hint", "below-minInputs", "no-broadcast-no-shared-key"])
def test_a_join_that_stays_sparks_says_why(spark: SparkSession, views: None, capsys: pytest.CaptureFixture[str],
                                           sql: str, join: str, reason: str) -> None:
    df = spark.sql(sql)
    said = plans.why_not(df)
    assert any(s.startswith(join) and reason in s for s in said), said
    # Each sentence names the join's condition, not an internal step.
    assert all(" on " in s or "without a condition" in s for s in said), said
    df.explain("extended")
    explained = capsys.readouterr().out
    assert "== Extended Information (UMJoin) ==" in explained and reason in explained, explained[-2000:]
    assert "UMJoin inputs=" not in explained  # none of these converts


def test_a_converted_query_has_nothing_to_say(spark: SparkSession, views: None) -> None:
    with temporary_conf(spark, {"spark.sql.autoBroadcastJoinThreshold": "10MB"}):
        df = spark.sql("SELECT * FROM x JOIN y ON x.k = y.k JOIN z ON y.k = z.k")
        assert plans.umjoin_nodes(plans.physical_plan(df)) and plans.why_not(df) == []


def test_the_reason_is_logged_once_per_query_at_info(tmp_path: Path) -> None:
    """Logged by the JVM (logger umjoin.spark): a fresh Python with that logger at INFO, its stderr read here."""
    script = textwrap.dedent("""
        from pyspark.sql import SparkSession
        import umjoin
        spark = umjoin.configure(SparkSession.builder.master("local[2]")).getOrCreate()
        jvm = spark._jvm
        jvm.org.apache.logging.log4j.core.config.Configurator.setLevel("umjoin.spark", jvm.org.apache.logging.log4j.Level.INFO)
        spark.range(50).selectExpr("id AS a", "id % 5 AS k").createOrReplaceTempView("x")
        spark.range(50).selectExpr("id AS b", "id % 5 AS k").createOrReplaceTempView("y")
        df = spark.sql("SELECT * FROM x FULL OUTER JOIN y ON x.k = y.k")
        df.collect()
        df.collect()
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    said = [line for line in run.stderr.splitlines() if "UMJoin: the FULL OUTER join of" in line]
    assert len(said) == 1 and " INFO " in said[0] and "stays as Spark plans it: UMJoin does not compute its join type" in said[0], said


def test_a_group_spark_broadcasts_in_every_join_stays_sparks_by_default(spark: SparkSession, tpch_data: Path) -> None:
    """UMJoin's default (`spark.umjoin.convertBroadcastJoins=false`) at SF 0.01, where Spark broadcasts most of
    TPC-H's joins: a query whose joins Spark (UMJoin off) plans as broadcast joins, every one, keeps that plan, and
    Q5's root join says why. Without broadcasts the default converts exactly the groups `convertBroadcastJoins=true`
    (the suite's session) does."""
    reason = "Spark plans every join of its group as a broadcast join"
    all_broadcast = []
    with temporary_conf(spark, {"spark.umjoin.convertBroadcastJoins": "false", "spark.sql.adaptive.enabled": "false",
                                "spark.sql.autoBroadcastJoinThreshold": "10MB"}):  # Spark's default
        for number in tpch.QUERY_NUMBERS:
            with temporary_conf(spark, {"spark.umjoin.enabled": "false"}):
                off = join_names(plans.physical_plan(spark.sql(tpch.query_text(number))))
            if len(off) >= 2 and all(name.startswith("Broadcast") for name in off):
                all_broadcast.append(number)
                on = plans.physical_plan(spark.sql(tpch.query_text(number)))
                assert plans.umjoin_nodes(on) == [] and join_names(on) == off, (number, join_names(on))
        said = plans.why_not(spark.sql(tpch.query_text(5)))
        assert any(s.startswith("the INNER join of ") and reason in s for s in said), said

    def groups_without_broadcasts(convert_broadcast_joins: str) -> dict[int, list[list[str]]]:
        with temporary_conf(spark, {"spark.umjoin.convertBroadcastJoins": convert_broadcast_joins, "spark.sql.adaptive.enabled": "false",
                                    "spark.sql.autoBroadcastJoinThreshold": "-1"}):
            return {n: [node.labels for node in plans.umjoin_nodes(plans.physical_plan(spark.sql(tpch.query_text(n))))]
                    for n in tpch.QUERY_NUMBERS}

    found, converting = groups_without_broadcasts("false"), groups_without_broadcasts("true")
    assert found == converting and sum(map(len, found.values())) >= 5, (found, converting)
    assert 5 in all_broadcast and len(all_broadcast) >= 8, all_broadcast
