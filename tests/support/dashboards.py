"""The shipped Grafana dashboard and Prometheus rules (deploy/), read for tests: their PromQL and the metrics it names."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "agentops.json"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
ALERT_TESTS = ROOT / "deploy" / "prometheus" / "alerts.test.yml"

#: Grafana's variables, as a rule file can hold them (Prometheus does not know them).
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__range": "1h", "$agent": ".*"}
#: Series Prometheus records itself for a scrape target, not exported by /metrics.
SCRAPE_SERIES = frozenset({"up"})
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
#: PromQL words that precede ``{`` or ``[`` or stand alone but are no metric.
_WORDS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool", "offset"})


def dashboard_expressions() -> list[str]:
    """Every PromQL expression of the dashboard: its panels' targets and its query variables."""
    dashboard = json.loads(DASHBOARD.read_text())
    panels = [p for row in dashboard["panels"] for p in [row, *row.get("panels", [])]]
    exprs = [t["expr"] for p in panels for t in p.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        query = variable.get("query")
        if isinstance(query, dict):
            inner = re.fullmatch(r"label_values\((\w+),\s*\w+\)", query["query"])
            assert inner, f"dashboard variable {variable['name']}: unexpected query {query['query']!r}"
            exprs.append(inner.group(1))
    return exprs


def rule_expressions() -> list[str]:
    rules = yaml.safe_load(ALERTS.read_text())
    return [rule["expr"] for group in rules["groups"] for rule in group["rules"]]


def with_grafana_values(expr: str) -> str:
    for name, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(name, value)
    assert "$" not in expr, f"an unknown Grafana variable in {expr!r}"
    return expr


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects: names before ``{`` or ``[``, and bare names that are not functions,
    keywords or grouping labels."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # label values are no names
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)  # grouping labels
    text = re.sub(r"\{[^}]*\}", "{}", text)  # label names inside matchers
    text = re.sub(r"\[[^\]]*\]", "[]", text)  # durations
    names = set()
    for match in _NAME.finditer(text):
        word, after = match.group(), text[match.end():].lstrip()[:1]
        if word in _WORDS or after == "(" or re.fullmatch(r"\d.*|e\d*|Inf|NaN", word):
            continue
        names.add(word)
    return names


def used_metric_names() -> set[str]:
    names = set()
    for expr in [*dashboard_expressions(), *rule_expressions()]:
        names |= metric_names(expr)
    return names
