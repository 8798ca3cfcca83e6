"""Comparison policies that exist only in the simulator.

* :class:`EmaTier`: an SGLang-0.5.23-like adaptive controller. It never runs
  PLAIN; it chooses the depth (``view.depth``, the policy contract's depth)
  per decode batch from batch-size tiers (default
  bs>=1 -> {1,3,5,7}, >=8 -> {0,1,3}, >=32 -> {0,1}, >=64 -> {0}) with an EMA of
  accepted drafts inside a tier. Depth 0 is SGLang's "off": a 1-token
  verify plus the draft extend, which the simulator charges as such (the
  simulator accepts depth 0 with ``Mode.SPEC`` for this baseline only; in the
  gate's contract depth 0 is PLAIN, a true decode).
* :class:`FixedDepth`: SPEC at one depth on every step (``spec-d3``, ...).
* :class:`Oracle`: per step, the mode with more tokens/second given perfect
  knowledge of that step's acceptance draws and the noise-free cost model.
  The resync a switch to SPEC costs is amortized over ``horizon`` steps (a
  purely myopic comparison would never leave PLAIN once the resync outweighs
  one step's gain).
* :class:`OracleMean`: the same with each request's expected acceptance (its
  class's mean) instead of the step's draws: no causal policy can use the
  draws, so this is the reachable target.
* :class:`DepthOracleMean` (``depth-oracle``): like :class:`OracleMean`, over
  PLAIN and every depth of ``view.depths``: per step the one with the highest
  expected tokens per second (resync amortized the same way). With one depth
  it decides exactly as :class:`OracleMean`.
* :func:`tune_threshold`: grid search of the built-in ``threshold`` policy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from eagle_gate.policies import AlwaysSpec
from eagle_gate.policy import Mode, StepOutcome, StepView

__all__ = [
    "EmaTier",
    "FixedDepth",
    "Oracle",
    "OracleMean",
    "DepthOracleMean",
    "THRESHOLD_GRID",
    "DEFAULT_TIERS",
]

DEFAULT_TIERS: tuple[tuple[int, tuple[int, ...]], ...] = (
    (1, (1, 3, 5, 7)),
    (8, (0, 1, 3)),
    (32, (0, 1)),
    (64, (0,)),
)


class EmaTier:
    """SGLang 0.5.23-like adaptive ``num_steps`` (sim-only, see module doc)."""

    name = "sglang-ema"

    def __init__(
        self,
        tiers: Sequence[tuple[int, Sequence[int]]] = DEFAULT_TIERS,
        ema_alpha: float = 0.2,
    ) -> None:
        self.tiers = tuple((int(lo), tuple(sorted(c))) for lo, c in tiers)
        self.ema_alpha = ema_alpha
        #: EMA of accepted draft tokens per step, per tier (None: no sample yet)
        self._ema: list[float | None] = [None] * len(self.tiers)
        self._tier_of_step: dict[int, int] = {}

    def _tier(self, b: int) -> int:
        t = 0
        for i, (lo, _) in enumerate(self.tiers):
            if b >= lo:
                t = i
        return t

    def decide(self, view: StepView) -> Mode:
        t = self._tier(view.batch_size)
        cands = self.tiers[t][1]
        ema = self._ema[t]
        if ema is None:
            # no acceptance seen in this tier yet: the largest candidate
            choice = cands[-1]
        else:
            target = ema + 1.0  # draft one more than what was recently accepted
            choice = cands[-1]
            for c in cands:
                if c >= target:
                    choice = c
                    break
        view.depth = choice
        self._tier_of_step[view.step] = t
        return Mode.SPEC

    def observe(self, outcome: StepOutcome) -> None:
        t = self._tier_of_step.pop(outcome.step, None)
        if t is None or outcome.batch_size <= 0:
            return
        accepted = outcome.tokens / outcome.batch_size - 1.0
        if outcome.depth == 0:
            return  # a 0-step verify says nothing about acceptance
        ema = self._ema[t]
        self._ema[t] = (
            accepted if ema is None else ema + self.ema_alpha * (accepted - ema)
        )


class FixedDepth(AlwaysSpec):
    """SPEC at ``depth`` (>= 1) draft steps on every step: the built-in
    ``always depth=d``, under the simulator's name for it (``spec-d<d>``)."""

    def __init__(self, depth: int) -> None:
        super().__init__(depth)
        self.name = f"spec-d{depth}"


class Oracle:
    """Best mode per step with perfect knowledge (sim-only, see module doc)."""

    name = "oracle"

    def __init__(self, horizon: int = 8) -> None:
        self.horizon = horizon
        self._sim: Any = None

    def bind(self, sim: Any) -> None:
        self._sim = sim

    def decide(self, view: StepView) -> Mode:
        b, spec_tokens, t_spec, resync, t_plain = self._sim.peek()
        spec_rate = spec_tokens / (t_spec + resync / self.horizon)
        return Mode.SPEC if spec_rate > b / t_plain else Mode.PLAIN

    def observe(self, outcome: StepOutcome) -> None:
        return None


class OracleMean(Oracle):
    """Like :class:`Oracle`, but knows only each request's *expected*
    acceptance (its class's mean), not the step's draws: the best a causal
    policy could do with perfect estimates."""

    name = "oracle-mean"

    def decide(self, view: StepView) -> Mode:
        b, spec_tokens, t_spec, resync, t_plain = self._sim.peek_mean()
        spec_rate = spec_tokens / (t_spec + resync / self.horizon)
        return Mode.SPEC if spec_rate > b / t_plain else Mode.PLAIN


class DepthOracleMean(OracleMean):
    """Like :class:`OracleMean` over PLAIN and each of ``view.depths``: the
    one with the highest expected tokens/s (see the module doc)."""

    name = "depth-oracle"

    def decide(self, view: StepView) -> Mode:
        depths = view.depths
        b, tokens, times, resync, t_plain = self._sim.peek_mean_depths(depths)
        best = b / t_plain
        choice = -1
        amortized = resync / self.horizon
        for i in range(len(depths)):
            rate = tokens[i] / (times[i] + amortized)
            if rate > best:
                best, choice = rate, i
        if choice < 0:
            return Mode.PLAIN
        view.depth = depths[choice]
        return Mode.SPEC


#: (plain_above, spec_at_or_below) pairs searched by the threshold tuning;
#: (0, 0) is "always PLAIN", a huge plain_above is "always SPEC".
THRESHOLD_GRID: tuple[tuple[int, int], ...] = (
    (0, 0),
    (1, 1),
    (2, 1),
    (4, 2),
    (8, 4),
    (16, 8),
    (32, 16),
    (64, 32),
    (128, 64),
    (200, 100),
    (1 << 20, 1 << 19),
)


def tune_threshold(
    evaluate: Callable[[Callable[[], Any]], float],
    make: Callable[[int, int], Any],
    grid: Sequence[tuple[int, int]] = THRESHOLD_GRID,
) -> tuple[tuple[int, int], float]:
    """Return the grid point with the best ``evaluate(factory)`` score."""
    best: tuple[int, int] | None = None
    best_score = float("-inf")
    for pa, sb in grid:
        score = evaluate(lambda pa=pa, sb=sb: make(pa, sb))
        if score > best_score:
            best, best_score = (pa, sb), score
    assert best is not None
    return best, best_score
