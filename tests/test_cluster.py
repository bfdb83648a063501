"""UMJoin on a Spark cluster of separate executor JVMs (`local-cluster[2,1,1024]`, 127.0.0.1 only).

Each test runs one application of cluster_job.py in its own process (a Python process holds one
SparkContext, and the rest of the suite's is local[2]). Run these alone with `pytest -m cluster`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cluster_job import TPCH_SETTINGS

pytestmark = pytest.mark.cluster

JOB = Path(__file__).resolve().parent / "cluster_job.py"


def run_job(name: str, scratch: Path) -> dict[str, Any]:
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    outcome = subprocess.run([sys.executable, str(JOB), name, str(scratch)], capture_output=True, text=True, env=env, timeout=900)
    assert outcome.returncode == 0, outcome.stderr[-4000:]
    return json.loads(outcome.stdout.strip().splitlines()[-1])


def test_tpch_official_answers_on_two_executors(tmp_path: Path) -> None:
    result = run_job("tpch-answers", tmp_path)
    assert result["executor_pids"] == 2
    for name in TPCH_SETTINGS:
        assert result[name]["wrong"] == [], f"{name}: TPC-H queries differing from the official answers"
        assert result[name]["umjoins"] > 0, f"{name}: no query ran a UMJoin"
    assert "broadcast" in result["broadcast-memory"]["placements"] and "broadcast" in result["broadcast-rocksdb"]["placements"]
    assert "broadcast" not in result["partitioned-memory"]["placements"]
    assert result["partitioned-rocksdb"]["rocksdb_bytes"] > 0 and result["partitioned-memory"]["rocksdb_bytes"] == 0
    assert result["store_roots"], "RocksDB stores were not under the executors' local directories"
    # The cluster deletes those directories with the application (here, when its JVM has exited).
    assert list((tmp_path / "local").rglob("umjoin-stores")) == []


def test_streaming_restart_writes_every_row_once(tmp_path: Path) -> None:
    result = run_job("streaming-restart", tmp_path)
    assert result["streaming_umjoins"] == 1 and result["spark_joins"] == 0
    assert result["stopped_after_batch"] >= 1, "the first run was stopped before it committed a batch"
    assert result["same"] and result["written"] == result["expected"] > 0


def test_killed_executor_leaves_the_right_answer_and_no_store(tmp_path: Path) -> None:
    result = run_job("killed-executor", tmp_path)
    assert len(result["killed"]) == 1 and not result["killed_still_running"]
    # s(k, v): i % 97, i for i < 2000; t and u the same for i < 300; joined on k.
    small = [[i for i in range(300) if i % 97 == k] for k in range(97)]  # t and u's values of key k
    expected = sorted((sv, tv, uv) for sv in range(2000) for tv in small[sv % 97] for uv in small[sv % 97])
    assert result["umjoin"]
    assert [tuple(r) for r in result["rows"]] == expected
    assert result["stores_left"] == [], "stores of the killed executor were left on disk"
