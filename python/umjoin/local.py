"""A local Spark session with UMJoin, as the CLI, the benchmarks and the tests use it."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from pyspark.sql import SparkSession

from umjoin import configure

__all__ = ["local_builder", "temporary_conf"]


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
