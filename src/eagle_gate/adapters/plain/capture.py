"""Building the plain step's DECODE CUDA graphs at start (docs/plain-graphs.md;
the § numbers name sections of docs/design/2026-12-plain-graphs.md): why
they stay off, the memory estimate and headroom, the capture itself, and the
TP agreement that makes every rank capture or none.

Nothing here runs per step; :mod:`eagle_gate.adapters.plain.graphs` is what
the plain step uses at run time. A version supplies its pieces through its
``graphs`` module (``version_blockers``, ``verify_graph_mib``,
``build_plain_backend``, ``build_plain_runner``, ``GRAPH_ATTR``: see
:class:`eagle_gate.adapters.protocol.VersionGraphs`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from eagle_gate.adapters.parallel import plain_graphs_agreement
from eagle_gate.adapters.patching import PatchTarget
from eagle_gate.adapters.plain import testing
from eagle_gate.adapters.plain.graphs import PlainGraphs
from eagle_gate.adapters.refusals import GateRefused
from eagle_gate.config import GateConfig

if TYPE_CHECKING:
    from eagle_gate.adapters.protocol import VersionGraphs

logger = logging.getLogger("eagle_gate")

#: how both versions build a second target attention backend (checked, not
#: wrapped: the plain graphs call it as the version's graphs module says).
ATTENTION_BACKEND_TARGET = PatchTarget(
    "sglang.srt.model_executor.model_runner",
    "ModelRunner._get_attention_backend",
    ("self", "init_new_workspace"),
)

__all__ = [
    "build_plain_graphs",
    "check_plain_runner",
    "plain_graphs_for_scheduler",
    "plain_graph_blockers",
    "plain_graphs_estimate_mib",
    "target_model_runner",
]

#: headroom needed before capture: this many times the estimate (§5.3).
PLAIN_GRAPHS_HEADROOM = 1.25
#: bytes of attention-backend graph state per (batch slot x context token), an
#: upper bound over the backends of design record §5.5 (FA3's four page
#: tables at page size 1: 16 bytes).
PLAIN_BACKEND_BYTES_PER_SLOT_TOKEN = 16


def _device_type(device: Any) -> str:
    return str(getattr(device, "type", device)).split(":")[0]


def plain_graph_blockers(
    model_runner: Any,
    server_args: Any,
    config: GateConfig,
    version_blockers: Callable[[Any, Any], str | None] | None = None,
) -> str | None:
    """Why the plain step cannot have its own DECODE CUDA graphs here (a reason
    code of design record §5.4), or None. The device comes first: every
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
    version: VersionGraphs,
    scheduler: Any,
    config: GateConfig,
    *,
    tp_rank: int = 0,
    tp_size: int = 1,
    control_group: Any = None,
    agree: Callable[[bool], bool] | None = None,
    memory_mib: Callable[[Any], float] | None = None,
) -> PlainGraphs:
    """Build the plain step's DECODE graph set per design record §5.3.

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
    reason = plain_graph_blockers(mr, server_args, config, version.version_blockers)
    verify = None
    if reason is None:
        verify = getattr(mr, version.GRAPH_ATTR, None)
        try:
            estimate = plain_graphs_estimate_mib(
                int(verify.max_bs),
                int(mr.model_config.context_len),
                version.verify_graph_mib(mr),
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
        agree = agree or plain_graphs_agreement(control_group)
        if not agree(reason is None) and reason is None:
            reason = "tp_disagreement"
    attempted = reason is None
    if attempted:
        tic = time.perf_counter()
        try:
            before = memory_mib(mr)
            graphs.backend = version.build_plain_backend(mr)
            after_backend = memory_mib(mr)
            graphs.runner = version.build_plain_runner(mr, graphs.backend)
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
    version: VersionGraphs,
    scheduler: Any,
    config: GateConfig,
    *,
    gated: bool,
    tp_rank: int,
    tp_size: int,
    dp_attention: bool = False,
) -> PlainGraphs:
    """The plain graphs of this scheduler: built when gated with the plain step
    on; any failure other than a refusal of ``on`` leaves them off (eager).
    Under data-parallel attention they stay off: whether a rank replays a
    graph (and pads to its size) must come from the ranks' gathered vote, as
    SGLang's own graphs do, which the plain step does not do yet. Test hooks
    (:func:`eagle_gate.adapters.plain.testing.on_plain_graphs`) see the result;
    none are registered outside tests."""
    graphs = _plain_graphs_for_scheduler(
        version,
        scheduler,
        config,
        gated=gated,
        tp_rank=tp_rank,
        tp_size=tp_size,
        dp_attention=dp_attention,
    )
    if testing.PLAIN_GRAPHS_HOOKS:
        testing.run_plain_graphs_hooks(
            graphs, version=version, scheduler=scheduler, config=config, gated=gated
        )
    return graphs


def _plain_graphs_for_scheduler(
    version: VersionGraphs,
    scheduler: Any,
    config: GateConfig,
    *,
    gated: bool,
    tp_rank: int,
    tp_size: int,
    dp_attention: bool,
) -> PlainGraphs:
    if dp_attention and config.plain_step:
        if config.plain_graphs == "on":
            raise GateRefused(
                "--gate-plain-graphs on under data-parallel attention is refused: "
                "the plain step's graphs do not yet follow the DP ranks' gathered "
                "graph vote; use auto or off (plain steps run the target eagerly)"
            )
        return PlainGraphs(setting=config.plain_graphs, reason="dp_attention")
    if not gated or not config.plain_step:
        device = getattr(scheduler.server_args, "device", None)
        if _device_type(device) != "cuda":
            reason = "device_not_cuda"
        else:
            reason = "plain_step_off" if gated else "not_gated"
        return PlainGraphs(setting=config.plain_graphs, reason=reason)
    try:
        return build_plain_graphs(
            version,
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


def check_plain_runner(
    runner: Any, verify: Any, *, width: int, more: Sequence[str] = ()
) -> None:
    """Refuse a constructed plain DECODE runner that is not what the plain
    step replays: RuntimeError naming every problem (forward mode, tokens per
    request ``width``, sizes other than the verify set's, then the version's
    own ``more``). ``verify``: the target's verify runner."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    problems = []
    if runner.capture_forward_mode != ForwardMode.DECODE:
        problems.append(f"forward mode {runner.capture_forward_mode!r}")
    if width != 1:
        problems.append(f"{width} tokens per request")
    mine, theirs = sorted(set(runner.capture_bs)), sorted(set(verify.capture_bs))
    if mine != theirs:
        problems.append(f"sizes {mine} != verify's {theirs}")
    problems.extend(more)
    if problems:
        raise RuntimeError("plain decode runner: " + "; ".join(problems))
