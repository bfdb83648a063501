"""The TPC-H conversion report at SF 0.01 on a few queries: schema, computed accuracy, rendered HTML."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import jsonschema
import pytest
from pyspark.sql import SparkSession

from umjoin import report

QUERIES = [3, 5, 13, 18]


@pytest.fixture(scope="module")
def written(spark: SparkSession, tpch_data: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:  # type: ignore[type-arg]
    out = tmp_path_factory.mktemp("report")
    return out, report.run_report(spark, 0.01, out, QUERIES, repetitions=1)


def test_json_matches_its_schema(written: tuple[Path, dict]) -> None:  # type: ignore[type-arg]
    out, returned = written
    document = json.loads((out / "report.json").read_text())
    jsonschema.validate(document, json.loads(report.SCHEMA_PATH.read_text()))
    assert document == json.loads(json.dumps(returned))
    assert [q["query"] for q in document["queries"]] == QUERIES


def test_accuracy_is_computed_from_expected_and_found_groups(written: tuple[Path, dict]) -> None:  # type: ignore[type-arg]
    _, document = written
    by_query = {q["query"]: q for q in document["queries"]}
    assert by_query[5]["expected_groups"] == [["customer", "lineitem", "nation", "orders", "region", "supplier"]]
    assert by_query[5]["umjoin_groups"][0]["inputs"] == ["customer", "orders", "lineitem", "supplier", "nation", "region"]
    assert by_query[5]["matched_groups"] == [[0, 0]] and by_query[5]["accuracy"] == 1
    assert by_query[13]["expected_groups"] == [] and by_query[13]["accuracy"] is None
    assert document["summary"]["expected_groups"] == 3 and document["summary"]["matched_groups"] == 3


def test_answers_agree_three_ways(written: tuple[Path, dict]) -> None:  # type: ignore[type-arg]
    _, document = written
    for query in document["queries"]:
        assert query["answers"]["on_equals_off"] and query["answers"]["official"] == "match", query["query"]


def test_match_groups_pairs_each_expected_group_with_the_tightest_covering_umjoin() -> None:
    expected = [["nation", "partsupp", "region", "supplier"], ["nation", "part", "partsupp", "region", "supplier"]]
    found = [["part", "partsupp", "partsupp+supplier+nation+region", "supplier", "nation", "region"], ["partsupp", "supplier", "nation", "region"]]
    assert report.match_groups(expected, found) == [(0, 1), (1, 0)]
    assert report.match_groups([["a", "b", "c"]], [["a", "b"]]) == []
    assert report.match_groups([["a", "b", "c"], ["a", "b", "c"]], [["a", "b", "c"]]) == [(0, 0)]


def rendered_dom(page: Path, profile: Path) -> str:
    """The page's DOM after headless Chromium loaded it (scripts and styles applied)."""
    chromium = shutil.which("chromium")
    assert chromium, "Debian's chromium is needed for this test: `make test` installs it (apt-get install chromium)"
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync", f"--user-data-dir={profile}"]
    return subprocess.run([chromium, *flags, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120, check=True).stdout


def test_html_opens_in_headless_chromium_with_one_row_per_query(written: tuple[Path, dict], tmp_path: Path) -> None:  # type: ignore[type-arg]
    out, _ = written
    dom = rendered_dom(out / "index.html", tmp_path)
    assert dom.count('class="query-row"') == len(QUERIES)
    assert dom.count("<svg") == 2 * len(QUERIES)
    assert 'class="node umjoin"' in dom
