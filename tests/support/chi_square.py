"""Pearson's chi-square test of homogeneity for two samples of categories,
written out because the test environments have no SciPy.

``homogeneity(a, b)`` pools categories whose expected count is below
``min_expected`` (the textbook rule for the chi-square approximation) into one
bin, and returns the statistic, its degrees of freedom and the p-value from
the chi-square survival function (the regularized upper incomplete gamma
function, by its series or its continued fraction, whichever converges).
``stratified_homogeneity`` compares conditional distributions: pairs
``(stratum, value)``, one homogeneity test per stratum, summed.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Iterable
from dataclasses import dataclass

__all__ = ["ChiSquare", "chi2_sf", "homogeneity", "stratified_homogeneity"]


def _upper_gamma_regularized(a: float, x: float) -> float:
    """Q(a, x) = Gamma(a, x) / Gamma(a), for a > 0, x >= 0."""
    if x <= 0:
        return 1.0
    log_prefix = -x + a * math.log(x) - math.lgamma(a)
    if x < a + 1:  # series for P(a, x), then Q = 1 - P
        term = total = 1.0 / a
        n = a
        for _ in range(10_000):
            n += 1
            term *= x / n
            total += term
            if abs(term) < abs(total) * 1e-15:
                break
        return max(0.0, 1.0 - total * math.exp(log_prefix))
    # continued fraction for Q(a, x) (modified Lentz)
    tiny = 1e-300
    b = x + 1 - a
    c = 1 / tiny
    d = 1 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        delta = d * c
        h *= delta
        if abs(delta - 1) < 1e-15:
            break
    return math.exp(log_prefix) * h


def chi2_sf(statistic: float, dof: int) -> float:
    """P(X >= statistic) for X chi-square distributed with ``dof`` degrees."""
    if dof < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {dof}")
    return _upper_gamma_regularized(dof / 2.0, statistic / 2.0)


@dataclass(frozen=True)
class ChiSquare:
    statistic: float
    dof: int
    p_value: float
    #: the bins compared: (category or "pooled", count in a, count in b);
    #: for a stratified test, the strata that count.
    bins: tuple[tuple[object, int, int], ...]
    unit: str = "bins"

    def summary(self) -> str:
        return (
            f"chi2 = {self.statistic:.2f}, dof = {self.dof}, p = {self.p_value:.3g} "
            f"({len(self.bins)} {self.unit})"
        )


def homogeneity(
    a: Iterable[Hashable], b: Iterable[Hashable], *, min_expected: float = 5.0
) -> ChiSquare:
    """Do samples ``a`` and ``b`` come from the same categorical distribution?"""
    ca, cb = Counter(a), Counter(b)
    na, nb = sum(ca.values()), sum(cb.values())
    if not na or not nb:
        raise ValueError("both samples need at least one value")
    share_a = na / (na + nb)
    big, pooled = [], [0, 0]
    for cat in sorted(set(ca) | set(cb), key=lambda c: -(ca[c] + cb[c])):
        total = ca[cat] + cb[cat]
        if min(total * share_a, total * (1 - share_a)) >= min_expected:
            big.append((cat, ca[cat], cb[cat]))
        else:
            pooled[0] += ca[cat]
            pooled[1] += cb[cat]
    bins = list(big)
    if sum(pooled):
        total = sum(pooled)
        if big and min(total * share_a, total * (1 - share_a)) < min_expected:
            # too small a bin of its own: merge it into the smallest kept one
            cat, x, y = bins.pop()
            bins.append(("pooled", x + pooled[0], y + pooled[1]))
        else:
            bins.append(("pooled", pooled[0], pooled[1]))
    if len(bins) < 2:
        return ChiSquare(0.0, 0, 1.0, tuple(bins))
    stat = 0.0
    for _, x, y in bins:
        total = x + y
        for observed, expected in ((x, total * share_a), (y, total * (1 - share_a))):
            stat += (observed - expected) ** 2 / expected
    dof = len(bins) - 1
    return ChiSquare(stat, dof, chi2_sf(stat, dof), tuple(bins))


def stratified_homogeneity(
    a: Iterable[tuple[Hashable, Hashable]],
    b: Iterable[tuple[Hashable, Hashable]],
    *,
    min_expected: float = 5.0,
) -> ChiSquare:
    """Do the second elements of pairs ``(stratum, value)`` have the same
    distribution in ``a`` and ``b`` given the stratum? The sum over strata of
    each stratum's homogeneity statistic, with the sum of their degrees of
    freedom (a stratum seen in one sample only tells nothing and is left out).
    ``bins``: (stratum, count in a, count in b) of the strata that count."""
    by_a: dict = {}
    by_b: dict = {}
    for s, v in a:
        by_a.setdefault(s, []).append(v)
    for s, v in b:
        by_b.setdefault(s, []).append(v)
    stat, dof, strata = 0.0, 0, []
    for s in sorted(set(by_a) & set(by_b), key=lambda s: -len(by_a[s]) - len(by_b[s])):
        part = homogeneity(by_a[s], by_b[s], min_expected=min_expected)
        if part.dof:
            stat += part.statistic
            dof += part.dof
            strata.append((s, len(by_a[s]), len(by_b[s])))
    p = chi2_sf(stat, dof) if dof else 1.0
    return ChiSquare(stat, dof, p, tuple(strata), unit="strata")
