"""What one scheduler process is, as the gate reports it: its process facts.

The facts are fixed when the gate activates in a scheduler process (the
adapter, SGLang's version, the ranks, the speculative setup SGLang resolved,
how PLAIN decisions run, the launch...) and do not change while it runs, so
they live in one frozen :class:`ProcessFacts`, built once
(``eagle_gate.adapters.activation``) and read by whoever reports them: the
status record (:mod:`eagle_gate.status_record`), the Prometheus exporter,
the decision log's header. The runtime reads the three a policy sees
(``tp_rank``, ``tp_size``, ``num_draft_tokens``) into its step view.

No SGLang, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["ProcessFacts", "plain_graphs_off"]


def plain_graphs_off(setting: str) -> dict[str, Any]:
    """The ``plain_graphs`` status block of a process given none (tests and
    third-party adapters): no plain decode graphs."""
    return {"setting": setting, "state": "off", "reason": None}


@dataclass(frozen=True)
class ProcessFacts:
    """One scheduler process's facts, each a key of the status record.

    A runtime built without activation (tests, third-party adapters) gives
    the first five by keyword; the others then report as unknown (None, or
    no fixes), and ``server_pid`` as the parent process.
    """

    adapter: str = "unknown"
    sglang_version: str = "unknown"
    tp_rank: int = 0
    tp_size: int = 1
    #: tokens one SPEC step verifies per request (1 when not gated).
    num_draft_tokens: int = 1
    #: the plain step's DECODE CUDA graphs (docs/plain-graphs.md): their
    #: status block as the adapter built them at activation.
    plain_graphs: dict[str, Any] = field(
        default_factory=lambda: plain_graphs_off("auto")
    )
    #: what the gate does in this process, in words ("gated", "idle: ...").
    state: str | None = None
    dp_rank: int | None = None
    speculative_algorithm: str | None = None
    #: the speculative setup as SGLang resolved it, with its description.
    speculative: dict[str, Any] | None = None
    #: how PLAIN decisions run here, in words (status key ``plain_step``).
    plain_mode: str | None = None
    draft_sync: str | None = None
    launch_id: str | None = None
    #: the server's (launcher's) pid; None: this process's parent.
    server_pid: int | None = None
    #: the version fixes the adapter applied in this process.
    fixes: tuple[str, ...] = ()
