"""What the randomised streaming suites draw: streams as users' data has them, and the watermarks Spark
gives their micro-batches.

A stream is its micro-batches of rows (one file each, test_streaming.write_batches); micro-batch b reads
file b of every stream that has one. On every input the suites draw NULL keys (some streams all NULL),
duplicate keys, streams without a row, empty micro-batches, and where there is an event time, rows
behind the watermark (late) and rows exactly at it. `watermarks` computes the watermark Spark evicts
with in each micro-batch, so that rows can be put exactly there; the suites check it against the
query's progress (`assert_watermarks`), and `features` says what a stream's rows hold, for the tests of
the generators.
"""

from __future__ import annotations

import datetime
import random
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any

from pyspark.sql.streaming import StreamingQuery

Row = tuple[Any, ...]
Batches = list[list[Row]]

EPOCH = datetime.datetime(1970, 1, 1)

NULL_KEYS = "NULL keys"
ALL_NULL = "every key NULL"
DUPLICATE_KEYS = "duplicate keys"
NO_ROWS = "no rows"
EMPTY_BATCH = "an empty micro-batch"
LATE = "late rows"
AT_WATERMARK = "rows at the watermark"
#: What every input of a suite with event times draws.
FEATURES = (NULL_KEYS, ALL_NULL, DUPLICATE_KEYS, NO_ROWS, EMPTY_BATCH, LATE, AT_WATERMARK)
#: Without a watermark no row is late or at it.
FEATURES_WITHOUT_EVENT_TIME = FEATURES[:5]
#: A static table has no micro-batches either.
TABLE_FEATURES = FEATURES[:4]


def millis(at: datetime.datetime) -> int:
    """A naive timestamp as Spark reads it from the suites' files (session time zone UTC), in ms since the epoch."""
    return (at - EPOCH) // datetime.timedelta(milliseconds=1)


def at_millis(ms: int) -> datetime.datetime:
    return EPOCH + datetime.timedelta(milliseconds=ms)


def null_share(rng: random.Random) -> float:
    """The share of an input's keys that are NULL: none, some, many, or all of them."""
    return rng.choice([0.0, 0.1, 0.1, 0.3, 1.0])


def key_drawer(rng: random.Random, domain: int, share: float) -> Callable[[], int | None]:
    """Keys from a domain small enough for duplicates, NULL in `share` of the rows."""
    if share == 0:  # (no draw for the NULLs: a generator without them draws the values it drew before)
        return lambda: rng.randrange(domain)
    return lambda: None if rng.random() < share else rng.randrange(domain)


def cut(rng: random.Random, rows: list[Row], cuts: int, empty: float = 0.25) -> Batches:
    """`rows` in order, cut at `cuts` random places into micro-batches, an empty one put in at a random place
    with probability `empty` (besides the empty ones equal cuts make)."""
    places = sorted(rng.randint(0, len(rows)) for _ in range(cuts))
    batches = [rows[a:b] for a, b in zip([0, *places], [*places, len(rows)])]
    if empty and rng.random() < empty:
        batches.insert(rng.randint(0, len(batches)), [])
    return batches


def watermarks(streams: dict[str, Batches], time: int, delays_ms: dict[str, int], policy: str = "min") -> list[int]:
    """Per micro-batch b, the watermark (ms) Spark evicts with in b, after the data's micro-batches one more
    (the batch a moved watermark runs without new rows). Spark's global watermark: after each micro-batch, each
    stream's latest event time so far less its delay (0 while it has brought no row; never moving back), the
    minimum of them (the default spark.sql.streaming.multipleWatermarkPolicy) or the maximum, never moving back.
    A micro-batch filters late rows with the watermark of the one before (`late_before`)."""
    choose = {"min": min, "max": max}[policy]
    count = max(len(batches) for batches in streams.values())
    latest: dict[str, int | None] = {name: None for name in streams}
    marks = [0]
    for b in range(count):
        for name, batches in streams.items():
            times = [millis(row[time]) for row in (batches[b] if b < len(batches) else []) if row[time] is not None]
            if times:
                candidate = max(times) - delays_ms[name]
                latest[name] = candidate if latest[name] is None else max(latest[name], candidate)  # type: ignore[type-var]
        marks.append(max(marks[-1], choose(0 if mark is None else mark for mark in latest.values())))
    return marks


def policy_for(streams: dict[str, Batches]) -> str:
    """The watermark policy a case runs with: Spark's default, the minimum of the streams' watermarks, unless a stream
    brings no row, whose watermark would hold every other one back for good (as a user would, the maximum then)."""
    return "max" if any(not any(batches) for batches in streams.values()) else "min"


def policy_settings(streams: dict[str, Batches]) -> dict[str, str]:
    return {"spark.sql.streaming.multipleWatermarkPolicy": policy_for(streams)}


def late_before(marks: Sequence[int], batch: int) -> int:
    """The watermark micro-batch `batch` drops late rows by: the one micro-batch `batch - 1` evicted with."""
    return marks[max(0, batch - 1)]


def put_at_watermarks(rng: random.Random, streams: dict[str, Batches], time: int, delays_ms: dict[str, int], share: float = 0.6,
                      policy: str = "min") -> None:
    """Into each stream with rows (with probability `share`), a copy of one of its rows at a micro-batch whose
    watermark is set, its event time exactly that watermark: the one the batch drops late rows by, or the one it
    evicts with. Such a row is at most the latest time less the delay, so the watermarks stay as they were."""
    marks = watermarks(streams, time, delays_ms, policy)
    for name, batches in streams.items():
        rows = [row for batch in batches for row in batch]
        candidates = [b for b in range(1, len(batches)) if marks[b] > 0]
        if not rows or not candidates or rng.random() >= share:
            continue
        b = rng.choice(candidates)
        at = rng.choice([late_before(marks, b), marks[b]])
        row = list(rng.choice(rows))
        row[time] = at_millis(at)
        batches[b].insert(rng.randint(0, len(batches[b])), tuple(row))


def features(batches: Batches, keys: Iterable[int], time: int | None = None, marks: Sequence[int] | None = None) -> set[str]:
    """What a stream's rows hold, over its key columns `keys` (a NULL in any; every row NULL in all of them;
    one value of a key in two rows) and, with its event time `time` and the micro-batches' watermarks,
    rows late or exactly at a watermark."""
    keys = list(keys)
    rows = [row for batch in batches for row in batch]
    found = set()
    if not rows:
        found.add(NO_ROWS)
    elif any(not batch for batch in batches):
        found.add(EMPTY_BATCH)
    if any(row[k] is None for row in rows for k in keys):
        found.add(NULL_KEYS)
    if all_null(batches, keys):
        found.add(ALL_NULL)
    for k in keys:
        values = [row[k] for row in rows if row[k] is not None]
        if len(values) > len(set(values)):
            found.add(DUPLICATE_KEYS)
    if time is not None and marks is not None:
        for b, batch in enumerate(batches):
            late, evicting = late_before(marks, b), marks[b]
            for row in batch:
                ms = millis(row[time])
                if late > 0 and ms <= late:
                    found.add(LATE)
                if ms in (late, evicting) and ms > 0:
                    found.add(AT_WATERMARK)
    return found


def all_null(batches: Batches, keys: Iterable[int]) -> bool:
    """Whether a stream has rows and every one of them is NULL in each of its key columns `keys`."""
    rows = [row for batch in batches for row in batch]
    return bool(rows) and all(row[k] is None for row in rows for k in keys)


def key_latest_row(batch: list[Row], time: int, keyed: Callable[[Row], Row]) -> None:
    """Replaces a micro-batch's latest row (by its event time `time`) with `keyed` of it: the row with its keys, so that
    no IS NOT NULL Spark pushes below the watermark changes the stream's latest event time (`seen_by_watermarks`)."""
    if batch:
        latest = max(range(len(batch)), key=lambda r: batch[r][time])
        batch[latest] = keyed(batch[latest])


def seen_by_watermarks(streams: dict[str, Batches], keys: Iterable[int], preserved: Collection[str] = ()) -> dict[str, Batches]:
    """The streams as Spark's watermarks see them. Spark infers IS NOT NULL of each column a join compares and pushes it
    below EventTimeWatermark: a stream whose every key is NULL moves its watermark no more than one without rows, unless
    no join filters it (`preserved`: an outer join's preserved stream). Holds where every other stream's latest row of
    each micro-batch has its keys (`key_latest_row`)."""
    keys = list(keys)
    return {name: [[] for _ in batches] if name not in preserved and all_null(batches, keys) else batches for name, batches in streams.items()}


def assert_watermarks(query: StreamingQuery, marks: Sequence[int]) -> None:
    """The watermarks the generator put rows at are the ones the query ran with (its progress, batch by batch)."""
    ran = {p["batchId"]: p["eventTime"].get("watermark") for p in query.recentProgress}
    for batch, mark in ran.items():
        if mark is not None and batch < len(marks):
            expected = at_millis(marks[batch]).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
            assert mark == expected, (batch, mark, expected, marks)


def missing(covered: dict[tuple[str, str], set[str]], wanted: dict[tuple[str, str], Sequence[str]]) -> dict[tuple[str, str], list[str]]:
    """Per (join type, side) `wanted`, the features no case drew there (`covered`: what the cases drew)."""
    return {where: lacking for where, need in wanted.items() if (lacking := [f for f in need if f not in covered.get(where, set())])}
