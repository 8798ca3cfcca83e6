"""One decode step as the runtime sees it: the :class:`Decision` taken before
it, what may run it (:class:`PlainStepLike`), and the outcome contract
checked after it (:func:`checked_outcome`).

No SGLang, no torch. Per step: the runtime's one :class:`Decision` is
refilled in place, and :func:`checked_outcome` hands back one small tuple
(the step's ``(mode, step)`` tuple it replaces is gone from ``decide``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from eagle_gate.counters import GateCounters
from eagle_gate.policy import Mode

__all__ = ["Decision", "PlainStepLike", "checked_outcome"]


class PlainStepLike(Protocol):
    """What the runtime and the worker wrapper ask of an adapter's plain step
    (``eagle_gate.adapters.plain.step.PlainStep``)."""

    #: why this decode batch cannot take the plain step (None: it can).
    blocker: Callable[[Any], str | None]
    #: runs before a SPEC step of a decode batch (lazy draft catch-up), or None.
    before_spec: Callable[[Any, Any], Any] | None

    def run(self, worker: Any, batch: Any, *args: Any, **kwargs: Any) -> Any: ...


class Decision:
    """One decode step's decision: ``mode`` runs at ``step`` for a batch of
    ``batch_size``; ``decided`` is what the policy said (a :class:`Mode`, or
    ``DECIDED_ERROR`` / ``DECIDED_NOT_ASKED``), ``override`` why ``mode``
    differs from it (or ``"shadow"``), else None.

    A runtime fills one object in place for every step (no allocation on the
    hot path): read it before the next decision.
    """

    __slots__ = ("step", "batch_size", "decided", "mode", "override", "depth")

    def __init__(
        self,
        mode: Mode = Mode.SPEC,
        step: int = -1,
        batch_size: int = 0,
        decided: int | None = None,
        override: str | None = None,
        depth: int = 0,
    ) -> None:
        self.mode = mode
        self.step = step
        self.batch_size = batch_size
        self.decided = mode if decided is None else decided
        self.override = override
        #: the SPEC depth to run (draft steps); 0 where the step is PLAIN or
        #: the depth is the server's configured one on a binary server.
        self.depth = depth

    def ran_spec(self, decided: int, override: str | None) -> Decision:
        """This step runs SPEC, at the configured depth, for a reason other
        than the policy's choice."""
        self.decided = decided
        self.mode = Mode.SPEC
        self.override = override
        self.depth = 0
        return self

    def __repr__(self) -> str:
        return (
            f"Decision(mode={self.mode!r}, step={self.step}, batch_size="
            f"{self.batch_size}, decided={self.decided!r}, override={self.override!r}"
            f", depth={self.depth})"
        )


def checked_outcome(
    mode: Any, accept_lens: Any, num_draft_tokens: int, counters: GateCounters
) -> tuple[Mode, Sequence[int], int] | None:
    """A resolved step's outcome as the contract (``StepOutcome``) has it:
    ``(mode, accept_lens, tokens)``, or None when it cannot be.

    ``tokens`` is the sum of ``accept_lens``; a PLAIN step emits one token per
    request, a SPEC step between 1 and ``num_draft_tokens``. What a
    third-party adapter sends outside it is counted in ``invalid_outcomes``
    and corrected (a PLAIN step: one token per request) or, when it cannot be
    (no valid mode, lengths that are not numbers, SPEC tokens out of range),
    refused: None, not accounted and not shown to the policy.
    """
    bad = False
    if mode is not Mode.SPEC and mode is not Mode.PLAIN:
        if mode == 0 or mode == 1:  # an int for the Mode
            mode = Mode.PLAIN if mode else Mode.SPEC
        else:
            bad = True
    try:
        tokens = sum(accept_lens).__index__()  # ints only (numpy's too)
        b = len(accept_lens)
    except Exception:
        bad = True
    if not bad:
        if mode is Mode.PLAIN:
            if tokens != b:  # correct it: a plain step emits one token each
                counters.invalid_outcomes += 1
                accept_lens = (1,) * b
                tokens = b
        else:
            k = num_draft_tokens
            bad = tokens < b or (k > 1 and tokens > b * k)
    if bad:
        counters.invalid_outcomes += 1
        return None
    return mode, accept_lens, tokens
