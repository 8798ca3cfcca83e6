"""A decision log written by a real GateRuntime replays through the simulator's
replay: the logged policy reproduces its own decisions exactly; another policy
shows where it would have differed on the same views and outcomes."""

from __future__ import annotations

import subprocess
import sys

from support.plain_stub import OPEN_PLAIN_STEP

from eagle_gate.config import GateConfig
from eagle_gate.decision_log import DecisionLog
from eagle_gate.plugins import get_policy_factory
from eagle_gate.policy import Mode
from eagle_gate.runtime import GateRuntime
from eagle_gate.sim.replay import read_log, replay


def write_log(tmp_path, steps=300):
    """Drive goodput through a GateRuntime with a decision log, outcomes one
    step late like the overlap scheduler, and timings that favour SPEC at small
    batches and PLAIN at large ones."""
    now = [0.0]
    runtime = GateRuntime(
        GateConfig("goodput"),
        get_policy_factory("goodput").create(),
        sglang_version="test",
        adapter="test",
        num_draft_tokens=4,
        plain_step=OPEN_PLAIN_STEP,
        clock=lambda: now[0],
    )
    log = DecisionLog(tmp_path / "decisions-1.jsonl", max_per_s=10**6)
    runtime.decision_log = log
    log.start({"policy": "goodput", "settings": {}, "num_draft_tokens": 4})
    previous = None
    for i in range(steps):
        batch = 2 if (i // 100) % 2 == 0 else 64
        decision = runtime.decide(batch, batch * 50)
        mode, step = decision.mode, decision.step
        if previous is not None:
            ran, ran_step, ran_batch = previous
            spec_cost = 0.010 + 0.0008 * ran_batch
            now[0] += spec_cost if ran is Mode.SPEC else 0.008 + 0.0001 * ran_batch
            runtime.observe(ran, ran_step, [3 if ran is Mode.SPEC else 1] * ran_batch)
        previous = (mode, step, batch)
    log.flush()
    return tmp_path / "decisions-1.jsonl", runtime


def test_the_logged_policy_reproduces_its_decisions(tmp_path):
    path, runtime = write_log(tmp_path)
    result = replay(read_log(path), get_policy_factory("goodput").create())
    assert result.decisions == 300 and result.outcomes == 299
    assert result.comparable == 300
    assert result.agreed == 300, result.first_differences
    assert result.by_mode == {
        "spec": runtime.counters.decisions_by_mode[Mode.SPEC],
        "plain": runtime.counters.decisions_by_mode[Mode.PLAIN],
    }
    assert result.by_mode["spec"] and result.by_mode["plain"]


def test_another_policy_shows_where_it_differs(tmp_path):
    path, _ = write_log(tmp_path)
    result = replay(read_log(path), get_policy_factory("always").create())
    assert result.by_mode == {"spec": 300, "plain": 0}
    assert result.agreed == result.logged_by_mode["spec"] < 300
    step, logged, replayed = result.first_differences[0]
    assert (logged, replayed) == ("plain", "spec")


def test_replay_command_line(tmp_path):
    path, _ = write_log(tmp_path)
    out = subprocess.run(
        [sys.executable, "-m", "eagle_gate.sim", "replay", str(path)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "replayed 300 decisions and 299 outcomes" in out.stdout
    assert "agreement 100.0%" in out.stdout
