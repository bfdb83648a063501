"""The benchmarks, run from a clone (`make bench*` or `python -m bench <name>`); not part of the installed package.

Benchmarks are not tests: each prints what it measured, side by side in one run, and writes it to
bench/results/ (docs/benchmarks.md says what each measures and what it last measured).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

#: The tests' and benchmarks' JVM classes (`make testkit`): the cost models asked directly, the arrival replay.
TESTKIT_JAR = Path(__file__).resolve().parent.parent / "build" / "umjoin-spark-testkit.jar"


def commit() -> str:
    """The commit a benchmark ran on, for its result file; where the work tree differed from it, `+changes to` the files."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    changed = subprocess.run(["git", "diff", "--name-only", "HEAD"], capture_output=True, text=True).stdout.split()
    return (head or "unknown") + (f" +changes to {', '.join(changed)}" if changed else "")


def spread(values: list[float], digits: int) -> str:
    """Repeated runs' figures as a result table shows them: min / median / max."""
    return " / ".join(f"{v:.{digits}f}" for v in (min(values), statistics.median(values), max(values)))


def peak_rss_bytes(pid: int) -> int:
    """The process's resident memory at its highest (VmHWM): a benchmark's JVM, asked before it stops."""
    return next(int(line.split()[1]) * 1024 for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("VmHWM"))


def with_testkit(builder: SparkSession.Builder) -> SparkSession.Builder:
    """Adds the testkit jar to a builder UMJoin is configured on (after :func:`umjoin.configure`)."""
    if not TESTKIT_JAR.is_file():
        raise FileNotFoundError(f"{TESTKIT_JAR} is missing: run `make testkit` (it compiles jvm-shim/src/test/scala)")
    jars = [jar for jar in builder._options.get("spark.jars", "").split(",") if jar]
    return builder.config("spark.jars", ",".join([*jars, str(TESTKIT_JAR)]))


def reported_by(module: str, spec: dict[str, Any]) -> dict[str, Any]:
    """What `python -m module '<spec>'` reported (its last JSON line), or {"ended": the last lines of its errors} where it reported nothing."""
    # Output to files, not pipes: the run is over when its Python process ends, whatever its JVM does after.
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        subprocess.run([sys.executable, "-m", module, json.dumps(spec)], stdout=out, stderr=err, timeout=7200)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else {"ended": " | ".join(stderr.strip().splitlines()[-3:])[:300]}


def reported_on_fresh_checkpoint(module: str, spec: dict[str, Any]) -> dict[str, Any]:
    """:func:`reported_by`, with the run's checkpoint directory (`spec["checkpoint"]`) removed before and after it."""
    subprocess.run(["rm", "-rf", spec["checkpoint"]], check=True)
    try:
        return reported_by(module, spec)
    finally:
        subprocess.run(["rm", "-rf", spec["checkpoint"]], check=True)
