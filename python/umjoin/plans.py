"""Spark plans as Python trees, built from the JVM's own JSON (``TreeNode.toJSON``).

Python does not re-derive what the JVM decided: the trees here are what Spark planned, read back.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Iterator

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from umjoin import connect
from umjoin.local import temporary_conf

__all__ = [
    "BINARY_JOINS",
    "PlanComparison",
    "PlanNode",
    "Plans",
    "UMJoinInput",
    "UMJoinNode",
    "binary_joins",
    "compare",
    "logical_plan",
    "physical_plan",
    "render",
    "render_lines",
    "tsc_groups",
    "unconverted_streaming_joins",
    "why_not",
    "umjoin_nodes",
]

#: Spark's physical binary join operators.
BINARY_JOINS = frozenset(
    {"BroadcastHashJoinExec", "SortMergeJoinExec", "ShuffledHashJoinExec", "BroadcastNestedLoopJoinExec", "CartesianProductExec"}
)


@dataclass
class PlanNode:
    """One plan node: its class name, one-line description, JSON fields, SQL metrics and children."""

    name: str
    text: str
    fields: dict[str, Any]
    metrics: dict[str, int] = field(default_factory=dict)
    children: list["PlanNode"] = field(default_factory=list)
    subqueries: list["PlanNode"] = field(default_factory=list)

    def walk(self) -> Iterator["PlanNode"]:
        """This node and all below it, in pre-order; a node's subquery plans follow the node."""
        yield self
        for subquery in self.subqueries:
            yield from subquery.walk()
        for child in self.children:
            yield from child.walk()


@dataclass(frozen=True)
class UMJoinInput:
    label: str
    placement: str  # streamed | broadcast | partitioned
    join_type: str  # Inner; LeftSemi / LeftAnti for the right side of a semi or anti join (a filter); LeftOuter for an outer join's padded side
    store_keys: tuple[str, ...]
    probe_keys: tuple[str, ...]
    conditions: tuple[str, ...]
    partition_key: str | None


@dataclass(frozen=True)
class UMJoinNode:
    """A UMJoin in a physical plan: its inputs and the order the streamed row probes them in."""

    inputs: tuple[UMJoinInput, ...]
    probe_order: tuple[int, ...]
    metrics: dict[str, int]

    @property
    def labels(self) -> list[str]:
        return [i.label for i in self.inputs]


def _tree(description: dict[str, Any]) -> PlanNode:
    """Rebuilds the tree from the pre-order node list, each node saying how many children it has."""
    nodes, texts = description["nodes"], description["text"]
    metrics, subqueries = description["metrics"], description["subqueries"]
    position = 0

    def build() -> PlanNode:
        nonlocal position
        at = position
        position += 1
        children = [build() for _ in range(int(nodes[at]["num-children"]))]
        name = nodes[at]["class"].rsplit(".", 1)[-1]
        return PlanNode(name, texts[at], nodes[at], metrics[at], children, [_tree(s) for s in subqueries[at]])

    return build()


def _inspection(df: DataFrame) -> Any:
    return df.sparkSession._jvm.umjoin.spark.PlanInspection


def physical_plan(df: DataFrame) -> PlanNode:
    """The executed physical plan; under AQE the current plan (the final one once ``df`` ran). On a Spark
    Connect session, the plan the server plans for ``df`` (under AQE its initial plan)."""
    if connect.is_connect(df):
        return _tree(connect.description(df)["plan"])
    return _tree(json.loads(_inspection(df).describe(df._jdf.queryExecution().executedPlan())))


def unconverted_streaming_joins(spark: SparkSession, query: StreamingQuery) -> list[str]:
    """Why joins of a running (or finished) streaming query of ``spark`` stayed as Spark planned
    them, one message per join group or join, as logged once per query run at INFO (logger
    ``umjoin.spark``)."""
    connect.classic_only(spark, "umjoin.plans.unconverted_streaming_joins",
                         "the server logs each reason once per query run at INFO (logger umjoin.spark)")
    inspection = spark._jvm.umjoin.spark.PlanInspection
    return list(json.loads(inspection.unconvertedStreamingJoins(query._jsq)))


def why_not(df: DataFrame) -> list[str]:
    """Why each join of batch DataFrame ``df`` that stays as Spark plans it is not part of a UMJoin:
    one sentence per join, naming it (type, tables, condition) and the reason, as logged once per
    query at INFO (logger ``umjoin.spark``). Plans ``df`` if it was not planned yet (on a Spark Connect
    session, the server plans it)."""
    if connect.is_connect(df):
        reasons = connect.description(df)["whyNot"]
    else:
        reasons = json.loads(_inspection(df).whyNot(df._jdf.queryExecution()))
    return [f"{join}: {reason}" for join, reason in reasons]


def converts_broadcast_joins(spark: SparkSession) -> bool:
    """Whether the session converts groups Spark would broadcast in every join (`spark.umjoin.convertBroadcastJoins`;
    by default they stay Spark's)."""
    return str(spark.conf.get("spark.umjoin.convertBroadcastJoins", "false")).strip().lower() == "true"


def _logical(df: DataFrame, stage: str) -> Any:
    connect.classic_only(df, "umjoin.plans' logical plans and TSC groups",
                         "on Spark Connect use physical_plan(df) and why_not(df), or df.explain('extended')")
    execution = df._jdf.queryExecution()
    stages = {"optimized": execution.optimizedPlan, "analyzed": execution.analyzed}
    if stage not in stages:
        raise ValueError(f"stage must be one of {sorted(stages)}, not {stage!r}")
    return stages[stage]()


def logical_plan(df: DataFrame, stage: str = "optimized") -> PlanNode:
    """A logical plan: ``optimized`` (what TSC runs on in batch) or ``analyzed`` (as written)."""
    plan = _logical(df, stage)
    return _tree(json.loads(_inspection(df).describe(plan)))


def tsc_groups(df: DataFrame, stage: str = "optimized") -> tuple[list[dict[str, Any]], PlanNode]:
    """TSC's two steps on a logical plan: the groups found and the plan with MultiJoin nodes.

    ``stage`` is ``optimized`` (what the batch hook sees) or ``analyzed`` (the plan as written,
    before Spark reorders joins or pushes filters: for hand-built plans).
    """
    plan = _logical(df, stage)
    result = json.loads(_inspection(df).twoStepConvert(plan))
    return result["groups"], _tree(result["converted"])


def render_lines(plan: PlanNode) -> list[tuple[PlanNode, str]]:
    """The tree as indented lines, each with its node (Spark's code-generation wrappers hidden)."""
    lines: list[tuple[PlanNode, str]] = []

    def visit(node: PlanNode, depth: int) -> None:
        if node.name in _HIDDEN:
            for child in node.children:
                visit(child, depth)
            return
        lines.append((node, "  " * depth + node.text))
        for subquery in node.subqueries:
            visit(subquery, depth + 2)
        for child in node.children:
            visit(child, depth + 1)

    visit(plan, 0)
    return lines


def render(plan: PlanNode, width: int = 160) -> str:
    """The tree as indented text, one node per line, each cut to ``width`` characters."""
    return "\n".join(line if len(line) <= width else line[: width - 3] + "..." for _, line in render_lines(plan))


_HIDDEN = {"WholeStageCodegenExec", "InputAdapter"}


def umjoin_nodes(plan: PlanNode) -> list[UMJoinNode]:
    """The UMJoin nodes of a physical plan, in pre-order."""
    found = []
    for node in plan.walk():
        if node.name == "UMJoinExec":
            inputs = tuple(
                UMJoinInput(
                    label=i["label"],
                    placement=i["placement"],
                    join_type=i["joinType"],
                    store_keys=tuple(i["storeKeys"]),
                    probe_keys=tuple(i["probeKeys"]),
                    conditions=tuple(i["conditions"]),
                    partition_key=i["partitionKey"],
                )
                for i in node.fields["inputs"]
            )
            found.append(UMJoinNode(inputs, tuple(node.fields["probeOrder"]), node.metrics))
    return found


def binary_joins(plan: PlanNode) -> list[PlanNode]:
    """Spark's binary join nodes in a physical plan, subqueries included."""
    return [node for node in plan.walk() if node.name in BINARY_JOINS]


def _comparable(text: str) -> str:
    """A node's text without what differs between two plannings of one query (ids of plans and stages)."""
    return re.sub(r"\[plan_id=\d+\]|^\*\(\d+\) ", "", text)


@dataclass(frozen=True)
class Plans:
    """A query's optimized logical plan and its physical plan in one setting."""

    logical: PlanNode
    physical: PlanNode


@dataclass(frozen=True)
class PlanComparison:
    """One query planned with UMJoin off and on; ``executed`` if the physical plans are AQE's final ones;
    ``why_not``: why each join of the plan with UMJoin on stays Spark's (as ``why_not`` says it)."""

    off: Plans
    on: Plans
    executed: bool
    why_not: tuple[str, ...] = ()

    @property
    def umjoins(self) -> list[UMJoinNode]:
        return umjoin_nodes(self.on.physical)

    @property
    def replaced_joins(self) -> list[PlanNode]:
        """The binary joins of Spark's plan that are gone with UMJoin on."""
        remaining = [_comparable(j.text) for j in binary_joins(self.on.physical)]
        replaced = []
        for join in binary_joins(self.off.physical):
            text = _comparable(join.text)
            if text in remaining:
                remaining.remove(text)
            else:
                replaced.append(join)
        return replaced

    @property
    def join_counts(self) -> dict[str, int]:
        """Binary joins in Spark's plan, and binary joins plus UMJoins with UMJoin on."""
        return {
            "binary_joins_off": len(binary_joins(self.off.physical)),
            "binary_joins_on": len(binary_joins(self.on.physical)),
            "umjoins_on": len(self.umjoins),
        }


def compare(spark: SparkSession, query: str | DataFrame, execute: bool = True) -> PlanComparison:
    """Plans ``query`` with UMJoin off and on, from one analyzed plan (so attribute ids agree).

    With ``execute`` the query runs (its rows are counted, not collected), so under AQE the
    physical plans are the final ones.
    """
    connect.classic_only(spark, "umjoin.plans.compare", "compare physical_plan(df) with spark.umjoin.enabled "
                         "set to false and to true, or run `umjoin plan-diff` where the data is")
    analyzed = (spark.sql(query) if isinstance(query, str) else query)._jdf.queryExecution().analyzed()
    planned, reasons = {}, []
    for enabled in ("false", "true"):
        with temporary_conf(spark, {"spark.umjoin.enabled": enabled}):
            execution = spark._jvm.org.apache.spark.sql.classic.Dataset.ofRows(spark._jsparkSession, analyzed).queryExecution()
            if execute:
                execution.toRdd().count()
            inspection = spark._jvm.umjoin.spark.PlanInspection
            planned[enabled] = Plans(
                _tree(json.loads(inspection.describe(execution.optimizedPlan()))),
                _tree(json.loads(inspection.describe(execution.executedPlan()))),
            )
            if enabled == "true":
                reasons = [f"{join}: {reason}" for join, reason in json.loads(inspection.whyNot(execution))]
    return PlanComparison(planned["false"], planned["true"], execute, tuple(reasons))
