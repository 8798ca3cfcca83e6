"""SGLang 0.5.9: the plain step's version parts (what
:mod:`eagle_gate.adapters.plain.step` asks of a version) and its result.

0.5.9's worker receives a ``ModelWorkerBatch``; the last accepted token is
``spec_info.verified_id``; the scheduler waits on the next draft input's
``verify_done`` event and reads a FIXED stride (the draft token count).
"""

from __future__ import annotations

import functools
from typing import Any

from eagle_gate.adapters.plain import step
from eagle_gate.adapters.plain.graphs import predicted_draft_extend_path
from eagle_gate.adapters.sglang_0_5_9.graphs import GRAPH_ATTR

#: A plain step's result in 0.5.9's flat speculative format: the layout alone
#: (0.5.9's resolver reads a FIXED stride, the draft token count).
build_plain_result = step.flat_plain_result


def plain_step_blocker(batch: Any) -> str | None:
    """Why this decode batch cannot take the plain step (None: it can).

    The plain step samples like a server without speculation; batches that
    need more than that run SGLang's speculative step instead, counted by
    this reason. Only CPU-side fields are read: no device synchronisation.
    """
    reason = step.common_plain_blocker(batch)
    if reason is not None:
        return reason
    lora_ids = getattr(batch, "lora_ids", None)
    if lora_ids is None:  # a ScheduleBatch (judged at the DP gather): per request
        reqs = getattr(batch, "reqs", None) or ()
        lora_ids = [getattr(req, "lora_id", None) for req in reqs]
    if any(lora is not None for lora in lora_ids):
        return "lora"
    spec = getattr(batch, "spec_info", None)
    if spec is None or getattr(spec, "verified_id", None) is None:
        return "no_draft_input"
    return None


def keep_on_stream(tensor: Any, stream: Any) -> None:
    """``tensor.record_stream(stream)``, exactly as 0.5.9's verify calls it,
    for device tensors (a CPU tensor has no caching allocator to tell, and
    torch refuses the call for it)."""
    if tensor.device.type != "cpu":
        tensor.record_stream(stream)


#: The path ("graph" or "eager") 0.5.9's ``_draft_extend_for_decode`` takes
#: for a batch: ``EagleDraftWorker.cuda_graph_runner_for_draft_extend`` and
#: its ``can_run`` (``eagle_draft_extend_cuda_graph_runner.py:190-210``),
#: which counts ``forward_batch.seq_lens.numel()`` requests and, where MLP
#: sync is needed, the batch's ``can_run_dp_cuda_graph``.
draft_extend_path_of = functools.partial(
    predicted_draft_extend_path,
    mlp_sync_flag="can_run_dp_cuda_graph",
    check_width=False,
)


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


def _keep_batch_on_stream(worker: Any, batch: Any, stream: Any) -> None:
    # As verify does: seq_lens was allocated on the schedule stream (after
    # filter/merge) and is read on the forward stream after the target
    # forward (new lengths, KV slots, draft extend), so the caching allocator
    # must not recycle it before this stream is done.
    keep_on_stream(batch.seq_lens, stream)


def _target_forward(target: Any, batch: Any, capture: Any) -> Any:
    # 0.5.9's target worker reads the hidden-state capture from the batch.
    batch.capture_hidden_mode = capture
    return target.forward_batch_generation(batch)


def _result(
    worker: Any, tokens: Any, stride: int, seq_lens: Any, out: Any, ran_graph: bool
) -> Any:
    """The plain step's result, its next draft input carrying ``verified_id``
    = the new token, ``new_seq_lens`` and a ``verify_done`` event recorded
    right after them, as verify does (the scheduler waits on it)."""
    import torch
    from sglang.srt.speculative.eagle_info import EagleDraftInput

    new_seq_lens = seq_lens + 1
    verify_done = torch.get_device_module(worker.device).Event()
    verify_done.record()
    return build_plain_result(
        tokens,
        stride=stride,
        next_draft_input=EagleDraftInput(
            verified_id=tokens.to(torch.int32),
            new_seq_lens=new_seq_lens,
            verify_done=verify_done,
        ),
        logits_output=out.logits_output,
        can_run_cuda_graph=ran_graph,
    )


def _skip_draft_extend(worker: Any, batch: Any, result: Any, bs: int) -> None:
    _zero_draft_state(worker, result.next_draft_input, bs)


def _draft_tp_context(worker: Any) -> Any:
    draft = worker.draft_worker
    return draft.draft_tp_context(draft.draft_runner.tp_group)


def _no_publish(*args: Any, **kwargs: Any) -> None:
    """0.5.9's stock step takes the batch alone; nothing to publish."""
    return None


PLAIN_PARTS = step.PlainStepParts(
    graph_attr=GRAPH_ATTR,
    last_token=lambda draft_input: draft_input.verified_id,
    keep_batch_on_stream=lambda w, b, s: _keep_batch_on_stream(w, b, s),
    keep_inputs_on_stream=lambda tensors, stream: None,
    target_forward=_target_forward,
    build_result=_result,
    skip_draft_extend=_skip_draft_extend,
    draft_tp_context=_draft_tp_context,
    draft_extend_path=lambda w, b: draft_extend_path_of(w, b),
    req_row=lambda req: req.req_pool_idx,
    on_publish_of=_no_publish,
)


def plain_step(
    worker: Any,
    batch: Any,
    draft_sync: str = "eager",
    lazy: Any = None,
    graphs: Any = None,
) -> Any:
    """One target DECODE step inside 0.5.9's ``EAGLEWorkerV2`` (see
    :mod:`eagle_gate.adapters.plain.step` for the invariants)."""
    return step.plain_step(
        PLAIN_PARTS, worker, batch, draft_sync=draft_sync, lazy=lazy, graphs=graphs
    )


#: ``_draft_extend(worker, batch, result, graphs=None)``: SGLang's own draft
#: extend over a result's flat layout, counted by path; and this version's
#: ``make_plain_step(draft_sync, graphs=None)``.
_draft_extend, make_plain_step = step.bind(PLAIN_PARTS, plain_step_blocker)
