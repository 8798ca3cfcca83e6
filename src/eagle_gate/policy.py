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

Draft depths: ``decide`` always returns a :class:`Mode`. A policy that chooses
the depth of a SPEC step (the number of draft steps ``s``, ``s + 1`` tokens
verified per request) writes it into ``view.depth`` before returning
``Mode.SPEC``; the caller resets ``view.depth`` to ``view.configured_depth``
before every ``decide``, so a policy that never touches it (every policy
written before depths) runs the configured depth, and a depth never outlives
its step. ``view.depths`` lists the SPEC depths the server can run
(``(configured_depth,)`` on a server that cannot change depth, where any other
value is ignored). PLAIN is depth 0 in the gate's sense: a true target decode,
never SGLang's 1-token verify, so 0 is never in ``depths``. The outcome says
which depth ran (``StepOutcome.depth``) and how many requests accepted at
least ``j`` drafts per position ``j`` (``StepOutcome.accepted_at_least``).
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
    so a policy must copy what it wants to keep.

    Sequence lengths: what a policy can rely on.

    * ``batch_size``, ``step``, ``num_draft_tokens``, ``tp_rank`` and
      ``tp_size`` are always exact.
    * ``seq_len_sum`` and ``seq_len_max`` are computed on first access only.
      Where SGLang keeps the batch's sequence lengths on the CPU (SGLang 0.5.9
      always; 0.5.23 with attention backends that need them, such as
      FlashInfer) they are exact and ``seq_lens_exact`` is True.
    * SGLang 0.5.23 with overlap scheduling and an attention backend that does
      not need CPU lengths (FA3, the Hopper default for most models,
      trtllm_mha, the Blackwell default, and Triton) keeps them on the device only;
      reading them there would be a device synchronisation every step. The
      adapters then give an estimate from the scheduler's own CPU bookkeeping
      of each request (its committed KV length), which lags the device by the
      steps still in flight (at most two steps' tokens per request) and costs
      one pass over the batch's requests when read; ``seq_lens_exact`` is
      False. Good enough for context-length buckets, not for exact positions.
    * Where neither is available (a third-party adapter, or the simulator run
      with ``cpu_seq_lens=False``) both are None. A policy that reads them must
      handle None.
    """

    __slots__ = (
        "batch_size",
        "step",
        "num_draft_tokens",
        "tp_rank",
        "tp_size",
        "depths",
        "configured_depth",
        "depth",
        "_seq_len_sum",
        "_seq_len_max",
        "_seq_lens",
        "_reqs",
        "_req_len",
        "_exact",
    )

    def __init__(
        self,
        *,
        batch_size: int = 0,
        step: int = 0,
        seq_len_sum: int | None = 0,
        seq_len_max: int | None = None,
        num_draft_tokens: int = 1,
        tp_rank: int = 0,
        tp_size: int = 1,
        req_len: Callable[[Any], int] | None = None,
        depths: Sequence[int] | None = None,
    ) -> None:
        #: requests in this decode batch.
        self.batch_size = batch_size
        #: decode steps decided before this one in this process (same on all ranks).
        self.step = step
        #: tokens one SPEC step verifies per request (draft tokens incl. the bonus).
        self.num_draft_tokens = num_draft_tokens
        #: tensor-parallel rank of this process and the TP size.
        self.tp_rank = tp_rank
        self.tp_size = tp_size
        configured = num_draft_tokens - 1 if num_draft_tokens > 1 else 1
        #: the depth (draft steps) of the server's configured SPEC step.
        self.configured_depth = configured
        #: the SPEC depths this server can run, ascending, each >= 1 (PLAIN,
        #: depth 0, is ``Mode.PLAIN``); ``(configured_depth,)`` where the
        #: depth cannot change.
        self.depths: tuple[int, ...] = (configured,)
        if depths is not None:
            self.set_depths(depths)
        #: the depth of this step if ``decide`` returns ``Mode.SPEC``: reset to
        #: ``configured_depth`` before every ``decide``; a policy choosing a
        #: depth writes one of ``depths`` here (see the module doc).
        self.depth = configured
        self._seq_len_sum = seq_len_sum
        self._seq_len_max = seq_len_max
        self._seq_lens: Any = None
        self._reqs: Any = None
        #: the adapter's estimate of one request's length from CPU bookkeeping.
        self._req_len = req_len
        self._exact = seq_len_sum is not None

    @property
    def seq_len_sum(self) -> int | None:
        """Total tokens in the batch's sequences (prompt + generated so far),
        or None when unknown (see the class doc)."""
        total = self._seq_len_sum
        if total is None:
            lens = self._seq_lens
            if lens is not None:
                total = int(lens.sum()) if hasattr(lens, "sum") else sum(lens)
            elif self._reqs is not None and self._req_len is not None:
                req_len = self._req_len
                total = sum(req_len(r) for r in self._reqs)
            self._seq_len_sum = total
        return total

    @property
    def seq_len_max(self) -> int | None:
        """Longest sequence in the batch, or None when unknown (see the class
        doc). Computed on first access, then cached."""
        longest = self._seq_len_max
        if longest is None:
            lens = self._seq_lens
            if self.batch_size == 0:
                longest = 0
            elif lens is not None:
                if len(lens) == 0:
                    longest = 0
                else:
                    fast_max = getattr(lens, "max", None)
                    longest = int(fast_max() if fast_max else max(lens))
            elif self._reqs is not None and self._req_len is not None:
                req_len = self._req_len
                longest = max((req_len(r) for r in self._reqs), default=0)
            self._seq_len_max = longest
        return longest

    @property
    def seq_lens_exact(self) -> bool:
        """True when ``seq_len_sum`` / ``seq_len_max`` are SGLang's exact CPU
        lengths of this step; False when they are estimates or unknown."""
        return self._exact

    def set_depths(self, depths: Sequence[int]) -> None:
        """Let ``depths`` be this server's SPEC depths (the runtime, once the
        adapter knows them): ascending, unique, each >= 1, holding the
        configured depth; ValueError otherwise."""
        self.depths = _check_depths(depths, self.configured_depth)

    def update(
        self,
        *,
        batch_size: int,
        step: int,
        seq_len_sum: int | None,
        seq_lens: Any = None,
        reqs: Any = None,
        exact: bool | None = None,
    ) -> StepView:
        """Refill this view for the next step (used by the adapters).

        ``seq_len_sum``: SGLang's exact sum, or None when it has none at hand.
        ``seq_lens``: the batch's per-request lengths on the CPU (sized,
        supporting ``max()`` and ``sum()``, or a list), or None when SGLang
        keeps them on the device only. ``reqs``: the batch's requests, for the
        estimate through ``req_len`` when neither is given. ``exact``
        overrides ``seq_lens_exact`` (a replayed estimate stays one).
        ``depth`` goes back to ``configured_depth``.
        """
        self.batch_size = batch_size
        self.step = step
        self.depth = self.configured_depth  # a depth never outlives its step
        self._seq_len_sum = seq_len_sum
        self._seq_len_max = None
        self._seq_lens = seq_lens
        self._reqs = reqs
        if exact is None:
            exact = seq_len_sum is not None or seq_lens is not None
        self._exact = exact
        return self

    def __repr__(self) -> str:
        return (
            f"StepView(batch_size={self.batch_size}, step={self.step}, "
            f"seq_len_sum={self.seq_len_sum}, seq_lens_exact={self.seq_lens_exact}, "
            f"num_draft_tokens={self.num_draft_tokens}"
            f", tp_rank={self.tp_rank}, tp_size={self.tp_size}"
            f", depths={self.depths}, depth={self.depth})"
        )


def _check_depths(depths: Sequence[int], configured: int) -> tuple[int, ...]:
    """``depths`` as the view holds them: ascending, unique, each >= 1, and
    holding the configured depth."""
    out = tuple(sorted({int(d) for d in depths}))
    if not out or out[0] < 1:
        raise ValueError(f"SPEC depths must be >= 1 (PLAIN is Mode.PLAIN): {depths}")
    if configured not in out:
        raise ValueError(f"depths {out} lack the configured depth {configured}")
    return out


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
    #: PLAIN steps with eager draft sync only: how many of the batch's
    #: requests had the draft's top proposal for this position equal to the
    #: token the target emitted. The draft is kept in sync during PLAIN
    #: stretches, so each PLAIN step is a free sample of first-position
    #: acceptance (a SPEC step accepts its first draft token exactly when this
    #: agreement holds). None where it is not measured: SPEC steps, lazy and
    #: none draft sync, adapters and replays without it.
    draft_matches: int | None = None
    #: the depth that ran: 0 for PLAIN, the SPEC step's draft steps otherwise;
    #: None where the adapter does not say (then the configured depth for
    #: SPEC).
    depth: int | None = None
    #: SPEC steps: per position ``j = 1..depth`` (index ``j - 1``), how many
    #: of the batch's requests accepted at least ``j`` draft tokens in the
    #: verify (before a finished request's output was cut to its length), so
    #: ``accepted_at_least[0] >= accepted_at_least[1] >= ...``. Deeper
    #: positions are seen only at deeper depths. None where it is unknown
    #: (PLAIN steps, adapters and replays without it).
    accepted_at_least: tuple[int, ...] | None = None


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

    Optional: ``predicted_plain_rate(view) -> float | None``, the output
    tokens per second the policy expects of one PLAIN step for a batch like
    ``view`` (None: no estimate). Shadow mode calls it on the steps where the
    policy would have run PLAIN, to estimate the throughput it would have
    gained (:mod:`eagle_gate.shadow`). Keep it O(1); it must not raise (if it
    does, the step counts as having no estimate).
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
