"""``goodput-depths``: :class:`~eagle_gate.goodput.Goodput` that also chooses
the SPEC depth per batch (issue #33; docs/goodput.md, "Draft depths in the simulator").

On a server with one SPEC depth (``view.depths == (configured,)``, every
server today) it *is* ``goodput``: ``decide`` and ``observe`` go straight to
it, so it decides exactly as ``goodput`` does.

With several depths, ``goodput``'s rule still chooses between PLAIN and SPEC,
where SPEC means the *home depth*; this layer chooses the home depth. Its
estimates (the acceptance's in :mod:`eagle_gate.goodput_depths_estimates`):

* acceptance per position: from ``StepOutcome.accepted_at_least``, per
  position ``j`` the requests that reached ``j - 1`` accepted drafts and
  those of them that accepted the ``j``-th (at most 2,048
  requests' worth each); a depth's expected tokens per request are
  ``1 + q1 + q1 q2 + ...``, positions never seen extrapolated with the last
  one seen, every position scaled by one factor so that the home depth's
  matches ``goodput``'s own acceptance (which follows changes quickly; the
  factor is kept and refined by two Newton steps per look, not solved
  afresh). On a detected change, positions beyond the home depth are
  forgotten;
* step time: one line in the batch size per depth, as ``goodput`` keeps one
  per mode. Where a depth has no line near this batch (within its reach or
  a quarter of its mean batch), its time is a *prior* from the lines that
  are, PLAIN as depth 0: the chord between the nearest around it, beyond the
  deepest the last segment extended (a lower bound where the cost grows
  convexly with the depth); the shallowest depth counts as costing a PLAIN
  step (the cheapest SPEC: only a look says whether it wins). Lines far from
  the batch are used (as their ratio to PLAIN where they ran) only where no
  line is near it: that ratio flatters deep depths at large batches.

Every ``_CHECK_EVERY`` steps, at this batch: from SPEC, the measured depth
with the highest expected tokens/s but the home depth becomes home where
its lead passes ``_DEPTH_MOVE`` and one standard error of the comparison
(the step-time lines' noise, the positions' between the two depths), and
is probed while within two of them (paid at its expected loss;
``probe_steps`` where they bring ``POS_MIN`` requests, else as many steps
as do, once per ``_RIVAL_GAP`` steps since it ran); from PLAIN, the best depth run near
this batch becomes home where it beats the home depth by
``_DEPTH_MARGIN``, and the shallowest depth may become the home depth
before it ran near this batch (``goodput``'s probes of SPEC then run it:
the cheapest SPEC at a large batch is the shallowest depth). From SPEC, the
shallowest depth never run near this batch that could beat the home depth
by the margin becomes home (tried by running it), and the
shallowest other depth known only by its prior that could is probed (the
prior is tightest there; ``probe_steps``, on until two steps were timed, at
most ``_PROBE_MAX`` times that; paid from ``goodput``'s budget, only while
it is at least ``_DEPTH_CREDIT`` full: ``goodput``'s own probes come first).
Where no prior wins, the shallowest depth between two lines is probed where
the middle of its bounds would (the chord above, the segment below extended:
costs grow convexly with the depth), at its loss, once per ``_RIVAL_GAP``.
No move from SPEC while its acceptance rests on a prediction; after a move
SPEC runs on until it no longer does (``_HOLD_REQUESTS``).

Where outcomes carry no per-position counts the layer stays at the
configured depth. The hot path allocates nothing: per-position counts are
appended per step and folded in at the look, which refreshes preallocated
per-depth figures in place.
"""

from __future__ import annotations

import math

from eagle_gate.goodput import Goodput
from eagle_gate.goodput_accept import PREDICTED_REQUESTS
from eagle_gate.goodput_depths_estimates import POS_MIN, DepthEstimates
from eagle_gate.goodput_estimates import Level, StepTime
from eagle_gate.goodput_settings import GOODPUT_SETTINGS
from eagle_gate.hookspecs import hookimpl
from eagle_gate.policy import Mode, PolicyFactory, StepOutcome, StepView

__all__ = ["GoodputDepths"]

_SPEC = Mode.SPEC
_PLAIN = Mode.PLAIN
#: goodput's own per-step methods, bound once (one lookup per step less)
_decide = Goodput.decide
_observe = Goodput.observe
#: the depth choice is looked at every this many steps (goodput looks at
#: its probes every 4: the depth matters less than the mode, and moves less).
_CHECK_EVERY = 8
#: another depth must beat the home depth's tokens/s by this share.
_DEPTH_MARGIN = 0.02
#: depth probes only while the probe budget is at least this share full.
_DEPTH_CREDIT = 0.6
#: from SPEC, a timed depth becomes home where its lead over the home depth
#: (log tokens/s) exceeds this plus ``_Z_DEPTH`` standard errors of the
#: comparison at the batch (DepthEstimates._comparison_se; a fixed 2% margin
#: let depths 1 and 3, 2.4% apart under +-12% step-time noise, trade places
#: every few looks on close-spec-5 C=8: 0.986 of ``goodput``), and is probed
#: while within ``2 * _Z_DEPTH`` of that (a depth that is not home gets
#: samples only from probes).
_DEPTH_MOVE = 0.005
_Z_DEPTH = 1.0
#: such a probe is paid from the budget at what it is expected to lose (its
#: shortfall against the home depth, at least this share of its steps' time),
#: not at its whole time: between two depths within a few percent the whole
#: time left the probes unaffordable beside goodput's own.
_PROBE_LOSS_FLOOR = 0.05
#: a depth probe runs at most this many times probe_steps (while it times
#: nothing: see _depth_probe; 4 cost more than the timing it bought).
_PROBE_MAX = 3
#: at batch 1 or 2 a rival depth within the noise (a probe long enough to
#: bring POS_MIN requests), and a depth between two lines, is probed at most
#: once per this many steps since it ran (docs/goodput.md: without, acc-down
#: b1 seed 25 held depth 1 at 0.901 x depth-oracle; 64 cost acc-up b1 0.1%).
_RIVAL_GAP = 256
#: below this many requests SPEC's acceptance rests mostly on a prediction:
#: no move from SPEC then, and after a move SPEC runs on until the moved-to
#: depth's acceptance (restarted from the depths' prediction, which can be
#: several percent low: goodput left SPEC on it) has them (close-plain-3
#: C=4..64 0.990 -> 0.995 of max, long-context ramp 0.988 -> 0.997).
_HOLD_REQUESTS = 2.0 * PREDICTED_REQUESTS


class GoodputDepths(DepthEstimates, Goodput):
    """``goodput`` over PLAIN and every SPEC depth (see the module doc)."""

    name = "goodput-depths"

    __slots__ = (
        "_depth", "_depths", "_d_times", "_d_acc", "_d_last", "_pos_n",
        "_pos_m", "_pend", "_pend_b", "_pend_h", "_q", "_exp", "_rate",
        "_known", "_line", "_r", "_dprobe_left", "_dprobe_depth", "_dprobe_w",
        "_dprobe_t", "_next_depth", "_dprobe_n", "_hold",
    )  # fmt: skip

    def __init__(self, **settings: object) -> None:
        super().__init__(**settings)  # type: ignore[arg-type]
        self._depths: tuple[int, ...] = ()
        self._depth = 0  # the home depth (0: not set up)
        self._d_times: dict[int, StepTime] = {}
        self._d_acc: dict[int, Level] = {}
        self._d_last: dict[int, int] = {}
        self._pos_n: list[float] = []  # per position: accepted
        self._pos_m: list[float] = []  # per position: reached
        # per depth: the per-position counts of the SPEC steps observed since
        # the last look (folded into _pos_n/_pos_m there, in C: zip and sum),
        # and those steps' requests
        self._pend: dict[int, list[tuple[int, ...]]] = {}
        self._pend_b = 0
        self._pend_h: list[tuple[int, ...]] = []  # the home depth's
        self._q: list[float] = []  # per position: acceptance (0: unknown)
        self._exp: list[float] = []  # per depth 0..deepest: tokens/request
        self._rate: list[float] = []  # per depth: tokens/s at the last look
        self._known: list[bool] = []  # per depth: measured near that batch
        self._line: list[float] = []  # per depth: its line's time there (0: none)
        self._r = 1.0  # the per-position acceptance's scale
        self._dprobe_left = self._dprobe_depth = self._next_depth = 0
        # a depth probe runs until its line holds this many samples (two more
        # timed ones), past probe_steps at this time per step from the budget
        self._dprobe_w, self._dprobe_t = 0, 0.0
        self._dprobe_n = self.probe_steps  # (its steps: _paid_probe's)
        self._hold = False  # SPEC held after a move (see _HOLD_REQUESTS)

    def _setup(self, view: StepView) -> None:
        depths = view.depths
        self._depths = depths
        d = view.configured_depth
        self._depth = d
        self._d_times = {s: StepTime() for s in depths}
        self._d_acc = {s: Level() for s in depths}
        self._d_times[d] = self._times[0]
        self._d_acc[d] = self._acc
        self._d_last = {s: -(1 << 62) for s in depths}
        k = depths[-1] + 1
        self._pos_n = [0.0] * k
        self._pos_m = [0.0] * k
        self._pend = {s: [] for s in depths}
        self._pend_h = self._pend[d]
        self._q = [0.0] * k
        self._exp = [1.0] * k
        self._rate = [0.0] * k
        self._known = [False] * k
        self._line = [0.0] * k

    # -- deciding -------------------------------------------------------------

    def decide(self, view: StepView) -> Mode:
        if len(view.depths) == 1:
            return _decide(self, view)
        if self._dprobe_left and self._probe_on():
            view.depth = self._dprobe_depth
            return _SPEC
        step = view.step
        if step >= self._next_depth and not self._probe_left:
            if not self._depth:
                self._setup(view)
            self._next_depth = step + _CHECK_EVERY
            if self._fit():
                probe = self._choose(view.batch_size, step)
                if probe:
                    view.depth = probe
                    return self._depth_probe(probe, step)
        if self._depth:
            # (before goodput decides: a cold start reads the depth there)
            view.depth = self._depth
            if self._hold:  # (see _HOLD_REQUESTS)
                if self._acc.n < _HOLD_REQUESTS and self.home is _SPEC:
                    self._decided += 1
                    return _SPEC
                self._hold = False
        return _decide(self, view)

    def _choose(self, b: int, step: int) -> int:
        """Rate every depth at batch ``b`` (measured or prior time), move the
        home depth, and return a depth to probe (0: none)."""
        fit_p = self._times[1]
        if fit_p.w == 0.0:
            return 0
        t_p = fit_p.predict(b)
        times = self._d_times
        home = self._depth
        depths = self._depths
        exp, rate, known, line = self._exp, self._rate, self._known, self._line
        # each depth's line near b (within the line's reach or a quarter of
        # its mean batch): measured there (known)
        near_any = False
        for d in depths:
            fit = times[d]
            t = 0.0
            k = False
            if fit.w > 0.0:
                near = fit.reach
                if near < 0.25 * fit.mb + 1.0:
                    near = 0.25 * fit.mb + 1.0
                if -near <= b - fit.mb <= near:
                    t = fit.predict(b)
                    k = near_any = True
            line[d] = t
            known[d] = k
        if not near_any:  # no line near b: each line's ratio to PLAIN there
            for d in depths:
                fit = times[d]
                if fit.w > 0.0:
                    mb = round(fit.mb)
                    line[d] = t_p * fit.predict(mb) / fit_p.predict(mb)
        # the best depth of all, the best measured one (known), the best
        # measured one but home (alt), and the best with a line near b or
        # the shallowest (what PLAIN looks at)
        best = best_k = best_p = alt = mid = 0
        t_mid = 0.0  # (mid: the shallowest depth but home between two lines)
        lo, t_lo, lo2, t_lo2 = 0, t_p, 0, t_p  # the two deepest lines so far
        for i, d in enumerate(depths):
            t = line[d]
            if t:
                lo2, t_lo2, lo, t_lo = lo, t_lo, d, t
                lined = True
            elif not i:
                # the shallowest depth, never run near b: the cheapest SPEC,
                # which may cost little more than PLAIN (looked at where that
                # could win)
                t = t_p
                lined = True
            else:
                lined = False  # not run near b: a prior from the lines around
                for hi in depths[i + 1 :]:
                    t_hi = line[hi]
                    if t_hi:  # between two lines (PLAIN as depth 0): the chord
                        t = t_lo + (t_hi - t_lo) * (d - lo) / (hi - lo)
                        if not mid and d != home:
                            # the chord is an upper bound where the cost grows
                            # convexly with the depth, the segment below
                            # extended a lower one: its time lies between
                            t_min = t_p
                            if lo:
                                t_min = t_lo + (t_lo - t_lo2) * (d - lo) / (lo - lo2)
                            mid = d
                            t_mid = 0.5 * (t + (t_min if t_min > t_p else t_p))
                        break
                else:
                    if not lo:
                        rate[d] = 0.0
                        continue  # (no line at all)
                    # beyond the deepest: the last segment, extended (a lower
                    # bound where the cost grows convexly with the depth)
                    t = t_lo + (t_lo - t_lo2) * (d - lo) / (lo - lo2)
                if t < t_p:
                    t = t_p
            r = exp[d] / t
            rate[d] = r
            if not best or r > rate[best]:
                best = d
            if known[d] and (not best_k or r > rate[best_k]):
                best_k = d
            if known[d] and d != home and (not alt or r > rate[alt]):
                alt = d
            if lined and (not best_p or r > rate[best_p]):
                best_p = d
        bar = rate[home] * (1.0 + _DEPTH_MARGIN)
        if self.home is not _SPEC:
            # from PLAIN: SPEC means the depth that looks best of those run
            # near b and the shallowest (goodput's own probes of SPEC then
            # measure it); a deeper depth never run is looked at from SPEC
            # (a lower bound on its time must not pick it from PLAIN). A move
            # to a depth not run near b nor for stale_steps asks goodput for
            # a refill, as a change does (close-plain-1 C=4..64 seed 2: depth
            # 1 first ran at batch 12-48 ~1,000 steps after it became home)
            if best_p != home and rate[best_p] > bar:
                self._set_depth(best_p)
                if (
                    not known[best_p]
                    and step - self._d_last[best_p] >= self.stale_steps
                ):
                    self._refill = True
            return 0
        if self._acc.n < _HOLD_REQUESTS:
            # SPEC's acceptance rests mostly on a prediction (just after a
            # switch or a move): the depths' figures scale from it, and a
            # deep depth's are the most sensitive to it; wait for samples
            # (goodput's own probes of PLAIN wait likewise)
            return 0
        if alt:  # (the best timed depth but the home depth)
            if rate[home] <= 0.0:  # (the home depth has no line at all)
                self._set_depth(alt)
                return 0
            se = self._comparison_se(alt, b)
            lead = math.log(rate[alt] / rate[home]) - _DEPTH_MOVE - _Z_DEPTH * se
            if lead > 0.0:
                self._set_depth(alt)
                self._hold = True
                return 0
            if (
                lead > -2.0 * _Z_DEPTH * se
                # (where probe_steps bring fewer requests than a position
                # needs to count, at batch 1 or 2, a longer probe that
                # brings them, once per _RIVAL_GAP steps of the rival)
                and (
                    self.probe_steps * b >= POS_MIN
                    or step - self._d_last[alt] >= _RIVAL_GAP
                )
            ):
                # within the lines' noise: a probe, paid at what its steps
                # are expected to lose against the home depth
                n = math.ceil(POS_MIN / b)
                return self._paid_probe(alt, self._loss_time(alt), n)
        if best == best_k or rate[best] <= bar:
            # no prior beats the home depth; a depth between two lines whose
            # time at the middle of its bounds would is probed (at its loss;
            # docs/goodput.md says why the middle: single-gpu-8b C=70, C=250)
            if (
                mid
                and exp[mid] > bar * t_mid
                and step - self._d_last[mid] >= _RIVAL_GAP
                and self._credit >= _DEPTH_CREDIT * self._credit_cap
            ):
                return self._paid_probe(mid, self._loss_time(mid))
            return 0
        if best == depths[0] and not line[best]:
            # the shallowest depth, never run near b, could win: tried by
            # moving there (no resync, no budget: its steps are the cheapest
            # SPEC, and the look above moves back once it is measured); a
            # probe from the budget waited ~60 steps at batch 250 on the
            # single-gpu-8b ramp, where it is 1.6x the home depth
            self._set_depth(best)
            return 0
        # a depth known only by its prior could beat the home depth: probe
        # it from a budget goodput leaves mostly unspent
        if self._credit < _DEPTH_CREDIT * self._credit_cap:
            return 0
        for d in depths:  # (the shallowest such: its prior is the tightest)
            if d != home and not known[d] and rate[d] > bar:
                best = d
                break
        return self._paid_probe(best, exp[best] / rate[best])

    def _loss_time(self, d: int) -> float:
        """What a step of depth ``d`` is expected to lose against the home
        depth (at least ``_PROBE_LOSS_FLOOR`` of its time), at the last look."""
        rate = self._rate
        loss = 1.0 - rate[d] / rate[self._depth]
        return max(loss, _PROBE_LOSS_FLOOR) * self._exp[d] / rate[d]

    def _paid_probe(self, depth: int, t: float, n: int = 0) -> int:
        """``depth`` where the budget pays a probe of it at ``t`` per step
        (``n`` steps, at least ``probe_steps``, now, as much again held
        back, up to ``_PROBE_MAX`` times that in the cap), else 0."""
        if n < self.probe_steps:
            n = self.probe_steps
        if not self._afford(n * t, n * t, _PROBE_MAX * n * t):
            return 0
        self._dprobe_t = t
        self._dprobe_n = n
        return depth

    def _depth_probe(self, depth: int, step: int) -> Mode:
        """Start a probe of ``depth``: the steps ``_paid_probe`` priced,
        then on until its line has two more timed samples (at most
        ``_PROBE_MAX`` times as long, each further step paid from the
        budget): at a large batch most steps follow a prefill and go
        untimed, and a probe that timed nothing told nothing."""
        n = self._dprobe_n
        self._dprobe_depth = depth
        self._dprobe_left = _PROBE_MAX * n - 1
        self._dprobe_w = self._d_times[depth].k + 2
        self._probed += 1
        self._d_last[depth] = step
        return _SPEC

    def _probe_on(self) -> bool:
        """A depth probe's next step: True to run it."""
        left = self._dprobe_left - 1
        self._dprobe_left = left
        if left < (_PROBE_MAX - 1) * self._dprobe_n:
            # past probe_steps: only while its line lacks two timed samples,
            # and the budget pays for the step
            t = self._dprobe_t
            if (
                self._d_times[self._dprobe_depth].k >= self._dprobe_w
                or self._credit < t
            ):
                self._dprobe_left = 0
                return False
            self._credit -= t
        self._probed += 1
        return True

    def _set_depth(self, d: int) -> None:
        """Make ``d`` the home depth: goodput's SPEC line and acceptance are
        now that depth's."""
        self._d_last[self._depth] = self._last[0]
        self._depth = d
        self._pend_h = self._pend[d]
        self._times = (self._d_times[d], self._times[1])
        acc = self._d_acc[d]
        # its own samples are probes' (few, maybe old): it restarts from the
        # prediction, as goodput's acceptance does from a PLAIN-side one
        accept = self._exp[d]
        acc.restart(accept, PREDICTED_REQUESTS)
        self._acc = acc
        self._accept = accept
        self._s = d
        self.switches += 1

    # -- learning -------------------------------------------------------------

    def estimates(self) -> dict[str, float]:
        """``goodput``'s, and with several depths the home depth and each
        timed depth's expected tokens/s (read by the ops thread, off the hot
        path)."""
        out = Goodput.estimates(self)
        if self._depth:
            out["home_depth"] = float(self._depth)
            for d, rate in self.depth_rates().items():
                out[f"depth_{d}_tokens_per_s"] = float(rate)
        return out

    def observe(self, outcome: StepOutcome) -> None:
        d = outcome.depth
        if d == self._depth:  # (the home depth's SPEC steps: most of them)
            at_least = outcome.accepted_at_least
            if at_least is not None:
                self._pend_h.append(at_least)  # (counted at the next look)
                self._pend_b += outcome.batch_size
            _observe(self, outcome)
            return
        if not self._depth or outcome.mode is not _SPEC or d is None:
            _observe(self, outcome)
            return
        b = outcome.batch_size
        pend = self._pend.get(d)
        if pend is None or b <= 0:
            return  # (a depth this layer did not ask for)
        at_least = outcome.accepted_at_least
        if at_least is not None:
            pend.append(at_least)
            self._pend_b += b
        resync = self._prev_mode is not _SPEC
        self._prev_mode = _SPEC
        self._d_acc[d].add(outcome.tokens / b, b)
        self._d_last[d] = outcome.step
        dt = outcome.interval_s
        if dt is not None and dt > 0.0 and not resync:
            self._d_times[d].add(b, dt)
            credit = self._credit + self.max_explore_share * dt
            cap = self._credit_cap
            self._credit = credit if credit < cap else cap

    def _changed(self, step: int) -> None:
        """An acceptance change: goodput's, and the positions' counts (see
        ``_forget_positions``)."""
        Goodput._changed(self, step)
        if self._depth:
            self._forget_positions()


@hookimpl
def eagle_gate_policies() -> list[PolicyFactory]:
    return [
        PolicyFactory(
            name="goodput-depths",
            create=GoodputDepths,
            description=(
                "goodput over PLAIN and every SPEC depth the server can run "
                "(--gate-depths, SGLang 0.5.23); goodput itself elsewhere"
            ),
            settings=GOODPUT_SETTINGS,
        )
    ]
