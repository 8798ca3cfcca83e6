"""The runtime with policy-chosen SPEC depths (``--gate-depths``, #33): the
decision carries the depth, a depth the server cannot run is a policy error,
and the outcome says which depth ran, with per-position acceptance."""

from __future__ import annotations

from types import SimpleNamespace

from support.plain_stub import OPEN_PLAIN_STEP

from eagle_gate import Mode
from eagle_gate.config import GateConfig
from eagle_gate.runtime import GateRuntime


class Chooser:
    name = "chooser"

    def __init__(self) -> None:
        self.depth: int | None = None
        self.mode = Mode.SPEC
        self.seen = []

    def decide(self, view):
        if self.depth is not None:
            view.depth = self.depth
        return self.mode

    def observe(self, outcome):
        self.seen.append(outcome)


def runtime(policy, depths=(1, 2, 3)) -> tuple[GateRuntime, SimpleNamespace]:
    rt = GateRuntime(
        GateConfig(policy="chooser"),
        policy,
        sglang_version="test",
        adapter="test",
        num_draft_tokens=4,
        plain_step=OPEN_PLAIN_STEP,
    )
    control = SimpleNamespace(depth=3, configured=3)
    if depths is not None:
        rt.enable_depths(depths, control)
    return rt, control


def test_the_decision_carries_the_chosen_depth():
    pol = Chooser()
    rt, _ = runtime(pol)
    assert rt.view.depths == (1, 2, 3)
    pol.depth = 1
    assert rt.propose(4, None).depth == 1
    pol.depth = None  # not touched: the configured depth
    assert rt.propose(4, None).depth == 3
    pol.mode = Mode.PLAIN
    d = rt.propose(4, None)
    assert (d.mode, d.depth) == (Mode.PLAIN, 0)


def test_a_depth_the_server_cannot_run_is_a_policy_error():
    pol = Chooser()
    rt, _ = runtime(pol)
    pol.depth = 5
    d = rt.propose(4, None)
    assert d.mode is Mode.SPEC and d.depth == 0  # the configured depth runs
    assert rt.counters.policy_errors
    # on a binary server any other depth is ignored (the contract)
    rt, _ = runtime(Chooser(), depths=None)
    rt.policy.depth = 5
    assert rt.propose(4, None).depth == 0 and not rt.counters.policy_errors


def test_the_outcome_says_which_depth_ran_with_per_position_acceptance():
    pol = Chooser()
    rt, _ = runtime(pol)
    rt.observe(Mode.SPEC, 0, [2, 1, 2, 2], depth=1)
    rt.observe(Mode.SPEC, 1, [4, 1, 3, 2], depth=3)
    rt.observe(Mode.PLAIN, 2, [1, 1], depth=0)
    spec1, spec3, plain = pol.seen
    assert (spec1.depth, spec1.accepted_at_least) == (1, (3,))
    assert (spec3.depth, spec3.accepted_at_least) == (3, (3, 2, 1))
    assert (plain.depth, plain.accepted_at_least) == (0, None)


def test_spec_tokens_are_judged_against_the_depth_that_ran():
    pol = Chooser()
    rt, _ = runtime(pol)
    rt.observe(Mode.SPEC, 0, [3, 3], depth=1)  # depth 1 verifies 2 per request
    assert not pol.seen and rt.counters.invalid_outcomes == 1
    rt.observe(Mode.SPEC, 1, [3, 3], depth=2)
    assert pol.seen[-1].tokens == 6
