"""SGLang 0.5.23: the plain step's version parts (what
:mod:`eagle_gate.adapters.plain.step` asks of a version) and its result.

0.5.23's worker receives the scheduler's ``ScheduleBatch``; the last accepted
token is ``spec_info.bonus_tokens``; the resolver reads the stride and the
non-draft token count from the RESULT, and under overlap scheduling the
worker must hand ``new_seq_lens`` to ``on_publish``.
"""

from __future__ import annotations

import functools
from typing import Any

from eagle_gate.adapters.plain import step
from eagle_gate.adapters.plain.graphs import predicted_draft_extend_path
from eagle_gate.adapters.sglang_0_5_23.graphs import GRAPH_ATTR


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
    return step.flat_plain_result(
        next_token_ids,
        stride=stride,
        next_draft_input=next_draft_input,
        logits_output=logits_output,
        can_run_cuda_graph=can_run_cuda_graph,
        speculative_num_draft_tokens=stride,
        speculative_output_stride=stride,
        num_non_draft_tokens_per_req=1,
        new_seq_lens=seq_lens + 1,
    )


def plain_step_blocker(batch: Any) -> str | None:
    """Why this decode batch cannot take the plain step (None: it can).

    Only CPU-side fields are read: no device synchronisation. In 0.5.23 the
    worker sees the scheduler's ``ScheduleBatch`` with a forward-only copy of
    its sampling info, whose penalties are pre-accumulated into buffers.
    """
    reason = step.common_plain_blocker(batch)
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


#: The path ("graph" or "eager") 0.5.23's ``_draft_extend_for_decode`` takes
#: for a batch: ``EagleDraftWorker.cuda_graph_runner_for_draft_extend`` and
#: its ``can_run_graph`` (``eagle_draft_extend_cuda_graph_runner.py:319-348``),
#: which first refuses a batch whose per-request width
#: (``speculative_num_draft_tokens``, what ``_draft_extend_for_decode`` sets
#: for the plain step's flat layout too) differs from the runner's
#: ``captured_req_width``, then counts ``forward_batch.seq_lens.numel()``
#: requests and, where MLP sync is needed, the batch's
#: ``can_run_decode_cuda_graph``.
draft_extend_path_of = functools.partial(
    predicted_draft_extend_path,
    mlp_sync_flag="can_run_decode_cuda_graph",
    check_width=True,
)


def _keep_batch_on_stream(worker: Any, batch: Any, stream: Any) -> None:
    # The scheduler's batch tensors were allocated on its schedule stream and
    # the plain step drops their only references mid-forward (as verify
    # does): SGLang's own helpers tell the caching allocator (no-ops on CPU).
    from sglang.srt.speculative.spec_utils import record_stream_for_v2_verify

    record_stream_for_v2_verify(batch, None, stream)


def _keep_inputs_on_stream(tensors: Any, stream: Any) -> None:
    from sglang.srt.speculative.spec_utils import record_stream_each

    record_stream_each(tensors, stream)


def _target_forward(target: Any, batch: Any, capture: Any) -> Any:
    return target.forward_batch_generation(batch, capture_hidden_mode=capture)


def _result(
    worker: Any, tokens: Any, stride: int, seq_lens: Any, out: Any, ran_graph: bool
) -> Any:
    import torch
    from sglang.srt.speculative.eagle_info import EagleDraftInput

    return build_plain_result(
        tokens,
        stride=stride,
        seq_lens=seq_lens,
        next_draft_input=EagleDraftInput(bonus_tokens=tokens.to(torch.int32)),
        logits_output=out.logits_output,
        can_run_cuda_graph=ran_graph,
    )


def _skip_draft_extend(worker: Any, batch: Any, result: Any, bs: int) -> None:
    # SGLang's own zero-filled draft state (cold recovery).
    worker._stub_skipped_draft_extend(batch, result)


def _draft_tp_context(worker: Any) -> Any:
    from sglang.srt.speculative import eagle_worker_v2 as ew

    return ew.draft_tp_context(worker.draft_worker.parallel_layout)


def _on_publish_of(
    on_publish: Any = None, grammar_barrier: Any = None, pp_proxy_tensors: Any = None
) -> Any:
    """The stock step's parameters after the batch, as the scheduler passes
    them (on_publish and grammar_barrier by keyword). grammar_barrier
    resolves grammar state for verify; batches with grammars never take the
    plain step. Pipeline parallelism is refused at launch."""
    if pp_proxy_tensors is not None:
        raise RuntimeError("the plain step does not run pipeline-parallel")
    return on_publish


PLAIN_PARTS = step.PlainStepParts(
    graph_attr=GRAPH_ATTR,
    last_token=lambda draft_input: draft_input.bonus_tokens,
    keep_batch_on_stream=_keep_batch_on_stream,
    keep_inputs_on_stream=_keep_inputs_on_stream,
    target_forward=_target_forward,
    build_result=_result,
    skip_draft_extend=_skip_draft_extend,
    draft_tp_context=_draft_tp_context,
    draft_extend_path=lambda w, b: draft_extend_path_of(w, b),
    # 0.5.23 keeps the request's req_to_token row under req.kv
    req_row=lambda req: req.kv.req_pool_idx,
    on_publish_of=_on_publish_of,
)


def plain_step(
    worker: Any,
    batch: Any,
    on_publish: Any = None,
    draft_sync: str = "eager",
    lazy: Any = None,
    graphs: Any = None,
) -> Any:
    """One target DECODE step inside 0.5.23's ``EAGLEWorkerV2`` (see
    :mod:`eagle_gate.adapters.plain.step`): the last accepted token is
    ``bonus_tokens``, and ``on_publish(new_seq_lens)`` is called before the
    draft work, where verify calls it. The scheduler's forward isolation
    restores every ``ScheduleBatch`` field this step changes."""
    return step.plain_step(
        PLAIN_PARTS,
        worker,
        batch,
        draft_sync=draft_sync,
        lazy=lazy,
        graphs=graphs,
        on_publish=on_publish,
    )


#: ``_draft_extend(worker, batch, result, graphs=None)``: SGLang's own draft
#: extend over a result's flat layout, counted by path; and this version's
#: ``make_plain_step(draft_sync, graphs=None)``.
_draft_extend, make_plain_step = step.bind(PLAIN_PARTS, plain_step_blocker)
