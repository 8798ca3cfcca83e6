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

import sys
from typing import Any

from eagle_gate.adapters._base import (
    GateRefused,
    Instrumentor,
    LazyDraftSync,
    PatchTarget,
    PlainStep,
    activate_scheduler,
    check_speculation,
    common_plain_blocker,
    draft_extend_path,
    flat_plain_tokens,
    kv_slots,
    make_worker_wrapper,
    plain_decode_pins,
    plain_target_forward,
    resolver_wrapper,
    scheduler_init_wrapper,
    spread_rows,
    swap_attrs,
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

#: what the plain step's DECODE CUDA graphs use (docs/plain-graphs.md §2):
#: checked, not wrapped.
GRAPH_RUNNER_MODULE = "sglang.srt.model_executor.cuda_graph_runner"
MODEL_RUNNER_MODULE = "sglang.srt.model_executor.model_runner"
PLAIN_RUNNER_TARGET = PatchTarget(
    GRAPH_RUNNER_MODULE, "CudaGraphRunner.__init__", ("self", "model_runner")
)
PLAIN_CAN_RUN_TARGET = PatchTarget(
    GRAPH_RUNNER_MODULE, "CudaGraphRunner.can_run", ("self", "forward_batch")
)
PLAIN_REPLAY_TARGET = PatchTarget(
    GRAPH_RUNNER_MODULE, "CudaGraphRunner.replay", ("self", "forward_batch")
)
PLAIN_RECAPTURE_TARGET = PatchTarget(
    GRAPH_RUNNER_MODULE,
    "CudaGraphRunner.recapture_if_needed",
    ("self", "forward_batch"),
)
PLAIN_SPEC_INFO_TARGET = PatchTarget(
    GRAPH_RUNNER_MODULE, "CudaGraphRunner.get_spec_info", ("self", "num_tokens")
)
PLAIN_BACKEND_TARGET = PatchTarget(
    MODEL_RUNNER_MODULE,
    "ModelRunner._get_attention_backend",
    ("self", "init_new_workspace"),
)
#: where the target keeps its graph runner (verify-shaped with speculation).
GRAPH_ATTR = "graph_runner"

#: environment SGLang 0.5.9 reads to choose the spec-v2 worker.
SPEC_V2_ENV = "SGLANG_ENABLE_SPEC_V2"


INSTRUMENTOR = Instrumentor(
    [
        (WORKER_TARGET, make_worker_wrapper("model_worker_batch")),
        (RESOLVER_TARGET, resolver_wrapper),
        (
            SCHEDULER_INIT_TARGET,
            scheduler_init_wrapper(lambda s: activate_in_scheduler(s)),
        ),
    ]
)
TARGETS = (
    WORKER_TARGET,
    RESOLVER_TARGET,
    SCHEDULER_INIT_TARGET,
    SCHEDULER_ENTRY_TARGET,
    LAUNCH_TARGET,
    PLAIN_RUNNER_TARGET,
    PLAIN_CAN_RUN_TARGET,
    PLAIN_REPLAY_TARGET,
    PLAIN_RECAPTURE_TARGET,
    PLAIN_SPEC_INFO_TARGET,
    PLAIN_BACKEND_TARGET,
)


def _instrument() -> None:
    INSTRUMENTOR.instrument()


def _uninstrument() -> None:
    INSTRUMENTOR.uninstrument()


def check_server_args(
    server_args: Any, environ: dict | None = None, *, draft_sync: str | None = None
) -> tuple[bool, str]:
    """Refuse speculative setups the gate cannot run on 0.5.9 (see module doc)."""
    import os

    env = os.environ if environ is None else environ
    gated, state = check_speculation(
        server_args,
        extra_refusals=[
            (
                "disable_overlap_schedule",
                "eagle_gate on SGLang 0.5.9 needs the spec-v2 worker, which SGLang "
                "only uses with overlap scheduling: drop --disable-overlap-schedule",
            ),
        ],
        pp_size=getattr(server_args, "pp_size", 1) or 1,
        draft_sync=draft_sync,
    )
    if gated:
        if env.get(SPEC_V2_ENV, "").lower() not in {"1", "true", "yes", "on"}:
            raise GateRefused(
                f"{SPEC_V2_ENV}=1 is required on SGLang 0.5.9 (without it SGLang runs "
                "the v1 EAGLE worker); python -m eagle_gate.launch sets it for you"
            )
    return gated, state


def committed_len(req: Any) -> int:
    """A request's committed KV length (CPU bookkeeping). 0.5.9 always hands
    the worker CPU sequence lengths, so this estimate is never needed there."""
    return req.kv_committed_len


def activate_in_scheduler(scheduler: Any, config=None):
    """Runs right after ``Scheduler.__init__`` in each scheduler process."""
    return activate_scheduler(
        sys.modules[__name__],
        scheduler,
        tp_rank=int(getattr(scheduler, "tp_rank", 0) or 0),
        tp_size=int(getattr(scheduler, "tp_size", 1) or 1),
        dp_rank=getattr(scheduler, "dp_rank", None),
        worker_hint=f"the gate needs the spec-v2 path ({SPEC_V2_ENV}=1, overlap "
        "scheduling on)",
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


# -- the plain step ----------------------------------------------------------
def plain_step_blocker(batch: Any) -> str | None:
    """Why this decode batch cannot take the plain step (None: it can).

    The plain step samples like a server without speculation; batches that
    need more than that run SGLang's speculative step instead, counted by
    this reason. Only CPU-side fields are read: no device synchronisation.
    """
    reason = common_plain_blocker(batch)
    if reason is not None:
        return reason
    if any(lora is not None for lora in getattr(batch, "lora_ids", None) or ()):
        return "lora"
    spec = getattr(batch, "spec_info", None)
    if spec is None or getattr(spec, "verified_id", None) is None:
        return "no_draft_input"
    return None


def plain_step(
    worker: Any,
    batch: Any,
    draft_sync: str = "eager",
    lazy: Any = None,
    graphs: Any = None,
) -> Any:
    """One target DECODE step inside ``EAGLEWorkerV2`` (0.5.9, spec-v2).

    Invariants (see the shared notes on SGLang internals):

    * ``batch.seq_lens`` excludes the last accepted token (``verified_id``),
      which sits at position ``seq_lens`` and whose KV slot is already
      allocated; the plain step decodes it there, writing exactly that one
      target KV slot, and samples the next token with the batch's sampling
      parameters (``TpModelWorker.forward_batch_generation``, the stock
      non-speculative sampling path).
    * The result is in the flat speculative format: the token at
      ``i * stride``, accept length 1, and a next draft input with
      ``verified_id`` = the new token, ``new_seq_lens = seq_lens + 1`` and a
      ``verify_done`` event recorded right after it, as verify does.
    * Draft state (``draft_sync``): ``eager`` runs SGLang's own draft extend
      over the flat layout, so the draft's KV at ``seq_lens`` gets (new token,
      target hidden at ``seq_lens``) and the next draft input is exact;
      ``none`` leaves the draft KV stale and zero-fills the next draft input
      (cold recovery: only acceptance suffers, never the output); ``lazy``
      does what ``none`` does and keeps the (new token, hidden) pair for a
      catch-up before the next SPEC step (see ``LazyDraftSync``).
    * The target's own CUDA graphs are verify-shaped: the target runs
      through the plain step's DECODE graphs when they were captured and the
      batch fits (``graphs``, docs/plain-graphs.md), else eagerly.
    """
    import torch
    from sglang.srt.model_executor.forward_batch_info import (
        CaptureHiddenMode,
        ForwardMode,
    )
    from sglang.srt.speculative.eagle_info import EagleDraftInput

    draft_input = batch.spec_info
    stride = int(worker.speculative_num_draft_tokens)
    bs = int(batch.seq_lens.shape[0])
    seq_lens, seq_lens_cpu, seq_lens_sum = (
        batch.seq_lens,
        batch.seq_lens_cpu,
        batch.seq_lens_sum,
    )
    if draft_sync == "lazy" and seq_lens_cpu is None:
        draft_sync = "eager"  # lazy's bookkeeping reads CPU lengths
    req_to_token = worker.req_to_token_pool.req_to_token
    target = worker.target_worker

    # As verify does: seq_lens was allocated on the schedule stream (after
    # filter/merge) and is read on the forward stream after the target
    # forward (new lengths, KV slots, draft extend), so the caching allocator
    # must not recycle it before this stream is done.
    keep_on_stream(seq_lens, torch.get_device_module(worker.device).current_stream())

    # 1. target decode of the verified token at position seq_lens
    batch.input_ids = draft_input.verified_id.to(torch.int64)
    batch.out_cache_loc = kv_slots(req_to_token, batch.req_pool_indices, seq_lens, 1)
    batch.seq_lens = seq_lens + 1
    batch.seq_lens_cpu = seq_lens_cpu + 1 if seq_lens_cpu is not None else None
    batch.seq_lens_sum = seq_lens_sum + bs
    batch.spec_info = None
    batch.forward_mode = ForwardMode.DECODE
    batch.capture_hidden_mode = (
        CaptureHiddenMode.NULL if draft_sync == "none" else CaptureHiddenMode.LAST
    )
    out, ran_graph = plain_target_forward(
        target.model_runner,
        GRAPH_ATTR,
        graphs,
        bs,
        lambda: target.forward_batch_generation(batch),
    )
    tokens = out.next_token_ids
    new_seq_lens = seq_lens + 1
    verify_done = torch.get_device_module(worker.device).Event()
    verify_done.record()
    next_draft_input = EagleDraftInput(
        verified_id=tokens.to(torch.int32),
        new_seq_lens=new_seq_lens,
        verify_done=verify_done,
    )
    result = build_plain_result(
        tokens,
        stride=stride,
        next_draft_input=next_draft_input,
        logits_output=out.logits_output,
        can_run_cuda_graph=ran_graph,
    )

    # 2. draft state, with the batch as the draft extend expects it
    batch.seq_lens, batch.seq_lens_cpu, batch.seq_lens_sum = (
        seq_lens,
        seq_lens_cpu,
        seq_lens_sum,
    )
    batch.forward_mode = ForwardMode.DECODE
    logits = out.logits_output
    if draft_sync == "eager":
        logits.hidden_states = spread_rows(logits.hidden_states, stride)
        batch.out_cache_loc = kv_slots(
            req_to_token, batch.req_pool_indices, seq_lens, stride
        )
        _draft_extend(worker, batch, result, graphs)
    else:
        _zero_draft_state(worker, next_draft_input, bs)
        if draft_sync == "lazy":
            lazy.record(worker, batch, tokens, logits.hidden_states)
    logits.hidden_states = None  # consumed; spares the scheduler a D2H copy
    return result


def keep_on_stream(tensor: Any, stream: Any) -> None:
    """``tensor.record_stream(stream)``, exactly as 0.5.9's verify calls it,
    for device tensors (a CPU tensor has no caching allocator to tell, and
    torch refuses the call for it)."""
    if tensor.device.type != "cpu":
        tensor.record_stream(stream)


def draft_extend_path_of(worker: Any, batch: Any) -> str:
    """The path ("graph" or "eager") 0.5.9's ``_draft_extend_for_decode``
    takes for ``batch``: its ``EagleDraftWorker.cuda_graph_runner_for_draft_extend``
    and ``can_run`` (``eagle_draft_extend_cuda_graph_runner.py:190-210``),
    which counts ``forward_batch.seq_lens.numel()`` requests and, where MLP
    sync is needed, the batch's ``can_run_dp_cuda_graph``. CPU fields only;
    never raises."""
    try:
        runner = worker.draft_worker.cuda_graph_runner_for_draft_extend
        bs = int(batch.seq_lens.shape[0])
        sync_ok = bool(getattr(batch, "can_run_dp_cuda_graph", False))
    except Exception:
        return "eager"
    return draft_extend_path(runner, bs, mlp_sync_ok=sync_ok)


def _draft_extend(worker: Any, batch: Any, result: Any, graphs: Any = None) -> None:
    """SGLang's own draft extend over ``result``'s flat layout, in the draft's
    TP and MoE contexts, as ``EAGLEWorkerV2.forward_batch_generation`` runs it.

    ``graphs`` (``PlainGraphs``): counts the path SGLang takes (predicted
    before, counted once the extend returned; a failed one is not counted)."""
    from sglang.srt.speculative import eagle_worker_v2 as ew

    path = draft_extend_path_of(worker, batch) if graphs is not None else None
    draft = worker.draft_worker
    with (
        draft.draft_tp_context(draft.draft_runner.tp_group),
        ew.speculative_moe_backend_context(),
        ew.speculative_moe_a2a_backend_context(),
    ):
        draft._draft_extend_for_decode(batch, result)
    if path is not None:
        graphs.count_draft_extend(path)


def _zero_draft_state(worker: Any, draft_input: Any, bs: int) -> None:
    """Cold recovery: next draft input of the FutureMap's shapes, all zeros."""
    import torch

    config = worker.target_worker.model_config
    device = draft_input.verified_id.device
    topk = int(worker.topk)
    draft_input.topk_p = torch.zeros((bs, topk), dtype=torch.float32, device=device)
    draft_input.topk_index = torch.zeros((bs, topk), dtype=torch.int64, device=device)
    draft_input.hidden_states = torch.zeros(
        (bs, config.hidden_size), dtype=config.dtype, device=device
    )


def make_plain_step(draft_sync: str, graphs: Any = None) -> PlainStep:
    """``graphs``: the plain step's DECODE CUDA graphs (``PlainGraphs``), or
    None: the target always runs eagerly and nothing is counted."""
    lazy = LazyDraftSync(lambda req: req.req_pool_idx) if draft_sync == "lazy" else None

    def run(worker: Any, batch: Any, *_: Any, **__: Any) -> Any:
        return plain_step(worker, batch, draft_sync, lazy, graphs)

    def draft_extend(worker: Any, batch: Any, result: Any) -> None:
        # the lazy catch-up's draft extend, counted like the eager sync's
        _draft_extend(worker, batch, result, graphs)

    return PlainStep(
        run=run,
        blocker=plain_step_blocker,
        lazy=lazy,
        draft_extend=draft_extend,
        new_draft_input=_new_draft_input,
    )


def _new_draft_input() -> Any:
    from sglang.srt.speculative.eagle_info import EagleDraftInput

    return EagleDraftInput()


# -- the plain step's DECODE CUDA graphs (docs/plain-graphs.md §2.4) ----------
_PLAIN_RUNNER_CLS: Any = None


def _plain_runner_cls() -> Any:
    """``PlainDecodeCudaGraphRunner(CudaGraphRunner)``, built on first use.

    0.5.9's runner takes no options and picks TARGET_VERIFY with
    ``num_draft_tokens`` per request for a speculative target inside its
    constructor (which also captures). The subclass pins DECODE, one token per
    request and a hidden-state capture of at least LAST through properties
    whose setters ignore (or raise to LAST) the constructor's assignments,
    gives no spec info and never re-captures (a LAST graph serves NULL and
    LAST requests; FULL never reaches the plain step).
    """
    global _PLAIN_RUNNER_CLS
    if _PLAIN_RUNNER_CLS is not None:
        return _PLAIN_RUNNER_CLS
    from sglang.srt.model_executor.cuda_graph_runner import CudaGraphRunner

    class PlainDecodeCudaGraphRunner(plain_decode_pins(), CudaGraphRunner):
        @property
        def num_tokens_per_bs(self):
            return 1

        @num_tokens_per_bs.setter
        def num_tokens_per_bs(self, value):
            pass  # the constructor's num_draft_tokens

        def recapture_if_needed(self, forward_batch):
            return None

    _PLAIN_RUNNER_CLS = PlainDecodeCudaGraphRunner
    return _PLAIN_RUNNER_CLS


def version_blockers(model_runner: Any, server_args: Any) -> str | None:
    """0.5.9's reasons the plain step gets no DECODE graphs (§5.4)."""
    from sglang.srt.model_executor.cuda_graph_runner import CudaGraphRunner

    if getattr(server_args, "disable_cuda_graph", False):
        return "cuda_graph_disabled"
    if not isinstance(getattr(model_runner, GRAPH_ATTR, None), CudaGraphRunner):
        return "no_target_graphs"
    if getattr(server_args, "enable_return_hidden_states", False):
        # the runner would capture FULL and decline every LAST plain step
        return "return_hidden_states"
    if getattr(server_args, "forward_hooks", None):
        # registered after SGLang's capture; a later capture would trace them
        return "forward_hooks"
    return None


def verify_graph_mib(model_runner: Any) -> float:
    """SGLang's measured graph memory of the target (GB in 0.5.9) in MiB."""
    return float(getattr(model_runner, "graph_mem_usage", 0) or 0) * 1024


def build_plain_backend(model_runner: Any) -> Any:
    """A second target attention backend (0.5.9's pdmux precedent); the
    workspace stays shared. ``_get_attention_backend`` rewrites
    ``init_new_workspace`` on the model runner: put back afterwards."""
    with swap_attrs(model_runner, init_new_workspace=model_runner.init_new_workspace):
        return model_runner._get_attention_backend(init_new_workspace=False)


def build_plain_runner(model_runner: Any, backend: Any, cls: Any = None) -> Any:
    """Construct (and so capture) the plain DECODE runner bound to ``backend``.

    During construction the model runner's ``attn_backend`` is the plain one
    (read for ``init_cuda_graph_state``, capture and replay metadata) and
    ``eagle_use_aux_hidden_state`` is False so the constructor does not reset
    the EAGLE3 capture layers to their defaults."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    cls = cls or _plain_runner_cls()
    verify = getattr(model_runner, GRAPH_ATTR)  # None only in CI's CPU test build
    with swap_attrs(
        model_runner, attn_backend=backend, eagle_use_aux_hidden_state=False
    ):
        runner = cls(model_runner)
    problems = []
    if runner.capture_forward_mode != ForwardMode.DECODE:
        problems.append(f"forward mode {runner.capture_forward_mode!r}")
    if runner.num_tokens_per_bs != 1:
        problems.append(f"{runner.num_tokens_per_bs} tokens per request")
    if verify is not None and sorted(set(runner.capture_bs)) != sorted(
        set(verify.capture_bs)
    ):
        problems.append(
            f"sizes {sorted(set(runner.capture_bs))} != verify's "
            f"{sorted(set(verify.capture_bs))}"
        )
    if verify is not None and runner.max_bs > verify.max_bs:
        problems.append(f"max_bs {runner.max_bs} > verify's {verify.max_bs}")
    if problems:
        raise RuntimeError("plain decode runner: " + "; ".join(problems))
    return runner
