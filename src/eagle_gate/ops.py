"""Operating the gate inside one scheduler process: the ops thread.

Why a thread: status files, Prometheus values and the decision log need
writing about once a second whatever the load (also when no decode step runs),
and none of that belongs on the scheduler's critical path. A daemon thread
that wakes every ``interval_s`` (default 1 s) does it; the hot path only counts
in plain ints. The thread never runs a collective and never calls the policy's
``decide``/``observe``; it reads the runtime's counters (best effort, CPython
makes each read atomic) and may call the policy's optional ``estimates()``.

Runtime control is the exception: when the gate is gating, a change must take
effect at the same decode step on every rank, so it is applied on the hot path
every ``tick_every`` steps (:class:`eagle_gate.control.ControlAgreement`).
When the gate is idle (no speculation: nothing asks the policy) the thread
applies a change as soon as it sees it.

Tunables (environment of the server; the launcher passes its own on):

* ``EAGLE_GATE_OPS_INTERVAL_S`` (1.0): the thread's period;
* ``EAGLE_GATE_CONTROL_EVERY`` (64): control check period in decode steps
  (rounded up to a power of two);
* ``EAGLE_GATE_DECIDE_BUDGET_US`` (1000): a slower ``decide`` is counted;
* ``EAGLE_GATE_PLAIN_FAILURES_TO_DEGRADE`` (3);
* ``EAGLE_GATE_DECISION_LOG`` / ``EAGLE_GATE_DECISION_LOG_RATE``
  (:mod:`eagle_gate.decision_log`); ``EAGLE_GATE_METRICS=0`` turns metrics off.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle_gate.control import ControlAgreement, ControlFile, config_from_request
from eagle_gate.status import write_process_status

logger = logging.getLogger("eagle_gate")

__all__ = ["OpsSettings", "OpsService"]


def _num(env: Mapping[str, str], name: str, default: float) -> float:
    try:
        return float(env.get(name, "") or default)
    except ValueError:
        logger.warning("eagle_gate: ignoring %s=%r (not a number)", name, env[name])
        return default


@dataclass(frozen=True)
class OpsSettings:
    interval_s: float = 1.0
    tick_every: int = 64
    decide_budget_s: float = 1e-3
    plain_failures_to_degrade: int = 3

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None):
        env = os.environ if environ is None else environ
        every = max(1, int(_num(env, "EAGLE_GATE_CONTROL_EVERY", 64)))
        return cls(
            interval_s=max(0.05, _num(env, "EAGLE_GATE_OPS_INTERVAL_S", 1.0)),
            tick_every=1 << (every - 1).bit_length(),
            decide_budget_s=max(0.0, _num(env, "EAGLE_GATE_DECIDE_BUDGET_US", 1000))
            * 1e-6,
            plain_failures_to_degrade=max(
                1, int(_num(env, "EAGLE_GATE_PLAIN_FAILURES_TO_DEGRADE", 3))
            ),
        )


class OpsService:
    """Status file, metrics export, decision log and (idle) control."""

    def __init__(
        self,
        runtime: Any,
        status_dir: str | os.PathLike[str],
        extra: dict[str, Any],
        *,
        gated: bool,
        settings: OpsSettings,
        metrics: Any = None,
        control_broadcast: Any = None,
        control_source: bool = True,
        control_available: bool = True,
    ) -> None:
        self.runtime = runtime
        self.status_dir = Path(status_dir)
        self.extra = dict(extra)
        self.gated = gated
        self.settings = settings
        self.metrics = metrics
        self.control = ControlFile(status_dir)
        self.control_available = control_available
        self.errors = 0
        self.status_path: Path | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if gated and control_available:
            runtime.on_tick = ControlAgreement(
                runtime,
                self.control,
                is_source=control_source,
                broadcast=control_broadcast,
            )

    # -- one round of work -------------------------------------------------------
    def record(self) -> dict[str, Any]:
        rt = self.runtime
        record = rt.status()
        record.update(self.extra)
        from eagle_gate.adapters._base import ACTIVE

        record.update(
            gated=self.gated,
            # errors of the gate's own logic (the step ran SGLang's stock path)
            internal_errors=ACTIVE.internal_errors,
            updated_at=time.time(),
            control={
                "available": self.control_available,
                "applies": (
                    f"at decode steps that are multiples of {rt.tick_every}, the "
                    "same step on every rank"
                    if self.gated
                    else "at once (the gate is idle)"
                ),
                "tick_every": rt.tick_every,
            },
            metrics=self.metrics is not None,
            decision_log=(
                None if rt.decision_log is None else str(rt.decision_log.path)
            ),
        )
        return record

    def write_status(self) -> Path:
        self.status_path = write_process_status(self.status_dir, self.record())
        return self.status_path

    def _apply_idle_control(self) -> None:
        rt = self.runtime
        version, text = self.control.poll()
        if version > rt.config_version and text:
            rt.apply_config(config_from_request(text, rt.config), version)

    def run_once(self) -> None:
        """Everything the thread does per period (also called by tests)."""
        rt = self.runtime
        if not self.gated and self.control_available:
            self._apply_idle_control()
        if self.metrics is not None:
            self.metrics.export(rt)
        if rt.decision_log is not None:
            rt.decision_log.flush()
        self.write_status()

    # -- the thread ----------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(
            target=self._loop, name="eagle_gate-ops", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _loop(self) -> None:
        while not self._stop.wait(self.settings.interval_s):
            try:
                self.run_once()
            except Exception:
                self.errors += 1
                if self.errors == 1 or self.errors % 1000 == 0:
                    logger.exception(
                        "eagle_gate: status/metrics update failed (%d so far); "
                        "decoding is not affected",
                        self.errors,
                    )
