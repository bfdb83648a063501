"""`umjoin tpch-report --streaming` at SF 0.01 on two of the paper's blocks: Q3 (converted) and Q15
(refused by Spark itself); schema, state figures checked against counts made here, rendered HTML."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from pyspark.sql import SparkSession

from test_report import rendered_dom
from umjoin import cli, stream_report

QUERIES = [3, 15]


@pytest.fixture(scope="module")
def written(spark: SparkSession, tpch_data: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:  # type: ignore[type-arg]
    out = tmp_path_factory.mktemp("stream-report")
    return out, stream_report.run_streaming_report(spark, 0.01, out, QUERIES, micro_batches=5)


def test_json_matches_its_schema(written: tuple[Path, dict]) -> None:  # type: ignore[type-arg]
    out, returned = written
    document = json.loads((out / "streaming.json").read_text())
    jsonschema.validate(document, json.loads(stream_report.SCHEMA_PATH.read_text()))
    assert document == json.loads(json.dumps(returned))
    assert [q["query"] for q in document["queries"]] == QUERIES


def test_q3_block_runs_as_one_streaming_umjoin_keeping_only_its_inputs_rows(spark: SparkSession, written: tuple[Path, dict]) -> None:  # type: ignore[type-arg]
    _, document = written
    q3 = document["queries"][0]
    on, off = q3["umjoin"], q3["spark"]
    assert on["umjoin_groups"] == [["customer", "orders", "lineitem"]] and on["stream_stream_joins"] == 0
    assert off["umjoin_groups"] == [] and off["stream_stream_joins"] == 2
    assert on["answer_equals_batch"] and off["answer_equals_batch"] and on["output_rows"] == off["output_rows"] > 0
    assert on["micro_batches"] >= 5
    # UMJoin's state is exactly the rows of its inputs that pass the block's filters, counted here in batch.
    kept = spark.sql("""SELECT (SELECT count(*) FROM customer WHERE c_mktsegment = 'BUILDING')
                             + (SELECT count(*) FROM orders WHERE o_orderdate < date '1995-03-15')
                             + (SELECT count(*) FROM lineitem WHERE l_shipdate > date '1995-03-15')""").first()[0]
    assert on["state_rows"] == kept
    assert on["state_rows_over_time"][-1] == kept and on["state_rows_over_time"] == sorted(on["state_rows_over_time"])
    # Spark's chained joins keep the same input rows and the customer-orders join's results on top.
    intermediate = spark.sql("""SELECT count(*) FROM customer JOIN orders ON c_custkey = o_custkey
                                WHERE c_mktsegment = 'BUILDING' AND o_orderdate < date '1995-03-15'""").first()[0]
    assert off["state_rows"] == kept + intermediate
    assert q3["state_rows_spark_over_umjoin"] == pytest.approx((kept + intermediate) / kept)


def test_q15_block_is_reported_as_refused_by_spark(written: tuple[Path, dict]) -> None:  # type: ignore[type-arg]
    _, document = written
    q15 = document["queries"][1]
    assert "not supported for streaming aggregations without watermark" in q15["umjoin"]["refused"]
    assert q15["spark"]["refused"] and q15["state_rows_spark_over_umjoin"] is None
    summary = document["summary"]
    assert (summary["queries"], summary["refused_by_spark"], summary["converted_wholly"]) == (2, 1, 1)
    assert summary["answers_equal_batch"] == summary["spark_answers_equal_batch"] == 1


def test_markdown_and_html_show_one_row_per_block(written: tuple[Path, dict], tmp_path: Path) -> None:  # type: ignore[type-arg]
    out, document = written
    markdown = (out / "streaming.md").read_text()
    q3 = document["queries"][0]
    assert f"| Q03 | customer, orders, lineitem | 2 -> 0 | {q3['spark']['state_rows']} / {q3['umjoin']['state_rows']} (" in markdown
    assert "| Q15 | refused by Spark: " in markdown
    dom = rendered_dom(out / "streaming.html", tmp_path)
    assert dom.count('class="query-row"') == len(QUERIES)
    assert "&amp;" not in dom and "StreamingUMJoin inputs=[#0 customer" in dom


@pytest.mark.parametrize(("args", "message"), [
    (["--streaming", "--queries", "4"], "--streaming covers the join blocks of the paper's queries 2, 3, 5, 7, 8, 9, 10, 11, 15, 18, 21, not [4]"),
    (["--micro-batches", "3"], "--micro-batches applies to the streaming report only: add --streaming"),
])
def test_misused_options_exit_2_before_spark_starts(capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    code = cli.main(["tpch-report", *args])
    err = capsys.readouterr().err
    assert code == 2 and err.strip() == f"umjoin tpch-report: error: {message}"
