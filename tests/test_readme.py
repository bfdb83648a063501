"""The README's Python code runs as written: every ```python block, each in a fresh Python (its own Spark)."""

from __future__ import annotations

import re
from collections import Counter
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
#: The blocks a Python process runs alone (a Spark Connect client's needs the README's server: tests/test_connect.py).
BLOCKS = [block for block in re.findall(r"^```python\n(.*?)^```$", README.read_text(), flags=re.S | re.M) if ".remote(" not in block]


def test_the_readme_has_python_blocks() -> None:
    assert BLOCKS, "no ```python block found in README.md"


@pytest.mark.parametrize("code", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_readme_block_runs_as_written(code: str, tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    if ".explain()" in code:
        # The Quick start promises a UMJoin where Spark plans binary joins.
        assert "UMJoin inputs=" in run.stdout, run.stdout[-3000:]
        assert "SortMergeJoin" not in run.stdout and "BroadcastHashJoin" not in run.stdout, run.stdout[-3000:]
    if "spark.umjoin.enabled" in code:
        # The switch over and back: Spark's joins, then a StreamingUMJoin, then Spark's joins again, every row once.
        assert run.stdout.splitlines() == [
            "UMJoin off: ['symmetricHashJoin', 'symmetricHashJoin']", "UMJoin on : ['umJoin']",
            "UMJoin off: ['symmetricHashJoin', 'symmetricHashJoin']", "51 rows written, the batch join's: True"], run.stdout
    if "lineitems" in code:
        assert lineitems_per_region() in run.stdout.splitlines(), run.stdout[-3000:]


def lineitems_per_region() -> str:
    """The printed answer of the README's customers-orders-lineitems query, counted from the tables' definitions:
    lineitem l has order l % 1000000, whose customer is (l % 1000000) % 1000, in region ((l % 1000000) % 1000) % 7."""
    lines = Counter((lid % 1000000) % 1000 % 7 for lid in range(4000000))
    return "[" + ", ".join(f"Row(region={r}, lines={n})" for r, n in sorted(lines.items())) + "]"
