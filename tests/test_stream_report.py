"""`umjoin tpch-report --streaming` at SF 0.01 on two of the paper's blocks: Q3 (converted) and Q15
(refused by Spark itself); schema, state figures checked against counts made here, rendered HTML.
And Q3 with an invalid UMJoin setting for UMJoin's run only, which fails it where Spark's run passes:
a failure, not a refusal, and the command exits 1."""

from __future__ import annotations

import contextlib
import functools
import io
import json
from pathlib import Path

import jsonschema
import pytest
from pyspark.sql import SparkSession

from test_report import rendered_dom
from umjoin import cli, stream_report

QUERIES = [3, 15]
#: A value the extension rejects when it plans (UMJoinConf: "Invalid value ... for spark.umjoin.probeOrder").
INVALID_SETTING = {"spark.umjoin.probeOrder": "fastest"}


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
    assert q15["umjoin"]["failed"] is None and q15["spark"]["failed"] is None
    summary = document["summary"]
    assert (summary["queries"], summary["refused_by_spark"], summary["umjoin_failed"], summary["converted_wholly"]) == (2, 1, 0, 1)
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


@pytest.fixture(scope="module")
def failing(spark: SparkSession, tpch_data: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, str, str]:
    """`umjoin tpch-report --streaming --queries 3` with ``INVALID_SETTING`` for UMJoin's runs (the CLI
    gives none: run_streaming_report is called with it): its output directory, exit code, stdout, stderr."""
    out = tmp_path_factory.mktemp("stream-report-failing")
    stdout, stderr = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        patch.setattr(stream_report, "run_streaming_report", functools.partial(stream_report.run_streaming_report, umjoin_settings=INVALID_SETTING))
        code = cli.main(["tpch-report", "--streaming", "--sf", "0.01", "--queries", "3", "--out", str(out)])
    return out, code, stdout.getvalue(), stderr.getvalue()


def test_an_error_of_umjoins_run_alone_is_a_failure_and_the_command_exits_1(spark: SparkSession, failing: tuple[Path, int, str, str]) -> None:
    out, code, stdout, stderr = failing
    document = json.loads((out / "streaming.json").read_text())
    jsonschema.validate(document, json.loads(stream_report.SCHEMA_PATH.read_text()))
    assert document["settings"]["umjoin_settings"] == INVALID_SETTING
    q3 = document["queries"][0]
    on, off = q3["umjoin"], q3["spark"]
    assert on["refused"] is None and "Invalid value 'fastest' for spark.umjoin.probeOrder" in on["failed"], on
    assert set(on) == {"refused", "failed"} and q3["state_rows_spark_over_umjoin"] is None
    # Spark's run (UMJoin off, without the setting) ran the block and gave the batch answer.
    assert off["refused"] is None and off["failed"] is None and off["stream_stream_joins"] == 2 and off["answer_equals_batch"]
    summary = document["summary"]
    assert (summary["queries"], summary["refused_by_spark"], summary["umjoin_failed"], summary["converted_wholly"]) == (1, 0, 1, 0)
    assert (summary["answers_equal_batch"], summary["spark_answers_equal_batch"]) == (0, 1)
    assert code == 1
    assert "0 refused by Spark, 1 failed with UMJoin" in stdout
    assert "umjoin tpch-report: Q03 failed with UMJoin (Spark's own run did not): " in stderr and "spark.umjoin.probeOrder" in stderr
    # The setting was set for UMJoin's run only: the session's settings are as before.
    assert spark.conf.get("spark.umjoin.probeOrder", None) is None


def test_markdown_and_html_show_the_failure(failing: tuple[Path, int, str, str], tmp_path: Path) -> None:
    out, _, _, _ = failing
    markdown = (out / "streaming.md").read_text()
    assert "0 refused by Spark itself as streams; UMJoin failed on 1 (an error Spark's own run did not raise)" in markdown
    assert "| Q03 | **UMJoin failed**: " in markdown and "| FAILED / yes |" in markdown
    dom = rendered_dom(out / "streaming.html", tmp_path)
    assert dom.count('class="query-row"') == 1
    assert '<td colspan="7" class="bad">UMJoin failed: ' in dom and "refused by Spark:" not in dom


def test_an_error_is_sparks_refusal_only_if_sparks_run_raised_the_same() -> None:
    def error(message: str, name: str, checkpoint: str, kind: type[Exception] = RuntimeError) -> stream_report._Error:
        return stream_report._error(kind(message), name, checkpoint)

    off = error("Query stream_report_q7_off [id = 1b4e28ba-2fa1-11d2-883f-0016d3cca427, runId = 6fa459ea-ee8a-3ca4-894e-db77e160355e] "
                "terminated with exception: cannot join #12 and #13L under /tmp/ck-a/offsets\n\tat Spark.frame(1)", "stream_report_q7_off", "/tmp/ck-a")
    # What differs between two runs of one block does not count, nor do the lines below the first.
    same = error("Query stream_report_q7_on [id = 0f8fad5b-d9cb-469f-a165-70867728950e, runId = 7c9e6679-7425-40de-944b-e07fc1f90ae7] "
                 "terminated with exception: cannot join #45 and #46L under /tmp/ck-b/offsets\n\tat UMJoin.frame(2)", "stream_report_q7_on", "/tmp/ck-b")
    assert stream_report._refused_by_spark(off, same) and same.line.startswith("Query stream_report_q7_on [id = 0f8fad5b")
    assert not stream_report._refused_by_spark(None, same)  # Spark's run passed
    # Another message, or another exception class, is another error.
    assert not stream_report._refused_by_spark(off, error(same.line.replace("cannot join", "cannot probe"), "stream_report_q7_on", "/tmp/ck-b"))
    assert not stream_report._refused_by_spark(off, error(same.line, "stream_report_q7_on", "/tmp/ck-b", kind=ValueError))
    # An error naming one of UMJoin's settings is UMJoin's, even where Spark's run (the extension loaded) raised it too.
    invalid = "Invalid value 'fastest' for spark.umjoin.probeOrder: expected dpPick or fixed or greedy or selectivityFirst."
    assert not stream_report._refused_by_spark(error(invalid, "stream_report_q3_off", "/tmp/ck-a"), error(invalid, "stream_report_q3_on", "/tmp/ck-b"))
