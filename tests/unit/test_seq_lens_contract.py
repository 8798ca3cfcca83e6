"""The StepView contract with and without CPU sequence lengths.

SGLang 0.5.23 leaves ``seq_lens_cpu`` / ``seq_lens_sum`` None at the worker
when no attention backend needs CPU lengths (FA3, trtllm_mha: the Hopper and
Blackwell defaults), and ``seq_lens_sum`` None after a batch was filtered or
merged. The gate must stay correct in every case: exact lengths when SGLang
has them, an estimate from request bookkeeping when it does not, None where
nothing is known; and no policy error, no crash in the decision log.
"""

from __future__ import annotations

import json

from support.plain_stub import OPEN_PLAIN_STEP

from eagle_gate.config import GateConfig
from eagle_gate.decision_log import DecisionLog
from eagle_gate.goodput import Goodput
from eagle_gate.policy import Mode, StepView
from eagle_gate.runtime import GateRuntime
from eagle_gate.sim import Scenario, Segment, Simulator, get_profile
from eagle_gate.sim.replay import replay


class Req:
    def __init__(self, committed: int) -> None:
        self.committed = committed


def committed_len(req: Req) -> int:
    committed_len.calls += 1
    return req.committed


committed_len.calls = 0


def test_exact_sum_is_used_as_given():
    view = StepView(req_len=committed_len)
    view.update(batch_size=2, step=0, seq_len_sum=30, seq_lens=[10, 20], reqs=[])
    assert view.seq_len_sum == 30 and view.seq_len_max == 20 and view.seq_lens_exact


def test_sum_from_cpu_lengths_when_sglang_left_the_sum_none():
    # 0.5.23 after filter_batch / merge_batch: seq_lens_sum None, CPU lens kept
    import array

    view = StepView(req_len=committed_len)
    lens = array.array("q", [7, 5, 9])
    view.update(batch_size=3, step=0, seq_len_sum=None, seq_lens=lens)
    assert view.seq_len_sum == 21 and view.seq_len_max == 9
    assert view.seq_lens_exact


def test_estimate_from_requests_is_lazy_and_marked_inexact():
    committed_len.calls = 0
    view = StepView(req_len=committed_len)
    reqs = [Req(100), Req(300)]
    view.update(batch_size=2, step=0, seq_len_sum=None, seq_lens=None, reqs=reqs)
    assert committed_len.calls == 0  # nothing computed unless a policy reads it
    assert view.seq_lens_exact is False
    assert view.seq_len_sum == 400 and view.seq_len_max == 300
    assert view.seq_len_sum == 400
    assert committed_len.calls == 4  # once for the sum, once for the max


def test_unknown_lengths_are_none():
    view = StepView()
    view.update(batch_size=2, step=0, seq_len_sum=None, seq_lens=None, reqs=None)
    assert view.seq_len_sum is None and view.seq_len_max is None
    assert view.seq_lens_exact is False
    view.update(batch_size=0, step=1, seq_len_sum=None)
    assert view.seq_len_max == 0


def runtime(policy, **kwargs):
    return GateRuntime(
        GateConfig("goodput"),
        policy,
        sglang_version="t",
        adapter="t",
        plain_step=OPEN_PLAIN_STEP,
        **kwargs,
    )


def test_goodput_decides_without_lengths_and_without_policy_errors():
    # Before the fix goodput computed ``seq_len_sum // b`` on None: a
    # TypeError on every step, so every step was a policy error (stock SPEC).
    rt = runtime(Goodput(), req_len=committed_len)
    reqs = [Req(50), Req(70)]
    for step in range(200):
        lengths = None if step % 2 else reqs  # estimate, then nothing at all
        decision = rt.decide(2, None, None, lengths)
        mode = decision.mode
        rt.observe(mode, step, [3, 1] if mode is Mode.SPEC else [1, 1])
    assert rt.counters.policy_errors == 0
    assert sum(rt.counters.decisions_by_mode) == 200


def test_decision_log_records_unknown_and_estimated_lengths(tmp_path):
    log = DecisionLog(tmp_path / "d.jsonl", max_per_s=2, clock=lambda: 5.0)
    committed_len.calls = 0
    rt = runtime(Goodput(), req_len=committed_len)
    rt.decision_log = log
    rt.decide(2, None, None, [Req(10), Req(20)])  # estimated
    rt.decide(2, None, None, None)  # unknown
    rt.decide(2, None, None, [Req(10), Req(20)])  # dropped by the rate limit
    log.flush()
    decisions = [
        r
        for r in map(json.loads, (tmp_path / "d.jsonl").read_text().splitlines())
        if r["kind"] == "decision"
    ]
    assert [(d["seq_len_sum"], d["seq_lens_exact"]) for d in decisions] == [
        (30, False),
        (None, False),
    ]
    # goodput does not read the lengths; the log reads the sum of the
    # record it writes (2 requests) and nothing for the one it drops
    assert committed_len.calls == 2


def test_replay_handles_records_without_lengths():
    records = [
        {"kind": "start", "num_draft_tokens": 4},
        {"kind": "decision", "step": 0, "batch_size": 2, "seq_len_sum": None,
         "seq_lens_exact": False, "decided": "spec"},
        {"kind": "decision", "step": 1, "batch_size": 2, "seq_len_sum": 4000,
         "seq_lens_exact": False, "decided": "spec"},
    ]  # fmt: skip
    seen = []

    class Spy:
        name = "spy"

        def decide(self, view):
            seen.append((view.seq_len_sum, view.seq_lens_exact))
            return Mode.SPEC

        def observe(self, outcome):
            pass

    result = replay(records, Spy())
    assert seen == [(None, False), (4000, False)]
    assert result.policy_errors == 0 and result.agreed == 2


def test_simulator_runs_policies_without_lengths():
    profile = get_profile("long-context")
    scenario = Scenario(name="t", segments=(Segment(4.0, 6.0),), seed=3)

    class NoLengthsSeen:
        name = "probe"

        def __init__(self):
            self.inner = Goodput()
            self.sums = set()

        def decide(self, view):
            self.sums.add(view.seq_len_sum)
            return self.inner.decide(view)

        def observe(self, outcome):
            self.inner.observe(outcome)

    probe = NoLengthsSeen()
    blind = Simulator(profile, scenario, cpu_seq_lens=False).run(probe)
    assert probe.sums == {None}
    seeing = Simulator(profile, scenario).run(Goodput())
    assert blind.tokens > 0
    # without lengths goodput still works, within a few percent of seeing them
    assert blind.tok_s > 0.9 * seeing.tok_s
