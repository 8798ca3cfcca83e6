"""The plain step on CPU: real SGLang target forward, batches and draft inputs.

One module for every SGLang version: the ``plain_harness`` fixture builds the
installed version's harness (``support/plain_harness.py`` for 0.5.9,
``support/plain_harness_0_5_23.py`` for 0.5.23, each saying exactly what is
real), and the harness hands the plain step what that version's scheduler
hands the worker (0.5.9: a ``ModelWorkerBatch``; 0.5.23: the ``ScheduleBatch``,
inside the scheduler's own forward isolation). Only the EAGLE draft model and
SGLang's GPU draft + verify are stand-ins; the target model, its KV cache,
sampling, ``FutureMap`` and the resolver are SGLang's own. Tests of what only
one version has are marked with that version.
"""

from __future__ import annotations

import pytest
import sglang_env
import torch
from sglang_env import changed_slots, committed, kv_snapshot
from support.plain_harness import STRIDE, hf_greedy, hf_hidden

VERSION = sglang_env.version()
only_0_5_9 = pytest.mark.skipif(
    VERSION != "0.5.9", reason="drives SGLang 0.5.9's spec-v2 objects"
)
only_0_5_23 = pytest.mark.skipif(
    VERSION != "0.5.23", reason="drives SGLang 0.5.23's scheduler objects"
)

PROMPTS = [[1, 5, 9, 33, 70], [1, 44, 12], [1, 7, 7, 7, 7, 7, 7, 7, 2]]


@pytest.fixture(scope="module")
def harness(plain_harness):
    return plain_harness


@pytest.fixture(scope="module")
def adapter(harness):
    return harness.adapter


def _decode_ready(harness, batch):
    """``prepare_for_decode``, then the batch the worker gets."""
    harness.prepare_for_decode(batch)
    return harness.worker_batch(batch)


# -- both versions ---------------------------------------------------------------
def test_eager_draft_sync_runs_the_draft_extend_over_the_flat_layout(
    harness, tiny_model
):
    """The draft extend gets, per request, the new token and the target's
    hidden state at the decoded position, checked against transformers'
    forward of the same weights (wrong layer, position, row or the state
    before the final norm all differ)."""
    batch = harness.prefill(PROMPTS[:2])
    sequences = [list(r.origin_input_ids) + list(r.output_ids) for r in batch.reqs]
    view = _decode_ready(harness, batch)
    seq_lens = view.seq_lens.clone()
    rows = view.req_pool_indices.tolist()
    harness.draft.extend_calls.clear()
    result = harness.plain_step(view, "eager")
    (call,) = harness.draft.extend_calls
    table = harness.req_to_token_pool.req_to_token
    expected_locs = [
        int(table[row, pos + j])
        for row, pos in zip(rows, seq_lens.tolist(), strict=True)
        for j in range(STRIDE)
    ]
    assert call["out_cache_loc"].tolist() == expected_locs
    assert call["seq_lens"].tolist() == seq_lens.tolist()
    if VERSION == "0.5.23":
        assert call["forward_mode"].is_decode()
        assert call["new_seq_lens"].tolist() == (seq_lens + 1).tolist()
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


def test_none_draft_sync_zero_fills_the_next_draft_input(harness):
    """No draft extend runs; the next draft input is zeros of the real shapes
    and dtypes (0.5.23: SGLang's own zero fill)."""
    batch = harness.prefill(PROMPTS[:2])
    view = _decode_ready(harness, batch)
    harness.draft.extend_calls.clear()
    result = harness.plain_step(view, "none")
    assert harness.draft.extend_calls == []
    nd = result.next_draft_input
    assert nd.topk_p.shape == (2, 1) and nd.topk_p.dtype == torch.float32
    assert not nd.topk_p.any()
    assert nd.topk_index.shape == (2, 1) and nd.topk_index.dtype == torch.int64
    assert nd.hidden_states.shape == (2, harness.draft.hidden_size) == (2, 64)
    assert not nd.hidden_states.any()


def _store_0_5_9(future_map, batch, result):
    """0.5.9's FutureMap: store at fresh future indices, read back as
    ``resolve_future`` indexes (without its CUDA-only record_stream call)."""
    indices = future_map.alloc_future_indices(2)
    future_map.store_to_map(indices, result)  # raises on a shape/dtype mismatch
    at = indices.indices
    nd = result.next_draft_input
    assert future_map.verified_id_buf[at].tolist() == nd.verified_id.tolist()
    assert future_map.new_seq_lens_buf[at].tolist() == nd.new_seq_lens.tolist()
    assert torch.equal(future_map.topk_index_buf[at], nd.topk_index)
    assert torch.equal(future_map.hidden_states_buf[at], nd.hidden_states)


def _store_0_5_23(future_map, batch, result):
    """0.5.23's FutureMap: stash by request row into its relay buffers."""
    from sglang.srt.managers.overlap_utils import RelayPayload

    rows = batch.req_pool_indices
    nd = result.next_draft_input
    future_map.stash(rows, RelayPayload.from_draft_input(nd))
    assert future_map.output_tokens_buf[rows].tolist() == nd.bonus_tokens.tolist()
    assert torch.equal(future_map.topk_p_buf[rows], nd.topk_p)
    assert torch.equal(future_map.topk_index_buf[rows], nd.topk_index)
    assert torch.equal(future_map.hidden_states_buf[rows], nd.hidden_states)


def _future_map(harness):
    from sglang.srt.managers.overlap_utils import FutureMap
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    eagle, cpu = SpeculativeAlgorithm.EAGLE, torch.device("cpu")
    if VERSION == "0.5.9":
        return FutureMap(8, 0, 2048, cpu, eagle)
    return FutureMap(cpu, eagle, harness.req_to_token_pool)


def test_next_draft_input_round_trips_through_the_real_future_map(harness, adapter):
    """The FutureMap sizes its buffers from the first draft input it stores
    (here a SPEC step's); plain steps' next draft inputs, of every draft-sync
    strategy, must store and resolve into the same buffers unchanged."""
    future_map = _future_map(harness)
    store = _store_0_5_9 if VERSION == "0.5.9" else _store_0_5_23
    batch = harness.prefill(PROMPTS[:2])
    lazy = adapter.plain.make_plain_step("lazy")
    for run in ("spec", "eager", "none", "lazy"):
        view = _decode_ready(harness, batch)
        if run == "spec":
            result = harness.spec_step(view, 2)
        elif run == "lazy":
            result = harness.run(lazy, view)
        else:
            result = harness.plain_step(view, run)
        store(future_map, batch, result)
        harness.commit(batch, result)


def test_mode_switches_emit_exactly_the_plain_greedy_tokens(harness, tiny_model):
    """SPEC x3, PLAIN x5, SPEC x2, PLAIN x1 (SPEC through the stand-in verify,
    which accepts 2 tokens per step), through the version's real resolver,
    emits the tokens transformers' greedy decode of the same weights emits."""
    batch = harness.prefill(PROMPTS)
    schedule = ["spec"] * 3 + ["plain"] * 5 + ["spec"] * 2 + ["plain"]
    for i, mode in enumerate(schedule):
        view = _decode_ready(harness, batch)
        if mode == "spec":
            result = harness.spec_step(view, 2)
        else:
            result = harness.plain_step(view, ("eager", "none")[i % 2])
        harness.commit(batch, result)
    n = 1 + 2 * 5 + 5 + 1  # prefill token, 5 SPEC steps of 2, 6 PLAIN steps of 1
    for req, prompt in zip(batch.reqs, PROMPTS, strict=True):
        assert len(req.output_ids) == n
        assert list(req.output_ids) == hf_greedy(tiny_model, prompt, n)
        assert committed(req) == len(prompt) + n - 1
        assert req.spec_verify_ct == len(schedule)
        # one accepted draft per SPEC step, none for PLAIN
        assert harness.correct_drafts(req) == 5


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
    view = _decode_ready(harness, batch)
    with harness.isolation(view):  # as the worker sees the batch
        assert adapter.plain.plain_step_blocker(view) == reason
        view.return_logprob = True
        assert adapter.plain.plain_step_blocker(view) == "logprobs"


def _plain_steps(harness, plain, batch, n):
    """n plain steps through ``plain`` (a PlainStep); returns the new tokens,
    ``[bs, n]``."""
    tokens = []
    for _ in range(n):
        result = harness.run(plain, _decode_ready(harness, batch))
        tokens.append(result.next_token_ids[::STRIDE])
        harness.commit(batch, result)
    return torch.stack(tokens, dim=1)  # [bs, n]


def _hf_gap_hidden(model_dir, batch, n):
    """The target hidden states a draft needs for the last ``n`` plain steps
    of each request of ``batch`` (positions ``len - 1 - n .. len - 2`` of
    prompt + output: each step decoded the token before its new one), from
    transformers' forward: ``[bs, n, hidden]``. Independent of the plain
    step, so a state eager and lazy sync both got wrong still fails."""
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
    plain = adapter.plain.make_plain_step("lazy")
    batch = harness.prefill(PROMPTS[:2])
    harness.draft.extend_calls.clear()
    tokens = _plain_steps(harness, plain, batch, n_plain)
    assert harness.draft.extend_calls == []  # nothing ran for the draft yet
    view = _decode_ready(harness, batch)
    seq_lens = view.seq_lens.clone()
    with harness.isolation(view):
        assert plain.before_spec(harness.worker, view) is True
        # the caught-up rows replaced the zero-filled next draft input
        caught_index = view.spec_info.topk_index.clone()
        assert view.seq_lens.tolist() == seq_lens.tolist()
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
    rows = view.req_pool_indices.tolist()
    expected = [
        [int(table[r, p]) for p in range(s - covered, s)]
        for r, s in zip(rows, seq_lens.tolist(), strict=True)
    ]
    assert locs.tolist() == expected
    assert caught_index[:, 0].tolist() == (tokens[:, -1] + 1).tolist()
    # the batch is as the scheduler left it, and the gap is closed
    assert view.seq_lens.tolist() == seq_lens.tolist()
    with harness.isolation(view):
        assert plain.before_spec(harness.worker, view) is False


def test_lazy_mode_switches_emit_exactly_the_plain_greedy_tokens(
    harness, adapter, tiny_model
):
    plain = adapter.plain.make_plain_step("lazy")
    batch = harness.prefill(PROMPTS)
    schedule = ["spec"] * 2 + ["plain"] * 5 + ["spec"] * 2 + ["plain"] * 2 + ["spec"]
    for mode in schedule:
        view = _decode_ready(harness, batch)
        if mode == "spec":
            with harness.isolation(view):
                plain.before_spec(harness.worker, view)
            result = harness.spec_step(view, 2)
        else:
            result = harness.run(plain, view)
        harness.commit(batch, result)
    n = 1 + 2 * 5 + 7
    for req, prompt in zip(batch.reqs, PROMPTS, strict=True):
        assert list(req.output_ids) == hf_greedy(tiny_model, prompt, n)


def test_the_plain_steps_draft_extends_are_counted_by_path(
    harness, adapter, monkeypatch
):
    """design record §5.7: each draft extend the plain step runs through
    SGLang's ``_draft_extend_for_decode`` is counted by the path SGLang takes:
    one per plain step under eager sync, none under ``none`` or per lazy plain
    step, one per lazy catch-up. With no draft-extend graph (what SGLang
    leaves on CPU) each is eager; with a runner the batch fits (and, on
    0.5.23, of the extend's width), the prediction says graph (the stand-in
    draft runs the same either way)."""
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
        view = _decode_ready(harness, batch)
        result = harness.plain_step(view, sync, graphs=graphs)
        harness.commit(batch, result)
    assert counted == ["eager", "eager"]
    harness.draft.cuda_graph_runner_for_draft_extend = SimpleNamespace(
        capture_bs=[1, 2],
        max_bs=2,
        disable_padding=False,
        require_mlp_sync=False,
        captured_req_width=STRIDE,
    )
    lazy = adapter.plain.make_plain_step("lazy", graphs=graphs)
    _plain_steps(harness, lazy, batch, 2)
    assert counted == ["eager", "eager"]  # nothing for the draft yet
    view = _decode_ready(harness, batch)
    with harness.isolation(view):
        assert lazy.before_spec(harness.worker, view) is True
    assert counted == ["eager", "eager", "graph"]  # one catch-up, bs 2 fits


# -- SGLang 0.5.9 ------------------------------------------------------------------
@only_0_5_9
def test_plain_step_writes_one_kv_slot_at_seq_lens_and_returns_flat_result(
    harness, mocker
):
    batch = harness.prefill(PROMPTS)
    mwb = _decode_ready(harness, batch)
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

    result = harness.plain_step(mwb, "eager")

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


@only_0_5_9
def test_sampled_plain_step_follows_the_batch_sampling_parameters(harness):
    """Temperature / top-k go through SGLang's stock sampler: with top_k=1 a
    hot temperature must still give the greedy token."""
    greedy = harness.prefill(PROMPTS[:1])
    a = harness.plain_step(_decode_ready(harness, greedy), "none")
    hot = harness.prefill(PROMPTS[:1], temperature=5.0, top_k=1)
    b = harness.plain_step(_decode_ready(harness, hot), "none")
    assert a.next_token_ids[0] == b.next_token_ids[0]


@only_0_5_9
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
    harness.run(plain, _decode_ready(harness, batch))
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


@only_0_5_9
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
    mwb = _decode_ready(harness, batch)
    seq_lens = mwb.seq_lens
    forward = mocker.spy(harness.target.model_runner, "forward")
    forwards_before_keep = []
    keep = mocker.patch.object(
        adapter.plain,  # the version's plain-step module
        "keep_on_stream",
        side_effect=lambda t, s: forwards_before_keep.append(forward.call_count),
    )
    harness.plain_step(mwb, "none")
    (call,) = keep.call_args_list
    assert call.args[0] is seq_lens
    assert call.args[1] is torch.get_device_module("cpu").current_stream()
    assert forwards_before_keep == [0] and forward.call_count == 1


@only_0_5_9
@pytest.mark.parametrize("draft_sync", ["eager", "lazy", "none"])
def test_the_patched_worker_called_as_the_scheduler_calls_it(
    harness, adapter, tiny_model, draft_sync
):
    """0.5.9's overlap scheduler calls
    ``self.model_worker.forward_batch_generation(model_worker_batch)``: here
    the class method carries the adapter's real wrapper, policy ``never``
    decides, and the plain step runs through it step after step (SPEC steps
    in between through the stand-in verify), emitting transformers' tokens."""
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
            mwb = _decode_ready(harness, batch)
            if mode == "spec":
                result = harness.spec_step(mwb, 2)
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


@only_0_5_9
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


# -- SGLang 0.5.23 -----------------------------------------------------------------
@only_0_5_23
def test_plain_step_writes_one_kv_slot_decodes_at_seq_lens_and_publishes(
    harness, mocker
):
    batch = harness.prefill(PROMPTS)
    harness.prepare_for_decode(batch)
    seq_lens = batch.seq_lens.clone()
    table = harness.req_to_token_pool.req_to_token
    rows = batch.req_pool_indices.tolist()
    expected = {int(table[r, p]) for r, p in zip(rows, seq_lens.tolist(), strict=True)}
    bonus = batch.spec_info.bonus_tokens.clone()
    spy = mocker.spy(harness.target.model_runner, "forward")
    published = []
    before = kv_snapshot(harness)

    result = harness.plain_step(batch, "eager", on_publish=published.append)

    assert changed_slots(before, kv_snapshot(harness)) == expected
    (call,) = spy.call_args_list
    forward_batch = call.args[0]
    assert forward_batch.forward_mode.is_decode()
    assert forward_batch.positions.tolist() == seq_lens.tolist()
    assert forward_batch.input_ids.tolist() == bonus.tolist()
    bs = len(PROMPTS)
    assert result.next_token_ids.shape == (bs * STRIDE,)
    assert result.accept_lens.tolist() == [1] * bs
    assert result.speculative_output_stride == STRIDE
    assert result.new_seq_lens.tolist() == (seq_lens + 1).tolist()
    assert [p.tolist() for p in published] == [(seq_lens + 1).tolist()]
    nd = result.next_draft_input
    assert nd.bonus_tokens.tolist() == result.next_token_ids[::STRIDE].tolist()
    # the scheduler's forward isolation put the batch back
    assert batch.seq_lens.tolist() == seq_lens.tolist()


# the patched worker, called exactly as 0.5.23's scheduler calls it
@pytest.fixture
def gated_worker(adapter):
    """The adapter's real wrapper on the real ``EAGLEWorkerV2`` class, with
    policy ``never``; yields a function that installs a plain step."""
    from eagle_gate.adapters.hooks import ACTIVE
    from eagle_gate.config import GateConfig
    from eagle_gate.runtime import GateRuntime

    adapter.INSTRUMENTOR.instrument()
    adapter.INSTRUMENTOR.require_applied([adapter.WORKER_MODULE])
    config = GateConfig("never")
    ACTIVE.runtime = GateRuntime(
        config,
        config.create_policy(),
        sglang_version="0.5.23",
        adapter=adapter.NAME,
        num_draft_tokens=4,
        req_len=adapter.committed_len,
    )

    def install(draft_sync):
        ACTIVE.runtime.plain_step = adapter.plain.make_plain_step(draft_sync)
        return ACTIVE.runtime

    yield install
    ACTIVE.runtime = None
    adapter.INSTRUMENTOR.uninstrument()


@only_0_5_23
@pytest.mark.parametrize("cpu_lens", [True, False], ids=["cpu-lens", "no-cpu-lens"])
@pytest.mark.parametrize("draft_sync", ["eager", "lazy", "none"])
def test_overlap_call_site_publishes_the_plain_steps_new_lengths(
    harness, gated_worker, draft_sync, cpu_lens
):
    """Scheduler.run_batch (overlap): ``model_worker.forward_batch_generation(
    batch, on_publish=partial(future_map.publish, future_indices))``. In
    overlap mode sequence lengths advance only through that publish; before
    the fix the wrapper dropped the keyword and every plain step decoded at
    the same position again. With ``cpu_lens=False`` the batch is what
    FA3/trtllm servers hand the worker: no CPU lengths, no sum."""
    import functools

    runtime = gated_worker(draft_sync)
    errors_before = runtime.counters.internal_errors
    batch = harness.prefill(PROMPTS)
    published = []

    def publish(future_indices, new_seq_lens):
        published.append((future_indices, new_seq_lens.clone()))

    for _ in range(3):
        harness.prepare_for_decode(batch)
        seq_lens = batch.seq_lens.clone()
        if not cpu_lens:
            batch.seq_lens_cpu = None
            batch.seq_lens_sum = None
        indices = torch.arange(len(PROMPTS))
        with harness.forward_isolation(batch):
            result = harness.worker.forward_batch_generation(
                batch, on_publish=functools.partial(publish, indices)
            )
        assert result.eagle_gate_mode.name == "PLAIN"
        assert published[-1][0] is indices
        assert published[-1][1].tolist() == (seq_lens + 1).tolist()
        harness.commit(batch, result)
    assert len(published) == 3
    assert (
        runtime.counters.policy_errors == 0
        and runtime.counters.plain_step_failures == 0
    )
    assert runtime.counters.internal_errors == errors_before


@only_0_5_23
@pytest.mark.parametrize("cpu_lens", [True, False], ids=["cpu-lens", "no-cpu-lens"])
def test_sync_call_site_and_goodput_without_cpu_lengths(
    harness, gated_worker, tiny_model, cpu_lens
):
    """The non-overlap call ``model_worker.forward_batch_generation(batch,
    pp_proxy_tensors=pp_proxy_tensors)``, several steps, outputs equal to
    transformers' greedy decode; goodput sees an estimate of the lengths
    (never a policy error) when the batch has no CPU lengths."""
    from eagle_gate.goodput import Goodput
    from eagle_gate.policy import Mode

    runtime = gated_worker("eager")
    errors_before = runtime.counters.internal_errors
    seen = []

    class Plain(Goodput):
        """goodput reads the lengths (and must not raise); the step is PLAIN."""

        def decide(self, view):
            seen.append((view.seq_len_sum, view.seq_lens_exact))
            super().decide(view)
            return Mode.PLAIN

    runtime.policy = Plain()
    batch = harness.prefill(PROMPTS)
    for _ in range(4):
        harness.prepare_for_decode(batch)
        if not cpu_lens:
            batch.seq_lens_cpu = None
            batch.seq_lens_sum = None
        with harness.forward_isolation(batch):
            result = harness.worker.forward_batch_generation(
                batch, pp_proxy_tensors=None
            )
        harness.commit(batch, result)
    assert (
        runtime.counters.policy_errors == 0 and runtime.counters.steps_by_mode[1] == 4
    )
    assert all(exact is cpu_lens for _, exact in seen)
    assert all(isinstance(total, int) and total > 0 for total, _ in seen)
    for req, prompt in zip(batch.reqs, PROMPTS, strict=True):
        assert list(req.output_ids) == hf_greedy(tiny_model, prompt, 1 + 4)
    assert runtime.counters.internal_errors == errors_before


@only_0_5_23
def test_plain_step_records_the_batch_tensors_on_the_forward_stream(harness, mocker):
    """0.5.23's verify runs ``record_stream_for_v2_verify(batch, ...)`` and
    ``record_stream_each((batch.input_ids, batch.out_cache_loc), ...)``: the
    scheduler's tensors came from its schedule stream and the worker drops
    their only references mid-forward. The plain step uses the same helpers,
    on the batch it was handed and on the tensors it binds."""
    from sglang.srt.speculative import spec_utils

    batch = harness.prefill(PROMPTS[:2])
    harness.prepare_for_decode(batch)
    seq_lens, input_ids = batch.seq_lens, batch.spec_info.bonus_tokens
    seen = []
    real_handed = spec_utils.record_stream_for_v2_verify
    real_each = spec_utils.record_stream_each

    def handed(b, verify_input, stream):
        seen.append(("batch", b is batch, b.seq_lens is seq_lens, verify_input))
        return real_handed(b, verify_input, stream)

    def each(tensors, stream):  # also called by record_stream_for_v2_verify
        tensors = list(tensors)
        seen.append(("each", [None if t is None else t.tolist() for t in tensors]))
        return real_each(tensors, stream)

    mocker.patch.object(spec_utils, "record_stream_for_v2_verify", handed)
    mocker.patch.object(spec_utils, "record_stream_each", each)
    harness.plain_step(batch, "none")
    table = harness.req_to_token_pool.req_to_token
    slots = table[batch.req_pool_indices, seq_lens].tolist()
    assert seen[0] == ("batch", True, True, None)
    assert seen[-1] == ("each", [input_ids.tolist(), slots])
