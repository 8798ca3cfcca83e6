"""What :class:`~eagle_gate.goodput_depths.GoodputDepths` knows of each
depth's acceptance: per position ``j`` the requests that reached ``j - 1``
accepted drafts and those of them that accepted the ``j``-th, scaled so
that the home depth's expected tokens match ``goodput``'s acceptance
(``_fit``); how sure a comparison of two depths is (``_comparison_se``: the
step-time lines' noise and the positions' between them); what a detected change
leaves of the counts (``_forget_positions``); each timed depth's tokens/s for
the status (``depth_rates``). A mix-in (its state is
declared in ``goodput_depths``); docs/goodput.md, "Draft depths in the
simulator", says why each is there. No SGLang or torch import.
"""

from __future__ import annotations

import math

from eagle_gate.goodput_estimates import StepTime

__all__ = ["POS_MIN", "DepthEstimates"]

#: requests' worth behind a position's acceptance at most (older counts
#: are scaled down when a look finds more).
_POS_REQUESTS = 2048.0
#: requests behind a position before its acceptance is used.
POS_MIN = 8.0
#: Newton steps per look on the scale of the per-position acceptance (from
#: the last look's scale: the target moves little between looks).
_NEWTON = 2
#: a position's scaled acceptance is capped here: goodput's acceptance at a
#: shallow home depth may run past what its positions can give (a PLAIN-side
#: prediction, noise), and scaling every position to certainty would make
#: the deepest depth look best.
_Q_MAX = 0.95
#: the scale's range (a position's acceptance is capped at 1 anyway).
_R_MIN, _R_MAX = 0.05, 4.0


class DepthEstimates:
    """Per-position acceptance and the noise of a depth comparison (a
    mix-in of :class:`eagle_gate.goodput_depths.GoodputDepths`)."""

    __slots__ = ()
    _accept: float
    _depth: int
    _d_times: dict[int, StepTime]
    _pos_n: list[float]
    _pos_m: list[float]
    _pend: dict[int, list[tuple[int, ...]]]
    _pend_b: int
    _q: list[float]
    _exp: list[float]
    _r: float

    def _fit(self) -> bool:
        """Refresh ``_q`` (per-position acceptance, extrapolated), the scale
        ``_r`` (two Newton steps towards the home depth's expected tokens
        matching goodput's acceptance) and ``_exp``, after folding in the
        counts observed since the last look; False where position 1 was never
        seen or goodput has no acceptance yet. In place: no allocation."""
        n, m, q = self._pos_n, self._pos_m, self._q
        if self._pend_b:
            m[1] += self._pend_b
            self._pend_b = 0
            for d, pend in self._pend.items():
                if pend:
                    j = 1
                    for col in zip(*pend, strict=False):  # (position j: >= j)
                        got = sum(col)
                        n[j] += got
                        if j < d:  # (they reached position j + 1)
                            m[j + 1] += got
                        j += 1
                    pend.clear()
        last = 0.0
        for j in range(1, len(n)):
            mj = m[j]
            if mj > _POS_REQUESTS:  # (a window of requests: older ones fade)
                n[j] *= _POS_REQUESTS / mj
                m[j] = mj = _POS_REQUESTS
            if mj >= POS_MIN:
                last = n[j] / mj
            elif j == 1:
                return False
            q[j] = last
        if self._accept <= 0.0:
            return False
        home = self._depth
        target = self._accept - 1.0
        r = self._r
        for _ in range(_NEWTON):
            f = df = 0.0
            reach, dreach = 1.0, 0.0
            for j in range(1, home + 1):
                rq = r * q[j]
                if rq < _Q_MAX:  # (a capped position does not move with r)
                    dreach = dreach * rq + reach * q[j]
                    reach *= rq
                else:
                    dreach *= _Q_MAX
                    reach *= _Q_MAX
                f += reach
                df += dreach
            if df <= 0.0:  # every position capped: no slope
                if f <= target:
                    break
                r *= 0.5
                continue
            r -= (f - target) / df
            if r < _R_MIN:
                r = _R_MIN
            elif r > _R_MAX:
                r = _R_MAX
        self._r = r
        exp = self._exp
        tot = reach = 1.0
        for j in range(1, len(q)):
            rq = r * q[j]
            reach *= rq if rq < _Q_MAX else _Q_MAX
            tot += reach
            exp[j] = tot
        return True

    def depth_rates(self) -> dict[int, float]:
        """Expected output tokens/s per timed depth at the home depth's mean
        batch (empty before any is known): read by the ops thread, so it
        changes nothing the decisions use."""
        home = self._d_times.get(self._depth)
        if home is None or home.w == 0.0 or self._accept <= 0.0:
            return {}
        exp = self._exp
        b = max(1, round(home.mb))
        return {
            d: exp[d] / fit.predict(b)
            for d, fit in self._d_times.items()
            if fit.w > 0.0 and fit.predict(b) > 0.0
        }

    def _comparison_se(self, d: int, b: int) -> float:
        """The standard error of depth ``d``'s log tokens/s against the home
        depth's at ``b``: the two step-time lines' noise and the
        per-position acceptances' between the two depths. At a look only
        (every ``_CHECK_EVERY`` steps)."""
        fd = self._d_times[d]
        fh = self._d_times[self._depth]
        se2 = fd.res * fd.leverage(b)
        if fh.w > 0.0:
            se2 += fh.res * fh.leverage(b)
        # the positions between the two depths: each one's acceptance is a
        # share of the requests that reached it (binomial), and moves the
        # deeper depth's tokens by the expected tokens from it on
        lo, hi = (d, self._depth) if d < self._depth else (self._depth, d)
        exp, q, m = self._exp, self._q, self._pos_m
        top = exp[hi]
        for j in range(lo + 1, hi + 1):
            qj = q[j]
            mj = m[j] if m[j] > POS_MIN else POS_MIN
            if 0.0 < qj < 1.0:
                tail = (top - exp[j - 1]) / top
                se2 += tail * tail * (1.0 - qj) / (qj * mj)
        return math.sqrt(se2)

    def _forget_positions(self) -> None:
        """An acceptance change: positions beyond the home depth (seen only
        by probes) are forgotten, the others keep a few requests' weight."""
        n, m = self._pos_n, self._pos_m
        home = self._depth
        for j in range(1, len(n)):
            if j > home:
                n[j] = m[j] = 0.0
            elif m[j] > 4.0 * POS_MIN:
                f = 4.0 * POS_MIN / m[j]
                n[j] *= f
                m[j] *= f
