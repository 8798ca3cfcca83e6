"""The guards that keep the gate from ever breaking the server.

What can go wrong around a decode step, and what the gate does about it, in
one place (the runtime calls these only when something did go wrong, never
on a healthy step):

* a policy that raises or returns something other than a ``Mode``: that
  step runs SGLang's stock speculative path; counted by reason
  (``policy_errors``), logged at most once a minute;
* a ``decide`` slower than ``decide_budget_s``: counted
  (``slow_decisions``), logged at most once a minute;
* a plain step that raises: the stock step runs instead; after
  ``plain_failures_to_degrade`` consecutive failures the gate *degrades*
  (:meth:`Guards.plain_step_failed` says so; the runtime stops asking the
  policy for the rest of the run);
* a failure of the gate's own logic in a wrapper (``internal_errors``) or of
  runtime control at a tick (``tick_errors``): counted and logged, the first
  time and every 1000th.

Every count lives in :class:`eagle_gate.counters.GateCounters`, where the
status and the metrics read it. No SGLang, no torch.
"""

from __future__ import annotations

import logging

from eagle_gate.counters import GateCounters, Overrides
from eagle_gate.logutil import OncePer, first_then_every

logger = logging.getLogger("eagle_gate")

__all__ = ["Guards"]


class Guards:
    """Counts and logs what went wrong; says when the gate must degrade."""

    def __init__(
        self,
        counters: GateCounters,
        *,
        decide_budget_s: float = 1e-3,
        plain_failures_to_degrade: int = 3,
    ) -> None:
        self.counters = counters
        #: a ``decide`` slower than this is counted and logged.
        self.decide_budget_s = decide_budget_s
        #: consecutive plain-step failures that degrade the gate.
        self.plain_failures_to_degrade = plain_failures_to_degrade
        self._policy_error_log = OncePer()
        self._slow_log = OncePer()

    def policy_error(self, policy: str, reason: str, what: str) -> None:
        """Policy ``policy`` failed (``reason``, one of ``PolicyErrors``;
        ``what`` says how); the step runs SGLang's stock speculative path."""
        total = self.counters.count_policy_error(reason)
        if self._policy_error_log.ready():
            logger.warning(
                "eagle_gate: policy %r %s; this step runs SGLang's stock speculative"
                " path (policy errors so far: %d; logged at most once a minute)",
                policy,
                what,
                total,
            )

    def slow_decision(self, policy: str, elapsed: float) -> None:
        """Policy ``policy`` took ``elapsed`` seconds, over the budget."""
        total = self.counters.count_slow_decision(elapsed)
        if self._slow_log.ready():
            logger.warning(
                "eagle_gate: policy %r took %.3f ms to decide (budget %.3f ms; slow "
                "decisions so far: %d; logged at most once a minute)",
                policy,
                elapsed * 1e3,
                self.decide_budget_s * 1e3,
                total,
            )

    def plain_step_failed(self, exc: BaseException) -> str | None:
        """A plain step raised ``exc`` (the stock step runs instead). Returns
        why the gate must degrade when that makes ``plain_failures_to_degrade``
        failures in a row (logged as an error), else None."""
        counters = self.counters
        counters.plain_step_failures += 1
        counters.consecutive_plain_failures += 1
        counters.count_override(Overrides.PLAIN_STEP_FAILED)
        if counters.consecutive_plain_failures >= self.plain_failures_to_degrade:
            reason = (
                f"the plain step failed {counters.consecutive_plain_failures} times "
                f"in a row (last: {exc!r})"
            )
            logger.error(
                "eagle_gate: %s; the gate is DEGRADED: every step from now on is "
                "SGLang's stock speculative step",
                reason,
                exc_info=exc,
            )
            return reason
        if first_then_every(counters.plain_step_failures):
            logger.warning(
                "eagle_gate: the plain step failed (%d so far: %r); this step ran "
                "SGLang's stock speculative step",
                counters.plain_step_failures,
                exc,
                exc_info=exc,
            )
        return None

    def internal_error(self, what: str, exc: BaseException) -> None:
        """The gate's own logic failed while ``what``; the step runs SGLang's
        stock path."""
        counters = self.counters
        counters.internal_errors += 1
        if first_then_every(counters.internal_errors):
            logger.error(
                "eagle_gate: internal error while %s (%d so far); this step runs "
                "SGLang's stock path",
                what,
                counters.internal_errors,
                exc_info=exc,
            )

    def tick_failed(self, step: int) -> None:
        """Runtime control failed at the tick of ``step`` (call it from the
        ``except`` block: the log has the traceback); the policy stays."""
        counters = self.counters
        counters.tick_errors += 1
        if first_then_every(counters.tick_errors):
            logger.exception(
                "eagle_gate: runtime control failed at step %d (%d so far); "
                "the current policy stays",
                step,
                counters.tick_errors,
            )
