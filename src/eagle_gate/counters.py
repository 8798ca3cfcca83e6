"""What the gate counts in one scheduler process, in plain ints.

:class:`GateCounters` holds every counter the hot path bumps (steps, tokens
and requests by mode, policy errors, overrides, plain-step paths, internal
errors...) and :class:`DecisionRing` the last decisions. Both are read by the
ops thread for the status record (``as_status``) and by the Prometheus
exporter (:mod:`eagle_gate.metrics`) as they are: CPython makes each read of
an int atomic, so a reader on another thread sees a value that was true at
some point, never a torn one. Nothing here allocates per step.

No SGLang, no torch.
"""

from __future__ import annotations

import collections
from typing import Any

from eagle_gate.policy import Mode

__all__ = [
    "GateCounters",
    "DecisionRing",
    "Overrides",
    "PolicyErrors",
    "MODE_NAMES",
    "DECIDED_NAMES",
    "DECIDED_ERROR",
    "DECIDED_NOT_ASKED",
    "PLAIN_PATHS",
    "PLAIN_EAGER_REASONS",
    "DRAFT_EXTEND_PATHS",
]

#: names of the modes that run, by ``Mode`` value (SPEC 0, PLAIN 1).
MODE_NAMES = ("spec", "plain")
#: decision codes in the ring / decision log besides Mode.SPEC (0), Mode.PLAIN (1).
DECIDED_ERROR = 2
DECIDED_NOT_ASKED = 3
DECIDED_NAMES = ("spec", "plain", "error", "not_asked")
#: the plain step's target paths, and why one ran eagerly (docs/plain-graphs.md).
PLAIN_PATHS = ("graph", "eager")
PLAIN_EAGER_REASONS = ("graphs_off", "bs_above_max", "bs_not_captured", "declined")
#: the paths of the plain step's draft extends (eager sync, lazy catch-up):
#: SGLang's own draft-extend CUDA graph, or its eager draft forward.
DRAFT_EXTEND_PATHS = ("graph", "eager")
#: finished dwells kept for the metrics exporter, which drains them.
DWELLS_KEPT = 4096


class Overrides:
    """Reasons the gate ran SPEC although the policy asked for PLAIN (besides
    the plain step's own blockers, such as ``logprobs`` or ``grammar``)."""

    #: the plain step is not available for this SGLang version / build yet.
    PLAIN_STEP_UNAVAILABLE = "plain_step_unavailable"
    #: the plain step raised; the stock step ran instead.
    PLAIN_STEP_FAILED = "plain_step_failed"
    #: the gate degraded to stock behaviour (the policy is not asked any more).
    DEGRADED = "degraded"
    #: DP attention: another DP rank voted SPEC (or was idle) for this step.
    DP_RANKS = "dp_ranks"


class PolicyErrors:
    """Reasons counted in ``policy_errors_by_reason``."""

    DECIDE_RAISED = "decide_raised"
    DECIDE_INVALID = "decide_invalid"
    OBSERVE_RAISED = "observe_raised"
    ALL = (DECIDE_RAISED, DECIDE_INVALID, OBSERVE_RAISED)


class GateCounters:
    """Every count of one process's gate. Indexed by ``Mode`` where per mode."""

    def __init__(self) -> None:
        self.steps_by_mode = [0, 0]
        self.tokens_by_mode = [0, 0]
        #: requests x steps by mode: SPEC tokens / SPEC request-steps is the
        #: accept length of SPEC steps alone (SGLang's own acceptance counts
        #: every plain step as a verify that accepted nothing).
        self.request_steps_by_mode = [0, 0]
        self.decisions_by_mode = [0, 0]
        #: first-position acceptance, seen from both sides. PLAIN steps under
        #: eager draft sync: requests whose draft top proposal equalled the
        #: target's token, and requests measured. SPEC steps: requests that
        #: accepted their first draft token, and requests measured. With a
        #: greedy target the two estimate the same probability.
        self.plain_draft_matches = 0
        self.plain_draft_samples = 0
        self.spec_first_accepts = 0
        self.spec_first_samples = 0
        self.policy_errors = 0
        self.policy_errors_by_reason = dict.fromkeys(PolicyErrors.ALL, 0)
        #: outcomes outside the StepOutcome contract (see GateRuntime.observe).
        self.invalid_outcomes = 0
        self.overrides: dict[str, int] = {}
        self.slow_decisions = 0
        self.max_decide_s = 0.0
        self.plain_step_failures = 0
        self.consecutive_plain_failures = 0
        #: plain steps by the target's path, and why the eager ones were eager.
        self.plain_path = dict.fromkeys(PLAIN_PATHS, 0)
        self.plain_eager_reasons = dict.fromkeys(PLAIN_EAGER_REASONS, 0)
        #: the plain step's draft extends by the path SGLang takes for them.
        self.draft_extend_path = dict.fromkeys(DRAFT_EXTEND_PATHS, 0)
        #: failures of runtime control at a tick (the current policy stays).
        self.tick_errors = 0
        #: failures of the gate's own logic (the step ran SGLang's stock path).
        self.internal_errors = 0
        # dwell: runs of one mode that ran, in resolved order (count_outcome)
        #: the mode the last resolved decode step ran (a Mode), or None.
        self.current_mode: Any = None
        self.dwell_len = 0
        #: finished dwells ``(mode, steps)``, drained by the metrics exporter.
        self.finished_dwells: collections.deque[tuple[int, int]] = collections.deque(
            maxlen=DWELLS_KEPT
        )

    # -- bumped on the hot path ------------------------------------------------
    def count_override(self, reason: str) -> None:
        self.overrides[reason] = self.overrides.get(reason, 0) + 1

    def count_policy_error(self, reason: str) -> int:
        """Count one; return the total so far."""
        self.policy_errors += 1
        by_reason = self.policy_errors_by_reason
        by_reason[reason] = by_reason.get(reason, 0) + 1
        return self.policy_errors

    def count_slow_decision(self, elapsed_s: float) -> int:
        """Count one ``decide`` over budget; return the total so far."""
        self.slow_decisions += 1
        if elapsed_s > self.max_decide_s:
            self.max_decide_s = elapsed_s
        return self.slow_decisions

    def count_plain_path(self, path: str, reason: str | None = None) -> None:
        """One plain step ran the target on ``path`` ("graph" or "eager");
        ``reason``: why it was eager (see PLAIN_EAGER_REASONS)."""
        self.plain_path[path] = self.plain_path.get(path, 0) + 1
        if reason is not None:
            reasons = self.plain_eager_reasons
            reasons[reason] = reasons.get(reason, 0) + 1

    def count_draft_extend(self, path: str) -> None:
        """One draft extend of the plain step (eager draft sync, or a lazy
        catch-up) ran on ``path``: "graph" when SGLang replays its own
        draft-extend CUDA graph, "eager" when it runs the draft eagerly."""
        self.draft_extend_path[path] = self.draft_extend_path.get(path, 0) + 1

    def count_outcome(
        self, mode: Mode, accept_lens: Any, tokens: int, draft_matches: int | None
    ) -> int | None:
        """Count one valid outcome (``GateRuntime.observe``, checked against
        the contract) and its dwell; returns ``draft_matches`` to pass on.

        ``draft_matches`` (PLAIN steps with eager draft sync, see
        ``StepOutcome.draft_matches``) is counted beside the SPEC steps' own
        first-position acceptance, so the status shows both sides of the same
        estimate; out of range or on a SPEC step it is an invalid outcome and
        dropped (None). The dwell: runs of one mode that ran, in resolved
        order; a finished one goes to the bounded deque the metrics exporter
        drains. One method, not two: this is the hot path."""
        b = len(accept_lens)
        self.steps_by_mode[mode] += 1
        self.tokens_by_mode[mode] += tokens
        self.request_steps_by_mode[mode] += b
        if draft_matches is not None:
            if mode is Mode.PLAIN and 0 <= draft_matches <= b:
                self.plain_draft_matches += draft_matches
                self.plain_draft_samples += b
            else:
                self.invalid_outcomes += 1
                draft_matches = None
        elif mode is Mode.SPEC:
            # requests whose first draft token was accepted, counted in C (a
            # sequence without .count, from a third-party adapter, is skipped)
            try:
                self.spec_first_accepts += b - accept_lens.count(1)
                self.spec_first_samples += b
            except AttributeError:
                pass
        # the dwell
        if mode is self.current_mode:
            self.dwell_len += 1
        else:
            if self.current_mode is not None:
                self.finished_dwells.append((int(self.current_mode), self.dwell_len))
            self.current_mode = mode
            self.dwell_len = 1
        return draft_matches

    # -- read by status and metrics ------------------------------------------
    def spec_accept_length(self) -> float | None:
        """Mean tokens per request of SPEC steps (bonus token included), or
        None before the first one: acceptance without the plain steps."""
        n = self.request_steps_by_mode[0]
        return self.tokens_by_mode[0] / n if n else None

    def first_position_acceptance(self) -> dict[str, dict[str, Any]]:
        """First-position acceptance measured by PLAIN steps (the draft's
        proposal against the target's token) and by SPEC steps (the first
        draft token accepted): counts and rate (None before a sample)."""

        def side(hits: int, n: int) -> dict[str, Any]:
            return {"hits": hits, "requests": n, "rate": hits / n if n else None}

        return {
            "plain": side(self.plain_draft_matches, self.plain_draft_samples),
            "spec": side(self.spec_first_accepts, self.spec_first_samples),
        }

    def as_status(self) -> dict[str, Any]:
        """The counters' part of the status record (JSON-able)."""

        def by_mode(values: list[int]) -> dict[str, int]:
            return {"spec": values[0], "plain": values[1]}

        current = self.current_mode
        return {
            "mode": None if current is None else MODE_NAMES[current],
            "steps": by_mode(self.steps_by_mode),
            "tokens": by_mode(self.tokens_by_mode),
            "request_steps": by_mode(self.request_steps_by_mode),
            "spec_accept_length": self.spec_accept_length(),
            "first_position_acceptance": self.first_position_acceptance(),
            "decisions": by_mode(self.decisions_by_mode),
            "policy_errors": self.policy_errors,
            "invalid_outcomes": self.invalid_outcomes,
            "policy_errors_by_reason": dict(self.policy_errors_by_reason),
            "slow_decisions": self.slow_decisions,
            "max_decide_s": self.max_decide_s,
            "overrides": dict(self.overrides),
            "plain_step_failures": self.plain_step_failures,
            "plain_path": dict(self.plain_path),
            "plain_eager_reasons": dict(self.plain_eager_reasons),
            "draft_extend_path": dict(self.draft_extend_path),
            "internal_errors": self.internal_errors,
        }


class DecisionRing:
    """The last ``size`` decisions (a power of two): parallel fixed-size
    lists written in place (no allocation per step), read oldest first for
    the status."""

    __slots__ = ("size", "_mask", "_step", "_bs", "_decided", "_ran", "_pos")

    def __init__(self, size: int = 32) -> None:
        if size < 1 or size & (size - 1):
            raise ValueError(f"the ring's size must be a power of two, got {size}")
        self.size = size
        self._mask = size - 1
        self._step = [-1] * size
        self._bs = [0] * size
        self._decided = [0] * size
        self._ran = [0] * size
        self._pos = 0

    def write(self, step: int, batch_size: int, decided: int, ran: int) -> None:
        pos = self._pos
        self._step[pos] = step
        self._bs[pos] = batch_size
        self._decided[pos] = decided
        self._ran[pos] = ran
        self._pos = (pos + 1) & self._mask

    def set_last_ran(self, ran: int) -> None:
        """Correct what the newest entry ran (a plain step that failed)."""
        self._ran[(self._pos - 1) % self.size] = ran

    def entries(self) -> list[dict[str, Any]]:
        """The ring, oldest first, without the slots never written."""
        out = []
        pos = self._pos
        for i in range(self.size):
            j = (pos + i) % self.size
            step = self._step[j]
            if step < 0:
                continue
            out.append(
                {
                    "step": step,
                    "batch_size": self._bs[j],
                    "decided": DECIDED_NAMES[self._decided[j]],
                    "ran": MODE_NAMES[self._ran[j]],
                }
            )
        return out
