"""Activation: the gate of one scheduler process, set up right after SGLang's
``Scheduler.__init__``.

:func:`activate_scheduler` judges what SGLang built (refusing what the gate
cannot gate), insists the patches are in place, builds the plain step and its
graphs, and calls :func:`activate`, which assembles the process's gate: the
runtime with everything it needs (decision log, TP agreements, runtime
control), Prometheus metrics where SGLang collects them, and the ops thread
that writes the status record. One log line says what the gate does here.
"""

from __future__ import annotations

import logging
import os
import tempfile
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from eagle_gate.adapters import parallel
from eagle_gate.adapters.hooks import ACTIVE
from eagle_gate.adapters.plain.capture import plain_graphs_for_scheduler
from eagle_gate.adapters.plain.graphs import PlainGraphs
from eagle_gate.adapters.plain.step import PlainStep
from eagle_gate.adapters.refusals import (
    check_built_worker,
    check_lazy_buffer,
)
from eagle_gate.adapters.resolved import ResolvedSpec, requested_from_environment
from eagle_gate.config import GateConfig, config_from_environment
from eagle_gate.control import ControlAgreement, ControlFile
from eagle_gate.counters import GateCounters
from eagle_gate.decision_log import DecisionLog
from eagle_gate.facts import ProcessFacts
from eagle_gate.metrics import GateMetrics, metrics_wanted
from eagle_gate.ops import OpsService, OpsSettings
from eagle_gate.runtime import GateRuntime
from eagle_gate.shadow import SHADOW_NOTE
from eagle_gate.statusdir import (
    LaunchInfo,
    StatusDir,
    ensure_private_dir,
    launch_from_environment,
)

if TYPE_CHECKING:
    from eagle_gate.adapters.protocol import SGLangAdapter

logger = logging.getLogger("eagle_gate")

__all__ = ["ProcessInfo", "activate", "activate_scheduler"]


@dataclass(frozen=True)
class ProcessInfo:
    """Who this scheduler process is, as the version's activation found it;
    :func:`activate` adds what it sets up and keeps it all, once, as the
    process's :class:`~eagle_gate.facts.ProcessFacts`."""

    adapter_name: str
    sglang_version: str
    tp_rank: int
    tp_size: int
    dp_rank: int | None
    #: tokens one SPEC step verifies per request (1 when not gated).
    num_draft_tokens: int
    speculative_algorithm: str | None
    #: the speculative setup as SGLang resolved it (status: "speculative").
    spec: ResolvedSpec | None = None
    #: the version fixes applied in this process (the adapter's ``fixes``).
    fixes: tuple[str, ...] = ()


def activate_scheduler(
    adapter: SGLangAdapter,
    scheduler: Any,
    *,
    tp_rank: int,
    tp_size: int,
    dp_rank: int | None,
    worker_hint: str,
    config: GateConfig | None = None,
) -> GateRuntime:
    """What every adapter's ``activate_in_scheduler`` does once it knows its
    ranks: judge the speculative setup, insist the patches are in place, then
    :func:`activate` with the adapter's plain step. ``worker_hint`` says why
    SGLang might have built another worker than EAGLEWorkerV2."""
    server_args = scheduler.server_args
    config = config or config_from_environment()
    spec = adapter.resolve_spec(server_args, requested_from_environment())
    gated, state = adapter.check_spec(
        spec,
        draft_sync=config.draft_sync if config.plain_step else None,
        depths=config.depths,
    )
    if gated:
        check_built_worker(getattr(scheduler, "draft_worker", None), spec, worker_hint)
        adapter.INSTRUMENTOR.require_applied()
        adapter.check_scheduler(scheduler, config)
    else:
        adapter.INSTRUMENTOR.require_applied(
            [adapter.SCHEDULER_MODULE, adapter.RESOLVER_MODULE]
        )
    if gated and config.plain_step and config.draft_sync == "lazy":
        check_lazy_buffer(scheduler, spec, config)
    dp_attention = gated and spec.attn_dp_size > 1
    graphs = plain_graphs_for_scheduler(
        adapter.graphs,
        scheduler,
        config,
        gated=gated,
        tp_rank=tp_rank,
        tp_size=tp_size,
        dp_attention=dp_attention,
    )
    plain = (
        adapter.plain.make_plain_step(config.draft_sync, graphs=graphs)
        if config.plain_step
        else None
    )
    process = ProcessInfo(
        adapter_name=adapter.NAME,
        sglang_version=adapter.SGLANG_VERSIONS[0],
        tp_rank=tp_rank,
        tp_size=tp_size,
        dp_rank=dp_rank,
        num_draft_tokens=(
            int(scheduler.draft_worker.speculative_num_draft_tokens) if gated else 1
        ),
        speculative_algorithm=spec.algorithm,
        spec=spec,
        fixes=tuple(_applied_fixes(adapter)),
    )
    runtime = activate(
        process,
        gated=gated,
        state=state,
        plain_step=plain,
        config=config,
        control_group=getattr(scheduler, "attn_tp_cpu_group", None),
        req_len=adapter.committed_len,
        plain_graphs=graphs,
    )
    if dp_attention:
        # the DP ranks vote on every step's mode (adapters/dp_vote.py)
        runtime.dp_vote = adapter.dp.VOTE
    return runtime


def activate(
    process: ProcessInfo,
    *,
    gated: bool,
    state: str,
    plain_step: PlainStep | None = None,
    config: GateConfig | None = None,
    control_group: Any = None,
    req_len: Any = None,
    plain_graphs: PlainGraphs | None = None,
) -> GateRuntime:
    """Create this process's gate, log it once, write its status record and
    start its ops thread (status, metrics, decision log, runtime control).

    ``control_group``: the scheduler's attention-TP CPU process group (the
    ranks that run the same decode batches), used with ``tp_size > 1`` to agree
    on runtime changes and timings; found through SGLang's parallel state when
    not given.
    """
    config = config or config_from_environment()
    settings = OpsSettings.from_environment()
    graphs = plain_graphs or PlainGraphs(setting=config.plain_graphs)
    launch, launch_id = _scheduler_launch(config)
    control_file = ControlFile(StatusDir(launch.status_dir), launch_id)
    on_tick, is_source, control_ok = _runtime_control(
        process, gated, control_file, launch_id, control_group
    )
    counters = GateCounters()
    graphs.on_path = counters.count_plain_path
    graphs.on_draft_extend = counters.count_draft_extend
    plain_mode = _plain_mode(plain_step, graphs, config)
    facts = ProcessFacts(
        adapter=process.adapter_name,
        sglang_version=process.sglang_version,
        tp_rank=process.tp_rank,
        tp_size=process.tp_size,
        num_draft_tokens=process.num_draft_tokens,
        plain_graphs=graphs.status(),
        state=state,
        dp_rank=process.dp_rank,
        speculative_algorithm=process.speculative_algorithm,
        speculative=_spec_status(process),
        plain_mode=plain_mode,
        draft_sync=config.draft_sync,
        launch_id=launch.launch_id,
        server_pid=launch.server_pid,
        fixes=tuple(process.fixes),
    )
    runtime = GateRuntime(
        config,
        config.create_policy(),
        facts=facts,
        plain_step=plain_step,
        settings=settings,
        req_len=req_len,
        counters=counters,
        on_tick=on_tick,
        agreement=(
            parallel.timing_agreement(control_group)
            if gated and process.tp_size > 1
            else None
        ),
        decision_log=_decision_log(facts, config),
    )
    if ACTIVE.ops is not None:
        ACTIVE.ops.stop()
    ACTIVE.runtime = runtime if gated else None
    ACTIVE.gate = runtime
    # OpsService() cannot fail; the status directory is opened on first use.
    ops = OpsService(
        runtime,
        launch.status_dir,
        gated=gated,
        settings=settings,
        metrics=_metrics(runtime, facts, gated, is_source),
        control_available=control_ok,
        control=control_file,
    )
    ACTIVE.ops = ops
    path = _start_ops(ops, launch.status_dir)
    logger.info(
        "eagle_gate active in scheduler pid %d (TP %d/%d): SGLang %s, adapter %s, "
        "policy %r %s%s, state: %s, %s, SGLang fixes: %s, status: %s",
        os.getpid(),
        process.tp_rank,
        process.tp_size,
        process.sglang_version,
        process.adapter_name,
        config.policy,
        config.settings,
        SHADOW_NOTE if config.shadow else "",
        state,
        plain_mode if gated else "plain step unused",
        ", ".join(process.fixes) or "none",
        path,
    )
    return runtime


def _spec_status(process: ProcessInfo) -> dict[str, Any] | None:
    """The status record's ``speculative``: SGLang's resolved setup, with its
    one-line description (None where activation had no server args)."""
    if process.spec is None:
        return None
    return {**process.spec.as_dict(), "describe": process.spec.describe()}


def _applied_fixes(adapter: SGLangAdapter) -> list[str]:
    """The version fixes the adapter applied in this process (its ``fixes``
    module; e.g. sglang_0_5_9/fixes.py, none on 0.5.23)."""
    return list(adapter.fixes.applied())


def _runtime_control(
    process: ProcessInfo,
    gated: bool,
    control_file: ControlFile,
    launch_id: str | None,
    control_group: Any,
) -> tuple[ControlAgreement | None, bool, bool]:
    """``(on_tick, is_source, available)``: the runtime's control hook (when
    gating with control on), whether this rank reads control requests and
    exports metrics, and whether control is on in this server at all."""
    broadcast, is_source, control_ok = None, process.tp_rank == 0, launch_id is not None
    if gated and process.tp_size > 1 and control_ok:
        try:
            broadcast, is_source = parallel.control_broadcast(control_group)
        except Exception as exc:
            control_ok = False
            logger.warning(
                "eagle_gate: runtime control is off in this server: no TP process "
                "group to agree on changes (%r)",
                exc,
            )
    on_tick = (
        ControlAgreement(control_file, is_source=is_source, broadcast=broadcast)
        if gated and control_ok
        else None
    )
    return on_tick, is_source, control_ok


def _decision_log(facts: ProcessFacts, config: GateConfig) -> DecisionLog | None:
    """The decision log when the environment asks for one, started with its
    header record; None otherwise or when it cannot be opened (ops never stop
    a scheduler)."""
    try:
        log = DecisionLog.from_environment()
    except Exception as exc:
        logger.error("eagle_gate: the decision log is off: %r", exc)
        return None
    if log is not None:
        log.start(
            {
                "pid": os.getpid(),
                "tp_rank": facts.tp_rank,
                "tp_size": facts.tp_size,
                "adapter": facts.adapter,
                "sglang_version": facts.sglang_version,
                "num_draft_tokens": facts.num_draft_tokens,
                "policy": config.policy,
                "settings": config.settings,
                "config_version": 0,
                "shadow": config.shadow,
            }
        )
    return log


def _metrics(
    runtime: GateRuntime, facts: ProcessFacts, gated: bool, is_source: bool
) -> GateMetrics | None:
    """Prometheus metrics, on the rank that exports them, where SGLang
    collects multiprocess metrics; None otherwise or if they cannot be made."""
    if not (is_source and metrics_wanted()):
        return None
    try:
        return GateMetrics(runtime, dp_rank=facts.dp_rank, gated=gated)
    except Exception as exc:
        logger.warning("eagle_gate: Prometheus metrics are off: %r", exc)
        return None


def _plain_mode(
    plain_step: PlainStep | None, graphs: PlainGraphs, config: GateConfig
) -> str:
    """How PLAIN decisions run here, in words (status and log)."""
    if plain_step is None:
        return "plain step off (PLAIN decisions run SPEC)"
    if graphs.captured:
        target = f"target decode CUDA graphs up to bs {graphs.max_bs}, eager above"
    else:
        why = graphs.reason
        target = "target eager, no decode CUDA graphs" + (f": {why}" if why else "")
    return f"plain step on ({target}; draft sync {config.draft_sync})"


def _start_ops(ops: OpsService, status_dir: Any) -> Any:
    """Write the first status record and start the ops thread; what the log
    line names as the status (the file, or why it is not written yet)."""
    try:
        path: Any = ops.write_status()
    except Exception as exc:  # the ops thread retries; decoding goes on
        ops.record_failure("status", exc)
        path = f"{status_dir} (not written yet: {exc})"
    try:
        ops.start()
    except Exception as exc:
        logger.error("eagle_gate: no ops thread (status, metrics): %r", exc)
    return path


def _scheduler_launch(config: GateConfig) -> tuple[LaunchInfo, str | None]:
    """This scheduler's launch (from its launcher, through the environment)
    and the launch id control requests must carry (None: control off).

    Without a launch in the environment (SGLang started without the gate's
    launcher or plugin in the launcher process) the status goes to a private
    directory of its own, named in the log line, and runtime control is off:
    no HTTP route would write for this process anyway. Only the environment
    decides, and it is the same on every TP rank, so control is on for all
    ranks of a group or for none (one without the other would wait forever in
    the control broadcast).
    """
    launch = launch_from_environment()
    if launch is not None:
        return launch, launch.launch_id
    try:
        if config.status_dir:
            path = str(ensure_private_dir(config.status_dir))
        else:
            path = tempfile.mkdtemp(prefix=f"eagle_gate-{os.getppid()}-")
    except Exception as exc:
        logger.error("eagle_gate: no status directory: %s", exc)
        path = os.path.join(tempfile.gettempdir(), "eagle_gate-unavailable")
    logger.warning(
        "eagle_gate: no launch in this process's environment (EAGLE_GATE_LAUNCH); "
        "status in %s, runtime control off",
        path,
    )
    return LaunchInfo("0" * 16, os.getppid(), path), None
