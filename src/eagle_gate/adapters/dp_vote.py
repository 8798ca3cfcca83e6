"""DP attention: every rank runs the same mode in the same step.

Under data-parallel attention each rank's MLP all-gathers are sized by every
rank's request count times the rank's *own* per-request token width (draft:
topk, verify: draft tokens, draft extend: its stride; PLAIN: 1). A rank in
PLAIN and another in SPEC would disagree on those sizes (a hang or mixed
activations) and run different sequences of collectives. So the ranks vote,
and all of them run what the vote says.

The vote rides on the MLP-sync gather SGLang already runs before every batch
(``prepare_mlp_sync_batch``: one int64 row per rank over the TP group, on
the CPU group under overlap scheduling): one column more, 8 bytes per rank,
no collective of its own. Each rank puts its vote in its row:

* ``IDLE`` (0): no decode batch here (none, idle, prebuilt);
* ``WANTS_PLAIN`` (1): a decode batch whose policy chose PLAIN, and the
  plain step can serve it (no blocker);
* ``WANTS_SPEC`` (2): anything else that runs a batch: SPEC chosen, a
  blocker, an extend batch, a rank whose gate is off or degraded.

Every rank reads the same gathered column and computes the same mode with
:func:`agreed_mode`: PLAIN only when every rank has a decode batch and voted
PLAIN. An idle rank (no requests) therefore never sees a PLAIN step: it runs
SGLang's own idle speculative step, whose collectives match the busy ranks'
SPEC step. (Letting idle ranks follow a PLAIN step needs an idle plain step,
an IDLE target forward and an idle draft extend; at the loads where one DP
rank drains, SPEC is usually the better mode anyway. A follow-up.) Each DP
rank's policy stays its own (its own batches, its own timings); the TP
agreement keeps the attention-TP ranks of one DP rank together as before.

This module is the protocol only (no SGLang, no torch): each version's
adapter puts the column into its gather and reads it back.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from eagle_gate.adapters.batch import propose_for_batch
from eagle_gate.counters import GateCounters, Overrides
from eagle_gate.decision import Decision
from eagle_gate.policy import Mode

__all__ = [
    "IDLE",
    "WANTS_PLAIN",
    "WANTS_SPEC",
    "agreed_mode",
    "after_vote",
    "DPVote",
    "row",
]

IDLE = 0
WANTS_PLAIN = 1
WANTS_SPEC = 2


def agreed_mode(votes: Iterable[int]) -> Mode | None:
    """The mode every rank runs, from every rank's vote: None when no rank
    has a batch (nothing to decide), PLAIN when every rank voted PLAIN (none
    idle), else SPEC. A value outside the protocol counts as SPEC (SGLang's
    stock step, which every rank can run)."""
    ranks = plain = idle = 0
    for vote in votes:
        ranks += 1
        idle += vote == IDLE
        plain += vote == WANTS_PLAIN
    if idle == ranks:
        return None
    return Mode.PLAIN if plain == ranks else Mode.SPEC


def after_vote(decision: Decision, agreed: Mode, counters: GateCounters) -> Decision:
    """This rank's ``decision`` (from ``GateRuntime.propose``) as the ranks
    agreed on ``agreed``, ready to record (``GateRuntime.record``): its PLAIN
    overruled by another rank runs SPEC, counted as a ``dp_ranks`` override."""
    if decision.mode is Mode.PLAIN and agreed is not Mode.PLAIN:
        decision.mode = Mode.SPEC
        decision.override = Overrides.DP_RANKS
        counters.count_override(Overrides.DP_RANKS)
    return decision


class DPVote:
    """One scheduler process's vote, from the gather to the step it governs.

    ``cast`` before the gather (the local vote goes into the row), ``settle``
    after it (every rank's votes in, the agreed mode out), ``take`` in the
    worker, for the batch the scheduler runs right after its gather. The
    scheduler thread runs these in that order for every batch, so one slot
    is enough; ``take`` empties it, and a batch that finds it empty (no
    gather ran: a path without MLP sync) runs SGLang's stock step.

    The slot carries this rank's decision (``GateRuntime.propose``'s, not
    recorded yet) from the gather to the worker, which records it as the
    vote left it (:func:`after_vote`, then ``GateRuntime.record``).
    """

    __slots__ = ("local", "mode", "decision", "disagreements")

    def __init__(self) -> None:
        #: this rank's vote for the coming gather.
        self.local = IDLE
        #: the agreed mode for the coming batch (None: not settled / none).
        self.mode: Mode | None = None
        #: what this rank's gate decided for it, or None.
        self.decision: Decision | None = None
        #: steps where this rank wanted PLAIN and another rank did not.
        self.disagreements = 0

    def cast(self, decision: Decision | None, busy: bool = True) -> int:
        """Keep this rank's decision for its coming batch and return its
        vote: ``decision`` None with ``busy`` means a batch the gate does not
        decide (extend, gate off): SPEC; not ``busy``: idle."""
        self.decision = decision
        self.mode = None
        if not busy:
            vote = IDLE
        elif decision is not None and decision.mode is Mode.PLAIN:
            vote = WANTS_PLAIN
        else:
            vote = WANTS_SPEC
        self.local = vote
        return vote

    def settle(self, votes: Iterable[int]) -> Mode | None:
        """Every rank's votes (the gathered column, in rank order): the mode
        all of them run."""
        mode = agreed_mode(votes)
        if self.local == WANTS_PLAIN and mode is not Mode.PLAIN:
            self.disagreements += 1
        self.mode = mode
        return mode

    def take(self) -> tuple[Mode | None, Decision | None]:
        """``(agreed mode, this rank's own decision)`` for the batch about to
        run, once; the slot is empty afterwards."""
        out = (self.mode, self.decision)
        self.mode = self.decision = None
        self.local = IDLE
        return out


def row(values: Sequence, device: Any, dtype: Any = None) -> Any:
    """A gather row as the versions build theirs: one int64 ``torch.tensor``
    call (the vote costs no allocation beyond stock's; booleans become 0/1)."""
    import torch

    return torch.tensor(values, device=device, dtype=dtype or torch.int64)


def cast_for(vote: DPVote, runtime: Any, batch: Any) -> int:
    """Before the gather: this rank's decision for the batch it is about to
    run, cast as its vote. A decode batch asks the gate (the policy, then the
    plain step's blockers: PLAIN comes back only when the plain step can
    serve the batch, and this is final, as every rank acts on the vote; the
    decision is recorded in the worker, once the vote is settled); no
    batch, an idle or a prebuilt one votes idle; anything else (an extend, a
    gate that is off) votes SPEC. Never raises: a failure counts as an
    internal error and votes SPEC."""
    if batch is None:
        return vote.cast(None, busy=False)
    try:
        fm = batch.forward_mode
        if fm.is_idle() or fm.is_prebuilt():
            return vote.cast(None, busy=False)
        if runtime is None or runtime.dp_vote is not vote or not fm.is_decode():
            return vote.cast(None, busy=True)
        # as the worker wrapper decides (adapters/hooks.py), not recorded yet
        decision = propose_for_batch(runtime, batch)
    except Exception as exc:
        if runtime is not None:
            runtime.guards.internal_error("casting the DP vote", exc)
        return vote.cast(None, busy=True)
    return vote.cast(decision)
