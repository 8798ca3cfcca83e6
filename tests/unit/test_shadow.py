"""Shadow mode without a server: the ledger's arithmetic, the runtime (the
policy is asked and observes, every step runs SPEC), the settings from CLI,
environment, file and the control route, the metrics and the replay of a
shadow log. The real speculative server runs it in
``tests/servers/test_spec_e2e.py::test_shadow_mode_runs_stock_steps_and_records_what_it_would_run``.
"""

from __future__ import annotations

import json

import pytest
from support.metrics_probe import scrape_lines
from support.plain_stub import OPEN_PLAIN_STEP

from eagle_gate.config import ConfigError, GateConfig, resolve_config
from eagle_gate.control import (
    ControlAgreement,
    ControlError,
    ControlFile,
    read_request,
    validate_change,
    write_request,
)
from eagle_gate.decision_log import DecisionLog
from eagle_gate.launch import split_argv
from eagle_gate.ops import OpsSettings
from eagle_gate.policy import Mode
from eagle_gate.runtime import GateRuntime
from eagle_gate.shadow import ShadowLedger
from eagle_gate.sim.replay import read_log, replay


class Predicting:
    """PLAIN above a batch size, with a fixed predicted PLAIN rate."""

    name = "predicting"

    def __init__(self, plain_above=2, rate=100.0):
        self.plain_above = plain_above
        self.rate = rate
        self.outcomes = []

    def decide(self, view):
        return Mode.PLAIN if view.batch_size > self.plain_above else Mode.SPEC

    def observe(self, outcome):
        self.outcomes.append((outcome.mode, outcome.step, outcome.tokens))

    def predicted_plain_rate(self, view):
        return self.rate


def make(policy, shadow=True, **kwargs):
    kwargs.setdefault("plain_step", OPEN_PLAIN_STEP)
    return GateRuntime(
        GateConfig("threshold", {}, shadow=shadow),
        policy,
        sglang_version="t",
        adapter="t",
        **kwargs,
    )


# -- the ledger ----------------------------------------------------------------
def test_ledger_retimes_would_plain_steps_at_the_predicted_rate():
    ledger = ShadowLedger()
    ledger.decided(0, False)
    ledger.decided(1, True, lambda view: 50.0)
    ledger.resolved(0, tokens=8, interval_s=0.1)
    ledger.resolved(1, tokens=8, interval_s=0.1)
    # stock: 0.2 s; would: 0.1 s + 8 tokens / 50 tok/s = 0.26 s: a loss
    assert ledger.estimated_gain() == pytest.approx(0.2 / 0.26 - 1)
    ledger.decided(2, True, lambda view: 400.0)
    ledger.resolved(2, tokens=8, interval_s=0.1)
    assert ledger.estimated_gain() == pytest.approx(0.3 / 0.28 - 1)
    snap = ledger.snapshot()
    assert snap["would_run"] == {"spec": 1, "plain": 2}
    assert snap["plain_estimated"] == 2 and snap["plain_without_estimate"] == 0


@pytest.mark.parametrize(
    "rate",
    [None, lambda v: None, lambda v: 0.0, lambda v: float("nan"), lambda v: 1 / 0],
)
def test_a_would_plain_step_without_a_usable_prediction_is_unknown(rate):
    ledger = ShadowLedger()
    ledger.decided(0, True, rate)  # never raises, whatever the policy does
    ledger.resolved(0, tokens=4, interval_s=0.1)
    assert ledger.estimated_gain() is None
    assert ledger.snapshot()["plain_without_estimate"] == 1


def test_ledger_ignores_untimed_steps_and_steps_it_did_not_see():
    ledger = ShadowLedger()
    assert ledger.estimated_gain() is None  # nothing timed yet
    ledger.decided(0, False)
    ledger.resolved(0, tokens=4, interval_s=None)
    ledger.resolved(7, tokens=4, interval_s=0.5)  # not a shadow step
    assert ledger.stock_s == 0.0
    ledger.decided(1, False)
    ledger.resolved(1, tokens=4, interval_s=0.5)
    ledger.resolved(1, tokens=4, interval_s=0.5)  # a step resolves once
    assert ledger.stock_s == 0.5
    assert ledger.estimated_gain() == 0.0  # would SPEC everywhere: no change


# -- the runtime -----------------------------------------------------------------
def test_shadow_runtime_asks_the_policy_and_runs_spec_every_step(tmp_path):
    policy = Predicting(plain_above=2, rate=1000.0)
    rt = make(policy)
    rt.decision_log = DecisionLog(tmp_path / "d.jsonl")
    ran = []
    for bs in [1, 4, 4, 1]:
        decision = rt.decide(bs, 10 * bs)
        mode, number = decision.mode, decision.step
        ran.append(mode)
        rt.observe(mode, number, [2] * bs)
    assert ran == [Mode.SPEC] * 4
    assert rt.counters.steps_by_mode == [4, 0]
    assert rt.counters.decisions_by_mode == [2, 2]  # what the policy said
    assert rt.counters.overrides == {}  # shadow is not an override
    # the policy observed every (SPEC) outcome, as usual
    assert [o[0] for o in policy.outcomes] == [Mode.SPEC] * 4
    status = rt.status()
    assert status["shadow"] is True
    assert status["shadow_totals"]["would_run"] == {"spec": 2, "plain": 2}
    assert [(d["decided"], d["ran"]) for d in status["last_decisions"]] == [
        ("spec", "spec"),
        ("plain", "spec"),
        ("plain", "spec"),
        ("spec", "spec"),
    ]
    rt.decision_log.flush()
    decisions = [r for r in read_log(tmp_path / "d.jsonl") if r["kind"] == "decision"]
    assert [(r["decided"], r["ran"], r["override"]) for r in decisions] == [
        ("spec", "spec", "shadow"),
        ("plain", "spec", "shadow"),
        ("plain", "spec", "shadow"),
        ("spec", "spec", "shadow"),
    ]


def test_shadow_gain_uses_the_measured_intervals():
    clock = iter([0.0, 1.0, 2.0, 3.0])
    rt = make(Predicting(plain_above=2, rate=4.0), clock=lambda: next(clock))
    for bs in (1, 4, 4, 1):
        decision = rt.decide(bs, None)
        mode, step = decision.mode, decision.step
        rt.observe(mode, step, [2] * bs)  # 1 s per step
    # timed: steps 1..3 (step 0 has no interval): 3 s stock; step 1 and 2
    # (8 tokens each, would PLAIN at 4 tok/s) would take 2 s each, step 3 1 s
    assert rt.status()["shadow_totals"]["estimated_gain"] == pytest.approx(3 / 5 - 1)


def test_shadow_switches_at_runtime_and_keeps_the_policy_state(tmp_path):
    policy = Predicting(plain_above=0)
    rt = GateRuntime(
        GateConfig("never"),
        policy,
        sglang_version="t",
        adapter="t",
        plain_step=OPEN_PLAIN_STEP,
        settings=OpsSettings(tick_every=4),
        on_tick=ControlAgreement(ControlFile(tmp_path), is_source=True),
    )
    assert rt.decide(2, None).mode is Mode.PLAIN  # step 0 (a tick): nothing yet
    write_request(tmp_path, validate_change({"shadow": True}, rt.config))
    modes = [rt.decide(2, None).mode for _ in range(7)]  # steps 1..7; tick at 4
    assert modes == [Mode.PLAIN] * 3 + [Mode.SPEC] * 4
    assert rt.shadow and rt.config.policy == "never" and rt.config_version == 1
    # only shadow changed: the same policy object goes on (its learned state
    # is what shadow mode was watching)
    assert rt.policy is policy
    write_request(tmp_path, validate_change({"shadow": False}, rt.config))
    modes = [rt.decide(2, None).mode for _ in range(4)]  # steps 8..11; tick at 8
    assert modes == [Mode.PLAIN] * 4
    assert rt.policy is policy and rt.config_version == 2
    assert rt.status()["shadow_totals"]["would_run"]["plain"] == 4
    # a change of policy or settings builds a new policy, as before
    write_request(tmp_path, validate_change({"policy": "never"}, rt.config))
    for _ in range(4):
        rt.decide(2, None)
    assert rt.config_version == 3 and rt.policy is not policy


def test_a_policy_error_in_shadow_mode_is_counted_like_any_other():
    class Raising(Predicting):
        def decide(self, view):
            raise RuntimeError("boom")

    rt = make(Raising())
    assert rt.decide(3, None).mode is Mode.SPEC
    assert rt.counters.policy_errors == 1
    assert rt.status()["shadow_totals"]["would_run"] == {"spec": 0, "plain": 0}


# -- settings -----------------------------------------------------------------------
def test_shadow_from_cli_env_and_file(tmp_path):
    assert resolve_config(environ={}).shadow is False
    gate_args, rest = split_argv(["--gate-shadow", "--model-path", "m"])
    assert gate_args.gate_shadow == "on" and rest == ["--model-path", "m"]
    assert resolve_config(cli_shadow=gate_args.gate_shadow, environ={}).shadow
    assert resolve_config(environ={"EAGLE_GATE_SHADOW": "on"}).shadow
    path = tmp_path / "gate.toml"
    path.write_text("shadow = true\n")
    assert resolve_config(cli_config=str(path), environ={}).shadow
    # the command line wins over the file
    assert not resolve_config(cli_config=str(path), cli_shadow="off", environ={}).shadow
    config = resolve_config(environ={"EAGLE_GATE_SHADOW": "1"})
    assert GateConfig.from_json(config.to_json()).shadow is True


@pytest.mark.parametrize(
    ("environ", "file_text"),
    [({"EAGLE_GATE_SHADOW": "maybe"}, None), ({}, 'shadow = "sometimes"\n')],
)
def test_a_bad_shadow_value_fails_naming_it(tmp_path, environ, file_text):
    kwargs = {}
    if file_text is not None:
        path = tmp_path / "gate.toml"
        path.write_text(file_text)
        kwargs["cli_config"] = str(path)
    with pytest.raises(
        ConfigError, match=r"shadow: value '(maybe|sometimes)'.*on or off"
    ):
        resolve_config(environ=environ, **kwargs)


def test_control_route_validates_and_stores_shadow(tmp_path):
    base = validate_change(
        {"policy": "threshold", "settings": {"plain_above": 8}}, GateConfig("never")
    )
    config = validate_change({"shadow": True}, base)
    assert config.shadow and config.policy == "threshold"
    assert config.settings == base.settings
    # without "shadow" it stays as it is
    assert validate_change({"policy": "never"}, config).shadow is True
    with pytest.raises(ControlError, match="'shadow' must be true or false, got 'yes'"):
        validate_change({"shadow": "yes"}, base)
    with pytest.raises(ControlError, match="allowed: policy, settings, shadow"):
        validate_change({"shadows": True}, base)
    write_request(tmp_path, config)
    assert read_request(tmp_path)["shadow"] is True
    version, text = ControlFile(tmp_path).poll()
    assert version == 1 and json.loads(text)["shadow"] is True


# -- metrics and replay --------------------------------------------------------------
METRICS_PROBE = r"""
from eagle_gate.config import GateConfig
from eagle_gate.metrics import GateMetrics
from eagle_gate.policy import Mode
from eagle_gate.runtime import GateRuntime

class P:
    def decide(self, view): return Mode.PLAIN if view.batch_size > 2 else Mode.SPEC
    def observe(self, outcome): pass

class Open:  # a plain step that serves every batch (never run: shadow mode)
    before_spec = None
    def blocker(self, batch): return None

t = iter(range(100))
rt = GateRuntime(GateConfig("threshold", shadow=True), P(), sglang_version="9",
                 adapter="a", plain_step=Open(), clock=lambda: next(t))
m = GateMetrics(rt, dp_rank=None, gated=True)
for bs in (4, 4, 1):
    decision = rt.decide(bs, None)
    mode, step = decision.mode, decision.step
    rt.observe(mode, step, [1] * bs)
m.export(rt)
"""


def test_shadow_metrics(tmp_path):
    lines = scrape_lines(tmp_path, METRICS_PROBE)
    for line in (
        'eagle_gate_shadow{dp_rank="0"} 1.0',
        'eagle_gate_shadow_decisions_total{dp_rank="0",mode="plain"} 2.0',
        'eagle_gate_shadow_decisions_total{dp_rank="0",mode="spec"} 1.0',
        # P predicts nothing: the gain is unknown, not zero
        'eagle_gate_shadow_estimated_gain{dp_rank="0"} NaN',
        'eagle_gate_decode_steps_total{dp_rank="0",mode="plain"} 0.0',
    ):
        assert line in lines, (line, sorted(lines))


def test_replay_of_a_shadow_log_shows_the_comparison(tmp_path, capsys):
    policy = Predicting(plain_above=2, rate=1000.0)
    rt = make(policy, clock=iter([float(i) for i in range(100)]).__next__)
    rt.decision_log = DecisionLog(tmp_path / "d.jsonl")
    rt.decision_log.start({"policy": "threshold", "settings": {}, "shadow": True})
    for bs in (1, 4, 4, 1, 4):
        decision = rt.decide(bs, 10 * bs)
        mode, step = decision.mode, decision.step
        rt.observe(mode, step, [2] * bs)
    rt.decision_log.flush()
    live = rt.status()["shadow_totals"]
    result = replay(read_log(tmp_path / "d.jsonl"), Predicting(2, 1000.0))
    assert result.shadow_decisions == 5
    assert result.shadow.snapshot() == live  # same comparison offline

    from eagle_gate.sim.replay import main

    assert main([str(tmp_path / "d.jsonl"), "--policy", "never"]) == 0
    out = capsys.readouterr().out
    assert "shadow log: 5 decisions ran SGLang's stock SPEC step" in out
    assert "'never' would run: spec 0, plain 5" in out
    assert "estimated throughput gain unknown" in out  # never predicts nothing


def test_goodput_in_shadow_mode_probes_on_paper_and_predicts_nothing_unmeasured():
    """goodput learns PLAIN rates from PLAIN steps, which shadow mode never
    runs: its would-PLAIN decisions are its probes, every outcome it sees is
    SPEC, it never errs, and the gain stays unknown (not a made-up zero).
    Switched live, the same policy object goes on."""
    from eagle_gate.goodput import Goodput

    policy = Goodput()
    t = iter(float(i) * 0.01 for i in range(10**6))
    rt = GateRuntime(
        GateConfig("goodput", shadow=True),
        policy,
        sglang_version="t",
        adapter="t",
        plain_step=OPEN_PLAIN_STEP,
        num_draft_tokens=4,
        clock=lambda: next(t),
    )
    for _ in range(3000):
        decision = rt.decide(4, 400)
        mode, step = decision.mode, decision.step
        assert mode is Mode.SPEC
        rt.observe(mode, step, [2, 2, 1, 3])
    totals = rt.status()["shadow_totals"]
    assert rt.counters.policy_errors == 0 and rt.counters.invalid_outcomes == 0
    assert totals["would_run"]["plain"] > 0  # probes, on paper
    assert totals["plain_estimated"] == 0
    assert totals["estimated_gain"] is None
    assert rt.apply_config(GateConfig("goodput", dict(rt.config.settings)), 1)
    assert rt.policy is policy and not rt.shadow
