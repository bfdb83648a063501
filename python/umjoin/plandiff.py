"""`umjoin plan-diff`: one query's plans with UMJoin off and on, UMJoin nodes and replaced joins marked."""

from __future__ import annotations

import difflib
import json
import re
import shutil
from pathlib import Path
from typing import Any

import jinja2
import sqlglot
from pyspark.errors import AnalysisException, ParseException
from pyspark.sql import SparkSession

from umjoin import plans, tpch
from umjoin.errors import UserError
from umjoin.svgtree import tree_svg

__all__ = ["FORMATS", "LAYOUTS", "load_query", "register_data", "run_plan_diff"]

FORMATS = ("text", "json", "html")
LAYOUTS = ("side-by-side", "unified")
_RED, _GREEN, _RESET = "\033[31m", "\033[32m", "\033[0m"


def load_query(source: str | None, tpch_number: int | None, dialect: str | None) -> str:
    """The Spark SQL to diff: TPC-H query, a .sql file, or SQL text; transpiled from ``dialect`` if given."""
    if tpch_number is not None:
        if source is not None:
            raise UserError("give either a query (SQL text or a .sql file) or --tpch N, not both")
        sql = tpch.query_text(tpch_number)
    elif source is None:
        raise UserError("no query: give SQL text, a .sql file, or --tpch N")
    elif source.endswith(".sql") or Path(source).is_file():
        path = Path(source)
        if not path.is_file():
            raise UserError(f"no such file: {source}")
        sql = path.read_text()
    else:
        sql = source
    if dialect is None:
        return sql
    try:
        sqlglot.Dialect.get_or_raise(dialect)
    except ValueError:
        known = ", ".join(sorted(d.value for d in sqlglot.Dialects if d.value))
        raise UserError(f"unknown dialect {dialect!r}; sqlglot knows: {known}") from None
    try:
        statements = sqlglot.transpile(sql, read=dialect, write="spark")
    except sqlglot.errors.ParseError as e:
        first = e.errors[0] if e.errors else {}
        raise UserError(
            f"SQL does not parse as {dialect} (line {first.get('line', '?')}, column {first.get('col', '?')}): "
            f"{first.get('description', str(e))}"
        ) from None
    if len(statements) != 1:
        raise UserError(f"expected one SQL statement, found {len(statements)}")
    return statements[0]


def register_data(spark: SparkSession, data: Path | None, tpch_sf: float | None) -> list[str]:
    """Registers the tables to query: every Parquet file or directory in ``data``, or TPC-H at ``tpch_sf``."""
    if data is not None and tpch_sf is not None:
        raise UserError("give either --data DIR or --tpch-sf X, not both")
    if tpch_sf is not None:
        tpch.register(spark, tpch.generate(tpch_sf))
        return list(tpch.TABLES)
    if data is None:
        return []
    if not data.is_dir():
        raise UserError(f"no such directory: {data}")
    tables = sorted(p for p in data.iterdir() if p.suffix == ".parquet" or (p.is_dir() and any(p.glob("*.parquet"))))
    if not tables:
        raise UserError(f"no Parquet tables in {data} (expected <table>.parquet files or directories)")
    for path in tables:
        spark.read.parquet(str(path)).createOrReplaceTempView(path.stem)
    return [p.stem for p in tables]


def _compare(spark: SparkSession, sql: str, execute: bool) -> plans.PlanComparison:
    """plans.compare, with Spark's parse and analysis errors turned into one clear message."""
    try:
        return plans.compare(spark, sql, execute=execute)
    except ParseException as e:
        where = re.search(r"line (\d+), pos (\d+)", str(e))
        position = f" (line {where.group(1)}, column {int(where.group(2)) + 1})" if where else ""
        reason = str(e).strip().splitlines()[0]
        raise UserError(f"SQL does not parse{position}: {reason}") from None
    except AnalysisException as e:
        if e.getCondition() == "TABLE_OR_VIEW_NOT_FOUND":
            name = e.getMessageParameters().get("relationName", "?")
            raise UserError(f"unknown table {name}: register tables with --data DIR or --tpch-sf X") from None
        raise UserError(f"the query cannot be analyzed: {str(e).strip().splitlines()[0]}") from None


def _marked_lines(comparison: plans.PlanComparison) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """Each plan's lines with a mark: '-' a join UMJoin replaced, '+' a UMJoin node, ' ' otherwise."""
    replaced = {id(j) for j in comparison.replaced_joins}
    off = [("-" if id(node) in replaced else " ", line) for node, line in plans.render_lines(comparison.off.physical)]
    on = [("+" if node.name == "UMJoinExec" else " ", line) for node, line in plans.render_lines(comparison.on.physical)]
    return off, on


def _paint(mark: str, text: str, color: bool) -> str:
    if not color or mark == " ":
        return text
    return f"{_RED if mark == '-' else _GREEN}{text}{_RESET}"


def _text(comparison: plans.PlanComparison, layout: str, color: bool) -> str:
    off, on = _marked_lines(comparison)
    if layout == "unified":
        strip = lambda line: re.sub(r"\[plan_id=\d+\]", "", line)  # noqa: E731
        matcher = difflib.SequenceMatcher(a=[strip(l) for _, l in off], b=[strip(l) for _, l in on], autojunk=False)
        out = ["--- UMJoin off (Spark's plan)", "+++ UMJoin on"]
        for tag, a1, a2, b1, b2 in matcher.get_opcodes():
            if tag == "equal":
                out += [f"  {line}" for _, line in off[a1:a2]]
            else:
                out += [_paint("-", f"- {line}", color) for _, line in off[a1:a2]]
                out += [_paint("+", f"+ {line}", color) for _, line in on[b1:b2]]
    else:
        half = max(40, (shutil.get_terminal_size((240, 24)).columns - 3) // 2)

        def cell(entry: tuple[str, str] | None) -> tuple[str, str]:
            if entry is None:
                return " ", " " * half
            mark, line = entry
            text = f"{mark} {line}"
            return mark, (text[: half - 1] + "…") if len(text) > half else text.ljust(half)

        header = "UMJoin off (Spark's plan)".ljust(half) + " | UMJoin on"
        out = [header, "-" * len(header)]
        for i in range(max(len(off), len(on))):
            left, right = cell(off[i] if i < len(off) else None), cell(on[i] if i < len(on) else None)
            out.append(f"{_paint(left[0], left[1], color)} | {_paint(right[0], right[1], color)}".rstrip())
    counts = comparison.join_counts
    out.append("")
    out.append(
        f"{counts['binary_joins_off']} binary joins without UMJoin; with UMJoin {counts['binary_joins_on']} binary joins "
        f"and {counts['umjoins_on']} UMJoin node(s); {len(comparison.replaced_joins)} joins replaced."
    )
    for node in comparison.umjoins:
        order = " -> ".join(node.inputs[i].label for i in node.probe_order)
        out.append(f"UMJoin over {', '.join(node.labels)}; probe order {order}")
    out += [f"Stays Spark's: {reason}" for reason in comparison.why_not]
    if not comparison.executed:
        out.append("Plans before execution: AQE may change them when the query runs.")
    return "\n".join(out)


def _tree_json(plan: plans.PlanNode, marks: dict[int, str]) -> dict[str, Any]:
    return {
        "node": plan.name,
        "text": plan.text,
        "mark": marks.get(id(plan)),
        "subqueries": [_tree_json(s, marks) for s in plan.subqueries],
        "children": [_tree_json(c, marks) for c in plan.children],
    }


def _json(sql: str, comparison: plans.PlanComparison) -> str:
    marks = {id(j): "replaced" for j in comparison.replaced_joins}
    marks.update({id(n): "umjoin" for n in comparison.on.physical.walk() if n.name == "UMJoinExec"})
    document = {
        "sql": sql,
        "executed": comparison.executed,
        "join_counts": comparison.join_counts,
        "replaced_joins": [j.text for j in comparison.replaced_joins],
        "why_not": list(comparison.why_not),
        "umjoins": [
            {
                "inputs": [
                    {"label": i.label, "placement": i.placement, "join_type": i.join_type, "store_keys": list(i.store_keys),
                     "probe_keys": list(i.probe_keys), "conditions": list(i.conditions), "partition_key": i.partition_key}
                    for i in node.inputs
                ],
                "probe_order": list(node.probe_order),
            }
            for node in comparison.umjoins
        ],
        "off": {"logical": plans.render(comparison.off.logical), "physical": _tree_json(comparison.off.physical, marks)},
        "on": {"logical": plans.render(comparison.on.logical), "physical": _tree_json(comparison.on.physical, marks)},
    }
    return json.dumps(document, indent=1)


def _html(sql: str, comparison: plans.PlanComparison) -> str:
    replaced = {id(j) for j in comparison.replaced_joins}
    environment = jinja2.Environment(loader=jinja2.PackageLoader("umjoin", "templates"), autoescape=True)
    return environment.get_template("plan_diff.html.j2").render(
        sql=sql,
        executed=comparison.executed,
        counts=comparison.join_counts,
        umjoins=[{"labels": n.labels, "order": [n.inputs[i].label for i in n.probe_order]} for n in comparison.umjoins],
        off_svg=tree_svg(comparison.off.physical, lambda n: "replaced" if id(n) in replaced else None),
        on_svg=tree_svg(comparison.on.physical, lambda n: "umjoin" if n.name == "UMJoinExec" else None),
        off_text=plans.render(comparison.off.physical),
        on_text=plans.render(comparison.on.physical),
    )


def run_plan_diff(spark: SparkSession, sql: str, fmt: str, layout: str, color: bool, execute: bool) -> str:
    """The diff of ``sql``'s plans with UMJoin off and on, in format ``fmt``."""
    comparison = _compare(spark, sql, execute)
    if fmt == "json":
        return _json(sql, comparison)
    if fmt == "html":
        return _html(sql, comparison)
    return _text(comparison, layout, color)
