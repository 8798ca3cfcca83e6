"""The :class:`~eagle_gate.policy.StepOutcome` a policy is handed for one
resolved decode step, built from what the runtime accounted.

Kept apart from :mod:`eagle_gate.runtime` (which decides *when* an outcome
is delivered: at once, or through the TP hold) because what an outcome
*says* is the policy contract's business (docs/writing-a-policy.md): the
depth that ran and, where the policy chooses depths, per-position acceptance.
Plain Python (no SGLang, no torch).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from typing import Any

from eagle_gate.policy import Mode, StepOutcome

__all__ = ["accepted_at_least", "step_outcome"]


def accepted_at_least(accept_lens: Sequence[int], depth: int) -> tuple[int, ...]:
    """Per draft position j = 1..``depth``, the requests that accepted at
    least j drafts (accept length >= j + 1). Read after SGLang cut finished
    requests' outputs, so a finishing request may count short."""
    lens = sorted(accept_lens)
    b = len(lens)
    return tuple(b - bisect_left(lens, j + 1) for j in range(1, depth + 1))


def step_outcome(
    mode: Mode,
    step: int,
    accept_lens: Sequence[int],
    interval: Any,
    tokens: int | None,
    draft_matches: int | None,
    depth: int | None,
    *,
    per_position: bool,
    configured_depth: int,
) -> StepOutcome:
    """The outcome of one step. ``depth``: the SPEC depth that ran (None: the
    configured one; a PLAIN step is depth 0); ``per_position``: the server
    lets the policy choose depths, so a SPEC step carries
    ``accepted_at_least``; ``tokens``: None to sum ``accept_lens``."""
    at_least = accepted_at_least(accept_lens, depth) if depth and per_position else None
    if depth is None:
        depth = 0 if mode is Mode.PLAIN else configured_depth
    return StepOutcome(
        mode=mode,
        batch_size=len(accept_lens),
        tokens=sum(accept_lens) if tokens is None else tokens,
        accept_lens=accept_lens,
        interval_s=interval,
        step=step,
        draft_matches=draft_matches,
        accepted_at_least=at_least,
        depth=depth,
    )
