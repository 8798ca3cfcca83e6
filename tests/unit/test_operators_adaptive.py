"""The operator's own ``--speculative-adaptive`` on SGLang 0.5.23 (#33): the
gate takes SGLang's adaptive controller over instead of refusing the flag. It
chooses among the depths SGLang built (never SGLang's depth 0, a 1-token
verify; the gate's PLAIN is a true decode), and where they leave nothing to
choose it still pins the controller to the configured depth, so SGLang's EMA
and batch-size tiers never move the depth on their own. Fake schedulers stand
in for SGLang's (the real server: tests/servers/test_depths_e2e.py)."""

from __future__ import annotations

from types import SimpleNamespace

from eagle_gate.adapters.sglang_0_5_23 import depths as adapter_depths
from eagle_gate.config import GateConfig
from eagle_gate.policies import AlwaysSpec
from eagle_gate.runtime import GateRuntime


class SglangParams:
    """SGLang's own controller policy: moves the depth by its EMA."""

    def get_steps_for_batch(self, batch_size: int) -> int:
        return 0 if batch_size >= 8 else 7

    def on_verify_complete(self, *args):
        return 1


def scheduler_with(built: tuple[int, ...]) -> SimpleNamespace:
    states = {d: SimpleNamespace(speculative_num_draft_tokens=d + 1) for d in built}
    controller = SimpleNamespace(_states=states, params=SglangParams())
    return SimpleNamespace(draft_worker=SimpleNamespace(adaptive_controller=controller))


def runtime() -> GateRuntime:
    return GateRuntime(
        GateConfig(policy="always"),
        AlwaysSpec(),
        sglang_version="0.5.23",
        adapter="test",
        num_draft_tokens=4,  # configured depth 3
    )


def test_the_depths_sglang_built_without_its_depth_zero():
    scheduler = scheduler_with((0, 1, 3, 5, 7))
    assert adapter_depths.operators_depths(scheduler) == "1,3,5,7"
    # no adaptive speculation: nothing to take over
    assert adapter_depths.operators_depths(SimpleNamespace(draft_worker=None)) is None


def test_the_gate_chooses_among_the_operators_depths():
    scheduler = scheduler_with((0, 1, 2, 3))
    rt = runtime()
    own = adapter_depths.operators_depths(scheduler)
    assert adapter_depths.install(rt, scheduler, own, operators=True) == (1, 2, 3)
    params = scheduler.draft_worker.adaptive_controller.params
    assert isinstance(params, adapter_depths.GateDepths)
    assert rt.view.depths == (1, 2, 3)
    # SGLang's verify feedback moves nothing; its step is the gate's
    assert params.on_verify_complete([1, 2], 2) is None
    assert params.get_steps_for_batch(64) == 3  # SGLang's tier said 0


def test_nothing_to_choose_still_pins_sglangs_controller():
    """SGLang built depths 0 and 3 only: the gate stays binary (SPEC at 3 or
    PLAIN), and SGLang's controller can no longer switch to its depth 0."""
    scheduler = scheduler_with((0, 3))
    rt = runtime()
    own = adapter_depths.operators_depths(scheduler)
    assert own == "3"
    assert adapter_depths.install(rt, scheduler, own, operators=True) is None
    params = scheduler.draft_worker.adaptive_controller.params
    assert isinstance(params, adapter_depths.GateDepths)
    assert params.get_steps_for_batch(64) == 3
    assert params.on_verify_complete([0, 0], 2) is None
    assert rt.view.depths == (3,)  # binary
