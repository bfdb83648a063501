"""Ad attribution over four event-time streams, with UMJoin and with Spark's own joins.

Impressions join profile updates on the user id; clicks join impressions on the ad and the user
within an hour after the impression; conversions join clicks on the click id within two hours; a
static ``ads`` table gives the campaign. Every stream has a 10-minute watermark and arrives as JSON
files, one per micro-batch, with rows arriving late, duplicated, or with a NULL key.

Spark accepts a stream-stream join only when each side has one event-time column. As users write it,
each stream keeps a plain copy of its event time (taken before ``withWatermark``, so it carries no
watermark) and the watermarked column is dropped once no later join's time range needs it.

``--profile bounded`` joins a profile update only within two hours before the impression;
``unbounded`` (the default) attaches any update of the user, the common way to enrich with a profile.

Run it (it writes data and results under the directory given)::

    python examples/ad_attribution.py /tmp/ads --profile unbounded

It runs the query twice into Parquet file sinks with checkpoints, UMJoin on and off, and prints the
rows of each, the joins of UMJoin's plan, the state rows each run keeps at the end, and whether
every micro-batch wrote the same rows.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

STREAMS = {
    "impressions": "imp_id BIGINT, user_id BIGINT, ad_id BIGINT, imp_time TIMESTAMP",
    "profiles": "p_user_id BIGINT, segment STRING, prof_time TIMESTAMP",
    "clicks": "click_id BIGINT, c_user_id BIGINT, c_ad_id BIGINT, click_time TIMESTAMP",
    "conversions": "conv_id BIGINT, cv_click_id BIGINT, amount DOUBLE, conv_time TIMESTAMP",
}
MICRO_BATCHES = 12
START = datetime.datetime(2026, 3, 1, 8, 0)


def generate(directory: Path, seed: int = 1, micro_batches: int = MICRO_BATCHES) -> None:
    """One JSON file per stream and micro-batch (event time advancing 20 minutes a batch), and the ads table."""
    rng = random.Random(seed)
    rows: dict[str, list[list[dict[str, object]]]] = {name: [[] for _ in range(micro_batches)] for name in STREAMS}

    def key(value: int) -> int | None:
        return None if rng.random() < 0.02 else value

    def at(batch: int, minutes: float) -> str:
        return (START + datetime.timedelta(minutes=20 * batch + minutes)).isoformat()

    click_id = 0
    for b in range(micro_batches):
        for i in range(rng.randint(25, 35)):
            imp = {"imp_id": 1000 * b + i, "user_id": key(rng.randrange(12)), "ad_id": key(rng.randrange(6)),
                   "imp_time": at(b, rng.uniform(0, 20))}
            rows["impressions"][b].append(imp)
            if rng.random() < 0.5:  # a click within the hour, arriving up to two batches later
                click_id += 1
                shown = datetime.datetime.fromisoformat(str(imp["imp_time"]))
                clicked = shown + datetime.timedelta(minutes=rng.uniform(0, 70))
                arrives = min(micro_batches - 1, b + rng.randint(0, 2))
                click = {"click_id": click_id, "c_user_id": imp["user_id"], "c_ad_id": imp["ad_id"], "click_time": clicked.isoformat()}
                rows["clicks"][arrives].append(click)
                if rng.random() < 0.6:  # a conversion within two hours of the click
                    converted = clicked + datetime.timedelta(minutes=rng.uniform(0, 130))
                    rows["conversions"][min(micro_batches - 1, arrives + rng.randint(0, 3))].append(
                        {"conv_id": click_id, "cv_click_id": key(click_id), "amount": round(rng.uniform(1, 90), 2),
                         "conv_time": converted.isoformat()})
        for _ in range(rng.randint(2, 5)):
            # Profile updates, some of them far behind the watermark (a device syncing late).
            behind = rng.uniform(120, 600) if b > 2 and rng.random() < 0.3 else rng.uniform(-20, 0)
            rows["profiles"][b].append({"p_user_id": key(rng.randrange(12)), "segment": rng.choice("abc"),
                                        "prof_time": at(b, behind + 20)})
        if b > 3:  # late rows and duplicates in every stream
            for name in STREAMS:
                earlier = [r for bb in range(b - 3) for r in rows[name][bb]]
                if earlier:
                    rows[name][b].extend(rng.sample(earlier, min(2, len(earlier))))
    for name, batches in rows.items():
        for b, batch in enumerate(batches):
            path = directory / name / f"part-{b:03d}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(json.dumps(r) + "\n" for r in batch))
            # A file stream reads files in the order of their modification times: dated as the batch order.
            os.utime(path, (1_000_000 + b, 1_000_000 + b))
    ads = directory / "ads" / "ads.json"
    ads.parent.mkdir(parents=True, exist_ok=True)
    ads.write_text("".join(json.dumps({"ad_id": a, "campaign": f"campaign-{a % 3}"}) + "\n" for a in range(6)))


def attribution(spark: SparkSession, directory: Path, profile: str = "unbounded") -> DataFrame:
    """The attribution query as Spark accepts it: one event-time column per join side."""
    def read(name: str, time: str, copy: str) -> DataFrame:
        frame = spark.readStream.schema(STREAMS[name]).option("maxFilesPerTrigger", 1).json(str(directory / name))
        return frame.withColumn(copy, F.col(time)).withWatermark(time, "10 minutes")

    impressions = read("impressions", "imp_time", "imp_at")
    profiles = read("profiles", "prof_time", "profile_at")
    clicks = read("clicks", "click_time", "click_at")
    conversions = read("conversions", "conv_time", "conv_at")
    ads = spark.read.schema("ad_id BIGINT, campaign STRING").json(str(directory / "ads"))

    with_profile = F.col("user_id") == F.col("p_user_id")
    if profile == "bounded":
        with_profile &= F.col("prof_time").between(F.col("imp_time") - F.expr("INTERVAL 2 HOURS"), F.col("imp_time"))
    elif profile != "unbounded":
        raise ValueError(f"profile must be 'bounded' or 'unbounded', not {profile!r}")
    clicked = ((F.col("c_ad_id") == F.col("ad_id")) & (F.col("c_user_id") == F.col("user_id"))
               & F.col("click_time").between(F.col("imp_time"), F.col("imp_time") + F.expr("INTERVAL 1 HOUR")))
    converted = ((F.col("cv_click_id") == F.col("click_id"))
                 & F.col("conv_time").between(F.col("click_time"), F.col("click_time") + F.expr("INTERVAL 2 HOURS")))
    return (impressions.join(profiles, with_profile).drop("prof_time")
            .join(clicks, clicked).drop("imp_time")
            .join(conversions, converted).drop("click_time", "conv_time")
            .join(ads, "ad_id")
            .select("campaign", "imp_id", "user_id", "segment", "click_id", "conv_id", "amount",
                    "imp_at", "profile_at", "click_at", "conv_at"))


def run(spark: SparkSession, query: DataFrame, out: Path) -> StreamingQuery:
    """The query into a Parquet file sink with its checkpoint beside it, every available micro-batch."""
    running = (query.writeStream.format("parquet").option("path", str(out / "rows"))
               .option("checkpointLocation", str(out / "checkpoint")).trigger(availableNow=True).start())
    running.awaitTermination()
    return running


def rows_by_batch(spark: SparkSession, out: Path) -> dict[int, list[tuple[object, ...]]]:
    """The rows of each micro-batch that wrote any to the file sink, as its log (``_spark_metadata``) lists the
    files (a micro-batch without new data that Spark runs to move a watermark on writes none for inner joins)."""
    log = out / "rows" / "_spark_metadata"
    batches: dict[int, list[tuple[object, ...]]] = {}
    # One log file per micro-batch, named by its id (a compaction every 10 batches lists the earlier ones too: `<id>.compact`).
    entries = sorted((p for p in log.iterdir() if p.name.split(".")[0].isdigit()), key=lambda p: int(p.name.split(".")[0]))
    listed: set[str] = set()
    for entry in entries:
        files = [json.loads(line)["path"] for line in entry.read_text().splitlines()[1:] if line.strip()]
        new = [f for f in files if f not in listed]
        listed.update(new)
        rows = sorted((tuple(r) for r in spark.read.parquet(*new).collect()), key=repr) if new else []
        if rows:
            batches[int(entry.name.split(".")[0])] = rows
    return batches


def state_rows(query: StreamingQuery) -> int:
    """The state rows the query's stateful operators keep after its last micro-batch."""
    return sum(op["numRowsTotal"] for op in query.lastProgress["stateOperators"])


@dataclass
class Comparison:
    """The query run with UMJoin on and off: each run's rows per micro-batch, state rows at the end, and the plan with UMJoin."""
    rows_on: dict[int, list[tuple[object, ...]]]
    rows_off: dict[int, list[tuple[object, ...]]]
    state_on: int
    state_off: int
    plan_on: str


def compare(spark: SparkSession, directory: Path, profile: str) -> Comparison:
    """Runs the attribution over the data under ``directory/data`` with UMJoin on and off (``directory/umjoin-<on|off>``)."""
    from umjoin.local import temporary_conf

    runs = {}
    for setting in ("on", "off"):
        out = directory / f"umjoin-{setting}"
        shutil.rmtree(out, ignore_errors=True)
        with temporary_conf(spark, {"spark.umjoin.enabled": str(setting == "on").lower()}):
            runs[setting] = (run(spark, attribution(spark, directory / "data", profile), out), rows_by_batch(spark, out))
    on, off = runs["on"], runs["off"]
    return Comparison(on[1], off[1], state_rows(on[0]), state_rows(off[0]),
                      on[0]._jsq.streamingQuery().lastExecution().executedPlan().toString())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--profile", choices=["bounded", "unbounded"], default="unbounded")
    args = parser.parse_args()
    import umjoin

    spark = umjoin.configure(SparkSession.builder.master("local[2]").config("spark.sql.shuffle.partitions", "4")).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    shutil.rmtree(args.directory / "data", ignore_errors=True)
    generate(args.directory / "data")
    result = compare(spark, args.directory, args.profile)
    joins = sorted({line.strip(" +-:*()0123456789").split(" ")[0] for line in result.plan_on.splitlines() if "Join" in line})
    print(f"UMJoin on:  {sum(map(len, result.rows_on.values()))} rows, {result.state_on} state rows at the end; plan: {', '.join(joins)}")
    print(f"UMJoin off: {sum(map(len, result.rows_off.values()))} rows, {result.state_off} state rows at the end")
    print(f"the same rows in every micro-batch: {result.rows_on == result.rows_off}")
    spark.stop()


if __name__ == "__main__":
    main()
