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
  gate over the same decision and is refused.
"""

from __future__ import annotations

from typing import Any

from eagle_gate.adapters._base import (
    GateRefused,
    Instrumentor,
    PatchTarget,
    activate,
    check_speculation,
    flat_plain_tokens,
    make_worker_wrapper,
    resolver_wrapper,
)

SGLANG_VERSIONS = ("0.5.23",)
NAME = "sglang-0.5.23"

WORKER_MODULE = "sglang.srt.speculative.eagle_worker_v2"
RESOLVER_MODULE = "sglang.srt.managers.scheduler_components.batch_result_processor"
SCHEDULER_MODULE = "sglang.srt.managers.scheduler"

WORKER_TARGET = PatchTarget(
    WORKER_MODULE,
    "EAGLEWorkerV2.forward_batch_generation",
    ("self", "batch", "on_publish", "grammar_barrier", "pp_proxy_tensors"),
)
RESOLVER_TARGET = PatchTarget(
    RESOLVER_MODULE,
    "SchedulerBatchResultProcessor._resolve_spec_v2_tokens",
    ("self", "result", "batch"),
)
SCHEDULER_INIT_TARGET = PatchTarget(
    SCHEDULER_MODULE, "Scheduler.__init__", ("self", "server_args", "port_args")
)
#: checked, not wrapped: SGLang calls load_plugins() at its start.
SCHEDULER_ENTRY_TARGET = PatchTarget(
    SCHEDULER_MODULE,
    "run_scheduler_process",
    ("server_args", "port_args", "gpu_id", "tp_rank"),
)
PLUGIN_LOADER_TARGET = PatchTarget("sglang.srt.plugins", "load_plugins", ())


def _scheduler_init(wrapped, instance, args, kwargs):
    wrapped(*args, **kwargs)
    activate_in_scheduler(instance)


INSTRUMENTOR = Instrumentor(
    [
        (WORKER_TARGET, make_worker_wrapper("batch")),
        (RESOLVER_TARGET, resolver_wrapper),
        (SCHEDULER_INIT_TARGET, _scheduler_init),
    ]
)
TARGETS = (
    WORKER_TARGET,
    RESOLVER_TARGET,
    SCHEDULER_INIT_TARGET,
    SCHEDULER_ENTRY_TARGET,
    PLUGIN_LOADER_TARGET,
)


def _instrument() -> None:
    INSTRUMENTOR.instrument()


def _uninstrument() -> None:
    INSTRUMENTOR.uninstrument()


def check_server_args(
    server_args: Any, environ: dict | None = None
) -> tuple[bool, str]:
    """Refuse speculative setups the gate cannot run on 0.5.23."""
    gated, state = check_speculation(
        server_args,
        extra_refusals=[
            (
                "enable_multi_layer_eagle",
                "--enable-multi-layer-eagle is not handled by eagle_gate",
            ),
            (
                "speculative_adaptive",
                "--speculative-adaptive is SGLang's own adaptive speculation and "
                "would fight eagle_gate over the same decision; use one of them",
            ),
        ],
    )
    if gated:
        topk = getattr(server_args, "speculative_eagle_topk", None)
        if topk not in (None, 1):
            raise GateRefused(
                f"--speculative-eagle-topk {topk} is not handled by eagle_gate yet; "
                "use --speculative-eagle-topk 1"
            )
    return gated, state


def _parallel() -> Any:
    try:
        from sglang.srt.runtime_context import get_parallel

        return get_parallel()
    except Exception:
        return None


def activate_in_scheduler(scheduler: Any, config=None):
    """Runs right after ``Scheduler.__init__`` in each scheduler process."""
    server_args = scheduler.server_args
    gated, state = check_server_args(server_args)
    if gated:
        from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

        worker = getattr(scheduler, "draft_worker", None)
        if not isinstance(worker, EAGLEWorkerV2):
            raise GateRefused(
                f"SGLang built {type(worker).__name__}, not EAGLEWorkerV2, for this "
                "speculative setup; eagle_gate only gates EAGLEWorkerV2"
            )
        INSTRUMENTOR.require_applied()
    else:
        INSTRUMENTOR.require_applied([SCHEDULER_MODULE, RESOLVER_MODULE])
    par = _parallel()
    return activate(
        adapter_name=NAME,
        sglang_version=SGLANG_VERSIONS[0],
        gated=gated,
        state=state,
        tp_rank=int(getattr(par, "tp_rank", 0) or 0),
        tp_size=int(getattr(par, "tp_size", 1) or 1),
        dp_rank=getattr(par, "dp_rank", None),
        num_draft_tokens=(
            int(scheduler.draft_worker.speculative_num_draft_tokens) if gated else 1
        ),
        speculative_algorithm=getattr(server_args, "speculative_algorithm", None),
        plain_step=None,
        config=config,
    )


# -- results -----------------------------------------------------------------
def build_plain_result(
    next_token_ids: Any,
    *,
    stride: int,
    seq_lens: Any,
    next_draft_input: Any = None,
    logits_output: Any = None,
    can_run_cuda_graph: bool = False,
):
    """A plain step's result in 0.5.23's flat speculative format.

    Same flat layout as 0.5.9 (request i's token at ``i * stride``, accept
    length 1), plus what 0.5.23's resolver and scheduler read from the result:
    the stride itself, one non-draft token per request (so a plain step counts
    zero correct drafts) and ``new_seq_lens = seq_lens + 1``, which the worker
    must also hand to ``on_publish``.
    """
    from sglang.srt.managers.utils import GenerationBatchResult

    flat, accept_lens = flat_plain_tokens(next_token_ids, stride)
    return GenerationBatchResult(
        logits_output=logits_output,
        next_token_ids=flat,
        can_run_cuda_graph=can_run_cuda_graph,
        next_draft_input=next_draft_input,
        accept_lens=accept_lens,
        speculative_num_draft_tokens=stride,
        speculative_output_stride=stride,
        num_non_draft_tokens_per_req=1,
        new_seq_lens=seq_lens + 1,
    )


def load_sglang_plugins() -> None:
    """Run SGLang's plugin loading in the launcher, as its own launcher does."""
    from sglang.srt.plugins import load_plugins

    load_plugins()


def serve(server_args: Any) -> None:
    """Run SGLang's own server dispatch; schedulers get the gate through
    SGLang's plugin loading (``eagle_gate.sglang_plugin``)."""
    from sglang.launch_server import run_server

    run_server(server_args)
