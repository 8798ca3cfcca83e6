"""The ``goodput`` policy's estimators (:mod:`eagle_gate.goodput` decides
with them):

* :class:`Level`: a mean over requests that follows changes, a fast/slow
  pair that restarts on a change (the acceptance ``A`` from SPEC steps, the
  first-position acceptance ``p1`` from PLAIN steps under eager sync);
* :class:`StepTime`: one mode's step time as a line in the batch size, least
  squares with forgetting, with its leverage and relative noise;
* :func:`depth`: the draft's geometric depth profile, which carries a change
  of ``p1`` over to ``A``.

Deterministic, no SGLang or torch import; each constant says what it is for.
"""

from __future__ import annotations

import math

__all__ = ["FAST_REQUESTS", "Z_CHANGE2", "Level", "StepTime", "depth"]

#: requests behind the fast acceptance estimates: at batch 1 a change of the
#: accept length from 3.2 to 1.8 shows within about 15 steps.
FAST_REQUESTS = 16.0
_FAST_WEIGHT = 1.0 / FAST_REQUESTS
#: requests behind the slow acceptance estimates at most: about 1% of
#: relative noise, and a lag of ~128 steps at batch 8 behind a gradual drift
#: (a class mix that moves with the requests), which no restart catches.
_SLOW_REQUESTS = 2048.0
#: a slow estimate restarts from the fast one when they differ by more than
#: this many standard errors (a change, not noise; squared).
Z_CHANGE2 = 4.0 * 4.0
#: weight of one step in the per-request variance of a level.
_VAR_WEIGHT = 1.0 / 64.0
#: step-time samples behind a mode's fit (weights decay by 1 - 1/this per
#: sample of that mode): long enough for 1% precision at 12% noise.
_FIT_SAMPLES = 256.0
_FORGET = 1.0 - 1.0 / _FIT_SAMPLES
#: prior variance of the batch size (requests^2) in the slope: while the
#: batch hardly varies, the slope shrinks to 0 (flat in the batch); small,
#: as a prediction far from the fit's batches is not used (see leverage).
_SLOPE_PRIOR = 0.1
#: a fit's line is solved again every this many samples of its mode.
_SOLVE_EVERY = 4
#: squared relative noise of one step time, assumed until measured.
_RES_PRIOR = 0.1 * 0.1
#: weight of one residual in a fit's noise estimate.
_RES_WEIGHT = 1.0 / 32.0
#: a prediction is floored at this share of the fit's mean step time (a line
#: extrapolated to small batches must not reach 0).
_FLOOR = 0.02


class Level:
    """A mean over requests that follows changes: a fast EMA (about
    ``FAST_REQUESTS`` requests) and a slow mean (up to ``_SLOW_REQUESTS``)
    that restarts from the fast one when the two differ beyond their noise."""

    __slots__ = ("fast", "slow", "n", "var", "restarts")

    def __init__(self) -> None:
        self.fast = self.slow = self.n = 0.0
        self.var = 1.0  # per-request variance (replaced by measurement)
        self.restarts = 0

    def add(self, mean: float, b: int) -> bool:
        """Fold in ``b`` requests whose samples average ``mean``; True when
        the slow mean restarted (a change)."""
        n = self.n
        if n == 0.0:
            self.fast = self.slow = mean
            self.n = b if b < _SLOW_REQUESTS else _SLOW_REQUESTS
            return False
        n += b
        if n > _SLOW_REQUESTS:
            n = _SLOW_REQUESTS
        slow = self.slow
        d = mean - slow
        var = self.var
        var += _VAR_WEIGHT * (b * d * d - var)
        slow += b / n * d
        a = b * _FAST_WEIGHT
        if a > 1.0:
            a = 1.0
        fast = self.fast
        fast += a * (mean - fast)
        d = fast - slow
        # the fast EMA's variance in per-request variances, and the slow's
        fv = a / ((2.0 - a) * b) + 1.0 / n
        self.fast = fast
        self.var = var
        if d * d > Z_CHANGE2 * var * fv:
            self.restart(fast)
            return True
        self.slow = slow
        self.n = n
        return False

    def restart(self, value: float) -> None:
        """It changed: start the slow mean afresh, from ``value`` (what the
        recent requests say), with the fast EMA's weight; the fast EMA
        starts there too."""
        self.slow = self.fast = value
        self.n = FAST_REQUESTS
        self.restarts += 1


class StepTime:
    """One mode's step time as ``a + c * batch``: weighted least squares whose
    weights decay per sample (``_FORGET``), with its relative noise. The
    sums take every sample; the line is solved again every ``_SOLVE_EVERY``
    samples (cheaper; a line 3 samples behind, out of ~256, is as good)."""

    __slots__ = (
        "w", "sb", "sbb", "st", "sbt", "k",
        "a", "c", "mb", "vb", "res", "floor", "reach",
    )  # fmt: skip

    def __init__(self) -> None:
        self.w = self.sb = self.sbb = self.st = self.sbt = 0.0
        self.a = self.c = self.mb = self.vb = self.floor = self.reach = 0.0
        self.res = _RES_PRIOR
        self.k = 0

    def predict(self, b: int) -> float:
        t = self.a + self.c * b
        return t if t > self.floor else self.floor

    def leverage(self, b: int) -> float:
        """1 / the samples' worth behind ``predict(b)``: 1 / their weight at
        the mean batch, more the farther ``b`` lies from it (least squares'
        leverage). Above 1: less than one sample's worth (far)."""
        d = b - self.mb
        return (1.0 + d * d / (self.vb + _SLOPE_PRIOR)) / self.w

    def add(self, b: int, dt: float) -> None:
        f = _FORGET
        self.w = w = self.w * f + 1.0
        self.sb = self.sb * f + b
        self.sbb = self.sbb * f + b * b
        self.st = self.st * f + dt
        self.sbt = self.sbt * f + b * dt
        k = self.k + 1
        self.k = k
        if (
            k % _SOLVE_EVERY
            and w > _SOLVE_EVERY
            and -self.reach < b - self.mb < self.reach
        ):
            return  # (a sample beyond the line's reach is solved at once)
        if w > 1.0:  # the noise, from this sample against the line so far
            r = dt / self.predict(b) - 1.0
            self.res += _RES_WEIGHT * _SOLVE_EVERY * (r * r - self.res)
        mb = self.sb / w
        mt = self.st / w
        vb = self.sbb / w - mb * mb
        if vb < 0.0:
            vb = 0.0
        c = (self.sbt / w - mb * mt) / (vb + _SLOPE_PRIOR)
        self.a = mt - c * mb
        self.c = c
        self.mb = mb
        self.vb = vb
        self.floor = _FLOOR * mt
        # batches within ``reach`` of the mean have leverage <= 1
        self.reach = math.sqrt((w - 1.0) * (vb + _SLOPE_PRIOR))


def depth(p: float, s: int) -> float:
    """Expected accepted drafts of ``s`` chained ones with per-token
    acceptance ``p`` (geometric): ``p + p**2 + ... + p**s``."""
    if p >= 1.0:
        return float(s)
    return p * (1.0 - p**s) / (1.0 - p)
