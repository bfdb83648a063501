"""Probe for issue 66 (branch planner, not a benchmark yet): queryPlanning and latency per micro-batch of one
query, UMJoin (the jar given) or Spark's joins, on a 3-stream inner chain or a 6-stream LEFT chain of JSON file
streams (12 micro-batches of 50 rows each, 10-minute watermarks, 20-minute time bounds, local[2], 4 partitions,
noop sink). One JVM per run; batches 0-1 left out. Usage:
  python bench/planning_probe.py <jar> umjoin|off inner3|left6 <work dir>
Prints one JSON line: median/min/max queryPlanning ms, median triggerExecution ms, the state operators."""
import json, os, random, shutil, statistics, sys, time
from pyspark.sql import SparkSession, functions as F

jar, mode, shape, root = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
n_streams = 3 if shape == "inner3" else 6
batches = 12
rng = random.Random(1)
data = os.path.join(root, "data")
if not os.path.exists(data):
    for s in range(n_streams):
        d = os.path.join(data, f"s{s}"); os.makedirs(d)
        for b in range(batches):
            with open(os.path.join(d, f"{b:03d}.json"), "w") as f:
                for r in range(50):
                    k = rng.randrange(200)
                    t = 1_700_000_000 + b * 60 + rng.randrange(60)
                    f.write(json.dumps({"k": k, "ts": t, "v": rng.randrange(1000)}) + "\n")
spark = (SparkSession.builder.master("local[2]").config("spark.jars", jar)
         .config("spark.sql.extensions", "umjoin.spark.UMJoinExtensions")
         .config("spark.umjoin.enabled", "true" if mode == "umjoin" else "false")
         .config("spark.sql.shuffle.partitions", "4").config("spark.ui.enabled", "false")
         .getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
def stream(s):
    df = (spark.readStream.schema("k INT, ts LONG, v INT").option("maxFilesPerTrigger", 1)
          .json(os.path.join(data, f"s{s}")))
    df = df.select(F.col("k").alias(f"k{s}"), F.timestamp_seconds("ts").alias(f"t{s}"), F.col("v").alias(f"v{s}"))
    return df.withWatermark(f"t{s}", "10 minutes")
q = stream(0)
how = "inner" if shape == "inner3" else "left"
for s in range(1, n_streams):
    q = q.join(stream(s), F.expr(f"k0 = k{s} AND t{s} BETWEEN t0 - INTERVAL 20 MINUTES AND t0 + INTERVAL 20 MINUTES"), how)
    q = q.withMetadata(f"t{s}", {})
ck = os.path.join(root, f"ck-{mode}-{time.time()}")
query = q.writeStream.format("noop").option("checkpointLocation", ck).trigger(availableNow=True).start()
query.awaitTermination()
prog = query.recentProgress
plan = query._jsq.streamingQuery().lastExecution().executedPlan().toString()
planning = [p["durationMs"].get("queryPlanning", 0) for p in prog][2:]
total = [p["durationMs"].get("triggerExecution", 0) for p in prog][2:]
ops = [o["operatorName"] for o in prog[-1]["stateOperators"]]
print(json.dumps({"mode": mode, "shape": shape, "batches": len(prog), "planning_med": statistics.median(planning),
                  "planning_min": min(planning), "planning_max": max(planning), "latency_med": statistics.median(total),
                  "ops": ops, "sshj": "StreamingSymmetricHashJoin" in plan, "umjoin": "StreamingUMJoin" in plan}))
