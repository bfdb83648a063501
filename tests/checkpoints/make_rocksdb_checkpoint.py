"""Writes one of the RocksDB checkpoints of test_streaming.OLDER_CHECKPOINTS: a StreamingUMJoin's state as an earlier
version of UMJoin kept it (rocksdb-separate-stores: layout format 3, a store per input and index, commit 678d4e5;
rocksdb-column-families: layout format 4, one store per partition with an entry per row, commit df2ddcc).

Run with that commit's package and jar first on the path (a worktree of it, its jar built there):

    git worktree add /tmp/old <commit> && (cd /tmp/old && python jvm-shim/build_jar.py python/umjoin/jars/umjoin-spark.jar)
    PYTHONPATH=/tmp/old/python:tests python tests/checkpoints/make_rocksdb_checkpoint.py <fixture>

The checkpoint's file-source logs name the data files by absolute path: written here under DATA
(test_streaming.OLDER_CHECKPOINT_DATA), which the test replaces with its own directory.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from pyspark.sql import SparkSession

from umjoin.local import local_builder

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_streaming import (OLDER_CHECKPOINT_BEFORE as BEFORE, OLDER_CHECKPOINT_COLUMNS as COLUMNS,  # noqa: E402
                            OLDER_CHECKPOINT_DATA, OLDER_CHECKPOINTS, ROCKSDB, chain, older_checkpoint,
                            older_checkpoint_batches as batches, sorted_rows, stream, write_batches)

DATA = Path(OLDER_CHECKPOINT_DATA)


def main(fixture: str) -> None:
    if fixture not in OLDER_CHECKPOINTS:
        raise SystemExit(f"usage: make_rocksdb_checkpoint.py {{{','.join(OLDER_CHECKPOINTS)}}}")
    target = older_checkpoint(fixture)
    shutil.rmtree(DATA, ignore_errors=True)
    shutil.rmtree(target, ignore_errors=True)
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
    target.mkdir(parents=True)
    shutil.copytree(DATA / "ck", target / "ck")
    for name in "xyz":
        shutil.copytree(DATA / name, target / name)
    (target / "rows-before.json").write_text(json.dumps(rows))
    print(f"wrote {target}: {len(rows)} rows put out before")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "")
