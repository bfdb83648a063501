"""Conversions attributed to the click and the impression before them: impressions join clicks on the user
and the ad within an hour, clicks join conversions on the click within two hours; 10-minute watermarks."""

from pyspark import pipelines as dp
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

EVENTS = spark.conf.get("attribution.events")  # noqa: F821 (spark-pipelines gives each file `spark`)
SCHEMAS = {
    "impressions": "imp_id BIGINT, user_id BIGINT, ad_id BIGINT, imp_time TIMESTAMP",
    "clicks": "click_id BIGINT, click_user BIGINT, click_ad BIGINT, click_time TIMESTAMP",
    "conversions": "conv_id BIGINT, conv_click BIGINT, conv_time TIMESTAMP",
}


def events(name: str, time: str, copy: str) -> DataFrame:
    """A stream with a 10-minute watermark on its event time and a plain copy of that time: Spark allows one
    event-time column per join input, so the watermarked one is dropped once no later join needs it."""
    frame = spark.readStream.schema(SCHEMAS[name]).option("maxFilesPerTrigger", 1).json(f"{EVENTS}/{name}")  # noqa: F821
    return frame.withColumn(copy, F.col(time)).withWatermark(time, "10 minutes")


@dp.table
def attributed() -> DataFrame:
    impressions = events("impressions", "imp_time", "impressed_at")
    clicks = events("clicks", "click_time", "clicked_at")
    conversions = events("conversions", "conv_time", "converted_at")
    clicked = ((F.col("user_id") == F.col("click_user")) & (F.col("ad_id") == F.col("click_ad"))
               & F.col("click_time").between(F.col("imp_time"), F.col("imp_time") + F.expr("interval 1 hour")))
    converted = ((F.col("click_id") == F.col("conv_click"))
                 & F.col("conv_time").between(F.col("click_time"), F.col("click_time") + F.expr("interval 2 hours")))
    return (impressions.join(clicks, clicked).drop("imp_time")
            .join(conversions, converted).drop("click_time", "conv_time"))
