"""How the gate reads an SGLang decode batch for a decision: one reading,
shared by the worker wrapper (``hooks.py``) and the DP vote's cast
(``dp_vote.py``), so both ask the policy about the same batch the same way.

Both supported versions' ``ScheduleBatch`` / ``ModelWorkerBatch`` carry these
fields; 0.5.23 may leave ``seq_lens_cpu`` and ``seq_lens_sum`` None (the view
then sums or estimates, only if a policy reads them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from eagle_gate.decision import Decision
    from eagle_gate.runtime import GateRuntime


def propose_for_batch(runtime: GateRuntime, batch: Any) -> Decision:
    """``runtime.propose`` for ``batch``: its size, CPU lengths, requests, and
    the batch itself for the plain step's blockers (PLAIN comes back only when
    the plain step can serve it). Not recorded: the caller records it."""
    return runtime.propose(
        batch.seq_lens.shape[0],
        batch.seq_lens_sum,
        batch.seq_lens_cpu,
        getattr(batch, "reqs", None),
        batch,
    )
