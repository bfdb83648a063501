"""Spark Connect: what the package reads from a Connect server, whose JVM a client cannot reach.

The plan views and ``why_not`` read the server's ``explain("extended")``, with UMJoin's description
provider (``umjoin.spark.UMJoinDescription``) named in ``spark.sql.extendedExplainProviders`` for that
explain only; what needs the driver's JVM otherwise says so in one line.
"""

from __future__ import annotations

import contextlib
import io
import json
from typing import Any

from pyspark.errors import PySparkException
from pyspark.sql import DataFrame

from umjoin.local import temporary_conf

__all__ = ["SERVER_HINT", "classic_only", "description", "is_connect"]

#: How a Connect server gets UMJoin (the README's Spark Connect section).
SERVER_HINT = ('start the Spark Connect server with UMJoin: start-connect-server.sh --jars "$(umjoin jar)" '
               "--conf spark.sql.extensions=umjoin.spark.UMJoinExtensions (README, Spark Connect)")
_DESCRIPTION_CLASS = "umjoin.spark.UMJoinDescription"
_SECTION = "== Extended Information (UMJoin description) =="


def is_connect(value: object) -> bool:
    """Whether a DataFrame, session or streaming query belongs to a Spark Connect client."""
    return type(value).__module__.startswith("pyspark.sql.connect.")


def classic_only(value: object, what: str, instead: str) -> None:
    """Raises, naming what to do instead, when ``value`` is a Spark Connect client's."""
    if is_connect(value):
        raise NotImplementedError(f"{what} reads the driver's JVM, which a Spark Connect client cannot reach; {instead}")


def description(df: DataFrame) -> dict[str, Any]:
    """``{"plan": ..., "whyNot": [[join, reason], ...]}`` for ``df``'s physical plan, planned by the server."""
    printed = io.StringIO()
    try:
        with temporary_conf(df.sparkSession, {"spark.sql.extendedExplainProviders": _DESCRIPTION_CLASS}):
            with contextlib.redirect_stdout(printed):
                df.explain(mode="extended")
    except PySparkException as failure:
        if f"ClassNotFoundException) {_DESCRIPTION_CLASS}" not in str(failure):
            raise
        raise RuntimeError(f"The Spark Connect server has no UMJoin jar; {SERVER_HINT}") from None
    text = printed.getvalue()
    if _SECTION not in text:
        raise RuntimeError(f"The Spark Connect server's explain has no UMJoin description; {SERVER_HINT}")
    section = text.split(_SECTION, 1)[1].lstrip("\n")
    return json.loads(section.split("\n", 1)[0])
