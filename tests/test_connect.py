"""UMJoin from a Spark Connect client: a real Connect server in its own JVM, started and stopped as the
README says, and clients in their own Python processes (a Connect client in this process would switch
pyspark to Connect for the rest of the suite's tests in it).

The client's answers, plans and reasons are compared with the same queries' on this process's classic
session: the plan views over Connect read the server's `explain("extended")`, the classic ones the JVM.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from pyspark.sql import SparkSession

from conftest import TPCH_SF
from test_readme import README, lineitems_per_region
from test_why_not import TABLES as WHY_NOT_TABLES
from umjoin import plans, tpch
from umjoin.local import temporary_conf

SECTION = README.read_text().split("## Spark Connect\n", 1)[1].split("\n## ", 1)[0]
(START,) = re.findall(r"^```bash\n(.*?)^```$", SECTION, flags=re.S | re.M)
(CLIENT,) = re.findall(r"^```python\n(.*?)^```$", SECTION, flags=re.S | re.M)
STOP = re.search(r'`("\$SPARK_HOME/sbin/stop-connect-server.sh")`', SECTION).group(1)  # type: ignore[union-attr]
PORT = 15002  # the Connect server's default, which the README's client names
REMOTE = f"sc://localhost:{PORT}"
#: Queries with a UMJoin, and queries whose joins stay Spark's (each says why), as test_why_not has them.
TPCH_QUERIES = (2, 5, 9)
WHY_NOT_SQL = ("SELECT * FROM x JOIN y ON x.a < y.b JOIN z ON y.j = z.j AND y.k = z.k",
               "SELECT * FROM x FULL OUTER JOIN y ON x.k = y.k FULL OUTER JOIN z ON y.j = z.j",
               "SELECT * FROM x JOIN y ON x.k = y.k")


def _serving() -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("localhost", PORT)) == 0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The README's server, its logs and pid file in a directory of the test's (Spark's SPARK_LOG_DIR, SPARK_PID_DIR)."""
    assert not _serving(), f"port {PORT} is taken: another Spark Connect server runs here"
    directory = tmp_path_factory.mktemp("connect-server")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "SPARK_LOG_DIR": str(directory), "SPARK_PID_DIR": str(directory)}
    started = subprocess.run(["bash", "-c", START], env=env, capture_output=True, text=True, timeout=120)
    logs = lambda: "".join(p.read_text()[-3000:] for p in directory.glob("*.out"))  # noqa: E731
    assert started.returncode == 0, started.stderr + logs()
    deadline = time.time() + 180
    while not _serving():
        assert time.time() < deadline, "the Spark Connect server did not listen within 180 s: " + logs()
        time.sleep(0.5)
    yield env
    stopped = subprocess.run(["bash", "-c", START.split("\n", 1)[0] + "\n" + STOP], env=env, capture_output=True, text=True, timeout=120)
    assert stopped.returncode == 0, stopped.stderr


def _client(script: str, env: dict[str, str]) -> dict[str, Any]:
    """Runs a client script in its own Python; it prints one JSON line last."""
    code = textwrap.dedent(f"""
        import json, sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from pyspark.sql import SparkSession
        spark = SparkSession.builder.remote({REMOTE!r}).getOrCreate()
    """) + textwrap.dedent(script)
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_the_readme_client_runs_as_written(server: dict[str, str], tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, "-c", CLIENT], env=server, capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.splitlines()
    assert "UMJoin over ['Range', 'Range', 'Range']" in lines, run.stdout
    assert lineitems_per_region() in lines, run.stdout
    assert any("fewer than spark.umjoin.minInputs (3)" in line for line in lines), run.stdout


def test_a_connect_client_gets_the_plans_reasons_and_answers_of_a_classic_session(
        server: dict[str, str], spark: SparkSession, tpch_data: Path) -> None:
    remote = _client(f"""
        from umjoin import answers, plans, tpch
        tpch.register(spark, tpch.generate({TPCH_SF}))
        spark.conf.set("spark.sql.adaptive.enabled", "false")
        spark.conf.set("spark.umjoin.convertBroadcastJoins", "true")  # as the suite's session (conftest)
        found = {{"groups": {{}}, "wrong": [], "why_not": {{}}}}
        for number in {TPCH_QUERIES}:
            df = spark.sql(tpch.query_text(number))
            found["groups"][number] = [node.labels for node in plans.umjoin_nodes(plans.physical_plan(df))]
            columns, expected = tpch.official_answer(number, {TPCH_SF})
            rows = [tuple(r) for r in df.collect()]
            if answers.compare(rows, expected, answers.order_by_columns(tpch.query_text(number), columns)):
                found["wrong"].append(number)
        for name, columns in {WHY_NOT_TABLES}.items():
            spark.range(200).selectExpr(*columns.split(", ")).createOrReplaceTempView(name)
        spark.conf.set("spark.sql.autoBroadcastJoinThreshold", "-1")
        for sql in {WHY_NOT_SQL}:
            found["why_not"][sql] = plans.why_not(spark.sql(sql))
        print(json.dumps(found))
    """, server)
    assert remote["wrong"] == []
    with temporary_conf(spark, {"spark.sql.adaptive.enabled": "false"}):
        groups = {str(n): [node.labels for node in plans.umjoin_nodes(plans.physical_plan(spark.sql(tpch.query_text(n))))]
                  for n in TPCH_QUERIES}
    assert remote["groups"] == groups and all(groups.values()), (remote["groups"], groups)
    for name, columns in WHY_NOT_TABLES.items():
        spark.range(200).selectExpr(*columns.split(", ")).createOrReplaceTempView(name)
    with temporary_conf(spark, {"spark.sql.autoBroadcastJoinThreshold": "-1"}):
        reasons = {sql: plans.why_not(spark.sql(sql)) for sql in WHY_NOT_SQL}
    assert remote["why_not"] == reasons and all(reasons.values()), (remote["why_not"], reasons)


def test_a_stream_stream_chain_from_a_connect_client_runs_as_one_streaming_umjoin_with_sparks_rows(
        server: dict[str, str], tmp_path: Path) -> None:
    remote = _client(f"""
        import contextlib, io
        from pathlib import Path
        from test_streaming import chain, nulls_first, stream, write_batches
        from umjoin import plans
        root = Path({str(tmp_path)!r})
        columns = {{n: f"{{n}}_k BIGINT, {{n}}_j BIGINT, {{n}}_v BIGINT" for n in "xyz"}}
        for n in "xyz":  # some keys NULL, one micro-batch empty
            batches = [[(None if i == 3 else (b + i) % 4, i % 3, b * 10 + i) for i in range(6)] for b in range(3)] + [[]]
            write_batches(root / n, columns[n], batches)
        spark.conf.set("spark.sql.shuffle.partitions", "2")
        found = {{}}
        for enabled in ("true", "false"):
            spark.conf.set("spark.umjoin.enabled", enabled)
            frames = {{n: stream(spark, root / n, columns[n]) for n in "xyz"}}
            query = (chain(frames).writeStream.format("memory").queryName(f"chain_{{enabled}}")
                     .option("checkpointLocation", str(root / f"ck-{{enabled}}")).trigger(availableNow=True).start())
            query.awaitTermination()
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                query.explain()
            rows = sorted((tuple(r) for r in spark.table(f"chain_{{enabled}}").collect()), key=nulls_first)
            found[enabled] = {{"rows": rows, "plan": printed.getvalue()}}
        try:
            plans.unconverted_streaming_joins(spark, query)
        except NotImplementedError as refused:
            found["unconverted"] = str(refused)
        print(json.dumps(found))
    """, server)
    on, off = remote["true"], remote["false"]
    assert on["rows"] == off["rows"] and on["rows"], (len(on["rows"]), len(off["rows"]))
    assert "StreamingUMJoin inputs=" in on["plan"] and "StreamingSymmetricHashJoin" not in on["plan"], on["plan"]
    assert "StreamingSymmetricHashJoin" in off["plan"], off["plan"]
    assert "Spark Connect" in remote["unconverted"] and "logger umjoin.spark" in remote["unconverted"]


def test_what_needs_the_drivers_jvm_says_what_to_do_on_a_connect_client(server: dict[str, str]) -> None:
    remote = _client("""
        import umjoin
        from umjoin import connect, plans
        df = spark.range(10).join(spark.range(10), "id")

        def without_the_jar():  # the description provider's class missing on the server, as without UMJoin's jar
            connect._DESCRIPTION_CLASS = "umjoin.spark.NotInThisJar"
            plans.physical_plan(df)

        said = {}
        for name, call in {"logical_plan": lambda: plans.logical_plan(df), "tsc_groups": lambda: plans.tsc_groups(df),
                           "compare": lambda: plans.compare(spark, df),
                           "configure": lambda: umjoin.configure(SparkSession.builder.remote("sc://localhost:1")),
                           "no jar": without_the_jar}.items():
            try:
                call()
                said[name] = None
            except (NotImplementedError, ValueError, RuntimeError) as refused:
                said[name] = str(refused)
        print(json.dumps(said))
    """, server)
    for name in ("logical_plan", "tsc_groups", "compare"):
        assert remote[name] and "Spark Connect" in remote[name] and "physical_plan" in remote[name], (name, remote[name])
    assert remote["configure"] and "start-connect-server.sh" in remote["configure"], remote["configure"]
    assert remote["no jar"] and remote["no jar"].startswith("The Spark Connect server has no UMJoin jar; start the"), remote["no jar"]
