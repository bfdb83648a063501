"""UMJoin on a Spark cluster of separate executor JVMs (`local-cluster[2,1,1024]`, 127.0.0.1 only).

The tests read what one application of cluster_job.py, running all its jobs, observed (in a process
of its own: a Python process holds one SparkContext, and the rest of the suite's is local[2]).
Run these alone with `pytest -m cluster`.
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


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cluster")


@pytest.fixture(scope="module")
def jobs(scratch: Path) -> dict[str, Any]:
    """Every job's outcome, by name, from one application."""
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    outcome = subprocess.run([sys.executable, str(JOB), "all", str(scratch)], capture_output=True, text=True, env=env, timeout=1200)
    assert outcome.returncode == 0, outcome.stderr[-4000:]
    return json.loads(outcome.stdout.strip().splitlines()[-1])


def test_tpch_official_answers_on_two_executors(jobs: dict[str, Any], scratch: Path) -> None:
    result = jobs["tpch-answers"]
    assert result["executor_pids"] == 2
    for name in TPCH_SETTINGS:
        assert result[name]["wrong"] == [], f"{name}: the TPC-H query differs from the official answer"
        assert result[name]["umjoins"] > 0, f"{name}: the query ran no UMJoin"
    assert "broadcast" in result["broadcast-memory"]["placements"] and "broadcast" in result["broadcast-rocksdb"]["placements"]
    assert "broadcast" not in result["partitioned-memory"]["placements"]
    assert result["partitioned-rocksdb"]["rocksdb_bytes"] > 0 and result["partitioned-memory"]["rocksdb_bytes"] == 0
    assert result["store_roots"], "RocksDB stores were not under the executors' local directories"
    # The cluster deletes those directories with the application (here, when its JVM has exited).
    assert list((scratch / "local").rglob("umjoin-stores")) == []


def test_streaming_restart_writes_every_row_once(jobs: dict[str, Any]) -> None:
    result = jobs["streaming-restart"]
    assert result["streaming_umjoins"] == 1 and result["spark_joins"] == 0
    assert result["stopped_after_batch"] >= 1, "the first run was stopped before it committed a batch"
    assert result["same"] and result["written"] == result["expected"] > 0


def test_killed_executor_leaves_the_right_answer_and_no_store(jobs: dict[str, Any]) -> None:
    result = jobs["killed-executor"]
    assert len(result["killed"]) == 1 and not result["killed_still_running"]
    # s(k, v): i % 97, i for i < 2000; t and u the same for i < 300; joined on k.
    small = [[i for i in range(300) if i % 97 == k] for k in range(97)]  # t and u's values of key k
    expected = sorted((sv, tv, uv) for sv in range(2000) for tv in small[sv % 97] for uv in small[sv % 97])
    assert result["umjoin"]
    assert [tuple(r) for r in result["rows"]] == expected
    assert result["stores_left"] == [], "stores of the killed executor were left on disk"
