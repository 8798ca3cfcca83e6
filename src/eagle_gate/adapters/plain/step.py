"""The plain step: one target DECODE inside SGLang's ``EAGLEWorkerV2``,
returned in the flat speculative format, with the draft kept in step.

The sequence is the same in every supported SGLang version; what differs
(names, stream bookkeeping, how a result is built, the draft's TP context) is
a :class:`PlainStepParts` the version adapter fills in. Invariants (see the
shared notes on SGLang internals):

* ``batch.seq_lens`` excludes the last accepted token (0.5.9's
  ``verified_id``, 0.5.23's ``bonus_tokens``), which sits at position
  ``seq_lens`` and whose KV slot is already allocated; the plain step decodes
  it there, writing exactly that one target KV slot, and samples the next
  token with the batch's sampling parameters (``TpModelWorker``'s stock
  non-speculative sampling path).
* The result is in the flat speculative format: the token at
  ``i * stride``, accept length 1, and a next draft input whose last token is
  the new token and whose ``new_seq_lens = seq_lens + 1`` (the version adds
  what its scheduler reads: 0.5.9's ``verify_done`` event, 0.5.23's stride
  fields and ``on_publish(new_seq_lens)`` before the draft work, where verify
  calls it).
* Draft state (``draft_sync``): ``eager`` runs SGLang's own draft extend over
  the flat layout, so the draft's KV at ``seq_lens`` gets (new token, target
  hidden at ``seq_lens``) and the next draft input is exact; ``none`` leaves
  the draft KV stale and zero-fills the next draft input (cold recovery: only
  acceptance suffers, never the output); ``lazy`` does what ``none`` does and
  keeps the (new token, hidden) pair for a catch-up before the next SPEC step
  (:class:`~eagle_gate.adapters.plain.lazy.LazyDraftSync`).
* The target's own CUDA graphs are verify-shaped: the target runs through
  the plain step's DECODE graphs when they were captured and the batch fits
  (``graphs``, docs/plain-graphs.md), else eagerly.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from itertools import repeat
from typing import Any

from eagle_gate.adapters.plain import testing
from eagle_gate.adapters.plain.graphs import PlainGraphs, plain_target_forward
from eagle_gate.adapters.plain.lazy import LazyDraftSync
from eagle_gate.adapters.plain.tensors import (
    flat_plain_tokens,
    kv_slots,
    mark_draft_matches,
    spread_rows,
)

__all__ = [
    "PlainStep",
    "PlainStepParts",
    "PLAIN_STEP_FIELDS",
    "common_plain_blocker",
    "flat_plain_result",
    "make_plain_step",
    "plain_step",
    "draft_extend",
    "bind",
]

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
_NONES = (None,) * len(PLAIN_STEP_FIELDS)


@dataclass(frozen=True)
class PlainStepParts:
    """What one SGLang version supplies to the shared plain step."""

    #: where the target keeps its (verify-shaped) graph runner.
    graph_attr: str
    #: the last accepted token of each request, from the batch's draft input.
    last_token: Callable[[Any], Any]
    #: ``(worker, batch, stream)``: tell the caching allocator that the
    #: scheduler's batch tensors are in use on the forward stream, as verify
    #: does, before the step rebinds them.
    keep_batch_on_stream: Callable[[Any, Any, Any], None]
    #: ``(tensors, stream)``: the same for the step's own new inputs.
    keep_inputs_on_stream: Callable[[Any, Any], None]
    #: ``(target_worker, batch, capture_hidden_mode) -> output``: the target's
    #: stock non-speculative forward and sampling.
    target_forward: Callable[[Any, Any, Any], Any]
    #: ``(worker, tokens, stride, seq_lens, output, ran_graph) -> result``: the
    #: version's result with its next draft input.
    build_result: Callable[[Any, Any, int, Any, Any, bool], Any]
    #: ``(worker, batch, result, bs)``: zero the next draft input (none/lazy).
    skip_draft_extend: Callable[[Any, Any, Any, int], None]
    #: ``(worker) -> context``: the draft's TP context for its forward.
    draft_tp_context: Callable[[Any], AbstractContextManager]
    #: ``(worker, batch) -> "graph" | "eager"``: the path SGLang's draft
    #: extend takes (CPU fields only; never raises).
    draft_extend_path: Callable[[Any, Any], str]
    #: a request's ``req_to_token`` row.
    req_row: Callable[[Any], int]
    #: ``(*args, **kwargs) -> on_publish``: the stock step's arguments after
    #: the batch, as the scheduler passes them; raises for ones the plain
    #: step cannot honour.
    on_publish_of: Callable[..., Any]


def flat_plain_result(
    next_token_ids: Any,
    *,
    stride: int,
    next_draft_input: Any = None,
    logits_output: Any = None,
    can_run_cuda_graph: bool = False,
    **version_fields: Any,
) -> Any:
    """A plain step's ``GenerationBatchResult`` in the flat speculative format
    every spec-v2 resolver reads: request i's token at ``i * stride`` of a
    flat ``bs * stride`` int32 tensor (the other slots are padding the
    resolver never reads) and every accept length 1 (``accept - 1 = 0``
    accepted drafts). ``version_fields``: what a version's scheduler also
    reads from the result."""
    from sglang.srt.managers.utils import GenerationBatchResult

    flat, accept_lens = flat_plain_tokens(next_token_ids, stride)
    return GenerationBatchResult(
        logits_output=logits_output,
        next_token_ids=flat,
        can_run_cuda_graph=can_run_cuda_graph,
        next_draft_input=next_draft_input,
        accept_lens=accept_lens,
        **version_fields,
    )


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


class PlainStep:
    """A version's plain step: ``blocker(batch)`` says why a batch cannot take
    it (or None), ``run(worker, batch, ...)`` runs it and returns the result.

    If the step raises, the batch fields it rebinds are put back before the
    exception leaves, so the stock speculative step that then runs instead
    (see ``GateRuntime.run_plain_step``) sees the batch SGLang handed over.

    With lazy draft sync, ``before_spec(worker, batch)`` catches the draft up
    before a SPEC step, through the version's ``draft_extend(worker, batch,
    result)``.
    """

    def __init__(
        self,
        run: Callable[..., Any],
        blocker: Callable[[Any], str | None],
        *,
        lazy: LazyDraftSync | None = None,
        draft_extend: Callable[[Any, Any, Any], None] | None = None,
    ) -> None:
        self._run = run
        self.blocker = blocker
        #: the lazy draft-sync buffer, when draft_sync is "lazy".
        self.lazy = lazy
        self._draft_extend = draft_extend
        #: runs before a SPEC step of a decode batch (lazy draft catch-up).
        self.before_spec = self._catch_up if lazy is not None else None

    def _catch_up(self, worker: Any, batch: Any) -> bool:
        return self.lazy.catch_up(worker, batch, self._draft_extend)

    def run(self, worker: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
        # getattr(batch, name, None) for every field, in C (no bytecodes per
        # field on the hot path)
        saved = tuple(map(getattr, repeat(batch), PLAIN_STEP_FIELDS, _NONES))
        try:
            return self._run(worker, batch, *args, **kwargs)
        except BaseException:
            for name, value in zip(PLAIN_STEP_FIELDS, saved, strict=True):
                setattr(batch, name, value)
            raise


def plain_step(
    parts: PlainStepParts,
    worker: Any,
    batch: Any,
    draft_sync: str = "eager",
    lazy: LazyDraftSync | None = None,
    graphs: PlainGraphs | None = None,
    on_publish: Callable[[Any], Any] | None = None,
) -> Any:
    """One target DECODE step inside ``EAGLEWorkerV2`` (see the module doc)."""
    import torch
    from sglang.srt.model_executor.forward_batch_info import (
        CaptureHiddenMode,
        ForwardMode,
    )

    draft_input = batch.spec_info
    stride = int(worker.speculative_num_draft_tokens)
    bs = int(batch.seq_lens.shape[0])
    seq_lens, seq_lens_cpu, seq_lens_sum = (
        batch.seq_lens,
        batch.seq_lens_cpu,
        batch.seq_lens_sum,
    )
    # Only eager sync keeps the draft's proposal for this position current
    # (lazy and none leave it stale or zero): only then is it a sample.
    measure_matches = (
        draft_sync == "eager"
        and stride > 1
        and getattr(draft_input, "topk_index", None) is not None
    )
    if draft_sync == "lazy" and seq_lens_cpu is None:
        # lazy's bookkeeping reads CPU lengths; without them (a backend that
        # skips the copy) this step keeps the draft exact the eager way.
        draft_sync = "eager"
    req_to_token = worker.req_to_token_pool.req_to_token
    target = worker.target_worker

    # The scheduler's batch tensors were allocated on its schedule stream and
    # this step drops their only references mid-forward (as verify does).
    stream = torch.get_device_module(worker.device).current_stream()
    parts.keep_batch_on_stream(worker, batch, stream)

    # 1. target decode of the last accepted token at position seq_lens
    batch.input_ids = parts.last_token(draft_input).to(torch.int64)
    batch.out_cache_loc = kv_slots(req_to_token, batch.req_pool_indices, seq_lens, 1)
    parts.keep_inputs_on_stream((batch.input_ids, batch.out_cache_loc), stream)
    batch.seq_lens = seq_lens + 1
    batch.seq_lens_cpu = seq_lens_cpu + 1 if seq_lens_cpu is not None else None
    batch.seq_lens_sum = seq_lens_sum + bs if seq_lens_sum is not None else None
    batch.spec_info = None
    batch.forward_mode = ForwardMode.DECODE
    capture = CaptureHiddenMode.NULL if draft_sync == "none" else CaptureHiddenMode.LAST
    out, ran_graph = plain_target_forward(
        target.model_runner,
        parts.graph_attr,
        graphs,
        bs,
        lambda: parts.target_forward(target, batch, capture),
    )
    tokens = out.next_token_ids
    result = parts.build_result(worker, tokens, stride, seq_lens, out, ran_graph)
    if measure_matches:
        hot = getattr(worker.draft_worker, "hot_token_id", None)
        mark_draft_matches(result, tokens, draft_input, hot, stride)
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
        draft_extend(parts, worker, batch, result, graphs)
    else:
        parts.skip_draft_extend(worker, batch, result, bs)
        if draft_sync == "lazy":
            lazy.record(worker, batch, tokens, logits.hidden_states)
    logits.hidden_states = None  # consumed; spares the scheduler a D2H copy
    return result


def draft_extend(
    parts: PlainStepParts,
    worker: Any,
    batch: Any,
    result: Any,
    graphs: PlainGraphs | None = None,
) -> None:
    """SGLang's own draft extend over ``result``'s flat layout, in the draft's
    TP and MoE contexts, as ``EAGLEWorkerV2.forward_batch_generation`` runs it.

    ``graphs`` (``PlainGraphs``): counts the path SGLang takes (predicted
    before, counted once the extend returned; a failed one is not counted)."""
    from sglang.srt.speculative import eagle_worker_v2 as ew

    path = parts.draft_extend_path(worker, batch) if graphs is not None else None
    with (
        parts.draft_tp_context(worker),
        ew.speculative_moe_backend_context(),
        ew.speculative_moe_a2a_backend_context(),
    ):
        worker.draft_worker._draft_extend_for_decode(batch, result)
    if path is not None:
        graphs.count_draft_extend(path)


def make_plain_step(
    parts: PlainStepParts,
    blocker: Callable[[Any], str | None],
    draft_sync: str,
    graphs: PlainGraphs | None = None,
) -> PlainStep:
    """A version's :class:`PlainStep`. ``graphs``: the plain step's DECODE
    CUDA graphs (``PlainGraphs``), or None: the target always runs eagerly
    and nothing is counted. The step runs :func:`plain_step` under the test
    wrappers registered with
    :func:`eagle_gate.adapters.plain.testing.wrap_plain_step`, applied here
    once (none outside tests: :func:`plain_step` itself)."""
    lazy = LazyDraftSync(parts.req_row) if draft_sync == "lazy" else None
    step = testing.wrapped_plain_step(plain_step)

    def run(worker: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
        # Everything the scheduler passed the stock step (0.5.23 passes
        # on_publish= and grammar_barrier= by keyword) goes through the
        # version's own reading of those arguments.
        on_publish = parts.on_publish_of(*args, **kwargs)
        return step(parts, worker, batch, draft_sync, lazy, graphs, on_publish)

    def catch_up_extend(worker: Any, batch: Any, result: Any) -> None:
        # the lazy catch-up's draft extend, counted like the eager sync's
        draft_extend(parts, worker, batch, result, graphs)

    return PlainStep(run=run, blocker=blocker, lazy=lazy, draft_extend=catch_up_extend)


def bind(
    parts: PlainStepParts, blocker: Callable[[Any], str | None]
) -> tuple[Callable[..., None], Callable[..., PlainStep]]:
    """A version's two entry points over its parts: ``draft_extend(worker,
    batch, result, graphs=None)`` and ``make_plain_step(draft_sync,
    graphs=None)`` (``graphs``: the plain step's DECODE CUDA graphs, or None:
    the target always runs eagerly and nothing is counted)."""
    return (
        functools.partial(draft_extend, parts),
        functools.partial(make_plain_step, parts, blocker),
    )
