"""The gate's test hooks (``eagle_gate.adapters.plain.testing``): what CI's
``ci/cpu_spec`` uses instead of rebinding the gate's functions. A registered
hook changes what the gate builds; with none registered the gate builds the
same objects over the same functions as before."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from eagle_gate.adapters.plain import step as step_mod
from eagle_gate.adapters.plain import testing
from eagle_gate.adapters.plain.capture import plain_graphs_for_scheduler
from eagle_gate.adapters.plain.graphs import PlainGraphs
from eagle_gate.config import GateConfig


@pytest.fixture(autouse=True)
def no_hooks():
    testing.clear()
    yield
    testing.clear()


def cpu_scheduler():
    return SimpleNamespace(server_args=SimpleNamespace(device="cpu"))


def decide(gated=True):
    return plain_graphs_for_scheduler(
        object(), cpu_scheduler(), GateConfig("x"), gated=gated, tp_rank=0, tp_size=1
    )


def test_no_graphs_hook_leaves_the_decision_as_it_is():
    graphs = decide(gated=False)
    assert graphs == PlainGraphs(setting="auto", reason="device_not_cuda")
    assert graphs.report is None


def test_a_graphs_hook_sees_the_decided_graphs_and_may_report():
    seen = []

    def hook(graphs, *, version, scheduler, config, gated):
        seen.append((graphs.reason, gated, config.policy))
        graphs.report = {"checked": True}

    assert testing.on_plain_graphs(hook) is hook
    graphs = decide(gated=False)
    assert seen == [("device_not_cuda", False, "x")]
    assert graphs.report == {"checked": True}
    assert graphs.state == "off"  # the decision itself stands


def parts():
    return SimpleNamespace(on_publish_of=lambda *a, **k: "publish", req_row=None)


def test_no_wrapper_runs_plain_step_itself(monkeypatch):
    calls = []

    def fake_plain_step(*args):
        calls.append(args)
        return "result"

    monkeypatch.setattr(step_mod, "plain_step", fake_plain_step)
    assert testing.wrapped_plain_step(fake_plain_step) is fake_plain_step
    plain = step_mod.make_plain_step(parts(), lambda batch: None, "eager")
    assert plain.run("worker", "batch") == "result"
    (args,) = calls
    assert args[1:] == ("worker", "batch", "eager", None, None, "publish")


def test_a_wrapper_is_applied_once_when_the_step_is_built(monkeypatch):
    monkeypatch.setattr(step_mod, "plain_step", lambda *args: "inner")
    built, ran = [], []

    def wrapper(step):
        built.append(step)

        def wrapped(parts, worker, batch, *args):
            ran.append(batch)
            return ("wrapped", step(parts, worker, batch, *args))

        return wrapped

    testing.wrap_plain_step(wrapper)
    plain = step_mod.make_plain_step(parts(), lambda batch: None, "eager")
    assert plain.run("worker", "b1") == ("wrapped", "inner")
    assert plain.run("worker", "b2") == ("wrapped", "inner")
    assert len(built) == 1 and ran == ["b1", "b2"]
    # with the wrapper gone, a step built now runs plain_step itself
    testing.clear()
    assert (
        step_mod.make_plain_step(parts(), lambda b: None, "eager").run("worker", "b3")
        == "inner"
    )
