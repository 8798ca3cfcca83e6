"""The gate's wrapper around ``EAGLEWorkerV2.forward_batch_generation``.

SGLang's speculative forward (draft + verify + draft extend) needs a GPU, so
here a pytest-mock stand-in replaces that GPU forward. The batches are real
SGLang ``ScheduleBatch`` objects and the wrapper is the one the adapter
installs on the real class.
"""

from __future__ import annotations

import pytest
import sglang_env
import torch

from eagle_gate.adapters.hooks import ACTIVE, make_worker_wrapper
from eagle_gate.adapters.plain.step import PlainStep
from eagle_gate.config import GateConfig
from eagle_gate.plugins import get_policy_factory
from eagle_gate.policy import Mode
from eagle_gate.runtime import GateRuntime, Overrides


def decode_batch(seq_lens):
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    batch = ScheduleBatch(reqs=sglang_env.make_reqs(len(seq_lens)))
    batch.forward_mode = ForwardMode.DECODE
    batch.seq_lens = torch.tensor(seq_lens)
    batch.seq_lens_cpu = torch.tensor(seq_lens)
    batch.seq_lens_sum = sum(seq_lens)
    return batch


def with_mode(batch, mode_name):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    batch.forward_mode = getattr(ForwardMode, mode_name)
    return batch


@pytest.fixture
def gate():
    views = []

    class Recording:
        name = "recording"
        answer = Mode.SPEC

        def decide(self, view):
            views.append((view.batch_size, view.step, view.seq_len_sum))
            if isinstance(self.answer, Exception):
                raise self.answer
            return self.answer

        def observe(self, outcome):
            pass

    policy = Recording()
    ACTIVE.runtime = GateRuntime(
        GateConfig("recording"), policy, sglang_version="t", adapter="t"
    )
    yield policy, views
    ACTIVE.runtime = None


@pytest.fixture
def gpu_forward_stand_in(mocker):
    """Stands in for SGLang's GPU speculative forward; returns a result object."""
    from sglang.srt.managers.utils import GenerationBatchResult

    return mocker.Mock(side_effect=lambda *a, **k: GenerationBatchResult())


def call(wrapper, forward, batch):
    worker = object()
    return wrapper(forward, worker, (batch,), {})


def test_decode_batch_is_decided_and_result_tagged(gate, gpu_forward_stand_in):
    policy, views = gate
    wrapper = make_worker_wrapper("batch")
    result = call(wrapper, gpu_forward_stand_in, decode_batch([5, 9, 7]))
    assert views == [(3, 0, 21)]
    assert gpu_forward_stand_in.call_count == 1
    assert (result.eagle_gate_mode, result.eagle_gate_step) == (Mode.SPEC, 0)
    call(wrapper, gpu_forward_stand_in, decode_batch([5]))
    assert views[-1] == (1, 1, 5)


def test_extend_and_idle_batches_pass_untouched(gate, gpu_forward_stand_in):
    policy, views = gate
    wrapper = make_worker_wrapper("batch")
    result = call(wrapper, gpu_forward_stand_in, with_mode(decode_batch([4]), "EXTEND"))
    assert views == [] and not hasattr(result, "eagle_gate_mode")
    assert ACTIVE.runtime._non_decode_since_resolve
    call(wrapper, gpu_forward_stand_in, with_mode(decode_batch([]), "IDLE"))
    assert views == [] and gpu_forward_stand_in.call_count == 2


def test_plain_decision_without_plain_step_runs_stock_and_counts(
    gate, gpu_forward_stand_in
):
    policy, views = gate
    policy.answer = Mode.PLAIN
    result = call(
        make_worker_wrapper("batch"), gpu_forward_stand_in, decode_batch([3, 3])
    )
    assert result.eagle_gate_mode is Mode.SPEC
    assert ACTIVE.runtime.counters.overrides == {Overrides.PLAIN_STEP_UNAVAILABLE: 1}


def test_plain_decision_with_a_plain_step_calls_it(gate, gpu_forward_stand_in, mocker):
    """When an adapter provides a plain step, PLAIN runs it instead of the
    speculative forward (the plain step itself is a stand-in here)."""
    from sglang.srt.managers.utils import GenerationBatchResult

    policy, views = gate
    policy.answer = Mode.PLAIN
    run = mocker.Mock(return_value=GenerationBatchResult())
    ACTIVE.runtime.plain_step = PlainStep(run=run, blocker=lambda batch: None)
    batch = decode_batch([3])
    result = call(make_worker_wrapper("batch"), gpu_forward_stand_in, batch)
    assert gpu_forward_stand_in.call_count == 0
    assert run.call_count == 1 and run.call_args.args[1] is batch
    assert result.eagle_gate_mode is Mode.PLAIN


def test_a_batch_the_plain_step_cannot_serve_runs_spec_counted_by_reason(
    gate, gpu_forward_stand_in, mocker
):
    policy, views = gate
    policy.answer = Mode.PLAIN
    run = mocker.Mock()
    ACTIVE.runtime.plain_step = PlainStep(run=run, blocker=lambda batch: "logprobs")
    result = call(make_worker_wrapper("batch"), gpu_forward_stand_in, decode_batch([3]))
    assert run.call_count == 0 and gpu_forward_stand_in.call_count == 1
    assert result.eagle_gate_mode is Mode.SPEC
    assert ACTIVE.runtime.counters.overrides == {"logprobs": 1}


def test_raising_policy_runs_stock_step(gate, gpu_forward_stand_in):
    policy, views = gate
    policy.answer = RuntimeError("policy bug")
    result = call(make_worker_wrapper("batch"), gpu_forward_stand_in, decode_batch([2]))
    assert result.eagle_gate_mode is Mode.SPEC
    assert ACTIVE.runtime.counters.policy_errors == 1


def test_gate_internal_error_runs_stock_step(gate, gpu_forward_stand_in):
    before = ACTIVE.runtime.counters.internal_errors
    result = call(make_worker_wrapper("batch"), gpu_forward_stand_in, object())
    assert gpu_forward_stand_in.call_count == 1
    assert not hasattr(result, "eagle_gate_mode")
    assert ACTIVE.runtime.counters.internal_errors == before + 1


def test_no_runtime_means_stock_behaviour(gpu_forward_stand_in):
    assert ACTIVE.runtime is None
    result = call(make_worker_wrapper("batch"), gpu_forward_stand_in, decode_batch([2]))
    assert not hasattr(result, "eagle_gate_mode")


def test_threshold_policy_through_the_wrapper(gpu_forward_stand_in):
    policy = get_policy_factory("threshold").create(
        plain_above=2, spec_at_or_below=1, min_dwell_steps=0
    )
    ACTIVE.runtime = GateRuntime(
        GateConfig("threshold"), policy, sglang_version="t", adapter="t"
    )
    try:
        wrapper = make_worker_wrapper("batch")
        for sizes in ([1], [1, 1, 1], [1, 1], [1]):
            call(wrapper, gpu_forward_stand_in, decode_batch(sizes))
        assert ACTIVE.runtime.counters.decisions_by_mode == [2, 2]
    finally:
        ACTIVE.runtime = None


def test_a_failing_plain_step_leaves_the_batch_as_sglang_gave_it(
    gate, gpu_forward_stand_in
):
    """The plain step raises half-way; the stock step (stand-in) that runs
    instead must see the batch's original fields."""
    policy, views = gate
    policy.answer = Mode.PLAIN
    batch = decode_batch([3, 4])
    original = {name: getattr(batch, name) for name in ("seq_lens", "spec_info")}
    seen = {}

    def half_done(worker, b, *args, **kwargs):
        b.seq_lens = b.seq_lens + 1
        b.spec_info = None
        raise RuntimeError("GPU says no")

    def stock(b, *args, **kwargs):
        seen.update(seq_lens=b.seq_lens, spec_info=b.spec_info)
        return gpu_forward_stand_in(b)

    ACTIVE.runtime.plain_step = PlainStep(run=half_done, blocker=lambda b: None)
    result = make_worker_wrapper("batch")(stock, object(), (batch,), {})
    assert result.eagle_gate_mode is Mode.SPEC
    assert seen["seq_lens"] is original["seq_lens"]
    assert seen["spec_info"] is original["spec_info"]
    assert ACTIVE.runtime.counters.overrides.get("plain_step_failed") == 1


def test_spec_steps_let_the_plain_step_catch_the_draft_up_first(
    gate, gpu_forward_stand_in, mocker
):
    """With lazy draft sync, every SPEC step of a decode batch first runs the
    plain step's catch-up; if that fails, the SPEC step still runs (the draft
    stays stale, outputs do not change) and an internal error is counted."""
    policy, views = gate
    order = []
    catch_up = mocker.Mock(side_effect=lambda w, b: order.append("catch-up"))
    ACTIVE.runtime.plain_step = PlainStep(run=mocker.Mock(), blocker=lambda b: None)
    ACTIVE.runtime.plain_step.before_spec = catch_up

    def stock(b, *args, **kwargs):
        order.append("spec")
        return gpu_forward_stand_in(b)

    wrapper = make_worker_wrapper("batch")
    batch = decode_batch([3])
    wrapper(stock, object(), (batch,), {})
    assert order == ["catch-up", "spec"] and catch_up.call_args.args[1] is batch
    catch_up.side_effect = RuntimeError("draft extend failed")
    before = ACTIVE.runtime.counters.internal_errors
    result = wrapper(stock, object(), (decode_batch([3]),), {})
    assert result.eagle_gate_mode is Mode.SPEC and order[-1] == "spec"
    assert ACTIVE.runtime.counters.internal_errors == before + 1


def test_a_blocked_plain_decision_is_recorded_as_spec_that_ran(
    gate, gpu_forward_stand_in, mocker
):
    """A PLAIN decision that a blocker turns into SPEC must be
    recorded as decided=plain, ran=spec (with the blocker's reason) in the
    decision ring and the decision log, exactly like plain_step_unavailable;
    a replay of the log must not believe PLAIN ran."""
    policy, views = gate
    policy.answer = Mode.PLAIN
    log = mocker.Mock()
    ACTIVE.runtime.decision_log = log  # a mock: what the log is told
    ACTIVE.runtime.plain_step = PlainStep(
        run=mocker.Mock(), blocker=lambda b: "grammar"
    )
    result = call(make_worker_wrapper("batch"), gpu_forward_stand_in, decode_batch([3]))
    assert result.eagle_gate_mode is Mode.SPEC
    last = ACTIVE.runtime.last_decisions()[-1]
    assert (last["decided"], last["ran"]) == ("plain", "spec")
    (step, _view, decided, ran, override) = log.decision.call_args.args
    assert (step, decided, ran, override) == (0, Mode.PLAIN, Mode.SPEC, "grammar")
    assert log.decision.call_count == 1


# -- DP attention: the mode voted at the gather (adapters/dp_vote.py) -----------
@pytest.mark.parametrize(
    ("others", "ran", "overrides"),
    [
        ([1], Mode.PLAIN, {}),  # every rank wants PLAIN
        ([2], Mode.SPEC, {Overrides.DP_RANKS: 1}),  # another wants SPEC
        ([0], Mode.SPEC, {Overrides.DP_RANKS: 1}),  # another is idle
    ],
)
def test_under_dp_attention_the_worker_runs_the_agreed_mode(
    gate, gpu_forward_stand_in, mocker, others, ran, overrides
):
    """The decision is taken before SGLang's MLP-sync gather (``cast_for``),
    the worker runs what every rank agreed on and records it then: the
    decision log says what this rank decided and what ran, an overruled
    PLAIN counts as a ``dp_ranks`` override."""
    from sglang.srt.managers.utils import GenerationBatchResult

    from eagle_gate.adapters.dp_vote import DPVote, cast_for

    policy, views = gate
    policy.answer = Mode.PLAIN
    runtime = ACTIVE.runtime
    runtime.dp_vote = vote = DPVote()
    run = mocker.Mock(return_value=GenerationBatchResult())
    runtime.plain_step = PlainStep(run=run, blocker=lambda batch: None)
    batch = decode_batch([3, 4])
    assert cast_for(vote, runtime, batch) == 1  # wants PLAIN
    assert len(views) == 1 and runtime.ring.entries() == []  # record deferred
    vote.settle([1, *others])
    result = call(make_worker_wrapper("batch"), gpu_forward_stand_in, batch)
    assert len(views) == 1  # not asked again
    assert result.eagle_gate_mode is ran
    assert (run.call_count, gpu_forward_stand_in.call_count) == (
        (1, 0) if ran is Mode.PLAIN else (0, 1)
    )
    assert runtime.counters.overrides == overrides
    (entry,) = runtime.ring.entries()
    assert (entry["batch_size"], entry["decided"], entry["ran"]) == (
        2,
        "plain",
        ran.name.lower(),
    )


def test_under_dp_attention_idle_and_unvoted_batches_run_stock(
    gate, gpu_forward_stand_in
):
    from eagle_gate.adapters.dp_vote import DPVote, cast_for

    policy, views = gate
    policy.answer = Mode.PLAIN
    ACTIVE.runtime.dp_vote = vote = DPVote()
    assert cast_for(vote, ACTIVE.runtime, None) == 0  # no batch: idle
    assert cast_for(vote, ACTIVE.runtime, with_mode(decode_batch([2]), "IDLE")) == 0
    assert cast_for(vote, ACTIVE.runtime, with_mode(decode_batch([2]), "EXTEND")) == 2
    vote.settle([0, 0])
    idle = with_mode(decode_batch([2]), "IDLE")
    result = call(make_worker_wrapper("batch"), gpu_forward_stand_in, idle)
    assert not hasattr(result, "eagle_gate_mode") and views == []
    # a decode batch that no gather voted on runs SGLang's step, undecided
    result = call(make_worker_wrapper("batch"), gpu_forward_stand_in, decode_batch([2]))
    assert not hasattr(result, "eagle_gate_mode") and views == []
