"""The Grafana dashboard (``deploy/observability/grafana-eagle-cluster.json``) read as data: its panels' PromQL
queries, the metric names each names, and which of them a ``/metrics`` text does not expose.

    missing(load(), urllib.request.urlopen("http://127.0.0.1:8000/metrics").read().decode())   # {} when all resolve
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from cluster.config import PROJECT_ROOT

DASHBOARD = PROJECT_ROOT / "deploy" / "observability" / "grafana-eagle-cluster.json"

# PromQL words that look like names: aggregations, functions (always followed by "("), operators, modifiers.
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
             "offset", "inf", "nan"}
_NAME = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


def load(path: Path = DASHBOARD) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


def queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, PromQL expression) for every target of every panel, rows' nested panels included."""
    out: list[tuple[str, str]] = []

    def walk(panels: list[dict[str, Any]]) -> None:
        for p in panels:
            out.extend((p.get("title", ""), t["expr"]) for t in p.get("targets", []) if t.get("expr"))
            walk(p.get("panels", []))

    walk(dashboard.get("panels", []))
    return out


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (not its functions, label names, label values or ranges)."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals (label values)
    s = re.sub(r"\{[^}]*\}", "", s)  # label matchers
    s = re.sub(r"\[[^\]]*\]", "", s)  # ranges, $__rate_interval included
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)  # label lists
    s = re.sub(r"\$\w+", " ", s)  # dashboard variables
    names = set()
    for m in _NAME.finditer(s):
        rest = s[m.end():].lstrip()
        if rest.startswith("(") or m.group().lower() in _KEYWORDS:
            continue  # a function or an aggregation, or an operator word
        if m.start() > 0 and (s[m.start() - 1].isdigit() or s[m.start() - 1] == "."):
            continue  # inside a number such as 1e3
        names.add(m.group())
    return names


def exposed(prometheus_text: str) -> set[str]:
    """The sample names in a Prometheus text exposition (``name_bucket``, ``name_sum``, ... for histograms)."""
    names = set()
    for line in prometheus_text.splitlines():
        if line and not line.startswith("#"):
            m = _NAME.match(line)
            if m:
                names.add(m.group())
    return names


def missing(dashboard: dict[str, Any], prometheus_text: str) -> dict[str, set[str]]:
    """Per panel title, the metric names its queries name that the text exposes no sample of."""
    have = exposed(prometheus_text)
    out: dict[str, set[str]] = {}
    for title, expr in queries(dashboard):
        names = metric_names(expr) - have
        if names:
            out.setdefault(title, set()).update(names)
    return out
