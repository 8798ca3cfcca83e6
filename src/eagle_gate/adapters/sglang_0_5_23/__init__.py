"""Adapter for SGLang 0.5.23 (newest supported release).

What this version needs (read from the 0.5.23 wheel):

* EAGLE / EAGLE3 always run ``EAGLEWorkerV2`` (spec v1 and the
  ``SGLANG_ENABLE_SPEC_V2`` switch are gone), synchronously when overlap
  scheduling is off. The worker receives the ``ScheduleBatch``:
  ``forward_batch_generation(self, batch, on_publish=None, grammar_barrier=None,
  pp_proxy_tensors=None)``.
* The resolver moved to
  ``SchedulerBatchResultProcessor._resolve_spec_v2_tokens`` and reads the stride
  from the RESULT (``speculative_output_stride`` or
  ``speculative_num_draft_tokens``) and ``num_non_draft_tokens_per_req``.
* SGLang loads ``sglang.srt.plugins`` entry points in every process; eagle_gate
  registers there (``eagle_gate.sglang_plugin:load``), so stock
  ``python -m sglang.launch_server`` gets the gate when it is enabled through
  the environment. SGLang's own hook registry only logs patch failures; our
  plugin raises SystemExit instead so a failed patch stops the launch.
* SGLang's own adaptive speculation (``--speculative-adaptive``) would fight the
  gate over the same decision, so the gate takes it over: it chooses among the
  depths SGLang built, SGLang's controller never moves (``depths.py``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from typing import Any

from eagle_gate.adapters.hooks import version_patches
from eagle_gate.adapters.patching import PatchTarget
from eagle_gate.adapters.refusals import GateRefused, check_speculation
from eagle_gate.adapters.resolved import (
    ResolvedSpec,
    server_args_check,
    sglang_flag,
)
from eagle_gate.adapters.sglang_0_5_23 import (  # noqa: F401
    depths,
    dp,
    fixes,
    graphs,
    plain,
)
from eagle_gate.adapters.sglang_0_5_23.resolve import (  # noqa: F401 (adapter API)
    resolve_argv,
    resolve_spec,
)

SGLANG_VERSIONS = ("0.5.23",)
#: SGLang's switch for its own DP spec/prefill coordination.
DP_PREFILL_COORDINATION = "SGLANG_ENABLE_DP_SPEC_PREFILL_COORDINATION"
NAME = "sglang-0.5.23"

WORKER_MODULE = "sglang.srt.speculative.eagle_worker_v2"
RESOLVER_MODULE = "sglang.srt.managers.scheduler_components.batch_result_processor"
SCHEDULER_MODULE = "sglang.srt.managers.scheduler"

WORKER_TARGET = PatchTarget(
    WORKER_MODULE,
    "EAGLEWorkerV2.forward_batch_generation",
    ("self", "batch", "on_publish", "grammar_barrier", "pp_proxy_tensors"),
)
#: the name of the worker's batch parameter (keyword or position 1).
WORKER_BATCH_PARAM = "batch"
RESOLVER_TARGET = PatchTarget(
    RESOLVER_MODULE,
    "SchedulerBatchResultProcessor._resolve_spec_v2_tokens",
    ("self", "result", "batch"),
)
SCHEDULER_INIT_TARGET = PatchTarget(
    SCHEDULER_MODULE, "Scheduler.__init__", ("self", "server_args", "port_args")
)
PLUGIN_LOADER_TARGET = PatchTarget("sglang.srt.plugins", "load_plugins", ())
#: no environment steers 0.5.23's argument resolution (spec v2 is the only path).
LAUNCH_ENV_KEYS: tuple[str, ...] = ()
#: 0.5.23 loads ``sglang.srt.plugins`` entry points (eagle_gate's among them).
HAS_SGLANG_PLUGINS = True


#: this package, as the shared code sees it (eagle_gate.adapters.protocol).
ADAPTER = sys.modules[__name__]
#: the wrappers, and every target this adapter relies on (doctor; untested
#: versions).
#: 0.5.23 also wraps SGLang's per-depth state build (what each depth costs).
INSTRUMENTOR, TARGETS = version_patches(
    ADAPTER, PLUGIN_LOADER_TARGET, patches=depths.PATCHES
)
_instrument, _uninstrument = INSTRUMENTOR.instrument, INSTRUMENTOR.uninstrument


def launch_environment(requested: argparse.Namespace) -> dict[str, str]:
    """Nothing to set before SGLang parses: 0.5.23 has no switch that changes
    its resolution or its worker (``SGLANG_ENABLE_SPEC_V2`` is gone)."""
    return {}


def api_keys(http_server: Any) -> tuple[str | None, str | None] | None:
    """SGLang's ``(api_key, admin_api_key)`` as 0.5.23's HTTP server keeps them
    (``get_serving()`` of ``sglang.srt.entrypoints.http_server``), None before
    it serves. The control endpoint defers to SGLang's key check when one is
    set."""
    try:
        serving = http_server.get_serving()
        return serving.api_key, serving.admin_api_key
    except Exception:
        return None


def check_spec(
    spec: ResolvedSpec,
    environ: Mapping[str, str] | None = None,
    *,
    draft_sync: str | None = None,
    depths: str = "off",
) -> tuple[bool, str]:
    """Refuse speculative setups the gate cannot run on 0.5.23, judged on
    SGLang's own resolution (:func:`resolve.resolve_spec`): NEXTN as the EAGLE
    it becomes, the shape ``_auto_choose_speculative_params`` picked, adaptive
    speculation only when SGLang kept it on, the attention-DP width and
    rejection-sampling default SGLang settled on. Draft trees (SGLang's own
    choice for Llama targets) are gated with eager draft sync: their draft
    state was measured exact across PLAIN stretches
    (scripts/measure_tree_draft.py, docs/compatibility.md). Data-parallel
    attention is gated through the vote in the MLP-sync gather (``dp.py``),
    except with SGLang's DP spec/prefill coordination."""
    return check_speculation(
        spec,
        extra_refusals=[
            (
                spec.adaptive and draft_sync == "lazy",
                "--speculative-adaptive with --gate-draft-sync lazy is refused: "
                "lazy sync's catch-up cannot follow the draft width as the depth "
                "changes; use eager draft sync (the default)",
            ),
            (
                spec.attn_dp_size > 1 and sglang_flag(DP_PREFILL_COORDINATION, environ),
                f"{DP_PREFILL_COORDINATION}=1 with data-parallel attention is "
                "refused: SGLang then runs decode rows inside other ranks' extend "
                "steps, which the gate's vote does not cover; unset it",
            ),
        ],
        draft_sync=draft_sync,
        gates_trees=True,
        gates_dp_attention=dp.GATES_DP_ATTENTION,
    )


#: :func:`check_spec` of a record's resolved view
check_server_args = server_args_check(check_spec, resolve_spec)


def check_scheduler(scheduler: Any, config: Any) -> None:
    """Refusals that need the built scheduler: lazy draft sync keeps its
    bookkeeping from SGLang's CPU sequence lengths, which 0.5.23's overlap
    scheduler does not keep when no attention backend needs them (Triton, FA3,
    trtllm_mha declare ``needs_cpu_seq_lens = False``; FlashInfer does not).
    Without overlap the scheduler keeps them on the batch itself."""
    future_map = getattr(scheduler, "future_map", None)
    if (
        config.plain_step
        and config.draft_sync == "lazy"
        and getattr(scheduler, "enable_overlap", True)
        and getattr(future_map, "needs_cpu_seq_lens", True) is False
    ):
        backend = type(scheduler.tp_worker.model_runner.attn_backend).__name__
        raise GateRefused(
            "--gate-draft-sync lazy needs SGLang's CPU sequence lengths, and this "
            f"server's attention backends ({backend}) run without them under the "
            "overlap scheduler (SGLang skips that copy for Triton, FA3 and "
            "trtllm_mha); use --gate-draft-sync eager (the default) or none, or "
            "an attention backend that keeps them (FlashInfer)"
        )


def committed_len(req: Any) -> int:
    """A request's committed KV length from the scheduler's CPU bookkeeping:
    the sequence-length estimate when the batch has no CPU lengths (it lags
    the device by the verifies still in flight)."""
    return req.kv.kv_committed_len


def _parallel() -> Any:
    try:
        from sglang.srt.runtime_context import get_parallel

        return get_parallel()
    except Exception:
        return None


def activate_in_scheduler(scheduler: Any, config=None):
    """Runs right after ``Scheduler.__init__`` in each scheduler process."""
    from eagle_gate.adapters.activation import activate_scheduler
    from eagle_gate.adapters.hooks import ACTIVE

    par = _parallel()
    runtime = activate_scheduler(
        ADAPTER,
        scheduler,
        tp_rank=int(getattr(par, "tp_rank", 0) or 0),
        tp_size=int(getattr(par, "tp_size", 1) or 1),
        dp_rank=getattr(par, "dp_rank", None),
        worker_hint="eagle_gate only gates EAGLEWorkerV2",
        config=config,
    )
    if ACTIVE.runtime is runtime:
        if runtime.config.depths != "off":
            depths.install(runtime, scheduler, runtime.config.depths)
        elif (own := depths.operators_depths(scheduler)) is not None:
            # the operator's own --speculative-adaptive: the gate chooses
            depths.install(runtime, scheduler, own, operators=True)
    return runtime


def load_sglang_plugins() -> None:
    """Run SGLang's plugin loading in the launcher, as its own launcher does."""
    from sglang.srt.plugins import load_plugins

    load_plugins()


def serve(server_args: Any) -> None:
    """Run SGLang's own server dispatch; schedulers get the gate through
    SGLang's plugin loading (``eagle_gate.sglang_plugin``)."""
    from sglang.launch_server import run_server

    run_server(server_args)
