"""The alternating-acceptance workload (simulated time only): the mechanics of
``Scenario.reclass_running``, what the ``alternating-a40`` profile promises
(the oracle flips with the phase at small batches, PLAIN wins both phases at
batch 128), and goodput against ``ALTERNATING_TARGETS`` (the mean over
seeds 0..2 per row, no seed more than 0.03 below; seeds spaced as in
``examples/sim_seeds.py --alternating``, whose table shows the same figures).
"""

from __future__ import annotations

import statistics

import pytest
from support.suite_rows import SEED_STRIDE

from eagle_gate.goodput import Goodput
from eagle_gate.policies import AlwaysSpec, NeverSpec
from eagle_gate.policy import Mode
from eagle_gate.sim import Scenario, Segment, Simulator
from eagle_gate.sim.baselines import OracleMean
from eagle_gate.sim.profiles import alternating_profile
from eagle_gate.sim.workloads import ALTERNATING_TARGETS, alternating_rows

SEEDS = range(3)
#: how far below the target one seed may fall
SEED_SLACK = 0.03

HI, LO = {"hi": 1.0}, {"lo": 1.0}


def _alternating(reclass: bool, c: int = 8, phases: int = 6, seed: int = 7):
    """``phases`` segments of 150 PLAIN steps at ``c`` clients, {hi:1} and
    {lo:1} by turns: outputs of 200-800 tokens span several phases."""
    prof = alternating_profile()
    dur = 150 * prof.plain_time(c, 0)
    segs = tuple(Segment(dur, c, HI if i % 2 == 0 else LO) for i in range(phases))
    sc = Scenario(
        name="alt-mechanics",
        segments=segs,
        seed=seed,
        max_delay=2,
        reclass_running=reclass,
    )
    return prof, sc


def _count_phases(sim: Simulator, phase: list[int]) -> None:
    """Count the simulator's segment boundaries, as it reclasses, into
    ``phase[0]`` (the index of the current segment; reclass_running only)."""
    inner = sim._reclass_running

    def counting(class_probs):
        phase[0] += 1
        inner(class_probs)

    sim._reclass_running = counting


class _Inspect(NeverSpec):
    """Always PLAIN; at every decision records the segment (counted at each
    reclassing), the class of every running request (by request id) and
    whether the acceptance pool of each is its class's."""

    def __init__(self) -> None:
        self.sim = None
        self.phase = [0]
        self.seen: list[tuple[int, dict[int, str]]] = []
        self.pool_mismatch = 0

    def bind(self, sim) -> None:
        self.sim = sim
        _count_phases(sim, self.phase)

    def decide(self, view):
        sim = self.sim
        classes = {}
        for i, rid in enumerate(sim._run_id):
            cls = sim._r_class[rid]
            classes[rid] = cls
            self.pool_mismatch += sim._run_pool[i] is not sim._pools[cls]
        self.seen.append((self.phase[0], classes))
        return super().decide(view)


def test_reclass_running_moves_every_running_request_at_each_boundary():
    """With ``reclass_running`` every running request takes the new phase's
    class at each boundary: at every decision the whole batch is of the
    current phase's class (hi in even phases, lo in odd ones), and each
    request's acceptance pool is its class's. Fails if the engine does not
    reclass (requests admitted in a hi phase stay hi in the lo phase), if it
    reclasses with the previous segment's mix, or if ``_reclass_running``
    moves the class but not the pool the acceptance draws come from."""
    prof, sc = _alternating(reclass=True)
    pol = _Inspect()
    Simulator(prof, sc).run(pol)
    n = len(sc.segments)
    assert pol.phase[0] == n - 1  # every boundary, once
    assert pol.pool_mismatch == 0
    phases = [p for p, _ in pol.seen]
    assert phases == sorted(phases)
    for phase in range(n):
        want = "hi" if phase % 2 == 0 else "lo"
        decisions = [(k, c) for k, (p, c) in enumerate(pol.seen) if p == phase]
        assert len(decisions) > 50, (phase, len(decisions))
        # right after the boundary, and at every decision of the phase
        wrong = [
            (k, rid, cls)
            for k, classes in decisions
            for rid, cls in classes.items()
            if cls != want
        ]
        assert not wrong, (phase, want, wrong[:5])
    # requests run across boundaries: the check above was not vacuous
    spans: dict[int, set[int]] = {}
    for phase, classes in pol.seen:
        for rid in classes:
            spans.setdefault(rid, set()).add(phase)
    assert sum(len(p) > 1 for p in spans.values()) >= 8


def test_without_reclass_running_requests_keep_their_class():
    """Without ``reclass_running`` a request keeps the class it was drawn
    with until it finishes, so batches are mixed after a boundary. Fails if
    the engine reclasses regardless of the flag (or reclasses requests at
    some other point)."""
    prof, sc = _alternating(reclass=False)
    pol = _Inspect()
    Simulator(prof, sc).run(pol)
    assert pol.phase[0] == 0  # no reclassing at all
    first: dict[int, str] = {}
    changed = []
    for k, (_, classes) in enumerate(pol.seen):
        for rid, cls in classes.items():
            if first.setdefault(rid, cls) != cls:
                changed.append((k, rid, first[rid], cls))
    assert not changed, changed[:5]
    assert pol.pool_mismatch == 0
    mixed = sum(len(set(c.values())) > 1 for _, c in pol.seen)
    assert mixed > 0.2 * len(pol.seen), (mixed, len(pol.seen))


def _fields(res):
    return (
        res.tokens,
        res.time_s,
        res.decode_steps,
        res.spec_steps,
        res.completed,
        res.total_tokens,
        res.switches,
        res.explored_s,
    )


def test_reclassing_keeps_common_random_numbers():
    """Two runs of one policy on one scenario (mixed reclass draws) give
    identical results, and policies that finish requests at different rates
    see the same requests (prompt and output lengths). Fails if a run's
    randomness is not seeded by the scenario, or if the reclass draws come
    from the request generator (how many requests run at a boundary, and
    when, depends on the policy)."""
    prof = alternating_profile()
    c = 8
    dur = 400 * prof.plain_time(c, 0)
    mixes = ({"hi": 0.7, "lo": 0.3}, {"hi": 0.3, "lo": 0.7})
    segs = tuple(Segment(dur, c, mixes[i % 2]) for i in range(8))
    sc = Scenario("alt-crn", segs, seed=11, max_delay=2, reclass_running=True)
    a = Simulator(prof, sc).run(Goodput())
    b = Simulator(prof, sc).run(Goodput())
    assert _fields(a) == _fields(b)
    sims = {}
    for name, make in (("always", AlwaysSpec), ("never", NeverSpec)):
        sims[name] = sim = Simulator(prof, sc)
        sim.run(make())
    s1, s2 = sims["always"], sims["never"]
    n = min(len(s1._r_prompt), len(s2._r_prompt))
    assert n > 40
    assert len(s1._r_prompt) != len(s2._r_prompt)  # they did differ in pace
    # the reclassing rewrote _r_class; compare what arrival drew: the lengths
    assert s1._r_prompt[:n] == s2._r_prompt[:n]
    assert s1._r_out[:n] == s2._r_out[:n]


class _PhaseModes(OracleMean):
    """oracle-mean, recording (the segment's class, mode) per step: the
    alternating rows' segments are {hi: 1} and {lo: 1} by turns, hi first."""

    def __init__(self) -> None:
        super().__init__()
        self.phase = [0]
        self.steps: list[tuple[str, Mode]] = []

    def bind(self, sim) -> None:
        super().bind(sim)
        _count_phases(sim, self.phase)

    def decide(self, view):
        mode = super().decide(view)
        self.steps.append(("hi" if self.phase[0] % 2 == 0 else "lo", mode))
        return mode


def _mode_share(steps, phase, mode) -> float:
    in_phase = [m for p, m in steps if p == phase]
    assert len(in_phase) > 100, (phase, len(in_phase))
    return sum(m is mode for m in in_phase) / len(in_phase)


@pytest.mark.parametrize("c", [1, 4, 16, 128])
def test_oracle_flips_with_the_phase_below_batch_128_only(c):
    """The profile's promise: at batch 1-16 oracle-mean runs SPEC in hi
    phases and PLAIN in lo phases (and so beats both fixed modes by 3%+), at
    batch 128 it runs PLAIN in both, and always-PLAIN beats always-SPEC by
    more than 15%. Fails if the rows' phases stop flipping the acceptance of
    the running batch (no reclassing, one class throughout) or if the
    profile's step-time ratios move the crossovers (SPEC ahead on lo, or
    ahead on hi at 128)."""
    ((_, prof, make),) = alternating_rows(
        quick=True, syncs=("eager",), periods=(300,), batches=(c,)
    )
    sc = make(0)
    pol = _PhaseModes()
    om = Simulator(prof, sc).run(pol).tok_s
    always = Simulator(prof, sc).run(AlwaysSpec()).tok_s
    never = Simulator(prof, sc).run(NeverSpec()).tok_s
    lo_plain = _mode_share(pol.steps, "lo", Mode.PLAIN)
    if c < 128:
        hi_spec = _mode_share(pol.steps, "hi", Mode.SPEC)
        assert hi_spec >= 0.9 and lo_plain >= 0.9, (hi_spec, lo_plain)
        assert om >= 1.03 * max(always, never), (om, always, never)
    else:
        hi_plain = _mode_share(pol.steps, "hi", Mode.PLAIN)
        assert hi_plain >= 0.99 and lo_plain >= 0.99, (hi_plain, lo_plain)
        assert never > 1.15 * always, (never, always)
        assert om == pytest.approx(never, rel=0.005)


def _goodput_table(rows) -> tuple[list[str], list[str]]:
    """Run goodput and oracle-mean on ``rows`` over SEEDS: (table lines,
    failing rows)."""
    lines = [
        f"{'row':<22} target  mean    worst   per seed (goodput / oracle-mean)",
    ]
    failing = []
    for name, prof, make in rows:
        ratios = []
        target = None
        for seed in SEEDS:
            sc = make(seed * SEED_STRIDE)
            target = ALTERNATING_TARGETS[sc.draft_sync]
            om = Simulator(prof, sc).run(OracleMean()).tok_s
            ratios.append(Simulator(prof, sc).run(Goodput()).tok_s / om)
        mean, worst = statistics.mean(ratios), min(ratios)
        bad = mean < target or worst < target - SEED_SLACK
        failing += [name] if bad else []
        lines.append(
            f"{name:<22} {target:.2f}    {mean:.4f}  {worst:.4f}  "
            + " ".join(f"{r:.4f}" for r in ratios)
            + ("  <- MISS" if bad else "")
        )
    return lines, failing


#: rows that miss their target today (docs/goodput.md, Known misses): none.
#: Lazy sync at batch 1 with phases of 300 steps missed (0.905) until the
#: hold in SPEC judged a drop on at least 16 requests and blind looks were
#: tested as one block (``Goodput._blind_hold``, ``_look_changed``). Strict:
#: a row that starts to miss fails, a known miss that passes must leave.
KNOWN_MISSES: set[str] = set()
#: the same for the quick rows (half as long).
KNOWN_MISSES_QUICK: set[str] = set()


def _check(lines, failing, rows, known=KNOWN_MISSES):
    names = {name for name, _, _ in rows}
    expected = known & names
    table = "\n" + "\n".join(lines)
    assert set(failing) <= expected, "new misses" + table
    assert set(failing) == expected, "known misses now pass: update" + table


@pytest.mark.parametrize("sync", ["eager", "lazy"])
def test_goodput_meets_alternating_targets_fast_subset(sync):
    """goodput within ALTERNATING_TARGETS[sync] of oracle-mean on the
    quick rows at period 300 and 1000, batch 1, 16 and 128 (mean over seeds 0..2;
    no seed more than 0.03 below). Fails for a policy that stays in one mode
    (always-SPEC gets ~0.93 at batch 1-16 and ~0.67 at 128, always-PLAIN
    ~0.83-0.86 at 1-16), or one that follows the acceptance too slowly to
    gain from the phases."""
    rows = alternating_rows(
        quick=True, syncs=(sync,), periods=(300, 1000), batches=(1, 16, 128)
    )
    lines, failing = _goodput_table(rows)
    _check(lines, failing, rows, KNOWN_MISSES_QUICK)


@pytest.mark.slow  # 12 rows x 3 seeds x 2 runs per sync: ~14 s each, 2 cores
@pytest.mark.parametrize("sync", ["eager", "lazy"])
def test_goodput_meets_alternating_targets_full_grid(sync):
    """As the fast subset, on every row of the full grid (quick=False:
    periods 300/1000/3000, batches 1/4/16/128). Fails where goodput loses
    more than the target allows on any row, e.g. by probing SPEC at batch
    128 where it is 33% behind, or flapping at period 300."""
    rows = alternating_rows(quick=False, syncs=(sync,))
    lines, failing = _goodput_table(rows)
    _check(lines, failing, rows)


def test_lazy_sync_holds_spec_where_following_would_be_blind_too_long():
    """Lazy sync, acceptance alternating every 300 steps at batch 4 (quick
    rows, seeds 0-2): PLAIN cannot see a rise, and the looks the budget pays
    at ~1 per 200 steps find it late, so leaving SPEC on each drop loses
    more in the next high phase than it gains in the low one: goodput holds
    SPEC there (``Goodput._blind_hold``), from the steps between changes
    seen; a rise a look found late is left out of those (it would make the
    low phases look long). Goodput / oracle-mean: 0.954 (worst seed
    0.947); when the hold came (#32, before the block test on looks):
    0.962, without it 0.922, counting late rises 0.932."""
    rows = alternating_rows(quick=True, syncs=("lazy",), periods=(300,), batches=(4,))
    lines, failing = _goodput_table(rows)
    assert not failing, "\n".join(lines)
    mean = float(lines[1].split()[5])
    assert mean >= 0.95, "\n".join(lines)
