"""The example Grafana dashboard and Prometheus alert rules
(``examples/monitoring/``), the PromQL check that ties them to ``/metrics``
(``support.monitoring``), and the metrics added for them: decision-log drops,
status agreement and ops errors. No server here: the scrape is the gate's own
exporter in multiprocess mode, as SGLang serves it; the same check against a
real gated speculative server is in ``test_spec_e2e.py``."""

from __future__ import annotations

import json
import os

import pytest
from support.metrics_probe import scrape_text
from support.monitoring import (
    TARGET_LABELS,
    PromQLError,
    all_queries,
    as_promql,
    dashboard_queries,
    load_dashboard,
    load_rules,
    parse,
    problems,
    rules_queries,
    scrape_labels,
)

from eagle_gate.config import GateConfig
from eagle_gate.metrics import DEPTH_METRICS, METRICS
from eagle_gate.ops import OpsService, OpsSettings
from eagle_gate.policy import Mode
from eagle_gate.runtime import GateRuntime
from eagle_gate.statusdir import StatusDir

# A scrape of the gate's exporter with every metric exported at least once:
# a policy with estimates, a decision log that dropped records, a failed ops
# stage, a plain step's draft extend, the agreement gauge (DP rank 0) and a
# second DP rank (no agreement).
SCRAPE_PROBE = r"""
import sys
from eagle_gate.config import GateConfig
from eagle_gate.decision_log import DecisionLog
from eagle_gate.metrics import GateMetrics
from eagle_gate.ops import OpsService, OpsSettings
from eagle_gate.policy import Mode
from eagle_gate.runtime import GateRuntime

status_dir, log_dir = sys.argv[1], sys.argv[2]

class P:
    name = "p"
    def decide(self, view): return Mode.PLAIN
    def observe(self, outcome): pass
    def estimates(self): return {"gain": 1.25}

rt = GateRuntime(GateConfig("threshold"), P(), sglang_version="9.9", adapter="a",
                 launch_id="probe",
                 decision_log=DecisionLog(f"{log_dir}/d.jsonl", max_per_s=1,
                                          clock=lambda: 100.0))
metrics = GateMetrics(rt, dp_rank=None, gated=True)
ops = OpsService(rt, status_dir, gated=True, settings=OpsSettings(),
                 metrics=metrics)
for i in range(5):
    rt.decide(4, 100)
    rt.observe(Mode.SPEC, i, [3, 1, 2, 1])
rt.counters.count_draft_extend("eager")
ops.record_failure("status", OSError("disk full"))
ops.write_status()
ops.run_once()
other = GateMetrics(rt, dp_rank=1, gated=True)
other.export(rt)
"""


@pytest.fixture(scope="module")
def scrape(tmp_path_factory) -> str:
    tmp = tmp_path_factory.mktemp("scrape")
    (tmp / "prom").mkdir()
    (tmp / "status").mkdir(mode=0o700)
    return scrape_text(
        tmp / "prom", SCRAPE_PROBE, str(tmp / "status"), str(tmp / "log")
    )


# -- the check against a scrape ------------------------------------------------
def test_every_query_matches_the_exporters_scrape(scrape):
    queries = all_queries()
    assert len(queries) > 30
    assert problems(queries, scrape_labels(scrape)) == []


def test_the_scrape_has_the_new_metrics(scrape):
    lines = set(scrape.splitlines())
    for expected in (
        'eagle_gate_decision_log_dropped_total{dp_rank="0",kind="decisions"} 4.0',
        'eagle_gate_decision_log_dropped_total{dp_rank="0",kind="outcomes"} 4.0',
        'eagle_gate_ops_errors_total{dp_rank="0",stage="status"} 1.0',
        'eagle_gate_ops_errors_total{dp_rank="0",stage="metrics"} 0.0',
        'eagle_gate_status_agreement{dp_rank="0"} 1.0',
        'eagle_gate_decision_log_dropped_total{dp_rank="1",kind="decisions"} 4.0',
        # the plain step's draft side and graph state (design record §5.7)
        'eagle_gate_plain_draft_extend_total{dp_rank="0",path="eager"} 1.0',
        'eagle_gate_plain_draft_extend_total{dp_rank="0",path="graph"} 0.0',
        'eagle_gate_plain_graphs_captured{dp_rank="0"} 0.0',
        'eagle_gate_plain_graphs_captured{dp_rank="1"} 0.0',
    ):
        assert expected in lines, (expected, scrape)
    # one series per server: DP rank 1 leaves the agreement to DP rank 0
    assert 'eagle_gate_status_agreement{dp_rank="1"}' not in scrape


def test_every_gate_metric_is_on_the_dashboard():
    names = {
        sel.name
        for _, expr in dashboard_queries(load_dashboard())
        for sel in parse(expr).selectors
    }
    suffixes = ("", "_bucket", "_sum", "_count")
    # but the depth servers' own (--gate-depths): every dashboard query must
    # match a binary server's scrape too (tests/servers), which has none
    wanted = [m for m in METRICS if m not in DEPTH_METRICS]
    assert len(wanted) < len(METRICS)
    missing = [m for m in wanted if not any(m + s in names for s in suffixes)]
    assert not missing, f"metrics with no dashboard panel: {missing}"


SCRAPE = """\
# HELP eagle_gate_decode_steps Decode steps
# TYPE eagle_gate_decode_steps counter
eagle_gate_decode_steps_total{dp_rank="0",mode="spec"} 3.0
eagle_gate_dwell_steps_bucket{dp_rank="0",le="1.0",mode="spec"} 0.0
eagle_gate_dwell_steps_sum{dp_rank="0",mode="spec"} 0.0
eagle_gate_degraded{dp_rank="0"} 0.0
eagle_gate_info{adapter="a",dp_rank="0",gated="t",policy="x\\"y",sglang_version="1"} 1
"""


@pytest.mark.parametrize(
    "expr",
    [
        'sum by (mode) (rate(eagle_gate_decode_steps_total{mode="spec"}[5m]))',
        "sum(rate(eagle_gate_decode_steps_total[$__rate_interval])) by (mode, job)",
        "histogram_quantile(0.9, sum by (le, mode) "
        "(rate(eagle_gate_dwell_steps_bucket[5m])))",
        "sum(rate(eagle_gate_dwell_steps_sum[5m])) / ignoring(mode) group_left "
        "sum without (mode) (rate(eagle_gate_decode_steps_total[5m] offset 1h))",
        'max by (instance) (eagle_gate_info{policy=~"$policy"}) == 1',
        'label_values(eagle_gate_info{instance=~"$instance"}, dp_rank)',
        "eagle_gate_degraded > bool 0.5e0 and on(dp_rank) eagle_gate_info",
    ],
)
def test_queries_that_match(expr):
    scrape = scrape_labels(SCRAPE)
    assert problems([("q", as_promql(expr))], scrape) == []


@pytest.mark.parametrize(
    "expr, words",
    [
        # a renamed metric
        (
            'sum(rate(eagle_gate_decode_step_total{mode="spec"}[5m]))',
            ["'eagle_gate_decode_step_total' is not in the scrape"],
        ),
        # the counter's family name is not a series; the hint names the sample
        (
            "rate(eagle_gate_decode_steps[5m])",
            ["'eagle_gate_decode_steps' is not in", "eagle_gate_decode_steps_total"],
        ),
        # a histogram without its suffix
        ("eagle_gate_dwell_steps{mode='spec'}", ["'eagle_gate_dwell_steps' is not"]),
        # a renamed label in a matcher
        (
            'eagle_gate_decode_steps_total{modus="spec"}',
            ["label 'modus' is not on 'eagle_gate_decode_steps_total'"],
        ),
        # a renamed label in a grouping, prefix and postfix
        (
            "sum by (reason) (rate(eagle_gate_decode_steps_total[5m]))",
            ["by (reason)", "no label 'reason'"],
        ),
        (
            "sum(eagle_gate_degraded) without (mode)",
            ["without (mode)", "'eagle_gate_degraded' has no label 'mode'"],
        ),
        # le is on buckets only
        (
            "sum by (le) (rate(eagle_gate_dwell_steps_sum[5m]))",
            ["no label 'le'"],
        ),
        # vector matching on a label none of them has
        (
            "eagle_gate_degraded / on(stage) eagle_gate_info",
            ["vector matching on 'stage'"],
        ),
        # a variable query on a renamed label
        (
            "label_values(eagle_gate_info, dp)",
            ["no label 'dp'"],
        ),
    ],
)
def test_a_renamed_metric_or_label_fails_naming_the_query(expr, words):
    found = problems([("panel 'X' [A]", as_promql(expr))], scrape_labels(SCRAPE))
    assert len(found) == 1, found
    assert found[0].startswith("panel 'X' [A]: ")
    for word in words:
        assert word in found[0], found


def test_a_metric_allowed_to_be_absent_is_still_checked_where_present():
    scrape = scrape_labels(SCRAPE)
    queries = [
        ("a", "eagle_gate_policy_estimate"),
        ("b", 'eagle_gate_degraded{reason="x"}'),
    ]
    absent_ok = {"eagle_gate_policy_estimate", "eagle_gate_degraded"}
    (found,) = problems(queries, scrape, absent_ok=absent_ok)
    assert found.startswith("b: label 'reason'")


def test_the_reader_refuses_what_it_cannot_check():
    with pytest.raises(PromQLError):
        parse('{__name__="eagle_gate_degraded"}')
    with pytest.raises(PromQLError):
        parse("sum(rate(x[5m])")
    with pytest.raises(PromQLError):
        parse("vector(1)")
    (found,) = problems([("q", "sum(")], {})
    assert found.startswith("q: ")


def test_the_reader_takes_apart_selectors_and_groupings():
    parsed = parse(
        'sum by (mode) (rate(a_total{x="1", y=~"$v"}[$__rate_interval]))'
        " / on(mode) group_left(z) count(b)"
    )
    assert [(s.name, s.labels) for s in parsed.selectors] == [
        ("a_total", {"x", "y"}),
        ("b", set()),
    ]
    assert [(g.keyword, g.labels) for g in parsed.groupings] == [("by", ["mode"])]
    assert parsed.matching == ["mode", "z"]
    assert TARGET_LABELS == {"instance", "job"}


def test_a_renamed_metric_in_the_real_files_fails(scrape):
    rules = load_rules()
    rule = rules["groups"][0]["rules"][0]
    rule["expr"] = rule["expr"].replace("eagle_gate_degraded", "eagle_gate_degrade")
    found = problems(list(rules_queries(rules)), scrape_labels(scrape))
    assert found and all(f"/ {rule['alert']}" in f for f in found), found


# -- the dashboard ------------------------------------------------------------
def panels(dashboard):
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


def test_dashboard_model():
    d = load_dashboard()
    assert d["schemaVersion"] >= 36 and d["uid"] and d["title"]
    variables = {v["name"]: v for v in d["templating"]["list"]}
    ds = variables["datasource"]
    assert ds["type"] == "datasource" and ds["query"] == "prometheus"
    assert variables["dp_rank"]["type"] == "query"
    assert "dp_rank" in variables["dp_rank"]["definition"]
    ids = [p["id"] for p in panels(d)]
    assert len(ids) == len(set(ids))
    prometheus = {"type": "prometheus", "uid": "${datasource}"}
    for p in panels(d):
        assert 0 <= p["gridPos"]["x"] and p["gridPos"]["x"] + p["gridPos"]["w"] <= 24
        if p["type"] == "row":
            continue
        assert p["datasource"] == prometheus, p["title"]
        assert p.get("description"), p["title"]
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["datasource"] == prometheus, p["title"]
            assert 'dp_rank=~"$dp_rank"' in t["expr"] or (
                "eagle_gate_status_agreement" in t["expr"]
            ), (p["title"], t["expr"])
    (note,) = [a for a in d["annotations"]["list"] if "expr" in a]
    assert note["datasource"] == prometheus
    assert note["expr"].startswith("changes(eagle_gate_config_version{")
    assert note["expr"].endswith("[1m]) > 0")


def test_dashboard_shows_what_the_issue_asks_for():
    d = load_dashboard()
    exprs = {p["title"]: " ".join(t["expr"] for t in p["targets"]) for p in panels(d)
             if p["type"] != "row"}  # fmt: skip
    wanted = {
        "Mode share of decode steps": "eagle_gate_decode_steps_total",
        "Tokens/s by mode": "eagle_gate_decode_tokens_total",
        "Accept length of SPEC steps": "eagle_gate_decode_request_steps_total",
        "Dwell of SPEC runs (steps)": "eagle_gate_dwell_steps_bucket",
        "Dwell of PLAIN runs (steps)": "eagle_gate_dwell_steps_bucket",
        "Overrides by reason (steps/s)": "eagle_gate_spec_overrides_total",
        "Policy errors by reason (/s)": "eagle_gate_policy_errors_total",
        "Degraded": "eagle_gate_degraded",
        "Policy estimates": "eagle_gate_policy_estimate",
        "Status agreement": "eagle_gate_status_agreement",
        "Plain steps and their draft extends by path (/s)": (
            "eagle_gate_plain_draft_extend_total"
        ),
        "Plain graphs captured": "eagle_gate_plain_graphs_captured",
    }
    for title, metric in wanted.items():
        assert metric in exprs[title], title


# -- the alert rules -----------------------------------------------------------
def test_alert_rules_shape():
    rules = [r for g in load_rules()["groups"] for r in g["rules"]]
    names = [r["alert"] for r in rules]
    assert len(names) == len(set(names))
    for r in rules:
        assert set(r) == {"alert", "expr", "for", "labels", "annotations"}, r
        assert r["labels"]["severity"] in {"critical", "warning", "info"}
        assert isinstance(r["for"], str) and r["for"][-1] in "smh"
        assert r["annotations"]["summary"].strip()
        assert "docs/operations.md" in r["annotations"]["description"], r["alert"]
    by_metric = {
        m: [r["alert"] for r in rules if m in r["expr"]]
        for m in (
            "eagle_gate_degraded",
            "eagle_gate_policy_errors_total",
            "eagle_gate_plain_step_failures_total",
            "eagle_gate_status_agreement",
            "eagle_gate_decision_log_dropped_total",
        )
    }
    assert all(by_metric.values()), by_metric


# -- the metrics behind them ---------------------------------------------------
class Recorder:
    """A stand-in for GateMetrics: what the ops thread hands it."""

    def __init__(self, exports_agreement=True):
        self.exports_agreement = exports_agreement
        self.agreement: list[bool] = []
        self.ops: list[dict] = []

    def export(self, rt):
        pass

    def export_ops(self, errors):
        self.ops.append(dict(errors))

    def set_status_agreement(self, agree):
        self.agreement.append(agree)


def make_ops(tmp_path, metrics, clock):
    rt = GateRuntime(
        GateConfig("threshold", {}),
        _Spec(),
        sglang_version="t",
        adapter="t",
        launch_id="L",
    )
    return OpsService(
        rt,
        tmp_path,
        gated=True,
        settings=OpsSettings(interval_s=1.0),
        metrics=metrics,
        clock=clock,
    )


class _Spec:
    name = "spec"

    def decide(self, view):
        return Mode.SPEC

    def observe(self, outcome):
        pass


def test_status_agreement_is_read_once_per_interval_and_follows_the_ranks(tmp_path):
    now = [1000.0]
    metrics = Recorder()
    ops = make_ops(tmp_path, metrics, lambda: now[0])
    ops.run_once()  # the first round: no record yet, nothing to disagree with
    ops.run_once()  # same instant: the directory is not read again
    assert metrics.agreement == [True]
    # another live scheduler of the same launch with other settings
    other = json.loads(ops.status_path.read_text())
    other.update(pid=os.getppid(), settings={"plain_above": 99}, tp_rank=1)
    directory = StatusDir(tmp_path)
    directory.write_json(f"scheduler-{os.getppid()}.json", other)
    now[0] += 1.0
    ops.run_once()
    assert metrics.agreement == [True, False]
    # a record of another launch does not count
    other.update(launch_id="other")
    directory.write_json(f"scheduler-{os.getppid()}.json", other)
    now[0] += 1.0
    ops.run_once()
    assert metrics.agreement == [True, False, True]
    assert metrics.ops[-1] == dict.fromkeys(ops.stage_errors, 0)


def test_only_the_exporting_rank_reads_the_status_directory(tmp_path, monkeypatch):
    import eagle_gate.ops as ops_module

    def boom(*args, **kwargs):
        raise AssertionError("read")

    monkeypatch.setattr(ops_module, "read_status", boom)
    metrics = Recorder(exports_agreement=False)
    ops = make_ops(tmp_path, metrics, lambda: 1.0)
    ops.run_once()
    assert metrics.agreement == [] and ops.stage_errors["metrics"] == 0


def test_an_unreadable_status_directory_sets_disagreement_and_never_raises(tmp_path):
    metrics = Recorder()
    ops = make_ops(tmp_path / "gone", metrics, lambda: 1.0)
    ops.run_once()
    assert metrics.agreement == [False]
    assert ops.stage_errors["metrics"] == 1 and ops.stage_errors["status"] == 1
    # the next round exports the failures counted so far
    ops._agreement_at = None
    ops.run_once()
    assert metrics.ops[-1]["metrics"] == 1 and metrics.ops[-1]["status"] == 1
