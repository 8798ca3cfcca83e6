"""Draft depths in the simulator (issue #33): policies choose a depth through
the contract (``view.depth``), outcomes say which depth ran and how many
requests accepted at least j drafts, fixed depths and the depth-aware oracle."""

from __future__ import annotations

import dataclasses

import pytest

from eagle_gate.goodput import Goodput
from eagle_gate.policies import AlwaysSpec, NeverSpec
from eagle_gate.policy import Mode, StepOutcome, StepView
from eagle_gate.sim import Scenario, Segment, Simulator, get_profile
from eagle_gate.sim.baselines import DepthOracleMean, EmaTier, FixedDepth, OracleMean
from eagle_gate.sim.profile_files import profile_from_mapping
from eagle_gate.sim.profiles import crossover_profile, drift_profile


def scenario(level: float = 4.0, dur: float = 2.0, seed: int = 3) -> Scenario:
    return Scenario(name="t", segments=(Segment(dur, level),), seed=seed)


class Spy:
    """Wraps a policy and keeps its views' depths and its outcomes."""

    def __init__(self, inner):
        self.inner = inner
        self.name = inner.name
        self.outcomes = []
        self.offered = set()

    def bind(self, sim):
        bind = getattr(self.inner, "bind", None)
        if bind is not None:
            bind(sim)

    def decide(self, view):
        assert view.depth == view.configured_depth  # reset before each decide
        self.offered.add(view.depths)
        return self.inner.decide(view)

    def observe(self, outcome):
        self.outcomes.append(outcome)
        self.inner.observe(outcome)


def test_profiles_offer_default_depths_plus_the_configured_one():
    prof = get_profile("single-gpu-8b")  # num_draft_tokens 6: depth 5
    assert prof.spec_depths() == (1, 3, 5, 7)
    assert get_profile("long-context").spec_depths() == (1, 3, 5, 7)
    deep = dataclasses.replace(prof, num_draft_tokens=10)
    assert deep.spec_depths() == (1, 3, 5, 7, 9)
    two = dataclasses.replace(prof, num_draft_tokens=3)
    assert two.spec_depths() == (1, 2, 3, 5, 7)
    assert dataclasses.replace(prof, depths=(5,)).spec_depths() == (5,)
    assert dataclasses.replace(prof, depths=(2, 1)).spec_depths() == (1, 2, 5)
    loaded = profile_from_mapping({"name": "x", "depths": [5, 1]})
    assert loaded.spec_depths() == (1, 3, 5)
    with pytest.raises(ValueError, match="depths"):
        profile_from_mapping({"name": "x", "depths": [0, 3]})


def test_old_policies_run_the_configured_depth():
    prof = get_profile("single-gpu-8b")
    spy = Spy(AlwaysSpec())
    Simulator(prof, scenario()).run(spy)
    assert spy.offered == {(1, 3, 5, 7)}
    assert {o.depth for o in spy.outcomes} == {5}
    assert all(len(o.accepted_at_least) == 5 for o in spy.outcomes)


@pytest.mark.parametrize("depth", [1, 5, 7])
def test_a_chosen_depth_runs_and_outcomes_count_acceptance_per_position(depth):
    prof = get_profile("single-gpu-8b")
    spy = Spy(FixedDepth(depth))
    Simulator(prof, scenario()).run(spy)
    assert spy.outcomes
    for o in spy.outcomes:
        assert o.mode is Mode.SPEC and o.depth == depth
        assert max(o.accept_lens) <= depth + 1
        at_least = o.accepted_at_least
        assert len(at_least) == depth
        assert list(at_least) == sorted(at_least, reverse=True)
        assert at_least[0] <= o.batch_size
        # a finished request's output is cut to its length, never raised
        for j in range(1, depth + 1):
            assert at_least[j - 1] >= sum(a >= j + 1 for a in o.accept_lens)
        # the verify's acceptance: exact where no request finished this step
        if sum(o.accept_lens) == o.batch_size + sum(at_least):
            continue
        assert sum(o.accept_lens) < o.batch_size + sum(at_least)
    total = sum(sum(o.accept_lens) for o in spy.outcomes)
    drafts = sum(o.batch_size + sum(o.accepted_at_least) for o in spy.outcomes)
    assert total <= drafts and total > 0.95 * drafts


def test_plain_outcomes_have_depth_0_and_no_per_position_counts():
    spy = Spy(NeverSpec())
    Simulator(get_profile("single-gpu-8b"), scenario()).run(spy)
    assert {(o.depth, o.accepted_at_least) for o in spy.outcomes} == {(0, None)}


def test_a_depth_outside_what_the_simulator_runs_is_refused():
    class Bad:
        name = "bad"

        def decide(self, view):
            view.depth = 65
            return Mode.SPEC

        def observe(self, outcome):
            pass

    with pytest.raises(ValueError, match="depth 65"):
        Simulator(get_profile("single-gpu-8b"), scenario()).run(Bad())


def test_sglang_ema_chooses_depths_through_the_contract():
    # batch 64+: SGLang's tier {0}, a 1-token verify (sim-only depth 0 SPEC)
    spy = Spy(EmaTier())
    Simulator(get_profile("single-gpu-8b"), scenario(level=80.0, dur=1.0)).run(spy)
    big = [o for o in spy.outcomes if o.batch_size >= 64]
    assert big and {(o.mode, o.depth) for o in big} == {(Mode.SPEC, 0)}
    spy = Spy(EmaTier())
    Simulator(get_profile("single-gpu-8b"), scenario(level=1.0)).run(spy)
    assert {o.depth for o in spy.outcomes} <= {1, 3, 5, 7}
    assert len({o.depth for o in spy.outcomes}) > 1


def test_fixed_depths_cost_what_the_model_says():
    prof = get_profile("single-gpu-8b")
    d1 = Simulator(prof, scenario(level=1.0)).run(FixedDepth(1))
    d5 = Simulator(prof, scenario(level=1.0)).run(FixedDepth(5))
    always = Simulator(prof, scenario(level=1.0)).run(AlwaysSpec())
    assert d5.tok_s == always.tok_s  # the configured depth is AlwaysSpec
    assert d1.tok_s != d5.tok_s
    assert d1.decode_steps > d5.decode_steps  # fewer tokens per step


def test_depth_oracle_on_a_binary_profile_is_oracle_mean():
    prof = dataclasses.replace(get_profile("single-gpu-8b"), depths=(5,))
    for level in (1.0, 30.0):
        sc = scenario(level=level)
        om = Simulator(prof, sc).run(OracleMean())
        dor = Simulator(prof, sc).run(DepthOracleMean())
        assert (dor.tok_s, dor.spec_steps) == (om.tok_s, om.spec_steps)


@pytest.mark.parametrize("name,level", [("single-gpu-8b", 2.0), ("close-plain-3", 8.0)])
def test_depth_oracle_beats_every_fixed_depth_and_plain(name, level):
    prof = get_profile(name)
    sc = scenario(level=level, dur=4.0)
    dor = Simulator(prof, sc).run(DepthOracleMean()).tok_s
    others = [Simulator(prof, sc).run(FixedDepth(d)).tok_s for d in prof.spec_depths()]
    others.append(Simulator(prof, sc).run(NeverSpec()).tok_s)
    others.append(Simulator(prof, sc).run(OracleMean()).tok_s)
    assert dor >= 0.995 * max(others)


def test_goodput_runs_the_configured_depth():
    spy = Spy(Goodput())
    Simulator(get_profile("single-gpu-8b"), scenario()).run(spy)
    assert {o.depth for o in spy.outcomes if o.mode is Mode.SPEC} == {5}


@pytest.mark.parametrize(
    "prof",
    [
        get_profile("seed-pcie-tp8"),
        get_profile("close-plain-3"),
        get_profile("close-spec-1"),
        get_profile("single-gpu-8b"),
        drift_profile(),
        crossover_profile(),
    ],
    ids=lambda p: p.name,
)
def test_every_depth_costs_more_than_plain_and_grows_with_depth(prof):
    # depth 0 (SGLang's 1-token verify + extend) is never cheaper than a
    # true decode, and each draft step costs something, on measured tables too
    own = prof.num_draft_tokens - 1
    for b in (1, 4, 8, 16, 32, 64, 128, 250):
        times = [prof.spec_time(b, 1000, s) for s in range(9)]
        assert times[0] > prof.plain_time(b, 1000)
        assert times == sorted(times) and len(set(times)) == len(times)
        assert times[own] == prof.spec_time(b, 1000)


def test_depth_oracle_finds_a_better_depth_than_the_configured_one():
    # close-plain-3 at ~40 clients: depth 1 beats PLAIN and depth 3 by >10%
    prof = get_profile("close-plain-3")
    sc = scenario(level=40.0, dur=4.0)
    spy = Spy(DepthOracleMean())
    dor = Simulator(prof, sc).run(spy).tok_s
    om = Simulator(prof, sc).run(OracleMean()).tok_s
    assert dor > 1.1 * om
    assert 1 in {o.depth for o in spy.outcomes}


def test_sglang_ema_learns_nothing_from_a_depth_0_verify():
    ema = EmaTier()
    view = StepView(num_draft_tokens=4, depths=(1, 3, 5, 7))
    assert ema.decide(view.update(batch_size=8, step=0, seq_len_sum=0)) is Mode.SPEC
    assert view.depth == 3  # tier {0, 1, 3}, nothing seen yet: the deepest
    ema.observe(StepOutcome(Mode.SPEC, 8, 8, (1,) * 8, None, 0, depth=0))
    ema.decide(view.update(batch_size=8, step=1, seq_len_sum=0))
    assert view.depth == 3
    ema.observe(StepOutcome(Mode.SPEC, 8, 8, (1,) * 8, None, 1, depth=1))
    ema.decide(view.update(batch_size=8, step=2, seq_len_sum=0))
    assert view.depth == 1  # nothing accepted at depth 1: draft one more
