"""A local Spark session with UMJoin, as the CLI, the benchmarks and the tests use it."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from pyspark.sql import SparkSession

from umjoin import configure

__all__ = ["LOCAL_CHECKPOINTS", "local_builder", "temporary_conf"]

#: Streaming checkpoints through Hadoop's FileSystem API: its FileContext API (Spark's default)
#: starts a `readlink` process for every rename on the local file system (pyspark has no native
#: Hadoop library), about a third of a small streaming query's time.
LOCAL_CHECKPOINTS = (
    "spark.sql.streaming.checkpointFileManagerClass",
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager",
)


def local_builder(
    app_name: str = "umjoin",
    cores: int = 2,
    shuffle_partitions: int = 4,
    driver_memory: str = "2g",
) -> SparkSession.Builder:
    """``local[cores]``, few shuffle partitions, no UI or progress bars, UTC; UMJoin configured."""
    builder = (
        SparkSession.builder.master(f"local[{cores}]")
        .appName(app_name)
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.default.parallelism", str(shuffle_partitions))
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", driver_memory)
        .config("spark.sql.session.timeZone", "UTC")
        .config(*LOCAL_CHECKPOINTS)
    )
    return configure(builder)


@contextmanager
def temporary_conf(spark: SparkSession, settings: dict[str, str]) -> Iterator[None]:
    """Sets session settings for a block and restores the previous values after it."""
    previous = {key: spark.conf.get(key, None) for key in settings}
    for key, value in settings.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, value in previous.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)
