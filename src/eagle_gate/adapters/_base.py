"""What every SGLang adapter shares: patch targets, wrapt instrumentation,
the two gate wrappers and per-process activation.

Version knowledge (module paths, signatures, argument names, how a version
builds its results) lives in one module per SGLang version family; this module
only holds the mechanism.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import wrapt

from eagle_gate.config import GateConfig, config_from_environment
from eagle_gate.metrics import GateMetrics, metrics_wanted
from eagle_gate.policy import Mode
from eagle_gate.runtime import GateRuntime

logger = logging.getLogger("eagle_gate")

__all__ = [
    "GatePatchError",
    "GateRefused",
    "PatchTarget",
    "Instrumentor",
    "ACTIVE",
]

#: attributes the worker wrapper sets on a result for the resolver wrapper.
RESULT_MODE_ATTR = "eagle_gate_mode"
RESULT_STEP_ATTR = "eagle_gate_step"


class GatePatchError(RuntimeError):
    """A patch target is missing or has an unexpected signature."""


class GateRefused(RuntimeError):
    """The server configuration is one the gate does not handle."""


@dataclass(frozen=True)
class PatchTarget:
    """A function or method the gate wraps, and the signature it expects."""

    module: str
    qualname: str
    #: the leading parameter names the adapter relies on, in order.
    params: tuple[str, ...]

    @property
    def dotted(self) -> str:
        return f"{self.module}.{self.qualname}"

    def owner_and_name(self, module: Any | None = None) -> tuple[Any, str]:
        if module is None:
            try:
                module = importlib.import_module(self.module)
            except Exception as exc:
                raise GatePatchError(
                    f"patch target {self.dotted}: module {self.module!r} does not "
                    f"import: {exc!r}"
                ) from exc
        owner: Any = module
        *path, name = self.qualname.split(".")
        for part in path:
            owner = getattr(owner, part, None)
            if owner is None:
                raise GatePatchError(
                    f"patch target {self.dotted}: {part!r} not found in {self.module}"
                )
        if name not in vars(owner) and not hasattr(owner, name):
            raise GatePatchError(f"patch target {self.dotted} does not exist")
        return owner, name

    def check(self, module: Any | None = None) -> None:
        """Raise GatePatchError unless the target exists with our signature."""
        owner, name = self.owner_and_name(module)
        func = inspect.getattr_static(owner, name)
        func = getattr(func, "__wrapped__", func)
        try:
            params = tuple(inspect.signature(func).parameters)
        except (TypeError, ValueError) as exc:
            raise GatePatchError(f"patch target {self.dotted}: {exc}") from exc
        if params[: len(self.params)] != self.params:
            raise GatePatchError(
                f"patch target {self.dotted} has parameters {params}; "
                f"eagle_gate expects them to start with {self.params}"
            )


class _GateWrapper(wrapt.FunctionWrapper):
    """Marks wrappers installed by eagle_gate (idempotence, removal)."""


class Instrumentor:
    """Installs wrapt wrappers when their target modules are imported.

    Modelled on OpenTelemetry's instrumentors: ``instrument()`` registers
    post-import hooks (applied at once for modules already imported) and is
    idempotent; ``uninstrument()`` restores the original functions.
    """

    def __init__(self, patches: Sequence[tuple[PatchTarget, Callable]]) -> None:
        self.patches = tuple(patches)
        self._enabled = False
        self._hooks_registered = False
        self._applied: dict[str, tuple[Any, str, Any]] = {}

    @property
    def is_instrumented(self) -> bool:
        return self._enabled

    def applied(self) -> list[str]:
        return sorted(self._applied)

    def instrument(self) -> None:
        if self._enabled:
            return
        self._enabled = True
        if not self._hooks_registered:
            self._hooks_registered = True
            for target, wrapper in self.patches:
                wrapt.register_post_import_hook(
                    self._hook(target, wrapper), target.module
                )
        else:  # re-instrument after uninstrument: modules already imported
            for target, wrapper in self.patches:
                if target.module in sys.modules:
                    self._apply(target, wrapper, sys.modules[target.module])

    def _hook(self, target: PatchTarget, wrapper: Callable) -> Callable[[Any], None]:
        def on_import(module: Any) -> None:
            if self._enabled:
                self._apply(target, wrapper, module)

        return on_import

    def _apply(self, target: PatchTarget, wrapper: Callable, module: Any) -> None:
        target.check(module)
        owner, name = target.owner_and_name(module)
        current = vars(owner).get(name)
        if isinstance(current, _GateWrapper):
            self._applied.setdefault(target.dotted, (owner, name, current.__wrapped__))
            return
        if current is None:
            raise GatePatchError(
                f"patch target {target.dotted} is inherited, not defined on "
                f"{owner.__name__}; eagle_gate will not patch a base class by accident"
            )
        setattr(owner, name, _GateWrapper(current, wrapper))
        self._applied[target.dotted] = (owner, name, current)

    def uninstrument(self) -> None:
        self._enabled = False
        for owner, name, original in self._applied.values():
            if isinstance(vars(owner).get(name), _GateWrapper):
                setattr(owner, name, original)
        self._applied.clear()

    def require_applied(self, modules: Sequence[str] | None = None) -> None:
        """Import the target modules (all, or those named) and insist that
        every wrapper in them is in place; raise GatePatchError naming the
        first target that is not."""
        for target, wrapper in self.patches:
            if modules is not None and target.module not in modules:
                continue
            module = importlib.import_module(target.module)
            if target.dotted not in self._applied:
                # The hook did not run (instrument() not called): apply now.
                if not self._enabled:
                    raise GatePatchError(
                        f"eagle_gate is not instrumented; {target.dotted} unpatched"
                    )
                self._apply(target, wrapper, module)


class _Active:
    """The gate of this process (one per scheduler process)."""

    #: the runtime the wrappers use: None unless the gate is gating (idle
    #: servers and other processes: the wrappers pass everything through).
    runtime: GateRuntime | None = None
    #: this process's runtime whether gating or idle (status, metrics, control).
    gate: GateRuntime | None = None
    #: the ops thread of this process (eagle_gate.ops.OpsService), if active.
    ops: Any = None
    #: the plain-step function of the active adapter, if it has one.
    plain_step: PlainStep | None = None
    internal_errors = 0


ACTIVE = _Active()


def _batch_arg(args: tuple, kwargs: dict, name: str, instance: Any) -> Any:
    # See resolver_wrapper for why ``instance is None`` shifts the position.
    return kwargs[name] if name in kwargs else args[instance is None]


def make_worker_wrapper(batch_param: str) -> Callable:
    """The wrapper around ``EAGLEWorkerV2.forward_batch_generation``.

    Decode batches go through the policy; everything else passes untouched.
    Any failure of the gate's own logic runs the stock step (never a crash).
    """

    def forward_batch_generation(wrapped, instance, args, kwargs):
        runtime = ACTIVE.runtime
        if runtime is None:
            return wrapped(*args, **kwargs)
        try:
            batch = _batch_arg(args, kwargs, batch_param, instance)
            fm = batch.forward_mode
            decode = not (fm.is_extend() or batch.is_extend_in_batch or fm.is_idle())
            if not decode and not fm.is_idle():
                runtime.note_non_decode_batch()
        except Exception as exc:
            _internal_error("inspecting the batch", exc)
            return wrapped(*args, **kwargs)
        if not decode:
            return wrapped(*args, **kwargs)
        try:
            # 0.5.23 may leave seq_lens_cpu / seq_lens_sum None (backends
            # without CPU lengths, after filter/merge): the view then sums
            # seq_lens_cpu or estimates from reqs, only if a policy reads it.
            mode, step = runtime.decide(
                batch.seq_lens.shape[0],
                batch.seq_lens_sum,
                batch.seq_lens_cpu,
                getattr(batch, "reqs", None),
            )
            plain = ACTIVE.plain_step
            if mode is Mode.PLAIN and plain is not None:
                reason = plain.blocker(batch)
                if reason is not None:
                    runtime.count_override(reason)
                    mode = Mode.SPEC
        except Exception as exc:
            _internal_error("deciding", exc)
            return wrapped(*args, **kwargs)
        if mode is Mode.PLAIN and plain is not None:
            # A failing plain step runs SGLang's stock step instead (counted;
            # repeated failures degrade the gate to stock for the rest of the run).
            # Everything SGLang passed goes on, keywords included: 0.5.23's
            # scheduler hands ``on_publish=`` (overlap scheduling) by keyword.
            result, mode = runtime.run_plain_step(
                plain.run, (instance, *args), kwargs, wrapped, args, kwargs
            )
        else:
            mode = Mode.SPEC
            if plain is not None and plain.before_spec is not None:
                try:
                    plain.before_spec(instance, batch)
                except Exception as exc:  # the draft stays stale; outputs do not
                    _internal_error("catching the draft up", exc)
            result = wrapped(*args, **kwargs)
        setattr(result, RESULT_MODE_ATTR, mode)
        setattr(result, RESULT_STEP_ATTR, step)
        return result

    return forward_batch_generation


def resolver_wrapper(wrapped, instance, args, kwargs):
    """The wrapper around the scheduler's spec-v2 result resolver."""
    tokens = wrapped(*args, **kwargs)
    runtime = ACTIVE.runtime
    if runtime is None:
        return tokens
    # Called on an instance, args are (result, batch); called through the
    # class with the instance first (wrapt passes instance=None), one later.
    result = kwargs["result"] if "result" in kwargs else args[instance is None]
    mode = getattr(result, RESULT_MODE_ATTR, None)
    if mode is None:
        return tokens
    try:
        runtime.observe(
            mode, getattr(result, RESULT_STEP_ATTR), [len(t) for t in tokens]
        )
    except Exception as exc:
        _internal_error("observing", exc)
    return tokens


def _internal_error(what: str, exc: BaseException) -> None:
    ACTIVE.internal_errors += 1
    if ACTIVE.internal_errors == 1 or ACTIVE.internal_errors % 1000 == 0:
        logger.exception(
            "eagle_gate: internal error while %s (%d so far); this step runs "
            "SGLang's stock path",
            what,
            ACTIVE.internal_errors,
            exc_info=exc,
        )


def activate(
    *,
    adapter_name: str,
    sglang_version: str,
    gated: bool,
    state: str,
    tp_rank: int,
    tp_size: int,
    dp_rank: int | None,
    num_draft_tokens: int,
    speculative_algorithm: str | None,
    plain_step: PlainStep | None = None,
    config: GateConfig | None = None,
    control_group: Any = None,
    req_len: Callable[[Any], int] | None = None,
    plain_graphs: PlainGraphs | None = None,
) -> GateRuntime:
    """Create this process's gate, log it once, write its status record and
    start its ops thread (status, metrics, decision log, runtime control).

    ``control_group``: the scheduler's attention-TP CPU process group (the
    ranks that run the same decode batches), used with ``tp_size > 1`` to agree
    on runtime changes; found through SGLang's parallel state when not given.
    """
    from eagle_gate.decision_log import DecisionLog
    from eagle_gate.ops import OpsService, OpsSettings

    config = config or config_from_environment()
    settings = OpsSettings.from_environment()
    runtime = GateRuntime(
        config,
        config.create_policy(),
        sglang_version=sglang_version,
        adapter=adapter_name,
        tp_rank=tp_rank,
        tp_size=tp_size,
        num_draft_tokens=num_draft_tokens,
        plain_step_available=plain_step is not None,
        tick_every=settings.tick_every,
        decide_budget_s=settings.decide_budget_s,
        plain_failures_to_degrade=settings.plain_failures_to_degrade,
        req_len=req_len,
    )
    if ACTIVE.ops is not None:
        ACTIVE.ops.stop()
    ACTIVE.runtime = runtime if gated else None
    ACTIVE.gate = runtime
    ACTIVE.plain_step = plain_step
    if plain_graphs is not None:
        runtime.plain_graphs = plain_graphs.status()
        plain_graphs.on_path = runtime.count_plain_path
        plain_graphs.on_draft_extend = runtime.count_draft_extend
    if plain_graphs is not None and plain_graphs.captured:
        target = (
            f"target decode CUDA graphs up to bs {plain_graphs.max_bs}, eager above"
        )
    else:
        why = plain_graphs.reason if plain_graphs is not None else None
        target = "target eager, no decode CUDA graphs" + (f": {why}" if why else "")
    plain_mode = (
        f"plain step on ({target}; draft sync {config.draft_sync})"
        if plain_step is not None
        else "plain step off (PLAIN decisions run SPEC)"
    )
    extra = {
        "state": state,
        "dp_rank": dp_rank,
        "speculative_algorithm": speculative_algorithm,
        "plain_step": plain_mode,
        "draft_sync": config.draft_sync,
    }
    launch, control_id = _scheduler_launch(config)
    extra.update(launch_id=launch.launch_id, server_pid=launch.server_pid)
    # is_source: reads control requests (gating) and exports metrics.
    broadcast, is_source, control_ok = None, tp_rank == 0, control_id is not None
    if gated and tp_size > 1 and control_ok:
        try:
            broadcast, is_source = _control_broadcast(control_group)
        except Exception as exc:
            control_ok = False
            logger.warning(
                "eagle_gate: runtime control is off in this server: no TP process "
                "group to agree on changes (%r)",
                exc,
            )
    if gated and tp_size > 1:
        runtime.agreement = _timing_agreement(control_group)
    metrics = None
    if is_source and metrics_wanted():
        try:
            metrics = GateMetrics(runtime, dp_rank=dp_rank, gated=gated)
        except Exception as exc:
            logger.warning("eagle_gate: Prometheus metrics are off: %r", exc)
    try:
        runtime.decision_log = DecisionLog.from_environment()
    except Exception as exc:  # ops never stop a scheduler
        logger.error("eagle_gate: the decision log is off: %r", exc)
    if runtime.decision_log is not None:
        runtime.decision_log.start(
            {
                "pid": os.getpid(),
                "tp_rank": tp_rank,
                "tp_size": tp_size,
                "adapter": adapter_name,
                "sglang_version": sglang_version,
                "num_draft_tokens": num_draft_tokens,
                "policy": config.policy,
                "settings": config.settings,
                "config_version": 0,
                "shadow": config.shadow,
            }
        )
    # OpsService() cannot fail; it sets the control hook on every rank alike.
    ops = OpsService(
        runtime,
        launch.status_dir,
        extra,
        gated=gated,
        settings=settings,
        metrics=metrics,
        control_broadcast=broadcast,
        control_source=is_source,
        control_available=control_ok,
        launch_id=control_id,
    )
    ACTIVE.ops = ops
    try:
        path: Any = ops.write_status()
    except Exception as exc:  # the ops thread retries; decoding goes on
        ops.record_failure("status", exc)
        path = f"{launch.status_dir} (not written yet: {exc})"
    try:
        ops.start()
    except Exception as exc:
        logger.error("eagle_gate: no ops thread (status, metrics): %r", exc)
    logger.info(
        "eagle_gate active in scheduler pid %d (TP %d/%d): SGLang %s, adapter %s, "
        "policy %r %s%s, state: %s, %s, status: %s",
        os.getpid(),
        tp_rank,
        tp_size,
        sglang_version,
        adapter_name,
        config.policy,
        config.settings,
        " in SHADOW mode (every step runs SGLang's stock step)"
        if config.shadow
        else "",
        state,
        plain_mode if gated else "plain step unused",
        path,
    )
    return runtime


def _scheduler_launch(config: GateConfig) -> tuple[Any, str | None]:
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
    from eagle_gate.statusdir import (
        LaunchInfo,
        ensure_private_dir,
        launch_from_environment,
    )

    launch = launch_from_environment()
    if launch is not None:
        return launch, launch.launch_id
    import tempfile

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


def _timing_agreement(group: Any):
    """Agreement on timings over the attention-TP CPU group (see
    eagle_gate.agreement); without a group, outcomes carry no timings."""
    from eagle_gate.agreement import TimingAgreement, torch_timing_broadcast

    try:
        return TimingAgreement(torch_timing_broadcast(_tp_cpu_group(group)))
    except Exception as exc:
        logger.warning(
            "eagle_gate: no TP process group to agree on step timings (%r); "
            "policies get no step intervals in this server",
            exc,
        )
        return TimingAgreement(None)


def _tp_cpu_group(group: Any) -> Any:
    if group is not None:
        return group
    try:
        from sglang.srt.runtime_context import get_parallel

        return get_parallel().attn_tp_group.cpu_group
    except Exception:
        from sglang.srt.layers.dp_attention import get_attention_tp_group

        return get_attention_tp_group().cpu_group


def _control_broadcast(group: Any) -> tuple[Any, bool]:
    """A TP broadcast for runtime control, and whether this rank is its source.

    ``group`` defaults to the attention-TP CPU group of SGLang's parallel state
    (0.5.23: ``runtime_context.get_parallel().attn_tp_group``; 0.5.9:
    ``layers.dp_attention.get_attention_tp_group()``), the same group as
    ``Scheduler.attn_tp_cpu_group``.
    """
    import torch.distributed as dist

    from eagle_gate.control import torch_broadcast

    group = _tp_cpu_group(group)
    return torch_broadcast(group), dist.get_rank(group) == 0


def scheduler_init_wrapper(activate_in_scheduler: Callable[[Any], Any]) -> Callable:
    """The wrapper around ``Scheduler.__init__``: SGLang's own init, then the
    gate's activation in this scheduler process (which may refuse the setup)."""

    def init(wrapped, instance, args, kwargs):
        wrapped(*args, **kwargs)
        activate_in_scheduler(instance)

    return init


def activate_scheduler(
    adapter: Any,
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
    gated, state = adapter.check_server_args(
        server_args, draft_sync=config.draft_sync if config.plain_step else None
    )
    if gated:
        from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

        worker = getattr(scheduler, "draft_worker", None)
        if not isinstance(worker, EAGLEWorkerV2):
            raise GateRefused(
                f"SGLang built {type(worker).__name__}, not EAGLEWorkerV2; "
                f"{worker_hint}"
            )
        adapter.INSTRUMENTOR.require_applied()
        check_scheduler = getattr(adapter, "check_scheduler", None)
        if check_scheduler is not None:
            check_scheduler(scheduler, config)
    else:
        adapter.INSTRUMENTOR.require_applied(
            [adapter.SCHEDULER_MODULE, adapter.RESOLVER_MODULE]
        )
    if gated and config.plain_step and config.draft_sync == "lazy":
        check_lazy_buffer(scheduler, server_args, config)
    graphs = plain_graphs_for_scheduler(
        adapter, scheduler, config, gated=gated, tp_rank=tp_rank, tp_size=tp_size
    )
    plain = (
        adapter.make_plain_step(config.draft_sync, graphs=graphs)
        if config.plain_step
        else None
    )
    return activate(
        adapter_name=adapter.NAME,
        sglang_version=adapter.SGLANG_VERSIONS[0],
        gated=gated,
        state=state,
        tp_rank=tp_rank,
        tp_size=tp_size,
        dp_rank=dp_rank,
        num_draft_tokens=(
            int(scheduler.draft_worker.speculative_num_draft_tokens) if gated else 1
        ),
        speculative_algorithm=getattr(server_args, "speculative_algorithm", None),
        plain_step=plain,
        config=config,
        control_group=getattr(scheduler, "attn_tp_cpu_group", None),
        req_len=adapter.committed_len,
        plain_graphs=graphs,
    )


def lazy_buffer_bytes(rows: int, width: int, hidden: int, dtype_bytes: int) -> int:
    """Bytes of the lazy draft-sync ring: hidden rows plus int64 tokens."""
    return rows * width * (hidden * dtype_bytes + 8)


def check_lazy_buffer(scheduler: Any, server_args: Any, config: GateConfig) -> int:
    """Report the lazy buffer's size at start and refuse it above the bound.

    The width the draft's hidden input has is the target's hidden size, three
    times it for EAGLE3 (its auxiliary layers), or the model config's
    ``spec_hidden_size`` where the version has one.
    """
    worker = scheduler.draft_worker
    rows = int(worker.req_to_token_pool.req_to_token.shape[0])
    width = int(worker.speculative_num_draft_tokens)
    model_config = worker.target_worker.model_config
    hidden = getattr(model_config, "spec_hidden_size", None)
    if not hidden:
        aux = 3 if str(server_args.speculative_algorithm).upper() == "EAGLE3" else 1
        hidden = aux * int(model_config.hidden_size)
    dtype_bytes = getattr(model_config.dtype, "itemsize", 2)
    size = lazy_buffer_bytes(rows, width, int(hidden), int(dtype_bytes))
    bound = config.lazy_max_mib * 2**20
    logger.info(
        "eagle_gate: lazy draft sync will keep %d request slots x %d positions x "
        "%d hidden: %.1f MiB (bound %d MiB)",
        rows,
        width,
        hidden,
        size / 2**20,
        config.lazy_max_mib,
    )
    if size > bound:
        raise GateRefused(
            f"lazy draft sync needs {size / 2**20:.0f} MiB for its buffer, above "
            f"lazy_max_mib={config.lazy_max_mib}; raise --gate-lazy-max-mib or "
            "use --gate-draft-sync eager"
        )
    return size


def common_plain_blocker(batch: Any) -> str | None:
    """The reasons both versions share for running SPEC instead of a plain
    step: what a server without speculation would sample differently or
    return more of. CPU-side fields only: no device synchronisation."""
    if getattr(batch, "return_logprob", False):
        return "logprobs"
    if getattr(batch, "has_grammar", False):
        return "grammar"
    if getattr(batch, "return_hidden_states", False):
        return "return_hidden_states"
    sampling = getattr(batch, "sampling_info", None)
    if sampling is not None:
        orchestrator = getattr(sampling, "penalizer_orchestrator", None)
        if orchestrator is not None and getattr(orchestrator, "is_required", False):
            return "penalties"
        if getattr(sampling, "has_custom_logit_processor", False):
            return "custom_logit_processor"
    return None


#: why data-parallel attention is refused (both versions).
DP_ATTENTION_REFUSAL = (
    "data-parallel attention (--enable-dp-attention / --attn-dp-size > 1) is not "
    "handled by eagle_gate: DP ranks exchange token counts every step for their "
    "MLP sync, and a PLAIN step's count (batch size) differs from a SPEC or idle "
    "rank's (batch size x draft tokens), so ranks would hang in a collective or "
    "mix activations. Launch without data-parallel attention, or without "
    "eagle_gate"
)
#: why pipeline parallelism is refused (both versions).
PP_REFUSAL = (
    "pipeline parallelism (--pp-size > 1) is not handled by eagle_gate: SGLang "
    "pre-builds each round's verify input on the earlier stages, so the gate "
    "could only ever run SPEC there; it refuses rather than sit idle while "
    "looking active. Launch without eagle_gate for pipeline-parallel serving"
)


def check_speculation(
    server_args: Any,
    *,
    extra_refusals: Sequence[tuple[str, str]] = (),
    attn_dp_size: int = 1,
    pp_size: int = 1,
    rejection_sampling: bool = False,
    draft_sync: str | None = None,
) -> tuple[bool, str]:
    """Decide what the gate does with this server's speculative settings.

    Returns ``(gated, state)``. Raises GateRefused for speculative setups the
    gate does not handle in any SGLang version (other algorithms, multi-layer
    EAGLE, a draft tree wider than topk 1, data-parallel attention, pipeline
    parallelism, rejection sampling without eager draft sync), because passing
    them through silently would leave an operator believing the gate is at
    work, or would break the server. ``extra_refusals`` are a version's own
    ``(server_args attribute, reason)`` pairs, refused when truthy; the
    version also says what it resolved for ``attn_dp_size``, ``pp_size`` and
    ``rejection_sampling``. ``draft_sync``: the gate's setting (None: not
    known here, checked later).
    """
    algorithm = getattr(server_args, "speculative_algorithm", None)
    if algorithm is None or str(algorithm).upper() == "NONE":
        return False, "idle: speculation is off, every step is SGLang's own"
    name = str(algorithm).upper()
    if name not in {"EAGLE", "EAGLE3"}:
        raise GateRefused(
            f"--speculative-algorithm {algorithm} is not handled by eagle_gate; "
            "supported: EAGLE, EAGLE3 (or no speculation). Launch without "
            "eagle_gate to use it."
        )
    refusals = (
        (
            "enable_multi_layer_eagle",
            "--enable-multi-layer-eagle is not handled by eagle_gate",
        ),
        *extra_refusals,
    )
    for attribute, reason in refusals:
        if getattr(server_args, attribute, None):
            raise GateRefused(reason)
    if getattr(server_args, "enable_dp_attention", False) or (attn_dp_size or 1) > 1:
        raise GateRefused(DP_ATTENTION_REFUSAL)
    if (pp_size or 1) > 1:
        raise GateRefused(PP_REFUSAL)
    if rejection_sampling and draft_sync not in (None, "eager"):
        raise GateRefused(
            f"--gate-draft-sync {draft_sync} with rejection sampling "
            "(--speculative-use-rejection-sampling, SGLang's default for EAGLE on "
            "ROCm) is refused: a plain step that skips the draft leaves the draft "
            "distribution (draft_probs) stale, and the next verify would accept "
            "tokens against a q that did not propose them, biasing the output. "
            "Use --gate-draft-sync eager (the default), which keeps it exact"
        )
    topk = getattr(server_args, "speculative_eagle_topk", None)
    if topk not in (None, 1):
        raise GateRefused(
            f"--speculative-eagle-topk {topk} is not handled by eagle_gate: the "
            "plain step and the spec-v2 path it joins need a chain of drafts; use "
            "--speculative-eagle-topk 1"
        )
    return True, f"gating {name}"


def flat_plain_tokens(next_token_ids: Any, stride: int) -> tuple[Any, Any]:
    """One token per request -> (flat ``bs*stride`` int32 tokens, int32 ones).

    The flat speculative layout every spec-v2 resolver reads: request i's token
    at ``i * stride``; the other slots are padding the resolver never reads
    because every accept length is 1.
    """
    import torch

    flat = spread_rows(next_token_ids.to(torch.int32), stride)
    ones = torch.ones(next_token_ids.shape[0], dtype=torch.int32, device=flat.device)
    return flat, ones


#: the batch fields a plain step rebinds (the versions' union).
PLAIN_STEP_FIELDS = (
    "input_ids",
    "out_cache_loc",
    "seq_lens",
    "seq_lens_cpu",
    "seq_lens_sum",
    "spec_info",
    "forward_mode",
    "capture_hidden_mode",
)


class PlainStep:
    """A version's plain step: ``blocker(batch)`` says why a batch cannot take
    it (or None), ``run(worker, batch, ...)`` runs it and returns the result.

    If the step raises, the batch fields it rebinds are put back before the
    exception leaves, so the stock speculative step that then runs instead
    (see ``GateRuntime.run_plain_step``) sees the batch SGLang handed over.

    With lazy draft sync, ``before_spec(worker, batch)`` catches the draft up
    before a SPEC step, through the version's ``draft_extend(worker, batch,
    result)`` and an empty draft input from ``new_draft_input()``.
    """

    def __init__(
        self,
        run: Callable[..., Any],
        blocker: Callable[[Any], str | None],
        *,
        lazy: LazyDraftSync | None = None,
        draft_extend: Callable[[Any, Any, Any], None] | None = None,
        new_draft_input: Callable[[], Any] | None = None,
    ) -> None:
        self._run = run
        self.blocker = blocker
        #: the lazy draft-sync buffer, when draft_sync is "lazy".
        self.lazy = lazy
        self._draft_extend = draft_extend
        self._new_draft_input = new_draft_input
        #: runs before a SPEC step of a decode batch (lazy draft catch-up).
        self.before_spec = self._catch_up if lazy is not None else None

    def _catch_up(self, worker: Any, batch: Any) -> bool:
        return self.lazy.catch_up(
            worker, batch, self._draft_extend, self._new_draft_input
        )

    def run(self, worker: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
        saved = [(name, getattr(batch, name, None)) for name in PLAIN_STEP_FIELDS]
        try:
            return self._run(worker, batch, *args, **kwargs)
        except BaseException:
            for name, value in saved:
                setattr(batch, name, value)
            raise


def kv_slots(req_to_token: Any, req_pool_indices: Any, start: Any, width: int):
    """KV slot ids of positions ``start .. start+width-1`` of each request,
    flattened request-major (int64). Pure tensor ops: no device sync."""
    import torch

    offsets = torch.arange(width, device=start.device, dtype=start.dtype)
    cols = start[:, None] + offsets[None, :]
    return req_to_token[req_pool_indices[:, None], cols].reshape(-1).to(torch.int64)


def spread_rows(rows: Any, stride: int):
    """``[bs, ...]`` -> ``[bs*stride, ...]`` with row i at ``i*stride``, zeros
    elsewhere: a plain step's per-request tensors in the flat verify layout."""
    import torch

    out = torch.zeros(
        (rows.shape[0] * stride, *rows.shape[1:]), dtype=rows.dtype, device=rows.device
    )
    out[::stride] = rows
    return out


class eager_target:
    """Run the target without its CUDA graphs for one forward.

    With speculation on, the target's graphs are captured for TARGET_VERIFY
    and their ``can_run`` checks do not look at the forward mode, so a DECODE
    forward of a captured batch size would replay the verify graph with the
    wrong layout. ``attribute``: where the version keeps that graph runner.
    """

    def __init__(self, model_runner: Any, attribute: str = "graph_runner") -> None:
        self.model_runner = model_runner
        self.attribute = attribute

    def __enter__(self) -> None:
        self.saved = getattr(self.model_runner, self.attribute)
        setattr(self.model_runner, self.attribute, None)

    def __exit__(self, *exc: Any) -> None:
        setattr(self.model_runner, self.attribute, self.saved)


# -- plain-step CUDA graphs (docs/plain-graphs.md) ---------------------------
#: headroom needed before capture: this many times the estimate (§5.3).
PLAIN_GRAPHS_HEADROOM = 1.25
#: bytes of attention-backend graph state per (batch slot x context token), an
#: upper bound over the backends of docs/plain-graphs.md §5.5 (FA3's four page
#: tables at page size 1: 16 bytes).
PLAIN_BACKEND_BYTES_PER_SLOT_TOKEN = 16


@dataclass
class PlainGraphs:
    """The plain step's DECODE CUDA-graph set of one scheduler process (one TP
    rank): a second target attention backend and a DECODE graph runner bound
    to it, or the reason there is none (then plain steps run eagerly)."""

    setting: str = "auto"
    #: "captured", "off" (never tried) or "failed" (tried, dropped).
    state: str = "off"
    reason: str | None = None
    backend: Any = None
    runner: Any = None
    capture_bs: tuple[int, ...] = ()
    max_bs: int = 0
    disable_padding: bool = False
    backend_mib: float | None = None
    graphs_mib: float | None = None
    total_mib: float | None = None
    capture_s: float | None = None
    attention_backend: str | None = None
    #: called with ``(path, reason)`` for every plain step; the runtime's
    #: ``count_plain_path`` once the gate is active.
    on_path: Callable[[str, str | None], None] | None = None
    #: called with the path ("graph" or "eager") of every draft extend the
    #: plain step runs (eager sync, lazy catch-up); the runtime's
    #: ``count_draft_extend`` once the gate is active.
    on_draft_extend: Callable[[str], None] | None = None
    #: checks a test build recorded (CI's ``EAGLE_GATE_CI_PLAIN_GRAPHS``);
    #: None otherwise.
    report: dict[str, Any] | None = None

    @property
    def captured(self) -> bool:
        return self.state == "captured" and self.runner is not None

    def count(self, path: str, reason: str | None = None) -> None:
        if self.on_path is not None:
            self.on_path(path, reason)

    def count_draft_extend(self, path: str) -> None:
        if self.on_draft_extend is not None:
            self.on_draft_extend(path)

    def status(self) -> dict[str, Any]:
        """The ``plain_graphs`` block of the gate's status (JSON-able)."""
        return {
            "setting": self.setting,
            "state": self.state,
            "reason": self.reason,
            "capture_bs": list(self.capture_bs),
            "max_bs": self.max_bs,
            "disable_padding": self.disable_padding,
            "memory_mib": self.total_mib,
            "backend_mib": self.backend_mib,
            "graphs_mib": self.graphs_mib,
            "capture_s": self.capture_s,
            "attention_backend": self.attention_backend,
            "report": self.report,
        }


def select_plain_path(graphs: PlainGraphs | None, bs: int) -> tuple[str, str | None]:
    """``("graph", None)`` when a plain step of ``bs`` requests can replay the
    plain DECODE graphs, else ``("eager", reason)`` with the first reason that
    applies (CPU fields only: no device synchronisation)."""
    if graphs is None or not graphs.captured:
        return "eager", "graphs_off"
    if bs > graphs.max_bs:
        return "eager", "bs_above_max"
    if graphs.disable_padding and bs not in graphs.capture_bs:
        return "eager", "bs_not_captured"
    return "graph", None


def draft_extend_path(runner: Any, bs: int, *, mlp_sync_ok: bool = True) -> str:
    """``"graph"`` when SGLang's ``_draft_extend_for_decode`` will replay its
    own draft-extend CUDA graph for a batch of ``bs`` requests, else
    ``"eager"`` (docs/plain-graphs.md §2.5, §3.6, §5.7).

    ``runner``: the draft worker's ``cuda_graph_runner_for_draft_extend``
    (None where SGLang captured none: CPU, graphs disabled, a draft backend
    without draft-extend graphs). The test is the one SGLang's ``can_run``
    (0.5.9) and ``can_run_graph`` (0.5.23) apply on a server without DP
    attention (the gate refuses DP attention): ``bs <= max_bs``, or, with
    ``--disable-cuda-graph-padding``, ``bs`` among the captured sizes; where
    the runner needs MLP sync, also the batch's own graph flag
    (``mlp_sync_ok``, which the version's adapter reads). What only one
    version checks (0.5.23's capture width) is the adapter's to add.

    A prediction for status and metrics, so it reads CPU-side integers only
    (no device synchronisation) and never raises: anything it cannot read
    counts as "eager".
    """
    if runner is None:
        return "eager"
    try:
        if runner.disable_padding:
            fits = bs in runner.capture_bs
        else:
            fits = bs <= runner.max_bs
        if fits and runner.require_mlp_sync:
            fits = mlp_sync_ok
        return "graph" if fits else "eager"
    except Exception:
        return "eager"


_MISSING = object()


_PLAIN_DECODE_PINS: Any = None


def plain_decode_pins() -> type:
    """A mixin for SGLang's decode graph runners (both versions) that pins
    what their constructors set for a speculative target: DECODE instead of
    TARGET_VERIFY, a hidden-state capture of at least LAST (a LAST graph
    serves NULL and LAST requests; FULL never reaches the plain step), and no
    spec info. Properties whose setters ignore (or raise to LAST) the
    constructor's assignments, so every reader sees the pinned values from
    the start. Put it first in the bases. Built on first use (SGLang's enums)."""
    global _PLAIN_DECODE_PINS
    if _PLAIN_DECODE_PINS is not None:
        return _PLAIN_DECODE_PINS
    from sglang.srt.model_executor.forward_batch_info import (
        CaptureHiddenMode,
        ForwardMode,
    )

    class PlainDecodePins:
        @property
        def capture_forward_mode(self):
            return ForwardMode.DECODE

        @capture_forward_mode.setter
        def capture_forward_mode(self, value):
            pass  # the constructor's TARGET_VERIFY

        @property
        def capture_hidden_mode(self):
            return self.__dict__.get("_eagle_gate_hidden", CaptureHiddenMode.LAST)

        @capture_hidden_mode.setter
        def capture_hidden_mode(self, value):
            self.__dict__["_eagle_gate_hidden"] = max(
                CaptureHiddenMode(value), CaptureHiddenMode.LAST
            )

        def get_spec_info(self, num_tokens):
            return None

    _PLAIN_DECODE_PINS = PlainDecodePins
    return PlainDecodePins


@contextlib.contextmanager
def swap_attrs(obj: Any, **values: Any):
    """Set attributes of ``obj`` for the ``with`` block and put the old values
    back in ``finally`` (an attribute that did not exist is deleted again)."""
    saved = [(name, getattr(obj, name, _MISSING)) for name in values]
    try:
        for name, value in values.items():
            setattr(obj, name, value)
        yield obj
    finally:
        for name, value in reversed(saved):
            if value is _MISSING:
                try:
                    delattr(obj, name)
                except AttributeError:
                    pass
            else:
                setattr(obj, name, value)


def plain_target_forward(
    model_runner: Any,
    graph_attr: str,
    graphs: PlainGraphs | None,
    bs: int,
    forward: Callable[[], Any],
) -> tuple[Any, bool]:
    """The plain step's target forward (docs/plain-graphs.md §5.2).

    Graph path: bind the plain attention backend and the plain DECODE runner
    (``graph_attr``: where the version keeps the target's graph runner) for
    this forward only, as SGLang's own adaptive and UNO workers swap them;
    SGLang's dispatch then replays or, if its own check refuses, runs eagerly
    on the plain backend ("declined"). Eager path: today's
    :class:`eager_target`. Returns ``(out, ran_graph)``; counts the path."""
    path, reason = select_plain_path(graphs, bs)
    if path == "graph":
        with swap_attrs(
            model_runner, **{"attn_backend": graphs.backend, graph_attr: graphs.runner}
        ):
            out = forward()
        ran_graph = bool(getattr(out, "can_run_cuda_graph", False))
        if not ran_graph:
            path, reason = "eager", "declined"
    else:
        with eager_target(model_runner, graph_attr):
            out = forward()
        ran_graph = False
    if graphs is not None:
        graphs.count(path, reason)
    return out, ran_graph


def _device_type(device: Any) -> str:
    return str(getattr(device, "type", device)).split(":")[0]


def plain_graph_blockers(
    model_runner: Any,
    server_args: Any,
    config: GateConfig,
    version_blockers: Callable[[Any, Any], str | None] | None = None,
) -> str | None:
    """Why the plain step cannot have its own DECODE CUDA graphs here (a reason
    code of docs/plain-graphs.md §5.4), or None. The device comes first: every
    CPU server reports ``device_not_cuda``, whatever the setting."""
    device = getattr(model_runner, "device", None)
    if device is None:
        device = getattr(server_args, "device", None)
    if _device_type(device) != "cuda":
        return "device_not_cuda"
    if config.plain_graphs == "off":
        return "setting_off"
    if not config.plain_step:
        return "plain_step_off"
    if getattr(server_args, "enable_lora", False):
        return "lora"
    if getattr(server_args, "enable_two_batch_overlap", False):
        return "two_batch_overlap"
    if getattr(server_args, "enable_pdmux", False):
        return "pdmux"
    if model_runner is None:
        return "no_target_graphs"
    if version_blockers is not None:
        return version_blockers(model_runner, server_args)
    return None


def target_model_runner(scheduler: Any) -> Any:
    """The speculative target's model runner (both versions)."""
    return scheduler.draft_worker.target_worker.model_runner


def available_gpu_mib(model_runner: Any) -> float:
    """SGLang's own free-memory reading (GB, after ``empty_cache``) in MiB."""
    from sglang.srt.utils.common import get_available_gpu_memory

    return (
        float(get_available_gpu_memory(model_runner.device, model_runner.gpu_id)) * 1024
    )


def plain_graphs_estimate_mib(
    max_bs: int, context_len: int, verify_mib: float
) -> float:
    """Upper bound of what the plain set allocates (§5.3): the backend's graph
    state plus SGLang's measured verify-graph memory (a DECODE set needs fewer
    tokens per graph than the verify set)."""
    backend = max_bs * context_len * PLAIN_BACKEND_BYTES_PER_SLOT_TOKEN / 2**20
    return backend + max(0.0, float(verify_mib))


def _plain_graphs_agreement(group: Any) -> Callable[[bool], bool]:
    from eagle_gate.agreement import torch_min_agreement

    return torch_min_agreement(_tp_cpu_group(group))


def _release_plain_graphs(graphs: PlainGraphs) -> None:
    graphs.runner = graphs.backend = None
    import gc

    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except Exception:  # cleanup is best effort
        pass


def build_plain_graphs(
    adapter: Any,
    scheduler: Any,
    config: GateConfig,
    *,
    tp_rank: int = 0,
    tp_size: int = 1,
    control_group: Any = None,
    agree: Callable[[bool], bool] | None = None,
    memory_mib: Callable[[Any], float] | None = None,
) -> PlainGraphs:
    """Build the plain step's DECODE graph set per docs/plain-graphs.md §5.3.

    With ``tp_size > 1`` every rank calls ``agree`` exactly twice (before and
    after capture; a MIN over the attention-TP CPU group), so all ranks capture
    or none do. ``--gate-plain-graphs on`` turns every reason that leaves the
    graphs off into :class:`GateRefused`.
    """
    graphs = PlainGraphs(setting=config.plain_graphs)
    server_args = scheduler.server_args
    memory_mib = memory_mib or available_gpu_mib
    mr = None
    try:
        mr = target_model_runner(scheduler)
    except AttributeError:
        pass
    reason = plain_graph_blockers(
        mr, server_args, config, getattr(adapter, "version_blockers", None)
    )
    verify = None
    if reason is None:
        verify = getattr(mr, adapter.GRAPH_ATTR, None)
        try:
            estimate = plain_graphs_estimate_mib(
                int(verify.max_bs),
                int(mr.model_config.context_len),
                adapter.verify_graph_mib(mr),
            )
            free = memory_mib(mr)
            if free < PLAIN_GRAPHS_HEADROOM * estimate:
                reason = "headroom"
                logger.warning(
                    "eagle_gate: %.1f MiB free on TP rank %d, plain decode CUDA "
                    "graphs need up to %.1f MiB (x%.2f headroom)",
                    free,
                    tp_rank,
                    estimate,
                    PLAIN_GRAPHS_HEADROOM,
                )
        except Exception as exc:
            reason = "headroom"
            logger.warning("eagle_gate: no memory estimate for plain graphs: %r", exc)
    if tp_size > 1:
        agree = agree or _plain_graphs_agreement(control_group)
        if not agree(reason is None) and reason is None:
            reason = "tp_disagreement"
    attempted = reason is None
    if attempted:
        tic = time.perf_counter()
        try:
            before = memory_mib(mr)
            graphs.backend = adapter.build_plain_backend(mr)
            after_backend = memory_mib(mr)
            graphs.runner = adapter.build_plain_runner(mr, graphs.backend)
            after = memory_mib(mr)
            graphs.capture_s = round(time.perf_counter() - tic, 3)
            graphs.backend_mib = round(before - after_backend, 1)
            graphs.graphs_mib = round(after_backend - after, 1)
            graphs.total_mib = round(before - after, 1)
            graphs.capture_bs = tuple(int(b) for b in graphs.runner.capture_bs)
            graphs.max_bs = int(graphs.runner.max_bs)
            graphs.disable_padding = bool(
                getattr(graphs.runner, "disable_padding", False)
            )
            graphs.attention_backend = type(graphs.backend).__name__
        except Exception as exc:
            reason = f"capture_failed: {exc!r}"
            if config.plain_graphs == "on" and tp_size == 1:
                _release_plain_graphs(graphs)
                raise GateRefused(
                    f"--gate-plain-graphs on: capturing the plain step's decode "
                    f"CUDA graphs failed on TP rank {tp_rank}: {exc!r}"
                ) from exc
    if tp_size > 1:
        if not agree(reason is None) and reason is None:
            reason = "tp_disagreement"
    if reason is None:
        graphs.state = "captured"
        logger.info(
            "eagle_gate: plain decode CUDA graphs on TP rank %d: %d sizes (%d..%d), "
            "%.1f MiB (attention backend %.1f, graphs %.1f), %.1f s",
            tp_rank,
            len(graphs.capture_bs),
            min(graphs.capture_bs),
            graphs.max_bs,
            graphs.total_mib,
            graphs.backend_mib,
            graphs.graphs_mib,
            graphs.capture_s,
        )
    else:
        graphs.state = "failed" if attempted else "off"
        graphs.reason = reason
        if attempted:
            _release_plain_graphs(graphs)
            held = ""
            try:
                held = f"; {before - memory_mib(mr):.1f} MiB still held after cleanup"
            except Exception:
                pass
            graphs.capture_bs, graphs.max_bs = (), 0
            logger.warning(
                "eagle_gate: plain decode CUDA graphs failed on TP rank %d (%s)%s; "
                "plain steps run the target eagerly",
                tp_rank,
                reason,
                held,
            )
        else:
            logger.info(
                "eagle_gate: plain decode CUDA graphs off on TP rank %d (%s); plain "
                "steps run the target eagerly",
                tp_rank,
                reason,
            )
        if config.plain_graphs == "on":
            raise GateRefused(
                f"--gate-plain-graphs on, but the plain step's decode CUDA graphs "
                f"are off on TP rank {tp_rank}: {reason}; use --gate-plain-graphs "
                "auto to run plain steps eagerly instead"
            )
    return graphs


def plain_graphs_for_scheduler(
    adapter: Any,
    scheduler: Any,
    config: GateConfig,
    *,
    gated: bool,
    tp_rank: int,
    tp_size: int,
) -> PlainGraphs:
    """The plain graphs of this scheduler: built when gated with the plain step
    on; any failure other than a refusal of ``on`` leaves them off (eager)."""
    if not gated or not config.plain_step:
        device = getattr(scheduler.server_args, "device", None)
        if _device_type(device) != "cuda":
            reason = "device_not_cuda"
        else:
            reason = "plain_step_off" if gated else "not_gated"
        return PlainGraphs(setting=config.plain_graphs, reason=reason)
    try:
        return build_plain_graphs(
            adapter,
            scheduler,
            config,
            tp_rank=tp_rank,
            tp_size=tp_size,
            control_group=getattr(scheduler, "attn_tp_cpu_group", None),
        )
    except GateRefused:
        raise
    except Exception as exc:
        if config.plain_graphs == "on":
            raise GateRefused(
                f"--gate-plain-graphs on: setting up the plain step's decode CUDA "
                f"graphs failed: {exc!r}"
            ) from exc
        logger.exception(
            "eagle_gate: setting up plain decode CUDA graphs failed; plain steps "
            "run the target eagerly"
        )
        return PlainGraphs(
            setting=config.plain_graphs,
            state="failed",
            reason=f"capture_failed: {exc!r}",
        )


class LazyDraftSync:
    """``draft_sync = "lazy"``: plain steps leave the draft alone but keep, per
    request, the (new token, target hidden state) pairs the draft would have
    consumed; when the request next runs SPEC, one batched draft extend over
    its gap catches the draft up first.

    The draft extend SGLang provides covers ``num_draft_tokens`` positions per
    request, so the buffer holds that many pairs per request slot (a ring over
    positions): a gap up to that long is caught up whole; a longer one on its
    most recent positions, and the older ones stay stale (acceptance may dip;
    outputs cannot change, verify decides them). Memory: ``rows x width x
    hidden`` of the target's hidden dtype, allocated at the first plain step
    and logged then.

    Bookkeeping is on the CPU, keyed by the request's ``req_pool_idx`` and
    ``rid`` (a reused slot starts clean), and read from ``seq_lens_cpu``: no
    device synchronisation.
    """

    def __init__(self, row_of: Callable[[Any], int]) -> None:
        #: a request's ``req_to_token`` row (where each version keeps it).
        self.row_of = row_of
        self.width = 0
        self.hidden: Any = None
        self.tokens: Any = None
        #: req_pool_idx -> [rid, first gap position, gap length]
        self.gaps: dict[int, list] = {}
        self.bytes = 0
        self.catch_ups = 0

    def record(self, worker: Any, batch: Any, new_tokens: Any, hidden: Any) -> None:
        """After a plain step: keep each request's (new token, hidden) pair."""
        import torch

        if self.hidden is None:
            rows = int(worker.req_to_token_pool.req_to_token.shape[0])
            self.width = int(worker.speculative_num_draft_tokens)
            self.hidden = torch.zeros(
                (rows, self.width, hidden.shape[-1]),
                dtype=hidden.dtype,
                device=hidden.device,
            )
            self.tokens = torch.zeros(
                (rows, self.width), dtype=torch.int64, device=hidden.device
            )
            self.bytes = (
                self.hidden.numel() * self.hidden.element_size()
                + self.tokens.numel() * self.tokens.element_size()
            )
            logger.info(
                "eagle_gate: lazy draft-sync buffer: %d request slots x %d positions "
                "x %d hidden = %.1f MiB",
                rows,
                self.width,
                hidden.shape[-1],
                self.bytes / 2**20,
            )
        rows = batch.req_pool_indices
        slots = torch.remainder(batch.seq_lens, self.width)
        self.hidden[rows, slots] = hidden
        self.tokens[rows, slots] = new_tokens.to(torch.int64)
        for req, pos in zip(batch.reqs, batch.seq_lens_cpu.tolist(), strict=True):
            row = self.row_of(req)
            gap = self.gaps.get(row)
            if gap is None or gap[0] != req.rid or gap[1] + gap[2] != pos:
                self.gaps[row] = [req.rid, pos, 1]
            else:
                gap[2] += 1

    def window(self, batch: Any) -> tuple[list[int], list[int], list[bool]] | None:
        """Per request: catch-up window start, valid length, and whether it has
        a gap ending at its current length; None when nobody has one."""
        starts, lengths, mask = [], [], []
        for req, pos in zip(batch.reqs, batch.seq_lens_cpu.tolist(), strict=True):
            gap = self.gaps.get(self.row_of(req))
            if gap is not None and gap[0] == req.rid and gap[1] + gap[2] == pos:
                length = min(gap[2], self.width)
                starts.append(pos - length)
                lengths.append(length)
                mask.append(True)
            else:
                starts.append(pos)
                lengths.append(1)
                mask.append(False)
        return (starts, lengths, mask) if any(mask) else None

    def forget(self, batch: Any) -> None:
        """A SPEC step ran for these requests: their gaps are closed."""
        for req in batch.reqs:
            self.gaps.pop(self.row_of(req), None)

    def catch_up(
        self,
        worker: Any,
        batch: Any,
        draft_extend: Callable[[Any, Any, Any], None],
        make_draft_input: Callable[[], Any],
    ) -> bool:
        """Before a SPEC step: one batched draft extend over every request's
        gap (``draft_extend(worker, batch, result)`` is the version's call of
        SGLang's ``_draft_extend_for_decode``), then the caught-up rows of the
        next draft input replace the zero-filled ones. The batch is restored
        field by field afterwards. Returns whether a catch-up ran."""
        import dataclasses
        import types

        import torch

        if self.hidden is None or batch.seq_lens_cpu is None:
            return False
        plan = self.window(batch)
        if plan is None:
            self.forget(batch)
            return False
        starts, lengths, mask = plan
        device = batch.seq_lens.device
        width = self.width
        start_t = torch.tensor(starts, dtype=batch.seq_lens.dtype, device=device)
        length_t = torch.tensor(lengths, dtype=torch.int32, device=device)
        offsets = torch.arange(width, device=device)
        slots = torch.remainder(start_t[:, None] + offsets[None, :], width)
        rows = batch.req_pool_indices[:, None]
        valid = offsets[None, :] < length_t[:, None]
        tokens = torch.where(valid, self.tokens[rows, slots], 0).reshape(-1)
        hidden = (self.hidden[rows, slots] * valid[..., None]).reshape(
            -1, self.hidden.shape[-1]
        )
        spec = batch.spec_info
        saved = {f.name: getattr(batch, f.name) for f in dataclasses.fields(batch)}
        from sglang.srt.managers.utils import GenerationBatchResult

        result = GenerationBatchResult(
            logits_output=types.SimpleNamespace(hidden_states=hidden),
            next_token_ids=tokens.to(torch.int32),
            accept_lens=length_t,
            next_draft_input=make_draft_input(),
        )
        result.new_seq_lens = start_t + length_t
        try:
            batch.seq_lens = start_t
            batch.seq_lens_cpu = torch.tensor(starts, dtype=torch.int64)
            batch.seq_lens_sum = sum(starts)
            batch.out_cache_loc = kv_slots(
                worker.req_to_token_pool.req_to_token,
                batch.req_pool_indices,
                start_t,
                width,
            )
            draft_extend(worker, batch, result)
        finally:
            for name, value in saved.items():
                setattr(batch, name, value)
        caught = result.next_draft_input
        chosen = torch.tensor(mask, device=device)[:, None]
        spec.topk_p = torch.where(chosen, caught.topk_p, spec.topk_p)
        spec.topk_index = torch.where(chosen, caught.topk_index, spec.topk_index)
        if spec.hidden_states is not None and caught.hidden_states is not None:
            spec.hidden_states = torch.where(
                chosen, caught.hidden_states, spec.hidden_states
            )
        self.forget(batch)
        self.catch_ups += 1
        return True
