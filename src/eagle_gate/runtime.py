"""The gate's decision flow inside one scheduler process.

Before a decode batch the adapters' worker wrapper asks
:meth:`GateRuntime.propose` for a :class:`~eagle_gate.decision.Decision` and
records it (:meth:`GateRuntime.record`; :meth:`GateRuntime.decide` does both),
then runs :meth:`GateRuntime.run_plain` when it says PLAIN; the resolver
wrapper calls :meth:`GateRuntime.observe` when the step's result is resolved.
Under DP attention the ranks vote between the two: the vote casts the
proposed decision and the worker records the agreed one
(``adapters.dp_vote.after_vote``).

The runtime owns the flow only: counts live in
:class:`~eagle_gate.counters.GateCounters`, failures are handled by
:class:`~eagle_gate.guards.Guards` (repeated plain-step failures *degrade* the
gate to SGLang's stock step for the rest of the run), the process's facts in
:class:`~eagle_gate.facts.ProcessFacts`, :mod:`eagle_gate.outcomes` builds
the outcome a policy is handed, :mod:`eagle_gate.reconfigure` switches the
configuration (runtime control) and :mod:`eagle_gate.status_record` builds
the status. Plain Python (no SGLang, no torch).

A PLAIN decision runs PLAIN only when the plain step can serve the batch (its
``blocker(batch)`` is asked inside the decision), so a blocked or unavailable
plain step is recorded as what it is (decided PLAIN, ran SPEC, and why) in
the ring, the counters and the decision log alike. In shadow mode
(:mod:`eagle_gate.shadow`) the policy decides and observes as usual and every
step runs SPEC; :attr:`GateRuntime.shadow_ledger` counts what it would have run.

Hot-path cost: ``decide`` and ``observe`` touch plain ints, one reused
:class:`~eagle_gate.decision.Decision`, a fixed-size ring and (rarely) a
bounded deque of finished dwells. Everything slower happens in the ops thread
(``eagle_gate.ops``), or every ``tick_every`` steps in ``on_tick`` (runtime
control, at the same step on every rank).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from eagle_gate.config import GateConfig
from eagle_gate.counters import (
    DECIDED_ERROR,
    DECIDED_NOT_ASKED,
    DecisionRing,
    GateCounters,
    Overrides,
    PolicyErrors,
)
from eagle_gate.decision import Decision, PlainStepLike, checked_outcome
from eagle_gate.depth_stats import DepthStats
from eagle_gate.facts import ProcessFacts, plain_graphs_off
from eagle_gate.guards import Guards
from eagle_gate.ops import OpsSettings
from eagle_gate.outcomes import step_outcome
from eagle_gate.policy import Mode, Policy, StepView
from eagle_gate.reconfigure import apply_config
from eagle_gate.shadow import ShadowLedger, predicted_plain_rate
from eagle_gate.status_record import policy_estimates, status_record

__all__ = [
    "GateRuntime",
    "Decision",
    "Overrides",
    "PolicyErrors",
    "PlainStepLike",
    "policy_estimates",
]

#: decisions kept for status (a fixed ring, no allocation per step).
RING_SIZE = 32


class GateRuntime:
    """Per-process gate: the policy, the step counter and the decision flow.

    ``facts``: the process's (or their fields by keyword: ``adapter=``,
    ``sglang_version=``, ``tp_rank=``...); ``plain_step``: the adapter's, or
    None (PLAIN decisions run SPEC: ``plain_step_unavailable``); ``req_len``:
    the adapter's estimate of a request's length, for steps without CPU
    sequence lengths; ``agreement``: TP timing agreement
    (:mod:`eagle_gate.agreement`); ``on_tick(runtime, step)``: runtime
    control, before deciding steps that are multiples of
    ``settings.tick_every``; ``settings``: the ops tunables (``tick_every``,
    ``decide_budget_s``, ``plain_failures_to_degrade``).
    """

    def __init__(
        self,
        config: GateConfig,
        policy: Policy,
        *,
        facts: ProcessFacts | None = None,
        plain_step: PlainStepLike | None = None,
        req_len: Callable[[Any], int] | None = None,
        counters: GateCounters | None = None,
        agreement: Any = None,
        decision_log: Any = None,
        on_tick: Callable[[GateRuntime, int], None] | None = None,
        settings: OpsSettings | None = None,
        clock: Callable[[], float] = time.perf_counter,
        timer: Callable[[], float] = time.perf_counter,
        **fact_fields: Any,
    ) -> None:
        settings = settings or OpsSettings()
        tick_every = settings.tick_every
        if tick_every < 1 or tick_every & (tick_every - 1):
            raise ValueError(f"tick_every must be a power of two, got {tick_every}")
        if facts is None:
            setting = getattr(config, "plain_graphs", "auto")
            fact_fields.setdefault("plain_graphs", plain_graphs_off(setting))
            facts = ProcessFacts(**fact_fields)
        elif fact_fields:
            raise TypeError(f"facts given twice: {sorted(fact_fields)}")
        self.config = config
        self.policy = policy
        self.facts = facts
        self.plain_step = plain_step
        #: the adapter's depth control where the policy may choose SPEC depths
        #: (:meth:`enable_depths`); None: every SPEC step runs the configured one.
        self.depth_control: Any = None
        #: per-depth counts and build costs, with ``depth_control`` only.
        self.depth_stats: DepthStats | None = None
        self._clock = clock
        self._timer = timer
        self.view = StepView(
            num_draft_tokens=facts.num_draft_tokens,
            tp_rank=facts.tp_rank,
            tp_size=facts.tp_size,
            req_len=req_len,
        )
        self.step = 0
        self.counters = counters if counters is not None else GateCounters()
        self.guards = Guards(
            self.counters,
            decide_budget_s=settings.decide_budget_s,
            plain_failures_to_degrade=settings.plain_failures_to_degrade,
        )
        self._budget_s = settings.decide_budget_s  # read on the hot path
        self.ring = DecisionRing(RING_SIZE)
        self._decision = Decision()  # refilled for every step
        #: DP attention: the process's vote (adapters/dp_vote.py), or None.
        self.dp_vote: Any = None
        # shadow mode: decide and observe, run stock SPEC, count would-haves
        self.shadow = bool(config.shadow)
        self.shadow_ledger = ShadowLedger()
        self._shadow_seen = self.shadow
        self._predict = predicted_plain_rate(policy)
        self._last_resolve: float | None = None
        self._non_decode_since_resolve = True
        # runtime control (see eagle_gate.control)
        self.config_version = 0
        self.last_control_error: str | None = None
        self.tick_every = tick_every
        self._tick_mask = tick_every - 1
        self.on_tick = on_tick
        self.degraded: str | None = None  # why, once degraded
        self.degraded_at_step: int | None = None
        self.decision_log = decision_log
        #: with tp_size > 1: holds outcomes back and releases them with rank 0's
        #: timings at the same step on every rank.
        self.agreement = agreement

    @property
    def plain_graphs(self) -> dict[str, Any]:
        """The plain graphs' status block (``facts.plain_graphs``)."""
        return self.facts.plain_graphs

    # -- before a decode batch --------------------------------------------
    def decide(
        self,
        batch_size: int,
        seq_len_sum: int | None,
        seq_lens: Any = None,
        reqs: Any = None,
        batch: Any = None,
    ) -> Decision:
        """:meth:`propose`, then :meth:`record`: the decision for the step."""
        decision = self.propose(batch_size, seq_len_sum, seq_lens, reqs, batch)
        self.record(decision)
        return decision

    def propose(
        self,
        batch_size: int,
        seq_len_sum: int | None,
        seq_lens: Any = None,
        reqs: Any = None,
        batch: Any = None,
    ) -> Decision:
        """Ask the policy (the step counts): the mode to RUN, not recorded
        yet: the caller records it (:meth:`record`) at once or, under DP
        attention, once the ranks agreed (``adapters/dp_vote.py``).

        ``seq_len_sum`` / ``seq_lens``: SGLang's CPU lengths, either None when
        SGLang has none at hand; ``reqs``: the batch's requests, for the
        view's estimate then (:class:`~eagle_gate.policy.StepView`);
        ``batch``: what the plain step's blocker judges when the policy says
        PLAIN.
        """
        step = self.step
        if not step & self._tick_mask and self.on_tick is not None:
            # before the step count moves on: a change applied here takes
            # effect at this step, and its decision-log record says so
            self._tick(step)
        self.step = step + 1
        agreement = self.agreement
        if agreement is not None and agreement.due(step):
            for mode_, step_, lens_, interval_, matches_, d_ in agreement.release():
                self._deliver(mode_, step_, lens_, interval_, None, matches_, d_)
        view = self.view.update(
            batch_size=batch_size,
            step=step,
            seq_len_sum=seq_len_sum,
            seq_lens=seq_lens,
            reqs=reqs,
        )
        d = self._decision
        d.step = step
        d.batch_size = batch_size
        if self.degraded is not None:
            self.counters.count_override(Overrides.DEGRADED)
            return d.ran_spec(DECIDED_NOT_ASKED, None)
        timer = self._timer
        t0 = timer()
        try:
            mode = self.policy.decide(view)
        except Exception as exc:
            self._policy_error(PolicyErrors.DECIDE_RAISED, f"decide raised {exc!r}")
            return d.ran_spec(DECIDED_ERROR, None)
        elapsed = timer() - t0
        if elapsed > self._budget_s:
            self.guards.slow_decision(self.config.policy, elapsed)
        if mode is not Mode.SPEC and mode is not Mode.PLAIN:
            # IntEnum members compare by identity; anything else is garbage.
            self._policy_error(
                PolicyErrors.DECIDE_INVALID,
                f"decide returned {mode!r}, not an eagle_gate.Mode",
            )
            return d.ran_spec(DECIDED_ERROR, None)
        self.counters.decisions_by_mode[mode] += 1
        if self.shadow:
            if mode is Mode.PLAIN:
                self.shadow_ledger.decided(step, True, self._predict, view)
            else:
                self.shadow_ledger.decided(step, False)
            return d.ran_spec(mode, "shadow")
        if mode is Mode.PLAIN:
            plain = self.plain_step
            reason = (
                Overrides.PLAIN_STEP_UNAVAILABLE
                if plain is None
                else plain.blocker(batch)
            )
            if reason is not None:
                self.counters.count_override(reason)
                return d.ran_spec(mode, reason)
        d.decided = d.mode = mode
        d.override = None
        d.depth = 0
        if self.depth_control is not None and mode is Mode.SPEC:
            depth = view.depth
            if depth not in view.depths:
                self._policy_error(
                    PolicyErrors.DECIDE_INVALID,
                    f"decide chose depth {depth!r}, not one of {view.depths}",
                )
                return d.ran_spec(DECIDED_ERROR, None)
            d.depth = depth
        return d

    def enable_depths(
        self,
        depths: Sequence[int],
        control: Any,
        builds: Mapping[int, Mapping[str, Any]] | None = None,
        measure_errors: int = 0,
    ) -> None:
        """Let the policy choose SPEC ``depths`` (each >= 1, the configured one
        among them); ``control`` is the adapter's object whose ``depth`` the
        worker wrapper sets before a SPEC step runs (``adapters/hooks.py``).
        ``builds``: what building each depth's runtime state cost, as the
        adapter measured it (status ``depths.per_depth``); the per-depth
        counts are allocated here, once, so counting them allocates nothing."""
        self.view.set_depths(depths)
        self.depth_stats = DepthStats(
            depths, self.view.configured_depth, builds, measure_errors
        )
        self.depth_control = control

    def record(self, decision: Decision) -> None:
        """Write ``decision`` to the ring of last decisions and the decision log."""
        self.ring.write(
            decision.step, decision.batch_size, decision.decided, decision.mode
        )
        log = self.decision_log
        if log is not None:
            log.decision(
                decision.step,
                self.view,
                decision.decided,
                decision.mode,
                decision.override,
            )

    def note_non_decode_batch(self) -> None:
        """A prefill/extend batch ran: the next interval is not a decode step's."""
        self._non_decode_since_resolve = True

    # -- running the plain step -------------------------------------------------
    def run_plain(
        self, worker: Any, stock_step: Callable[..., Any], args: tuple, kwargs: dict
    ) -> tuple[Any, Mode]:
        """Run the plain step on ``worker`` with every argument SGLang gave the
        stock step (keywords included: 0.5.23 hands ``on_publish=`` by keyword)
        and return ``(result, Mode.PLAIN)``. If it raises, count it, run
        ``stock_step(*args, **kwargs)`` (SGLang's own step) and return its
        result with ``Mode.SPEC``; repeated failures degrade the gate.

        Caveat under tensor parallelism: a failure that happens on some ranks
        only, after a collective, cannot be repaired here (the ranks' steps
        already diverged); deterministic failures (the common case: a shape or
        a missing attribute) happen on every rank at the same step, so every
        rank falls back and degrades at the same step.
        """
        try:
            result = self.plain_step.run(worker, *args, **kwargs)  # type: ignore[union-attr]
        except Exception as exc:
            self._plain_step_failed(exc)
            return stock_step(*args, **kwargs), Mode.SPEC
        self.counters.consecutive_plain_failures = 0
        return result, Mode.PLAIN

    def _plain_step_failed(self, exc: BaseException) -> None:
        self.ring.set_last_ran(Mode.SPEC)
        log = self.decision_log
        if log is not None:
            log.plain_failure(self.step - 1, repr(exc))
        reason = self.guards.plain_step_failed(exc)
        if reason is not None:
            self.degrade(reason)

    def degrade(self, reason: str) -> None:
        """Stop gating for the rest of the run (every step: stock SPEC)."""
        if self.degraded is None:
            self.degraded = reason
            self.degraded_at_step = self.step

    # -- after the result was resolved ---------------------------------------
    def observe(
        self,
        mode: Mode,
        step: int,
        accept_lens: Sequence[int],
        draft_matches: int | None = None,
        depth: int | None = None,
    ) -> None:
        """Account a resolved decode step and tell the policy. ``depth``: the
        SPEC depth that ran (0 PLAIN; None: the configured depth).

        In named steps: the interval since the last resolved step;
        validation (:func:`~eagle_gate.decision.checked_outcome`, the outcome
        contract); the shadow ledger; the counters and the dwell
        (``GateCounters.count_outcome`` and ``count_dwell``); the decision
        log; the policy: not once degraded, and under tensor parallelism
        through the TP hold (``agreement.hold``: every rank hands it on at the
        same step, with rank 0's timings). O(1) beyond the sum of
        ``accept_lens``.
        """
        now = self._clock()
        last = self._last_resolve
        interval = (
            None if last is None or self._non_decode_since_resolve else now - last
        )
        self._last_resolve = now
        self._non_decode_since_resolve = False
        checked = checked_outcome(
            mode,
            accept_lens,
            depth + 1 if depth else self.view.num_draft_tokens,
            self.counters,
        )
        if checked is None:  # refused: the next interval is unknown too
            self._non_decode_since_resolve = True
            return
        mode, accept_lens, tokens = checked
        if self._shadow_seen:
            self.shadow_ledger.resolved(step, tokens, interval)
        draft_matches = self.counters.count_outcome(
            mode, accept_lens, tokens, draft_matches
        )
        stats = self.depth_stats
        if stats is not None:
            stats.count(mode, depth, len(accept_lens), tokens)
        log = self.decision_log
        if log is not None:
            log.outcome(step, mode, accept_lens, tokens, interval, draft_matches, depth)
        if self.degraded is not None:
            return
        agreement = self.agreement
        if agreement is not None:  # the TP hold, released in propose()
            agreement.hold(mode, step, accept_lens, interval, draft_matches, depth)
            return
        self._deliver(mode, step, accept_lens, interval, tokens, draft_matches, depth)

    def _deliver(
        self,
        mode: Mode,
        step: int,
        accept_lens: Sequence[int],
        interval: Any,
        tokens: int | None = None,
        draft_matches: int | None = None,
        depth: int | None = None,
    ) -> None:
        """Hand the policy one outcome (with agreed timings under TP)."""
        if self.degraded is not None:
            return
        outcome = step_outcome(
            mode,
            step,
            accept_lens,
            interval,
            tokens,
            draft_matches,
            depth,
            per_position=self.depth_control is not None,
            configured_depth=self.view.configured_depth,
        )
        try:
            self.policy.observe(outcome)
        except Exception as exc:
            self._policy_error(PolicyErrors.OBSERVE_RAISED, f"observe raised {exc!r}")

    def _policy_error(self, reason: str, what: str) -> None:
        self.guards.policy_error(self.config.policy, reason, what)

    # -- runtime control -----------------------------------------------------
    def _tick(self, step: int) -> None:
        try:
            self.on_tick(self, step)  # type: ignore[misc]
        except Exception:
            self.guards.tick_failed(step)

    def apply_config(self, config: GateConfig, version: int) -> bool:
        """Switch to ``config`` as configuration ``version``; False (the
        current policy stays) when its policy cannot be created
        (:func:`eagle_gate.reconfigure.apply_config`)."""
        return apply_config(self, config, version)

    # -- reporting -----------------------------------------------------------
    def last_decisions(self) -> list[dict[str, Any]]:
        """The ring of the last decisions, oldest first."""
        return self.ring.entries()

    def status(self) -> dict[str, Any]:
        """A JSON-able snapshot (:func:`eagle_gate.status_record.status_record`;
        safe to call from another thread: best effort)."""
        return status_record(self)
