"""A CPU harness for the plain step on SGLang 0.5.23, built from real pieces.

The 0.5.23 twin of ``support/plain_harness.py`` (0.5.9). Everything runs in
the test process, the way one scheduler process of a real EAGLE server brings
up tensor-parallel rank 0.

Real, and called the way SGLang calls it:

* the configuration: an EAGLE ``ServerArgs`` (draft path = the target, 3 steps,
  topk 1, 4 draft tokens) resolved with ``ServerArgs.resolve_once()`` and
  published with ``runtime_context.publish(role="scheduler", SpawnRanks(...))``,
  as ``run_scheduler_process`` does; so ``get_spec()`` and everything sized
  from it (KV over-allocation, ``req_to_token`` row width) says EAGLE;
* the start-up: ``Scheduler.init_model_config``,
  ``bootstrap.init_parallel_runtime`` (a 1-rank gloo WORLD),
  ``bootstrap.init_layer_runtime`` and ``Scheduler.init_model_worker`` (which
  builds ``TpModelWorker`` and runs ``init_memory_pools``,
  ``init_all_attention_backends``, ``init_all_cuda_graphs`` and
  ``prewarm_sampling``), called on a ``Scheduler`` made with
  ``object.__new__`` that holds only the attributes those methods read; then
  ``kv_cache_builder.build_kv_cache`` for the tree cache (radix cache
  disabled). The target serves the tiny Llama with the ``torch_native``
  attention backend, its KV pool, ``req_to_token`` pool and allocator;
* batches: ``Req``, ``ScheduleBatch.init_new``, ``prepare_for_extend``,
  ``resolve_forward_inputs`` and ``TpModelWorker.forward_batch_generation``
  (prefill with FULL hidden capture, as ``EAGLEWorkerV2`` does), inside the
  scheduler's own ``Scheduler._forward_isolation``;
* decode preparation: ``ScheduleBatch.prepare_for_decode`` ->
  ``spec_prepare_for_decode`` -> ``eagle_prepare_for_decode`` ->
  ``alloc_for_spec_decode`` (page-aligned over-allocation to
  ``kv_committed_len + 2 * max(num_steps * topk, num_draft_tokens)``);
* results: ``SchedulerBatchResultProcessor._resolve_spec_v2_tokens`` on a
  processor built with its real constructor (as
  ``Scheduler.init_batch_result_processor`` does; the fields the resolver
  does not read are None), a ``SchedulerMetricsReporter`` made with
  ``object.__new__`` (only ``scheduler.enable_fpm = False`` is read) and the
  EAGLE worker shell below; ``GenerationBatchResult.copy_to_cpu``.

Stand-ins, because they only run on a GPU:

* ``alloc_for_spec_decode`` writes ``req_to_token`` with
  ``sgl_kernel.assign_req_to_token_pool_cpu`` on CPU (Triton on GPU); the
  CPU ``sgl_kernel`` here is a stand-in without it, so
  :meth:`Harness.prepare_for_decode` swaps in :func:`assign_req_to_token_torch`
  (the same writes, in torch) for the duration of the call only;
* the EAGLE draft worker: :class:`DraftStandIn` records what it is handed
  and fills the next draft input with deterministic values of the real shapes;
* ``EAGLEWorkerV2``: a shell made with ``object.__new__`` (plus
  ``BaseSpecWorker.__init__``) holding the target, the draft stand-in and the
  attributes a plain step and the resolver read;
* SGLang's draft + verify (a SPEC step): :func:`spec_step_stand_in` decodes
  ``k`` tokens with the REAL target and returns them as ``run_eagle_verify``
  does.

Fragile by nature: ``init_parallel_runtime`` may run once per process, so the
first :class:`Harness` publishes the configuration and builds the process
groups and later ones (same model directory) reuse them; another test that
publishes a different configuration in the same process changes what the
harness reads through ``get_spec()`` and friends.
"""

from __future__ import annotations

import contextlib
import os
import types
from pathlib import Path

import torch

from support.plain_harness import (  # noqa: F401  (re-exported references)
    hf_greedy,
    hf_hidden,
)

os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

STRIDE = 4  # speculative_num_draft_tokens: num_steps 3 + 1, topk 1
NUM_STEPS = STRIDE - 1
TOPK = 1
HIDDEN = 64  # the tiny Llama's hidden size
DRAFT_TOPK_P = 0.5  # what the draft stand-in reports as its top-1 probability

#: the model directory this process published (``init_parallel_runtime`` runs once)
_PUBLISHED: dict[str, object] = {}


def assign_req_to_token_torch(
    req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, pool_len
) -> None:
    """``sgl_kernel.assign_req_to_token_pool_cpu`` / the Triton
    ``assign_req_to_token_pool`` in torch: row ``req_pool_indices[i]`` gets
    ``out_cache_loc`` entries at columns ``[start_offset[i], end_offset[i])``,
    requests packed one after another in ``out_cache_loc``."""
    offset = 0
    for row, start, end in zip(
        req_pool_indices.tolist(),
        start_offset.tolist(),
        end_offset.tolist(),
        strict=True,
    ):
        assert end <= pool_len
        req_to_token[row, start:end] = out_cache_loc[offset : offset + end - start].to(
            req_to_token.dtype
        )
        offset += end - start


class DraftStandIn:
    """Stands in for ``EagleDraftWorker`` (its forward needs a GPU backend).

    ``_draft_extend_for_decode`` has the real signature, records its inputs
    and fills ``next_draft_input`` like the real topk-1 path: rows picked at
    ``select_index = i*stride + accept_len - 1``; ``topk_p`` fp32 ``[bs, 1]``,
    ``topk_index`` int64 ``[bs, 1]`` (the picked token + 1),
    ``hidden_states`` ``[bs, spec_hidden_size]`` of the model dtype (ones).
    """

    def __init__(self, target) -> None:
        from sglang.srt.configs.draft_parallel import DraftParallelLayout
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        self.extend_calls: list[dict] = []
        self.speculative_num_draft_tokens = STRIDE
        self.speculative_num_steps = NUM_STEPS
        self.topk = TOPK
        self.device = "cpu"
        # no draft TP group: SGLang's draft_tp_context() is then a no-op
        self.parallel_layout = DraftParallelLayout(tp_group=None, attn_tp_size=1)
        # what get_draft_recurrent_hidden_state_spec() reads (the draft shares
        # the target's config here)
        self.draft_runner = types.SimpleNamespace(
            model_config=target.model_config,
            spec_algorithm=SpeculativeAlgorithm.EAGLE,
        )
        self.hidden_size = int(target.model_config.spec_hidden_size)
        self.dtype = target.model_config.dtype

    def _draft_extend_for_decode(self, batch, batch_result, *, kv_loc_plan=None):
        bs = int(batch.seq_lens.shape[0])
        logits = batch_result.logits_output
        hidden = getattr(logits, "hidden_states", None)
        self.extend_calls.append(
            {
                # SGLang's draft extend feeds the result's flat tokens
                "input_ids": batch_result.next_token_ids.clone(),
                "out_cache_loc": batch.out_cache_loc.clone(),
                "seq_lens": batch.seq_lens.clone(),
                "forward_mode": batch.forward_mode,
                "hidden": hidden.clone() if hidden is not None else None,
                "accept_lens": batch_result.accept_lens.clone(),
                "new_seq_lens": (
                    batch_result.new_seq_lens.clone()
                    if batch_result.new_seq_lens is not None
                    else None
                ),
                "kv_loc_plan": kv_loc_plan,
            }
        )
        select = (
            torch.arange(bs, device=batch_result.accept_lens.device) * STRIDE
            + batch_result.accept_lens.to(torch.int64)
            - 1
        )
        picked = batch_result.next_token_ids.to(torch.int64)[select]
        nd = batch_result.next_draft_input
        nd.topk_p = torch.full((bs, TOPK), DRAFT_TOPK_P, dtype=torch.float32)
        nd.topk_index = picked[:, None] + 1
        nd.hidden_states = torch.ones((bs, self.hidden_size), dtype=self.dtype)


class Harness:
    """One real target worker on CPU and decode batches driven like the
    0.5.23 scheduler's synchronous (non-overlap) spec-v2 path.

    Attributes: ``server_args``, ``scheduler`` (the ``object.__new__`` shell
    the real start-up methods ran on), ``target`` (``TpModelWorker``),
    ``req_to_token_pool``, ``allocator``, ``tree_cache``, ``draft``
    (:class:`DraftStandIn`), ``worker`` (the ``EAGLEWorkerV2`` shell) and
    ``result_processor`` (the real ``SchedulerBatchResultProcessor``).

    The methods under "the plain step, as the worker gets it" are the 0.5.9
    harness's too, so one test drives either version's plain step
    (``support.plain.installed_harness``).
    """

    version = "0.5.23"

    def __init__(self, model_dir: Path) -> None:
        from sglang.srt.disaggregation.utils import DisaggregationMode
        from sglang.srt.distributed import bootstrap
        from sglang.srt.managers.scheduler import Scheduler
        from sglang.srt.managers.scheduler_components.batch_result_processor import (
            SchedulerBatchResultProcessor,
        )
        from sglang.srt.managers.scheduler_components.logprob_result_processor import (
            SchedulerLogprobResultProcessor,
        )
        from sglang.srt.managers.scheduler_components.metrics_reporter import (
            SchedulerMetricsReporter,
        )
        from sglang.srt.mem_cache import kv_cache_builder
        from sglang.srt.runtime_context import (
            SpawnRanks,
            get_device,
            get_schedule,
            get_spec,
            publish,
        )
        from sglang.srt.server_args import ServerArgs
        from sglang.srt.speculative.base_spec_worker import BaseSpecWorker
        from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
        from sglang.srt.utils.network import get_free_port

        model_dir = str(model_dir)
        published = _PUBLISHED.get("model_dir")
        if published is None:
            server_args = ServerArgs(
                model_path=model_dir,
                device="cpu",
                dtype="float32",
                mem_fraction_static=0.05,
                max_total_tokens=4096,
                # tests never free their requests: room for all of them
                max_running_requests=256,
                attention_backend="torch_native",
                sampling_backend="pytorch",
                random_seed=0,
                disable_cuda_graph=True,
                disable_radix_cache=True,
                speculative_algorithm="EAGLE",
                speculative_draft_model_path=model_dir,
                speculative_num_steps=NUM_STEPS,
                speculative_eagle_topk=TOPK,
                speculative_num_draft_tokens=STRIDE,
            )
            # what the launcher and run_scheduler_process do before Scheduler()
            server_args.resolve_once()
            publish(
                server_args,
                role="scheduler",
                ranks=SpawnRanks(world_rank=0, dp_rank=None, gpu_id=0),
            )
        elif published != model_dir:
            raise RuntimeError(
                f"this process already published {published}; SGLang builds its "
                "process groups once per process"
            )
        else:
            server_args = _PUBLISHED["server_args"]
        self.server_args = server_args

        # The Scheduler.__init__ steps that bring up the model worker, on a
        # Scheduler holding only what they read.
        sched = object.__new__(Scheduler)
        sched.server_args = server_args
        sched.nccl_port = _PUBLISHED.get("nccl_port") or get_free_port()
        sched.spec_algorithm = SpeculativeAlgorithm.from_string(
            get_spec().speculative_algorithm
        )
        sched.page_size = get_schedule().page_size
        sched.enable_overlap = False  # SGLang turns overlap off for spec on CPU
        sched.enable_unified_memory = False
        sched.enable_fpm = False  # read by the metrics reporter
        # The draft worker needs a GPU draft attention backend: none is built.
        sched.maybe_init_draft_worker = lambda: setattr(sched, "draft_worker", None)
        sched.init_model_config()
        if published is None:
            bootstrap.init_parallel_runtime(
                server_args=server_args,
                device=get_device().device,
                dist_port=sched.nccl_port,
            )
            bootstrap.init_layer_runtime(model_config=sched.model_config)
            _PUBLISHED.update(
                model_dir=model_dir, server_args=server_args, nccl_port=sched.nccl_port
            )
        sched.init_model_worker()
        kv = kv_cache_builder.build_kv_cache(
            server_args=server_args,
            model_config=sched.model_config,
            tp_worker=sched.tp_worker,
            page_size=sched.page_size,
            spec_algorithm=sched.spec_algorithm,
            enable_metrics=False,
            enable_kv_cache_events=False,
            enable_hierarchical_cache=False,
        )
        sched.req_to_token_pool = kv.req_to_token_pool
        sched.token_to_kv_pool_allocator = kv.token_to_kv_pool_allocator
        sched.tree_cache = kv.tree_cache
        self.scheduler = sched
        self.target = sched.tp_worker
        self.req_to_token_pool = kv.req_to_token_pool
        self.allocator = kv.token_to_kv_pool_allocator
        self.tree_cache = kv.tree_cache

        self.draft = DraftStandIn(self.target)
        worker = object.__new__(EAGLEWorkerV2)
        BaseSpecWorker.__init__(worker)
        worker.server_args = server_args
        worker._target_worker = self.target
        worker._draft_worker = self.draft
        worker._hosts_draft = True
        worker.req_to_token_pool = self.req_to_token_pool
        worker.token_to_kv_pool_allocator = self.allocator
        worker.speculative_num_draft_tokens = STRIDE
        worker.speculative_num_steps = NUM_STEPS
        worker.topk = TOPK
        worker.device = "cpu"
        worker.gpu_id = 0
        worker.page_size = sched.page_size
        worker.speculative_algorithm = SpeculativeAlgorithm.EAGLE
        worker.adaptive_controller = None
        worker.enable_dp_spec_prefill_coordination = False
        worker.plan_stream, worker.plan_stream_ctx = None, contextlib.nullcontext()
        self.worker = worker
        sched.model_worker = sched.draft_worker = worker

        reporter = object.__new__(SchedulerMetricsReporter)
        reporter.scheduler = sched
        # Scheduler.init_batch_result_processor's constructor call; what the
        # resolver does not read is None.
        self.result_processor = SchedulerBatchResultProcessor(
            is_generation=True,
            disaggregation_mode=DisaggregationMode.NULL,
            enable_overlap=False,
            enable_overlap_mlx=False,
            model_config=sched.model_config,
            token_to_kv_pool_allocator=self.allocator,
            tree_cache=self.tree_cache,
            hisparse_coordinator=None,
            req_to_token_pool=self.req_to_token_pool,
            decode_offload_manager=None,
            metrics_collector=None,
            metrics_reporter=reporter,
            draft_worker=worker,
            model_worker=worker,
            logprob_result_processor=SchedulerLogprobResultProcessor(
                model_config=sched.model_config
            ),
            output_streamer=None,
            beam_coordinator=None,
            abort_request=None,
        )

    # -- the plain step, as the worker gets it ---------------------------------
    @property
    def adapter(self):
        from eagle_gate.adapters import sglang_0_5_23

        return sglang_0_5_23

    def worker_batch(self, batch):
        """What 0.5.23's scheduler hands the worker: the ``ScheduleBatch``."""
        return batch

    def isolation(self, view):
        """The scheduler's forward isolation around the worker's step."""
        return self.forward_isolation(view)

    def plain_step(
        self, view, draft_sync="eager", *, on_publish=None, lazy=None, graphs=None
    ):
        """The adapter's plain step on ``view``, inside the forward isolation."""
        with self.isolation(view):
            return self.adapter.plain.plain_step(
                self.worker, view, on_publish, draft_sync, lazy, graphs
            )

    def run(self, plain, view):
        """``plain.run`` (a ``make_plain_step`` PlainStep) as the worker runs it."""
        with self.isolation(view):
            return plain.run(self.worker, view)

    def spec_step(self, view, k: int):
        """A SPEC step accepting ``k`` tokens (:func:`spec_step_stand_in`)."""
        return spec_step_stand_in(self, view, k)

    @staticmethod
    def correct_drafts(req) -> int:
        """The request's count of accepted draft tokens."""
        return req.spec_num_correct_drafts

    # -- batches -------------------------------------------------------------
    def make_reqs(self, prompts: list[list[int]], **sampling) -> list:
        """Real ``Req`` objects admitted whole (no chunking), as the prefill
        adder leaves them (``extend_end`` = the full fill)."""
        from array import array

        from sglang.srt.managers.schedule_batch import Req
        from sglang.srt.sampling.sampling_params import SamplingParams

        vocab = self.target.model_config.vocab_size
        reqs = []
        for i, prompt in enumerate(prompts):
            params = SamplingParams(
                **{"max_new_tokens": 64, "temperature": 0, **sampling}
            )
            params.normalize(None)
            params.verify(vocab)
            req = Req(f"r{i}", "", array("q", prompt), params, vocab_size=vocab)
            req.init_next_round_input(self.tree_cache)
            req.extend_end = len(req.full_untruncated_fill_ids)
            reqs.append(req)
        return reqs

    @contextlib.contextmanager
    def forward_isolation(self, batch):
        """The scheduler's own ``_forward_isolation`` (non-overlap): every
        ``ScheduleBatch`` field is restored after the block."""
        from sglang.srt.managers.scheduler import Scheduler

        with Scheduler._forward_isolation(self.scheduler, batch, overlap=False):
            yield

    def prefill(self, prompts: list[list[int]], **sampling):
        """Prefill with the real target; return the decode-ready ScheduleBatch
        (``spec_info``: an ``EagleDraftInput`` with ``bonus_tokens``, the
        prefill's sampled token per request, which sits at position
        ``seq_lens`` and is not in the KV cache yet)."""
        from sglang.srt.managers.overlap_utils import resolve_forward_inputs
        from sglang.srt.managers.schedule_batch import ScheduleBatch
        from sglang.srt.model_executor.forward_batch_info import (
            CaptureHiddenMode,
            ForwardMode,
        )
        from sglang.srt.speculative.eagle_info import EagleDraftInput
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        reqs = self.make_reqs(prompts, **sampling)
        batch = ScheduleBatch.init_new(
            reqs,
            self.req_to_token_pool,
            self.allocator,
            self.tree_cache,
            self.target.model_config,
            False,
            SpeculativeAlgorithm.EAGLE,
        )
        batch.prepare_for_extend()
        resolve_forward_inputs(batch, None)  # prefill: staged ids -> input_ids
        with self.forward_isolation(batch):
            # EAGLEWorkerV2._forward_prefill_batch's target half
            out = self.target.forward_batch_generation(
                batch, capture_hidden_mode=CaptureHiddenMode.FULL
            )
        tokens = out.next_token_ids
        for req, token in zip(reqs, tokens.tolist(), strict=True):
            req.output_ids.append(token)
        bs = len(reqs)
        # what the draft's prefill extend would hand over (stand-in values)
        batch.spec_info = EagleDraftInput(
            bonus_tokens=tokens.to(torch.int32),
            topk_p=torch.full((bs, TOPK), DRAFT_TOPK_P, dtype=torch.float32),
            topk_index=tokens.to(torch.int64)[:, None] + 1,
            hidden_states=torch.ones(
                (bs, self.draft.hidden_size), dtype=self.draft.dtype
            ),
            num_tokens_per_req=1,
            num_tokens_for_logprob_per_req=1,
        )
        batch.input_ids = None  # the scheduler clears it after every forward
        batch.forward_mode = ForwardMode.DECODE
        return batch

    def prepare_for_decode(self, batch) -> None:
        """SGLang's own ``ScheduleBatch.prepare_for_decode`` (spec-v2 branch:
        ``eagle_prepare_for_decode``), with only its ``req_to_token`` write
        kernel swapped for :func:`assign_req_to_token_torch` during the call."""
        from unittest import mock

        from sglang.srt.mem_cache import allocation

        with mock.patch.object(
            allocation, "assign_req_to_token_pool_cpu", assign_req_to_token_torch
        ):
            batch.prepare_for_decode()
        if batch.seq_lens_cpu is not None:
            batch.seq_lens_sum = int(batch.seq_lens_cpu.sum())

    def commit(self, batch, result) -> list[list[int]]:
        """What the synchronous scheduler does with a decode result: the next
        batch state (``spec_info``, ``seq_lens``), the D2H copy, the REAL
        resolver, then the new tokens appended to each request."""
        batch.spec_info = result.next_draft_input
        new_seq_lens = result.new_seq_lens
        if new_seq_lens is not None and new_seq_lens is not batch.seq_lens:
            batch.seq_lens = new_seq_lens
            batch.seq_lens_cpu = new_seq_lens.to("cpu")
            batch.seq_lens_sum = int(batch.seq_lens_cpu.sum())
        batch.input_ids = None
        result.copy_done = torch.get_device_module("cpu").Event()
        result.copy_to_cpu(
            return_logprob=batch.return_logprob,
            return_hidden_states=batch.return_hidden_states,
        )
        tokens = self.result_processor._resolve_spec_v2_tokens(result, batch)
        for req, new in zip(batch.reqs, tokens, strict=True):
            req.output_ids.extend(new)
        return tokens


def decode_one(harness: Harness, batch, *, capture_hidden_mode=None):
    """A plain target DECODE of ``bonus_tokens`` at position ``seq_lens`` (the
    slot ``prepare_for_decode`` reserved), inside the scheduler's forward
    isolation; returns the ``TpModelWorker`` result (batch unchanged)."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    seq_lens = batch.seq_lens
    rows = batch.req_pool_indices
    with harness.forward_isolation(batch):
        batch.input_ids = batch.spec_info.bonus_tokens.to(torch.int64)
        batch.out_cache_loc = harness.req_to_token_pool.req_to_token[rows, seq_lens].to(
            torch.int64
        )
        batch.seq_lens = seq_lens + 1
        batch.seq_lens_cpu = batch.seq_lens.cpu()
        batch.seq_lens_sum = int(batch.seq_lens_cpu.sum())
        batch.spec_info = None
        batch.forward_mode = ForwardMode.DECODE
        return harness.target.forward_batch_generation(
            batch, capture_hidden_mode=capture_hidden_mode
        )


def spec_step_stand_in(harness: Harness, batch, k: int):
    """Stands in for ``EAGLEWorkerV2``'s draft + verify + draft extend (GPU
    only): decodes ``k`` (<= STRIDE) tokens with the real target at positions
    ``seq_lens .. seq_lens+k-1`` and returns them as ``run_eagle_verify``
    does (flat ``bs*STRIDE`` int32, accept length ``k``, ``new_seq_lens =
    seq_lens + k``), with the next draft input filled like the draft stand-in
    fills it. The batch is left as it came in."""
    from sglang.srt.managers.utils import GenerationBatchResult
    from sglang.srt.speculative.eagle_info import EagleDraftInput

    assert 1 <= k <= STRIDE
    seq_lens, seq_lens_cpu, spec_info = (
        batch.seq_lens,
        batch.seq_lens_cpu,
        batch.spec_info,
    )
    bs = int(seq_lens.shape[0])
    runs = []
    try:
        for j in range(k):
            batch.seq_lens = seq_lens + j
            batch.seq_lens_cpu = seq_lens_cpu + j
            out = decode_one(harness, batch)
            runs.append(out.next_token_ids)
            batch.spec_info = EagleDraftInput(bonus_tokens=out.next_token_ids)
    finally:
        batch.seq_lens, batch.seq_lens_cpu, batch.spec_info = (
            seq_lens,
            seq_lens_cpu,
            spec_info,
        )
        batch.seq_lens_sum = int(seq_lens_cpu.sum())
    flat = torch.zeros(bs * STRIDE, dtype=torch.int32)
    for j, run in enumerate(runs):
        flat[j::STRIDE] = run.to(torch.int32)
    last = runs[-1].to(torch.int32)
    nd = EagleDraftInput(
        bonus_tokens=last,
        topk_p=torch.full((bs, TOPK), DRAFT_TOPK_P, dtype=torch.float32),
        topk_index=last.to(torch.int64)[:, None] + 1,
        hidden_states=torch.ones(
            (bs, harness.draft.hidden_size), dtype=harness.draft.dtype
        ),
    )
    return GenerationBatchResult(
        next_token_ids=flat,
        accept_lens=torch.full((bs,), k, dtype=torch.int32),
        next_draft_input=nd,
        new_seq_lens=seq_lens + k,
        speculative_num_draft_tokens=STRIDE,
    )
