"""The 0.5.23 CPU harness itself: a real target worker, real batches, and a
plain greedy decode done by hand that matches transformers token for token.

``support/plain_harness_0_5_23.py`` says what is real and what stands in.
"""

from __future__ import annotations

import pytest
import sglang_env
import torch

pytestmark = pytest.mark.skipif(
    sglang_env.version() != "0.5.23",
    reason="the harness drives SGLang 0.5.23's scheduler and spec-v2 objects",
)

PROMPTS = [[1, 5, 9, 33, 70], [1, 44, 12], [1, 7, 7, 7, 7, 7, 7, 7, 2]]
STEPS = 4


@pytest.fixture(scope="module")
def harness(plain_harness):
    """The installed version's harness (``support.plain``): 0.5.23's here."""
    return plain_harness


def test_builds_a_real_target_worker_under_an_eagle_config(harness):
    from sglang.srt.layers.attention.torch_native_backend import (
        TorchNativeAttnBackend,
    )
    from sglang.srt.managers.tp_worker import TpModelWorker
    from sglang.srt.runtime_context import get_spec
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2
    from support.plain_harness_0_5_23 import STRIDE

    target = harness.target
    assert isinstance(target, TpModelWorker)
    runner = target.model_runner
    assert isinstance(runner.attn_backend, TorchNativeAttnBackend)
    assert runner.spec_algorithm.is_eagle()
    assert runner.decode_cuda_graph_runner is None
    pool, allocator = target.get_memory_pool()
    assert pool is harness.req_to_token_pool and allocator is harness.allocator
    assert allocator.page_size == 1 and allocator.available_size() > 1000
    assert target.model_config.hidden_size == 64
    spec = get_spec()
    assert (spec.speculative_algorithm, spec.speculative_num_draft_tokens) == (
        "EAGLE",
        STRIDE,
    )
    worker = harness.worker
    assert isinstance(worker, EAGLEWorkerV2)
    assert worker.target_worker is target and worker.draft_worker is harness.draft
    assert (worker.speculative_num_draft_tokens, worker.speculative_num_steps) == (4, 3)
    assert (worker.topk, worker.device) == (1, "cpu")
    assert worker.req_to_token_pool is harness.req_to_token_pool
    assert worker.token_to_kv_pool_allocator is harness.allocator


def test_prefill_returns_a_decode_ready_spec_v2_batch(harness):
    from sglang.srt.speculative.eagle_info import EagleDraftInput
    from support.plain_harness_0_5_23 import HIDDEN

    batch = harness.prefill(PROMPTS)
    bs = len(PROMPTS)
    assert batch.forward_mode.is_decode() and batch.spec_algorithm.is_eagle()
    assert batch.seq_lens.tolist() == [len(p) for p in PROMPTS]
    assert [r.kv.kv_committed_len for r in batch.reqs] == [len(p) for p in PROMPTS]
    spec = batch.spec_info
    assert isinstance(spec, EagleDraftInput)
    assert spec.bonus_tokens.dtype == torch.int32
    assert spec.bonus_tokens.tolist() == [r.output_ids[-1] for r in batch.reqs]
    assert spec.topk_p.shape == (bs, 1) and spec.topk_index.shape == (bs, 1)
    assert spec.hidden_states.shape == (bs, HIDDEN)


def test_prepare_for_decode_over_allocates_like_sglang(harness):
    from support.plain_harness_0_5_23 import STRIDE

    batch = harness.prefill(PROMPTS)
    free_before = harness.allocator.available_size()
    harness.prepare_for_decode(batch)
    reserve = 2 * STRIDE  # 2 * max(num_steps * topk, num_draft_tokens)
    lens = [len(p) for p in PROMPTS]
    assert [r.kv.kv_allocated_len for r in batch.reqs] == [n + reserve for n in lens]
    assert free_before - harness.allocator.available_size() == reserve * len(lens)
    table = harness.req_to_token_pool.req_to_token
    slots = [
        table[row, : n + reserve].tolist()
        for row, n in zip(batch.req_pool_indices.tolist(), lens, strict=True)
    ]
    flat = [s for row in slots for s in row]
    assert len(set(flat)) == len(flat) and min(flat) > 0
    # a second preparation with nothing committed allocates nothing
    harness.prepare_for_decode(batch)
    assert [r.kv.kv_allocated_len for r in batch.reqs] == [n + reserve for n in lens]


def test_plain_greedy_decode_by_hand_matches_transformers(harness, tiny_model):
    """DECODE of the bonus token at position seq_lens through the real target,
    for a few steps: the same tokens as transformers' greedy generate."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.speculative.eagle_info import EagleDraftInput
    from support.plain_harness_0_5_23 import hf_greedy

    batch = harness.prefill(PROMPTS)
    produced = [[r.output_ids[-1]] for r in batch.reqs]
    table = harness.req_to_token_pool.req_to_token
    for _ in range(STEPS):
        harness.prepare_for_decode(batch)
        seq_lens = batch.seq_lens
        with harness.forward_isolation(batch):
            batch.input_ids = batch.spec_info.bonus_tokens.to(torch.int64)
            batch.out_cache_loc = table[batch.req_pool_indices, seq_lens].to(
                torch.int64
            )
            batch.seq_lens = seq_lens + 1
            batch.seq_lens_cpu = batch.seq_lens.cpu()
            batch.seq_lens_sum = int(batch.seq_lens_cpu.sum())
            batch.spec_info = None
            batch.forward_mode = ForwardMode.DECODE
            out = harness.target.forward_batch_generation(batch)
        # the scheduler's isolation restored the batch
        assert batch.seq_lens is seq_lens and batch.spec_info is not None
        tokens = out.next_token_ids
        for row, token in zip(produced, tokens.tolist(), strict=True):
            row.append(token)
        for req in batch.reqs:
            req.kv.kv_committed_len += 1
        batch.spec_info = EagleDraftInput(bonus_tokens=tokens.to(torch.int32))
        batch.seq_lens = seq_lens + 1
        batch.seq_lens_cpu = batch.seq_lens.cpu()
        batch.seq_lens_sum = int(batch.seq_lens_cpu.sum())
    for prompt, got in zip(PROMPTS, produced, strict=True):
        assert got == hf_greedy(tiny_model, prompt, STEPS + 1)


def test_commit_runs_the_real_resolver_and_advances_the_batch(harness, tiny_model):
    """A plain-shaped result and a SPEC-shaped one (the stand-in) through the
    real resolver: output and KV bookkeeping stay those of greedy decoding."""
    from support.plain_harness_0_5_23 import (
        STRIDE,
        decode_one,
        hf_greedy,
        spec_step_stand_in,
    )

    adapter = sglang_env.adapter()
    batch = harness.prefill(PROMPTS[:2])
    lens = [len(p) for p in PROMPTS[:2]]

    # a plain step's result, built by the adapter, with the draft stand-in
    harness.prepare_for_decode(batch)
    seq_lens = batch.seq_lens
    out = decode_one(harness, batch)
    from sglang.srt.speculative.eagle_info import EagleDraftInput

    result = adapter.plain.build_plain_result(
        out.next_token_ids,
        stride=STRIDE,
        seq_lens=seq_lens,
        next_draft_input=EagleDraftInput(
            bonus_tokens=out.next_token_ids.to(torch.int32)
        ),
        logits_output=out.logits_output,
    )
    harness.draft.extend_calls.clear()
    harness.draft._draft_extend_for_decode(batch, result)
    (call,) = harness.draft.extend_calls
    assert call["input_ids"].tolist() == result.next_token_ids.tolist()
    nd = result.next_draft_input
    assert nd.topk_index[:, 0].tolist() == [t + 1 for t in out.next_token_ids.tolist()]
    tokens = harness.commit(batch, result)
    assert tokens == [[t] for t in out.next_token_ids.tolist()]
    assert batch.seq_lens.tolist() == [n + 1 for n in lens]
    assert batch.spec_info is nd
    assert [r.kv.kv_committed_len for r in batch.reqs] == [n + 1 for n in lens]
    assert [r.spec_num_correct_drafts for r in batch.reqs] == [0, 0]

    # a SPEC step accepting 3 tokens
    harness.prepare_for_decode(batch)
    tokens = harness.commit(batch, spec_step_stand_in(harness, batch, 3))
    assert [len(t) for t in tokens] == [3, 3]
    assert batch.seq_lens.tolist() == [n + 4 for n in lens]
    assert [r.kv.kv_committed_len for r in batch.reqs] == [n + 4 for n in lens]
    assert [r.spec_num_correct_drafts for r in batch.reqs] == [2, 2]
    for prompt, req in zip(PROMPTS[:2], batch.reqs, strict=True):
        assert list(req.output_ids) == hf_greedy(tiny_model, prompt, 5)
