"""A CPU harness for the plain step, built from real SGLang pieces.

Real: SGLang's ``TpModelWorker`` serving the tiny Llama on CPU (its model
forward, KV pool, ``req_to_token`` pool, attention backend and sampler),
``Req``, ``ScheduleBatch`` -> ``ModelWorkerBatch``, ``EagleDraftInput``,
``FutureMap`` and the spec-v2 resolver.

Stand-ins, because they only run on a GPU:

* the EAGLE draft model: :class:`DraftStandIn` records what the plain step
  hands SGLang's ``_draft_extend_for_decode`` and fills the next draft input
  with deterministic values of the real shapes;
* SGLang's draft + verify (a SPEC step): :func:`spec_step_stand_in` decodes
  ``k`` tokens with the REAL target model, one position at a time, and returns
  them exactly as verify does (flat layout, accept length ``k``), i.e. a verify
  that accepted ``k-1`` perfect drafts plus the bonus token;
* the scheduler's spec-v2 over-allocation: SGLang's
  ``EagleDraftInput.prepare_for_decode`` assigns ``req_to_token`` with a Triton
  kernel; :meth:`Harness.prepare_for_decode` does the same in torch.
"""

from __future__ import annotations

import contextlib
import functools
import types
from pathlib import Path

import torch

STRIDE = 4  # speculative_num_draft_tokens: num_steps 3 + 1, topk 1
HIDDEN = 64  # the tiny Llama's hidden size


class DraftStandIn:
    """Stands in for the EAGLE draft worker (its forward needs a GPU)."""

    def __init__(self) -> None:
        self.extend_calls: list[dict] = []
        self.hidden_size = HIDDEN
        self.draft_runner = types.SimpleNamespace(tp_group=None)
        self.tp_contexts: list = []

    def draft_tp_context(self, tp_group):
        """The draft's TP context, as SGLang's draft worker provides it."""
        self.tp_contexts.append(tp_group)
        return contextlib.nullcontext()

    def _draft_extend_for_decode(self, batch, result) -> None:
        bs = int(batch.seq_lens.shape[0])
        self.extend_calls.append(
            {
                # SGLang's draft extend feeds the result's flat tokens
                "input_ids": result.next_token_ids.clone(),
                "out_cache_loc": batch.out_cache_loc.clone(),
                "seq_lens": batch.seq_lens.clone(),
                "hidden": result.logits_output.hidden_states.clone(),
                "accept_lens": result.accept_lens.clone(),
            }
        )
        nd = result.next_draft_input
        nd.topk_p = torch.full((bs, 1), 0.5)
        # the real draft extend reads the row of each request's last accepted
        # position: select_index = i * STRIDE + accept_len - 1
        select = torch.arange(bs) * STRIDE + result.accept_lens.to(torch.int64) - 1
        picked = result.next_token_ids.to(torch.int64)[select]
        nd.topk_index = picked[:, None] + 1
        nd.hidden_states = torch.ones((bs, HIDDEN))


class Harness:
    """One target worker on CPU and a decode batch driven like the scheduler.

    The methods under "the plain step, as the worker gets it" are the ones the
    0.5.23 harness has too, so one test drives either version's plain step
    (``support.plain.installed_harness``).
    """

    version = "0.5.9"

    def __init__(self, model_dir: Path) -> None:
        from sglang.srt.managers.tp_worker import TpModelWorker
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.chunk_cache import ChunkCache
        from sglang.srt.server_args import ServerArgs, get_global_server_args
        from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2
        from sglang.srt.utils import get_free_port

        server_args = ServerArgs(
            model_path=str(model_dir),
            device="cpu",
            dtype="float32",
            mem_fraction_static=0.05,
            max_total_tokens=4096,
            attention_backend="torch_native",
            sampling_backend="pytorch",
            random_seed=0,
            disable_cuda_graph=True,
        )
        self.target = TpModelWorker(
            server_args,
            gpu_id=0,
            tp_rank=0,
            moe_ep_rank=0,
            pp_rank=0,
            attn_cp_rank=0,
            moe_dp_rank=0,
            dp_rank=None,
            nccl_port=get_free_port(),
        )
        # What an EAGLE server's global args say (read by SGLang's helpers).
        g = get_global_server_args()
        g.speculative_algorithm = "EAGLE"
        g.speculative_num_steps = STRIDE - 1
        g.speculative_eagle_topk = 1
        g.speculative_num_draft_tokens = STRIDE
        self.req_to_token_pool, self.allocator = self.target.get_memory_pool()
        self.cache = ChunkCache(
            CacheInitParams(
                disable=True,
                req_to_token_pool=self.req_to_token_pool,
                token_to_kv_pool_allocator=self.allocator,
                page_size=1,
            )
        )
        self.draft = DraftStandIn()
        worker = object.__new__(EAGLEWorkerV2)
        worker._target_worker = self.target
        worker._draft_worker = self.draft
        worker.req_to_token_pool = self.req_to_token_pool
        worker.speculative_num_draft_tokens = STRIDE
        worker.speculative_num_steps = STRIDE - 1
        worker.topk = 1
        worker.device = "cpu"
        self.worker = worker
        self.resolver_owner = types.SimpleNamespace(draft_worker=worker)

    # -- the plain step, as the worker gets it ---------------------------------
    @property
    def adapter(self):
        from eagle_gate.adapters import sglang_0_5_9

        return sglang_0_5_9

    def worker_batch(self, batch):
        """What 0.5.9's scheduler hands the worker: a ``ModelWorkerBatch``."""
        return batch.get_model_worker_batch()

    def isolation(self, view):
        """0.5.9 hands the worker its own ``ModelWorkerBatch``: nothing to
        isolate (0.5.23's scheduler restores its batch after the step)."""
        return contextlib.nullcontext()

    def plain_step(self, view, draft_sync="eager", *, lazy=None, graphs=None):
        """The adapter's plain step on ``view`` (a ``worker_batch``)."""
        return self.adapter.plain.plain_step(
            self.worker, view, draft_sync, lazy, graphs
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
        return req.spec_accepted_tokens

    # -- batches -------------------------------------------------------------
    def prefill(self, prompts: list[list[int]], **sampling):
        """Prefill with the real target; return the decode-ready ScheduleBatch."""
        from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
        from sglang.srt.model_executor.forward_batch_info import ForwardMode
        from sglang.srt.sampling.sampling_params import SamplingParams
        from sglang.srt.speculative.eagle_info import EagleDraftInput
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        reqs = []
        for i, prompt in enumerate(prompts):
            params = SamplingParams(max_new_tokens=64, **{"temperature": 0, **sampling})
            params.normalize(None)
            params.verify(1000)
            req = Req(f"r{i}", "", list(prompt), params)
            req.init_next_round_input(self.cache)
            reqs.append(req)
        batch = ScheduleBatch.init_new(
            reqs,
            self.req_to_token_pool,
            self.allocator,
            self.cache,
            self.target.model_runner.model_config,
            True,
            SpeculativeAlgorithm.NONE,
        )
        batch.prepare_for_extend()
        out = self.target.forward_batch_generation(batch.get_model_worker_batch())
        tokens = out.next_token_ids
        for req, token in zip(reqs, tokens.tolist(), strict=True):
            req.output_ids.append(token)
        bs = len(reqs)
        batch.spec_algorithm = SpeculativeAlgorithm.EAGLE
        batch.spec_info = EagleDraftInput(
            verified_id=tokens.to(torch.int32),
            new_seq_lens=batch.seq_lens,
            topk_p=torch.full((bs, 1), 0.5),
            topk_index=torch.zeros((bs, 1), dtype=torch.int64),
            hidden_states=torch.ones((bs, HIDDEN)),
        )
        batch.forward_mode = ForwardMode.DECODE
        return batch

    def prepare_for_decode(self, batch) -> None:
        """SGLang's spec-v2 ``prepare_for_decode`` (page size 1), in torch."""
        from sglang.srt.managers.utils import get_alloc_len_per_decode
        from sglang.srt.mem_cache.common import alloc_token_slots
        from sglang.srt.model_executor.forward_batch_info import ForwardMode

        batch.forward_mode = ForwardMode.DECODE
        per_decode = get_alloc_len_per_decode()
        spans, need = [], 0
        for req in batch.reqs:
            grow = req.kv_committed_len + 2 * per_decode - req.kv_allocated_len
            spans.append((req.kv_allocated_len, req.kv_allocated_len + grow))
            need += grow
            req.kv_allocated_len += grow
            req.decode_batch_idx += 1
        locs = alloc_token_slots(batch.tree_cache, need)
        table = self.req_to_token_pool.req_to_token
        offset = 0
        for row, (start, end) in zip(
            batch.req_pool_indices.tolist(), spans, strict=True
        ):
            table[row, start:end] = locs[offset : offset + end - start].to(table.dtype)
            offset += end - start
        batch.seq_lens_cpu = batch.seq_lens.cpu()
        batch.seq_lens_sum = int(batch.seq_lens_cpu.sum())

    def commit(self, batch, result) -> list[list[int]]:
        """What the scheduler does with a result: the real resolver, then the
        next batch state from the result's next draft input."""
        from sglang.srt.managers.scheduler_output_processor_mixin import (
            SchedulerOutputProcessorMixin as Mixin,
        )

        result.next_token_ids = result.next_token_ids.cpu()
        result.accept_lens = result.accept_lens.cpu()
        tokens = Mixin._resolve_spec_overlap_token_ids(
            self.resolver_owner, result, batch
        )
        for req, new in zip(batch.reqs, tokens, strict=True):
            req.output_ids.extend(new)
        nd = result.next_draft_input
        batch.seq_lens = nd.new_seq_lens
        batch.seq_lens_cpu = batch.seq_lens.cpu()
        batch.seq_lens_sum = int(batch.seq_lens_cpu.sum())
        batch.spec_info = nd
        return tokens


def spec_step_stand_in(harness: Harness, mwb, k: int):
    """Stands in for SGLang's draft + verify (GPU only): decodes ``k`` tokens
    with the real target at positions ``seq_lens .. seq_lens+k-1`` and returns
    them as verify does: flat ``bs*STRIDE`` tokens, accept length ``k``."""
    from sglang.srt.managers.utils import GenerationBatchResult
    from sglang.srt.speculative.eagle_info import EagleDraftInput

    from eagle_gate.adapters import sglang_0_5_9 as adapter

    seq_lens, seq_lens_cpu = mwb.seq_lens, mwb.seq_lens_cpu
    verified = mwb.spec_info
    bs = int(seq_lens.shape[0])
    runs = []
    for j in range(k):
        mwb.seq_lens = seq_lens + j
        mwb.seq_lens_cpu = seq_lens_cpu + j
        mwb.seq_lens_sum = int(mwb.seq_lens_cpu.sum())
        mwb.spec_info = verified
        step = adapter.plain.plain_step(harness.worker, mwb, draft_sync="none")
        runs.append(step.next_token_ids[::STRIDE])
        verified = step.next_draft_input
    flat = torch.zeros(bs * STRIDE, dtype=torch.int32)
    for j, run in enumerate(runs):
        flat[j::STRIDE] = run
    nd = EagleDraftInput(
        verified_id=runs[-1].to(torch.int32),
        new_seq_lens=seq_lens + k,
        topk_p=torch.full((bs, 1), 0.5),
        topk_index=torch.zeros((bs, 1), dtype=torch.int64),
        hidden_states=torch.ones((bs, HIDDEN)),
    )
    return GenerationBatchResult(
        next_token_ids=flat,
        accept_lens=torch.full((bs,), k, dtype=torch.int32),
        next_draft_input=nd,
    )


@functools.lru_cache(maxsize=2)
def _hf_model(model_dir: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)


def hf_greedy(model_dir: Path, prompt: list[int], n: int) -> list[int]:
    """Reference: transformers' own greedy decode of the same weights."""
    model = _hf_model(Path(model_dir))
    out = model.generate(
        torch.tensor([prompt]), max_new_tokens=n, do_sample=False, pad_token_id=0
    )
    return out[0, len(prompt) :].tolist()


def hf_hidden(model_dir: Path, tokens: list[int]):
    """Reference for the hidden state an EAGLE target hands its draft: the
    last layer's output after the final norm (what ``lm_head`` reads; SGLang's
    ``LogitsProcessor`` stores it for ``CaptureHiddenMode.LAST`` / ``FULL``
    without aux layers), one row per position of ``tokens``, from
    transformers' own forward of the same weights: ``[len(tokens), hidden]``."""
    model = _hf_model(Path(model_dir))
    with torch.no_grad():
        out = model(torch.tensor([tokens]), output_hidden_states=True)
    return out.hidden_states[-1][0]
