"""The gate inside one scheduler process: policy calls, guards and counters.

The adapters call :meth:`GateRuntime.decide` before a decode batch and
:meth:`GateRuntime.observe` when its result is resolved. Everything here is
plain Python (no SGLang, no torch) so it is tested directly.

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

import collections
import logging
import os
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from eagle_gate.config import GateConfig
from eagle_gate.policy import Mode, Policy, StepOutcome, StepView
from eagle_gate.shadow import ShadowLedger, predicted_plain_rate

logger = logging.getLogger("eagle_gate")

__all__ = ["GateRuntime", "default_status_dir", "Overrides", "PolicyErrors"]

_LOG_EVERY_S = 60.0
#: decisions kept for status (a fixed ring, no allocation per step).
RING_SIZE = 32
#: decision codes in the ring / decision log besides Mode.SPEC (0), Mode.PLAIN (1).
DECIDED_ERROR = 2
DECIDED_NOT_ASKED = 3
DECIDED_NAMES = ("spec", "plain", "error", "not_asked")
MODE_NAMES = ("spec", "plain")
#: the plain step's target paths, and why one ran eagerly (docs/plain-graphs.md).
PLAIN_PATHS = ("graph", "eager")
PLAIN_EAGER_REASONS = ("graphs_off", "bs_above_max", "bs_not_captured", "declined")
#: the paths of the plain step's draft extends (eager sync, lazy catch-up):
#: SGLang's own draft-extend CUDA graph, or its eager draft forward.
DRAFT_EXTEND_PATHS = ("graph", "eager")


class Overrides:
    """Reasons the gate ran SPEC although the policy asked for PLAIN."""

    #: the plain step is not available for this SGLang version / build yet.
    PLAIN_STEP_UNAVAILABLE = "plain_step_unavailable"
    #: the plain step raised; the stock step ran instead.
    PLAIN_STEP_FAILED = "plain_step_failed"
    #: the gate degraded to stock behaviour (the policy is not asked any more).
    DEGRADED = "degraded"


class PolicyErrors:
    """Reasons counted in ``policy_errors_by_reason``."""

    DECIDE_RAISED = "decide_raised"
    DECIDE_INVALID = "decide_invalid"
    OBSERVE_RAISED = "observe_raised"
    ALL = (DECIDE_RAISED, DECIDE_INVALID, OBSERVE_RAISED)


def default_status_dir(server_pid: int) -> Path:
    """Where scheduler processes of server ``server_pid`` report by default."""
    return Path(tempfile.gettempdir()) / f"eagle_gate-{server_pid}"


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


class GateRuntime:
    """Per-process gate state: the policy, the step counter and the counters."""

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
        plain_step_available: bool = False,
        clock: Callable[[], float] = time.perf_counter,
        timer: Callable[[], float] = time.perf_counter,
        tick_every: int = 64,
        decide_budget_s: float = 1e-3,
        plain_failures_to_degrade: int = 3,
        req_len: Callable[[Any], int] | None = None,
    ) -> None:
        if tick_every < 1 or tick_every & (tick_every - 1):
            raise ValueError(f"tick_every must be a power of two, got {tick_every}")
        self.config = config
        self.policy = policy
        self.sglang_version = sglang_version
        self.adapter = adapter
        self.plain_step_available = plain_step_available
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
        self.steps_by_mode = [0, 0]
        self.tokens_by_mode = [0, 0]
        #: requests x steps by mode: SPEC tokens / SPEC request-steps is the
        #: accept length of SPEC steps alone (SGLang's own acceptance counts
        #: every plain step as a verify that accepted nothing).
        self.request_steps_by_mode = [0, 0]
        self.decisions_by_mode = [0, 0]
        # shadow mode: decide and observe, run stock SPEC, count would-haves
        self.shadow = bool(config.shadow)
        self.shadow_ledger = ShadowLedger()
        self._shadow_seen = self.shadow
        self._predict = predicted_plain_rate(policy)
        self.policy_errors = 0
        #: outcomes outside the StepOutcome contract (see observe).
        self.invalid_outcomes = 0
        self.policy_errors_by_reason = dict.fromkeys(PolicyErrors.ALL, 0)
        self.overrides: dict[str, int] = {}
        self._last_log = -_LOG_EVERY_S
        self._last_slow_log = -_LOG_EVERY_S
        self._last_resolve: float | None = None
        self._non_decode_since_resolve = True
        # runtime control (see eagle_gate.control)
        self.config_version = 0
        self.last_control_error: str | None = None
        self.tick_every = tick_every
        self._tick_mask = tick_every - 1
        #: called with the step number before deciding steps that are multiples
        #: of ``tick_every`` (same steps on every rank); set by the ops layer.
        self.on_tick: Callable[[int], None] | None = None
        self.tick_errors = 0
        # guards
        self.decide_budget_s = decide_budget_s
        self.slow_decisions = 0
        self.max_decide_s = 0.0
        self.plain_failures_to_degrade = plain_failures_to_degrade
        self.plain_step_failures = 0
        self.consecutive_plain_failures = 0
        self.degraded: str | None = None
        self.degraded_at_step: int | None = None
        # the last decisions: parallel fixed-size lists, written in place
        self._ring_step = [-1] * RING_SIZE
        self._ring_bs = [0] * RING_SIZE
        self._ring_decided = [0] * RING_SIZE
        self._ring_ran = [0] * RING_SIZE
        self._ring_pos = 0
        # dwell: runs of one mode that ran, in resolved order
        self.current_mode: Mode | None = None
        self._dwell_len = 0
        #: finished dwells ``(mode, steps)``, drained by the metrics exporter.
        self.finished_dwells: collections.deque[tuple[int, int]] = collections.deque(
            maxlen=4096
        )
        #: optional DecisionLog (eagle_gate.decision_log); None when off.
        self.decision_log: Any = None
        #: with tp_size > 1: holds outcomes back and releases them with rank 0's
        #: timings at the same step on every rank (eagle_gate.agreement).
        self.agreement: Any = None
        #: the plain step's DECODE CUDA graphs (docs/plain-graphs.md): the
        #: status block, set at activation; off until then.
        self.plain_graphs: dict[str, Any] = {
            "setting": getattr(config, "plain_graphs", "auto"),
            "state": "off",
            "reason": None,
            "capture_bs": [],
            "max_bs": 0,
            "disable_padding": False,
            "memory_mib": None,
            "backend_mib": None,
            "graphs_mib": None,
            "capture_s": None,
            "attention_backend": None,
            "report": None,
        }
        #: plain steps by the target's path, and why the eager ones were eager.
        self.plain_path = dict.fromkeys(PLAIN_PATHS, 0)
        self.plain_eager_reasons = dict.fromkeys(PLAIN_EAGER_REASONS, 0)
        #: the plain step's draft extends by the path SGLang takes for them.
        self.draft_extend_path = dict.fromkeys(DRAFT_EXTEND_PATHS, 0)

    # -- before a decode batch --------------------------------------------
    def decide(
        self,
        batch_size: int,
        seq_len_sum: int | None,
        seq_lens: Any = None,
        reqs: Any = None,
    ) -> tuple[Mode, int]:
        """Ask the policy; return the mode to RUN and this step's number.

        ``seq_len_sum`` / ``seq_lens``: SGLang's CPU lengths, either of them
        None when SGLang has none at hand; ``reqs``: the batch's requests, for
        the view's estimate then (see :class:`~eagle_gate.policy.StepView`).
        """
        step = self.step
        self.step = step + 1
        if not step & self._tick_mask and self.on_tick is not None:
            self._tick(step)
        agreement = self.agreement
        if agreement is not None and agreement.due(step):
            for mode_, step_, lens_, interval_ in agreement.release():
                self._deliver(mode_, step_, lens_, interval_)
        view = self.view.update(
            batch_size=batch_size,
            step=step,
            seq_len_sum=seq_len_sum,
            seq_lens=seq_lens,
            reqs=reqs,
        )
        if self.degraded is not None:
            self.count_override(Overrides.DEGRADED)
            return self._ran(step, batch_size, DECIDED_NOT_ASKED, None)
        timer = self._timer
        t0 = timer()
        try:
            mode = self.policy.decide(view)
        except Exception as exc:
            self._policy_error(PolicyErrors.DECIDE_RAISED, f"decide raised {exc!r}")
            return self._ran(step, batch_size, DECIDED_ERROR, None)
        elapsed = timer() - t0
        if elapsed > self.decide_budget_s:
            self._slow(elapsed)
        if mode is not Mode.SPEC and mode is not Mode.PLAIN:
            # IntEnum members compare by identity; anything else is garbage.
            self._policy_error(
                PolicyErrors.DECIDE_INVALID,
                f"decide returned {mode!r}, not an eagle_gate.Mode",
            )
            return self._ran(step, batch_size, DECIDED_ERROR, None)
        self.decisions_by_mode[mode] += 1
        if self.shadow:
            if mode is Mode.PLAIN:
                self.shadow_ledger.decided(step, True, self._predict, view)
            else:
                self.shadow_ledger.decided(step, False)
            return self._ran(step, batch_size, mode, "shadow")
        if mode is Mode.PLAIN and not self.plain_step_available:
            reason = Overrides.PLAIN_STEP_UNAVAILABLE
            self.count_override(reason)
            return self._ran(step, batch_size, mode, reason)
        pos = self._ring_pos
        self._ring_step[pos] = step
        self._ring_bs[pos] = batch_size
        self._ring_decided[pos] = mode
        self._ring_ran[pos] = mode
        self._ring_pos = (pos + 1) % RING_SIZE
        log = self.decision_log
        if log is not None:
            log.decision(step, view, mode, mode, None)
        return mode, step

    def _ran(
        self,
        step: int,
        batch_size: int,
        decided: int,
        override: str | None,
    ) -> tuple[Mode, int]:
        """Record a step that runs SPEC for a reason other than the policy."""
        pos = self._ring_pos
        self._ring_step[pos] = step
        self._ring_bs[pos] = batch_size
        self._ring_decided[pos] = decided
        self._ring_ran[pos] = Mode.SPEC
        self._ring_pos = (pos + 1) % RING_SIZE
        log = self.decision_log
        if log is not None:
            log.decision(step, self.view, decided, Mode.SPEC, override)
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
        self.consecutive_plain_failures = 0
        return result, Mode.PLAIN

    def _plain_step_failed(self, exc: BaseException) -> None:
        self.plain_step_failures += 1
        self.consecutive_plain_failures += 1
        self.count_override(Overrides.PLAIN_STEP_FAILED)
        last = (self._ring_pos - 1) % RING_SIZE
        self._ring_ran[last] = Mode.SPEC
        log = self.decision_log
        if log is not None:
            log.plain_failure(self.step - 1, repr(exc))
        if self.consecutive_plain_failures >= self.plain_failures_to_degrade:
            self.degrade(
                f"the plain step failed {self.consecutive_plain_failures} times in a "
                f"row (last: {exc!r})"
            )
            logger.error(
                "eagle_gate: %s; the gate is DEGRADED: every step from now on is "
                "SGLang's stock speculative step",
                self.degraded,
                exc_info=exc,
            )
        elif self.plain_step_failures == 1 or self.plain_step_failures % 1000 == 0:
            logger.warning(
                "eagle_gate: the plain step failed (%d so far: %r); this step ran "
                "SGLang's stock speculative step",
                self.plain_step_failures,
                exc,
                exc_info=exc,
            )

    def degrade(self, reason: str) -> None:
        """Stop gating for the rest of the run (every step: stock SPEC)."""
        if self.degraded is None:
            self.degraded = reason
            self.degraded_at_step = self.step

    # -- after the result was resolved ---------------------------------------
    def observe(self, mode: Mode, step: int, accept_lens: Sequence[int]) -> None:
        """Account a resolved decode step and tell the policy.

        The outcome contract (``StepOutcome``): ``tokens`` is the sum of
        ``accept_lens``, a PLAIN step emits one token per request and a SPEC
        step between 1 and ``num_draft_tokens`` per request. What a
        third-party adapter sends outside it is counted in
        ``invalid_outcomes`` and corrected (a PLAIN step: one token per
        request) or, when it cannot be (no valid mode, lengths that are not
        numbers, SPEC tokens out of range), not accounted and not shown to
        the policy; the next interval is then unknown. O(1) beyond the sum.
        """
        now = self._clock()
        last = self._last_resolve
        interval = (
            None if last is None or self._non_decode_since_resolve else now - last
        )
        self._last_resolve = now
        self._non_decode_since_resolve = False
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
                    self.invalid_outcomes += 1
                    accept_lens = (1,) * b
                    tokens = b
            else:
                k = self.view.num_draft_tokens
                bad = tokens < b or (k > 1 and tokens > b * k)
        if bad:
            self.invalid_outcomes += 1
            self._non_decode_since_resolve = True
            return
        if self._shadow_seen:
            self.shadow_ledger.resolved(step, tokens, interval)
        self.steps_by_mode[mode] += 1
        self.tokens_by_mode[mode] += tokens
        self.request_steps_by_mode[mode] += len(accept_lens)
        if mode is self.current_mode:
            self._dwell_len += 1
        else:
            if self.current_mode is not None:
                self.finished_dwells.append((int(self.current_mode), self._dwell_len))
            self.current_mode = mode
            self._dwell_len = 1
        log = self.decision_log
        if log is not None:
            log.outcome(step, mode, accept_lens, tokens, interval)
        if self.degraded is not None:
            return
        if self.agreement is not None:
            self.agreement.hold(mode, step, accept_lens, interval)
            return
        self._deliver(mode, step, accept_lens, interval, tokens)

    def _deliver(
        self,
        mode: Mode,
        step: int,
        accept_lens: Sequence[int],
        interval: Any,
        tokens: int | None = None,
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
        )
        try:
            self.policy.observe(outcome)
        except Exception as exc:
            self._policy_error(PolicyErrors.OBSERVE_RAISED, f"observe raised {exc!r}")

    # -- runtime control -----------------------------------------------------
    def _tick(self, step: int) -> None:
        try:
            self.on_tick(step)  # type: ignore[misc]
        except Exception:
            self.tick_errors += 1
            if self.tick_errors == 1 or self.tick_errors % 1000 == 0:
                logger.exception(
                    "eagle_gate: runtime control failed at step %d (%d so far); "
                    "the current policy stays",
                    step,
                    self.tick_errors,
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

    # -- counters ------------------------------------------------------------
    def count_override(self, reason: str) -> None:
        self.overrides[reason] = self.overrides.get(reason, 0) + 1

    def count_plain_path(self, path: str, reason: str | None = None) -> None:
        """One plain step ran the target on ``path`` ("graph" or "eager");
        ``reason``: why it was eager (see PLAIN_EAGER_REASONS)."""
        self.plain_path[path] = self.plain_path.get(path, 0) + 1
        if reason is not None:
            self.plain_eager_reasons[reason] = (
                self.plain_eager_reasons.get(reason, 0) + 1
            )

    def count_draft_extend(self, path: str) -> None:
        """One draft extend of the plain step (eager draft sync, or a lazy
        catch-up) ran on ``path``: "graph" when SGLang replays its own
        draft-extend CUDA graph, "eager" when it runs the draft eagerly."""
        self.draft_extend_path[path] = self.draft_extend_path.get(path, 0) + 1

    def _policy_error(self, reason: str, what: str) -> None:
        self.policy_errors += 1
        self.policy_errors_by_reason[reason] = (
            self.policy_errors_by_reason.get(reason, 0) + 1
        )
        now = time.monotonic()
        if now - self._last_log >= _LOG_EVERY_S:
            self._last_log = now
            logger.warning(
                "eagle_gate: policy %r %s; this step runs SGLang's stock speculative"
                " path (policy errors so far: %d; logged at most once a minute)",
                self.config.policy,
                what,
                self.policy_errors,
            )

    def _slow(self, elapsed: float) -> None:
        self.slow_decisions += 1
        if elapsed > self.max_decide_s:
            self.max_decide_s = elapsed
        now = time.monotonic()
        if now - self._last_slow_log >= _LOG_EVERY_S:
            self._last_slow_log = now
            logger.warning(
                "eagle_gate: policy %r took %.3f ms to decide (budget %.3f ms; slow "
                "decisions so far: %d; logged at most once a minute)",
                self.config.policy,
                elapsed * 1e3,
                self.decide_budget_s * 1e3,
                self.slow_decisions,
            )

    # -- reporting -----------------------------------------------------------
    def spec_accept_length(self) -> float | None:
        """Mean tokens per request of SPEC steps (bonus token included), or
        None before the first one: acceptance without the plain steps."""
        n = self.request_steps_by_mode[0]
        return self.tokens_by_mode[0] / n if n else None

    def last_decisions(self) -> list[dict[str, Any]]:
        """The ring of the last decisions, oldest first."""
        out = []
        pos = self._ring_pos
        for i in range(RING_SIZE):
            j = (pos + i) % RING_SIZE
            step = self._ring_step[j]
            if step < 0:
                continue
            out.append(
                {
                    "step": step,
                    "batch_size": self._ring_bs[j],
                    "decided": DECIDED_NAMES[self._ring_decided[j]],
                    "ran": MODE_NAMES[self._ring_ran[j]],
                }
            )
        return out

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
            "mode": (
                None if self.current_mode is None else MODE_NAMES[self.current_mode]
            ),
            "steps": {"spec": self.steps_by_mode[0], "plain": self.steps_by_mode[1]},
            "tokens": {
                "spec": self.tokens_by_mode[0],
                "plain": self.tokens_by_mode[1],
            },
            "request_steps": {
                "spec": self.request_steps_by_mode[0],
                "plain": self.request_steps_by_mode[1],
            },
            "spec_accept_length": self.spec_accept_length(),
            "decisions": {
                "spec": self.decisions_by_mode[0],
                "plain": self.decisions_by_mode[1],
            },
            "policy_errors": self.policy_errors,
            "invalid_outcomes": self.invalid_outcomes,
            "policy_errors_by_reason": dict(self.policy_errors_by_reason),
            "slow_decisions": self.slow_decisions,
            "decide_budget_s": self.decide_budget_s,
            "max_decide_s": self.max_decide_s,
            "overrides": dict(self.overrides),
            "plain_step_failures": self.plain_step_failures,
            "plain_graphs": dict(self.plain_graphs),
            "plain_path": dict(self.plain_path),
            "plain_eager_reasons": dict(self.plain_eager_reasons),
            "draft_extend_path": dict(self.draft_extend_path),
            "degraded": self.degraded is not None,
            "degraded_reason": self.degraded,
            "degraded_at_step": self.degraded_at_step,
            "estimates": policy_estimates(self.policy),
            "last_decisions": self.last_decisions(),
        }
