"""The wheel from the checkout's files, installed into a fresh virtualenv, works from any directory.

Builds with `pip wheel` as a user would (build isolation: the build environment gets its own
pyspark, whose Scala compiler compiles the shim), installs the wheel without the repository on the
path, first without extras (the extension alone), then with the ``report`` extra.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.packaging

REPOSITORY = Path(__file__).resolve().parent.parent

# A 3-way join on one key: a(k, x), b(k, y), c(k, z) with k = i % 7, 5 and 3.
A = [(i % 7, i) for i in range(30)]
B = [(i % 5, 100 + i) for i in range(20)]
C = [(i % 3, 200 + i) for i in range(10)]

THREE_WAY_SCRIPT = textwrap.dedent(
    f"""
    import json
    from pyspark.sql import SparkSession
    import umjoin

    spark = umjoin.configure(SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
                             .config("spark.sql.shuffle.partitions", "2")).getOrCreate()
    spark.createDataFrame({A!r}, "k int, x int").createOrReplaceTempView("a")
    spark.createDataFrame({B!r}, "k int, y int").createOrReplaceTempView("b")
    spark.createDataFrame({C!r}, "k int, z int").createOrReplaceTempView("c")
    df = spark.sql("SELECT a.x, b.y, c.z FROM a JOIN b ON a.k = b.k JOIN c ON b.k = c.k")
    rows = sorted(tuple(r) for r in df.collect())
    plan = df._jdf.queryExecution().executedPlan().toString()
    print(json.dumps({{"umjoin_file": umjoin.__file__, "rows": rows, "umjoin_in_plan": "UMJoin" in plan}}))
    spark.stop()
    """
)


def _checkout_files(target: Path) -> None:
    """Copies what a clean clone has (tracked and new, unignored files): no jar, no build output."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPOSITORY,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = REPOSITORY / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            (target / name).write_bytes(source.read_bytes())


def _run(command: list[str], cwd: Path, env: dict[str, str], timeout: int = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_wheel_installs_and_runs_outside_the_repository(tmp_path: Path) -> None:
    source, wheels, venv, work = (tmp_path / name for name in ("source", "wheels", "venv", "work"))
    for directory in (source, work):
        directory.mkdir()
    _checkout_files(source)
    assert not (source / "python" / "umjoin" / "jars").exists()

    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(source)],
                           capture_output=True, text=True, timeout=900)
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = wheels.glob("umjoin_spark-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "umjoin/jars/umjoin-spark.jar" in names
    assert {"umjoin/rules/batch.yaml", "umjoin/rules/streaming.yaml", "umjoin/templates/report.html.j2"} <= names
    assert {f"umjoin/tpch_queries/q{n:02d}.sql" for n in range(1, 23)} <= names

    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python, umjoin_command = str(venv / "bin" / "python"), str(venv / "bin" / "umjoin")
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["UMJOIN_DATA_DIR"] = str(tmp_path / "data")
    install = _run([python, "-m", "pip", "install", "-q", str(wheel)], work, env)
    assert install.returncode == 0, install.stderr[-3000:]
    site_packages = Path(_run([python, "-c", "import umjoin, os; print(os.path.dirname(umjoin.__file__))"], work, env).stdout.strip())
    assert venv in site_packages.parents
    packaged = {p.relative_to(site_packages) for p in site_packages.rglob("*") if "__pycache__" not in p.parts}

    # The extension alone: the jar's path for spark-submit, and a 3-way join as one UMJoin.
    jar = _run([umjoin_command, "jar"], work, env)
    assert jar.returncode == 0, jar.stderr
    assert Path(jar.stdout.strip()) == site_packages / "jars" / "umjoin-spark.jar"
    joined = _run([python, "-c", THREE_WAY_SCRIPT], work, env)
    assert joined.returncode == 0, joined.stderr[-3000:]
    result = json.loads(joined.stdout.strip().splitlines()[-1])
    assert Path(result["umjoin_file"]).parent == site_packages
    assert result["umjoin_in_plan"]
    expected = sorted((x, y, z) for ka, x in A for kb, y in B for kc, z in C if ka == kb == kc)
    assert [tuple(r) for r in result["rows"]] == expected and expected

    # A command that needs the report extra says which one; with it installed, it runs.
    refused = _run([umjoin_command, "plan-diff", "--tpch", "5", "--tpch-sf", "0.01", "--format", "json"], work, env)
    assert refused.returncode == 2 and "pip install 'umjoin-spark[report]'" in refused.stderr
    with_extra = _run([python, "-m", "pip", "install", "-q", f"{wheel}[report]"], work, env)
    assert with_extra.returncode == 0, with_extra.stderr[-3000:]
    # Q2: Spark sort-merge joins its decorrelated subquery even at SF 0.01, so its group converts under the defaults.
    diff = _run([umjoin_command, "plan-diff", "--tpch", "2", "--tpch-sf", "0.01", "--format", "json"], work, env)
    assert diff.returncode == 0, diff.stderr[-3000:]
    report = json.loads(diff.stdout)
    assert report["executed"] and report["join_counts"]["umjoins_on"] == 1

    # Generated data went to the data directory, nothing into the installed package.
    assert (tmp_path / "data" / "tpch" / "sf0.01" / "_COMPLETE").is_file()
    assert {p.relative_to(site_packages) for p in site_packages.rglob("*") if "__pycache__" not in p.parts} == packaged
