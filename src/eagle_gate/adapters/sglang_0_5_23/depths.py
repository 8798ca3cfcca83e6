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

What each depth costs is measured where SGLang builds its state: a wrapper
around ``EAGLEWorkerV2.build_adaptive_runtime_state`` (:data:`BUILD_TARGET`,
installed with the adapter's other wrappers) records, per depth, the build's
seconds, the device's free-memory drop (CUDA only), the verify and draft
graphs' share of it (SGLang's own per-phase graph-memory dicts) and the batch
sizes captured (:func:`measure_build`). It runs inside ``Scheduler.__init__``,
before the gate's activation, so it keeps its record on the worker and
:func:`install` hands it to the runtime (status ``depths.per_depth``).
Design note §1.4.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from collections.abc import Callable
from typing import Any

from eagle_gate.adapters.patching import PatchTarget
from eagle_gate.adapters.refusals import GateRefused
from eagle_gate.depth_stats import BUILT_ADAPTIVE
from eagle_gate.depths import depth_set

__all__ = [
    "BUILD_TARGET",
    "PATCHES",
    "DepthBuilds",
    "GateDepths",
    "install",
    "launch_args",
    "measure_build",
    "operators_depths",
    "operators_note",
]

#: SGLang builds one adaptive runtime state per candidate depth here.
BUILD_TARGET = PatchTarget(
    "sglang.srt.speculative.eagle_worker_v2",
    "EAGLEWorkerV2.build_adaptive_runtime_state",
    ("self", "speculative_num_steps", "speculative_num_draft_tokens", "cuda_graph_bs"),
)
#: the worker attribute that keeps its :class:`DepthBuilds` until install().
BUILDS_ATTR = "_eagle_gate_depth_builds"
#: SGLang's graph-memory dicts hold GiB (``get_available_gpu_memory``).
_MIB_PER_GIB = 1024.0

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


class DepthBuilds:
    """What building each depth's runtime state cost on one worker:
    ``costs[depth]`` (status keys of ``depths.per_depth``, see
    :mod:`eagle_gate.depth_stats`) and the measurements given up."""

    def __init__(self) -> None:
        self.costs: dict[int, dict[str, Any]] = {}
        self.errors = 0


#: measurements that failed before a worker's record could be found.
UNRECORDED_ERRORS = 0


def _builds_of(worker: Any) -> DepthBuilds:
    builds = getattr(worker, BUILDS_ATTR, None)
    if not isinstance(builds, DepthBuilds):
        builds = DepthBuilds()
        setattr(worker, BUILDS_ATTR, builds)
    return builds


def _free_bytes(worker: Any) -> int | None:
    """The device's free memory (after emptying torch's cache, as SGLang's
    own ``get_available_gpu_memory`` does next), None without CUDA (a CPU
    server on a machine with a GPU included: ``worker.device``)."""
    import torch

    if not str(getattr(worker, "device", "cuda")).startswith("cuda"):
        return None
    if not torch.cuda.is_available():
        return None
    device = getattr(worker, "gpu_id", None)
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info(device)
    return int(free)


def _graph_gib(worker: Any) -> tuple[float, float]:
    """SGLang's running totals of the target verify graphs' and the draft
    worker's own graphs' memory (GiB; 0 before any capture, and on CPU)."""
    verify = float(
        getattr(worker, "_additional_graph_memory_usage", {}).get("target_verify", 0)
    )
    draft = getattr(
        getattr(worker, "_draft_worker", None), "_specialized_graph_memory_usage", {}
    )
    return verify, float(sum(draft.values()))


def _capture_bs(runner: Any) -> list[int] | None:
    bs = getattr(runner, "capture_bs", None)
    return None if bs is None else [int(b) for b in bs]


def _build_wrapper(wrapped: Callable, instance: Any, args: tuple, kwargs: dict):
    """Around ``build_adaptive_runtime_state``: SGLang's build always runs
    and its state (or its exception) is what the caller gets; measuring is
    best effort (a failure is counted, the cost left out)."""
    global UNRECORDED_ERRORS
    worker = instance if instance is not None else (args[0] if args else None)
    try:
        bound = args if instance is not None else args[1:]
        depth = int(kwargs.get("speculative_num_steps", bound[0] if bound else 0))
        before = (time.perf_counter(), _free_bytes(worker), _graph_gib(worker))
    except Exception:
        before = None
    state = wrapped(*args, **kwargs)
    try:
        builds = _builds_of(worker)
    except Exception:
        UNRECORDED_ERRORS += 1
        return state
    try:
        if before is None:
            raise RuntimeError("nothing measured before the build")
        builds.costs[depth] = measure_build(worker, state, *before)
    except Exception:
        builds.errors += 1
    return state


def measure_build(
    worker: Any,
    state: Any,
    t0: float,
    free_before: int | None,
    graphs_before: tuple[float, float],
) -> dict[str, Any]:
    """One depth's build cost from what was read before it (``t0``,
    ``free_before``, ``graphs_before``: :func:`_graph_gib`) and now: seconds,
    MiB the device lost in all (None without CUDA), the verify and draft
    graphs' MiB (SGLang's dicts' growth), the rest (backends, workspaces),
    and the batch sizes the state's graphs captured (None: no graphs)."""
    capture_s = time.perf_counter() - t0
    free_after = _free_bytes(worker)
    verify, draft = _graph_gib(worker)
    mib_verify = (verify - graphs_before[0]) * _MIB_PER_GIB
    mib_draft = (draft - graphs_before[1]) * _MIB_PER_GIB
    total = (
        None
        if free_before is None or free_after is None
        else (free_before - free_after) / (1 << 20)
    )
    return {
        "built": BUILT_ADAPTIVE,
        "capture_s": capture_s,
        "mib_total": total,
        "mib_verify_graphs": mib_verify,
        "mib_draft_graphs": mib_draft,
        "mib_other": None if total is None else total - mib_verify - mib_draft,
        "verify_graph_bs": _capture_bs(getattr(state, "target_graph_runner", None)),
        "draft_extend_graph_bs": _capture_bs(
            getattr(state, "cuda_graph_runner_for_draft_extend", None)
        ),
    }


#: the adapter's wrappers for depths (``hooks.version_patches`` installs them).
PATCHES = ((BUILD_TARGET, _build_wrapper),)


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


def _built_states(scheduler: Any) -> tuple[Any, Any, dict | None]:
    """The worker, its ``AdaptiveController`` and the states SGLang built
    (None where SGLang runs no adaptive speculation)."""
    worker = getattr(scheduler, "draft_worker", None)
    controller = getattr(worker, "adaptive_controller", None)
    states = getattr(controller, "_states", None)
    return worker, controller, states if isinstance(states, dict) else None


def operators_depths(scheduler: Any) -> str | None:
    """Where the operator passed SGLang's own ``--speculative-adaptive`` (and
    SGLang kept it on), the depths SGLang built a state for, as a
    ``--gate-depths`` list: the gate chooses among them per batch instead of
    SGLang's batch-size tiers and EMA. Depth 0 is left out: SGLang's is a
    1-token verify plus a draft extend, the gate's PLAIN a true decode; its
    state stays built, never run. None: no adaptive speculation here."""
    _, _, states = _built_states(scheduler)
    if states is None:
        return None
    built = sorted(int(d) for d in states if int(d) >= 1)
    return ",".join(map(str, built)) if built else None


def operators_note(server_args: Any) -> str | None:
    """The launcher's line where the operator's own ``--speculative-adaptive``
    survives SGLang's resolution (None otherwise): which depths the gate will
    choose among."""
    from sglang.srt.speculative.adaptive_spec_params import (
        resolve_candidate_steps_from_config,
    )

    if not getattr(server_args, "speculative_adaptive", False):
        return None
    try:
        steps = resolve_candidate_steps_from_config(
            getattr(server_args, "speculative_adaptive_config", None)
        )
    except Exception as exc:  # SGLang raises its own error at startup
        return f"--speculative-adaptive: SGLang's candidate depths unknown ({exc!r})"
    chosen = sorted({int(d) for d in steps if int(d) >= 1})
    zero = (
        "; SGLang's depth 0 (a 1-token verify) is built but never run: PLAIN is "
        "the gate's true decode"
        if 0 in {int(d) for d in steps}
        else ""
    )
    return (
        "--speculative-adaptive: the gate chooses the draft depth per batch among "
        f"SGLang's candidates {chosen} and PLAIN, from its policy, instead of "
        f"SGLang's batch-size tiers{zero}"
    )


def install(
    runtime: Any, scheduler: Any, setting: str, *, operators: bool = False
) -> tuple[int, ...] | None:
    """Let ``runtime``'s policy choose the depths of ``setting`` on this
    scheduler's worker: checks that SGLang built a state of the right width
    for each, swaps the controller's policy object for :class:`GateDepths`
    and quiets SGLang's switch log. Returns the depths (None: binary).
    Raises GateRefused when SGLang built no such states. ``operators``: the
    states are the operator's own ``--speculative-adaptive``
    (:func:`operators_depths`); where they leave nothing to choose the
    controller is still taken over, pinned to the configured depth, so
    SGLang never moves on its own."""
    configured = runtime.view.configured_depth
    label = (
        f"--speculative-adaptive (depths {setting})"
        if operators
        else f"--gate-depths {setting}"
    )
    depths = depth_set(setting, configured)
    worker, controller, states = _built_states(scheduler)
    if depths is None:
        if operators and states is not None:
            controller.params = GateDepths((configured,), configured)
            logging.getLogger(_WORKER_LOGGER).addFilter(_DropSwitchLines())
        return None
    if states is None:
        raise GateRefused(
            f"{label}: SGLang built no adaptive runtime states; "
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
            f"{label}: SGLang's runtime states lack depths {missing} "
            f"or verify another width at {wrong} (built: {sorted(states)})"
        )
    params = GateDepths(depths, configured)
    controller.params = params
    logging.getLogger(_WORKER_LOGGER).addFilter(_DropSwitchLines())
    builds = getattr(worker, BUILDS_ATTR, None)
    if isinstance(builds, DepthBuilds):
        runtime.enable_depths(depths, params, builds.costs, builds.errors)
    else:  # the wrapper saw no build (or could not keep its record)
        runtime.enable_depths(depths, params, None, UNRECORDED_ERRORS)
    return depths
