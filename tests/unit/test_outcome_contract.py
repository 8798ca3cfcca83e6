"""The outcome contract between adapters, the runtime and policies.

``StepOutcome.tokens`` is the sum of ``accept_lens``; a PLAIN step emits one
token per request, a SPEC step 1..num_draft_tokens per request. The runtime
corrects or rejects what a third-party adapter sends outside it (counted in
``invalid_outcomes``); the simulator and the tests' drivers keep it.
"""

from __future__ import annotations

import pytest
from support.plain_stub import OPEN_PLAIN_STEP

from eagle_gate import Mode, StepView
from eagle_gate.config import GateConfig
from eagle_gate.goodput import Goodput
from eagle_gate.policy import StepOutcome
from eagle_gate.runtime import GateRuntime


class Recorder:
    name = "recorder"

    def __init__(self) -> None:
        self.seen: list[StepOutcome] = []

    def decide(self, view):
        return Mode.SPEC

    def observe(self, outcome):
        self.seen.append(outcome)


def runtime(policy, clock=None, k=4) -> GateRuntime:
    kwargs = {"clock": clock} if clock else {}
    return GateRuntime(
        GateConfig(policy="recorder"),
        policy,
        sglang_version="test",
        adapter="test",
        num_draft_tokens=k,
        plain_step=OPEN_PLAIN_STEP,
        **kwargs,
    )


def assert_contract(o: StepOutcome, k: int = 4) -> None:
    assert o.tokens == sum(o.accept_lens)
    assert o.batch_size == len(o.accept_lens)
    if o.mode is Mode.PLAIN:
        assert all(a == 1 for a in o.accept_lens)
    else:
        assert o.batch_size <= o.tokens <= k * o.batch_size


def test_valid_outcomes_pass_unchanged():
    pol = Recorder()
    rt = runtime(pol)
    rt.observe(Mode.SPEC, 0, [3, 1])
    rt.observe(Mode.PLAIN, 1, [1, 1, 1])
    rt.observe(1, 2, [1])  # an int for the mode is fine
    assert getattr(rt, "invalid_outcomes", 0) == 0
    assert [o.tokens for o in pol.seen] == [4, 3, 1]
    assert pol.seen[2].mode is Mode.PLAIN
    for o in pol.seen:
        assert_contract(o)


def test_plain_outcome_with_extra_tokens_is_corrected_and_counted():
    pol = Recorder()
    rt = runtime(pol)
    rt.observe(Mode.PLAIN, 0, [2, 1, 3])
    assert rt.counters.invalid_outcomes == 1
    (o,) = pol.seen
    assert o.tokens == 3 and list(o.accept_lens) == [1, 1, 1]
    assert_contract(o)
    assert rt.counters.tokens_by_mode == [0, 3]


@pytest.mark.parametrize(
    "mode, lens",
    [
        (Mode.SPEC, [0, 0]),  # fewer tokens than requests
        (Mode.SPEC, [5, 5]),  # more than num_draft_tokens each
        ("spec", [1]),  # not a mode
        (7, [1]),
        (Mode.SPEC, [None, 1]),  # not numbers
        (Mode.SPEC, [1.5, 1]),
        (Mode.SPEC, 3),  # not a sequence
    ],
)
def test_outcomes_that_cannot_be_corrected_are_rejected(mode, lens):
    pol = Recorder()
    times = iter([1.0, 2.0, 3.0, 4.0])
    rt = runtime(pol, clock=lambda: next(times))
    rt.observe(Mode.SPEC, 0, [2])
    rt.observe(mode, 1, lens)  # never raises
    rt.observe(Mode.SPEC, 2, [2])
    assert rt.counters.invalid_outcomes == 1
    assert [o.step for o in pol.seen] == [0, 2]
    # the interval after a rejected outcome is unknown
    assert pol.seen[1].interval_s is None
    assert rt.counters.steps_by_mode == [2, 0]


def test_unknown_draft_count_does_not_bound_spec_tokens():
    # adapters that do not say num_draft_tokens (1, the default) keep working
    pol = Recorder()
    rt = runtime(pol, k=1)
    rt.observe(Mode.SPEC, 0, [6, 2])
    assert getattr(rt, "invalid_outcomes", 0) == 0
    assert pol.seen[0].tokens == 8


def test_goodput_only_sees_contract_outcomes_through_the_runtime():
    class Checked(Goodput):
        __slots__ = ()

        def observe(self, outcome):
            assert_contract(outcome)
            super().observe(outcome)

    pol = Checked()
    clock = iter(float(i) * 0.01 for i in range(10_000))
    rt = runtime(pol, clock=lambda: next(clock))
    for i in range(200):
        decision = rt.decide(8, 8 * 1000)
        mode, step = decision.mode, decision.step
        lens = [1] * 8 if mode is Mode.PLAIN else [1 + (i + j) % 4 for j in range(8)]
        if i % 50 == 7:  # a sloppy adapter
            lens = [2] * 8 if mode is Mode.PLAIN else [0] * 8
        rt.observe(mode, step, lens)
    assert rt.counters.invalid_outcomes == 4
    assert rt.counters.policy_errors == 0


def test_simulator_and_test_driver_keep_the_contract():
    from eagle_gate.sim import Scenario, Segment, Simulator, get_profile

    seen = []

    class Spy(Goodput):
        __slots__ = ()

        def observe(self, outcome):
            seen.append(outcome)
            super().observe(outcome)

    prof = get_profile("close-plain-3")
    scen = Scenario("t", (Segment(2.0, 8),), unknown_share=0.25, seed=1)
    Simulator(prof, scen).run(Spy())
    assert seen
    for o in seen:
        assert_contract(o, prof.num_draft_tokens)
    # a quarter of the intervals (plus those after prefills) are unknown
    unknown = sum(o.interval_s is None for o in seen) / len(seen)
    assert 0.2 < unknown < 0.45


def test_view_is_not_needed_for_predicted_plain_rate_of_empty_batch():
    assert Goodput().predicted_plain_rate(StepView(batch_size=0)) is None


def test_draft_matches_of_plain_steps_reach_the_policy_and_the_status():
    pol = Recorder()
    rt = runtime(pol)
    rt.observe(Mode.PLAIN, 0, [1, 1, 1], 2)
    rt.observe(Mode.PLAIN, 1, [1, 1], None)  # lazy/none sync: not measured
    rt.observe(Mode.SPEC, 2, [3, 1, 2, 1])  # two of four accepted a draft token
    assert [o.draft_matches for o in pol.seen] == [2, None, None]
    first = rt.counters.as_status()["first_position_acceptance"]
    assert first["plain"] == {"hits": 2, "requests": 3, "rate": 2 / 3}
    assert first["spec"] == {"hits": 2, "requests": 4, "rate": 0.5}
    assert rt.counters.invalid_outcomes == 0


@pytest.mark.parametrize(
    ("mode", "matches"), [(Mode.SPEC, 1), (Mode.PLAIN, 3), (Mode.PLAIN, -1)]
)
def test_draft_matches_outside_the_contract_are_dropped_and_counted(mode, matches):
    pol = Recorder()
    rt = runtime(pol)
    rt.observe(mode, 0, [2, 1] if mode is Mode.SPEC else [1, 1], matches)
    assert rt.counters.invalid_outcomes == 1
    assert pol.seen[0].draft_matches is None  # the outcome itself still counts
    first = rt.counters.as_status()["first_position_acceptance"]
    assert first["plain"]["requests"] == 0


def test_draft_matches_travel_through_the_tp_agreement():
    from eagle_gate.agreement import TimingAgreement

    pol = Recorder()
    rt = runtime(pol)
    rt.agreement = TimingAgreement(None, every=2)
    rt.decide(2, None, None, None, None)  # step 0: agreement due, nothing held
    rt.observe(Mode.PLAIN, 0, [1, 1], 1)
    assert pol.seen == []  # held
    rt.decide(2, None, None, None, None)  # step 1: not due
    rt.decide(2, None, None, None, None)  # step 2: due: the held outcome goes out
    assert [(o.step, o.draft_matches) for o in pol.seen] == [(0, 1)]
