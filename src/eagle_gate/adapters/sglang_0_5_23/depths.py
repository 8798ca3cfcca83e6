"""SPEC depth per batch on SGLang 0.5.23 (``--gate-depths``, issue #33).

SGLang 0.5.23 builds, with ``--speculative-adaptive``, one runtime state per
candidate depth at startup (draft and verify backends and graphs, the draft
extend's; ``EAGLEWorkerV2.build_adaptive_runtime_state``) and switches between
them with ``apply_runtime_state``. It asks its ``AdaptiveController`` for the
depth at the start of every decode step (``forward_batch_generation`` ->
``activate_step_by_batch`` -> ``params.get_steps_for_batch``) and lets the
controller's EMA move it after each verify (``on_verify_complete``). See
docs/design/2026-12-depths-0.5.23.md for the reading, with line numbers.

The gate drives that machinery instead of SGLang's controller:

* the launcher adds ``--speculative-adaptive`` with a config whose only tier's
  candidates are the gate's depths (:func:`launch_args`; never 0: SGLang's
  depth 0 is a 1-token verify plus a draft extend, the gate's PLAIN is a true
  decode), so SGLang builds a state for each, sized for the deepest;
* each scheduler swaps the controller's policy object for :class:`GateDepths`
  (:func:`install`): SGLang's own per-step call then applies the depth the
  gate's worker wrapper set for this step (``adapters/hooks.py``), and
  SGLang's verify feedback moves nothing. No SGLang method is replaced;
* SGLang logs every switch at INFO; a gate switching every step would flood
  the log, so those records are dropped while the gate drives.

A PLAIN step runs under whatever state is active (its eager draft sync takes
its width from the active state: any depth >= 1 gives an exact draft).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from typing import Any

from eagle_gate.adapters.refusals import GateRefused
from eagle_gate.depths import depth_set

__all__ = ["GateDepths", "launch_args", "install"]

#: SGLang's worker module, whose logger announces every state switch.
_WORKER_LOGGER = "sglang.srt.speculative.eagle_worker_v2"
_SWITCH_LINE = "Switch adaptive runtime state"


class GateDepths:
    """Stands in for SGLang's ``AdaptiveSpeculativeParams`` (the
    ``AdaptiveSpecPolicy`` protocol of ``adaptive_runtime_state.py``): the
    depth for a batch is the gate's, and nothing SGLang observes moves it."""

    def __init__(self, depths: tuple[int, ...], configured: int) -> None:
        self.candidate_steps = list(depths)
        self.configured = configured
        #: the depth SGLang applies at the next decode step (set by the
        #: gate's worker wrapper before every SPEC step).
        self.depth = configured

    def set_cuda_graph_bs(self, cuda_graph_bs: Any) -> None:
        return None

    def get_steps_for_batch(self, batch_size: int) -> int:
        return self.depth

    def on_verify_complete(self, num_correct_drafts_per_req: Any, batch_size: int):
        return None  # SGLang never changes depth on its own

    def cuda_graph_bs_for_step(self, step: int) -> None:
        return None


class _DropSwitchLines(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(_SWITCH_LINE)


def launch_args(server_args: Any, setting: str) -> list[str]:
    """The SGLang flags that build a runtime state for each depth of
    ``setting`` (``--gate-depths``), judged on SGLang's resolution of
    ``server_args``; [] where there is nothing to choose. Raises GateRefused
    where SGLang cannot build them (its ``adaptive_unsupported_reason``, or the
    operator's own ``--speculative-adaptive``)."""
    from sglang.srt.speculative.adaptive_spec_params import (
        adaptive_unsupported_reason,
    )

    from eagle_gate.adapters.sglang_0_5_23.resolve import (
        resolve_spec,
        resolved_record,
    )

    spec = resolve_spec(server_args)
    if not spec.speculating:
        return []
    if spec.adaptive:
        raise GateRefused(
            f"--gate-depths {setting} with --speculative-adaptive: the gate writes "
            "SGLang's adaptive config itself (its depths, never SGLang's depth-0 "
            "verify); drop --speculative-adaptive and its config"
        )
    reason = adaptive_unsupported_reason(resolved_record(server_args))
    if reason is not None:
        raise GateRefused(
            f"--gate-depths {setting}: SGLang 0.5.23 cannot build per-depth runtime "
            f"states for this server ({reason}); use --gate-depths off"
        )
    depths = depth_set(setting, spec.num_steps or 1)
    if depths is None:
        return []
    folder = tempfile.mkdtemp(prefix="eagle_gate_depths_")
    path = os.path.join(folder, "adaptive.json")
    with open(path, "w") as f:
        json.dump({"1": {"candidate_steps": list(depths)}}, f)
    return ["--speculative-adaptive", "--speculative-adaptive-config", path]


def install(runtime: Any, scheduler: Any, setting: str) -> tuple[int, ...] | None:
    """Let ``runtime``'s policy choose the depths of ``setting`` on this
    scheduler's worker: checks that SGLang built a state of the right width
    for each, swaps the controller's policy object for :class:`GateDepths`
    and quiets SGLang's switch log. Returns the depths (None: binary).
    Raises GateRefused when SGLang built no such states."""
    configured = runtime.view.configured_depth
    depths = depth_set(setting, configured)
    if depths is None:
        return None
    worker = getattr(scheduler, "draft_worker", None)
    controller = getattr(worker, "adaptive_controller", None)
    states = getattr(controller, "_states", None)
    if controller is None or not isinstance(states, dict):
        raise GateRefused(
            f"--gate-depths {setting}: SGLang built no adaptive runtime states; "
            "launch with python -m eagle_gate.launch, which asks SGLang for them"
        )
    missing = [d for d in depths if d not in states]
    wrong = [
        d
        for d in depths
        if d in states and states[d].speculative_num_draft_tokens != d + 1
    ]
    if missing or wrong:
        raise GateRefused(
            f"--gate-depths {setting}: SGLang's runtime states lack depths {missing} "
            f"or verify another width at {wrong} (built: {sorted(states)})"
        )
    params = GateDepths(depths, configured)
    controller.params = params
    logging.getLogger(_WORKER_LOGGER).addFilter(_DropSwitchLines())
    runtime.enable_depths(depths, params)
    return depths
