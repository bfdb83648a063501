"""How the benchmarks check that runs put out the same rows: as multisets, not by row counts.

A run's output is fingerprinted by its row count and an order-independent hash: the sum, as
DECIMAL(38,0), of every row's 64-bit hash (a sum of 64-bit values, exact where a BIGINT sum would
overflow and fail under ANSI mode). Equal multisets give equal fingerprints in any order and any
cut into micro-batches (the fingerprint of a union is the sum of its parts'); a missing, extra or
duplicated row, or a changed value, changes the hash (up to a collision of the sums).

The row hash is Spark's ``xxhash64`` over the row's NULL masks, then its values. ``xxhash64`` skips
NULL arguments, so over the values alone (1, NULL) and (NULL, 1) hash alike; the masks (a BIGINT per
63 columns, bit k set where column k is NULL), always hashed and first, say which values follow, so
the hashed sequence identifies the row. One BIGINT per 63 columns rather than a flag per column: the
hash is computed inside the timed queries, and that keeps it cheap.

Streaming runs observe the aggregates (``DataFrame.observe``: per micro-batch, in the progress's
``observedMetrics``), batch runs aggregate their result; either way both sides of a comparison
compute them alike, as part of the query measured.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

__all__ = ["COMPARED", "aggregates", "digest", "equal", "fingerprint", "fingerprint_of", "null_masks", "observed", "observed_fingerprint",
           "observed_output", "row_hash", "shown", "union"]

#: What the benchmarks' notes say they compare.
COMPARED = ("outputs compared as multisets: an order-independent hash of every row (the sum, as DECIMAL(38,0), of each row's "
            "xxhash64 over its columns' NULL flags and values) and the row count")
#: The name of the observed metrics in a streaming query's progress.
OBSERVED = "output"
#: Flags per mask: a BIGINT's bits, less its sign.
MASK_BITS = 63


def null_masks(columns: Sequence[Column]) -> list[Column]:
    """The columns' NULL flags packed into BIGINTs: bit k of mask m is set where column ``MASK_BITS * m + k`` is NULL."""
    def mask(part: Sequence[Column]) -> Column:
        return functools.reduce(Column.bitwiseOR, [F.shiftleft(c.isNull().cast("bigint"), k) for k, c in enumerate(part)])

    return [mask(columns[start:start + MASK_BITS]) for start in range(0, len(columns), MASK_BITS)]


def row_hash(columns: Sequence[Column]) -> Column:
    """A row's 64-bit hash that tells where its NULLs are: xxhash64 over the NULL masks, then the values."""
    return F.xxhash64(*null_masks(columns), *columns)


def aggregates(df: DataFrame) -> list[Column]:
    """The fingerprint of `df`'s rows as two aggregates: ``rows`` and ``hash``."""
    columns = [F.col(f"`{name}`") for name in df.columns]
    return [F.count(F.lit(1)).alias("rows"), F.sum(row_hash(columns).cast("decimal(38,0)")).alias("hash")]


def fingerprint(row: Any) -> dict[str, int]:
    """{"rows", "hash"} of a row (or mapping) of :func:`aggregates` (a sum over no rows is NULL: 0)."""
    if isinstance(row["hash"], float):  # (a progress's JSON read with a float would have lost the sum's low digits)
        raise TypeError(f"an output hash read as the float {row['hash']!r}: its digits are lost")
    return {"rows": int(row["rows"]), "hash": int(row["hash"] or 0)}


def fingerprint_of(df: DataFrame) -> dict[str, int]:
    """The fingerprint of batch DataFrame `df`'s rows, computed by Spark."""
    return fingerprint(df.agg(*aggregates(df)).collect()[0])


def observed(df: DataFrame) -> DataFrame:
    """Streaming `df` with its fingerprint observed per micro-batch (read back by :func:`observed_fingerprint`)."""
    return df.observe(OBSERVED, *aggregates(df))


def observed_fingerprint(progress: Any) -> dict[str, int] | None:
    """One micro-batch's fingerprint from its progress (a StreamingQueryProgress or mapping); None where the batch reported none."""
    metrics = progress["observedMetrics"].get(OBSERVED)
    return fingerprint(metrics) if metrics is not None else None


def observed_output(progress: Sequence[Any]) -> dict[str, int] | None:
    """A streaming run's fingerprint from its progress (its micro-batches' together); None where the sink wrote rows that
    the observed metrics missed (a batch without them), so that an incomplete fingerprint never passes for the output's."""
    total = union(part for part in map(observed_fingerprint, progress) if part)
    written = [p["sink"].get("numOutputRows", -1) for p in progress]
    return None if all(w >= 0 for w in written) and total["rows"] != sum(written) else total


def union(parts: Iterable[Mapping[str, int]]) -> dict[str, int]:
    """The fingerprint of the parts' rows together (micro-batches', a sweep's): the sums of theirs."""
    total = {"rows": 0, "hash": 0}
    for part in parts:
        total = {"rows": total["rows"] + part["rows"], "hash": total["hash"] + part["hash"]}
    return total


def equal(output: Mapping[str, int] | None, other: Mapping[str, int] | None) -> bool:
    """Whether two runs put out the same multiset of rows; never where either has no fingerprint (a failed run)."""
    return output is not None and other is not None and output == other


def shown(output: Mapping[str, int] | None) -> str:
    """A fingerprint's hash as a report shows it ("-": none, e.g. a failed run)."""
    return "-" if output is None else str(output["hash"])


def digest(rows: Iterable[Sequence[Any]]) -> str:
    """An order-independent digest of rows already collected (a TPC-H answer): SHA-256 over their sorted reprs."""
    return hashlib.sha256("\n".join(sorted(repr(tuple(r)) for r in rows)).encode()).hexdigest()
