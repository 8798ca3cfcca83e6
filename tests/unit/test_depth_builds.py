"""What building each depth's runtime state costs (#33, design note §1.4):
the wrapper around SGLang 0.5.23's ``EAGLEWorkerV2.build_adaptive_runtime_state``
measures seconds, memory and captured batch sizes per depth, never breaks
the build, and ``install`` hands the record to the runtime's status. Fake
workers stand in for SGLang's (the real target's signature is checked by
tests/inprocess/test_sglang_contract.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import wrapt

from eagle_gate.adapters import sglang_0_5_23
from eagle_gate.adapters.sglang_0_5_23 import depths as adapter_depths
from eagle_gate.config import GateConfig
from eagle_gate.policies import AlwaysSpec
from eagle_gate.runtime import GateRuntime

GIB = 1 << 30


class FakeWorker:
    """Grows SGLang's per-phase graph-memory dicts (GiB) as a build does."""

    def __init__(self, fail: Exception | None = None) -> None:
        self._additional_graph_memory_usage: dict = {}
        self._draft_worker = SimpleNamespace(_specialized_graph_memory_usage={})
        self.fail = fail
        self.calls: list[int] = []

    def build_adaptive_runtime_state(
        self, speculative_num_steps, speculative_num_draft_tokens, cuda_graph_bs=None
    ):
        self.calls.append(speculative_num_steps)
        if self.fail is not None:
            raise self.fail
        verify = self._additional_graph_memory_usage
        verify["target_verify"] = verify.get("target_verify", 0.0) + 0.25
        draft = self._draft_worker._specialized_graph_memory_usage
        draft["draft_decode"] = draft.get("draft_decode", 0.0) + 0.0625
        draft["draft_extend"] = draft.get("draft_extend", 0.0) + 0.0625
        return SimpleNamespace(
            speculative_num_steps=speculative_num_steps,
            speculative_num_draft_tokens=speculative_num_draft_tokens,
            target_graph_runner=SimpleNamespace(capture_bs=[1, 2, 4]),
            cuda_graph_runner_for_draft_extend=None,
        )


FakeWorker.build_adaptive_runtime_state = wrapt.FunctionWrapper(
    FakeWorker.build_adaptive_runtime_state, adapter_depths._build_wrapper
)


def builds(worker) -> adapter_depths.DepthBuilds:
    return getattr(worker, adapter_depths.BUILDS_ATTR)


def test_each_depth_build_is_measured_without_cuda():
    worker = FakeWorker()
    state = worker.build_adaptive_runtime_state(
        speculative_num_steps=1, speculative_num_draft_tokens=2, cuda_graph_bs=None
    )
    worker.build_adaptive_runtime_state(2, 3)  # positionally too
    assert state.speculative_num_steps == 1 and worker.calls == [1, 2]
    record = builds(worker)
    assert record.errors == 0 and sorted(record.costs) == [1, 2]
    one = record.costs[1]
    assert one["built"] == "adaptive" and one["capture_s"] >= 0
    assert one["mib_verify_graphs"] == 256.0  # 0.25 GiB of verify graphs
    assert one["mib_draft_graphs"] == 128.0
    assert one["verify_graph_bs"] == [1, 2, 4]
    assert one["draft_extend_graph_bs"] is None  # no draft-extend graphs
    # no CUDA here: no free-memory reading, so no total and no rest
    assert one["mib_total"] is None and one["mib_other"] is None
    assert record.costs[2]["mib_verify_graphs"] == 256.0  # a delta, not a total


def test_the_device_memory_drop_gives_the_total_and_the_rest(monkeypatch):
    free = iter([10 * GIB, 9 * GIB])  # 1024 MiB gone during the build
    monkeypatch.setattr(adapter_depths, "_free_bytes", lambda worker: next(free))
    worker = FakeWorker()
    worker.build_adaptive_runtime_state(1, 2)
    cost = builds(worker).costs[1]
    assert cost["mib_total"] == 1024.0
    assert cost["mib_other"] == 1024.0 - 256.0 - 128.0


def test_a_failed_measurement_is_counted_and_the_build_still_returns(monkeypatch):
    calls: list[int] = []
    fail = {"at": 0}

    def free(worker):  # fails when asked for the n-th time
        calls.append(1)
        if len(calls) == fail["at"]:
            raise RuntimeError("no device")
        return None

    monkeypatch.setattr(adapter_depths, "_free_bytes", free)
    for at in (1, 2):  # before the build, then after it
        calls.clear()
        fail["at"] = at
        worker = FakeWorker()
        state = worker.build_adaptive_runtime_state(1, 2)
        assert state.speculative_num_steps == 1 and worker.calls == [1]
        assert builds(worker).errors == 1 and not builds(worker).costs
    # a state SGLang returns with odd parts: still returned, counted
    worker = FakeWorker()
    worker.build_adaptive_runtime_state(1, 2)
    bad = SimpleNamespace(target_graph_runner=SimpleNamespace(capture_bs=5))
    original = FakeWorker.build_adaptive_runtime_state.__wrapped__
    monkeypatch.setattr(
        FakeWorker,
        "build_adaptive_runtime_state",
        wrapt.FunctionWrapper(
            lambda self, *a, **k: (original(self, *a, **k), bad)[1],
            adapter_depths._build_wrapper,
        ),
    )
    assert worker.build_adaptive_runtime_state(2, 3) is bad
    assert builds(worker).errors == 1 and sorted(builds(worker).costs) == [1]


def test_sglangs_own_failure_reaches_sglang():
    worker = FakeWorker(fail=ValueError("out of memory"))
    with pytest.raises(ValueError, match="out of memory"):
        worker.build_adaptive_runtime_state(1, 2)


def test_the_build_target_is_wrapped_and_listed_for_doctor():
    target = adapter_depths.BUILD_TARGET
    assert target.dotted == (
        "sglang.srt.speculative.eagle_worker_v2."
        "EAGLEWorkerV2.build_adaptive_runtime_state"
    )
    assert target in sglang_0_5_23.TARGETS
    assert (target, adapter_depths._build_wrapper) in sglang_0_5_23.INSTRUMENTOR.patches


def scheduler_with(worker) -> SimpleNamespace:
    states = {d: SimpleNamespace(speculative_num_draft_tokens=d + 1) for d in (1, 2, 3)}
    worker.adaptive_controller = SimpleNamespace(_states=states, params=None)
    return SimpleNamespace(draft_worker=worker)


def test_install_hands_the_measured_builds_to_the_status():
    worker = FakeWorker()
    worker.build_adaptive_runtime_state(1, 2)
    worker.build_adaptive_runtime_state(2, 3)
    rt = GateRuntime(
        GateConfig(policy="always"),
        AlwaysSpec(),
        sglang_version="0.5.23",
        adapter="test",
        num_draft_tokens=4,
    )
    assert adapter_depths.install(rt, scheduler_with(worker), "1,2,3") == (1, 2, 3)
    depths = rt.status()["depths"]
    per = depths["per_depth"]
    assert per["1"]["mib_verify_graphs"] == 256.0
    assert per["2"]["verify_graph_bs"] == [1, 2, 4]
    assert per["3"]["built"] == "startup"  # the configured depth, not rebuilt
    assert depths["measure_errors"] == 0


def test_free_memory_is_read_on_the_workers_cuda_device_only(monkeypatch):
    torch = pytest.importorskip("torch")
    asked = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: asked.append("empty"))
    monkeypatch.setattr(
        torch.cuda, "mem_get_info", lambda d=None: asked.append(d) or (5 * GIB, 0)
    )
    gpu = SimpleNamespace(device="cuda", gpu_id=3)
    assert adapter_depths._free_bytes(gpu) == 5 * GIB
    assert asked == ["empty", 3]  # torch's cache emptied first, as SGLang does
    assert adapter_depths._free_bytes(SimpleNamespace(device="cpu", gpu_id=0)) is None
