"""The status record: one scheduler process's gate as one JSON-able dict.

Built in one place, :func:`status_record`, from the runtime's state, the
process facts (:class:`~eagle_gate.facts.ProcessFacts`), the counters and,
when the ops thread writes it, the ops service's own part. Every reader goes
through it: ``GateRuntime.status()``, the status file
(``OpsService.record``, read back by ``eagle-gate status`` and
``GET /eagle_gate/status``) and the Prometheus exporter
(:mod:`eagle_gate.metrics`). docs/operations.md documents the keys.

Called off the hot path (the ops thread, about once a second, and tests):
safe from another thread, best effort (CPython makes each read atomic).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from eagle_gate.config import GateConfig
from eagle_gate.counters import DecisionRing, GateCounters
from eagle_gate.facts import ProcessFacts
from eagle_gate.guards import Guards
from eagle_gate.shadow import ShadowLedger

__all__ = ["RuntimeState", "OpsState", "status_record", "policy_estimates"]


class RuntimeState(Protocol):
    """What the record reads of a runtime (``eagle_gate.runtime.GateRuntime``)."""

    config: GateConfig
    policy: Any
    facts: ProcessFacts
    counters: GateCounters
    ring: DecisionRing
    guards: Guards
    shadow: bool
    shadow_ledger: ShadowLedger
    step: int
    config_version: int
    last_control_error: str | None
    degraded: str | None
    degraded_at_step: int | None
    plain_step: Any
    tick_every: int
    decision_log: Any
    depth_stats: Any  # DepthStats where the policy chooses depths, else None


class OpsState(Protocol):
    """What the record reads of the ops service (``eagle_gate.ops.OpsService``)."""

    gated: bool
    settings: Any  # OpsSettings: interval_s
    stage_errors: dict[str, int]
    last_errors: dict[str, str]
    control_available: bool
    metrics: Any
    clock: Callable[[], float]


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


def status_record(rt: RuntimeState, ops: OpsState | None = None) -> dict[str, Any]:
    """The status record of runtime ``rt``; with ``ops``, the full record the
    ops thread writes (``gated``, ``updated_at``, ``ops``, ``control``,
    ``metrics``, ``decision_log`` added)."""
    facts = rt.facts
    server_pid = facts.server_pid
    record = {
        "pid": os.getpid(),
        "server_pid": os.getppid() if server_pid is None else server_pid,
        "sglang_version": facts.sglang_version,
        "adapter": facts.adapter,
        "policy": rt.config.policy,
        "settings": dict(rt.config.settings),
        "config_version": rt.config_version,
        "last_control_error": rt.last_control_error,
        "tp_rank": facts.tp_rank,
        "tp_size": facts.tp_size,
        "num_draft_tokens": facts.num_draft_tokens,
        "plain_step_available": rt.plain_step is not None,
        "shadow": rt.shadow,
        "shadow_totals": rt.shadow_ledger.snapshot(),
        "step": rt.step,
        **rt.counters.as_status(),
        "decide_budget_s": rt.guards.decide_budget_s,
        "plain_graphs": dict(facts.plain_graphs),
        "degraded": rt.degraded is not None,
        "degraded_reason": rt.degraded,
        "degraded_at_step": rt.degraded_at_step,
        "estimates": policy_estimates(rt.policy),
        "last_decisions": rt.ring.entries(),
        "state": facts.state,
        "dp_rank": facts.dp_rank,
        "speculative_algorithm": facts.speculative_algorithm,
        "speculative": facts.speculative,
        "plain_step": facts.plain_mode,
        "draft_sync": facts.draft_sync,
        "launch_id": facts.launch_id,
        "fixes": list(facts.fixes),
    }
    depth_stats = getattr(rt, "depth_stats", None)
    if depth_stats is not None:  # binary servers: no key, as before depths
        record["depths"] = depth_stats.as_status()
    if ops is None:
        return record
    log = rt.decision_log
    record.update(
        gated=ops.gated,
        updated_at=ops.clock(),
        ops={
            "interval_s": ops.settings.interval_s,
            "errors": dict(ops.stage_errors),
            "last_errors": dict(ops.last_errors),
        },
        control={
            "available": ops.control_available,
            "applies": (
                f"at decode steps that are multiples of {rt.tick_every}, the "
                "same step on every rank"
                if ops.gated
                else "at once (the gate is idle)"
            ),
            "tick_every": rt.tick_every,
        },
        metrics=ops.metrics is not None,
        decision_log=None if log is None else str(log.path),
    )
    return record
