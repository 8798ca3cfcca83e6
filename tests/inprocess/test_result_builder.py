"""A plain step's result, fed to the REAL spec-v2 resolver of each version.

The resolver is SGLang's own function, called on real ``Req`` objects (and on
0.5.23 a real ``ScheduleBatch``, metrics reporter and EAGLE worker method); only
the scheduler object around it is a namespace holding what the resolver reads.
"""

from __future__ import annotations

import types

import pytest
import sglang_env
import torch

from eagle_gate.adapters.hooks import ACTIVE
from eagle_gate.config import GateConfig
from eagle_gate.policy import Mode
from eagle_gate.runtime import GateRuntime

STRIDE = 4


def _resolver_and_self(stride: int):
    """SGLang's real resolver, bound to a minimal scheduler-side object."""
    adapter = sglang_env.adapter()
    if adapter.NAME == "sglang-0.5.9":
        from sglang.srt.managers.scheduler_output_processor_mixin import (
            SchedulerOutputProcessorMixin as Mixin,
        )

        owner = types.SimpleNamespace(
            draft_worker=types.SimpleNamespace(speculative_num_draft_tokens=stride)
        )
        return (
            lambda *a: Mixin._resolve_spec_overlap_token_ids(*a),  # looked up late
            owner,
        )
    from sglang.srt.managers.scheduler_components.batch_result_processor import (
        SchedulerBatchResultProcessor as Processor,
    )
    from sglang.srt.managers.scheduler_components.metrics_reporter import (
        SchedulerMetricsReporter,
    )
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

    reporter = object.__new__(SchedulerMetricsReporter)
    reporter.scheduler = types.SimpleNamespace(enable_fpm=False)
    worker = object.__new__(EAGLEWorkerV2)
    worker.adaptive_controller = None
    owner = types.SimpleNamespace(metrics_reporter=reporter, model_worker=worker)
    owner.advance_grammar_fsm = types.MethodType(Processor.advance_grammar_fsm, owner)
    return (lambda *a: Processor._resolve_spec_v2_tokens(*a)), owner


def _batch(reqs):
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    batch = ScheduleBatch(reqs=reqs)
    batch.forward_mode = ForwardMode.DECODE
    return batch


def _plain_result(tokens, seq_lens):
    adapter = sglang_env.adapter()
    if adapter.NAME == "sglang-0.5.9":
        return adapter.plain.build_plain_result(tokens, stride=STRIDE)
    return adapter.plain.build_plain_result(tokens, stride=STRIDE, seq_lens=seq_lens)


def _spec_counts(req):
    if hasattr(req, "spec_num_correct_drafts"):
        return req.spec_verify_ct, req.spec_num_correct_drafts
    return req.spec_verify_ct, req.spec_accepted_tokens


def test_plain_result_layout():
    tokens = torch.tensor([11, 22, 33])
    result = _plain_result(tokens, torch.tensor([5, 9, 7]))
    assert result.next_token_ids.dtype == torch.int32
    assert result.next_token_ids.tolist() == [11, 0, 0, 0, 22, 0, 0, 0, 33, 0, 0, 0]
    assert result.accept_lens.dtype == torch.int32
    assert result.accept_lens.tolist() == [1, 1, 1]
    if sglang_env.adapter().NAME == "sglang-0.5.23":
        assert result.speculative_output_stride == STRIDE
        assert result.num_non_draft_tokens_per_req == 1
        assert result.new_seq_lens.tolist() == [6, 10, 8]


def test_real_resolver_takes_one_token_per_request_and_counts_no_drafts():
    resolve, owner = _resolver_and_self(STRIDE)
    reqs = sglang_env.make_reqs(3, committed=5)
    result = _plain_result(torch.tensor([11, 22, 33]), torch.tensor([5, 5, 5]))
    tokens = resolve(owner, result, _batch(reqs))
    assert tokens == [[11], [22], [33]]
    assert [sglang_env.committed(r) for r in reqs] == [6, 6, 6]
    assert [_spec_counts(r) for r in reqs] == [(1, 0)] * 3
    if sglang_env.adapter().NAME == "sglang-0.5.9":
        assert result.num_accepted_tokens == 0
        assert result.accept_length_per_req_cpu == [0, 0, 0]
        assert [r.spec_acceptance_histogram[0] for r in reqs] == [1, 1, 1]
    else:
        assert result.num_correct_drafts == 0
        assert result.num_correct_drafts_per_req_cpu == [0, 0, 0]
        assert [r.spec_correct_drafts_histogram[0] for r in reqs] == [1, 1, 1]


def test_same_resolver_on_a_speculative_result_for_contrast():
    """The resolver really reads accept lengths: a SPEC-shaped result with
    accept lengths 3, 1, 2 yields longer runs and counts accepted drafts."""
    resolve, owner = _resolver_and_self(STRIDE)
    reqs = sglang_env.make_reqs(3, committed=5)
    result = _plain_result(torch.tensor([11, 22, 33]), torch.tensor([5, 5, 5]))
    result.next_token_ids = torch.tensor(
        [11, 12, 13, 0, 22, 0, 0, 0, 33, 34, 0, 0], dtype=torch.int32
    )
    result.accept_lens = torch.tensor([3, 1, 2], dtype=torch.int32)
    tokens = resolve(owner, result, _batch(reqs))
    assert tokens == [[11, 12, 13], [22], [33, 34]]
    assert [sglang_env.committed(r) for r in reqs] == [8, 6, 7]
    assert [_spec_counts(r)[1] for r in reqs] == [2, 0, 1]


def test_instrumented_resolver_reports_the_outcome_to_the_policy():
    """Through the real, instrumented resolver: the gate's wrapper sees the
    result tagged by the worker wrapper and hands the policy an outcome."""
    adapter = sglang_env.adapter()
    adapter._instrument()
    resolve, owner = _resolver_and_self(STRIDE)
    seen = []

    class Recorder:
        name = "recorder"

        def decide(self, view):
            return Mode.PLAIN

        def observe(self, outcome):
            seen.append(outcome)

    ACTIVE.runtime = GateRuntime(
        GateConfig("recorder"), Recorder(), sglang_version="t", adapter="t"
    )
    try:
        reqs = sglang_env.make_reqs(2)
        result = _plain_result(torch.tensor([7, 8]), torch.tensor([5, 5]))
        result.eagle_gate_mode, result.eagle_gate_step = Mode.PLAIN, 41
        tokens = resolve(owner, result, _batch(reqs))
    finally:
        ACTIVE.runtime = None
        adapter._uninstrument()
    assert tokens == [[7], [8]]
    assert len(seen) == 1
    assert (seen[0].mode, seen[0].step, seen[0].tokens) == (Mode.PLAIN, 41, 2)
    assert list(seen[0].accept_lens) == [1, 1]


@pytest.mark.parametrize("bs", [0, 1])
def test_plain_result_for_empty_and_single_batches(bs):
    tokens = torch.arange(100, 100 + bs)
    result = _plain_result(tokens, torch.full((bs,), 3))
    assert result.next_token_ids.shape == (bs * STRIDE,)
    assert result.accept_lens.shape == (bs,)
