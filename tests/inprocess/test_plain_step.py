"""The plain step on CPU: real SGLang target forward, batches and draft inputs.

Only the EAGLE draft model and SGLang's GPU draft + verify are stand-ins (see
``support/plain_harness.py``, which says exactly what is real); the target
model, its KV cache, sampling, ``FutureMap`` and the resolver are SGLang's own.
"""

from __future__ import annotations

import pytest
import sglang_env
import torch
from sglang_env import changed_slots, kv_snapshot

pytestmark = pytest.mark.skipif(
    sglang_env.version() != "0.5.9",
    reason="this module drives SGLang 0.5.9's spec-v2 objects; "
    "test_plain_step_0_5_23.py covers 0.5.23",
)

PROMPTS = [[1, 5, 9, 33, 70], [1, 44, 12], [1, 7, 7, 7, 7, 7, 7, 7, 2]]


@pytest.fixture(scope="module")
def harness(tiny_model):
    from support.plain_harness import Harness

    return Harness(tiny_model)


@pytest.fixture(scope="module")
def adapter():
    from eagle_gate.adapters import sglang_0_5_9

    return sglang_0_5_9


def test_plain_step_writes_one_kv_slot_at_seq_lens_and_returns_flat_result(
    harness, adapter, mocker
):
    from support.plain_harness import STRIDE

    batch = harness.prefill(PROMPTS)
    harness.prepare_for_decode(batch)
    mwb = batch.get_model_worker_batch()
    seq_lens = mwb.seq_lens.clone()
    expected_slots = {
        int(harness.req_to_token_pool.req_to_token[row, pos])
        for row, pos in zip(
            mwb.req_pool_indices.tolist(), seq_lens.tolist(), strict=True
        )
    }
    verified = mwb.spec_info.verified_id.clone()
    spy = mocker.spy(harness.target.model_runner, "forward")
    before = kv_snapshot(harness)

    result = adapter.plain.plain_step(harness.worker, mwb, draft_sync="eager")

    # exactly one target KV slot per request, the one at position seq_lens
    assert changed_slots(before, kv_snapshot(harness)) == expected_slots
    # one DECODE forward (not TARGET_VERIFY) of the verified token at seq_lens
    forward_batch = spy.call_args.args[0]
    assert forward_batch.forward_mode.is_decode()
    assert forward_batch.positions.tolist() == seq_lens.tolist()
    assert forward_batch.input_ids.tolist() == verified.tolist()
    assert spy.call_count == 1
    # the flat speculative format
    bs = len(PROMPTS)
    tokens = result.next_token_ids
    assert tokens.shape == (bs * STRIDE,) and tokens.dtype == torch.int32
    assert result.accept_lens.tolist() == [1] * bs
    nd = result.next_draft_input
    assert nd.verified_id.tolist() == tokens[::STRIDE].tolist()
    assert nd.new_seq_lens.tolist() == (seq_lens + 1).tolist()
    assert nd.verify_done is not None
    # the batch is left as SGLang's draft extend / scheduler expect it
    assert mwb.seq_lens.tolist() == seq_lens.tolist()


def test_eager_draft_sync_runs_the_draft_extend_over_the_flat_layout(
    harness, adapter, tiny_model
):
    """The draft extend gets, per request, the new token and the target's
    hidden state at the decoded position, checked against transformers'
    forward of the same weights (wrong layer, position, row or the state
    before the final norm all differ)."""
    from support.plain_harness import STRIDE, hf_hidden

    batch = harness.prefill(PROMPTS[:2])
    sequences = [list(r.origin_input_ids) + list(r.output_ids) for r in batch.reqs]
    harness.prepare_for_decode(batch)
    mwb = batch.get_model_worker_batch()
    seq_lens = mwb.seq_lens.clone()
    rows = mwb.req_pool_indices.tolist()
    harness.draft.extend_calls.clear()
    result = adapter.plain.plain_step(harness.worker, mwb, draft_sync="eager")
    (call,) = harness.draft.extend_calls
    table = harness.req_to_token_pool.req_to_token
    expected_locs = [
        int(table[row, pos + j])
        for row, pos in zip(rows, seq_lens.tolist(), strict=True)
        for j in range(STRIDE)
    ]
    assert call["out_cache_loc"].tolist() == expected_locs
    assert call["seq_lens"].tolist() == seq_lens.tolist()
    assert (
        call["input_ids"][::STRIDE].tolist() == result.next_token_ids[::STRIDE].tolist()
    )
    hidden = call["hidden"]
    assert hidden.shape == (2 * STRIDE, harness.target.model_config.hidden_size)
    # the target's hidden state at seq_lens, the position of the token decoded
    for i, (seq, pos) in enumerate(zip(sequences, seq_lens.tolist(), strict=True)):
        assert pos == len(seq) - 1
        reference = hf_hidden(tiny_model, seq)[pos]
        assert torch.allclose(hidden[i * STRIDE], reference, atol=1e-4), i
    padding = torch.ones(2 * STRIDE, dtype=torch.bool)
    padding[::STRIDE] = False
    assert hidden[padding].abs().sum() == 0
    assert call["accept_lens"].tolist() == [1, 1]
    assert result.logits_output.hidden_states is None  # consumed, not copied out


def test_none_draft_sync_zero_fills_the_next_draft_input(harness, adapter):
    batch = harness.prefill(PROMPTS[:2])
    harness.prepare_for_decode(batch)
    harness.draft.extend_calls.clear()
    result = adapter.plain.plain_step(
        harness.worker, batch.get_model_worker_batch(), "none"
    )
    assert harness.draft.extend_calls == []
    nd = result.next_draft_input
    assert nd.topk_p.shape == (2, 1) and nd.topk_p.dtype == torch.float32
    assert nd.topk_index.shape == (2, 1) and nd.topk_index.dtype == torch.int64
    assert nd.hidden_states.shape == (2, 64) and not nd.hidden_states.any()


def test_next_draft_input_round_trips_through_the_real_future_map(harness, adapter):
    """The FutureMap sizes its buffers from the first stored draft input (here a
    SPEC step's); a plain step's must store and resolve into the same buffers."""
    from sglang.srt.managers.overlap_utils import FutureMap
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from support.plain_harness import spec_step_stand_in

    future_map = FutureMap(8, 0, 2048, torch.device("cpu"), SpeculativeAlgorithm.EAGLE)
    batch = harness.prefill(PROMPTS[:2])
    lazy = adapter.plain.make_plain_step("lazy")
    for run in ("spec", "plain-eager", "plain-none", "plain-lazy"):
        harness.prepare_for_decode(batch)
        mwb = batch.get_model_worker_batch()
        if run == "spec":
            result = spec_step_stand_in(harness, mwb, 2)
        elif run == "plain-lazy":
            result = lazy.run(harness.worker, mwb)
        else:
            result = adapter.plain.plain_step(harness.worker, mwb, run.split("-")[1])
        indices = future_map.alloc_future_indices(2)
        future_map.store_to_map(indices, result)  # raises on a shape/dtype mismatch
        # resolve_future's indexing, without its CUDA-only record_stream call
        at = indices.indices
        nd = result.next_draft_input
        assert future_map.verified_id_buf[at].tolist() == nd.verified_id.tolist()
        assert future_map.new_seq_lens_buf[at].tolist() == nd.new_seq_lens.tolist()
        assert torch.equal(future_map.topk_index_buf[at], nd.topk_index)
        assert torch.equal(future_map.hidden_states_buf[at], nd.hidden_states)
        harness.commit(batch, result)


def test_mode_switches_emit_exactly_the_plain_greedy_tokens(
    harness, adapter, tiny_model
):
    """SPEC x3, PLAIN x5, SPEC x2, PLAIN x1 (SPEC through the stand-in verify,
    which accepts 2 tokens per step) emits the tokens transformers' greedy
    decode of the same weights emits."""
    from support.plain_harness import hf_greedy, spec_step_stand_in

    batch = harness.prefill(PROMPTS)
    schedule = ["spec"] * 3 + ["plain"] * 5 + ["spec"] * 2 + ["plain"]
    for i, mode in enumerate(schedule):
        harness.prepare_for_decode(batch)
        mwb = batch.get_model_worker_batch()
        if mode == "spec":
            result = spec_step_stand_in(harness, mwb, 2)
        else:
            result = adapter.plain.plain_step(
                harness.worker, mwb, ("eager", "none")[i % 2]
            )
        harness.commit(batch, result)
    n = 1 + 2 * 5 + 5 + 1  # prefill token, 5 SPEC steps of 2, 6 PLAIN steps of 1
    for req, prompt in zip(batch.reqs, PROMPTS, strict=True):
        assert len(req.output_ids) == n
        assert req.output_ids == hf_greedy(tiny_model, prompt, n)
        assert req.kv_committed_len == len(prompt) + n - 1
        assert req.spec_verify_ct == len(schedule)
        assert req.spec_accepted_tokens == 5  # one accepted draft per SPEC step


@pytest.mark.parametrize(
    ("sampling", "reason"),
    [
        ({"frequency_penalty": 0.5}, "penalties"),
        ({"presence_penalty": 0.5}, "penalties"),
        ({}, None),
        ({"temperature": 0.7, "top_p": 0.9, "top_k": 20}, None),
    ],
)
def test_blocker_names_what_the_plain_step_cannot_serve(
    harness, adapter, sampling, reason
):
    batch = harness.prefill(PROMPTS[:1], **sampling)
    harness.prepare_for_decode(batch)
    mwb = batch.get_model_worker_batch()
    assert adapter.plain.plain_step_blocker(mwb) == reason
    mwb.return_logprob = True
    assert adapter.plain.plain_step_blocker(mwb) == "logprobs"


def test_sampled_plain_step_follows_the_batch_sampling_parameters(harness, adapter):
    """Temperature / top-k go through SGLang's stock sampler: with top_k=1 a
    hot temperature must still give the greedy token."""
    greedy = harness.prefill(PROMPTS[:1])
    harness.prepare_for_decode(greedy)
    a = adapter.plain.plain_step(
        harness.worker, greedy.get_model_worker_batch(), "none"
    )
    hot = harness.prefill(PROMPTS[:1], temperature=5.0, top_k=1)
    harness.prepare_for_decode(hot)
    b = adapter.plain.plain_step(harness.worker, hot.get_model_worker_batch(), "none")
    assert a.next_token_ids[0] == b.next_token_ids[0]


def _plain_steps(harness, plain, batch, n):
    """n plain steps through ``plain`` (a PlainStep); returns the new tokens,
    ``[bs, n]``."""
    tokens = []
    for _ in range(n):
        harness.prepare_for_decode(batch)
        mwb = batch.get_model_worker_batch()
        result = plain.run(harness.worker, mwb)
        tokens.append(
            result.next_token_ids[:: harness.worker.speculative_num_draft_tokens]
        )
        harness.commit(batch, result)
    return torch.stack(tokens, dim=1)  # [bs, n]


def _hf_gap_hidden(model_dir, batch, n):
    """The target hidden states a draft needs for the last ``n`` plain steps
    of each request of ``batch`` (positions ``len - 1 - n .. len - 2`` of
    prompt + output: each step decoded the token before its new one), from
    transformers' forward: ``[bs, n, hidden]``. Independent of the plain
    step, so a state eager and lazy sync both got wrong still fails."""
    from support.plain_harness import hf_hidden

    rows = []
    for req in batch.reqs:
        seq = list(req.origin_input_ids) + list(req.output_ids)
        rows.append(hf_hidden(model_dir, seq)[len(seq) - 1 - n : len(seq) - 1])
    return torch.stack(rows)


@pytest.mark.parametrize("n_plain", [3, 6])
def test_lazy_catch_up_covers_exactly_the_gap(harness, adapter, tiny_model, n_plain):
    """PLAIN x n with lazy sync, then SPEC: one batched draft extend before the
    SPEC step gets the (token, target hidden, KV slot) triples of the gap, for
    the whole gap when it fits the buffer (STRIDE positions) and for its most
    recent STRIDE positions when not; the hidden states checked against
    transformers' forward at those positions (not against eager sync's)."""
    from support.plain_harness import STRIDE

    plain = adapter.plain.make_plain_step("lazy")
    batch = harness.prefill(PROMPTS[:2])
    harness.draft.extend_calls.clear()
    tokens = _plain_steps(harness, plain, batch, n_plain)
    assert harness.draft.extend_calls == []  # nothing ran for the draft yet
    harness.prepare_for_decode(batch)
    mwb = batch.get_model_worker_batch()
    seq_lens = mwb.seq_lens.clone()
    assert plain.before_spec(harness.worker, mwb) is True
    (call,) = harness.draft.extend_calls
    hidden_ref = _hf_gap_hidden(tiny_model, batch, n_plain)
    covered = min(n_plain, STRIDE)
    window = slice(n_plain - covered, n_plain)
    assert call["accept_lens"].tolist() == [covered, covered]
    assert call["seq_lens"].tolist() == (seq_lens - covered).tolist()
    ids = call["input_ids"].view(2, STRIDE)
    assert ids[:, :covered].tolist() == tokens[:, window].tolist()
    hid = call["hidden"].view(2, STRIDE, -1)
    assert torch.allclose(hid[:, :covered], hidden_ref[:, window], atol=1e-4)
    assert not hid[:, covered:].any()
    locs = call["out_cache_loc"].view(2, STRIDE)[:, :covered]
    table = harness.req_to_token_pool.req_to_token
    rows = mwb.req_pool_indices.tolist()
    expected = [
        [int(table[r, p]) for p in range(s - covered, s)]
        for r, s in zip(rows, seq_lens.tolist(), strict=True)
    ]
    assert locs.tolist() == expected
    # the caught-up rows replaced the zero-filled next draft input
    assert mwb.spec_info.topk_index[:, 0].tolist() == (tokens[:, -1] + 1).tolist()
    # the batch is as the scheduler left it, and the gap is closed
    assert mwb.seq_lens.tolist() == seq_lens.tolist()
    assert plain.before_spec(harness.worker, mwb) is False


def test_lazy_mode_switches_emit_exactly_the_plain_greedy_tokens(
    harness, adapter, tiny_model
):
    from support.plain_harness import hf_greedy, spec_step_stand_in

    plain = adapter.plain.make_plain_step("lazy")
    batch = harness.prefill(PROMPTS)
    schedule = ["spec"] * 2 + ["plain"] * 5 + ["spec"] * 2 + ["plain"] * 2 + ["spec"]
    for mode in schedule:
        harness.prepare_for_decode(batch)
        mwb = batch.get_model_worker_batch()
        if mode == "spec":
            plain.before_spec(harness.worker, mwb)
            result = spec_step_stand_in(harness, mwb, 2)
        else:
            result = plain.run(harness.worker, mwb)
        harness.commit(batch, result)
    n = 1 + 2 * 5 + 7
    for req, prompt in zip(batch.reqs, PROMPTS, strict=True):
        assert req.output_ids == hf_greedy(tiny_model, prompt, n)


def test_lazy_buffer_is_reported_at_start_and_bounded(harness, adapter):
    """The size check at activation predicts the buffer the first lazy plain
    step allocates, and a bound below it refuses the launch."""
    import types

    from eagle_gate.adapters.refusals import GateRefused, check_lazy_buffer
    from eagle_gate.config import GateConfig

    scheduler = types.SimpleNamespace(draft_worker=harness.worker)
    spec = types.SimpleNamespace(algorithm="EAGLE")  # as SGLang resolved it
    config = GateConfig("goodput", draft_sync="lazy", lazy_max_mib=64)
    predicted = check_lazy_buffer(scheduler, spec, config)
    plain = adapter.plain.make_plain_step("lazy")
    batch = harness.prefill(PROMPTS[:1])
    harness.prepare_for_decode(batch)
    plain.run(harness.worker, batch.get_model_worker_batch())
    assert plain.lazy.bytes == predicted > 0
    tiny = GateConfig("goodput", draft_sync="lazy", lazy_max_mib=1)
    big_rows = types.SimpleNamespace(
        draft_worker=types.SimpleNamespace(
            req_to_token_pool=types.SimpleNamespace(
                req_to_token=torch.zeros((4096, 1), dtype=torch.int32)
            ),
            speculative_num_draft_tokens=4,
            target_worker=harness.worker.target_worker,
        )
    )
    with pytest.raises(GateRefused, match="lazy_max_mib=1"):
        check_lazy_buffer(big_rows, types.SimpleNamespace(algorithm="EAGLE3"), tiny)


def test_plain_step_keeps_seq_lens_alive_on_the_forward_stream(
    harness, adapter, mocker
):
    """0.5.9's verify calls ``batch.seq_lens.record_stream(current stream)``:
    after filter/merge the tensor was allocated on the schedule stream, and
    it is read on the forward stream after the target forward. The plain step
    reads it there too (new lengths, KV slots, draft extend), so it must do
    the same, before the forward. (A CPU tensor has no caching allocator, so
    here the call is observed, not its effect.)"""
    batch = harness.prefill(PROMPTS[:2])
    harness.prepare_for_decode(batch)
    mwb = batch.get_model_worker_batch()
    seq_lens = mwb.seq_lens
    forward = mocker.spy(harness.target.model_runner, "forward")
    forwards_before_keep = []
    keep = mocker.patch.object(
        adapter.plain,  # the version's plain-step module
        "keep_on_stream",
        side_effect=lambda t, s: forwards_before_keep.append(forward.call_count),
    )
    adapter.plain.plain_step(harness.worker, mwb, draft_sync="none")
    (call,) = keep.call_args_list
    assert call.args[0] is seq_lens
    assert call.args[1] is torch.get_device_module("cpu").current_stream()
    assert forwards_before_keep == [0] and forward.call_count == 1


@pytest.mark.parametrize("draft_sync", ["eager", "lazy", "none"])
def test_the_patched_worker_called_as_the_scheduler_calls_it(
    harness, adapter, tiny_model, draft_sync
):
    """0.5.9's overlap scheduler calls
    ``self.model_worker.forward_batch_generation(model_worker_batch)``: here
    the class method carries the adapter's real wrapper, policy ``never``
    decides, and the plain step runs through it step after step (SPEC steps
    in between through the stand-in verify), emitting transformers' tokens."""
    from support.plain_harness import hf_greedy, spec_step_stand_in

    from eagle_gate.adapters.hooks import ACTIVE
    from eagle_gate.config import GateConfig
    from eagle_gate.runtime import GateRuntime

    adapter.INSTRUMENTOR.instrument()
    adapter.INSTRUMENTOR.require_applied([adapter.WORKER_MODULE])
    config = GateConfig("never", draft_sync=draft_sync)
    ACTIVE.runtime = GateRuntime(
        config,
        config.create_policy(),
        sglang_version="0.5.9",
        adapter=adapter.NAME,
        num_draft_tokens=4,
        plain_step=adapter.plain.make_plain_step(draft_sync),
        req_len=adapter.committed_len,
    )
    try:
        batch = harness.prefill(PROMPTS)
        for mode in ["plain", "plain", "spec", "plain"]:
            harness.prepare_for_decode(batch)
            mwb = batch.get_model_worker_batch()
            if mode == "spec":
                result = spec_step_stand_in(harness, mwb, 2)
            else:
                result = harness.worker.forward_batch_generation(mwb)
                assert result.eagle_gate_mode.name == "PLAIN"
            harness.commit(batch, result)
        assert ACTIVE.runtime.counters.steps_by_mode[1] == 3
        assert ACTIVE.runtime.counters.plain_step_failures == 0
        assert ACTIVE.runtime.counters.internal_errors == 0
    finally:
        ACTIVE.runtime = None
        adapter.INSTRUMENTOR.uninstrument()
    n = 1 + 3 + 2
    for req, prompt in zip(batch.reqs, PROMPTS, strict=True):
        assert req.output_ids == hf_greedy(tiny_model, prompt, n)


def test_the_plain_steps_draft_extends_are_counted_by_path(
    harness, adapter, monkeypatch
):
    """docs/plain-graphs.md §5.7: each draft extend the plain step runs through
    SGLang's ``_draft_extend_for_decode`` is counted by the path SGLang takes:
    one per plain step under eager sync, none under ``none`` or per lazy plain
    step, one per lazy catch-up. With no draft-extend graph (what SGLang
    leaves on CPU) each is eager; with a runner the batch fits, the
    prediction says graph (the stand-in draft runs the same either way)."""
    from types import SimpleNamespace

    from eagle_gate.adapters.plain.graphs import PlainGraphs

    monkeypatch.setattr(
        harness.draft, "cuda_graph_runner_for_draft_extend", None, raising=False
    )
    graphs = PlainGraphs()
    counted: list[str] = []
    graphs.on_draft_extend = counted.append
    batch = harness.prefill(PROMPTS[:2])
    for sync in ("eager", "none", "eager"):
        harness.prepare_for_decode(batch)
        mwb = batch.get_model_worker_batch()
        result = adapter.plain.plain_step(harness.worker, mwb, sync, None, graphs)
        harness.commit(batch, result)
    assert counted == ["eager", "eager"]
    harness.draft.cuda_graph_runner_for_draft_extend = SimpleNamespace(
        capture_bs=[1, 2], max_bs=2, disable_padding=False, require_mlp_sync=False
    )
    lazy = adapter.plain.make_plain_step("lazy", graphs=graphs)
    _plain_steps(harness, lazy, batch, 2)
    assert counted == ["eager", "eager"]  # nothing for the draft yet
    harness.prepare_for_decode(batch)
    assert lazy.before_spec(harness.worker, batch.get_model_worker_batch()) is True
    assert counted == ["eager", "eager", "graph"]  # one catch-up, bs 2 fits


def test_the_blocker_judges_a_schedule_batch_as_its_worker_batch(harness, adapter):
    """Under DP attention the gate decides at SGLang's MLP-sync gather, on the
    ScheduleBatch (no ``lora_ids`` there: LoRA shows per request), not on the
    ModelWorkerBatch the worker gets later: both give the same reason."""
    batch = harness.prefill(PROMPTS[:2])
    harness.prepare_for_decode(batch)
    assert adapter.plain.plain_step_blocker(batch) is None
    assert adapter.plain.plain_step_blocker(batch.get_model_worker_batch()) is None
    batch.reqs[1].lora_id = "an-adapter"
    assert adapter.plain.plain_step_blocker(batch) == "lora"
    assert adapter.plain.plain_step_blocker(batch.get_model_worker_batch()) == "lora"
