"""How the ``goodput`` policy prices a switch: the draft resync it costs,
and from it the dwell and margin; how long SPEC stays ahead once it is (the
runs of steps where it was), so that entering SPEC gains its resync back;
how often acceptance changes (blind looks follow it), and whether SPEC
holds where PLAIN would be blind. A mix-in of
:class:`eagle_gate.goodput.Goodput` (its state is declared there);
docs/goodput.md says why each is there."""

from __future__ import annotations

import math

from eagle_gate.goodput_estimates import FAST_REQUESTS, Level
from eagle_gate.policy import Mode

__all__ = ["MIN_DWELL", "GoodputSwitching"]

#: at least this many steps between switches: a decision's outcome arrives
#: up to two steps late, plus the step that acts on it.
MIN_DWELL = 3
#: weight of one run (steps from SPEC ahead by the margin to SPEC behind by
#: it, in either mode) in their EMA: entering SPEC must gain its resync back
#: within the runs seen (at most ``stale_steps``): a batch that leaves
#: SPEC's range within 4 steps does not pay a resync of 3 SPEC steps back,
#: and a batch moving 31 <-> 32 across a line's noise entered SPEC every few
#: steps.
_STAY_WEIGHT = 0.25
#: weight of one interval between acceptance changes in their EMA.
_GAP_WEIGHT = 0.25
#: exp() of more than this overflows a float.
_EXP_MAX = 700.0


class GoodputSwitching:
    """Switch costs and the runs and changes they are weighed against."""

    __slots__ = ()
    stale_steps: int
    switch_cost: float
    switch_overhead: float
    _stay: float
    _ahead: int
    _change_step: int
    _change_gap: float
    _req_plain: int
    home: Mode
    _resync_rel: float
    _switch_rel: float
    _dwell: int
    _margin: float
    _exp_margin_lo: float
    _exp_margin_hi: float
    _check_a: float
    _accept: float
    _acc: Level
    max_explore_share: float

    def _stay_left(self, step: int) -> float:
        """How many more steps SPEC stays ahead: what the runs seen say, less
        the ``e`` steps this one has lasted, but at least ``e`` once it
        outlasts them (a batch that settles where SPEC is ahead must not
        stay PLAIN because earlier runs were short)."""
        stay = self._stay
        if self._ahead < 0:
            return stay
        e = step - self._ahead
        return stay - e if e < stay else e

    def _end_run(self, step: int) -> None:
        """A run of steps where SPEC was ahead ended at ``step``: its length
        joins their mean (an EMA from ``stale_steps``): how long
        SPEC stays ahead once it is, so that entering it gains its resync
        back (a batch flipping out of SPEC's range every 4 steps must not
        pay a resync of 3 SPEC steps each time)."""
        stay = self._stay + _STAY_WEIGHT * (step - self._ahead - self._stay)
        self._stay = stay if stay < self.stale_steps else self.stale_steps
        self._ahead = -1

    def _changed(self, step: int) -> None:
        """An acceptance change was detected at ``step``: the steps between
        changes (an EMA) say how often a blind look is worth its loss, and
        whether leaving SPEC pays while blind. A change a look found from
        blind PLAIN came late (by up to the looks' spacing): the interval
        ending there would overstate the gap, so it is not counted."""
        last = self._change_step
        self._change_step = step
        if last < 0 or self.home is Mode.PLAIN and not self._req_plain:
            return
        g = step - last
        gap = self._change_gap
        self._change_gap = g if gap == 0.0 else gap + _GAP_WEIGHT * (g - gap)

    def _blind_hold(self, b: int, gain: float, t_s: float, t_p: float) -> bool:
        """Stay in SPEC after an acceptance drop where PLAIN would be blind
        (lazy/none sync: no PLAIN step ever carried the draft's matches) and
        acceptance changes every ``gap`` steps: PLAIN gains ``-gain`` per
        step until the next change, but a rise is seen only by looks at
        SPEC, which the budget pays every ``L`` steps (each long enough to
        see a change: ~16 requests); the steps until one lands cost the
        rise's gain."""
        gap = self._change_gap
        a_hi = self._check_a
        if self._req_plain or not gap or a_hi <= self._accept:
            return False
        if self._acc.n < FAST_REQUESTS:
            return True
        g_hi = math.log(a_hi * t_p / t_s)
        if g_hi <= 0.0:
            return False
        n = math.ceil(FAST_REQUESTS / b)
        look = (n + self._switch_rel) * t_s / (self.max_explore_share * t_p)
        return -gain * gap < g_hi * (0.5 * look + n) + self._switch_rel

    def _update_switch_costs(self) -> None:
        """What a switch costs (the measured resync, at least ``switch_cost``),
        and from it the dwell and margin: resyncs at most ``switch_overhead``
        of the time, and a switch must gain its cost back within
        ``stale_steps``."""
        rr = self._resync_rel
        if rr < self.switch_cost:
            rr = self.switch_cost
        self._switch_rel = rr
        self._dwell = max(MIN_DWELL, math.ceil(rr / self.switch_overhead))
        self._margin = margin = rr / self.stale_steps
        # (the gain's tests against +-margin, taken on its ratio: no log; a
        # margin past exp's range, from a huge switch_cost, is never reached)
        self._exp_margin_lo = math.exp(-margin)
        self._exp_margin_hi = math.exp(margin) if margin < _EXP_MAX else math.inf
