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
#: what the plain step's DECODE CUDA graphs use (docs/plain-graphs.md §3):
#: checked, not wrapped.
GRAPH_RUNNER_MODULE = "sglang.srt.model_executor.runner.decode_cuda_graph_runner"
MODEL_RUNNER_MODULE = "sglang.srt.model_executor.model_runner"
PLAIN_RUNNER_TARGET = PatchTarget(
    GRAPH_RUNNER_MODULE,
    "DecodeCudaGraphRunner.__init__",
    (
        "self",
        "model_runner",
        "attn_backend",
        "speculative_num_steps",
        "speculative_num_draft_tokens",
    ),
)
PLAIN_CAN_RUN_TARGET = PatchTarget(
    GRAPH_RUNNER_MODULE,
    "DecodeCudaGraphRunner.can_run_graph",
    ("self", "forward_batch"),
)
PLAIN_SPEC_INFO_TARGET = PatchTarget(
    GRAPH_RUNNER_MODULE, "DecodeCudaGraphRunner.get_spec_info", ("self", "num_tokens")
)
PLAIN_BACKEND_TARGET = PatchTarget(
    MODEL_RUNNER_MODULE,
    "ModelRunner._get_attention_backend",
    ("self", "init_new_workspace"),
)
#: where the target keeps its decode graph runner (verify-shaped with speculation).
GRAPH_ATTR = "decode_cuda_graph_runner"
#: 0.5.23 environment switches that carve graph-pool extents at capture.
POOL_BORROW_ENV = (
    "SGLANG_ENABLE_GRAPH_POOL_BORROW",
    "SGLANG_ENABLE_GRAPH_POOL_PRECARVE",
)


INSTRUMENTOR = Instrumentor(
    [
        (WORKER_TARGET, make_worker_wrapper("batch")),
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
    PLUGIN_LOADER_TARGET,
    PLAIN_RUNNER_TARGET,
    PLAIN_CAN_RUN_TARGET,
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
    """Refuse speculative setups the gate cannot run on 0.5.23.

    0.5.23 resolves some settings after parsing (``--enable-dp-attention``
    becomes ``attn_dp_size``; rejection sampling is switched on by default for
    EAGLE on ROCm): the resolved values are read where SGLang keeps them.
    """
    return check_speculation(
        server_args,
        extra_refusals=[
            (
                "speculative_adaptive",
                "--speculative-adaptive is SGLang's own adaptive speculation and "
                "would fight eagle_gate over the same decision; use one of them",
            ),
        ],
        attn_dp_size=_resolved(server_args, "attn_dp_size") or 1,
        pp_size=_resolved(server_args, "pp_size") or 1,
        rejection_sampling=bool(
            _resolved(server_args, "speculative_use_rejection_sampling")
        ),
        draft_sync=draft_sync,
    )


def _resolved(server_args: Any, name: str) -> Any:
    """A setting as SGLang resolved it: 0.5.23's resolution records some
    values as declarations over the parsed fields (``resolving_view`` reads
    them); a pre-parsed flag namespace has only the raw attribute."""
    try:
        from sglang.srt.arg_groups.model_override_base import resolving_view

        return getattr(resolving_view(server_args), name)
    except Exception:
        return getattr(server_args, name, None)


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
    par = _parallel()
    return activate_scheduler(
        sys.modules[__name__],
        scheduler,
        tp_rank=int(getattr(par, "tp_rank", 0) or 0),
        tp_size=int(getattr(par, "tp_size", 1) or 1),
        dp_rank=getattr(par, "dp_rank", None),
        worker_hint="eagle_gate only gates EAGLEWorkerV2",
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


# -- the plain step ----------------------------------------------------------
def plain_step_blocker(batch: Any) -> str | None:
    """Why this decode batch cannot take the plain step (None: it can).

    Only CPU-side fields are read: no device synchronisation. In 0.5.23 the
    worker sees the scheduler's ``ScheduleBatch`` with a forward-only copy of
    its sampling info, whose penalties are pre-accumulated into buffers.
    """
    reason = common_plain_blocker(batch)
    if reason is not None:
        return reason
    sampling = getattr(batch, "sampling_info", None)
    if sampling is not None and (
        getattr(sampling, "acc_additive_penalties", None) is not None
        or getattr(sampling, "acc_scaling_penalties", None) is not None
    ):
        return "penalties"
    if any(getattr(req, "lora_id", None) is not None for req in batch.reqs):
        return "lora"
    spec = getattr(batch, "spec_info", None)
    if spec is None or getattr(spec, "bonus_tokens", None) is None:
        return "no_draft_input"
    if spec.is_verify_input():
        return "prebuilt_verify_input"  # pipeline parallel pre-built the verify
    return None


def plain_step(
    worker: Any,
    batch: Any,
    on_publish: Any = None,
    draft_sync: str = "eager",
    lazy: Any = None,
    graphs: Any = None,
) -> Any:
    """One target DECODE step inside ``EAGLEWorkerV2`` (0.5.23).

    Same invariants as 0.5.9 (see ``sglang_0_5_9.plain_step``) with 0.5.23's
    names: the last accepted token is ``bonus_tokens`` at position
    ``seq_lens``; the result carries ``new_seq_lens = seq_lens + 1`` and the
    stride, and ``on_publish(new_seq_lens)`` is called before the draft work,
    where verify calls it. The scheduler's forward isolation restores every
    ``ScheduleBatch`` field this step changes. Draft state: ``eager`` runs
    SGLang's own ``_draft_extend_for_decode`` over the flat layout; ``none``
    is SGLang's own ``_stub_skipped_draft_extend`` (zero-filled: cold
    recovery); ``lazy`` stubs likewise and keeps the (new token, hidden) pair
    for a catch-up before the next SPEC step (``LazyDraftSync``). The
    target's own decode graphs are verify-shaped: the target runs through the
    plain step's DECODE graphs when captured and the batch fits (``graphs``,
    docs/plain-graphs.md), else eagerly.
    """
    import torch
    from sglang.srt.model_executor.forward_batch_info import (
        CaptureHiddenMode,
        ForwardMode,
    )
    from sglang.srt.speculative.eagle_info import EagleDraftInput
    from sglang.srt.speculative.spec_utils import (
        record_stream_each,
        record_stream_for_v2_verify,
    )

    draft_input = batch.spec_info
    stride = int(worker.speculative_num_draft_tokens)
    bs = int(batch.seq_lens.shape[0])
    seq_lens, seq_lens_cpu, seq_lens_sum = (
        batch.seq_lens,
        batch.seq_lens_cpu,
        batch.seq_lens_sum,
    )
    if draft_sync == "lazy" and seq_lens_cpu is None:
        # lazy's bookkeeping reads CPU lengths; without them (a backend that
        # skips the copy) this step keeps the draft exact the eager way.
        draft_sync = "eager"
    req_to_token = worker.req_to_token_pool.req_to_token
    target = worker.target_worker

    # The scheduler's batch tensors were allocated on its schedule stream and
    # this step drops their only references mid-forward (as verify does):
    # tell the caching allocator they are in use on the forward stream, with
    # SGLang's own helpers (no-ops for CPU tensors).
    fwd_stream = torch.get_device_module(worker.device).current_stream()
    record_stream_for_v2_verify(batch, None, fwd_stream)

    # 1. target decode of the bonus token at position seq_lens
    batch.input_ids = draft_input.bonus_tokens.to(torch.int64)
    batch.out_cache_loc = kv_slots(req_to_token, batch.req_pool_indices, seq_lens, 1)
    record_stream_each((batch.input_ids, batch.out_cache_loc), fwd_stream)
    batch.seq_lens = seq_lens + 1
    batch.seq_lens_cpu = seq_lens_cpu + 1 if seq_lens_cpu is not None else None
    batch.seq_lens_sum = seq_lens_sum + bs if seq_lens_sum is not None else None
    batch.spec_info = None
    batch.forward_mode = ForwardMode.DECODE
    capture = CaptureHiddenMode.NULL if draft_sync == "none" else CaptureHiddenMode.LAST
    out, ran_graph = plain_target_forward(
        target.model_runner,
        GRAPH_ATTR,
        graphs,
        bs,
        lambda: target.forward_batch_generation(batch, capture_hidden_mode=capture),
    )
    tokens = out.next_token_ids
    result = build_plain_result(
        tokens,
        stride=stride,
        seq_lens=seq_lens,
        next_draft_input=EagleDraftInput(bonus_tokens=tokens.to(torch.int32)),
        logits_output=out.logits_output,
        can_run_cuda_graph=ran_graph,
    )
    if on_publish is not None:
        on_publish(result.new_seq_lens)

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
        worker._stub_skipped_draft_extend(batch, result)
        if draft_sync == "lazy":
            lazy.record(worker, batch, tokens, logits.hidden_states)
    logits.hidden_states = None  # consumed; spares the scheduler a D2H copy
    return result


def draft_extend_path_of(worker: Any, batch: Any) -> str:
    """The path ("graph" or "eager") 0.5.23's ``_draft_extend_for_decode``
    takes for ``batch``: its ``EagleDraftWorker.cuda_graph_runner_for_draft_extend``
    and ``can_run_graph`` (``eagle_draft_extend_cuda_graph_runner.py:319-348``),
    which first refuses a batch whose per-request width
    (``speculative_num_draft_tokens``, what ``_draft_extend_for_decode`` sets
    for the plain step's flat layout too) differs from the runner's
    ``captured_req_width``, then counts ``forward_batch.seq_lens.numel()``
    requests and, where MLP sync is needed, the batch's
    ``can_run_decode_cuda_graph``. CPU fields only; never raises."""
    try:
        draft = worker.draft_worker
        runner = draft.cuda_graph_runner_for_draft_extend
        if runner is not None and int(runner.captured_req_width) != int(
            draft.speculative_num_draft_tokens
        ):
            return "eager"
        bs = int(batch.seq_lens.shape[0])
        sync_ok = bool(getattr(batch, "can_run_decode_cuda_graph", False))
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
    with (
        ew.draft_tp_context(worker.draft_worker.parallel_layout),
        ew.speculative_moe_backend_context(),
        ew.speculative_moe_a2a_backend_context(),
    ):
        worker.draft_worker._draft_extend_for_decode(batch, result)
    if path is not None:
        graphs.count_draft_extend(path)


def make_plain_step(draft_sync: str, graphs: Any = None) -> PlainStep:
    """``graphs``: the plain step's DECODE CUDA graphs (``PlainGraphs``), or
    None: the target always runs eagerly and nothing is counted."""
    # 0.5.23 keeps the request's req_to_token row under req.kv
    lazy = (
        LazyDraftSync(lambda req: req.kv.req_pool_idx) if draft_sync == "lazy" else None
    )

    def run(
        worker: Any,
        batch: Any,
        on_publish: Any = None,
        grammar_barrier: Any = None,
        pp_proxy_tensors: Any = None,
    ) -> Any:
        # The stock step's parameters, as the scheduler passes them (on_publish
        # and grammar_barrier by keyword). grammar_barrier resolves grammar
        # state for verify; batches with grammars never take the plain step.
        # pp_proxy_tensors: pipeline parallelism is refused at launch.
        if pp_proxy_tensors is not None:
            raise RuntimeError("the plain step does not run pipeline-parallel")
        return plain_step(worker, batch, on_publish, draft_sync, lazy, graphs)

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


# -- the plain step's DECODE CUDA graphs (docs/plain-graphs.md §3.4) ----------
_PLAIN_RUNNER_CLS: Any = None


def _plain_runner_cls() -> Any:
    """``PlainDecodeGraphRunner(DecodeCudaGraphRunner)``, built on first use.

    0.5.23's runner switches a speculative target to TARGET_VERIFY inside its
    constructor (which also captures); ``speculative_num_draft_tokens=1``
    gives width 1 but not the mode. The subclass pins DECODE (every reader
    sees it from the start), keeps the hidden-state capture at least LAST and
    gives no spec info, as SGLang's own ``EAGLEDraftExtendCudaGraphRunner`` and
    ``UnoDecodeCudaGraphRunner`` specialise the same class.
    """
    global _PLAIN_RUNNER_CLS
    if _PLAIN_RUNNER_CLS is not None:
        return _PLAIN_RUNNER_CLS
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import (
        DecodeCudaGraphRunner,
    )

    class PlainDecodeGraphRunner(plain_decode_pins(), DecodeCudaGraphRunner):
        pass

    _PLAIN_RUNNER_CLS = PlainDecodeGraphRunner
    return _PLAIN_RUNNER_CLS


def version_blockers(model_runner: Any, server_args: Any) -> str | None:
    """0.5.23's reasons the plain step gets no DECODE graphs (§5.4)."""
    import os

    from sglang.srt.model_executor.cuda_graph_config import (
        Backend,
        Phase,
        check_cuda_graph_backend,
    )
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import (
        DecodeCudaGraphRunner,
    )

    if getattr(server_args, "disable_cuda_graph", False) or check_cuda_graph_backend(
        Phase.DECODE, Backend.DISABLED
    ):
        return "cuda_graph_disabled"
    if not isinstance(getattr(model_runner, GRAPH_ATTR, None), DecodeCudaGraphRunner):
        return "no_target_graphs"
    if getattr(model_runner, "lora_manager", None) is not None:
        return "lora"
    if getattr(model_runner, "enable_elastic_ep", False):
        return "elastic_ep"
    try:
        from sglang.srt.runtime_context import get_observability

        if get_observability().forward_hooks:
            return "forward_hooks"
    except (ImportError, ValueError):
        pass
    if any(
        os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}
        for name in POOL_BORROW_ENV
    ):
        return "graph_pool_borrow"
    return None


def verify_graph_mib(model_runner: Any) -> float:
    """SGLang's measured decode/verify graph memory of the target (GB, as the
    capture records it; inferred) in MiB."""
    usage = getattr(model_runner, "graph_memory_usage", None) or {}
    return sum(float(usage.get(k, 0) or 0) for k in ("decode", "target_verify")) * 1024


def build_plain_backend(model_runner: Any) -> Any:
    """A second target attention backend bound to the model runner's KV index
    translator, as ``init_attention_backends`` binds the first; the workspace
    stays shared and ``init_new_workspace`` is put back."""
    with swap_attrs(
        model_runner,
        init_new_workspace=getattr(model_runner, "init_new_workspace", False),
    ):
        backend = model_runner._get_attention_backend(init_new_workspace=False)
    translator = getattr(model_runner, "kv_index_translator", None)
    if translator is not None:
        translator.bind_and_verify_backends([backend])
    return backend


def build_plain_runner(model_runner: Any, backend: Any, cls: Any = None) -> Any:
    """Construct (and so capture) the plain DECODE runner on ``backend``:
    ``attn_backend=`` and one token per request, as adaptive speculation and
    UNO construct theirs."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    cls = cls or _plain_runner_cls()
    verify = getattr(model_runner, GRAPH_ATTR)
    if not hasattr(verify, "capture_bs"):
        verify = None  # CI's CPU test build only: no verify graphs there
    runner = cls(
        model_runner,
        attn_backend=backend,
        speculative_num_steps=0,
        speculative_num_draft_tokens=1,
    )
    problems = []
    if runner.capture_forward_mode != ForwardMode.DECODE:
        problems.append(f"forward mode {runner.capture_forward_mode!r}")
    if runner.captured_req_width != 1:
        problems.append(f"{runner.captured_req_width} tokens per request")
    if runner.attn_backend is not backend:
        problems.append("not bound to the plain attention backend")
    if verify is not None and sorted(set(runner.capture_bs)) != sorted(
        set(verify.capture_bs)
    ):
        problems.append(
            f"sizes {sorted(set(runner.capture_bs))} != verify's "
            f"{sorted(set(verify.capture_bs))}"
        )
    if problems:
        raise RuntimeError("plain decode runner: " + "; ".join(problems))
    return runner
