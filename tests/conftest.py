"""Shared fixtures: one Spark session (local[2]) with UMJoin for the whole run, and TPC-H SF 0.01."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Iterator

import pytest
from pyspark.sql import SparkSession

from umjoin import tpch
from umjoin.local import local_builder

#: Python workers run the interpreter the tests run, as in an activated virtualenv. Spark's default, `python3` on
#: PATH, is the system's Python when the suite runs as `.venv/bin/python -m pytest`: without pandas and pyarrow,
#: which the virtualenv has (Spark Connect's client needs them), and with which pyspark plans Arrow-optimized UDFs.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

TPCH_SF = 0.01
#: Each TPC-H query's UMJoin groups under default settings (AQE off), checked by test_tpch.
GOLDEN = Path(__file__).parent / "golden" / "tpch_umjoin_groups.json"
#: The TPC-H queries with a UMJoin: the tests of backends, probe orders and clusters run these
#: (the others never reach a store or a probe order: test_tpch checks they get no UMJoin in any of its settings
#: and their answers in Spark's default one).
UMJOIN_TPCH_QUERIES = tuple(int(q[1:]) for q, groups in json.loads(GOLDEN.read_text()).items() if groups)


def session_builder() -> SparkSession.Builder:
    """The test session: local[2], 4 shuffle partitions, no UI, 3g of driver memory; UMJoin and the testkit jar configured.

    The whole suite runs in it, hundreds of queries with broadcasts. Spark frees a finished query's
    broadcast blocks only once a garbage collection has found its broadcast unreachable; in one run the
    heap held 2.7 GB after a full collection (1.1 GB once Spark's cleaner had run) and a TPC-DS
    query's broadcast failed for want of memory. A collection every minute keeps that bounded.

    Spark's cache of generated classes holds 2000 instead of 100: one streaming test, UMJoin's run and
    Spark's chained joins' beside it, generates several hundred, and with 100 each micro-batch compiled
    again what the one before had (a random chain's test took 1.4x as long).

    UMJoin converts groups whose joins Spark would all broadcast (`spark.umjoin.convertBroadcastJoins`, off by
    default: such a group stays Spark's). At SF 0.01 every TPC-H table is that small, and the suite is about UMJoin's
    answers and plans with broadcast inputs too; the tests of the default set it back (test_why_not, test_aqe,
    test_tpch's `defaults` setting)."""
    from bench import with_testkit  # (imported here: scripts that import this module run without the clone on their path)

    return (with_testkit(local_builder("umjoin-tests", driver_memory="3g")).config("spark.cleaner.periodicGC.interval", "1min")
            .config("spark.sql.codegen.cache.maxEntries", "2000").config("spark.umjoin.convertBroadcastJoins", "true"))


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = session_builder().getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def tpch_data(spark: SparkSession) -> Path:
    directory = tpch.generate(TPCH_SF)
    tpch.register(spark, directory)
    return directory



def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The slow whole-system tests (wheel build, cluster) run last, so a failure elsewhere shows first."""
    items.sort(key=lambda item: any(item.get_closest_marker(m) for m in ("packaging", "cluster")))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--event-time-seeds", default=None,
                     help="run seeds 0..N-1 of the randomised event-time streaming suite (test_streaming_event_time.py) instead of its chosen seeds")
