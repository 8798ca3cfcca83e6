"""The goodput policy on synthetic cost curves (no simulator, no wall clock)."""

from __future__ import annotations

import math

import pytest

from eagle_gate.goodput import (
    GOODPUT_SETTINGS,
    Goodput,
    _bucket_index,
    batch_bucket,
    context_bucket,
    eagle_gate_policies,
)
from eagle_gate.policy import Mode, Policy, StepOutcome, StepView
from eagle_gate.settings import validate_settings


def drive(
    policy,
    steps,
    batch,
    t_plain,
    t_spec,
    acc,
    *,
    resync=0.0,
    none_every=0,
    ctx=1000,
    start=0,
):
    """Run ``steps`` decode steps; outcomes arrive one step late. ``batch``,
    ``t_plain``, ``t_spec``, ``acc`` and ``resync`` may be callables of the
    step."""
    view = StepView(num_draft_tokens=4)
    modes = []
    pending = None
    prev = None
    for i in range(start, start + steps):
        b = batch(i) if callable(batch) else batch
        view.update(batch_size=b, step=i, seq_len_sum=b * ctx)
        mode = policy.decide(view)
        assert isinstance(mode, Mode)
        if pending is not None:
            policy.observe(pending)
        tp = t_plain(i) if callable(t_plain) else t_plain
        ts = t_spec(i) if callable(t_spec) else t_spec
        a = acc(i) if callable(acc) else acc
        if mode is Mode.SPEC:
            if prev is Mode.PLAIN:
                dt = ts + (resync(i) if callable(resync) else resync)
            else:
                dt = ts
            # the contract: tokens == sum(accept_lens), each in 1..k
            tokens = max(b, min(4 * b, round(a * b)))
            q, extra = divmod(tokens, b)
            lens = (q + 1,) * extra + (q,) * (b - extra)
        else:
            dt = tp
            tokens = b
            lens = (1,) * b
        interval = None if none_every and i % none_every == 0 else dt
        assert tokens == sum(lens)
        pending = StepOutcome(mode, b, tokens, lens, interval, i)
        modes.append(mode)
        prev = mode
    if pending is not None:
        policy.observe(pending)
    return modes


def share(modes, mode, last=None):
    xs = modes[-last:] if last else modes
    return sum(m is mode for m in xs) / len(xs)


def test_registered_with_typed_settings():
    (factory,) = eagle_gate_policies()
    assert factory.name == "goodput"
    values = validate_settings(
        "goodput", factory.settings, {"max_explore_share": "0.1"}
    )
    assert values["max_explore_share"] == 0.1
    pol = factory.create(**values)
    assert isinstance(pol, Policy)
    assert pol.name == "goodput"
    assert set(GOODPUT_SETTINGS) == set(values)


def test_buckets_monotone():
    last = -1
    for b in range(1, 5000):
        i = batch_bucket(b)
        assert i >= last
        last = i
    assert batch_bucket(0) == 0
    assert context_bucket(100) == 0
    assert context_bucket(2000) == 1
    assert context_bucket(10_000) == 2
    assert context_bucket(10**7) == 4


def test_picks_plain_where_plain_is_faster():
    # SPEC: 2.2 tokens in 30 ms (73/s), PLAIN: 1 token in 11 ms (91/s)
    pol = Goodput()
    modes = drive(pol, 3000, 4, 0.011, 0.030, 2.2, resync=0.004)
    assert share(modes, Mode.PLAIN, last=2000) > 0.98
    assert pol.explored_share <= pol.max_explore_share + 2 * pol.probe_steps / 3000


def test_picks_spec_where_spec_is_faster():
    # SPEC: 3.3 tokens in 9 ms, PLAIN: 1 token in 6.3 ms
    pol = Goodput()
    modes = drive(pol, 3000, 1, 0.0063, 0.009, 3.3, resync=0.001)
    assert share(modes, Mode.SPEC, last=2000) > 0.98


def test_follows_batch_size_crossover():
    # spec wins at small batches, plain at large ones
    def t_spec(i, b=None):
        return 0.009 + 0.0008 * batch(i)

    def batch(i):
        return 2 if (i // 2000) % 2 == 0 else 128

    pol = Goodput()
    modes = drive(pol, 8000, batch, lambda i: 0.006 + 0.0001 * batch(i), t_spec, 3.0)
    for seg in range(4):
        part = modes[seg * 2000 + 300 : (seg + 1) * 2000]
        want = Mode.SPEC if seg % 2 == 0 else Mode.PLAIN
        assert share(part, want) > 0.95, seg


def test_exploration_within_bound_and_does_not_flap():
    # near a tie with noisy timings: few switches, bounded exploration
    def noisy(base, k):
        return lambda i: base * (1.0 + 0.05 * math.sin(i * k))

    pol = Goodput()
    steps = 20000
    drive(pol, steps, 16, noisy(0.020, 1.3), noisy(0.041, 0.7), 2.0, resync=0.01)
    limit = pol.max_explore_share + (2 * pol.probe_steps + 4 * pol.probe_steps) / steps
    assert pol.explored_share <= limit
    assert pol.switches <= steps / pol.dwell_steps / 4
    assert pol.switches < 50


def resync_share(modes, t_plain, t_spec, resync):
    """Share of the time spent on draft resyncs (first SPEC step after PLAIN)."""
    total = 0.0
    spent = 0.0
    prev = None
    for i, m in enumerate(modes):
        if m is Mode.SPEC:
            total += t_spec(i)
            if prev is Mode.PLAIN:
                total += resync
                spent += resync
        else:
            total += t_plain(i)
        prev = m
    return spent / total


@pytest.mark.parametrize("resync", [0.0005, 0.004, 0.012, 0.03])
def test_resync_time_stays_below_the_setting(resync):
    # the batch flips every 4 steps between a size where SPEC wins by far
    # and one where PLAIN does: following every flip would spend most of the
    # time on resyncs; the measured resync and the dwell keep the share low
    def batch(i):
        return 2 if (i // 4) % 2 == 0 else 128

    def t_plain(i):
        return 0.006 + 0.0001 * batch(i)

    def t_spec(i):
        return 0.009 + 0.0008 * batch(i)

    pol = Goodput()
    modes = drive(pol, 6000, batch, t_plain, t_spec, 3.0, resync=resync)
    # switches, and the probes' resyncs (bounded by explore_cost)
    assert resync_share(modes, t_plain, t_spec, resync) <= (
        pol.switch_overhead + pol.explore_cost
    )
    if resync <= 0.0005:
        # cheap resyncs: it does follow the batch (SPEC at batch 2)
        small = [m for i, m in enumerate(modes) if batch(i) == 2]
        assert share(small[1000:], Mode.SPEC) > 0.3


def test_dearer_resync_switches_less():
    def batch(i):
        return 2 if (i // 4) % 2 == 0 else 128

    counts = []
    for resync in (0.0005, 0.012):
        pol = Goodput()
        drive(
            pol,
            4000,
            batch,
            lambda i: 0.006 + 0.0001 * batch(i),
            lambda i: 0.009 + 0.0008 * batch(i),
            3.0,
            resync=resync,
        )
        counts.append(pol.switches)
    assert counts[1] < counts[0]


def test_none_intervals_are_ignored_for_timing():
    pol = Goodput()
    drive(pol, 3000, 4, 0.011, 0.030, 2.2, none_every=2)
    tp, ts, acc, n_plain, n_spec = pol.bucket_estimates(4, 1000)
    assert tp == pytest.approx(0.011)
    assert ts == pytest.approx(0.030, rel=0.05)
    assert acc == pytest.approx(2.2, rel=0.05)


def test_deterministic_given_inputs():
    a, b = Goodput(), Goodput()
    args = (
        5000,
        lambda i: 1 + (i * 37) % 200,
        0.01,
        lambda i: 0.02 + (i % 7) * 1e-3,
        2.5,
    )
    assert drive(a, *args) == drive(b, *args)


def test_cold_start_and_settings_validation():
    pol = Goodput(initial_mode="plain")
    view = StepView(batch_size=3, step=0, seq_len_sum=3000)
    assert pol.decide(view) is Mode.PLAIN
    with pytest.raises(ValueError):
        validate_settings("goodput", GOODPUT_SETTINGS, {"initial_mode": "maybe"})


def noisy_close_call(spec_gain, seed):
    """Step times with +-12% lognormal noise, noisy accept lengths, a quarter
    of the intervals unknown; SPEC's expected rate is 1 + spec_gain times
    PLAIN's."""
    import random

    rng = random.Random(seed)
    noise = [math.exp(rng.gauss(0.0, 0.12)) for _ in range(1 << 15)]
    accs = [max(1.0, min(4.0, rng.gauss(2.2, 0.27))) for _ in range(1 << 15)]
    t_p = 0.010
    t_s = t_p * 2.2 / (1.0 + spec_gain)
    return (
        lambda i: t_p * noise[(2 * i) & 0x7FFF],
        lambda i: t_s * noise[(2 * i + 1) & 0x7FFF],
        lambda i: accs[i & 0x7FFF],
    )


@pytest.mark.parametrize("spec_gain", [0.05, -0.05])
@pytest.mark.parametrize("initial", ["spec", "plain"])
def test_close_call_converges_to_the_better_mode_from_either_start(spec_gain, initial):
    tp, ts, acc = noisy_close_call(spec_gain, seed=7)
    pol = Goodput(initial_mode=initial)
    modes = drive(pol, 16000, 16, tp, ts, acc, resync=0.002, none_every=4)
    want = Mode.SPEC if spec_gain > 0 else Mode.PLAIN
    assert share(modes, want, last=6000) > 0.85
    assert pol.switches <= 6  # no flapping


def test_no_lock_in_after_a_noisy_start():
    # the old rule left SPEC on one noisy estimate below zero and needed a
    # 5% gain to come back: a true gain of 3% must bring it back
    tp, ts, acc = noisy_close_call(0.03, seed=11)
    pol = Goodput(initial_mode="plain")
    modes = drive(pol, 16000, 16, tp, ts, acc, resync=0.002, none_every=4)
    assert share(modes, Mode.SPEC, last=8000) > 0.85


def settled_at(modes, want, window=1000, every=100):
    """First step (a multiple of ``every``) from which ``want`` runs at least
    90% of the next ``window`` steps; None if never."""
    for i in range(0, len(modes) - window + 1, every):
        if share(modes[i : i + window], want) > 0.9:
            return i
    return None


@pytest.mark.parametrize("spec_gain", [0.03, -0.03])
def test_close_call_from_the_wrong_start_settles_in_hundreds_of_steps(spec_gain):
    # 3% apart, 12% step-time noise: telling the two apart takes ~100 paired
    # samples. Paid from the 3% exploration budget alone that is thousands of
    # steps in the slower mode (up to 11,000 seen over these seeds); probes
    # of the mode the evidence already puts ahead are not charged to it, so
    # every seed settles within 3,000 steps
    want = Mode.SPEC if spec_gain > 0 else Mode.PLAIN
    wrong = "plain" if spec_gain > 0 else "spec"
    settled = []
    leading = []
    for seed in range(10):
        tp, ts, acc = noisy_close_call(spec_gain, seed=seed)
        pol = Goodput(initial_mode=wrong)
        steps = 12000
        modes = drive(pol, steps, 16, tp, ts, acc, resync=0.002, none_every=4)
        settled.append(settled_at(modes, want))
        # the budget still binds the probes it is charged for; the status
        # tells the others apart
        est = pol.estimates()
        charged = est["explored_share"] - est["leading_probe_share"]
        slack = (2 * pol.probe_steps + 4 * pol.probe_steps) / steps
        assert charged <= pol.max_explore_share + slack, (seed, est)
        leading.append(est["leading_probe_share"])
    assert None not in settled, settled
    assert max(settled) <= 3000, settled
    assert max(leading) > 0.0, leading


def test_a_batch_at_a_bucket_edge_does_not_flap():
    # PLAIN 3% ahead; the batch sits at 31 and is 32 on one step in seven
    # (batch buckets 24-31 and 32-47). The rare bucket's probes were paired
    # with a PLAIN EMA that PLAIN had not refreshed there for thousands of
    # steps: its error, shared by every pair, put SPEC 5-8% ahead there, and
    # the policy switched at every crossing (over 1,000 switches in one seed
    # of these ten, 33 in another)
    import random

    for seed in range(10):
        tp, ts, acc = noisy_close_call(-0.03, seed=seed)
        rng = random.Random(seed)
        sizes = [32 if rng.random() < 0.15 else 31 for _ in range(12000)]
        pol = Goodput()
        modes = drive(
            pol, 12000, sizes.__getitem__, tp, ts, acc, resync=0.002, none_every=4
        )
        assert pol.switches <= 5, (seed, pol.switches)
        assert share(modes, Mode.PLAIN, last=8000) > 0.9, seed


def test_probe_acceptance_reopens_a_clear_bucket_only_if_it_could_flip_it():
    # PLAIN is clearly ahead (SPEC: 2 tokens in 30 ms, PLAIN: 1 in 10 ms).
    # Recent probes' acceptance 2-4 standard errors off the estimate makes a
    # bucket unclear (re-probed at once, longer) only when the decision would
    # not stand with it: 2.2 leaves PLAIN ahead, 3.5 puts SPEC ahead
    pol = Goodput()
    drive(pol, 6000, 2, 0.010, 0.030, 2.0, resync=0.003)
    idx = batch_bucket(2)  # context bucket 0 (1000 tokens per request)
    assert pol._home is Mode.PLAIN and pol._clear[idx]
    assert pol._stands(idx, 2.2)
    assert not pol._stands(idx, 3.5)
    assert not pol._stands(batch_bucket(64), 2.0)  # no paired evidence there


class _UncachedGoodput(Goodput):
    """Goodput without its shortcuts: the paired test runs on every step (its
    cached verdict never holds) and every bucket is re-checked for warmth."""

    __slots__ = ()

    def decide(self, view):
        self._vgen += 1
        self._warm[:] = [False] * len(self._warm)
        return super().decide(view)


def _close_call_moving(seed):
    """A close call with noise, batch sizes moving across buckets,
    acceptance dropping, then rising again, and the resync changing."""
    tp, ts, _ = noisy_close_call(0.02, seed=seed)

    def acc(i):
        return 2.2 if i < 5000 or i >= 9000 else 1.7

    def batch(i):
        return 4 + (i // 50) % 60

    def resync(i):  # the draft's catch-up gets dearer, then cheaper
        return 0.002 if i < 3000 else 0.03 if i < 7000 else 0.0005

    return batch, tp, ts, acc, resync


def _crossover_back_and_forth(seed):
    """SPEC clearly ahead at batch 2, PLAIN at batch 128, the batch moving
    between the two every 40 + seed steps: the home mode switches in one
    bucket and must be re-tested in the other."""

    def batch(i):
        return 2 if (i // (40 + seed)) % 2 == 0 else 128

    def t_spec(i):
        return 0.009 + 0.0008 * batch(i)

    def t_plain(i):
        return 0.006 + 0.0001 * batch(i)

    return batch, t_plain, t_spec, 3.0, 0.002


class _WatchedGoodput(Goodput):
    """Goodput counting the steps whose bucket's cached verdict is current."""

    __slots__ = ("verdict_current",)

    def __init__(self) -> None:
        super().__init__()
        self.verdict_current = 0

    def decide(self, view):
        b = view.batch_size
        idx = _bucket_index(b, view.seq_len_sum // b)
        self.verdict_current += self._vseen[idx] == self._vgen
        return super().decide(view)


@pytest.mark.parametrize("scenario", [_close_call_moving, _crossover_back_and_forth])
@pytest.mark.parametrize("seed", [1, 2])
def test_shortcuts_do_not_change_decisions(scenario, seed):
    # decide skips the paired test while none of its inputs changed, and
    # the cold-bucket check once a bucket is warm: decisions must be the
    # same, step for step, as without those shortcuts
    batch, tp, ts, acc, resync = scenario(seed)
    cached = _WatchedGoodput()
    modes = drive(cached, 12000, batch, tp, ts, acc, resync=resync, none_every=4)
    uncached = _UncachedGoodput()
    assert (
        drive(uncached, 12000, batch, tp, ts, acc, resync=resync, none_every=4) == modes
    )
    assert cached.switches == uncached.switches > 0
    # the shortcut was there to take on many steps
    assert cached.verdict_current > 1000, cached.verdict_current


def test_estimates_contract_and_predicted_plain_rate():
    pol = Goodput()
    est = pol.estimates()  # no arguments: the runtime's optional contract
    assert isinstance(est, dict)
    assert all(isinstance(v, float) for v in est.values())
    view = StepView(batch_size=8, step=0, seq_len_sum=8000)
    assert pol.predicted_plain_rate(view) is None  # nothing measured yet
    drive(pol, 3000, 8, 0.010, 0.030, 2.2, resync=0.004)
    est = pol.estimates()
    assert {"accept_length", "resync_rel", "explored_share"} <= set(est)
    assert est["plain_tok_s"] == pytest.approx(8 / 0.010, rel=0.01)
    assert all(isinstance(v, float) for v in est.values())
    rate = pol.predicted_plain_rate(view.update(batch_size=8, step=1, seq_len_sum=8000))
    assert rate == pytest.approx(800.0, rel=0.01)
    # a neighbouring batch bucket stands in; far away: None
    assert pol.predicted_plain_rate(
        view.update(batch_size=10, step=2, seq_len_sum=10000)
    ) == pytest.approx(10 / 0.010, rel=0.01)
    far = view.update(batch_size=200, step=3, seq_len_sum=None)
    assert pol.predicted_plain_rate(far) is None
    assert pol.predicted_plain_rate(object()) is None  # never raises

    from eagle_gate.runtime import policy_estimates

    assert policy_estimates(pol) == est
