"""The gate's decision flow inside one scheduler process.

The adapters' worker wrapper calls :meth:`GateRuntime.decide` before a decode
batch (and :meth:`GateRuntime.run_plain_step` when it says PLAIN); the
resolver wrapper calls :meth:`GateRuntime.observe` when the step's result is
resolved. What is counted lives in :class:`eagle_gate.counters.GateCounters`,
the last decisions in a :class:`eagle_gate.counters.DecisionRing`. Everything
here is plain Python (no SGLang, no torch) so it is tested directly.

A PLAIN decision runs PLAIN only when the plain step can serve the batch:
the adapter's plain step (``plain_step``, with its ``blocker(batch)``) is
asked inside :meth:`GateRuntime.decide`, so a blocked or unavailable plain
step is recorded as what it is (decided PLAIN, ran SPEC, and why) in the
ring, the counters and the decision log alike.

Never breaking the server:

* a policy that raises or returns something other than a :class:`Mode` makes
  that step run SGLang's stock speculative path; a counter rises and at most
  one log line per minute says why;
* a ``decide`` slower than ``decide_budget_s`` (two ``perf_counter`` reads per
  step) is counted (``slow_decisions``) and logged at most once a minute;
* a plain step that raises runs the stock step instead
  (:meth:`GateRuntime.run_plain_step`); after ``plain_failures_to_degrade``
  consecutive failures the gate *degrades*: for the rest of the run every step
  is SGLang's stock speculative step, the policy is no longer asked, and status
  and metrics say so.

Shadow mode (``config.shadow``, see :mod:`eagle_gate.shadow`): the policy is
asked and observes as usual, every step runs SPEC (SGLang's stock step, not
counted as an override), and :attr:`GateRuntime.shadow_ledger` counts what it
would have run.

Hot-path cost: ``decide`` and ``observe`` only touch plain ints, a fixed-size
ring of the last decisions and (rarely) a bounded deque of finished dwells.
Everything slower (status files, Prometheus, the decision log, runtime
control) happens elsewhere: in the ops thread (``eagle_gate.ops``), or every
``tick_every`` steps in :attr:`GateRuntime.on_tick` (runtime control, which
must happen at the same step on every rank).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from eagle_gate.config import GateConfig
from eagle_gate.counters import (
    DECIDED_ERROR,
    DECIDED_NOT_ASKED,
    DecisionRing,
    GateCounters,
    Overrides,
    PolicyErrors,
)
from eagle_gate.logutil import OncePer, first_then_every
from eagle_gate.policy import Mode, Policy, StepOutcome, StepView
from eagle_gate.shadow import ShadowLedger, predicted_plain_rate

logger = logging.getLogger("eagle_gate")

__all__ = ["GateRuntime", "Overrides", "PolicyErrors", "PlainStepLike"]

#: decisions kept for status (a fixed ring, no allocation per step).
RING_SIZE = 32


class PlainStepLike(Protocol):
    """What the runtime and the worker wrapper ask of an adapter's plain step
    (``eagle_gate.adapters.plain.step.PlainStep``)."""

    #: why this decode batch cannot take the plain step (None: it can).
    blocker: Callable[[Any], str | None]
    #: runs before a SPEC step of a decode batch (lazy draft catch-up), or None.
    before_spec: Callable[[Any, Any], Any] | None

    def run(self, worker: Any, batch: Any, *args: Any, **kwargs: Any) -> Any: ...


def policy_estimates(policy: Any) -> dict[str, float]:
    """The policy's optional ``estimates()`` (see ``eagle_gate.policy``), or {}.

    Never raises: a missing method, an exception or values that are not
    numbers give an empty dict or drop those entries.
    """
    fn = getattr(policy, "estimates", None)
    if fn is None or not callable(fn):
        return {}
    try:
        raw = fn()
        if not isinstance(raw, Mapping):
            return {}
        out = {}
        for key, value in raw.items():
            if isinstance(value, bool) or not isinstance(value, int | float):
                continue
            value = float(value)
            if value != value or value in (float("inf"), float("-inf")):
                continue  # NaN / infinity: not JSON, not a useful estimate
            out[str(key)] = value
        return out
    except Exception:
        return {}


def plain_graphs_off(setting: str) -> dict[str, Any]:
    """The ``plain_graphs`` status block of a runtime given none (tests and
    third-party adapters): no plain decode graphs."""
    return {"setting": setting, "state": "off", "reason": None}


class GateRuntime:
    """Per-process gate: the policy, the step counter and the decision flow.

    Everything the runtime works with is given at construction:
    ``plain_step`` (the adapter's, or None: PLAIN decisions run SPEC, counted
    as ``plain_step_unavailable``), ``counters``, ``on_tick`` (runtime
    control, called as ``on_tick(runtime, step)`` every ``tick_every`` steps),
    ``agreement`` (TP timing agreement, :mod:`eagle_gate.agreement`),
    ``decision_log`` (:mod:`eagle_gate.decision_log`) and ``plain_graphs``
    (the status block of the plain step's DECODE CUDA graphs).
    """

    def __init__(
        self,
        config: GateConfig,
        policy: Policy,
        *,
        sglang_version: str,
        adapter: str,
        tp_rank: int = 0,
        tp_size: int = 1,
        num_draft_tokens: int = 1,
        plain_step: PlainStepLike | None = None,
        clock: Callable[[], float] = time.perf_counter,
        timer: Callable[[], float] = time.perf_counter,
        tick_every: int = 64,
        decide_budget_s: float = 1e-3,
        plain_failures_to_degrade: int = 3,
        req_len: Callable[[Any], int] | None = None,
        counters: GateCounters | None = None,
        on_tick: Callable[[GateRuntime, int], None] | None = None,
        agreement: Any = None,
        decision_log: Any = None,
        plain_graphs: Mapping[str, Any] | None = None,
    ) -> None:
        if tick_every < 1 or tick_every & (tick_every - 1):
            raise ValueError(f"tick_every must be a power of two, got {tick_every}")
        self.config = config
        self.policy = policy
        self.sglang_version = sglang_version
        self.adapter = adapter
        #: the adapter's plain step, or None (PLAIN decisions then run SPEC).
        self.plain_step = plain_step
        self._clock = clock
        self._timer = timer
        #: ``req_len``: the adapter's estimate of a request's length from the
        #: scheduler's CPU bookkeeping, for steps without CPU sequence lengths.
        self.view = StepView(
            num_draft_tokens=num_draft_tokens,
            tp_rank=tp_rank,
            tp_size=tp_size,
            req_len=req_len,
        )
        self.step = 0
        self.counters = counters if counters is not None else GateCounters()
        self.ring = DecisionRing(RING_SIZE)
        #: DP attention: the process's vote (adapters/dp_vote.py), or None.
        self.dp_vote: Any = None
        self._defer = False  # decide() defers its record (DP attention)
        self._deferred: tuple = (DECIDED_NOT_ASKED, Mode.SPEC, None)
        # shadow mode: decide and observe, run stock SPEC, count would-haves
        self.shadow = bool(config.shadow)
        self.shadow_ledger = ShadowLedger()
        self._shadow_seen = self.shadow
        self._predict = predicted_plain_rate(policy)
        self._policy_error_log = OncePer()
        self._slow_log = OncePer()
        self._last_resolve: float | None = None
        self._non_decode_since_resolve = True
        # runtime control (see eagle_gate.control)
        self.config_version = 0
        self.last_control_error: str | None = None
        self.tick_every = tick_every
        self._tick_mask = tick_every - 1
        #: called as ``on_tick(runtime, step)`` before deciding steps that are
        #: multiples of ``tick_every`` (same steps on every rank).
        self.on_tick = on_tick
        # guards
        self.decide_budget_s = decide_budget_s
        self.plain_failures_to_degrade = plain_failures_to_degrade
        self.degraded: str | None = None
        self.degraded_at_step: int | None = None
        #: optional DecisionLog (eagle_gate.decision_log); None when off.
        self.decision_log = decision_log
        #: with tp_size > 1: holds outcomes back and releases them with rank 0's
        #: timings at the same step on every rank (eagle_gate.agreement).
        self.agreement = agreement
        #: the plain step's DECODE CUDA graphs (docs/plain-graphs.md): their
        #: status block, as the adapter built them at activation.
        self.plain_graphs: dict[str, Any] = (
            dict(plain_graphs)
            if plain_graphs is not None
            else plain_graphs_off(getattr(config, "plain_graphs", "auto"))
        )

    @property
    def plain_step_available(self) -> bool:
        return self.plain_step is not None

    # -- before a decode batch --------------------------------------------
    def decide(
        self,
        batch_size: int,
        seq_len_sum: int | None,
        seq_lens: Any = None,
        reqs: Any = None,
        batch: Any = None,
        defer_record: bool = False,
    ) -> tuple[Mode, int]:
        """Ask the policy; return the mode to RUN and this step's number.

        ``seq_len_sum`` / ``seq_lens``: SGLang's CPU lengths, either of them
        None when SGLang has none at hand; ``reqs``: the batch's requests, for
        the view's estimate then (see :class:`~eagle_gate.policy.StepView`);
        ``batch``: what the plain step's blocker judges when the policy says
        PLAIN. ``defer_record``: under DP attention the ranks vote on the mode
        first; the step's record (ring, decision log) is then written by
        :meth:`record_agreed` once the agreed mode is known.
        """
        self._defer = defer_record
        step = self.step
        if not step & self._tick_mask and self.on_tick is not None:
            # before the step count moves on: a change applied here takes
            # effect at this step, and its decision-log record says so
            self._tick(step)
        self.step = step + 1
        agreement = self.agreement
        if agreement is not None and agreement.due(step):
            for mode_, step_, lens_, interval_, matches_ in agreement.release():
                self._deliver(mode_, step_, lens_, interval_, None, matches_)
        view = self.view.update(
            batch_size=batch_size,
            step=step,
            seq_len_sum=seq_len_sum,
            seq_lens=seq_lens,
            reqs=reqs,
        )
        if self.degraded is not None:
            self.counters.count_override(Overrides.DEGRADED)
            return self._ran_spec(step, batch_size, DECIDED_NOT_ASKED, None)
        timer = self._timer
        t0 = timer()
        try:
            mode = self.policy.decide(view)
        except Exception as exc:
            self._policy_error(PolicyErrors.DECIDE_RAISED, f"decide raised {exc!r}")
            return self._ran_spec(step, batch_size, DECIDED_ERROR, None)
        elapsed = timer() - t0
        if elapsed > self.decide_budget_s:
            self._slow(elapsed)
        if mode is not Mode.SPEC and mode is not Mode.PLAIN:
            # IntEnum members compare by identity; anything else is garbage.
            self._policy_error(
                PolicyErrors.DECIDE_INVALID,
                f"decide returned {mode!r}, not an eagle_gate.Mode",
            )
            return self._ran_spec(step, batch_size, DECIDED_ERROR, None)
        self.counters.decisions_by_mode[mode] += 1
        if self.shadow:
            if mode is Mode.PLAIN:
                self.shadow_ledger.decided(step, True, self._predict, view)
            else:
                self.shadow_ledger.decided(step, False)
            return self._ran_spec(step, batch_size, mode, "shadow")
        if mode is Mode.PLAIN:
            plain = self.plain_step
            reason = (
                Overrides.PLAIN_STEP_UNAVAILABLE
                if plain is None
                else plain.blocker(batch)
            )
            if reason is not None:
                self.counters.count_override(reason)
                return self._ran_spec(step, batch_size, mode, reason)
        self._record(step, batch_size, mode, mode, None)
        return mode, step

    def _record(
        self, step: int, batch_size: int, decided: int, ran: Mode, override: str | None
    ) -> None:
        if self._defer:
            self._deferred = (decided, ran, override)
            return
        self._write(step, batch_size, decided, ran, override)

    def _write(
        self, step: int, batch_size: int, decided: int, ran: Mode, override: str | None
    ) -> None:
        self.ring.write(step, batch_size, decided, ran)
        log = self.decision_log
        if log is not None:
            log.decision(step, self.view, decided, ran, override)

    def decide_batch(self, batch: Any, defer_record: bool = False) -> tuple[Mode, int]:
        """:meth:`decide` for an SGLang batch: its size, CPU lengths (0.5.23
        may leave ``seq_lens_cpu`` / ``seq_lens_sum`` None: the view then sums
        or estimates, only if a policy reads them), requests and the batch
        itself for the plain step's blockers."""
        return self.decide(
            batch.seq_lens.shape[0],
            batch.seq_lens_sum,
            batch.seq_lens_cpu,
            getattr(batch, "reqs", None),
            batch,
            defer_record,
        )

    def record_agreed(self, step: int, batch_size: int, agreed: Mode) -> Mode:
        """Under DP attention: write the record :meth:`decide` deferred
        (``defer_record``) for ``step``, now that the ranks agreed on
        ``agreed``. This rank's PLAIN overruled by another rank runs SPEC and
        counts as an override (``dp_ranks``). Returns the mode to run."""
        decided, ran, override = self._deferred
        self._deferred = (DECIDED_NOT_ASKED, Mode.SPEC, None)
        if ran is Mode.PLAIN and agreed is not Mode.PLAIN:
            override = Overrides.DP_RANKS
            self.counters.count_override(override)
        ran = Mode.PLAIN if ran is Mode.PLAIN and agreed is Mode.PLAIN else Mode.SPEC
        self._write(step, batch_size, decided, ran, override)
        return ran

    def _ran_spec(
        self,
        step: int,
        batch_size: int,
        decided: int,
        override: str | None,
    ) -> tuple[Mode, int]:
        """Record a step that runs SPEC for a reason other than the policy."""
        self._record(step, batch_size, decided, Mode.SPEC, override)
        return Mode.SPEC, step

    def note_non_decode_batch(self) -> None:
        """A prefill/extend batch ran: the next interval is not a decode step's."""
        self._non_decode_since_resolve = True

    # -- running the plain step -------------------------------------------------
    def run_plain_step(
        self,
        plain_step: Callable[..., Any],
        plain_args: tuple,
        plain_kwargs: dict,
        stock_step: Callable[..., Any],
        args: tuple,
        kwargs: dict,
    ) -> tuple[Any, Mode]:
        """Run ``plain_step(*plain_args, **plain_kwargs)``; if it raises, count it, run
        ``stock_step(*args, **kwargs)`` (SGLang's own step) and return its
        result with ``Mode.SPEC``; else return ``(result, Mode.PLAIN)``. After
        ``plain_failures_to_degrade`` consecutive failures the gate degrades
        for the rest of the run.

        The worker wrapper calls it as
        ``result, mode = runtime.run_plain_step(plain.run, (instance, *args),
        kwargs, wrapped, args, kwargs)``: the plain step gets every argument
        the stock step would have got, keywords included.

        Caveat under tensor parallelism: a failure that happens on some ranks
        only, after a collective, cannot be repaired here (the ranks' steps
        already diverged); deterministic failures (the common case: a shape or
        a missing attribute) happen on every rank at the same step, so every
        rank falls back and degrades at the same step.
        """
        try:
            result = plain_step(*plain_args, **plain_kwargs)
        except Exception as exc:
            self._plain_step_failed(exc)
            return stock_step(*args, **kwargs), Mode.SPEC
        self.counters.consecutive_plain_failures = 0
        return result, Mode.PLAIN

    def _plain_step_failed(self, exc: BaseException) -> None:
        counters = self.counters
        counters.plain_step_failures += 1
        counters.consecutive_plain_failures += 1
        counters.count_override(Overrides.PLAIN_STEP_FAILED)
        self.ring.set_last_ran(Mode.SPEC)
        log = self.decision_log
        if log is not None:
            log.plain_failure(self.step - 1, repr(exc))
        if counters.consecutive_plain_failures >= self.plain_failures_to_degrade:
            self.degrade(
                f"the plain step failed {counters.consecutive_plain_failures} times "
                f"in a row (last: {exc!r})"
            )
            logger.error(
                "eagle_gate: %s; the gate is DEGRADED: every step from now on is "
                "SGLang's stock speculative step",
                self.degraded,
                exc_info=exc,
            )
        elif first_then_every(counters.plain_step_failures):
            logger.warning(
                "eagle_gate: the plain step failed (%d so far: %r); this step ran "
                "SGLang's stock speculative step",
                counters.plain_step_failures,
                exc,
                exc_info=exc,
            )

    def degrade(self, reason: str) -> None:
        """Stop gating for the rest of the run (every step: stock SPEC)."""
        if self.degraded is None:
            self.degraded = reason
            self.degraded_at_step = self.step

    def count_internal_error(self, what: str, exc: BaseException) -> None:
        """The gate's own logic failed while ``what``; the step runs SGLang's
        stock path. Counted, and logged the first time and every 1000th."""
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

    # -- after the result was resolved ---------------------------------------
    def observe(
        self,
        mode: Mode,
        step: int,
        accept_lens: Sequence[int],
        draft_matches: int | None = None,
    ) -> None:
        """Account a resolved decode step and tell the policy.

        The outcome contract (``StepOutcome``): ``tokens`` is the sum of
        ``accept_lens``, a PLAIN step emits one token per request and a SPEC
        step between 1 and ``num_draft_tokens`` per request. What a
        third-party adapter sends outside it is counted in
        ``invalid_outcomes`` and corrected (a PLAIN step: one token per
        request) or, when it cannot be (no valid mode, lengths that are not
        numbers, SPEC tokens out of range), not accounted and not shown to
        the policy; the next interval is then unknown. O(1) beyond the sum.

        ``draft_matches`` (PLAIN steps with eager draft sync, see
        ``StepOutcome.draft_matches``) is passed on and counted beside the
        SPEC steps' own first-position acceptance, so the status shows both
        sides of the same estimate.
        """
        now = self._clock()
        last = self._last_resolve
        interval = (
            None if last is None or self._non_decode_since_resolve else now - last
        )
        self._last_resolve = now
        self._non_decode_since_resolve = False
        counters = self.counters
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
                k = self.view.num_draft_tokens
                bad = tokens < b or (k > 1 and tokens > b * k)
        if bad:
            counters.invalid_outcomes += 1
            self._non_decode_since_resolve = True
            return
        if self._shadow_seen:
            self.shadow_ledger.resolved(step, tokens, interval)
        # counted here, not in a GateCounters method: this is the hot path
        counters.steps_by_mode[mode] += 1
        counters.tokens_by_mode[mode] += tokens
        counters.request_steps_by_mode[mode] += b
        if draft_matches is not None:
            if mode is Mode.PLAIN and 0 <= draft_matches <= b:
                counters.plain_draft_matches += draft_matches
                counters.plain_draft_samples += b
            else:
                counters.invalid_outcomes += 1
                draft_matches = None
        elif mode is Mode.SPEC:
            # requests whose first draft token was accepted, counted in C (a
            # sequence without .count, from a third-party adapter, is skipped)
            try:
                counters.spec_first_accepts += b - accept_lens.count(1)
                counters.spec_first_samples += b
            except AttributeError:
                pass
        if mode is counters.current_mode:
            counters.dwell_len += 1
        else:
            if counters.current_mode is not None:
                counters.finished_dwells.append(
                    (int(counters.current_mode), counters.dwell_len)
                )
            counters.current_mode = mode
            counters.dwell_len = 1
        log = self.decision_log
        if log is not None:
            log.outcome(step, mode, accept_lens, tokens, interval, draft_matches)
        if self.degraded is not None:
            return
        if self.agreement is not None:
            self.agreement.hold(mode, step, accept_lens, interval, draft_matches)
            return
        self._deliver(mode, step, accept_lens, interval, tokens, draft_matches)

    def _deliver(
        self,
        mode: Mode,
        step: int,
        accept_lens: Sequence[int],
        interval: Any,
        tokens: int | None = None,
        draft_matches: int | None = None,
    ) -> None:
        """Hand the policy one outcome (with agreed timings under TP)."""
        if self.degraded is not None:
            return
        outcome = StepOutcome(
            mode=mode,
            batch_size=len(accept_lens),
            tokens=sum(accept_lens) if tokens is None else tokens,
            accept_lens=accept_lens,
            interval_s=interval,
            step=step,
            draft_matches=draft_matches,
        )
        try:
            self.policy.observe(outcome)
        except Exception as exc:
            self._policy_error(PolicyErrors.OBSERVE_RAISED, f"observe raised {exc!r}")

    # -- runtime control -----------------------------------------------------
    def _tick(self, step: int) -> None:
        try:
            self.on_tick(self, step)  # type: ignore[misc]
        except Exception:
            counters = self.counters
            counters.tick_errors += 1
            if first_then_every(counters.tick_errors):
                logger.exception(
                    "eagle_gate: runtime control failed at step %d (%d so far); "
                    "the current policy stays",
                    step,
                    counters.tick_errors,
                )

    def apply_config(self, config: GateConfig, version: int) -> bool:
        """Switch to ``config`` (a new policy object) as configuration ``version``.

        Returns False (and keeps the current policy) if the policy cannot be
        created; ``last_control_error`` says why. Policy creation is
        deterministic, so every rank reaches the same result. A change of
        shadow mode alone keeps the policy object and what it has learned:
        switching a watched policy live is the point of shadow mode.
        """
        current = self.config
        try:
            if (
                config.shadow != current.shadow
                and config.policy == current.policy
                and config.settings == current.settings
            ):
                policy = self.policy
            else:
                policy = config.create_policy()
        except Exception as exc:
            self.last_control_error = (
                f"version {version}: cannot create policy {config.policy!r}: {exc}"
            )
            self.config_version = max(self.config_version, version)
            logger.error("eagle_gate: %s; the current policy stays", exc)
            return False
        old = self.config.policy
        self.policy = policy
        self._predict = predicted_plain_rate(policy)
        self.shadow = bool(config.shadow)
        self._shadow_seen = self._shadow_seen or self.shadow
        self.config = config
        self.config_version = version
        self.last_control_error = None
        log = self.decision_log
        if log is not None:
            log.config(
                self.step, version, config.policy, config.settings, config.shadow
            )
        logger.info(
            "eagle_gate: configuration %d from step %d: policy %r %s (was %r)%s",
            version,
            self.step,
            config.policy,
            config.settings,
            old,
            " in SHADOW mode (every step runs SGLang's stock step)"
            if self.shadow
            else "",
        )
        return True

    # -- guards ----------------------------------------------------------------
    def _policy_error(self, reason: str, what: str) -> None:
        total = self.counters.count_policy_error(reason)
        if self._policy_error_log.ready():
            logger.warning(
                "eagle_gate: policy %r %s; this step runs SGLang's stock speculative"
                " path (policy errors so far: %d; logged at most once a minute)",
                self.config.policy,
                what,
                total,
            )

    def _slow(self, elapsed: float) -> None:
        total = self.counters.count_slow_decision(elapsed)
        if self._slow_log.ready():
            logger.warning(
                "eagle_gate: policy %r took %.3f ms to decide (budget %.3f ms; slow "
                "decisions so far: %d; logged at most once a minute)",
                self.config.policy,
                elapsed * 1e3,
                self.decide_budget_s * 1e3,
                total,
            )

    # -- reporting -----------------------------------------------------------
    def last_decisions(self) -> list[dict[str, Any]]:
        """The ring of the last decisions, oldest first."""
        return self.ring.entries()

    def status(self) -> dict[str, Any]:
        """A JSON-able snapshot (safe to call from another thread: best effort)."""
        return {
            "pid": os.getpid(),
            "server_pid": os.getppid(),
            "sglang_version": self.sglang_version,
            "adapter": self.adapter,
            "policy": self.config.policy,
            "settings": dict(self.config.settings),
            "config_version": self.config_version,
            "last_control_error": self.last_control_error,
            "tp_rank": self.view.tp_rank,
            "tp_size": self.view.tp_size,
            "num_draft_tokens": self.view.num_draft_tokens,
            "plain_step_available": self.plain_step_available,
            "shadow": self.shadow,
            "shadow_totals": self.shadow_ledger.snapshot(),
            "step": self.step,
            **self.counters.as_status(),
            "decide_budget_s": self.decide_budget_s,
            "plain_graphs": dict(self.plain_graphs),
            "degraded": self.degraded is not None,
            "degraded_reason": self.degraded,
            "degraded_at_step": self.degraded_at_step,
            "estimates": policy_estimates(self.policy),
            "last_decisions": self.last_decisions(),
        }
