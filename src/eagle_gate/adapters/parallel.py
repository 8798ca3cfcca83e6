"""Tensor parallelism: the process group the gate agrees over, and the three
agreements built on it.

Under TP every rank runs its own scheduler and gate, and all ranks must take
the same branch in the same step. The gate agrees, over the scheduler's
attention-TP CPU (gloo) group, on exactly three things, never per step:

* step timings, every few steps (:func:`timing_agreement`,
  :mod:`eagle_gate.agreement`);
* runtime control requests, every ``tick_every`` steps
  (:func:`control_broadcast`, :mod:`eagle_gate.control`);
* whether the plain step's CUDA graphs were captured, twice at start
  (:func:`plain_graphs_agreement`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from eagle_gate.agreement import TimingAgreement

logger = logging.getLogger("eagle_gate")

__all__ = [
    "tp_cpu_group",
    "timing_agreement",
    "control_broadcast",
    "plain_graphs_agreement",
]


def tp_cpu_group(group: Any) -> Any:
    """``group``, or the attention-TP CPU group of SGLang's parallel state
    (0.5.23: ``runtime_context.get_parallel().attn_tp_group``; 0.5.9:
    ``layers.dp_attention.get_attention_tp_group()``), the same group as
    ``Scheduler.attn_tp_cpu_group``."""
    if group is not None:
        return group
    try:
        from sglang.srt.runtime_context import get_parallel

        return get_parallel().attn_tp_group.cpu_group
    except Exception:
        from sglang.srt.layers.dp_attention import get_attention_tp_group

        return get_attention_tp_group().cpu_group


def timing_agreement(group: Any) -> TimingAgreement:
    """Agreement on timings over the attention-TP CPU group (see
    eagle_gate.agreement); without a group, outcomes carry no timings."""
    from eagle_gate.agreement import torch_timing_broadcast

    try:
        return TimingAgreement(torch_timing_broadcast(tp_cpu_group(group)))
    except Exception as exc:
        logger.warning(
            "eagle_gate: no TP process group to agree on step timings (%r); "
            "policies get no step intervals in this server",
            exc,
        )
        return TimingAgreement(None)


def control_broadcast(group: Any) -> tuple[Any, bool]:
    """A TP broadcast for runtime control, and whether this rank is its source."""
    import torch.distributed as dist

    from eagle_gate.control import torch_broadcast

    group = tp_cpu_group(group)
    return torch_broadcast(group), dist.get_rank(group) == 0


def plain_graphs_agreement(group: Any) -> Callable[[bool], bool]:
    """``agree(ok) -> all ranks ok`` over the attention-TP CPU group."""
    from eagle_gate.agreement import torch_min_agreement

    return torch_min_agreement(tp_cpu_group(group))
