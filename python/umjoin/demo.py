"""`umjoin demo`: one TPC-H query with UMJoin off and on, both plans and both answers side by side."""

from __future__ import annotations

from typing import Sequence

from pyspark.sql import Row, SparkSession

from umjoin import answers, plans, tpch

__all__ = ["run_demo"]


def _table(columns: Sequence[str], rows: Sequence[Row]) -> str:
    cells = [list(columns)] + [[answers._as_text(v) for v in row] for row in rows]
    widths = [max(len(r[c]) for r in cells) for c in range(len(columns))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in cells]
    return "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:]])


def run_demo(spark: SparkSession, number: int, sf: float) -> bool:
    """Prints the query's plans and answers with UMJoin off and on; True if all answers agree."""
    tpch.register(spark, tpch.generate(sf))
    sql = tpch.query_text(number)
    results = {}
    for enabled in ("false", "true"):
        spark.conf.set("spark.umjoin.enabled", enabled)
        df = spark.sql(sql)
        rows = df.collect()
        plan = plans.physical_plan(df)
        results[enabled] = (df.columns, rows, plans.render(plan), plans.umjoin_nodes(plan))
    spark.conf.unset("spark.umjoin.enabled")

    setting = (", with spark.umjoin.convertBroadcastJoins=true (by default a group whose joins Spark plans as broadcast "
               "joins, every one, stays Spark's)") if plans.converts_broadcast_joins(spark) else ""
    print(f"TPC-H Q{number} at scale factor {sf:g}{setting}\n\n{sql}\n")
    for enabled, title in (("false", "UMJoin off: Spark's own plan"), ("true", "UMJoin on")):
        print(f"== {title} ==\n{results[enabled][2]}")
    nodes = results["true"][3]
    for node in nodes:
        order = " -> ".join(node.inputs[i].label for i in node.probe_order)
        print(f"UMJoin over {len(node.inputs)} inputs; probe order: {order}")
    for enabled, title in (("false", "Answer with UMJoin off"), ("true", "Answer with UMJoin on")):
        columns, rows = results[enabled][0], results[enabled][1]
        print(f"\n== {title} ({len(rows)} rows) ==\n{_table(columns, rows)}")

    off_rows = [tuple(r) for r in results["false"][1]]
    on_rows = [tuple(r) for r in results["true"][1]]
    same = sorted(map(repr, off_rows)) == sorted(map(repr, on_rows))
    verdicts = [f"same answer with UMJoin on and off: {'yes' if same else 'NO'}"]
    ok = same
    if any(abs(sf - known) < 1e-9 for known in tpch.ANSWER_SCALE_FACTORS):
        columns, expected = tpch.official_answer(number, sf)
        problems = answers.compare(on_rows, expected, answers.order_by_columns(sql, columns))
        verdicts.append(f"matches the official TPC-H answer: {'yes' if not problems else 'NO ' + str(problems)}")
        ok = ok and not problems
    print("\n" + "; ".join(verdicts))
    return ok
