"""The policy contract: what a policy sees, what it decides, what it learns.

This module is the public plugin contract. It imports neither SGLang nor torch,
so policies can be written, read, tested and simulated without either.

Per decode batch the gate builds a :class:`StepView`, asks ``policy.decide(view)``
for a :class:`Mode`, runs the step, and later hands the policy a
:class:`StepOutcome` through ``policy.observe(outcome)``.

Timing: ``StepOutcome.interval_s`` is measured on the CPU, without a device
synchronisation, as the wall time between two consecutive decode results being
resolved by the scheduler in this process. With overlap scheduling the result of
step N is resolved while step N+1 already runs, so outcomes arrive one step
after the decision that produced them (two with a full pipeline); a policy must
not assume that ``observe`` for step N comes before ``decide`` for step N+1
(under tensor parallelism outcomes arrive in batches, see :class:`Policy`).
While the GPU is the bottleneck the interval equals the device step time.
It is ``None`` when the previous resolution was not a decode step (a prefill
batch ran in between, or the server was idle), because then it measures
something else.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "Mode",
    "StepView",
    "StepOutcome",
    "Policy",
    "PolicyFactory",
]


class Mode(enum.IntEnum):
    """What the next decode step runs."""

    #: draft + verify: SGLang's stock speculative step.
    SPEC = 0
    #: one plain target decode step, reported in the speculative result format.
    PLAIN = 1


class StepView:
    """What a policy sees before a decode batch.

    One instance per process is reused for every step (no per-step allocation),
    so a policy must copy what it wants to keep. ``seq_len_max`` is computed on
    first access only, because most policies never read it.
    """

    __slots__ = (
        "batch_size",
        "step",
        "seq_len_sum",
        "num_draft_tokens",
        "tp_rank",
        "tp_size",
        "_seq_len_max",
        "_seq_lens",
    )

    def __init__(
        self,
        *,
        batch_size: int = 0,
        step: int = 0,
        seq_len_sum: int = 0,
        seq_len_max: int | None = None,
        num_draft_tokens: int = 1,
        tp_rank: int = 0,
        tp_size: int = 1,
    ) -> None:
        #: requests in this decode batch.
        self.batch_size = batch_size
        #: decode steps decided before this one in this process (same on all ranks).
        self.step = step
        #: total tokens in the batch's sequences (prompt + generated so far).
        self.seq_len_sum = seq_len_sum
        #: tokens one SPEC step verifies per request (draft tokens incl. the bonus).
        self.num_draft_tokens = num_draft_tokens
        #: tensor-parallel rank of this process and the TP size.
        self.tp_rank = tp_rank
        self.tp_size = tp_size
        self._seq_len_max = seq_len_max
        self._seq_lens: Any = None

    @property
    def seq_len_max(self) -> int:
        """Longest sequence in the batch (computed on first access, then cached).

        The adapters hand over the batch's CPU sequence lengths (a CPU tensor or
        a list) without copying; the maximum is only computed if a policy asks.
        """
        if self._seq_len_max is None:
            lens = self._seq_lens
            if lens is None or len(lens) == 0:
                self._seq_len_max = 0
            else:
                fast_max = getattr(lens, "max", None)
                self._seq_len_max = int(fast_max() if fast_max else max(lens))
        return self._seq_len_max

    def update(
        self,
        *,
        batch_size: int,
        step: int,
        seq_len_sum: int,
        seq_lens: Any = None,
    ) -> StepView:
        """Refill this view for the next step (used by the adapters).

        ``seq_lens``: the batch's per-request lengths on the CPU (sized and
        supporting ``max()``), or None when not known.
        """
        self.batch_size = batch_size
        self.step = step
        self.seq_len_sum = seq_len_sum
        self._seq_len_max = None
        self._seq_lens = seq_lens
        return self

    def __repr__(self) -> str:
        return (
            f"StepView(batch_size={self.batch_size}, step={self.step}, "
            f"seq_len_sum={self.seq_len_sum}, num_draft_tokens={self.num_draft_tokens}"
            f", tp_rank={self.tp_rank}, tp_size={self.tp_size})"
        )


@dataclass(frozen=True)
class StepOutcome:
    """What a policy learns after a decode step's result was resolved."""

    #: the mode that actually ran (may differ from the decision: see overrides).
    mode: Mode
    #: requests in the batch.
    batch_size: int
    #: tokens emitted by the step: the sum of ``accept_lens``.
    tokens: int
    #: tokens emitted per request, bonus token included (a PLAIN step: all 1).
    accept_lens: Sequence[int]
    #: CPU wall time since the previous decode resolution, or None (see module doc).
    interval_s: float | None
    #: the step counter of the decision that produced this outcome.
    step: int


@runtime_checkable
class Policy(Protocol):
    """A gate policy. ``decide`` runs before every decode batch, on every TP rank.

    Rules a policy must follow:

    * Be deterministic in what it is given: every TP rank calls ``decide`` with
      the same views and ``observe`` with the same outcomes. Wall clocks differ
      between ranks, so with ``tp_size > 1`` the gate holds outcomes back and
      delivers them every few steps with rank 0's ``interval_s``
      (:mod:`eagle_gate.agreement`); a policy must not read clocks itself.
    * Be fast: ``decide`` is on the scheduler's critical path.
    * Raising, or returning something that is not a :class:`Mode`, never
      breaks the server: the gate runs SGLang's stock speculative step and
      counts a policy error.

    Optional: ``estimates() -> dict[str, float]`` exposes what the policy
    believes (for example tokens/s per mode); the gate exports it as the
    ``eagle_gate_policy_estimate`` metric and in its status.
    """

    name: str

    def decide(self, view: StepView) -> Mode: ...

    def observe(self, outcome: StepOutcome) -> None: ...


@dataclass(frozen=True)
class PolicyFactory:
    """How a plugin offers a policy: a name, its settings and a constructor.

    ``create`` receives the validated settings (defaults filled in) as keyword
    arguments. ``settings`` maps each setting name to its :class:`Setting`.
    """

    name: str
    create: Callable[..., Policy]
    description: str = ""
    settings: Mapping[str, Any] = ()  # Mapping[str, eagle_gate.settings.Setting]

    def __post_init__(self) -> None:
        if not isinstance(self.settings, Mapping):
            object.__setattr__(self, "settings", dict(self.settings))
