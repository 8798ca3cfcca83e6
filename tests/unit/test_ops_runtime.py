"""Fast unit tests of the operating pieces: guards in GateRuntime, runtime
control and rank agreement, the decision log, the ops round, metrics export,
the HTTP handler logic and the status view (no server)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from support.metrics_probe import scrape_lines
from support.plain_stub import OPEN_PLAIN_STEP
from support.two_ranks import run_two_ranks

from eagle_gate.adapters.plain.step import PlainStep
from eagle_gate.config import ENV_RESOLVED, GateConfig
from eagle_gate.control import (
    ControlAgreement,
    ControlError,
    ControlFile,
    read_request,
    validate_change,
    write_request,
)
from eagle_gate.decision_log import DecisionLog
from eagle_gate.ops import OpsService, OpsSettings
from eagle_gate.plugins import get_policy_factory
from eagle_gate.policy import Mode
from eagle_gate.runtime import RING_SIZE, GateRuntime, Overrides
from eagle_gate.status import aggregate, read_status
from eagle_gate.statusdir import ENV_LAUNCH, start_launch


class Fixed:
    name = "fixed"

    def __init__(self, mode=Mode.PLAIN):
        self.mode = mode
        self.decided = 0
        self.observed = 0

    def decide(self, view):
        self.decided += 1
        return self.mode

    def observe(self, outcome):
        self.observed += 1


def make(policy=None, **kwargs):
    kwargs.setdefault("plain_step", OPEN_PLAIN_STEP)
    tunables = {
        key: kwargs.pop(key)
        for key in ("tick_every", "decide_budget_s", "plain_failures_to_degrade")
        if key in kwargs
    }
    return GateRuntime(
        GateConfig("threshold", {}),
        policy or Fixed(),
        sglang_version="t",
        adapter="t",
        settings=OpsSettings(**tunables),
        **kwargs,
    )


# -- guards ----------------------------------------------------------------------
def test_slow_decisions_are_counted_with_an_injected_timer(caplog):
    ticks = iter([0.0, 0.0005, 1.0, 1.004, 2.0, 2.010])
    rt = make(timer=lambda: next(ticks), decide_budget_s=0.001)
    for _ in range(3):
        assert rt.decide(2, 10).mode is Mode.PLAIN
    assert rt.counters.slow_decisions == 2
    assert rt.counters.max_decide_s == pytest.approx(0.010)
    assert rt.status()["slow_decisions"] == 2
    assert sum("to decide" in r.message for r in caplog.records) == 1


def test_plain_step_failure_runs_the_stock_step_and_degrades_after_k(caplog):
    rt = make(plain_failures_to_degrade=2)
    calls = []

    def plain_ok(worker, batch):
        return ("plain", batch)

    def plain_bad(worker, batch):
        raise RuntimeError("no plain today")

    def stock(batch):
        calls.append(batch)
        return ("stock", batch)

    def plain(run):
        return PlainStep(run=run, blocker=lambda batch: None)

    rt.decide(1, 1)
    rt.plain_step = plain(plain_bad)
    assert rt.run_plain(None, stock, ("b0",), {}) == (("stock", "b0"), Mode.SPEC)
    rt.decide(1, 1)
    rt.plain_step = plain(plain_ok)
    assert rt.run_plain(None, stock, ("b1",), {}) == (("plain", "b1"), Mode.PLAIN)
    assert rt.counters.consecutive_plain_failures == 0 and rt.degraded is None
    rt.plain_step = plain(plain_bad)
    for i in (2, 3):
        rt.decide(1, 1)
        rt.run_plain(None, stock, (i,), {})
    assert rt.degraded and "2 times in a row" in rt.degraded
    assert rt.counters.plain_step_failures == 3 and calls == ["b0", 2, 3]
    assert rt.counters.overrides[Overrides.PLAIN_STEP_FAILED] == 3
    assert rt.last_decisions()[-1] == {
        "step": 3,
        "batch_size": 1,
        "decided": "plain",
        "ran": "spec",
    }
    # degraded: the policy is not asked any more, every step is stock SPEC
    asked = rt.policy.decided
    assert rt.decide(3, 3).mode is Mode.SPEC
    rt.observe(Mode.SPEC, 4, [1, 1, 1])
    assert rt.policy.decided == asked and rt.policy.observed == 0
    assert rt.counters.overrides[Overrides.DEGRADED] == 1
    status = rt.status()
    assert status["degraded"] is True and status["degraded_at_step"] == 4
    assert status["last_decisions"][-1]["decided"] == "not_asked"
    assert any("DEGRADED" in r.message for r in caplog.records)


def test_policy_errors_are_counted_by_reason():
    class Bad:
        name = "bad"

        def __init__(self):
            self.n = 0

        def decide(self, view):
            self.n += 1
            if self.n == 1:
                raise ValueError("x")
            return "PLAIN"

        def observe(self, outcome):
            raise ValueError("y")

    rt = make(Bad())
    rt.decide(1, 1)
    rt.decide(1, 1)
    rt.observe(Mode.SPEC, 0, [2])
    assert rt.counters.policy_errors_by_reason == {
        "decide_raised": 1,
        "decide_invalid": 1,
        "observe_raised": 1,
    }
    assert [d["decided"] for d in rt.last_decisions()] == ["error", "error"]


def test_ring_keeps_the_last_decisions_in_order():
    rt = make()
    for i in range(RING_SIZE + 5):
        rt.decide(i + 1, 0)
    last = rt.last_decisions()
    assert len(last) == RING_SIZE
    assert [d["step"] for d in last] == list(range(5, RING_SIZE + 5))
    assert last[-1]["batch_size"] == RING_SIZE + 5


def test_dwells_are_recorded_when_the_mode_changes():
    rt = make()
    for mode in [Mode.SPEC] * 3 + [Mode.PLAIN] * 2 + [Mode.SPEC]:
        rt.observe(mode, 0, [1])
    assert list(rt.counters.finished_dwells) == [(0, 3), (1, 2)]
    assert rt.status()["mode"] == "spec"


def test_tick_runs_at_multiples_of_tick_every_and_its_errors_never_escape():
    seen = []

    def tick(runtime, step):
        seen.append(step)
        if step == 4:
            raise OSError("disk gone")

    rt = make(tick_every=4, on_tick=tick)
    for _ in range(10):
        assert rt.decide(1, 1).mode is Mode.PLAIN
    assert seen == [0, 4, 8] and rt.counters.tick_errors == 1
    with pytest.raises(ValueError):
        make(tick_every=3)


def test_policy_estimates_are_optional_and_sanitised():
    class Est(Fixed):
        def estimates(self):
            return {"a": 1, "b": 2.5, "c": "no", "d": True}

    class EstRaises(Fixed):
        def estimates(self):
            raise RuntimeError

    assert make(Est()).status()["estimates"] == {"a": 1.0, "b": 2.5}
    assert make(EstRaises()).status()["estimates"] == {}
    assert make().status()["estimates"] == {}


# -- control --------------------------------------------------------------------------
BASE = GateConfig("threshold", {"plain_above": 16, "spec_at_or_below": 4})


def test_validate_change_merges_or_replaces_settings():
    c = validate_change({"settings": {"plain_above": "20"}}, BASE)
    assert c.policy == "threshold"
    assert c.settings == {
        "plain_above": 20,
        "spec_at_or_below": 4,
        "min_dwell_steps": 32,
    }
    assert validate_change({"policy": "never"}, BASE).settings == {}
    # fields other than policy and settings carry over from the current config
    base = GateConfig("threshold", {}, status_dir="/somewhere")
    assert validate_change({"policy": "never"}, base).status_dir == "/somewhere"


@pytest.mark.parametrize(
    "body, words",
    [
        ([], "JSON object"),
        ({"policy": 3}, "'policy' must be"),
        ({"policy": "turbo"}, "unknown policy 'turbo'; available:"),
        ({"settings": {"plain_above": -1}}, "'plain_above'"),
        ({"settings": {"spec_at_or_below": 99}}, "spec_at_or_below"),
        ({"settings": []}, "'settings' must be"),
        ({"x": 1}, "unknown key 'x'"),
    ],
)
def test_validate_change_names_the_problem(body, words):
    with pytest.raises(ControlError, match=".*") as info:
        validate_change(body, BASE)
    assert words in str(info.value)


def test_requests_are_numbered_and_polled_cheaply(tmp_path):
    cf = ControlFile(tmp_path)
    assert cf.poll() == (0, "")
    r1 = write_request(tmp_path, validate_change({"policy": "never"}, BASE))
    r2 = write_request(tmp_path, validate_change({"policy": "always"}, BASE))
    assert (r1["version"], r2["version"]) == (1, 2)
    version, text = cf.poll()
    assert version == 2 and json.loads(text)["policy"] == "always"
    assert read_request(tmp_path)["version"] == 2
    assert cf.poll() == (version, text)  # unchanged: stat only


def test_ranks_apply_a_change_at_the_same_step(tmp_path):
    """Two ranks in one process: rank 0 reads the file; the stand-in broadcast
    hands rank 1 what rank 0 read at the same tick (as torch_broadcast does)."""
    channel = {}

    def broadcast_for(rank):
        def broadcast(version, text):
            if rank == 0:
                channel["value"] = (version, text)
            return channel["value"]

        return broadcast

    ranks = [
        make(
            tick_every=8,
            tp_rank=r,
            tp_size=2,
            on_tick=ControlAgreement(
                ControlFile(tmp_path), is_source=r == 0, broadcast=broadcast_for(r)
            ),
        )
        for r in (0, 1)
    ]
    switched = {}
    for step in range(40):
        if step == 11:
            write_request(tmp_path, validate_change({"policy": "never"}, BASE))
        for r, rt in enumerate(ranks):
            rt.decide(1, 1)
            if rt.config_version and r not in switched:
                switched[r] = step
    assert switched == {0: 16, 1: 16}
    assert all(rt.config.policy == "never" for rt in ranks)


def test_torch_broadcast_makes_two_processes_switch_at_the_same_step(tmp_path):
    results = run_two_ranks(tmp_path, write_step=6, timeout_s=120)
    # written before step 6 on rank 0; the next tick (step 8) switches both
    assert [r["switched"] for r in results] == [8, 8]
    assert [r["policy"] for r in results] == ["never", "never"]


# -- decision log ---------------------------------------------------------------------
def test_decision_log_records_and_rate_limit(tmp_path):
    now = [100.0]
    log = DecisionLog(tmp_path / "d.jsonl", max_per_s=3, clock=lambda: now[0])
    rt = make(Fixed(Mode.PLAIN), plain_step=None)
    rt.decision_log = log
    log.start({"pid": 1, "policy": "fixed"})
    for i in range(5):
        rt.decide(2, 40)
        rt.observe(Mode.SPEC, i, [3, 1])
    now[0] = 101.5
    rt.decide(2, 42)
    rt.apply_config(GateConfig("never"), 1)
    assert log.flush() > 0
    records = [json.loads(x) for x in (tmp_path / "d.jsonl").read_text().splitlines()]
    kinds = [r["kind"] for r in records]
    assert kinds.count("decision") == 4 and kinds.count("outcome") == 3
    assert kinds[0] == "start" and "config" in kinds
    dropped = [r for r in records if r["kind"] == "dropped"]
    assert dropped == [
        {"v": 1, "kind": "dropped", "t": 101.5, "decisions": 2, "outcomes": 2}
    ]
    d = next(r for r in records if r["kind"] == "decision")
    assert d == {
        "v": 1,
        "kind": "decision",
        "t": 100.0,
        "step": 0,
        "batch_size": 2,
        "seq_len_sum": 40,
        "seq_lens_exact": True,
        "decided": "plain",
        "ran": "spec",
        "override": "plain_step_unavailable",
    }
    o = next(r for r in records if r["kind"] == "outcome")
    assert o["accept_lens"] == [3, 1] and o["tokens"] == 4 and o["mode"] == "spec"
    assert log.flush() == 0


def test_decision_log_is_opt_in(tmp_path):
    assert DecisionLog.from_environment({}) is None
    log = DecisionLog.from_environment(
        {"EAGLE_GATE_DECISION_LOG": str(tmp_path), "EAGLE_GATE_DECISION_LOG_RATE": "7"},
        pid=42,
    )
    assert log.path == tmp_path / "decisions-42.jsonl" and log.max_per_s == 7


# -- the ops round, status and the HTTP handler ---------------------------
def test_ops_settings_from_environment():
    s = OpsSettings.from_environment(
        {"EAGLE_GATE_CONTROL_EVERY": "100", "EAGLE_GATE_DECIDE_BUDGET_US": "250"}
    )
    assert s.tick_every == 128 and s.decide_budget_s == pytest.approx(250e-6)
    assert OpsSettings.from_environment({}).tick_every == 64


def test_idle_ops_round_applies_control_and_writes_status(tmp_path):
    rt = make(state="idle")
    ops = OpsService(rt, tmp_path, gated=False, settings=OpsSettings())
    ops.write_status()
    write_request(tmp_path, validate_change({"policy": "never"}, BASE))
    ops.run_once()
    (record,) = read_status(tmp_path)
    assert record["policy"] == "never" and record["config_version"] == 1
    assert record["state"] == "idle" and record["alive"]
    view = aggregate(tmp_path, [record], read_request(tmp_path))
    assert view["ok"] and not view["pending"] and view["agreement"]["all"]


def test_gated_ops_leave_control_to_the_hot_path(tmp_path):
    control = ControlFile(tmp_path)
    rt = make(tick_every=4, on_tick=ControlAgreement(control, is_source=True))
    ops = OpsService(rt, tmp_path, gated=True, settings=OpsSettings(), control=control)
    write_request(tmp_path, validate_change({"policy": "never"}, BASE))
    ops.run_once()
    assert rt.config_version == 0  # the thread never switches a gating runtime
    rt.decide(1, 1)  # step 0 is a tick
    assert rt.config_version == 1 and rt.config.policy == "never"


def test_aggregate_flags_disagreement_pending_and_degraded(tmp_path):
    a = {"alive": True, "policy": "threshold", "settings": {}, "config_version": 1}
    b = dict(a, config_version=0)
    view = aggregate(tmp_path, [a, b], {"version": 1})
    assert not view["ok"] and view["pending"]
    assert view["agreement"] == {
        "policy": True,
        "settings": True,
        "config_version": False,
        "shadow": True,
        "all": False,
    }
    view = aggregate(tmp_path, [a, dict(a, degraded=True)], {"version": 1})
    assert view["degraded"] and not view["ok"]


@pytest.fixture
def http_env(tmp_path, monkeypatch):
    monkeypatch.setenv(
        ENV_RESOLVED, GateConfig("threshold", {}, status_dir=str(tmp_path)).to_json()
    )
    env: dict = {}
    start_launch(str(tmp_path), env)  # as the launcher does
    monkeypatch.setenv(ENV_LAUNCH, env[ENV_LAUNCH])
    return tmp_path


JSON = {"Content-Type": "application/json"}


def test_control_handler_rules(http_env):
    from eagle_gate import http_api

    code, reply = http_api.handle_change({"policy": "never"}, "192.0.2.7", JSON)
    assert code == 403 and "loopback" in reply["error"]
    code, reply = http_api.handle_change({"policy": "turbo"}, "127.0.0.1", JSON)
    assert code == 400 and "unknown policy 'turbo'" in reply["error"]
    assert read_request(http_env) is None
    code, reply = http_api.handle_change({"policy": "never"}, "127.0.0.1")
    assert code == 415 and "application/json" in reply["error"]
    code, reply = http_api.handle_change({"policy": "never"}, "::1", JSON)
    assert code == 202 and reply["version"] == 1
    assert http_api.current_config().policy == "never"
    # settings of a later change merge over the last requested configuration
    code, reply = http_api.handle_change({"policy": "threshold"}, "127.0.0.1", JSON)
    code, reply = http_api.handle_change(
        {"settings": {"plain_above": 9}}, "127.0.0.1", JSON
    )
    assert reply["version"] == 3 and reply["settings"]["plain_above"] == 9


def test_control_handler_defers_to_sglangs_key_check(http_env, monkeypatch):
    from eagle_gate import http_api

    monkeypatch.setattr(http_api, "configured_keys", lambda: ("k", None))
    assert http_api.handle_change({"policy": "never"}, "192.0.2.7", JSON)[0] == 202
    # with a key, a web page needs the key: its Origin alone is no reason to refuse
    headers = {**JSON, "Origin": "http://dashboard.example"}
    assert http_api.handle_change({"policy": "never"}, "192.0.2.7", headers)[0] == 202


def test_cli_status_from_a_directory(tmp_path):
    ops = OpsService(make(), tmp_path, gated=False, settings=OpsSettings())
    ops.write_status()
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "eagle_gate.cli",
            "status",
            "--status-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    view = json.loads(out.stdout)
    assert view["ok"] and len(view["schedulers"]) == 1


def test_threshold_still_builds_from_its_factory():
    # the control path creates policies through the same factories
    assert get_policy_factory("threshold").create().decide is not None


METRICS_PROBE = r"""
from eagle_gate.config import GateConfig
from eagle_gate.metrics import GateMetrics
from eagle_gate.policy import Mode
from eagle_gate.runtime import GateRuntime

class P:
    name = "p"
    def decide(self, view): return Mode.PLAIN
    def observe(self, outcome): pass
    def estimates(self): return {"gain": 1.25}

rt = GateRuntime(GateConfig("threshold"), P(), sglang_version="9.9", adapter="a")
m = GateMetrics(rt, dp_rank=None, gated=True)
for i in range(5):
    rt.decide(4, 100)
    rt.observe(Mode.SPEC, i, [3, 1, 2, 1])
m.export(rt)
for i in range(3):
    rt.observe(Mode.PLAIN, 5 + i, [1, 1])
rt.observe(Mode.SPEC, 8, [2])
m.export(rt)
m.export(rt)  # idempotent without new steps
"""


def test_metrics_export_deltas_in_multiprocess_mode(tmp_path):
    lines = scrape_lines(tmp_path, METRICS_PROBE)
    expected = [
        'eagle_gate_decode_steps_total{dp_rank="0",mode="spec"} 6.0',
        'eagle_gate_decode_steps_total{dp_rank="0",mode="plain"} 3.0',
        'eagle_gate_decode_tokens_total{dp_rank="0",mode="spec"} 37.0',
        'eagle_gate_decode_tokens_total{dp_rank="0",mode="plain"} 6.0',
        'eagle_gate_spec_overrides_total{dp_rank="0",reason="plain_step_unavailable"}'
        " 5.0",
        'eagle_gate_mode{dp_rank="0",mode="spec"} 1.0',
        'eagle_gate_mode{dp_rank="0",mode="plain"} 0.0',
        'eagle_gate_spec_step_ratio{dp_rank="0"} 0.25',
        # SPEC steps alone: 5 steps x 4 requests (35 tokens), then 1 x 1 (2)
        'eagle_gate_decode_request_steps_total{dp_rank="0",mode="spec"} 21.0',
        'eagle_gate_decode_request_steps_total{dp_rank="0",mode="plain"} 6.0',
        'eagle_gate_spec_accept_length{dp_rank="0"} 2.0',
        'eagle_gate_policy_estimate{dp_rank="0",name="gain"} 1.25',
        'eagle_gate_dwell_steps_count{dp_rank="0",mode="spec"} 1.0',
        'eagle_gate_dwell_steps_sum{dp_rank="0",mode="spec"} 5.0',
        'eagle_gate_dwell_steps_count{dp_rank="0",mode="plain"} 1.0',
        'eagle_gate_degraded{dp_rank="0"} 0.0',
        'eagle_gate_info{adapter="a",dp_rank="0",gated="true",policy="threshold",'
        'sglang_version="9.9"} 1.0',
    ]
    missing = [e for e in expected if e not in lines]
    assert not missing, sorted(lines)
