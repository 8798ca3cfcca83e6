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
every ``tick_every`` steps (:class:`eagle_gate.control.ControlAgreement`, the
runtime's ``on_tick``, which activation builds over the same control file).
When the gate is idle (no speculation: nothing asks the policy) the thread
applies a change as soon as it sees it.

Each stage of a round (idle control, metrics, decision log, status) runs on
its own: one that fails is counted and logged (first, then every 1000th), and
the others, the status record above all, still happen. The record says when it
was written (``updated_at``) and how often it should be (``ops.interval_s``),
so a dead or hung thread shows as ``stale`` in the status.

Tunables (environment of the server; the launcher passes its own on, and
refuses a launch whose values are not allowed, naming the variable; a
scheduler that still meets one logs it and uses the default):

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
import math
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle_gate.config import ConfigError
from eagle_gate.control import ControlFile, config_from_request
from eagle_gate.logutil import first_then_every
from eagle_gate.status import aggregate, read_status, write_process_status
from eagle_gate.status_record import status_record
from eagle_gate.statusdir import StatusDir, as_status_dir

logger = logging.getLogger("eagle_gate")

__all__ = ["OpsSettings", "OpsService", "ENVIRONMENT", "check_environment"]


@dataclass(frozen=True)
class _Var:
    integer: bool
    default: float
    minimum: float
    maximum: float

    def allowed(self) -> str:
        kind = "an integer" if self.integer else "a finite number"
        lo = int(self.minimum) if self.integer else self.minimum
        hi = int(self.maximum) if self.integer else self.maximum
        return f"{kind} in [{lo}, {hi}]"

    def parse(self, name: str, text: str) -> float:
        """The value of ``text``; ConfigError naming the variable if not allowed."""
        try:
            value: float = int(text.strip(), 10) if self.integer else float(text)
        except (ValueError, OverflowError):
            value = math.nan
        if not (math.isfinite(value) and self.minimum <= value <= self.maximum):
            raise ConfigError(
                f"{name}: value {text!r} is not allowed; expected {self.allowed()}"
            )
        return value


#: the ops tunables read from the environment, and what each allows.
ENVIRONMENT: dict[str, _Var] = {
    "EAGLE_GATE_OPS_INTERVAL_S": _Var(False, 1.0, 0.05, 3600.0),
    "EAGLE_GATE_CONTROL_EVERY": _Var(True, 64, 1, 1 << 20),
    "EAGLE_GATE_DECIDE_BUDGET_US": _Var(False, 1000.0, 0.0, 1e9),
    "EAGLE_GATE_PLAIN_FAILURES_TO_DEGRADE": _Var(True, 3, 1, 1_000_000),
    "EAGLE_GATE_DECISION_LOG_RATE": _Var(True, 200, 1, 1_000_000),
}


def check_environment(environ: Mapping[str, str] | None = None) -> None:
    """Refuse (ConfigError naming the variable) any ops tunable in ``environ``
    that is not allowed: NaN, infinite, not a number, out of range. The
    launchers call this before SGLang starts, so no scheduler meets one."""
    env = os.environ if environ is None else environ
    for name, var in ENVIRONMENT.items():
        text = env.get(name, "")
        if text.strip():
            var.parse(name, text)


def _value(env: Mapping[str, str], name: str) -> float:
    var = ENVIRONMENT[name]
    text = env.get(name, "")
    if not text.strip():
        return var.default
    try:
        return var.parse(name, text)
    except ConfigError as exc:
        logger.warning("eagle_gate: %s; using %s", exc, var.default)
        return var.default


@dataclass(frozen=True)
class OpsSettings:
    interval_s: float = 1.0
    tick_every: int = 64
    decide_budget_s: float = 1e-3
    plain_failures_to_degrade: int = 3

    @classmethod
    def from_environment(
        cls, environ: Mapping[str, str] | None = None, *, strict: bool = False
    ) -> OpsSettings:
        """The settings in ``environ``. ``strict``: raise ConfigError naming a
        variable that is not allowed; otherwise log it and use its default
        (a scheduler never fails to start over a tunable)."""
        env = os.environ if environ is None else environ
        if strict:
            check_environment(env)
        every = int(_value(env, "EAGLE_GATE_CONTROL_EVERY"))
        return cls(
            interval_s=_value(env, "EAGLE_GATE_OPS_INTERVAL_S"),
            tick_every=1 << (every - 1).bit_length(),
            decide_budget_s=_value(env, "EAGLE_GATE_DECIDE_BUDGET_US") * 1e-6,
            plain_failures_to_degrade=int(
                _value(env, "EAGLE_GATE_PLAIN_FAILURES_TO_DEGRADE")
            ),
        )


#: the stages of one round, in order.
STAGES = ("control", "metrics", "decision_log", "status")


class OpsService:
    """Status file, metrics export, decision log and (idle) control.

    Construction does nothing that can fail (the status directory is opened
    and checked on first use), so setting it up never stops a scheduler.
    """

    def __init__(
        self,
        runtime: Any,
        status_dir: StatusDir | str | os.PathLike[str],
        *,
        gated: bool,
        settings: OpsSettings,
        metrics: Any = None,
        control_available: bool = True,
        control: ControlFile | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``runtime``: the process's ``GateRuntime``, whose facts
        (``runtime.facts``: the launch id among them) the record reports.
        ``control``: the launch's control file, shared with the runtime's
        ``on_tick`` when gating (the thread reads it only when idle); one of
        its own, for the runtime's launch, when not given."""
        self.runtime = runtime
        self.directory = as_status_dir(status_dir)
        self.status_dir = self.directory.path
        self.gated = gated
        self.settings = settings
        self.metrics = metrics
        # A descriptor of its own: the hot path polls control (gating) while
        # this thread writes status, and each may have to reopen its own.
        if control is None:
            control = ControlFile(
                StatusDir(self.directory.path), runtime.facts.launch_id
            )
        self.control = control
        self.control_available = control_available
        #: the wall clock of ``updated_at`` and of the agreement check.
        self.clock = clock
        #: failures per stage, and the last one's message.
        self.stage_errors = dict.fromkeys(STAGES, 0)
        self.last_errors: dict[str, str] = {}
        self.status_path: Path | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: when the status directory was last read for the agreement gauge.
        self._agreement_at: float | None = None

    @property
    def errors(self) -> int:
        return sum(self.stage_errors.values())

    # -- one round of work -------------------------------------------------------
    def record(self) -> dict[str, Any]:
        """This process's status record, the ops part included
        (:func:`eagle_gate.status_record.status_record`)."""
        return status_record(self.runtime, self)

    def write_status(self) -> Path:
        self.status_path = write_process_status(self.directory, self.record())
        return self.status_path

    def _apply_idle_control(self) -> None:
        rt = self.runtime
        version, text = self.control.poll()
        if version > rt.config_version and text:
            rt.apply_config(config_from_request(text, rt.config), version)

    def _export_metrics(self) -> None:
        metrics = self.metrics
        metrics.export(self.runtime)
        export_ops = getattr(metrics, "export_ops", None)
        if export_ops is not None:
            export_ops(self.stage_errors)
        if getattr(metrics, "exports_agreement", False):
            self._export_agreement()

    def _export_agreement(self) -> None:
        """``eagle_gate_status_agreement`` from the status directory, read at
        most once per interval (this runs on one process: TP rank 0 of DP
        rank 0). An unreadable directory sets 0 and fails the stage."""
        now = self.clock()
        last = self._agreement_at
        if last is not None and 0 <= now - last < 0.9 * self.settings.interval_s:
            return
        self._agreement_at = now
        try:
            records = read_status(self.directory, self.runtime.facts.launch_id)
            agree = bool(aggregate(self.directory, records)["agreement"]["all"])
        except Exception:
            self.metrics.set_status_agreement(False)
            raise
        self.metrics.set_status_agreement(agree)

    def _flush_log(self) -> None:
        self.runtime.decision_log.flush()

    def record_failure(self, stage: str, exc: Exception) -> None:
        """Count and log a failed stage (first, then every 1000th)."""
        n = self.stage_errors[stage] = self.stage_errors[stage] + 1
        self.last_errors[stage] = f"{type(exc).__name__}: {exc}"[:500]
        if first_then_every(n):
            logger.error(
                "eagle_gate: the %s step of the ops thread failed (%d so far): %r; "
                "decoding is not affected",
                stage,
                n,
                exc,
                exc_info=exc,
            )

    def run_once(self) -> None:
        """Everything the thread does per period (also called by tests). Each
        stage runs whatever the others did; none raises out of here."""
        rt = self.runtime
        stages: list[tuple[str, Callable[[], Any]]] = []
        if not self.gated and self.control_available:
            stages.append(("control", self._apply_idle_control))
        if self.metrics is not None:
            stages.append(("metrics", self._export_metrics))
        if rt.decision_log is not None:
            stages.append(("decision_log", self._flush_log))
        stages.append(("status", self.write_status))
        for stage, fn in stages:
            try:
                fn()
            except Exception as exc:
                self.record_failure(stage, exc)

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
            self.run_once()
