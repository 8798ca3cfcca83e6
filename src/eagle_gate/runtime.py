"""The gate inside one scheduler process: policy calls, guards and counters.

The adapters call :meth:`GateRuntime.decide` before a decode batch and
:meth:`GateRuntime.observe` when its result is resolved. Everything here is
plain Python (no SGLang, no torch) so it is tested directly.

Never breaking the server: a policy that raises or returns something other
than a :class:`Mode` makes that step run SGLang's stock speculative path; a
counter rises and at most one log line per minute says why.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from eagle_gate.config import GateConfig
from eagle_gate.policy import Mode, Policy, StepOutcome, StepView

logger = logging.getLogger("eagle_gate")

__all__ = ["GateRuntime", "default_status_dir", "Overrides"]

_LOG_EVERY_S = 60.0


class Overrides:
    """Reasons the gate ran SPEC although the policy asked for PLAIN."""

    #: the plain step is not available for this SGLang version / build yet.
    PLAIN_STEP_UNAVAILABLE = "plain_step_unavailable"


def default_status_dir(server_pid: int) -> Path:
    """Where scheduler processes of server ``server_pid`` report by default."""
    return Path(tempfile.gettempdir()) / f"eagle_gate-{server_pid}"


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
    ) -> None:
        self.config = config
        self.policy = policy
        self.sglang_version = sglang_version
        self.adapter = adapter
        self.plain_step_available = plain_step_available
        self._clock = clock
        self.view = StepView(
            num_draft_tokens=num_draft_tokens, tp_rank=tp_rank, tp_size=tp_size
        )
        self.step = 0
        self.steps_by_mode = [0, 0]
        self.tokens_by_mode = [0, 0]
        self.decisions_by_mode = [0, 0]
        self.policy_errors = 0
        self.overrides: dict[str, int] = {}
        self._last_log = -_LOG_EVERY_S
        self._last_resolve: float | None = None
        self._non_decode_since_resolve = True

    # -- before a decode batch --------------------------------------------
    def decide(
        self,
        batch_size: int,
        seq_len_sum: int,
        seq_lens: Any = None,
    ) -> tuple[Mode, int]:
        """Ask the policy; return the mode to RUN and this step's number."""
        step = self.step
        self.step = step + 1
        view = self.view.update(
            batch_size=batch_size,
            step=step,
            seq_len_sum=seq_len_sum,
            seq_lens=seq_lens,
        )
        try:
            mode = self.policy.decide(view)
        except Exception as exc:
            self._policy_error(f"decide raised {exc!r}")
            return Mode.SPEC, step
        if mode is not Mode.SPEC and mode is not Mode.PLAIN:
            # IntEnum members compare by identity; anything else is garbage.
            self._policy_error(f"decide returned {mode!r}, not an eagle_gate.Mode")
            return Mode.SPEC, step
        self.decisions_by_mode[mode] += 1
        if mode is Mode.PLAIN and not self.plain_step_available:
            self.count_override(Overrides.PLAIN_STEP_UNAVAILABLE)
            return Mode.SPEC, step
        return mode, step

    def note_non_decode_batch(self) -> None:
        """A prefill/extend batch ran: the next interval is not a decode step's."""
        self._non_decode_since_resolve = True

    # -- after the result was resolved ---------------------------------------
    def observe(self, mode: Mode, step: int, accept_lens: Sequence[int]) -> None:
        """Account a resolved decode step and tell the policy."""
        now = self._clock()
        last = self._last_resolve
        interval = (
            None if last is None or self._non_decode_since_resolve else now - last
        )
        self._last_resolve = now
        self._non_decode_since_resolve = False
        tokens = sum(accept_lens)
        self.steps_by_mode[mode] += 1
        self.tokens_by_mode[mode] += tokens
        outcome = StepOutcome(
            mode=mode,
            batch_size=len(accept_lens),
            tokens=tokens,
            accept_lens=accept_lens,
            interval_s=interval,
            step=step,
        )
        try:
            self.policy.observe(outcome)
        except Exception as exc:
            self._policy_error(f"observe raised {exc!r}")

    # -- counters ------------------------------------------------------------
    def count_override(self, reason: str) -> None:
        self.overrides[reason] = self.overrides.get(reason, 0) + 1

    def _policy_error(self, what: str) -> None:
        self.policy_errors += 1
        now = self._clock()
        if now - self._last_log >= _LOG_EVERY_S:
            self._last_log = now
            logger.warning(
                "eagle_gate: policy %r %s; this step runs SGLang's stock speculative"
                " path (policy errors so far: %d; logged at most once a minute)",
                self.config.policy,
                what,
                self.policy_errors,
            )

    # -- reporting -----------------------------------------------------------
    def status(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "server_pid": os.getppid(),
            "sglang_version": self.sglang_version,
            "adapter": self.adapter,
            "policy": self.config.policy,
            "settings": self.config.settings,
            "tp_rank": self.view.tp_rank,
            "tp_size": self.view.tp_size,
            "num_draft_tokens": self.view.num_draft_tokens,
            "plain_step_available": self.plain_step_available,
            "steps": {"spec": self.steps_by_mode[0], "plain": self.steps_by_mode[1]},
            "tokens": {
                "spec": self.tokens_by_mode[0],
                "plain": self.tokens_by_mode[1],
            },
            "decisions": {
                "spec": self.decisions_by_mode[0],
                "plain": self.decisions_by_mode[1],
            },
            "policy_errors": self.policy_errors,
            "overrides": dict(self.overrides),
        }
