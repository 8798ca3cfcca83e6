"""Switching a running gate to another configuration (runtime control).

:func:`apply_config` is what ``GateRuntime.apply_config`` does when the ops
thread's control (``eagle_gate.control``) hands a new configuration at a
tick: the same step on every rank. Kept apart from the per-step flow in
:mod:`eagle_gate.runtime` because it runs rarely, may be slow (it builds a
policy object) and logs. Plain Python (no SGLang, no torch).
"""

from __future__ import annotations

import logging
from typing import Any

from eagle_gate.config import GateConfig
from eagle_gate.shadow import SHADOW_NOTE, predicted_plain_rate

logger = logging.getLogger("eagle_gate")

__all__ = ["apply_config"]


def apply_config(rt: Any, config: GateConfig, version: int) -> bool:
    """Switch runtime ``rt`` to ``config`` (a new policy object) as
    configuration ``version``.

    Returns False (and keeps the current policy) if the policy cannot be
    created; ``rt.last_control_error`` says why. Policy creation is
    deterministic, so every rank reaches the same result. A change of shadow
    mode alone keeps the policy object and what it has learned: switching a
    watched policy live is the point of shadow mode.
    """
    current = rt.config
    try:
        if (
            config.shadow != current.shadow
            and config.policy == current.policy
            and config.settings == current.settings
        ):
            policy = rt.policy
        else:
            policy = config.create_policy()
    except Exception as exc:
        rt.last_control_error = (
            f"version {version}: cannot create policy {config.policy!r}: {exc}"
        )
        rt.config_version = max(rt.config_version, version)
        logger.error("eagle_gate: %s; the current policy stays", exc)
        return False
    old = rt.config.policy
    rt.policy = policy
    rt._predict = predicted_plain_rate(policy)
    rt.shadow = bool(config.shadow)
    rt._shadow_seen = rt._shadow_seen or rt.shadow
    rt.config = config
    rt.config_version = version
    rt.last_control_error = None
    log = rt.decision_log
    if log is not None:
        log.config(rt.step, version, config.policy, config.settings, config.shadow)
    logger.info(
        "eagle_gate: configuration %d from step %d: policy %r %s (was %r)%s",
        version,
        rt.step,
        config.policy,
        config.settings,
        old,
        SHADOW_NOTE if rt.shadow else "",
    )
    return True
