"""UMJoin for Spark: multi-way joins that keep state only for their inputs.

Turn it on for a session with :func:`configure`::

    from pyspark.sql import SparkSession
    import umjoin
    spark = umjoin.configure(SparkSession.builder.master("local[2]")).getOrCreate()
"""

from __future__ import annotations

import os
from pathlib import Path

from pyspark.sql import SparkSession

__all__ = ["EXPLAIN_CLASS", "EXTENSION_CLASS", "configure", "jar_path"]

EXTENSION_CLASS = "umjoin.spark.UMJoinExtensions"
#: Says in explain("extended") why joins stay Spark's (Spark's spark.sql.extendedExplainProviders).
EXPLAIN_CLASS = "umjoin.spark.UMJoinExplain"
_JAR = Path(__file__).parent / "jars" / "umjoin-spark.jar"


def jar_path() -> str:
    """The UMJoin jar built for the installed pyspark (the package build or ``make build`` creates it)."""
    if not _JAR.is_file():
        raise FileNotFoundError(
            f"UMJoin jar not found at {_JAR}. `pip install` of the package builds it; in an editable "
            "checkout run `make build` (both compile the Scala shim with the compiler inside the installed pyspark)."
        )
    return str(_JAR)


def _append(current: str | None, value: str) -> str:
    """Adds ``value`` to a comma-separated Spark setting unless it is already there."""
    items = [item for item in (current or "").split(",") if item]
    return ",".join(items if value in items else [*items, value])


def configure(builder: SparkSession.Builder, **settings: str) -> SparkSession.Builder:
    """Adds the UMJoin jar, extension and explain provider to ``builder``, keeping jars, extensions and
    providers already set.

    ``settings`` are UMJoin settings without the ``spark.umjoin.`` prefix, e.g.
    ``configure(builder, minInputs="4")``.
    """
    options = builder._options  # the settings given to this builder so far
    if options.get("spark.remote") or os.environ.get("SPARK_REMOTE"):
        from umjoin.connect import SERVER_HINT  # (here: umjoin.connect imports this module)

        raise ValueError(f"umjoin.configure sets up the driver of a classic session, and a Spark Connect client's is the server: {SERVER_HINT}")
    builder.config("spark.jars", _append(options.get("spark.jars"), jar_path()))
    builder.config("spark.sql.extensions", _append(options.get("spark.sql.extensions"), EXTENSION_CLASS))
    builder.config("spark.sql.extendedExplainProviders", _append(options.get("spark.sql.extendedExplainProviders"), EXPLAIN_CLASS))
    for key, value in settings.items():
        builder.config(f"spark.umjoin.{key}", value)
    return builder
