"""Check the example Grafana dashboard and Prometheus alert rules
(``examples/monitoring/``) against a ``/metrics`` scrape.

Every PromQL expression in the dashboard (panel targets, template variables,
annotations) and in the rules is taken apart into its metric selectors (name
and matcher labels) and the label names of its ``by``/``without`` and
``on``/``ignoring``/``group_left``/``group_right`` clauses. Each name must be a
sample name of the scrape (so a counter is ``..._total`` and a histogram
``..._bucket``/``_sum``/``_count``, as Prometheus stores them), and each label
must be on that metric (``le`` on buckets). ``instance`` and ``job`` are added
by Prometheus when it scrapes, so they are on every metric.

This is a small PromQL reader, not a full parser: it knows what the example
files use (selectors, ranges, functions, aggregations with grouping, binary
operators with vector matching, ``offset``, Grafana's ``$variables``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "examples" / "monitoring"
DASHBOARD = MONITORING / "eagle_gate-dashboard.json"
RULES = MONITORING / "eagle_gate-alerts.yaml"

#: labels Prometheus attaches to every series of a scrape target.
TARGET_LABELS = frozenset({"instance", "job"})

AGGREGATIONS = frozenset(
    {
        "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count",
        "count_values", "bottomk", "topk", "quantile", "limitk", "limit_ratio",
    }
)  # fmt: skip
GROUPING = frozenset({"by", "without"})
MATCHING = frozenset({"on", "ignoring", "group_left", "group_right"})
KEYWORDS = frozenset(
    {"bool", "and", "or", "unless", "offset", "inf", "nan", "start", "end", "atan2"}
)

_TOKEN = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<comment>\#[^\n]*)
  | (?P<string>"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|`[^`]*`)
  | (?P<range>\[[^\]]*\])
  | (?P<var>\$\{[^}]*\}|\$\w+|\[\[\w+\]\])
  | (?P<number>(?:0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
                (?:[a-zA-Z]+\d*)*)
  | (?P<ident>[a-zA-Z_:][a-zA-Z0-9_:]*)
  | (?P<punct>[{}(),])
  | (?P<op>==|!=|=~|!~|<=|>=|[-+*/%^<>=@])
    """,
    re.VERBOSE,
)


class PromQLError(ValueError):
    """An expression this reader cannot take apart."""


@dataclass
class Selector:
    name: str
    labels: set[str]
    at: int  # token index of the name


@dataclass
class Grouping:
    """Labels of a by/without clause, checked on the selectors in its scope."""

    keyword: str
    labels: list[str]
    scope: tuple[int, int]  # token indices (exclusive) of the aggregated argument


@dataclass
class Parsed:
    selectors: list[Selector] = field(default_factory=list)
    groupings: list[Grouping] = field(default_factory=list)
    #: labels of on/ignoring/group_left/group_right (any operand must have them)
    matching: list[str] = field(default_factory=list)


def tokenize(expr: str) -> list[tuple[str, str]]:
    tokens, pos = [], 0
    while pos < len(expr):
        match = _TOKEN.match(expr, pos)
        if match is None:
            raise PromQLError(f"cannot read {expr[pos : pos + 20]!r} in {expr!r}")
        pos = match.end()
        kind = match.lastgroup
        if kind not in ("ws", "comment"):
            tokens.append((kind, match.group()))
    return tokens


def _closing(tokens: list[tuple[str, str]], start: int) -> int:
    """Index of the ``)`` matching the ``(`` at ``start``."""
    depth = 0
    for i in range(start, len(tokens)):
        if tokens[i] == ("punct", "("):
            depth += 1
        elif tokens[i] == ("punct", ")"):
            depth -= 1
            if depth == 0:
                return i
    raise PromQLError("unbalanced parentheses")


def _label_list(tokens: list[tuple[str, str]], start: int) -> tuple[list[str], int]:
    """The label names of ``( a, b )`` at ``start``; and the index after it."""
    if tokens[start] != ("punct", "("):
        raise PromQLError(f"expected '(' after a grouping keyword, got {tokens[start]}")
    end = _closing(tokens, start)
    labels = [text for kind, text in tokens[start + 1 : end] if kind == "ident"]
    return labels, end + 1


def parse(expr: str) -> Parsed:
    tokens = tokenize(expr)
    out = Parsed()
    skip: set[int] = set()  # tokens of label lists, already read
    n = len(tokens)

    def at(i: int) -> tuple[str, str]:
        return tokens[i] if i < n else ("eof", "")

    for i, (kind, text) in enumerate(tokens):
        if i in skip:
            continue
        if kind == "punct" and text == "{":
            raise PromQLError(f"a selector without a metric name in {expr!r}")
        if kind != "ident":
            continue
        word = text.lower()
        if word in AGGREGATIONS and (
            at(i + 1) == ("punct", "(") or at(i + 1)[1] in GROUPING
        ):
            j, labels, keyword = i + 1, [], ""
            if at(j)[1] in GROUPING:  # sum by (x) (...)
                keyword = at(j)[1]
                skip.add(j)
                labels, after = _label_list(tokens, j + 1)
                skip.update(range(j + 1, after))
                j = after
            end = _closing(tokens, j)
            if at(end + 1)[1] in GROUPING:  # sum (...) by (x)
                keyword = at(end + 1)[1]
                skip.add(end + 1)
                labels, after = _label_list(tokens, end + 2)
                skip.update(range(end + 2, after))
            if keyword:
                out.groupings.append(Grouping(keyword, labels, (j, end)))
            continue
        if word in MATCHING:
            if at(i + 1) == ("punct", "("):
                labels, after = _label_list(tokens, i + 1)
                skip.update(range(i + 1, after))
                out.matching += labels
            continue
        if word in KEYWORDS or word in GROUPING:
            continue
        if at(i + 1) == ("punct", "("):
            continue  # a function call
        labels: set[str] = set()
        if at(i + 1) == ("punct", "{"):
            skip.add(i + 1)
            j = i + 2
            while at(j) != ("punct", "}"):
                k, t = at(j)
                if k == "eof":
                    raise PromQLError(f"unclosed '{{' in {expr!r}")
                if k == "ident" and at(j + 1)[0] == "op":
                    labels.add(t)
                elif k == "string" and at(j - 1)[0] != "op":
                    raise PromQLError(f"a quoted metric name in {expr!r}")
                skip.add(j)
                j += 1
            skip.add(j)
        out.selectors.append(Selector(text, labels, i))
    if not out.selectors:
        raise PromQLError(f"no metric in {expr!r}")
    return out


_LABEL_VALUES = re.compile(r"^\s*label_values\((?P<sel>.+),\s*(?P<label>\w+)\s*\)\s*$")


def as_promql(query: str) -> str:
    """A Grafana template query as PromQL: ``label_values(sel, l)`` becomes
    ``group by (l) (sel)``, which needs the same metric and label."""
    match = _LABEL_VALUES.match(query)
    if match:
        return f"group by ({match['label']}) ({match['sel']})"
    return query


# -- the scrape -----------------------------------------------------------------
_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?\s")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="(?:\\.|[^"\\])*"')


def scrape_labels(text: str) -> dict[str, set[str]]:
    """Sample name -> label names over its samples, from a text exposition."""
    names: dict[str, set[str]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            continue
        labels = set(_LABEL.findall(match["labels"] or ""))
        names.setdefault(match["name"], set()).update(labels)
    return names


# -- the files --------------------------------------------------------------------
def dashboard_queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, PromQL) of every query in a Grafana dashboard JSON model."""

    def walk(node: Any, where: str) -> Iterator[tuple[str, str]]:
        if isinstance(node, dict):
            here = where
            if isinstance(node.get("title"), str):
                here = f"{where} / {node['title']}" if where else node["title"]
            elif isinstance(node.get("name"), str):
                here = f"{where} / {node['name']}" if where else node["name"]
            if isinstance(node.get("expr"), str) and node["expr"].strip():
                ref = node.get("refId") or node.get("name") or ""
                yield f"{here} [{ref}]" if ref else here, node["expr"]
            query = node.get("query")
            if node.get("type") == "query" and isinstance(query, dict):
                query = query.get("query")
            if node.get("type") == "query" and isinstance(query, str):
                yield f"{here} [variable query]", as_promql(query)
            for key, value in node.items():
                if key not in ("expr", "query"):
                    yield from walk(value, here)
        elif isinstance(node, list):
            for item in node:
                yield from walk(item, where)

    yield from walk(dashboard, "dashboard")


def rules_queries(rules: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, PromQL) of every rule of a Prometheus rules file; annotation
    templates are checked too: a ``$labels.x`` becomes a ``by (x)`` clause on
    the whole expression, so ``x`` must be a label of its metrics."""
    for group in rules["groups"]:
        for rule in group["rules"]:
            name = rule.get("alert") or rule.get("record")
            where = f"rules / {group['name']} / {name}"
            yield where, rule["expr"]
            used = set()
            for text in (rule.get("annotations") or {}).values():
                used.update(re.findall(r"\$labels\.(\w+)", str(text)))
            if used:
                by = ", ".join(sorted(used))
                yield f"{where} [annotations]", f"group by ({by}) ({rule['expr']})"


def load_dashboard(path: Path = DASHBOARD) -> dict[str, Any]:
    return json.loads(path.read_text())


def load_rules(path: Path = RULES) -> dict[str, Any]:
    import yaml  # PyYAML: a dependency of transformers, so of SGLang

    return yaml.safe_load(path.read_text())


def all_queries() -> list[tuple[str, str]]:
    return [*dashboard_queries(load_dashboard()), *rules_queries(load_rules())]


# -- the check -----------------------------------------------------------------------
def problems(
    queries: list[tuple[str, str]],
    scrape: dict[str, set[str]],
    *,
    prefix: str = "",
    absent_ok: Collection[str] = (),
) -> list[str]:
    """What in ``queries`` the scrape does not have: one line per problem,
    naming the query. Only metrics starting with ``prefix`` are checked;
    metrics in ``absent_ok`` may have no sample at all (a series that needs
    an event the server has not had), but where they do, their labels count.
    """
    found = []
    for where, expr in queries:
        try:
            parsed = parse(expr)
        except PromQLError as exc:
            found.append(f"{where}: {exc}")
            continue
        checked = [s for s in parsed.selectors if s.name.startswith(prefix)]

        def labels_of(sel: Selector) -> set[str]:
            return scrape.get(sel.name, set()) | TARGET_LABELS

        for sel in checked:
            if sel.name not in scrape:
                if sel.name in absent_ok:
                    continue
                hint = [n for n in scrape if n.startswith(sel.name)]
                found.append(
                    f"{where}: metric {sel.name!r} is not in the scrape"
                    + (f" (did you mean one of {sorted(hint)}?)" if hint else "")
                    + f"  in: {expr}"
                )
                continue
            for label in sorted(sel.labels - labels_of(sel)):
                found.append(
                    f"{where}: label {label!r} is not on {sel.name!r} "
                    f"(it has {sorted(scrape[sel.name])})  in: {expr}"
                )
        present = [s for s in checked if s.name in scrape]
        for grouping in parsed.groupings:
            lo, hi = grouping.scope
            inside = [s for s in present if lo < s.at < hi]
            for sel in inside:
                for label in grouping.labels:
                    if label not in labels_of(sel):
                        found.append(
                            f"{where}: {grouping.keyword} ({label}) but "
                            f"{sel.name!r} has no label {label!r} (it has "
                            f"{sorted(scrape[sel.name])})  in: {expr}"
                        )
        for label in parsed.matching:
            if present and not any(label in labels_of(s) for s in present):
                found.append(
                    f"{where}: vector matching on {label!r}, which none of "
                    f"{sorted({s.name for s in present})} has  in: {expr}"
                )
    return found
