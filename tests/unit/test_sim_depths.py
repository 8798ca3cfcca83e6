"""Draft depths in the simulator (issue #33): policies choose a depth through
the contract (``view.depth``), outcomes say which depth ran and how many
requests accepted at least j drafts, fixed depths and the depth-aware oracle."""

from __future__ import annotations

import dataclasses

import pytest
from support.suite_rows import SEED_STRIDE, suite_row_ratio

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


# -- goodput-depths against issue #33's bars (quick rows, seed 0 unless said;
# the 5-seed and held-out figures: docs/goodput.md#draft-depths) ------------


def _quick_row(name: str, workload: str, label: str, seed: int = 0):
    from eagle_gate.sim.workloads import close_scenarios, grid_scenarios

    prof = get_profile(name)
    if workload == "grid":
        rows = [
            (f"C={c}", sc) for c, sc in grid_scenarios(prof, True, seed * SEED_STRIDE)
        ]
    else:
        rows = close_scenarios(prof, True, seed * SEED_STRIDE)
    return prof, dict(rows)[label]


def _tok(prof, sc, policy) -> float:
    return Simulator(prof, sc).run(policy).tok_s


def _ema_plain_and_depth_1(prof, sc) -> list[float]:
    """sglang-ema's, PLAIN's and fixed depth 1's tok/s (ema first)."""
    return [_tok(prof, sc, p) for p in (EmaTier(), NeverSpec(), FixedDepth(1))]


# Why each row failed before (single-gpu-8b, quick, seed 0):
# - C=70: depth 3 takes 4.5% less than the chord of depths 1 and 5 says (its
#   prior; the cost is convex in the depth) and is 3% ahead of depth 1.
#   Judged by the chord alone it was never run: 0.963 (0.964 over seeds
#   0-4); probed where the middle of its bounds wins, it becomes home: 0.997
#   (0.992).
# - C=100: depth 1 at batch 100 is 1.43x PLAIN and 1.58x depth 5 (the
#   configured one); the first goodput-depths never looked at it from PLAIN:
#   0.79.
# - C=250: 300 quick steps, SPEC steps mostly untimed: 0.984 on seed 0, 0.980
#   over seeds 0-4, 0.975 over 5-19 (0.917, 0.954, 0.954 while a probe beyond
#   the deepest line took the depth its prior rated best, 5, and ran to 4x
#   probe_steps untimed; the first version: 0.75).
@pytest.mark.parametrize("label", ["C=70", "C=100", "C=250"])
def test_goodput_depths_reaches_the_depth_oracle_on_single_gpu_8b(label):
    from eagle_gate.goodput_depths import GoodputDepths

    prof, sc = _quick_row("single-gpu-8b", "grid", label)
    gd = _tok(prof, sc, GoodputDepths())
    dor = _tok(prof, sc, DepthOracleMean())
    assert gd >= 0.98 * dor, gd / dor


def test_a_depth_between_two_lines_is_not_probed_where_its_middle_loses():
    # single-gpu-8b C=250, seed 2: depth 3 takes 2.3x depth 1's time. The
    # chord of depths 1 and 5 and the segment PLAIN-depth 1 extended bracket
    # it (1.3-2.8x PLAIN); probed where the lower bound wins, its 9 steps
    # cost 2% of the run (0.959 x depth-oracle, 0.976 without)
    from eagle_gate.goodput_depths import GoodputDepths

    prof, sc = _quick_row("single-gpu-8b", "grid", "C=250", seed=2)
    spy = Spy(GoodputDepths())
    Simulator(prof, sc).run(spy)
    assert {o.depth for o in spy.outcomes if o.mode is Mode.SPEC} == {1, 5}


@pytest.mark.parametrize(("name", "seed"), [("close-plain-1", 2), ("close-spec-3", 4)])
def test_a_move_to_a_depth_not_run_near_the_batch_buys_a_look(name, seed):
    # C=4..64: from PLAIN, depth 1 becomes home at a batch it never ran at,
    # but goodput's budget, drained by a look at depth 3, paid its first look
    # there ~1,000 steps later: 0.951 and 0.959 x fixed depth 1. The move
    # asks goodput for a refill, as a detected change does: 0.992, 0.991
    from eagle_gate.goodput_depths import GoodputDepths

    prof, sc = _quick_row(name, "close", "C=4..64", seed=seed)
    gd = _tok(prof, sc, GoodputDepths())
    assert gd >= 0.98 * _tok(prof, sc, FixedDepth(1))


def test_spec_runs_on_after_a_depth_move_until_samples_back_it():
    # A move from SPEC restarts the new depth's acceptance from the depths'
    # prediction, which can be several percent low; goodput left SPEC on it.
    # long-context ramp seed 1: 0.968 x depth-oracle, 1.004 with SPEC held
    # until 32 requests back the estimate; close-plain-3 C=4..64 seed 4
    # (fixed depth 1 the best): 0.957 -> 0.983
    from eagle_gate.goodput_depths import GoodputDepths
    from eagle_gate.sim.workloads import ramp_scenario

    prof = get_profile("long-context")
    sc = ramp_scenario(prof, True, 1 * SEED_STRIDE)
    gd = _tok(prof, sc, GoodputDepths())
    assert gd >= 0.98 * _tok(prof, sc, DepthOracleMean())
    prof, sc = _quick_row("close-plain-3", "close", "C=4..64", seed=4)
    gd = _tok(prof, sc, GoodputDepths())
    assert gd >= 0.98 * _tok(prof, sc, FixedDepth(1))


def test_goodput_depths_beats_sglang_ema_where_ema_beats_goodput():
    # close-plain-3 at C=32: sglang-ema 2,226 tok/s against goodput's 2,268
    # and PLAIN's 2,267... and depth 1's 2,481: goodput-depths runs depth 1
    from eagle_gate.goodput_depths import GoodputDepths

    prof, sc = _quick_row("close-plain-3", "close", "C=32")
    gd = _tok(prof, sc, GoodputDepths())
    others = _ema_plain_and_depth_1(prof, sc)
    assert gd >= 0.99 * max(others) and gd > others[0], (gd, others)


@pytest.mark.xfail(
    strict=True,
    reason="close-spec-5 C=4..64 seed 1: 0.991 x the best of sglang-ema, fixed "
    "depths and PLAIN (fixed depth 1 there; 0.973 before the refill on a "
    "move), 1.009 x sglang-ema; over seeds 0-4 0.992 (held out 0.994) and "
    "1.011 (the first version: 0.965, 0.983): at the small batches PLAIN and "
    "depths 1 and 3 are within a few percent, and each look at the one not "
    "run costs",
)
def test_goodput_depths_at_least_the_best_of_ema_fixed_depths_and_plain():
    from eagle_gate.goodput_depths import GoodputDepths

    prof, sc = _quick_row("close-spec-5", "close", "C=4..64", seed=1)
    gd = _tok(prof, sc, GoodputDepths())
    others = _ema_plain_and_depth_1(prof, sc)
    assert gd >= max(others), (gd, others)


def test_goodput_depths_within_1_percent_of_goodput_at_c250_on_seed_pcie():
    # SPEC loses at every depth (depth 1 costs 3 PLAIN steps): 1.012 x
    # goodput on seed 0, 1.007 over seeds 0-4, 0.997 held out (the first
    # version: 0.965, 0.972); the look at depth 1 is taken from SPEC at the
    # start, before goodput leaves it, instead of a probe from PLAIN
    from eagle_gate.goodput_depths import GoodputDepths

    prof, sc = _quick_row("seed-pcie-tp8", "grid", "C=250")
    gd = _tok(prof, sc, GoodputDepths())
    gp = _tok(prof, sc, Goodput())
    assert gd >= 0.99 * gp, gd / gp


def test_goodput_depths_within_1_percent_of_goodput_at_close_spec_5_c8():
    # depths 1 and 3 are 2.4% apart under +-12% step-time noise: 1.001 x
    # binary goodput on seed 0 (0.970 with a fixed 2% margin and no probe of
    # a timed rival: after the opening move to depth 1, depth 3's line of
    # ~15 early samples predicted it 7% slower than it is, and nothing ran
    # it again); moves between timed depths now wait for their lines' and
    # positions' noise, and a rival within it is probed at its expected loss
    from eagle_gate.goodput_depths import GoodputDepths

    prof, sc = _quick_row("close-spec-5", "close", "C=8")
    gd = _tok(prof, sc, GoodputDepths())
    gp = _tok(prof, sc, Goodput())
    assert gd >= 0.99 * gp, gd / gp


def _depths_on_suite_row(row: str, seed: int) -> float:
    """goodput-depths' tok/s over depth-oracle's on the policy suite's
    ``row`` (full length) with ``seed``."""
    from eagle_gate.goodput_depths import GoodputDepths

    return suite_row_ratio(row, seed, GoodputDepths(), DepthOracleMean())


def test_goodput_depths_moves_on_noisy_positions_only_beyond_their_noise():
    # acc-up b1 (suite row), seed 8: at batch 1, after the rise, positions
    # beyond the home depth hold few requests; counting only the step-time
    # lines' noise, moves between depths on those positions (each restarting
    # SPEC's acceptance from a prediction) sent goodput to PLAIN for good:
    # 0.925 x depth-oracle. The positions' binomial noise in the move's
    # standard error: 0.989 (over seeds 0-19 0.9883 -> 0.9903, worst seed
    # 0.925 -> 0.979)
    ratio = _depths_on_suite_row("acc-up b1", seed=8)
    assert ratio >= 0.98, ratio


def test_goodput_depths_acceptance_describes_the_home_depth_after_a_cold_start():
    # acc-up b1 (suite row), seed 37: goodput's cold start (no SPEC step
    # timed at the home depth yet) set the acceptance model's depth back to
    # the configured 3 while the home depth was 1; the PLAIN side's rise
    # then predicted 2.67 tokens per depth-1 step (at most 2 can come), the
    # samples slid down from there, the CUSUM took that for a drop and
    # goodput-depths sat in PLAIN through the high phase: 0.918 x
    # depth-oracle; 0.984 with the home depth's model
    ratio = _depths_on_suite_row("acc-up b1", seed=37)
    assert ratio >= 0.97, ratio


def test_goodput_depths_probes_a_rival_only_where_a_probe_brings_enough_requests():
    # acc-down b1 (suite row), seed 7: at batch 1 a probe of 3 steps brings
    # 3 requests, fewer than a position needs to count (8); a rival within
    # the noise was probed at every look (seven probes of depth 5 in 48
    # steps) and the run went on with goodput in PLAIN: 0.898 x
    # depth-oracle; 0.989 without those probes
    ratio = _depths_on_suite_row("acc-down b1", seed=7)
    assert ratio >= 0.97, ratio


def test_goodput_depths_probes_a_rival_at_batch_1_with_enough_steps_now_and_then():
    # acc-down b1 (suite row), seed 25: depth 1 became home at step 19, and
    # through the high phase depth 3 was rated 6% ahead, within the noise of
    # positions 2 and 3, which only ~20 early requests had sampled; with no
    # probe at batch 1 nothing sampled them again: depth 1 held 1,769 steps,
    # 0.901 x depth-oracle. A probe of 8 steps (8 requests) once per 256
    # steps of the rival: 0.972
    ratio = _depths_on_suite_row("acc-down b1", seed=25)
    assert ratio >= 0.96, ratio
