"""Shadow mode's bookkeeping: what the policy would have run, and what it
estimates that would have gained.

In shadow mode (``--gate-shadow``, ``EAGLE_GATE_SHADOW``, ``shadow = true`` in
the config file, or ``{"shadow": true}`` on the control route) the policy is
asked before every decode batch and observes every outcome exactly as usual,
but every step runs SGLang's stock speculative step. It is how an operator
watches a policy on live traffic before letting it act.

The estimate: a SPEC step that ran where the policy would have run PLAIN
emitted ``tokens`` tokens in its measured interval ``I``. Had those tokens come
from PLAIN steps at the policy's predicted PLAIN rate ``r`` (tokens/s for that
batch, from its optional ``predicted_plain_rate(view)``), they would have
taken ``tokens / r``. Over all shadow steps with a measured interval::

    estimated_gain = sum(I) / (sum(I over would-SPEC) + sum(tokens / r)) - 1

so +0.10 means "about 10% more tokens per second". Would-PLAIN steps whose
policy gave no prediction count as unchanged and are reported apart
(``plain_without_estimate``); when every would-PLAIN step lacks one, the
estimate is unknown (None) rather than a made-up zero. The resync cost of
switching back to SPEC is not in it; a policy that wants it counted folds it
into its predicted rate.

A policy that only measures (``goodput``) learns PLAIN rates from PLAIN steps,
which shadow mode never runs: it predicts from what it measured before
shadow mode was switched on, or not at all. Say so when you read the number.

No SGLang, no torch; O(1) per step, fixed-size state.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

__all__ = ["ShadowLedger", "predicted_plain_rate", "SHADOW_NOTE"]

#: what the log lines add for a policy in shadow mode.
SHADOW_NOTE = " in SHADOW mode (every step runs SGLang's stock step)"

_RING = 16
_RING_MASK = _RING - 1
#: codes in the per-step ring besides a positive predicted rate.
_WOULD_SPEC = 0.0
_NO_ESTIMATE = -1.0


def predicted_plain_rate(policy: Any) -> Callable[[Any], float] | None:
    """The policy's optional ``predicted_plain_rate(view)``, or None."""
    fn = getattr(policy, "predicted_plain_rate", None)
    return fn if callable(fn) else None


class ShadowLedger:
    """Would-have decisions and the estimated gain of a shadow run.

    :meth:`decided` at decision time, :meth:`resolved` when the step's result
    arrives (1-2 steps later: a 16-step ring keyed by step number pairs them).
    """

    def __init__(self) -> None:
        #: what the policy would have run: [spec, plain].
        self.decisions = [0, 0]
        #: measured time of the shadow steps with a known interval.
        self.stock_s = 0.0
        #: the same steps, the would-PLAIN ones re-timed at the predicted rate.
        self.would_s = 0.0
        #: would-PLAIN steps re-timed / left unchanged for want of a prediction.
        self.plain_estimated = 0
        self.plain_without_estimate = 0
        self._ring_step = [-1] * _RING
        self._ring_rate = [_WOULD_SPEC] * _RING

    def decided(
        self,
        step: int,
        would_plain: bool,
        rate: Callable[[Any], Any] | None = None,
        view: Any = None,
    ) -> None:
        """Record step ``step``'s would-have mode; ``rate(view)`` (called only
        for would-PLAIN steps) gives the predicted PLAIN tokens/s. Never
        raises."""
        j = step & _RING_MASK
        self._ring_step[j] = step
        if not would_plain:
            self.decisions[0] += 1
            self._ring_rate[j] = _WOULD_SPEC
            return
        self.decisions[1] += 1
        value = _NO_ESTIMATE
        if rate is not None:
            try:
                r = rate(view)
                if (
                    not isinstance(r, bool)
                    and isinstance(r, int | float)
                    and math.isfinite(r)
                    and r > 0
                ):
                    value = float(r)
            except Exception:
                pass
        self._ring_rate[j] = value

    def resolved(self, step: int, tokens: int, interval_s: float | None) -> None:
        """Account step ``step``'s stock result (a no-op for other steps)."""
        j = step & _RING_MASK
        if self._ring_step[j] != step:
            return
        self._ring_step[j] = -1
        if interval_s is None or not interval_s > 0:
            return
        r = self._ring_rate[j]
        self.stock_s += interval_s
        if r > 0:
            self.would_s += tokens / r
            self.plain_estimated += 1
        else:
            self.would_s += interval_s
            if r < 0:
                self.plain_without_estimate += 1

    def estimated_gain(self) -> float | None:
        """Relative throughput gain the policy estimates (0.1: +10%), or None
        when unknown (no timed step yet, or no would-PLAIN step had an
        estimate although some wanted PLAIN)."""
        if self.stock_s <= 0 or self.would_s <= 0:
            return None
        if self.plain_estimated == 0 and self.plain_without_estimate > 0:
            return None
        return self.stock_s / self.would_s - 1.0

    def snapshot(self) -> dict[str, Any]:
        """JSON-able totals for status and reports."""
        return {
            "would_run": {"spec": self.decisions[0], "plain": self.decisions[1]},
            "estimated_gain": self.estimated_gain(),
            "timed_seconds": self.stock_s,
            "plain_estimated": self.plain_estimated,
            "plain_without_estimate": self.plain_without_estimate,
        }
