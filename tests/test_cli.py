"""The `umjoin` command: help, plan-diff in every format, and every input error with exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from umjoin import cli, tpch
from umjoin.datadir import DATA_DIR_ENV, data_root, generating
from umjoin.local import temporary_conf


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_help_lists_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    for command in ("jar", "tpch-report", "plan-diff", "demo"):
        assert command in out
    assert "bench" not in out, "the benchmarks run from a clone (python -m bench), not from the installed command"


def test_plan_diff_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["plan-diff", "--help"])
    out = capsys.readouterr().out
    for option in ("--tpch", "--data", "--tpch-sf", "--dialect", "--format", "--layout"):
        assert option in out


def test_text_side_by_side_marks_replaced_joins_and_umjoin(spark: SparkSession, tpch_data: Path, capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # Each side is half the terminal's width: in a narrow one the deepest joins' names are cut off.
    monkeypatch.setenv("COLUMNS", "240")
    code, out, _ = run(capsys, "plan-diff", "--tpch", "5", "--tpch-sf", "0.01")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("UMJoin off (Spark's plan)") and "| UMJoin on" in lines[0]
    assert sum("- " in l.split(" | ")[0] and "BroadcastHashJoin" in l.split(" | ")[0] for l in lines) == 5
    assert sum("+ " in l.split(" | ")[-1] and "UMJoin" in l.split(" | ")[-1] for l in lines) == 1
    assert "5 binary joins without UMJoin; with UMJoin 0 binary joins and 1 UMJoin node(s); 5 joins replaced." in out
    assert "\033[" not in out  # plain when piped


def test_text_unified_and_colour(spark: SparkSession, tpch_data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "plan-diff", "--tpch", "3", "--layout", "unified", "--color", "always")
    assert code == 0
    assert out.startswith("--- UMJoin off (Spark's plan)\n+++ UMJoin on")
    assert "\033[32m+ " in out and "UMJoin inputs=[" in out and "\033[31m- " in out


def test_json_format(spark: SparkSession, tpch_data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "plan-diff", "--tpch", "5", "--format", "json")
    assert code == 0
    document = json.loads(out)
    assert document["join_counts"] == {"binary_joins_off": 5, "binary_joins_on": 0, "umjoins_on": 1}
    (umjoin,) = document["umjoins"]
    assert [i["label"] for i in umjoin["inputs"]] == ["customer", "orders", "lineitem", "supplier", "nation", "region"]
    assert umjoin["probe_order"][0] == 2 and umjoin["inputs"][2]["placement"] == "streamed"

    def marks(node: dict) -> list[str]:  # type: ignore[type-arg]
        return [node["mark"]] * bool(node["mark"]) + [m for c in node["children"] for m in marks(c)]

    assert marks(document["off"]["physical"]) == ["replaced"] * 5
    assert marks(document["on"]["physical"]) == ["umjoin"]


def test_a_query_left_to_spark_says_why_in_both_formats(spark: SparkSession, tpch_data: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """Under UMJoin's default (`spark.umjoin.convertBroadcastJoins=false`) Q5's joins at SF 0.01 are Spark's broadcast
    joins, every one: the diff shows no UMJoin and says why, as `umjoin.plans.why_not` does."""
    reason = "Spark plans every join of its group as a broadcast join"
    with temporary_conf(spark, {"spark.umjoin.convertBroadcastJoins": "false"}):
        code, out, _ = run(capsys, "plan-diff", "--tpch", "5", "--format", "json")
        assert code == 0
        document = json.loads(out)
        assert document["join_counts"]["umjoins_on"] == 0 and any(reason in r for r in document["why_not"]), document["why_not"]
        code, out, _ = run(capsys, "plan-diff", "--tpch", "5", "--no-execute")
        assert code == 0 and any(l.startswith("Stays Spark's: the INNER join of ") and reason in l for l in out.splitlines()), out[-2000:]


def test_html_format_to_file(spark: SparkSession, tpch_data: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    target = tmp_path / "diff.html"
    code, out, _ = run(capsys, "plan-diff", "--tpch", "5", "--format", "html", "--out", str(target))
    assert code == 0 and out == ""
    html = target.read_text()
    assert html.startswith("<!DOCTYPE html>") and "<svg" in html and 'class="node umjoin"' in html
    assert html.count('class="node replaced"') == 5
    assert "<script" not in html and "http" not in html.replace("http://www.w3.org/2000/svg", "")


def test_sql_file_data_dir_and_dialect(spark: SparkSession, tpch_data: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    query = tmp_path / "q.sql"
    # Postgres spelling (:: casts, ILIKE) transpiled to Spark SQL by sqlglot.
    query.write_text(
        "SELECT n.n_name FROM nation n JOIN supplier s ON s.s_nationkey = n.n_nationkey "
        "JOIN region r ON n.n_regionkey = r.r_regionkey WHERE r.r_name ILIKE 'asia' AND s.s_acctbal::float > 0"
    )
    code, out, _ = run(capsys, "plan-diff", str(query), "--data", str(tpch_data), "--dialect", "postgres", "--format", "json")
    assert code == 0
    document = json.loads(out)
    assert "ILIKE" in document["sql"].upper() and "::" not in document["sql"]
    assert sorted(i["label"] for i in document["umjoins"][0]["inputs"]) == ["nation", "region", "supplier"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["missing.sql"], "no such file: missing.sql"),
        (["SELECT n_name FROM nation WHERE n_name = = 1", "--tpch-sf", "0.01"], "SQL does not parse (line 1, column 42)"),
        (["SELECT *\nFROM nation\nWHERE n_name =", "--tpch-sf", "0.01"], "SQL does not parse (line 3, column"),
        (["SELECT * FROM nowhere", "--tpch-sf", "0.01"], "unknown table `nowhere`"),
        (["SELECT 1", "--dialect", "klingon"], "unknown dialect 'klingon'; sqlglot knows: "),
        (["SELECT * FROM (", "--dialect", "postgres"], "SQL does not parse as postgres (line 1, column"),
        (["SELECT 1", "--data", "/no/such/dir"], "no such directory: /no/such/dir"),
        (["--tpch", "3", "SELECT 1"], "give either a query"),
        ([], "no query: give SQL text, a .sql file, or --tpch N"),
    ],
)
def test_bad_input_exits_2_with_one_message(spark: SparkSession, tpch_data: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    code, out, err = run(capsys, "plan-diff", *args)
    assert code == 2 and out == ""
    assert err.startswith("umjoin plan-diff: error: ") and message in err
    assert len(err.strip().splitlines()) == 1 and "\tat " not in err and "Traceback" not in err


def test_argument_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    for args in (["plan-diff", "--tpch", "23"], ["plan-diff", "--format", "pdf", "x"], ["tpch-report", "--sf", "-1"]):
        with pytest.raises(SystemExit) as done:
            cli.main(args)
        assert done.value.code == 2
        assert "error:" in capsys.readouterr().err


def test_bench_names_the_broadcast_thresholds_it_knows(capsys: pytest.CaptureFixture[str]) -> None:
    from bench.__main__ import main as bench_main

    with pytest.raises(SystemExit) as done:
        bench_main(["tpch", "--thresholds", "default,5MB"])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert "broadcast thresholds are default, 1MB, not 5MB" in err and "Traceback" not in err


def test_bench_streaming_takes_settings_as_key_equals_value(capsys: pytest.CaptureFixture[str]) -> None:
    from bench.__main__ import _parser, main as bench_main

    args = _parser().parse_args(["streaming", "--blocks", "10", "--conf", "spark.umjoin.stateCacheRows=0"])
    assert args.blocks == [10] and dict(args.conf) == {"spark.umjoin.stateCacheRows": "0"}
    with pytest.raises(SystemExit) as done:
        bench_main(["streaming", "--conf", "stateCacheRows"])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert "a setting is KEY=VALUE with a spark.* key, not 'stateCacheRows'" in err and "Traceback" not in err


def test_jar_prints_the_path_of_the_built_jar(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "jar")
    assert code == 0
    jar = Path(out.strip())
    names = set(zipfile.ZipFile(jar).namelist())
    assert "umjoin/spark/UMJoinExtensions.class" in names and "umjoin/rules/batch.yaml" in names


def test_data_dir_flag_puts_generated_data_there(spark: SparkSession, tpch_data: Path, capsys: pytest.CaptureFixture[str],
                                                 tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)  # restored after the test: the flag sets it for worker processes
    code, out, err = run(capsys, "plan-diff", "--tpch", "3", "--tpch-sf", "0.01", "--no-execute", "--data-dir", str(tmp_path / "d"))
    assert code == 0, err
    assert (tmp_path / "d" / "tpch" / "sf0.01" / "_COMPLETE").is_file()
    assert sorted(p.name for p in (tmp_path / "d" / "tpch").iterdir()) == [".sf0.01.lock", "sf0.01"]


def test_data_root_is_the_setting_else_the_user_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path / "mine"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert data_root() == tmp_path / "mine"
    monkeypatch.delenv(DATA_DIR_ENV)
    assert data_root() == tmp_path / "xdg" / "umjoin"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert data_root() == Path.home() / ".cache" / "umjoin"


def test_a_process_asking_for_data_another_is_generating_waits_for_it_then_reuses_it(tmp_path: Path) -> None:
    """Two test runs, or a test run beside a benchmark, share the data directory: the second one to ask
    writes nothing while the first holds the generation's lock, and then finds the data complete."""
    target = tpch.data_dir(0.001, tmp_path)
    script = (f"from pathlib import Path; from umjoin import tpch; print('asking', flush=True); "
              f"tpch.generate(0.001, Path({str(tmp_path)!r}))")
    with generating(target):
        waiting = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
        assert waiting.stdout is not None and waiting.stdout.readline() == "asking\n"
        time.sleep(2)
        assert waiting.poll() is None and not target.exists()
        target.mkdir()
        (target / "_COMPLETE").write_text("generated by the test\n")
    assert waiting.wait(timeout=120) == 0
    assert sorted(p.name for p in target.iterdir()) == ["_COMPLETE"], "the waiting process generated the data again"
