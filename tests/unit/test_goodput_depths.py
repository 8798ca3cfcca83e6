"""``goodput-depths`` (issue #33, a first version): goodput that also chooses
the SPEC depth. On a binary server it is goodput, step for step."""

from __future__ import annotations

import dataclasses

import pytest
from support.suite_rows import SEED_STRIDE

from eagle_gate.goodput import Goodput
from eagle_gate.goodput_depths import GoodputDepths
from eagle_gate.policy import Mode, StepOutcome, StepView
from eagle_gate.sim import Scenario, Segment, Simulator, get_profile
from eagle_gate.sim.baselines import DepthOracleMean
from eagle_gate.sim.workloads import policy_suite


def scenario(level: float, dur: float = 4.0, seed: int = 3) -> Scenario:
    return Scenario(name="t", segments=(Segment(dur, level),), seed=seed)


class Spy:
    def __init__(self, inner, strip: bool = False):
        self.inner = inner
        self.name = inner.name
        self.strip = strip
        self.depths: set[tuple[Mode, int | None]] = set()

    def decide(self, view):
        return self.inner.decide(view)

    def observe(self, outcome):
        self.depths.add((outcome.mode, outcome.depth))
        if self.strip:  # an adapter without per-position counts
            outcome = dataclasses.replace(outcome, accepted_at_least=None)
        self.inner.observe(outcome)


@pytest.mark.parametrize(
    "name,level", [("single-gpu-8b", 30.0), ("close-plain-3", 40.0)]
)
def test_on_a_binary_server_it_is_goodput(name, level):
    prof = get_profile(name)
    binary = dataclasses.replace(prof, depths=(prof.num_draft_tokens - 1,))
    sc = scenario(level)
    spy = Spy(GoodputDepths())
    gd = Simulator(binary, sc).run(spy)
    gp = Simulator(binary, sc).run(Goodput())
    assert (gd.tok_s, gd.spec_steps, spy.inner.switches) == (
        gp.tok_s,
        gp.spec_steps,
        gp.switches,
    )
    assert {d for m, d in spy.depths if m is Mode.SPEC} == {prof.num_draft_tokens - 1}


def test_on_a_binary_suite_row_it_is_goodput():
    name, prof, make = policy_suite(quick=True)[0]  # acc-down b1, 1-2 late
    binary = dataclasses.replace(prof, depths=(prof.num_draft_tokens - 1,))
    sc = make(0)
    gd = Simulator(binary, sc).run(GoodputDepths())
    gp = Simulator(binary, sc).run(Goodput())
    assert gd.tok_s == gp.tok_s and gd.switches == gp.switches


def test_it_finds_a_shallower_depth_that_beats_both_modes():
    # close-plain-3 at ~40 clients: depth 1 is 13% ahead of PLAIN and depth 3
    prof = get_profile("close-plain-3")
    sc = scenario(40.0)
    spy = Spy(GoodputDepths())
    gd = Simulator(prof, sc).run(spy).tok_s
    gp = Simulator(prof, sc).run(Goodput()).tok_s
    dor = Simulator(prof, sc).run(DepthOracleMean()).tok_s
    assert gd > 1.05 * gp
    assert gd > 0.94 * dor  # (a short run: the first looks weigh)
    assert (Mode.SPEC, 1) in spy.depths


def test_without_per_position_counts_it_stays_at_the_configured_depth():
    prof = get_profile("close-plain-3")
    spy = Spy(GoodputDepths(), strip=True)
    Simulator(prof, scenario(40.0)).run(spy)
    assert {d for m, d in spy.depths if m is Mode.SPEC} == {3}


def outcome(step, depth, at_least, b=8, dt=0.01, mode=Mode.SPEC):
    lens = [1] * b
    for n in at_least:
        for i in range(n):
            lens[i] += 1
    return StepOutcome(
        mode, b, sum(lens), lens, dt, step, depth=depth, accepted_at_least=at_least
    )


def test_per_position_acceptance_extrapolates_deeper_depths():
    pol = GoodputDepths()
    view = StepView(num_draft_tokens=4, depths=(1, 3, 5, 7))
    pol.decide(view.update(batch_size=8, step=0, seq_len_sum=0))
    for step in range(1, 40):  # alpha 0.5 at every position, depth 3
        pol.observe(outcome(step, 3, (4, 2, 1)))
    assert pol._fit()  # (goodput's acceptance: 1.875, what the counts say)
    exp = pol._exp
    assert exp[1] == pytest.approx(1.5)
    assert exp[3] == pytest.approx(1.875)
    assert exp[7] == pytest.approx(2 - 0.5**7)  # beyond depth 3: the last q


def test_an_outcome_at_another_depth_feeds_that_depth_only():
    pol = GoodputDepths()
    view = StepView(num_draft_tokens=4, depths=(1, 3, 5, 7))
    pol.decide(view.update(batch_size=8, step=0, seq_len_sum=0))
    pol.observe(outcome(0, 3, (4, 2, 1)))
    pol.observe(outcome(1, 3, (4, 2, 1)))
    spec_w = pol._times[0].w
    pol.observe(outcome(2, 1, (4,)))
    assert pol._times[0].w == spec_w  # goodput's SPEC line: the home depth's
    assert pol._d_times[1].w == 1.0
    assert pol._d_acc[1].slow == pytest.approx(1.5)


def test_goodput_depths_is_a_built_in_that_reports_its_depths():
    """Installed like ``goodput`` (an entry point), and its estimates name the
    home depth and each timed depth's tokens/s, which the home depth leads
    by the margin a move needs (what a live server's status shows)."""
    import random

    from eagle_gate.plugins import get_policy_factory
    from eagle_gate.policy import StepOutcome, StepView

    policy = get_policy_factory("goodput-depths").create()
    rng = random.Random(1)
    view = StepView(batch_size=4, step=0, num_draft_tokens=4, depths=(1, 2, 3))
    for step in range(1500):
        view.update(batch_size=4, step=step, seq_len_sum=None)
        mode = policy.decide(view)
        depth = view.depth if mode is Mode.SPEC else 0
        lens = []
        for _ in range(4):
            n = 0
            while n < depth and rng.random() < 0.7:
                n += 1
            lens.append(1 + n)
        at_least = tuple(sum(x - 1 >= j for x in lens) for j in range(1, depth + 1))
        policy.observe(
            StepOutcome(
                mode=mode,
                batch_size=4,
                tokens=sum(lens),
                accept_lens=lens,
                interval_s=0.01 * (1 + 0.3 * depth),
                step=step,
                depth=depth,
                accepted_at_least=at_least or None,
            )
        )
    est = policy.estimates()
    rates = {d: est[f"depth_{d}_tokens_per_s"] for d in (1, 2, 3)}
    home = int(est["home_depth"])
    assert est["spec_home"] == 1.0
    assert rates[home] * 1.05 >= max(rates.values()), (home, rates)


# -- the mechanisms of the cost-based depth choice (issue #33) ----------------


def _grid(name: str, c: int, seed: int = 0):
    from eagle_gate.sim.workloads import grid_scenarios

    prof = get_profile(name)
    return prof, dict(grid_scenarios(prof, quick=True, seed=seed))[c]


def test_the_shallowest_depth_is_looked_at_where_it_could_win():
    # single-gpu-8b at C=250: depth 1 is 1.46x PLAIN and 2.5x depth 5 (the
    # configured one); a look at depth 1 (the cheapest SPEC, rated as if it
    # cost a PLAIN step until it ran near this batch) finds it
    prof, sc = _grid("single-gpu-8b", 250)
    spy = Spy(GoodputDepths())
    gd = Simulator(prof, sc).run(spy).tok_s
    gp = Simulator(prof, sc).run(Goodput()).tok_s
    assert (Mode.SPEC, 1) in spy.depths
    assert gd > 1.3 * gp, (gd, gp)


def _feed(pol, view, step, depth, b=8, dt=0.01, at_least=(4, 2, 1)):
    view.update(batch_size=b, step=step, seq_len_sum=0)
    mode = pol.decide(view)
    d = view.depth if mode is Mode.SPEC else 0
    return mode, d


def test_a_depth_probe_runs_until_two_of_its_steps_were_timed():
    # at large batches most steps follow a prefill and go untimed: a probe of
    # probe_steps steps may time nothing, and a look that timed nothing told
    # nothing; it goes on (to 3x probe_steps) until two steps were timed
    pol = GoodputDepths()
    view = StepView(num_draft_tokens=4, depths=(1, 3, 5, 7))
    pol.decide(view.update(batch_size=8, step=0, seq_len_sum=0))
    pol._credit = pol._credit_cap = 10.0
    pol._dprobe_t = 0.01
    pol.decide(view.update(batch_size=8, step=1, seq_len_sum=0))
    assert pol._depth_probe(1, 1) is Mode.SPEC
    ran = 1
    for step in range(2, 40):
        view.update(batch_size=8, step=step, seq_len_sum=0)
        if pol._dprobe_left and pol._probe_on():
            ran += 1
            timed = step >= 8  # steps 1-7 go untimed
            pol.observe(outcome(step, 1, (4,), dt=0.01 if timed else None))
        else:
            break
    # (outcomes here arrive at once: it stops after the second timed one)
    assert ran == 9, ran
    assert pol._d_times[1].k == 2

    def fresh_probe(start: int, dt: float | None) -> int:
        """Steps a new probe of depth 1 from ``start`` runs, each timed
        ``dt`` (None: untimed)."""
        pol._d_times[1] = type(pol._d_times[1])()
        pol._credit = 10.0
        pol._depth_probe(1, start)
        ran = 1
        for step in range(start + 1, start + 40):
            if not (pol._dprobe_left and pol._probe_on()):
                break
            ran += 1
            pol.observe(outcome(step, 1, (4,), dt=dt))
        return ran

    # where its steps are timed, a probe is probe_steps long
    assert fresh_probe(50, 0.01) == pol.probe_steps
    # where none of its steps is timed it stops at 3x probe_steps: the steps
    # past that cost more than the timing they might buy (single-gpu-8b
    # C=250: 4x ran 12 steps of a depth ~25% behind, 0.978 x depth-oracle
    # on seed 0; 3x 0.984)
    assert fresh_probe(100, None) == 3 * pol.probe_steps


def test_a_probe_beyond_the_deepest_line_takes_the_shallowest_depth_it_could():
    # single-gpu-8b C=250: once depth 1 ran, depths 3, 5 and 7 are rated
    # only by a prior, the segment from PLAIN to depth 1 extended (a lower
    # bound, loosest for the deepest): 5 looked best and was probed (12
    # steps, mostly untimed, at half depth 1's tokens/s). The probe takes
    # the shallowest depth whose prior beats the home depth, 3 here, whose
    # timing then rates 5 and 7 from a nearer segment
    prof, sc = _grid("single-gpu-8b", 250)
    ran = []

    class Rec(GoodputDepths):
        __slots__ = ()

        def observe(self, outcome):
            ran.append((outcome.mode, outcome.depth))
            super().observe(outcome)

    Simulator(prof, sc).run(Rec())
    after = set(ran[ran.index((Mode.SPEC, 1)) :])
    assert (Mode.SPEC, 3) in after
    assert not after & {(Mode.SPEC, 5), (Mode.SPEC, 7)}, sorted(after)


def test_the_acceptance_scale_leaves_the_cap():
    # every position at 0.9, goodput's acceptance far above what depth 3 can
    # give: every scaled position sits at the cap (0.95); when the
    # acceptance comes down the scale must follow (with every position capped
    # the slope is 0, and a Newton step alone stayed put)
    pol = GoodputDepths()
    view = StepView(num_draft_tokens=4, depths=(1, 3, 5, 7))
    pol.decide(view.update(batch_size=10, step=0, seq_len_sum=0))
    for step in range(1, 30):
        pol.observe(outcome(step, 3, (9, 8, 7), b=10))
    pol._accept = 3.9
    for _ in range(4):
        assert pol._fit()
    assert pol._exp[3] == pytest.approx(1 + 0.95 + 0.95**2 + 0.95**3)
    pol._accept = 2.0
    for _ in range(4):
        pol._fit()
    assert pol._exp[3] == pytest.approx(2.0, abs=0.02)


def test_a_depth_never_run_near_this_batch_is_rated_from_the_lines_around_it():
    # single-gpu-8b ramp (C=1..250..1): depth 5 ran at small batches, depth
    # 7 once at batch 10; at batch 100 their lines are far. Rated by their
    # ratio to PLAIN where they ran, depth 7 looked best at batch 70-250 and
    # took the probes that depth 1 needed (0.96 x goodput); rated from the
    # lines near the batch (and depth 1 as the cheapest SPEC) it is 1.15x
    prof = get_profile("single-gpu-8b")
    from eagle_gate.sim.workloads import ramp_scenario

    sc = ramp_scenario(prof, quick=True, seed=0)
    gd = Simulator(prof, sc).run(GoodputDepths()).tok_s
    gp = Simulator(prof, sc).run(Goodput()).tok_s
    assert gd > 1.1 * gp, (gd, gp)


@pytest.mark.parametrize("seed", [0, 2])
def test_depth_choices_wait_while_spec_acceptance_is_a_prediction(seed):
    # acc-up b1: acceptance rises while PLAIN runs; the switch to SPEC comes
    # with goodput's acceptance predicted from the PLAIN side (17% high
    # here). Scaled from it, depth 7 looked 5% ahead of depth 3 and became
    # home (it is 5% behind); the depth choice now waits for 32 requests of
    # SPEC samples, as goodput's own probes of PLAIN do
    name, prof, make = policy_suite(quick=False)[1]
    assert name == "acc-up b1"
    sc = make(seed * SEED_STRIDE)
    gd = Simulator(prof, sc).run(GoodputDepths()).tok_s
    gp = Simulator(prof, sc).run(Goodput()).tok_s
    assert gd > 0.98 * gp, (gd, gp)


def test_decide_and_observe_stay_cheap_with_four_depths():
    """The bytecodes goodput-depths runs per decide + observe with depths
    1, 3, 5, 7 (examples/bench_policy_overhead.py; the whole class hierarchy,
    goodput's included): 811 on CPython 3.11 (goodput alone: 495; 870 and
    554 before goodput's second trim; 840 before
    the noise bar on depth moves, whose standard error costs ~300 at a look,
    one step in 8; the first version: 2,325, a bisection over freshly built
    lists every 4 steps)."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).parents[2] / "examples" / "bench_policy_overhead.py"
    spec = importlib.util.spec_from_file_location("_bench_depths", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    n = bench.count_bytecodes(GoodputDepths, 2000, "walk", (1, 3, 5, 7))
    gp = bench.count_bytecodes(Goodput, 2000, "walk")
    assert n < 1.7 * gp, (n, gp)
    if sys.version_info[:2] == (3, 11):
        assert n < 840, n


def test_from_spec_the_shallowest_depth_is_tried_by_moving_there():
    # single-gpu-8b ramp: at batch 70-250 depth 1 is 1.2-1.6x the home depth
    # (3 or 5). Probed from goodput's budget, the look waited ~60 steps at
    # batch 250 for the budget to refill (0.88 x depth-oracle on seed 0);
    # moved to (its steps are the cheapest SPEC, no resync) it runs at once
    from eagle_gate.sim.workloads import ramp_scenario

    prof = get_profile("single-gpu-8b")
    sc = ramp_scenario(prof, quick=True, seed=0)
    gd = Simulator(prof, sc).run(GoodputDepths()).tok_s
    dor = Simulator(prof, sc).run(DepthOracleMean()).tok_s
    assert gd >= 0.98 * dor, gd / dor
