"""Per-depth counts and build costs in the status and metrics (#33): a
server whose policy chooses depths reports, per depth (0 = PLAIN), the steps,
request-steps, tokens and mean accept length, and what building each depth's
runtime state cost; a binary server shows exactly what it showed before."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from support.metrics_probe import scrape_lines
from support.plain_stub import OPEN_PLAIN_STEP

from eagle_gate import Mode
from eagle_gate.config import GateConfig
from eagle_gate.depth_stats import BUILD_KEYS, COUNT_KEYS, DepthStats
from eagle_gate.policies import AlwaysSpec
from eagle_gate.runtime import GateRuntime
from eagle_gate.status_record import status_record

BUILD_1 = {
    "built": "adaptive",
    "capture_s": 1.5,
    "mib_total": 600.0,
    "mib_verify_graphs": 128.0,
    "mib_draft_graphs": 64.0,
    "mib_other": 408.0,
    "verify_graph_bs": [1, 2, 4],
    "draft_extend_graph_bs": [1, 2, 4],
}


def runtime(depths=(1, 2, 3), builds=None) -> GateRuntime:
    rt = GateRuntime(
        GateConfig(policy="always"),
        AlwaysSpec(),
        sglang_version="test",
        adapter="test",
        num_draft_tokens=4,
        plain_step=OPEN_PLAIN_STEP,
    )
    if depths is not None:
        rt.enable_depths(depths, SimpleNamespace(depth=3, configured=3), builds)
    return rt


def run_steps(rt: GateRuntime) -> None:
    rt.observe(Mode.SPEC, 0, [2, 1, 2, 2], depth=1)  # 7 tokens, 4 requests
    rt.observe(Mode.SPEC, 1, [4, 1], depth=3)
    rt.observe(Mode.SPEC, 2, [3, 3], depth=3)
    rt.observe(Mode.PLAIN, 3, [1, 1, 1], depth=0)
    rt.observe(Mode.SPEC, 4, [2, 2])  # no depth reported: the configured one


def test_the_status_counts_every_step_at_the_depth_that_ran():
    rt = runtime(builds={1: BUILD_1})
    run_steps(rt)
    depths = json.loads(json.dumps(rt.status()))["depths"]  # JSON-able
    assert depths["set"] == [1, 2, 3]
    assert (depths["configured"], depths["max"]) == (3, 3)
    per = depths["per_depth"]
    assert sorted(per) == ["0", "1", "2", "3"]
    assert {k: per["1"][k] for k in COUNT_KEYS} == {
        "steps": 1,
        "request_steps": 4,
        "tokens": 7,
        "mean_accept": 1.75,
    }
    assert {k: per["3"][k] for k in COUNT_KEYS} == {
        "steps": 3,
        "request_steps": 6,
        "tokens": 15,
        "mean_accept": 2.5,
    }
    assert (per["0"]["steps"], per["0"]["tokens"], per["0"]["mean_accept"]) == (
        1,
        3,
        1.0,
    )
    assert per["2"]["steps"] == 0 and per["2"]["mean_accept"] is None
    # the totals by mode agree with the depths'
    steps = rt.status()["steps"]
    assert steps["spec"] == sum(per[d]["steps"] for d in "123")
    assert steps["plain"] == per["0"]["steps"]


def test_build_costs_show_per_depth_with_the_configured_one_built_at_startup():
    per = runtime(builds={1: BUILD_1}).status()["depths"]["per_depth"]
    assert {k: per["1"][k] for k in BUILD_KEYS} == BUILD_1
    assert per["3"]["built"] == "startup"
    assert all(per["3"][k] is None for k in BUILD_KEYS if k != "built")
    assert all(per["0"][k] is None for k in BUILD_KEYS)  # PLAIN: nothing built
    assert per["2"]["built"] is None  # a build the gate did not see


def test_a_binary_server_has_no_depths_key():
    rt = runtime(depths=None)
    run_steps(rt)
    assert "depths" not in rt.status()
    assert rt.depth_stats is None


def test_counting_allocates_nothing_per_step():
    stats = DepthStats((1, 2, 3), 3)
    lists = (stats.steps, stats.request_steps, stats.tokens)
    sizes = tuple(map(len, lists))
    for depth in (1, 2, 3, None, 0):
        stats.count(Mode.SPEC, depth, 4, 8)
    stats.count(Mode.PLAIN, 2, 4, 4)  # PLAIN counts at 0 whatever it says
    stats.count(Mode.SPEC, 9, 4, 8)  # outside 0..max: counted apart
    now = (stats.steps, stats.request_steps, stats.tokens)
    assert all(a is b for a, b in zip(now, lists, strict=True))
    assert tuple(map(len, lists)) == sizes == (4, 4, 4)
    assert stats.steps == [1, 1, 1, 3]  # None and 0: the configured depth
    assert stats.out_of_range == 1


def test_the_status_record_reads_depths_only_where_the_runtime_has_them():
    rt = runtime()
    assert "depths" in status_record(rt)
    rt.depth_stats = None
    assert "depths" not in status_record(rt)


METRICS_PROBE = r"""
import sys
from types import SimpleNamespace
from eagle_gate.config import GateConfig
from eagle_gate.policies import AlwaysSpec
from eagle_gate.metrics import GateMetrics
from eagle_gate.policy import Mode
from eagle_gate.runtime import GateRuntime

class P:
    name = "p"
    def decide(self, view): return Mode.SPEC
    def observe(self, outcome): pass

rt = GateRuntime(GateConfig("threshold"), P(), sglang_version="9.9", adapter="a",
                 num_draft_tokens=4)
if sys.argv[1] == "depths":
    build = {"built": "adaptive", "capture_s": 2.5, "mib_total": 300.0}
    rt.enable_depths((1, 3), SimpleNamespace(depth=3, configured=3), {1: build})
m = GateMetrics(rt, dp_rank=None, gated=True)
rt.observe(Mode.SPEC, 0, [2, 1, 2], depth=1)
m.export(rt)
rt.observe(Mode.SPEC, 1, [4, 3], depth=3)
rt.observe(Mode.PLAIN, 2, [1, 1], depth=0)
rt.observe(Mode.SPEC, 3, [1, 2], depth=1)
m.export(rt)
m.export(rt)  # idempotent without new steps
"""


def test_metrics_count_per_depth_with_a_depth_label(tmp_path):
    lines = scrape_lines(tmp_path, METRICS_PROBE, "depths")
    expected = [
        'eagle_gate_depth_steps_total{depth="0",dp_rank="0"} 1.0',
        'eagle_gate_depth_steps_total{depth="1",dp_rank="0"} 2.0',
        'eagle_gate_depth_steps_total{depth="3",dp_rank="0"} 1.0',
        'eagle_gate_depth_tokens_total{depth="1",dp_rank="0"} 8.0',
        'eagle_gate_depth_tokens_total{depth="3",dp_rank="0"} 7.0',
        'eagle_gate_depth_request_steps_total{depth="1",dp_rank="0"} 5.0',
        'eagle_gate_depth_request_steps_total{depth="0",dp_rank="0"} 2.0',
        'eagle_gate_depth_build_memory_mib{depth="1",dp_rank="0"} 300.0',
        'eagle_gate_depth_build_seconds{depth="1",dp_rank="0"} 2.5',
        # the mode totals are unchanged
        'eagle_gate_decode_steps_total{dp_rank="0",mode="spec"} 3.0',
    ]
    missing = [e for e in expected if e not in lines]
    assert not missing, sorted(lines)
    # a build cost not measured is no series (not a 0 that reads as "free")
    assert not any(
        line.startswith("eagle_gate_depth_build") and 'depth="3"' in line
        for line in lines
    )


def test_a_binary_server_exports_no_depth_series(tmp_path):
    lines = scrape_lines(tmp_path, METRICS_PROBE, "binary")
    assert 'eagle_gate_decode_steps_total{dp_rank="0",mode="spec"} 3.0' in lines
    assert not [line for line in lines if line.startswith("eagle_gate_depth_")]


def test_a_state_built_outside_the_set_is_never_plains_cost():
    """SGLang's depth-0 state (a 1-token verify, built under an operator's
    own adaptive config) is not PLAIN: its cost shows apart."""
    depths = runtime(builds={0: BUILD_1, 1: BUILD_1}).status()["depths"]
    assert depths["per_depth"]["0"]["built"] is None
    assert depths["per_depth"]["0"]["mib_total"] is None
    assert depths["unused_builds"] == {"0": BUILD_1}
    assert depths["per_depth"]["1"]["mib_total"] == 600.0
    assert runtime().status()["depths"]["unused_builds"] == {}


def test_always_with_a_depth_pins_every_spec_step_to_it():
    """``always depth=d`` (a runtime pin, validate_gpu's section 5 times
    each depth with it): every SPEC step at ``d``; 0 is the configured depth;
    a depth the server cannot run is a policy error (SGLang's step runs), and
    a binary server ignores the pin."""
    rt = runtime()
    rt.policy = AlwaysSpec(depth=2)
    assert [rt.decide(4, 100).depth for _ in range(3)] == [2, 2, 2]
    rt.policy = AlwaysSpec()
    assert rt.decide(4, 100).depth == 3
    rt.policy = AlwaysSpec(depth=5)
    decision = rt.decide(4, 100)
    assert decision.mode is Mode.SPEC and rt.counters.policy_errors == 1
    binary = runtime(depths=None)
    binary.policy = AlwaysSpec(depth=2)
    assert binary.decide(4, 100).mode is Mode.SPEC
    assert binary.counters.policy_errors == 0


def test_the_always_depth_setting_is_checked_at_launch():
    from eagle_gate.plugins import get_policy_factory
    from eagle_gate.settings import SettingsError

    factory = get_policy_factory("always")
    assert factory.settings["depth"].default == 0
    with pytest.raises(SettingsError, match=r"'depth'.*-1.*in \[0, 16\]"):
        factory.settings["depth"].coerce("depth", "-1")
    with pytest.raises(SettingsError, match=r"'depth'.*17"):
        factory.settings["depth"].coerce("depth", 17)
