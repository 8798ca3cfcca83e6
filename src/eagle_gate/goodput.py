"""The ``goodput`` policy: run the mode that emits more output tokens/second.

How it decides, its settings and results: docs/goodput.md. Estimates (in
:mod:`eagle_gate.goodput_estimates`): acceptance ``A`` from SPEC steps and
the first-position agreement ``p1`` from PLAIN steps (eager sync), each a
mean with a CUSUM that restarts on a change; each mode's step time as a line
in the batch size; the draft resync. One rule: SPEC where
``log(A * t_plain(b) / t_spec(b))`` beats the margin, PLAIN where it loses by
it; probes of the other mode from a time budget, where they can turn the
decision. Deterministic in its inputs (TP ranks agree), late and batched
outcomes are fine, ``interval_s=None`` skips the timing; imports neither
SGLang nor torch.
"""

from __future__ import annotations

import math
import warnings

from eagle_gate.goodput_accept import PREDICTED_REQUESTS, GoodputAcceptance
from eagle_gate.goodput_estimates import FAST_REQUESTS, SLOPE_PRIOR, Level, StepTime
from eagle_gate.goodput_report import GoodputReport
from eagle_gate.goodput_settings import GOODPUT_SETTINGS
from eagle_gate.goodput_switch import MIN_DWELL, GoodputSwitching
from eagle_gate.hookspecs import hookimpl
from eagle_gate.policy import Mode, PolicyFactory, StepOutcome, StepView

__all__ = ["Goodput", "GOODPUT_SETTINGS"]

_SPEC = Mode.SPEC
_PLAIN = Mode.PLAIN
_log = math.log

#: weight of one resync in its EMA (after the first 8, which are averaged).
_RESYNC_WEIGHT = 1.0 / 8.0
#: a resync is measured only against a prediction with at least 4 samples'
#: worth behind it (leverage 1/4).
_RESYNC_LEVERAGE = 0.25
#: resync cost (relative to a SPEC step) assumed until one is measured.
_RESYNC_PRIOR = 0.5
#: a probe is due while the gain is within this many standard errors.
_Z_PROBE = 2.0
#: probes while uncertain are this many times ``probe_steps`` long (more
#: samples per resync).
_LONG_PROBE = 4
#: the probe conditions are looked at every this many steps (cheaper; a
#: probe starts at most this much later).
_CHECK_EVERY = 4
#: unused probe budget is capped at this many probes' time.
_CREDIT_PROBES = 2.0
#: a probe is looked for once the budget holds this share of its cap (one
#: short probe's worth).
_SHORT_SHARE = 1.0 / (_CREDIT_PROBES * _LONG_PROBE)
#: a SPEC probe goes on while its samples lean towards a rise: the change
#: test's sum above this (a quarter of the way to a restart).
_LEAN = 2.0
#: PLAIN-side requests behind the new reference before it checks a change
#: the SPEC side detected (a ratio of two noisy agreements is noisy).
_CHECK_REQUESTS = 64.0
#: while the home mode has no timed step (a prefill before each of its
#: steps: SPEC at batch 250 finishes requests every step), the other mode is
#: looked at every this many probes' steps: its steps may be timed, and the
#: SPEC step after it gives a provisional SPEC time (see ``_prov``).
_COLD_LOOK = 2
#: a SPEC look that could not turn the decision (see decide) is skipped
#: until the last SPEC sample is this many ``stale_steps`` old (the lines
#: it rests on may have moved).
_NO_TURN_AGE = 64


class Goodput(GoodputAcceptance, GoodputSwitching, GoodputReport):
    """Run whichever of SPEC and PLAIN is measured to emit more tokens/second."""

    name = "goodput"

    __slots__ = (
        "max_explore_share", "explore_cost", "stale_steps", "switch_overhead",
        "switch_cost", "probe_steps", "home", "switches", "_times", "_acc",
        "_p1", "_p1_ref", "_req_plain", "_accept", "_s", "_resync_rel",
        "_switch_rel", "_n_resync", "_dwell", "_margin", "_exp_margin_lo",
        "_exp_margin_hi", "_switch_step", "_entry_step",
        "_last", "_probe_left", "_probe_mode", "_credit", "_credit_cap",
        "_decided", "_probed", "_prev_mode", "_next_check", "_lean",
        "_change_step", "_change_gap", "_refill", "_check_a", "_check_p",
        "_stay", "_prov", "_probe_sign", "_probe_lim", "_ahead", "_switch_b",
        "_look_a", "_look_n", "_look_r", "_look_end",
    )  # fmt: skip

    def __init__(
        self,
        max_explore_share: float = 0.03,
        explore_cost: float = 0.01,
        stale_steps: int = 256,
        switch_overhead: float = 0.05,
        switch_cost: float = 0.0,
        probe_steps: int = 3,
        initial_mode: str = "spec",
        ema_alpha: float | None = None,
    ) -> None:
        if ema_alpha is not None:
            msg = (
                "goodput setting 'ema_alpha' is deprecated and ignored: step "
                "times are now fitted over the last ~256 samples of each mode "
                "and acceptance follows changes by itself (docs/goodput.md); "
                "remove it"
            )
            warnings.warn(msg, DeprecationWarning, stacklevel=2)
        if initial_mode not in ("spec", "plain"):
            raise ValueError(
                f"goodput initial_mode {initial_mode!r}: expected 'spec' or 'plain'"
            )
        self.max_explore_share = float(max_explore_share)
        self.explore_cost = float(explore_cost)
        self.stale_steps = int(stale_steps)
        self.switch_overhead = float(switch_overhead)
        self.switch_cost = float(switch_cost)
        self.probe_steps = max(2, int(probe_steps))
        #: the mode chosen (probes aside).
        self.home = _PLAIN if initial_mode == "plain" else _SPEC
        self.switches = 0
        self._times = (StepTime(), StepTime())  # indexed by Mode
        self._acc = Level()  # tokens per request of a SPEC step
        self._p1 = Level(0.25)  # first-position agreement, PLAIN side (eager;
        # a 0/1 sample per request: variance at most 1/4)
        self._p1_ref = 0.0  # _p1 at the last SPEC step (0: too few samples)
        # requests of PLAIN steps that carried the draft's matches (0: PLAIN
        # is blind, lazy or none sync). The lifetime first-position
        # acceptance of either side is the gate's to count (the status's
        # first_position_acceptance, for every policy), not the policy's.
        self._req_plain = 0
        self._accept = 0.0  # A for the decision (0: not measured)
        self._s = 3  # draft tokens per SPEC step (num_draft_tokens - 1)
        self._resync_rel = _RESYNC_PRIOR
        self._update_switch_costs()  # _switch_rel, _dwell, _margin, _exp_margin_*
        self._switch_step = self._entry_step = -(1 << 62)
        self._last = [-(1 << 62), -(1 << 62)]  # step of each mode's last sample
        self._probe_mode = self._prev_mode = self.home
        self._credit = self._credit_cap = 0.0  # probe budget (seconds)
        self._n_resync = self._probe_left = self._next_check = 0
        self._decided = self._probed = 0
        self._lean = False  # a SPEC probe leans towards a rise (go on)
        self._refill = False  # a PLAIN-side change or a depth move (decide pays)
        # the SPEC estimate and PLAIN reference before a SPEC-side change
        self._check_a = self._check_p = 0.0
        self._stay = float(self.stale_steps)  # steps SPEC stays ahead
        self._switch_b = self._probe_sign = 0
        self._probe_lim = 0.0
        self._ahead = -1  # the step since which SPEC is ahead (-1: it is not)
        self._change_step = -1  # the last detected acceptance change
        # True: the SPEC line holds only a resync step's time (an upper
        # bound, replaced by the first SPEC step timed without a resync);
        # None: SPEC steps went untimed while the line was empty (a resync
        # step may stand in)
        self._prov: bool | None = False
        self._change_gap = 0.0  # steps between changes (0: none seen)
        # a blind look at SPEC: the level before it (0 requests: none on)
        self._look_a = self._look_n = 0.0
        self._look_r = 0
        self._look_end = -(1 << 62)  # the step of a look's last SPEC sample

    # -- deciding -------------------------------------------------------------

    def decide(self, view: StepView) -> Mode:
        self._decided += 1
        b = float(view.batch_size)  # (exact; float-only arithmetic is faster)
        if self._probe_left:
            if b * self._probe_sign <= self._probe_lim:
                self._probe_left -= 1
                return self._probe_mode
            # the batch moved by more than 2x against the probed mode (SPEC
            # grows dearer relative to PLAIN with the batch): the probe was
            # priced, and looked for, at another batch
            self._probe_left = 0
        home = self.home
        if home is _SPEC:  # (unpacked: indexing by an IntEnum is slow)
            away = _PLAIN
            fit_h, fit_a = self._times
        else:
            away = _SPEC
            fit_a, fit_h = self._times
        accept = self._accept
        if fit_a.w == 0.0 or accept == 0.0 or fit_h.w == 0.0:
            # cold: measure the home mode first, then take a first look at
            # the other one (SPEC also gives the acceptance), from the budget
            self._s = view.depth  # (the depth the acceptance describes)
            if self._change_step < 0:
                # the start counts as a change: acceptance that held this
                # long and then changed is the first measure of the gap
                self._change_step = view.step
            if fit_h.w == 0.0:
                # nothing timed of the home mode: a look at the other one
                # every few steps (it may be timed where the home mode's
                # steps are not), else the home mode runs blind
                step = view.step
                wait = _COLD_LOOK * self.probe_steps
                if step < wait or step < self._next_check:
                    return home
                # untimed, so priced in steps: a switch dearer than the whole
                # budget's steps never fits (a huge switch_cost stays put)
                if self._switch_rel > _CREDIT_PROBES * _LONG_PROBE * wait:
                    return home
                self._next_check = step + wait
                return self._probe(away, 0, b)
            t = self.probe_steps * fit_h.predict(b)
            long_cost = _LONG_PROBE * t * (1.0 + self._resync_rel)
            if not self._afford(t * (1.0 + self._switch_rel), 0.0, long_cost):
                return home
            return self._probe(away, 0, b)
        # (fit.predict(b), inlined: the hot path)
        t_h = fit_h.a + fit_h.c * b
        if t_h < fit_h.floor:
            t_h = fit_h.floor
        t_a = fit_a.a + fit_a.c * b
        if t_a < fit_a.floor:
            t_a = fit_a.floor
        far = b > fit_a.hi or b < fit_a.lo
        if far:
            # far from every batch the other mode ran at: its time there is
            # the home mode's times its ratio to it where it did run
            mb = round(fit_a.mb)
            t_r = t_h * fit_a.predict(mb) / fit_h.predict(mb)
            # SPEC grows dearer relative to PLAIN with the batch: beyond the
            # batches it ran at, that ratio is a lower bound, and its own
            # line says more where its slope was measured
            if away is _PLAIN or b < mb or t_r > t_a:
                t_a = t_r
        step = view.step
        # the gain, a log, is taken only where it is used (a log costs ~4% of
        # a step): its tests against the margin test its ratio, exp(gain)
        if home is _SPEC:
            ratio = accept * t_a / t_h  # SPEC's gain over PLAIN is its log
            behind = ratio < self._exp_margin_lo  # (the gain below -margin)
        else:
            ratio = accept * t_h / t_a  # PLAIN's gain is minus its log
            if self._ahead >= 0 and ratio < self._exp_margin_lo:
                # SPEC behind by the margin, as when it is left: a run ends
                self._end_run(step)
            behind = ratio > self._exp_margin_hi  # (the gain below -margin)
        # switch: leaving SPEC costs nothing now; entering it pays a resync,
        # so SPEC is entered at most once per dwell, where it stays ahead
        # long enough to gain that back (and no switch follows another
        # within MIN_DWELL steps, the outcomes' delay)
        if behind:  # the home mode is behind by the margin
            gain = _log(ratio) if home is _SPEC else -_log(ratio)
            if home is _PLAIN and self._ahead < 0:
                self._ahead = step  # SPEC ahead from here (a run begins)
            if (
                not far  # (there a probe comes first)
                and (
                    step - self._switch_step >= MIN_DWELL
                    # (a batch grown 2x since SPEC was entered leaves it at
                    # once: the batch, not a late outcome, turned it)
                    or away is _PLAIN
                    and b > 2 * self._switch_b
                )
                and (
                    away is _PLAIN
                    and not self._blind_hold(b, gain, t_h, t_a)
                    or away is _SPEC
                    and step - self._entry_step >= self._dwell
                    and gain * self._stay_left(step) < -self._switch_rel
                )
            ):
                self._switch_step = step
                self._switch_b = b
                if away is _SPEC:
                    self._entry_step = step
                elif self._ahead >= 0:  # (not the start in SPEC: never entered)
                    self._end_run(step)
                self.home = away
                self.switches += 1
                return away
        if self._lean:
            # a SPEC probe leans towards a rise (its CUSUM past _LEAN): go on
            # while the budget pays, where that rise (the mean since the lean
            # began) would turn the decision
            self._lean = False
            acc = self._acc
            margin = self._margin
            if home is _PLAIN and acc.up_s * t_h >= acc.up_n * t_a * (1.0 - margin):
                n = self.probe_steps
                long_cost = (_LONG_PROBE * n + self._resync_rel) * t_a
                if self._afford((n + self._switch_rel) * t_a, 0.0, long_cost):
                    return self._probe(_SPEC, n, b)
        # a probe? looked at every _CHECK_EVERY steps, when the budget could
        # pay for a short one or a refill is due (it may pay one)
        if step >= self._next_check and (
            self._credit >= self._credit_cap * _SHORT_SHARE or self._refill
        ):
            self._next_check = step + _CHECK_EVERY
            gain = _log(ratio) if home is _SPEC else -_log(ratio)
            margin = self._margin
            n = self.probe_steps
            # (fit.leverage(b) of both, inlined: the hot path)
            db = b - fit_a.mb
            dh = b - fit_h.mb
            se2 = fit_a.res * (1.0 + db * db / (fit_a.vb + SLOPE_PRIOR)) / fit_a.w
            se2 += fit_h.res * (1.0 + dh * dh / (fit_h.vb + SLOPE_PRIOR)) / fit_h.w
            if home is _PLAIN:
                # a look at SPEC that could not turn the decision were every draft
                # accepted and SPEC's step 2 standard errors faster (what its lines
                # say) does not pay its resync: not even under lazy sync
                top = _log((self._s + 1) * t_h / t_a) + _Z_PROBE * math.sqrt(se2)
                if (
                    top < margin or top * self._stay_left(step) < self._switch_rel
                ) and step - self._last[0] < _NO_TURN_AGE * self.stale_steps:
                    return home
                se2 += self._acc_rel_var()  # (what SPEC's estimate lacks)
            g = gain - margin
            # (not from SPEC while its acceptance rests mostly on a PLAIN-side
            # prediction: a PLAIN probe then puts off the SPEC samples that
            # would settle it, while the PLAIN side moves it again)
            uncertain = g * g < _Z_PROBE * _Z_PROBE * se2 and (
                home is _PLAIN or self._acc.n >= 2.0 * PREDICTED_REQUESTS
            )
            if self._refill:  # a change (or a depth move): refill where it can pay
                self._refill = False
                if uncertain and home is _PLAIN:  # (it buys SPEC samples)
                    self._credit = self._credit_cap
            if not uncertain:
                # clear: re-probe once stale, and when the probe's expected
                # loss is at most explore_cost of the time since the last
                # sample (below); keep one uncertain probe's worth of budget
                age = step - self._last[away]
                gap = self._change_gap
                # blind (lazy/none sync) where acceptance changes: a two-step look
                # once not looking (a change per gap steps, seen age late) loses
                # more than the look
                blind = home is _PLAIN and self._p1_ref == 0.0 and gap
                if blind:
                    n = 2
                elif age < self.stale_steps:
                    return home
            t_s = t_a if away is _SPEC else t_h  # (priced only now; a resync is SPEC's)
            rr = self._switch_rel * t_s  # what the switch costs
            long_cost = _LONG_PROBE * self.probe_steps * t_a + self._resync_rel * t_s
            reserve = 0.0
            if uncertain:
                # uncertain: a long probe (more samples per resync); a short
                # first look where the other mode never ran at such a batch
                if not far and self._prov is not True:
                    n *= _LONG_PROBE
            else:
                lost = n * t_a * (1.0 - math.exp(-gain)) + rr
                if (
                    age * age * gain * t_h < 2.0 * gap * lost
                    if blind
                    else lost > self.explore_cost * age * t_h
                ):
                    return home
                reserve = long_cost
            if not self._afford(n * t_a + rr, reserve, long_cost):
                return home
            return self._probe(away, n, b)
        return home

    def _afford(self, cost: float, reserve: float, long_cost: float) -> bool:
        """Pay ``cost`` seconds from the probe budget if it holds them beyond
        ``reserve``. The budget earns ``max_explore_share`` of every timed
        step, up to ``_CREDIT_PROBES`` long probes' worth (it starts full),
        each with its *measured* resync: a ``switch_cost`` above that never
        fits, and the policy stays in its mode (what such a setting asks)."""
        cap = _CREDIT_PROBES * long_cost
        if self._credit_cap == 0.0:
            self._credit = cap
        self._credit_cap = cap
        if self._credit < cost + reserve:
            return False
        self._credit -= cost
        return True

    def _probe(self, mode: Mode, n: int, b: int) -> Mode:
        """Run ``mode`` for this step and ``n - 1`` more (0: ``probe_steps``),
        while the batch stays within 2x of ``b``."""
        k = n if n else self.probe_steps
        # (on while b <= 2 * b0 for SPEC, -b <= -b0 / 2 for PLAIN)
        if mode is _SPEC:
            self._probe_sign, self._probe_lim = 1, 2.0 * b
        else:
            self._probe_sign, self._probe_lim = -1, -0.5 * b
        self._probe_mode = mode
        self._probe_left = k - 1
        self._probed += k
        return mode

    # -- learning -------------------------------------------------------------

    def observe(self, outcome: StepOutcome) -> None:
        n_req = outcome.batch_size
        if n_req <= 0:
            return
        b = float(n_req)  # (once for every estimator: float-only arithmetic)
        mode = outcome.mode
        prev = self._prev_mode
        self._prev_mode = mode
        dt = outcome.interval_s
        if mode is _SPEC or mode == 0:
            i = 0  # (Mode.SPEC: an int index, indexing by an IntEnum is slow)
            acc = self._acc
            if prev is not _SPEC:
                self._rebase(acc)
                if self.home is _PLAIN:
                    self._start_look(acc, outcome.step)
            before = acc.slow
            if acc.add(outcome.tokens / b, b) or (
                self._look_n and self._look_changed(outcome.step)
            ):
                self._changed(outcome.step)
                # SPEC saw a change: the PLAIN-side agreement describes the
                # old acceptance, so it is re-anchored on the next PLAIN
                # steps (else that change counts twice when PLAIN runs),
                # where it checks the change (see _check)
                self._check_a = before
                self._check_p = self._p1_ref
                self._p1.forget()
                self._p1_ref = 0.0
            elif acc.up > _LEAN and self.home is _PLAIN:
                self._lean = True
            # the acceptance as measured, and the PLAIN-side first-position
            # acceptance it goes with (the reference for PLAIN-side changes)
            self._accept = acc.slow
            p1 = self._p1
            if p1.n >= FAST_REQUESTS:
                self._p1_ref = p1.slow
            fit = self._times[0]
            if dt is None or dt <= 0.0:
                if fit.w == 0.0:  # SPEC goes untimed: a stand-in may serve
                    self._prov = None
                return
            if prev is not _SPEC:
                # the first SPEC step after PLAIN carries the draft's resync
                # (measured where the fit knows the batch: 4 samples' worth)
                if fit.w == 0.0:
                    # no SPEC step timed yet, and SPEC steps went untimed
                    # (SPEC at a large batch finishes requests at every
                    # step, and the next step comes after a prefill): this
                    # one stands in, resync and all, until a SPEC step is
                    # timed without it
                    if self._prov is not None:
                        return
                    fit.add(b, dt)
                    self._last[0] = outcome.step
                    self._prov = True
                    return
                if fit.leverage(b) > _RESYNC_LEVERAGE:
                    return
                rel = dt / fit.predict(b) - 1.0
                n = self._n_resync + 1
                self._n_resync = n
                w = 1.0 / n if n * _RESYNC_WEIGHT < 1.0 else _RESYNC_WEIGHT
                self._resync_rel += w * ((rel if rel > 0.0 else 0.0) - self._resync_rel)
                self._update_switch_costs()
                return
            if self._prov is True:  # the stand-in gives way to a timed step
                self._prov = False
                fit.__init__()
        else:
            i = 1  # (Mode.PLAIN)
            m = outcome.draft_matches
            if m is not None:
                self._req_plain += n_req
                p1 = self._p1
                changed = p1.add(m / b, b)
                if changed:
                    self._changed(outcome.step)
                if self._p1_ref == 0.0 and p1.n >= FAST_REQUESTS:
                    self._p1_ref = p1.slow  # anchored (checked below)
                elif self._p1_ref > 0.0:
                    if self._check_p and p1.n >= _CHECK_REQUESTS:
                        self._check(p1)
                    self._update_accept(p1.slow, changed)
                    if changed and self.home is _PLAIN:
                        # SPEC's estimate moved without a SPEC sample: the
                        # probe that checks it is paid now (not in ~1,000
                        # steps of budget, a long SPEC probe at batch 1),
                        # where it can turn the decision (decide says)
                        self._refill = True
            if dt is None or dt <= 0.0:
                return
            fit = self._times[1]
        fit.add(b, dt)
        self._last[i] = outcome.step
        credit = self._credit + self.max_explore_share * dt
        cap = self._credit_cap
        self._credit = credit if credit < cap else cap


@hookimpl
def eagle_gate_policies() -> list[PolicyFactory]:
    return [
        PolicyFactory(
            name="goodput",
            create=Goodput,
            description=(
                "fit each mode's step time over the batch size and track "
                "acceptance; run the mode with more tokens/second"
            ),
            settings=GOODPUT_SETTINGS,
        )
    ]
