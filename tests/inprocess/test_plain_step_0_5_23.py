"""The plain step on CPU with SGLang 0.5.23: real target forward and batches.

The harness (``support/plain_harness_0_5_23.py``) builds the target worker the
way a 0.5.23 scheduler process does and says exactly what is a stand-in: the
EAGLE draft model and SGLang's GPU draft + verify. The plain step runs inside
the scheduler's own forward isolation, as in the server.
"""

from __future__ import annotations

import pytest
import sglang_env
import torch
from sglang_env import changed_slots, kv_snapshot

pytestmark = pytest.mark.skipif(
    sglang_env.version() != "0.5.23",
    reason="this module drives SGLang 0.5.23's objects; "
    "test_plain_step.py covers 0.5.9",
)

PROMPTS = [[1, 5, 9, 33, 70], [1, 44, 12], [1, 7, 7, 7, 7, 7, 7, 7, 2]]


@pytest.fixture(scope="module")
def harness(tiny_model):
    from support.plain_harness_0_5_23 import Harness

    return Harness(tiny_model)


@pytest.fixture(scope="module")
def adapter():
    from eagle_gate.adapters import sglang_0_5_23

    return sglang_0_5_23


def run_plain(harness, adapter, batch, draft_sync="eager", on_publish=None):
    with harness.forward_isolation(batch):
        return adapter.plain.plain_step(harness.worker, batch, on_publish, draft_sync)


def test_plain_step_writes_one_kv_slot_decodes_at_seq_lens_and_publishes(
    harness, adapter, mocker
):
    from support.plain_harness_0_5_23 import STRIDE

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

    result = run_plain(harness, adapter, batch, "eager", published.append)

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


def test_eager_draft_sync_runs_the_draft_extend_over_the_flat_layout(
    harness, adapter, tiny_model
):
    """The draft extend gets, per request, the new token and the target's
    hidden state at the decoded position, checked against transformers'
    forward of the same weights (wrong layer, position, row or the state
    before the final norm all differ)."""
    from support.plain_harness_0_5_23 import STRIDE, hf_hidden

    batch = harness.prefill(PROMPTS[:2])
    sequences = [list(r.origin_input_ids) + list(r.output_ids) for r in batch.reqs]
    harness.prepare_for_decode(batch)
    seq_lens = batch.seq_lens.clone()
    rows = batch.req_pool_indices.tolist()
    harness.draft.extend_calls.clear()
    result = run_plain(harness, adapter, batch, "eager")
    (call,) = harness.draft.extend_calls
    table = harness.req_to_token_pool.req_to_token
    expected_locs = [
        int(table[r, p + j])
        for r, p in zip(rows, seq_lens.tolist(), strict=True)
        for j in range(STRIDE)
    ]
    assert call["out_cache_loc"].tolist() == expected_locs
    assert call["seq_lens"].tolist() == seq_lens.tolist()
    assert call["forward_mode"].is_decode()
    assert (
        call["input_ids"][::STRIDE].tolist() == result.next_token_ids[::STRIDE].tolist()
    )
    hidden = call["hidden"]
    assert hidden.shape[0] == 2 * STRIDE
    # the target's hidden state at seq_lens, the position of the token decoded
    for i, (seq, pos) in enumerate(zip(sequences, seq_lens.tolist(), strict=True)):
        assert pos == len(seq) - 1
        reference = hf_hidden(tiny_model, seq)[pos]
        assert torch.allclose(hidden[i * STRIDE], reference, atol=1e-4), i
    padding = torch.ones(2 * STRIDE, dtype=torch.bool)
    padding[::STRIDE] = False
    assert hidden[padding].abs().sum() == 0
    assert call["accept_lens"].tolist() == [1, 1]
    assert call["new_seq_lens"].tolist() == (seq_lens + 1).tolist()
    assert result.logits_output.hidden_states is None


def test_none_draft_sync_is_sglangs_own_zero_fill(harness, adapter):
    batch = harness.prefill(PROMPTS[:2])
    harness.prepare_for_decode(batch)
    harness.draft.extend_calls.clear()
    result = run_plain(harness, adapter, batch, "none")
    assert harness.draft.extend_calls == []
    nd = result.next_draft_input
    assert nd.topk_p.shape == (2, 1) and not nd.topk_p.any()
    assert nd.topk_index.dtype == torch.int64
    assert nd.hidden_states.shape == (2, harness.draft.hidden_size)
    assert not nd.hidden_states.any()


def test_mode_switches_emit_exactly_the_plain_greedy_tokens(
    harness, adapter, tiny_model
):
    """SPEC x3, PLAIN x5, SPEC x2, PLAIN x1 (SPEC through the stand-in verify,
    which accepts 2 tokens per step), through the real 0.5.23 resolver."""
    from support.plain_harness_0_5_23 import hf_greedy, spec_step_stand_in

    batch = harness.prefill(PROMPTS)
    schedule = ["spec"] * 3 + ["plain"] * 5 + ["spec"] * 2 + ["plain"]
    for i, mode in enumerate(schedule):
        harness.prepare_for_decode(batch)
        if mode == "spec":
            result = spec_step_stand_in(harness, batch, 2)
        else:
            result = run_plain(harness, adapter, batch, ("eager", "none")[i % 2])
        harness.commit(batch, result)
    n = 1 + 2 * 5 + 5 + 1
    for req, prompt in zip(batch.reqs, PROMPTS, strict=True):
        assert list(req.output_ids) == hf_greedy(tiny_model, prompt, n)
        assert req.spec_verify_ct == len(schedule)
        assert req.spec_num_correct_drafts == 5  # one per SPEC step, none for PLAIN


@pytest.mark.parametrize(
    ("sampling", "reason"),
    [
        ({"frequency_penalty": 0.5}, "penalties"),
        ({}, None),
        ({"temperature": 0.7, "top_p": 0.9, "top_k": 20}, None),
    ],
)
def test_blocker_names_what_the_plain_step_cannot_serve(
    harness, adapter, sampling, reason
):
    batch = harness.prefill(PROMPTS[:1], **sampling)
    harness.prepare_for_decode(batch)
    with harness.forward_isolation(batch):  # as the worker sees the batch
        assert adapter.plain.plain_step_blocker(batch) == reason
        batch.return_logprob = True
        assert adapter.plain.plain_step_blocker(batch) == "logprobs"


def _lazy_plain_steps(harness, plain, batch, n):
    from support.plain_harness_0_5_23 import STRIDE

    tokens = []
    for _ in range(n):
        harness.prepare_for_decode(batch)
        with harness.forward_isolation(batch):
            result = plain.run(harness.worker, batch)
        tokens.append(result.next_token_ids[::STRIDE])
        harness.commit(batch, result)
    return torch.stack(tokens, dim=1)


def _hf_gap_hidden(model_dir, batch, n):
    """The target hidden states a draft needs for the last ``n`` plain steps
    of each request of ``batch`` (positions ``len - 1 - n .. len - 2`` of
    prompt + output: each step decoded the token before its new one), from
    transformers' forward: ``[bs, n, hidden]``. Independent of the plain
    step, so a state eager and lazy sync both got wrong still fails."""
    from support.plain_harness_0_5_23 import hf_hidden

    rows = []
    for req in batch.reqs:
        seq = list(req.origin_input_ids) + list(req.output_ids)
        rows.append(hf_hidden(model_dir, seq)[len(seq) - 1 - n : len(seq) - 1])
    return torch.stack(rows)


@pytest.mark.parametrize("n_plain", [3, 6])
def test_lazy_catch_up_covers_exactly_the_gap(harness, adapter, tiny_model, n_plain):
    """PLAIN x n with lazy sync, then SPEC: one batched draft extend gets the
    (token, target hidden, KV slot) triples of the gap, for the whole gap or
    its most recent STRIDE positions; the hidden states checked against
    transformers' forward at those positions (not against eager sync's)."""
    from support.plain_harness_0_5_23 import STRIDE

    plain = adapter.plain.make_plain_step("lazy")
    batch = harness.prefill(PROMPTS[:2])
    harness.draft.extend_calls.clear()
    tokens = _lazy_plain_steps(harness, plain, batch, n_plain)
    assert harness.draft.extend_calls == []
    harness.prepare_for_decode(batch)
    seq_lens = batch.seq_lens.clone()
    with harness.forward_isolation(batch):
        assert plain.before_spec(harness.worker, batch) is True
        caught_index = batch.spec_info.topk_index.clone()
        assert batch.seq_lens.tolist() == seq_lens.tolist()
    (call,) = harness.draft.extend_calls
    hidden_ref = _hf_gap_hidden(tiny_model, batch, n_plain)
    covered = min(n_plain, STRIDE)
    window = slice(n_plain - covered, n_plain)
    assert call["accept_lens"].tolist() == [covered, covered]
    assert call["seq_lens"].tolist() == (seq_lens - covered).tolist()
    assert call["input_ids"].view(2, STRIDE)[:, :covered].tolist() == (
        tokens[:, window].tolist()
    )
    hid = call["hidden"].view(2, STRIDE, -1)
    assert torch.allclose(hid[:, :covered], hidden_ref[:, window], atol=1e-4)
    assert not hid[:, covered:].any()
    table = harness.req_to_token_pool.req_to_token
    rows = batch.req_pool_indices.tolist()
    expected = [
        [int(table[r, p]) for p in range(s - covered, s)]
        for r, s in zip(rows, seq_lens.tolist(), strict=True)
    ]
    assert call["out_cache_loc"].view(2, STRIDE)[:, :covered].tolist() == expected
    assert caught_index[:, 0].tolist() == (tokens[:, -1] + 1).tolist()


def test_lazy_mode_switches_emit_exactly_the_plain_greedy_tokens(
    harness, adapter, tiny_model
):
    from support.plain_harness_0_5_23 import hf_greedy, spec_step_stand_in

    plain = adapter.plain.make_plain_step("lazy")
    batch = harness.prefill(PROMPTS)
    schedule = ["spec"] * 2 + ["plain"] * 5 + ["spec"] * 2 + ["plain"] * 2 + ["spec"]
    for mode in schedule:
        harness.prepare_for_decode(batch)
        if mode == "spec":
            with harness.forward_isolation(batch):
                plain.before_spec(harness.worker, batch)
            result = spec_step_stand_in(harness, batch, 2)
        else:
            with harness.forward_isolation(batch):
                result = plain.run(harness.worker, batch)
        harness.commit(batch, result)
    n = 1 + 2 * 5 + 7
    for req, prompt in zip(batch.reqs, PROMPTS, strict=True):
        assert list(req.output_ids) == hf_greedy(tiny_model, prompt, n)


def test_next_draft_input_round_trips_through_the_real_future_map(harness, adapter):
    """0.5.23's FutureMap sizes its relay buffers from the first draft input it
    stashes (here a SPEC step's); plain steps' next draft inputs, of every
    draft-sync strategy, must stash into the same buffers unchanged."""
    from sglang.srt.managers.overlap_utils import FutureMap, RelayPayload
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from support.plain_harness_0_5_23 import spec_step_stand_in

    future_map = FutureMap(
        torch.device("cpu"), SpeculativeAlgorithm.EAGLE, harness.req_to_token_pool
    )
    lazy = adapter.plain.make_plain_step("lazy")
    batch = harness.prefill(PROMPTS[:2])
    for run in ("spec", "eager", "none", "lazy"):
        harness.prepare_for_decode(batch)
        if run == "spec":
            result = spec_step_stand_in(harness, batch, 2)
        elif run == "lazy":
            with harness.forward_isolation(batch):
                result = lazy.run(harness.worker, batch)
        else:
            result = run_plain(harness, adapter, batch, run)
        rows = batch.req_pool_indices
        nd = result.next_draft_input
        future_map.stash(rows, RelayPayload.from_draft_input(nd))
        assert future_map.output_tokens_buf[rows].tolist() == nd.bonus_tokens.tolist()
        assert torch.equal(future_map.topk_p_buf[rows], nd.topk_p)
        assert torch.equal(future_map.topk_index_buf[rows], nd.topk_index)
        assert torch.equal(future_map.hidden_states_buf[rows], nd.hidden_states)
        harness.commit(batch, result)


# -- the patched worker, called exactly as 0.5.23's scheduler calls it ---------
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


@pytest.mark.parametrize("cpu_lens", [True, False], ids=["cpu-lens", "no-cpu-lens"])
@pytest.mark.parametrize("draft_sync", ["eager", "lazy", "none"])
def test_overlap_call_site_publishes_the_plain_steps_new_lengths(
    harness, adapter, gated_worker, draft_sync, cpu_lens
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


@pytest.mark.parametrize("cpu_lens", [True, False], ids=["cpu-lens", "no-cpu-lens"])
def test_sync_call_site_and_goodput_without_cpu_lengths(
    harness, adapter, gated_worker, tiny_model, cpu_lens
):
    """The non-overlap call ``model_worker.forward_batch_generation(batch,
    pp_proxy_tensors=pp_proxy_tensors)``, several steps, outputs equal to
    transformers' greedy decode; goodput sees an estimate of the lengths
    (never a policy error) when the batch has no CPU lengths."""
    from support.plain_harness_0_5_23 import hf_greedy

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


def test_plain_step_records_the_batch_tensors_on_the_forward_stream(
    harness, adapter, mocker
):
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
    run_plain(harness, adapter, batch, "none")
    table = harness.req_to_token_pool.req_to_token
    slots = table[batch.req_pool_indices, seq_lens].tolist()
    assert seen[0] == ("batch", True, True, None)
    assert seen[-1] == ("each", [input_ids.tolist(), slots])


def test_the_plain_steps_draft_extends_are_counted_by_path(
    harness, adapter, monkeypatch
):
    """docs/plain-graphs.md §5.7: each draft extend the plain step runs through
    SGLang's ``_draft_extend_for_decode`` is counted by the path SGLang takes:
    one per plain step under eager sync, none under ``none`` or per lazy plain
    step, one per lazy catch-up. With no draft-extend graph (what SGLang
    leaves on CPU) each is eager; with a runner the batch fits (and of the
    extend's width), the prediction says graph (the stand-in draft runs the
    same either way)."""
    from types import SimpleNamespace

    from support.plain_harness_0_5_23 import STRIDE

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
        with harness.forward_isolation(batch):
            result = adapter.plain.plain_step(
                harness.worker, batch, None, sync, None, graphs
            )
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
    _lazy_plain_steps(harness, lazy, batch, 2)
    assert counted == ["eager", "eager"]  # nothing for the draft yet
    harness.prepare_for_decode(batch)
    with harness.forward_isolation(batch):
        assert lazy.before_spec(harness.worker, batch) is True
    assert counted == ["eager", "eager", "graph"]  # one catch-up, bs 2 fits
