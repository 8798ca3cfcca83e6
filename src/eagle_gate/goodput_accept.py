"""How the ``goodput`` policy keeps its acceptance while PLAIN runs: under
eager draft sync the SPEC steps' accept length moved along with the
PLAIN-side first-position agreement through the draft's depth profile, a
SPEC-side change checked against the PLAIN side, and the SPEC estimate
rebased at the first SPEC step after PLAIN; under lazy and none sync (PLAIN
blind) each look at SPEC tested as one block. A mix-in of
:class:`eagle_gate.goodput.Goodput` (its state is declared there);
docs/goodput.md says why each is there."""

from __future__ import annotations

from eagle_gate.goodput_estimates import SLOW_REQUESTS, Z_CHANGE2, Level, depth
from eagle_gate.policy import Mode

__all__ = ["PREDICTED_REQUESTS", "GoodputAcceptance"]

#: a prediction of the accept length from the PLAIN side counts as this
#: many requests: a model's guess (the depth profile, an offset assumed
#: constant); where the next SPEC samples lean away from it, the probe goes
#: on (goodput's _LEAN) until they outweigh it.
PREDICTED_REQUESTS = 16.0
#: a SPEC-side restart the PLAIN side contradicts by more than this many
#: standard errors (squared; both estimates' noise counted) is replaced by
#: the PLAIN side's view. At 2.5 a false restart at batch 1 (3.26 -> 2.18
#: on 23 requests, 2.0 from the PLAIN side's prediction) held PLAIN for
#: ~1,200 steps; a wrongly kept restart costs that, a wrongly undone one
#: the ~16 requests the next SPEC steps take to restart it again.
_Z_ANCHOR2 = 2.0 * 2.0
#: a look at SPEC from blind PLAIN (lazy/none sync) whose samples, as one
#: block, lie beyond this many standard errors (squared) of the acceptance
#: before it restarts the estimate from them (2.5: looks are hundreds of
#: steps apart, so a looser bar than the CUSUM's costs little; 3 left
#: lazy period 1000 at batch 1 at 0.940 of oracle-mean, 2.5 0.973). The
#: CUSUM alone needs ~10 steps at batch 1, and a level restarted from few
#: requests takes in a look's samples before its sum gets there.
_Z_LOOK2 = 2.5 * 2.5
#: a look's block is tested from this many requests on (4: a single step
#: at batch 4 could restart it, and lazy period 300 at batch 4 fell from
#: 0.953 to 0.939).
_LOOK_REQUESTS = 8.0
#: SPEC samples at most this many steps apart belong to one look.
_LOOK_GAP = 4


class GoodputAcceptance:
    """The PLAIN side's part in :class:`eagle_gate.goodput.Goodput`'s
    acceptance (its state is declared there)."""

    __slots__ = ()
    _acc: Level
    _p1: Level
    _accept: float
    _p1_ref: float
    _s: int
    _check_a: float
    _check_p: float
    _look_a: float
    _look_n: float
    _look_r: int
    _look_end: int
    _req_plain: int
    home: Mode

    def _acc_rel_var(self) -> float:
        """Squared relative standard error of the acceptance estimate."""
        acc = self._acc
        a = self._accept
        v = acc.var / (acc.n * a * a)
        p1 = self._p1
        if p1.n and p1.slow > 0.0:
            v += p1.var / (p1.n * p1.slow * p1.slow)
        return v

    def _update_accept(self, p_now: float, changed: bool) -> None:
        """The decision's acceptance while PLAIN runs: the SPEC steps' accept
        length, moved along with the PLAIN-side first-position acceptance
        (eager sync) through the draft's geometric depth profile. Only its
        change since the last SPEC step counts (``p_now`` against
        ``_p1_ref``, both PLAIN-side), so a constant offset between PLAIN-side
        agreement and SPEC's first-position acceptance cancels. On a detected
        change the accept length restarts from this prediction (the next
        SPEC steps refine it), and the reference moves to ``p_now``."""
        s = self._s
        acc = self._acc
        a = 1.0 + (acc.slow - 1.0) * (depth(p_now, s) / depth(self._p1_ref, s))
        if a > s + 1.0:  # (every draft accepted: two noisy agreements can
            a = s + 1.0  # scale past it, and the level then slides down)
        self._accept = a
        if changed:
            acc.restart(a, PREDICTED_REQUESTS)
            self._p1_ref = p_now

    def _check(self, p1: Level) -> None:
        """A change the SPEC side detected, checked against the PLAIN side
        once it has ``_CHECK_REQUESTS`` requests behind its new reference:
        the agreement before the change and the acceptance it went with say
        what the change should look like now. Where the SPEC side's restart
        (a few requests at batch 1) lies beyond both estimates' noise from
        that, it was a false alarm or undershot, and the estimate restarts
        from the PLAIN side's view (a false restart to 1.25 in a phase at
        3.1 left the policy in PLAIN for ~1,000 steps)."""
        q = self._check_p
        self._check_p = 0.0
        p = p1.slow
        s = self._s
        acc = self._acc
        a = 1.0 + (self._check_a - 1.0) * (depth(p, s) / depth(q, s))
        d = a - acc.slow
        # the prediction's noise: both agreements' (the older one taken as
        # noisy as this), through the depth profile's elasticity (<= 2)
        e = (a - 1.0) / p
        v = acc.var / acc.n + 8.0 * e * e * p1.var / p1.n
        if d * d > _Z_ANCHOR2 * v:
            acc.restart(a, PREDICTED_REQUESTS)
            self._accept = a
            self._p1_ref = p

    def _rebase(self, acc: Level) -> None:
        """First SPEC step after PLAIN: where the PLAIN side moved the
        decision's acceptance beyond the SPEC estimate's noise, restart that
        estimate from it (as on a detected change); an estimate that is a
        PLAIN-side prediction itself (no SPEC sample since) takes it as is.
        Without this a change the PLAIN side *followed* but never *detected*
        (a recovery after a false restart, a gradual drift) is forgotten at
        the next SPEC step."""
        a = self._accept
        d = a - acc.slow
        if not acc.n or d == 0.0:
            return
        if acc.n <= PREDICTED_REQUESTS:  # a PLAIN-side prediction itself
            acc.slow = a
        elif d * d > Z_CHANGE2 * acc.var / acc.n:
            acc.restart(a, PREDICTED_REQUESTS)

    def _start_look(self, acc: Level, step: int) -> None:
        """A SPEC step after PLAIN while PLAIN is chosen, ``_LOOK_GAP`` steps
        or more after the last one: a look. Blind (no PLAIN step ever
        carried the draft's matches), its samples are tested as one block
        (:meth:`_look_changed`); a look that goes on after a PLAIN step or
        two (a lean decided on a late outcome) stays one block."""
        if step > self._look_end + _LOOK_GAP and not self._req_plain:
            self._look_a, self._look_n, self._look_r = acc.slow, acc.n, acc.restarts

    def _look_changed(self, step: int) -> bool:
        """A SPEC sample in a blind look: where the look's samples (what the
        level gained since it began) lie beyond ``_Z_LOOK2`` of the level
        before it, the level restarts from them; True then (a change)."""
        self._look_end = step
        acc = self._acc
        n0 = self._look_n
        n = acc.n - n0
        if self.home is not Mode.PLAIN or acc.restarts != self._look_r:
            self._look_n = 0.0  # (over: SPEC chosen, or the CUSUM restarted)
            return False
        if n < _LOOK_REQUESTS or acc.n >= SLOW_REQUESTS:
            return False
        a0 = self._look_a
        m = (acc.slow * acc.n - a0 * n0) / n
        d = m - a0
        if d * d <= _Z_LOOK2 * acc.var * (1.0 / n + 1.0 / n0):
            return False
        self._look_n = 0.0
        acc.restart(m, n)
        return True
