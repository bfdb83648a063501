"""A StreamingUMJoin's state read back per input (`spark.read.format("umjoin-state")`), against the rows each
input must hold, computed from the data written: without watermarks a chain of inner joins keeps every row
whose join keys are all set (Spark's optimizer drops rows with a NULL join key before the joins)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from test_streaming import ROCKSDB, SPARK_JOINS, chain, nulls_first, run_to_end, stream, write_batches
from umjoin.local import temporary_conf

COLUMNS = {n: f"{n}_k BIGINT, {n}_j BIGINT, {n}_v BIGINT" for n in "xyz"}
#: The key columns each input of `chain` joins on: x on k, y on k and j, z on j.
JOIN_KEYS = {"x": (0,), "y": (0, 1), "z": (1,)}


def _data() -> dict[str, list[list[tuple]]]:  # type: ignore[type-arg]
    """Three micro-batches per stream (the second empty for z): keys NULL now and then, duplicate rows."""
    def row(n: str, b: int, i: int) -> tuple:  # type: ignore[type-arg]
        k = None if (i + b + ord(n)) % 5 == 0 else (i + b) % 3
        j = None if (i * 7 + ord(n)) % 6 == 0 else i % 2
        return (k, j, b * 100 + i % 4)  # i % 4: rows i and i + 4 of a batch may be equal
    return {n: [[] if (n, b) == ("z", 1) else [row(n, b, i) for i in range(8)] for b in range(3)] for n in "xyz"}


def _run(spark: SparkSession, tmp_path: Path, settings: dict[str, str]) -> Path:
    data = _data()
    for name, batches in data.items():
        write_batches(tmp_path / name, COLUMNS[name], batches)
    with temporary_conf(spark, {"spark.sql.shuffle.partitions": "2", **settings}):
        frames = {n: stream(spark, tmp_path / n, COLUMNS[n]) for n in "xyz"}
        run_to_end(chain(frames), f"state_{tmp_path.name}", tmp_path / "ck")
    return tmp_path / "ck"


@pytest.mark.parametrize("provider", ["hdfs", "rocksdb"])
def test_each_inputs_rows_read_back_are_the_rows_it_holds(spark: SparkSession, tmp_path: Path, provider: str) -> None:
    checkpoint = _run(spark, tmp_path, ROCKSDB if provider == "rocksdb" else {})
    data = _data()
    for position, name in enumerate("xyz"):
        read = spark.read.format("umjoin-state").option("input", name).load(str(checkpoint))
        assert read.columns == [f"{name}_k", f"{name}_j", f"{name}_v", "partition_id"]
        found = read.collect()
        expected = sorted((r for batch in data[name] for r in batch if all(r[c] is not None for c in JOIN_KEYS[name])),
                          key=nulls_first)
        assert sorted((tuple(r)[:3] for r in found), key=nulls_first) == expected and expected, name
        assert {r.partition_id for r in found} <= {0, 1}, name
        by_position = spark.read.format("umjoin-state").option("input", str(position)).load(str(checkpoint))
        assert sorted(map(tuple, by_position.collect()), key=nulls_first) == sorted(map(tuple, found), key=nulls_first)


def test_what_the_reader_cannot_read_it_names_with_the_fix(spark: SparkSession, tmp_path: Path) -> None:
    umjoin = _run(spark, tmp_path / "umjoin", {})
    sparks = _run(spark, tmp_path / "sparks", SPARK_JOINS)
    cases = [
        ({"input": "w"}, umjoin, "operator 0 has no input w; its inputs: x, y, z"),
        ({}, umjoin, "name the input to read with option input: one of x, y, z"),
        ({"input": "x", "operatorId": "1"}, umjoin, "operator 1 of .* is not a StreamingUMJoin; its StreamingUMJoins: 0"),
        ({"input": "x"}, sparks, "holds no StreamingUMJoin state"),
        ({"input": "x", "batchId": "first"}, umjoin, "batchId must be a micro-batch number, not first"),
    ]
    for options, checkpoint, message in cases:
        with pytest.raises(Exception, match=message):
            spark.read.format("umjoin-state").options(**options).load(str(checkpoint)).collect()


def test_sparks_state_metadata_names_the_operator_and_each_of_its_stores(spark: SparkSession, tmp_path: Path) -> None:
    """`spark.read.format("state-metadata")`: operator 0 is umJoin, with its layout-format entry (`default`) and the
    stores its partitions keep, as found on disk, each over the query's 2 partitions."""
    checkpoint = _run(spark, tmp_path, {})
    on_disk = sorted(p.name for p in (checkpoint / "state" / "0" / "0").iterdir() if p.is_dir() and not p.name.startswith("_"))
    metadata = spark.read.format("state-metadata").load(str(checkpoint)).collect()
    assert {(r.operatorId, r.operatorName) for r in metadata} == {(0, "umJoin")}
    assert sorted(r.stateStoreName for r in metadata) == sorted(["default", *on_disk]) and len(on_disk) >= 3, (metadata, on_disk)
    assert {r.numPartitions for r in metadata} == {2}
