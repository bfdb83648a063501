"""Writes tests/checkpoints/rocksdb-separate-stores: a RocksDB checkpoint of a StreamingUMJoin whose inputs each keep
a store of their own (layout format 3), as UMJoin wrote it before one store per partition (commit 678d4e5).

Run with that commit's package and jar first on the path (a worktree of it, its jar built there):

    git worktree add /tmp/old 678d4e5 && (cd /tmp/old && python jvm-shim/build_jar.py python/umjoin/jars/umjoin-spark.jar)
    PYTHONPATH=/tmp/old/python:tests python tests/checkpoints/make_rocksdb_separate_stores.py

The checkpoint's file-source logs name the data files by absolute path: written here under DATA
(test_streaming.SEPARATE_STORES_DATA), which the test replaces with its own directory.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from pyspark.sql import SparkSession

from umjoin.local import local_builder

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_streaming import (ROCKSDB, SEPARATE_STORES as FIXTURE, SEPARATE_STORES_BEFORE as BEFORE,  # noqa: E402
                            SEPARATE_STORES_COLUMNS as COLUMNS, SEPARATE_STORES_DATA, chain,
                            separate_stores_batches as batches, sorted_rows, stream, write_batches)

DATA = Path(SEPARATE_STORES_DATA)


def main() -> None:
    shutil.rmtree(DATA, ignore_errors=True)
    shutil.rmtree(FIXTURE, ignore_errors=True)
    for name, rows in batches().items():
        write_batches(DATA / name, COLUMNS[name], rows[:BEFORE])
    spark = local_builder("fixture").config("spark.sql.shuffle.partitions", "2").getOrCreate()
    for key, value in ROCKSDB.items():
        spark.conf.set(key, value)
    query = (chain({n: stream(spark, DATA / n, COLUMNS[n]) for n in "xyz"}).writeStream.format("memory")
             .queryName("before").option("checkpointLocation", str(DATA / "ck")).trigger(availableNow=True).start())
    query.awaitTermination()
    plan = query._jsq.streamingQuery().lastExecution().executedPlan().toString()
    assert "StreamingUMJoin" in plan, plan
    rows = sorted_rows(spark.table("before"))
    spark.stop()
    FIXTURE.mkdir(parents=True)
    shutil.copytree(DATA / "ck", FIXTURE / "ck")
    for name in "xyz":
        shutil.copytree(DATA / name, FIXTURE / name)
    (FIXTURE / "rows-before.json").write_text(json.dumps(rows))
    print(f"wrote {FIXTURE}: {len(rows)} rows put out before")


if __name__ == "__main__":
    main()
