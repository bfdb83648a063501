"""Plans drawn as inline SVG trees (no scripts, no external files), for the HTML report and plan-diff."""

from __future__ import annotations

import re
from dataclasses import dataclass
from html import escape
from typing import Callable

from umjoin.plans import BINARY_JOINS, PlanNode

__all__ = ["short_label", "tree_svg"]

# Wrappers that add nothing to a reader's picture of the plan.
_SKIPPED = {"WholeStageCodegenExec", "InputAdapter", "ColumnarToRowExec", "AQEShuffleReadExec"}
_BOX_WIDTH, _BOX_HEIGHT, _X_GAP, _Y_GAP = 180, 34, 14, 26


def short_label(node: PlanNode) -> str:
    """A few words for a node: ``UMJoin 6 inputs``, ``BroadcastHashJoin Inner``, ``Scan lineitem``..."""
    name = node.name.removesuffix("Exec")
    if node.name == "UMJoinExec":
        return f"UMJoin {len(node.fields.get('inputs', []))} inputs"
    if node.name in BINARY_JOINS:
        kind = re.search(r"\b(Inner|LeftOuter|RightOuter|FullOuter|LeftSemi|LeftAnti|Cross|ExistenceJoin)\b", node.text)
        return f"{name} {kind.group(1) if kind else ''}".strip()
    if node.name == "FileSourceScanExec":
        table = re.search(r"\[file:[^\]]*?/([^/\]]+?)(?:\.parquet)?\]", node.text)
        return f"Scan {table.group(1) if table else 'files'}"
    if node.name == "ShuffleExchangeExec":
        return "Exchange " + node.text.split()[1].split("(")[0]
    return name


@dataclass
class _Box:
    node: PlanNode
    x: float
    depth: int


def _layout(plan: PlanNode) -> list[tuple[_Box, list[_Box]]]:
    """Leaves in consecutive slots left to right, each parent centred over its children."""
    placed: list[tuple[_Box, list[_Box]]] = []
    next_slot = 0

    def visible_children(node: PlanNode) -> list[PlanNode]:
        children = []
        for child in node.children:
            children.extend(visible_children(child) if child.name in _SKIPPED else [child])
        return children

    def place(node: PlanNode, depth: int) -> _Box:
        nonlocal next_slot
        children = [place(child, depth + 1) for child in visible_children(node)]
        if children:
            x = sum(c.x for c in children) / len(children)
        else:
            x = next_slot
            next_slot += 1
        box = _Box(node, x, depth)
        placed.append((box, children))
        return box

    root = plan
    while root.name in _SKIPPED and len(root.children) == 1:
        root = root.children[0]
    place(root, 0)
    return placed


def tree_svg(plan: PlanNode, css_class: Callable[[PlanNode], str | None] = lambda _: None) -> str:
    """The plan as an SVG tree; ``css_class`` marks nodes (e.g. UMJoin, replaced joins) for styling."""
    placed = _layout(plan)
    slots = max(int(box.x) for box, _ in placed) + 1
    depth = max(box.depth for box, _ in placed) + 1
    width = slots * (_BOX_WIDTH + _X_GAP)
    height = depth * (_BOX_HEIGHT + _Y_GAP)

    def centre(box: _Box) -> tuple[float, float]:
        return box.x * (_BOX_WIDTH + _X_GAP) + _BOX_WIDTH / 2 + _X_GAP / 2, box.depth * (_BOX_HEIGHT + _Y_GAP)

    parts = [f'<svg class="plan" xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" viewBox="0 0 {width:.0f} {height:.0f}">']
    for box, children in placed:
        x, y = centre(box)
        for child in children:
            cx, cy = centre(child)
            parts.append(f'<line x1="{x:.0f}" y1="{y + _BOX_HEIGHT:.0f}" x2="{cx:.0f}" y2="{cy:.0f}"/>')
    for box, _ in placed:
        x, y = centre(box)
        label = short_label(box.node)
        shown = label if len(label) <= 27 else label[:26] + "…"
        klass = " ".join(filter(None, ["node", css_class(box.node)]))
        parts.append(
            f'<g class="{klass}"><title>{escape(box.node.text)}</title>'
            f'<rect x="{x - _BOX_WIDTH / 2:.0f}" y="{y:.0f}" width="{_BOX_WIDTH}" height="{_BOX_HEIGHT}" rx="5"/>'
            f'<text x="{x:.0f}" y="{y + _BOX_HEIGHT / 2 + 4:.0f}">{escape(shown)}</text></g>'
        )
    parts.append("</svg>")
    return "".join(parts)
