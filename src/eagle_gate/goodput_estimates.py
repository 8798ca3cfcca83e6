"""The ``goodput`` policy's estimators (:mod:`eagle_gate.goodput` decides
with them):

* :class:`Level`: a mean over requests that follows changes, a slow mean
  with a CUSUM that restarts it on a change (the acceptance ``A`` from SPEC steps, the
  first-position acceptance ``p1`` from PLAIN steps under eager sync);
* :class:`StepTime`: one mode's step time as a line in the batch size, least
  squares with forgetting, with its leverage and relative noise;
* :func:`depth`: the draft's geometric depth profile, which carries a change
  of ``p1`` over to ``A``.

Deterministic, no SGLang or torch import; each constant says what it is for.
"""

from __future__ import annotations

import math

_sqrt = math.sqrt

__all__ = [
    "FAST_REQUESTS",
    "SLOPE_PRIOR",
    "SLOW_REQUESTS",
    "Z_CHANGE2",
    "Level",
    "StepTime",
    "depth",
]

#: requests behind a level restarted from a prediction (the PLAIN side's),
#: and the samples a reference needs before it is trusted.
FAST_REQUESTS = 16.0
#: requests behind the slow acceptance estimates at most: about 1% of
#: relative noise, and a lag of ~128 steps at batch 8 behind a gradual drift
#: (a class mix that moves with the requests), where no restart fires.
SLOW_REQUESTS = 2048.0
#: a restart is taken where a gap of the level and the PLAIN side's
#: prediction exceeds this many standard errors (squared).
Z_CHANGE2 = 4.0 * 4.0
#: weight of one step in the per-request variance of a level.
_VAR_WEIGHT = 1.0 / 64.0
#: one step's squared deviation enters the variance clipped at this many
#: variances: a change must not widen the noise it is judged against.
_VAR_CLIP = 9.0
#: change detection (CUSUM): each step's deviation from the slow mean, in
#: standard errors, less ``_CUSUM_K`` accumulates per side; beyond
#: ``_CUSUM_H`` the level restarts from the mean since the excursion began.
#: A false restart about every 10,000 steps; a shift of one per-request
#: standard deviation shows after ~10 requests at batch 1, of 0.76 (first-
#: position agreement 0.5 -> 0.88) after ~28, and within a few steps at
#: batch 4 and up.
_CUSUM_K = 0.5
_CUSUM_H = 8.0
#: a step's deviation counts at most this many standard errors: at least
#: 6 steps make a change, however far one of them lies.
_Z_CLIP = 2.0
_Z_CLIP_NEG = -_Z_CLIP  # (negated once, not at every step)
#: a level's variance is floored here (constant samples, e.g. every draft
#: agreeing, must not make the next deviation infinitely significant).
_VAR_FLOOR = 1e-4
#: step-time samples behind a mode's fit (weights decay by 1 - 1/this per
#: sample of that mode): long enough for 1% precision at 12% noise.
_FIT_SAMPLES = 256.0
_FORGET = 1.0 - 1.0 / _FIT_SAMPLES
#: prior variance of the batch size (requests^2) in the slope: while the
#: batch hardly varies, the slope shrinks to 0 (flat in the batch); small,
#: as a prediction far from the fit's batches is not used (see leverage).
SLOPE_PRIOR = 0.1
#: a fit's line is solved again every this many samples of its mode.
_SOLVE_EVERY = 4
_SOLVE_W = float(_SOLVE_EVERY)  # (a float compares faster with a float)
#: squared relative noise of one step time, assumed until measured.
_RES_PRIOR = 0.1 * 0.1
#: weight of one residual in a fit's noise estimate.
_RES_WEIGHT = 1.0 / 32.0
#: the weight of the one residual a solve takes in (for every sample since)
_RES_STEP = _RES_WEIGHT * _SOLVE_EVERY
#: a prediction is floored at this share of the fit's mean step time (a line
#: extrapolated to small batches must not reach 0).
_FLOOR = 0.02


class Level:
    """A mean over requests that follows changes: a slow mean (up to
    ``SLOW_REQUESTS`` requests) and a two-sided CUSUM on the steps'
    deviations from it; where one side's sum passes ``_CUSUM_H`` the mean
    restarts from the samples since that excursion began (a change, not
    noise). Unlike a fast/slow pair of means, a CUSUM accumulates a moderate
    shift until it shows, instead of waiting for it to reach a fixed number
    of standard errors within one window."""

    __slots__ = ("slow", "n", "var", "restarts", "up", "up_s", "up_n", "dn",
                 "dn_s", "dn_n")  # fmt: skip

    def __init__(self, var: float = 1.0) -> None:
        self.var = var  # per-request variance (a prior, then measured)
        self.restarts = 0
        self.forget()

    def add(self, mean: float, b: float) -> bool:
        """Fold in ``b`` requests whose samples average ``mean``; True when
        the mean restarted (a change). ``b`` is best a float (an int works;
        float-only arithmetic is faster than mixed, and the hot caller
        converts it once for this and :meth:`StepTime.add`)."""
        n = self.n
        if n == 0.0:
            self.slow = mean
            self.n = b if b < SLOW_REQUESTS else SLOW_REQUESTS
            return False
        slow = self.slow
        d = mean - slow
        var = self.var
        e = b * d * d
        if e > _VAR_CLIP * var:
            e = _VAR_CLIP * var
        var += _VAR_WEIGHT * (e - var)
        if var < _VAR_FLOOR:
            var = _VAR_FLOOR
        self.var = var
        z = d / _sqrt(var * (1.0 / b + 1.0 / n))
        if z > _Z_CLIP:  # (one odd step is no change: skewed samples,
            z = _Z_CLIP  # e.g. a miss where 85% of drafts agree, count
        elif z < _Z_CLIP_NEG:  # at most this much)
            z = _Z_CLIP_NEG
        c = self.up + z - _CUSUM_K
        if c > 0.0:
            self.up = c
            self.up_s += mean * b
            self.up_n += b
            if c > _CUSUM_H:
                self.restart(self.up_s / self.up_n, self.up_n)
                return True
        elif self.up:
            self.up = self.up_s = self.up_n = 0.0
        c = self.dn - z - _CUSUM_K
        if c > 0.0:
            self.dn = c
            self.dn_s += mean * b
            self.dn_n += b
            if c > _CUSUM_H:
                self.restart(self.dn_s / self.dn_n, self.dn_n)
                return True
        elif self.dn:
            self.dn = self.dn_s = self.dn_n = 0.0
        if n < SLOW_REQUESTS:  # (else it stays there)
            n += b
            if n > SLOW_REQUESTS:
                n = SLOW_REQUESTS
            self.n = n
        self.slow = slow + b / n * d
        return False

    def forget(self) -> None:
        """Start over: the next samples set the level (it described an
        acceptance that has since changed)."""
        self.slow = self.n = 0.0
        self.up = self.up_s = self.up_n = self.dn = self.dn_s = self.dn_n = 0.0

    def restart(self, value: float, n: float = FAST_REQUESTS) -> None:
        """It changed: start the mean afresh from ``value`` (what the recent
        ``n`` requests say)."""
        self.forget()
        self.slow = value
        self.n = n if n < SLOW_REQUESTS else SLOW_REQUESTS
        self.restarts += 1


class StepTime:
    """One mode's step time as ``a + c * batch``: weighted least squares whose
    weights decay per sample (``_FORGET``), with its relative noise. The
    sums take every sample; the line is solved again every ``_SOLVE_EVERY``
    samples (cheaper; a line 3 samples behind, out of ~256, is as good)."""

    __slots__ = (
        "w", "sb", "sbb", "st", "sbt", "k",
        "a", "c", "mb", "vb", "res", "floor", "reach", "lo", "hi",
    )  # fmt: skip

    def __init__(self) -> None:
        self.w = self.sb = self.sbb = self.st = self.sbt = 0.0
        self.a = self.c = self.mb = self.vb = self.floor = self.reach = 0.0
        self.lo = self.hi = 0.0  # mb -+ reach (the hot paths' range tests)
        self.res = _RES_PRIOR
        self.k = 0

    def predict(self, b: int) -> float:
        """The line at ``b``, floored (inlined on the hot paths, ``add`` and
        ``Goodput.decide``: a change here goes there too)."""
        t = self.a + self.c * b
        return t if t > self.floor else self.floor

    def leverage(self, b: int) -> float:
        """1 / the samples' worth behind ``predict(b)``: 1 / their weight at
        the mean batch, more the farther ``b`` lies from it (least squares'
        leverage). Above 1: less than one sample's worth (far). Inlined in
        ``Goodput.decide``'s probe check (the hot path): a change here goes
        there too."""
        d = b - self.mb
        return (1.0 + d * d / (self.vb + SLOPE_PRIOR)) / self.w

    def add(self, b: float, dt: float) -> None:
        """Fold in one step of batch ``b`` (best a float, as for
        :meth:`Level.add`) that took ``dt`` seconds."""
        f = _FORGET
        self.w = w = self.w * f + 1.0
        self.sb = self.sb * f + b
        self.sbb = self.sbb * f + b * b
        self.st = self.st * f + dt
        self.sbt = self.sbt * f + b * dt
        k = self.k + 1
        self.k = k
        if k % _SOLVE_EVERY and w > _SOLVE_W and self.lo < b < self.hi:
            return  # (a sample beyond the line's reach is solved at once)
        if w > 1.0 and self.lo < b < self.hi:
            # the noise, from this sample against the line so far (not a
            # sample beyond its reach: that miss is the line's, not noise)
            t = self.a + self.c * b  # (predict(b), inlined)
            r = dt / (t if t > self.floor else self.floor) - 1.0
            self.res += _RES_STEP * (r * r - self.res)
        mb = self.sb / w
        mt = self.st / w
        vb = self.sbb / w - mb * mb
        if vb < 0.0:
            vb = 0.0
        vp = vb + SLOPE_PRIOR
        c = (self.sbt / w - mb * mt) / vp
        self.a = mt - c * mb
        self.c = c
        self.mb = mb
        self.vb = vb
        self.floor = _FLOOR * mt
        # batches within ``reach`` of the mean have leverage <= 1
        self.reach = reach = _sqrt((w - 1.0) * vp)
        self.lo = mb - reach
        self.hi = mb + reach


def depth(p: float, s: int) -> float:
    """Expected accepted drafts of ``s`` chained ones with per-token
    acceptance ``p`` (geometric): ``p + p**2 + ... + p**s``."""
    if p >= 1.0:
        return float(s)
    return p * (1.0 - p**s) / (1.0 - p)
