"""Settings, rules files and packaging: defaults work, bad input fails with a message that helps."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

import umjoin
from umjoin.local import temporary_conf
from umjoin import plans, tpch

REPO_RULES = Path(__file__).resolve().parents[1] / "rules"


def q5_umjoins(spark: SparkSession) -> list[plans.UMJoinNode]:
    with temporary_conf(spark, {"spark.sql.adaptive.enabled": "false"}):
        return plans.umjoin_nodes(plans.physical_plan(spark.sql(tpch.query_text(5))))


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("spark.umjoin.enabled", "maybe", "expected true or false"),
        ("spark.umjoin.minInputs", "three", "expected an integer >= 2"),
        ("spark.umjoin.minInputs", "1", "expected an integer >= 2"),
        ("spark.umjoin.stateBackend", "disk", "expected auto or memory or rocksdb"),
        ("spark.umjoin.rocksdb.writeBufferSize", "lots", "a size such as 64k, 8m or 1g, at least 65536 bytes"),
        ("spark.umjoin.rocksdb.writeBufferSize", "-8m", "a size such as 64k, 8m or 1g"),
        ("spark.umjoin.rocksdb.writeBufferSize", "1k", "at least 65536 bytes"),
        ("spark.umjoin.rocksdb.blockCacheSize", "-5m", "a size such as 64k, 8m or 1g"),
        ("spark.umjoin.rocksdb.bloomFilterBitsPerKey", "-1", "an integer >= 0"),
        ("spark.umjoin.rocksdb.bloomFilterBitsPerKey", "ten", "an integer >= 0"),
        ("spark.umjoin.auto.maxStoreMemory", "big", "a size such as 64k, 8m or 1g"),
        ("spark.umjoin.probeOrder", "fastest", "expected dpPick or fixed or greedy or selectivityFirst"),
        ("spark.umjoin.dpPick.cycleRows", "0", "expected an integer >= 1"),
        ("spark.umjoin.dpPick.period", "soon", "expected a positive duration"),
        ("spark.umjoin.dpPick.history", "-2", "expected an integer >= 1"),
        ("spark.umjoin.dpPick.smoothing", "yes", "expected true or false"),
        ("spark.umjoin.dpPick.alpha", "1.5", "expected a number from 0.0 to 1.0"),
        ("spark.umjoin.dpPick.damping", "x", "expected a number from 0.0 to 1.0"),
        ("spark.umjoin.dpPick.queryCost", "-1", "expected a number >= 0.0"),
        ("spark.umjoin.stateCacheRows", "-1", "expected an integer >= 0"),
        ("spark.umjoin.stateCacheRows", "many", "expected an integer >= 0"),
        ("spark.umjoin.staticCache", "some", "expected all or off or ssbj"),
        ("spark.umjoin.staticTables", "keep", "expected store or reread"),
        ("spark.umjoin.staticCache.maxBytes", "huge", "a size such as 64k, 8m or 1g"),
        ("spark.umjoin.staticCache.hysteresis", "0.5", "expected a number >= 1.0"),
    ],
)
def test_invalid_setting_fails_the_query_naming_it(spark: SparkSession, tpch_data: Path, key: str, value: str, expected: str) -> None:
    with temporary_conf(spark, {key: value}):
        with pytest.raises(Exception) as failure:
            spark.sql(tpch.query_text(5)).collect()
    message = str(failure.value)
    assert key in message and f"'{value}'" in message and expected in message


def test_enabled_switches_umjoin_per_session(spark: SparkSession, tpch_data: Path) -> None:
    assert len(q5_umjoins(spark)) == 1
    with temporary_conf(spark, {"spark.umjoin.enabled": "false"}):
        assert q5_umjoins(spark) == []


def test_min_inputs_is_the_smallest_group_converted(spark: SparkSession, tpch_data: Path) -> None:
    with temporary_conf(spark, {"spark.umjoin.minInputs": "6"}):
        (node,) = q5_umjoins(spark)
        assert len(node.inputs) == 6
    with temporary_conf(spark, {"spark.umjoin.minInputs": "7"}):
        assert q5_umjoins(spark) == []


def _parse_rules(spark: SparkSession, text: str) -> None:
    jvm = spark._jvm
    jvm.umjoin.spark.tsc.MemberPatterns.parse("test.yaml", text, jvm.umjoin.spark.planning.LogicalPatterns.vocabulary())


VALID_JOIN = "  - node: Join\n    role: join\n    when: {joinType: [Inner], equiJoinKey: true}\n"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("plan: logical\nmembers: [ {node: Join", "not valid YAML at line"),
        ("", "expected a mapping with the keys `plan` and `members`"),
        ("plan: physical\nmembers:\n" + VALID_JOIN, "`plan: physical` does not fit here"),
        ("plan: logical\nmembers: []\n", "`members` is missing or empty"),
        ("plan: logical\nmembers:\n  - node: Joinn\n    role: join\n", "unknown node `Joinn`; logical plans know Filter, Join, Project"),
        ("plan: logical\nmembers:\n  - node: Project\n    role: join\n", "only join nodes have role `join`"),
        ("plan: logical\nmembers:\n  - node: Join\n    role: hub\n", "unknown role `hub`"),
        ("plan: logical\nmembers:\n  - node: Join\n    role: join\n    when: {joinType: [FullOuter]}\n", "FullOuter cannot be a UMJoin member"),
        ("plan: logical\nmembers:\n  - node: Join\n    role: join\n    when: {equiJoinKey: false}\n", "remove the line to drop the check"),
        ("plan: logical\nmembers:\n  - node: Join\n    role: join\n    when: {attributesOnly: true}\n", "check `attributesOnly` does not apply to `Join`"),
        ("plan: logical\nmembers:\n  - node: Join\n    role: join\n    when: {fastest: true}\n", "unknown check `fastest`"),
        ("plan: logical\nmembers:\n  - node: Project\n    role: passThrough\n", "no member has role `join`"),
        ("plan: logical\nmembers:\n" + VALID_JOIN + "    extra: 1\n", "unknown key `extra`"),
    ],
)
def test_broken_rules_name_the_file_and_the_problem(spark: SparkSession, text: str, problem: str) -> None:
    with pytest.raises(Exception) as failure:
        _parse_rules(spark, text)
    message = str(failure.value)
    assert "UMJoin rules file test.yaml" in message and problem in message, message


def test_repository_rules_parse(spark: SparkSession) -> None:
    _parse_rules(spark, (REPO_RULES / "batch.yaml").read_text())
    jvm = spark._jvm
    jvm.umjoin.spark.tsc.MemberPatterns.parse("streaming.yaml", (REPO_RULES / "streaming.yaml").read_text(), jvm.umjoin.spark.planning.PhysicalPatterns.vocabulary())


def _session_outcome(rules_dir: Path, query: str = "SELECT 1") -> subprocess.CompletedProcess[str]:
    """Starts a fresh Spark (own JVM) with spark.umjoin.rulesDir and prints the query's plan or the error."""
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from conftest import session_builder
        from umjoin import tpch
        try:
            spark = session_builder().config("spark.umjoin.rulesDir", {str(rules_dir)!r}).getOrCreate()
        except Exception as e:
            print("SESSION FAILED:", e)
            sys.exit(3)
        tpch.register(spark, tpch.generate(0.01))
        spark.conf.set("spark.sql.adaptive.enabled", "false")
        print(spark.sql({query!r})._jdf.queryExecution().executedPlan().toString())
        """
    )
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)


def test_broken_rules_file_fails_at_session_start(tmp_path: Path) -> None:
    (tmp_path / "batch.yaml").write_text("plan: logical\nmembers:\n  - node: Joinn\n    role: join\n")
    outcome = _session_outcome(tmp_path)
    assert outcome.returncode == 3, outcome.stdout + outcome.stderr
    assert f"UMJoin rules file {tmp_path / 'batch.yaml'}: member 1: unknown node `Joinn`" in outcome.stdout


def test_missing_rules_file_fails_at_session_start(tmp_path: Path) -> None:
    (tmp_path / "batch.yaml").write_text((REPO_RULES / "batch.yaml").read_text())
    outcome = _session_outcome(tmp_path)
    assert outcome.returncode == 3, outcome.stdout + outcome.stderr
    assert f"UMJoin rules file {tmp_path / 'streaming.yaml'} is missing" in outcome.stdout


def test_rules_dir_replaces_the_built_in_rules(tmp_path: Path) -> None:
    """Rules that admit only cross joins leave TPC-H Q5's inner joins to Spark."""
    (tmp_path / "batch.yaml").write_text("plan: logical\nmembers:\n  - node: Join\n    role: join\n    when: {joinType: [Cross]}\n")
    (tmp_path / "streaming.yaml").write_text((REPO_RULES / "streaming.yaml").read_text())
    outcome = _session_outcome(tmp_path, tpch.query_text(5))
    assert outcome.returncode == 0, outcome.stdout + outcome.stderr
    assert "BroadcastHashJoin" in outcome.stdout and "UMJoin" not in outcome.stdout


def test_missing_jar_says_how_to_build_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(umjoin, "_JAR", tmp_path / "absent.jar")
    with pytest.raises(FileNotFoundError, match="make build"):
        umjoin.jar_path()
    with pytest.raises(FileNotFoundError, match="make build"):
        umjoin.configure(SparkSession.builder)


def test_configure_keeps_jars_and_extensions_already_set() -> None:
    builder = SparkSession.builder.config("spark.jars", "/opt/other.jar").config("spark.sql.extensions", "other.Ext")
    umjoin.configure(builder, minInputs="4")
    assert builder._options["spark.jars"] == f"/opt/other.jar,{umjoin.jar_path()}"
    assert builder._options["spark.sql.extensions"] == f"other.Ext,{umjoin.EXTENSION_CLASS}"
    assert builder._options["spark.umjoin.minInputs"] == "4"
