"""Adapter for SGLang 0.5.9 (the spec-v2 overlap path of the reference runs).

What this version needs (read from the 0.5.9 wheel):

* EAGLE / EAGLE3 run through ``EAGLEWorkerV2`` only when the environment has
  ``SGLANG_ENABLE_SPEC_V2=1`` and overlap scheduling is on; otherwise SGLang
  falls back to the v1 worker, which the gate does not patch (refused).
* ``EAGLEWorkerV2.forward_batch_generation(self, model_worker_batch)``.
* The resolver ``SchedulerOutputProcessorMixin._resolve_spec_overlap_token_ids``
  takes a FIXED stride ``self.draft_worker.speculative_num_draft_tokens``.
* No plugin mechanism: schedulers are spawned, so the launcher hands SGLang
  :func:`run_scheduler_process`, which instruments the child and then runs
  SGLang's own entry function.
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

SGLANG_VERSIONS = ("0.5.9",)
NAME = "sglang-0.5.9"

WORKER_MODULE = "sglang.srt.speculative.eagle_worker_v2"
RESOLVER_MODULE = "sglang.srt.managers.scheduler_output_processor_mixin"
SCHEDULER_MODULE = "sglang.srt.managers.scheduler"

WORKER_TARGET = PatchTarget(
    WORKER_MODULE,
    "EAGLEWorkerV2.forward_batch_generation",
    ("self", "model_worker_batch"),
)
RESOLVER_TARGET = PatchTarget(
    RESOLVER_MODULE,
    "SchedulerOutputProcessorMixin._resolve_spec_overlap_token_ids",
    ("self", "result", "batch"),
)
SCHEDULER_INIT_TARGET = PatchTarget(
    SCHEDULER_MODULE,
    "Scheduler.__init__",
    ("self", "server_args", "port_args", "gpu_id", "tp_rank"),
)
#: checked, not wrapped: the launcher hands SGLang our replacement for it.
SCHEDULER_ENTRY_TARGET = PatchTarget(
    SCHEDULER_MODULE,
    "run_scheduler_process",
    ("server_args", "port_args", "gpu_id", "tp_rank"),
)
LAUNCH_TARGET = PatchTarget(
    "sglang.srt.entrypoints.http_server",
    "launch_server",
    ("server_args", "init_tokenizer_manager_func", "run_scheduler_process_func"),
)

#: environment SGLang 0.5.9 reads to choose the spec-v2 worker.
SPEC_V2_ENV = "SGLANG_ENABLE_SPEC_V2"


def _scheduler_init(wrapped, instance, args, kwargs):
    wrapped(*args, **kwargs)
    activate_in_scheduler(instance)


INSTRUMENTOR = Instrumentor(
    [
        (WORKER_TARGET, make_worker_wrapper("model_worker_batch")),
        (RESOLVER_TARGET, resolver_wrapper),
        (SCHEDULER_INIT_TARGET, _scheduler_init),
    ]
)
TARGETS = (
    WORKER_TARGET,
    RESOLVER_TARGET,
    SCHEDULER_INIT_TARGET,
    SCHEDULER_ENTRY_TARGET,
    LAUNCH_TARGET,
)


def _instrument() -> None:
    INSTRUMENTOR.instrument()


def _uninstrument() -> None:
    INSTRUMENTOR.uninstrument()


def check_server_args(
    server_args: Any, environ: dict | None = None
) -> tuple[bool, str]:
    """Refuse speculative setups the gate cannot run on 0.5.9 (see module doc)."""
    import os

    env = os.environ if environ is None else environ
    gated, state = check_speculation(
        server_args,
        extra_refusals=[
            (
                "enable_multi_layer_eagle",
                "--enable-multi-layer-eagle is not handled by eagle_gate",
            ),
            (
                "disable_overlap_schedule",
                "eagle_gate on SGLang 0.5.9 needs the spec-v2 worker, which SGLang "
                "only uses with overlap scheduling: drop --disable-overlap-schedule",
            ),
        ],
    )
    if gated:
        topk = getattr(server_args, "speculative_eagle_topk", None)
        if topk not in (None, 1):
            raise GateRefused(
                f"--speculative-eagle-topk {topk} is not supported on SGLang 0.5.9's "
                "spec-v2 path; use --speculative-eagle-topk 1"
            )
        if env.get(SPEC_V2_ENV, "").lower() not in {"1", "true", "yes", "on"}:
            raise GateRefused(
                f"{SPEC_V2_ENV}=1 is required on SGLang 0.5.9 (without it SGLang runs "
                "the v1 EAGLE worker); python -m eagle_gate.launch sets it for you"
            )
    return gated, state


def activate_in_scheduler(scheduler: Any, config=None):
    """Runs right after ``Scheduler.__init__`` in each scheduler process."""
    server_args = scheduler.server_args
    gated, state = check_server_args(server_args)
    if gated:
        from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

        worker = getattr(scheduler, "draft_worker", None)
        if not isinstance(worker, EAGLEWorkerV2):
            raise GateRefused(
                f"SGLang built {type(worker).__name__}, not EAGLEWorkerV2; the gate "
                f"needs the spec-v2 path ({SPEC_V2_ENV}=1, overlap scheduling on)"
            )
        INSTRUMENTOR.require_applied()
    else:
        INSTRUMENTOR.require_applied([SCHEDULER_MODULE, RESOLVER_MODULE])
    return activate(
        adapter_name=NAME,
        sglang_version=SGLANG_VERSIONS[0],
        gated=gated,
        state=state,
        tp_rank=int(getattr(scheduler, "tp_rank", 0) or 0),
        tp_size=int(getattr(scheduler, "tp_size", 1) or 1),
        dp_rank=getattr(scheduler, "dp_rank", None),
        num_draft_tokens=stride_of(scheduler) if gated else 1,
        speculative_algorithm=getattr(server_args, "speculative_algorithm", None),
        plain_step=None,
        config=config,
    )


def run_scheduler_process(*args: Any, **kwargs: Any) -> Any:
    """Scheduler entry handed to SGLang: instrument this (spawned) process, then
    run SGLang's own ``run_scheduler_process``. A patch that cannot be applied
    raises here, the scheduler dies before reporting ready, and the launch stops.
    """
    _instrument()
    INSTRUMENTOR.require_applied([SCHEDULER_MODULE, RESOLVER_MODULE])
    from sglang.srt.managers.scheduler import run_scheduler_process as original

    return original(*args, **kwargs)


# -- results -----------------------------------------------------------------
def build_plain_result(
    next_token_ids: Any,
    *,
    stride: int,
    next_draft_input: Any = None,
    logits_output: Any = None,
    can_run_cuda_graph: bool = False,
):
    """A plain step's result in 0.5.9's flat speculative format.

    ``next_token_ids``: one new token per request (int tensor ``[bs]``).
    Request i's token sits at ``i * stride`` of a flat ``bs * stride`` int32
    tensor, the other slots are padding the resolver never reads, and every
    accept length is 1 (the resolver counts ``accept - 1 = 0`` accepted drafts).
    """
    from sglang.srt.managers.utils import GenerationBatchResult

    flat, accept_lens = flat_plain_tokens(next_token_ids, stride)
    return GenerationBatchResult(
        logits_output=logits_output,
        next_token_ids=flat,
        can_run_cuda_graph=can_run_cuda_graph,
        next_draft_input=next_draft_input,
        accept_lens=accept_lens,
    )


def stride_of(scheduler_or_worker: Any) -> int:
    """The stride 0.5.9's resolver uses (fixed: the draft token count)."""
    worker = getattr(scheduler_or_worker, "draft_worker", scheduler_or_worker)
    return int(worker.speculative_num_draft_tokens)


def serve(server_args: Any) -> None:
    """Run SGLang's HTTP server with our scheduler entry function."""
    if getattr(server_args, "grpc_mode", False) or getattr(
        server_args, "encoder_only", False
    ):
        raise GateRefused(
            "python -m eagle_gate.launch runs SGLang's HTTP server; --grpc-mode "
            "and --encoder-only are not supported on SGLang 0.5.9"
        )
    from sglang.srt.entrypoints.http_server import launch_server

    launch_server(server_args, run_scheduler_process_func=run_scheduler_process)
