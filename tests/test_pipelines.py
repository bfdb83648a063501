"""UMJoin in Spark Declarative Pipelines: the README's `spark-pipelines` command, as written, runs
examples/pipeline (a streaming table joining three event streams with watermarks) as one StreamingUMJoin.

The reference is the same flow run by Spark's joins in the same pipeline run: a copy of the example's
table whose flow sets spark.umjoin.enabled=false (a flow's spark_conf, as SDP offers it).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb

from test_readme import README

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "pipeline"
SECTION = README.read_text().split("## Spark Declarative Pipelines\n", 1)[1].split("\n## ", 1)[0]
(COMMANDS,) = re.findall(r"^```bash\n(.*?)^```$", SECTION, flags=re.S | re.M)
(RUN,) = [line for line in COMMANDS.splitlines() if line.startswith("spark-pipelines ")]
EXAMPLE_ROOT = "/tmp/umjoin-attribution"  # where the example's spec keeps its events and storage


def _operators(checkpoint: Path) -> dict[int, str]:
    """The stateful operators a checkpoint's state metadata names, by id."""
    named = {}
    for metadata in checkpoint.glob("state/*/_metadata/metadata"):
        info = json.loads(metadata.read_text().splitlines()[-1])["operatorInfo"]
        named[info["operatorId"]] = info["operatorName"]
    return named


def test_the_readme_command_runs_the_example_pipelines_join_as_one_streaming_umjoin_with_sparks_rows(tmp_path: Path) -> None:
    project = tmp_path / "pipeline"
    shutil.copytree(EXAMPLE, project)
    spec = project / "spark-pipeline.yml"
    assert EXAMPLE_ROOT in spec.read_text()
    spec.write_text(spec.read_text().replace(EXAMPLE_ROOT, str(tmp_path / "attribution")))
    example = (project / "transformations" / "attributed.py").read_text()
    reference = example.replace('@dp.table\ndef attributed()',
                                '@dp.table(spark_conf={"spark.umjoin.enabled": "false"})\ndef attributed_by_sparks_joins()')
    assert reference != example
    (project / "transformations" / "attributed_by_sparks_joins.py").write_text(reference)
    generated = subprocess.run([sys.executable, "generate.py", str(tmp_path / "attribution" / "events")], cwd=project,
                               capture_output=True, text=True, timeout=120)
    assert generated.returncode == 0, generated.stderr

    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    run = subprocess.run(["bash", "-c", RUN], cwd=project, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0 and "Run is COMPLETED." in run.stdout + run.stderr, (run.stdout + run.stderr)[-4000:]

    checkpoints = tmp_path / "attribution" / "storage" / "_checkpoints" / "spark_catalog" / "default"
    assert _operators(checkpoints / "attributed" / "attributed" / "0") == {0: "umJoin"}
    sparks = checkpoints / "attributed_by_sparks_joins" / "attributed_by_sparks_joins" / "0"
    assert _operators(sparks) == {0: "symmetricHashJoin", 1: "symmetricHashJoin"}

    def rows(table: str) -> list[tuple]:  # type: ignore[type-arg]
        files = str(project / "spark-warehouse" / table / "*.parquet")
        found = duckdb.sql(f"SELECT * FROM read_parquet('{files}') ORDER BY ALL").fetchall()
        return found

    with_umjoin, with_sparks_joins = rows("attributed"), rows("attributed_by_sparks_joins")
    assert with_umjoin == with_sparks_joins and len(with_umjoin) > 10, (len(with_umjoin), len(with_sparks_joins))
