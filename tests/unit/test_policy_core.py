"""The policy core: built-in policies, the runtime's guards, discovery.

No SGLang and no torch are needed here; the core must work without them.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from support.plain_stub import OPEN_PLAIN_STEP

from eagle_gate import Mode, StepView
from eagle_gate.config import GateConfig
from eagle_gate.plugins import available_policies, get_policy_factory
from eagle_gate.policies import Threshold
from eagle_gate.runtime import GateRuntime, Overrides


def run_threshold(policy: Threshold, sizes: list[int]) -> list[Mode]:
    view = StepView()
    return [
        policy.decide(view.update(batch_size=bs, step=i, seq_len_sum=0))
        for i, bs in enumerate(sizes)
    ]


def test_policy_core_imports_neither_sglang_nor_torch():
    code = (
        "import sys, eagle_gate, eagle_gate.policies, eagle_gate.config, "
        "eagle_gate.runtime, eagle_gate.plugins;"
        "eagle_gate.plugins.available_policies();"
        "bad = [m for m in ('torch', 'sglang') if m in sys.modules];"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_builtin_policies_are_discovered_through_the_entry_point():
    policies = available_policies()
    assert {"always", "never", "threshold"} <= set(policies)
    from importlib.metadata import entry_points

    names = {ep.name: ep.value for ep in entry_points(group="eagle_gate")}
    assert names.get("builtin") == "eagle_gate.policies"


def test_always_and_never():
    view = StepView(batch_size=3)
    assert get_policy_factory("always").create().decide(view) is Mode.SPEC
    assert get_policy_factory("never").create().decide(view) is Mode.PLAIN


def test_threshold_switches_with_hysteresis():
    policy = Threshold(plain_above=8, spec_at_or_below=4, min_dwell_steps=0)
    modes = run_threshold(policy, [1, 8, 9, 7, 5, 4, 6, 9])
    S, P = Mode.SPEC, Mode.PLAIN
    # 9 > 8 -> PLAIN; stays PLAIN at 7 and 5 (above resume 4); 4 -> SPEC;
    # 6 does not switch back (not above 8); 9 does.
    assert modes == [S, S, P, P, P, S, S, P]


def test_threshold_dwell_prevents_flapping():
    policy = Threshold(plain_above=8, spec_at_or_below=4, min_dwell_steps=3)
    modes = run_threshold(policy, [9, 1, 1, 1, 9, 9, 9, 9])
    S, P = Mode.SPEC, Mode.PLAIN
    # switch at step 0; must stay PLAIN until step 3, then SPEC; again 3 steps.
    assert modes == [P, P, P, S, S, S, P, P]


def test_threshold_rejects_resume_above_plain():
    from eagle_gate.settings import SettingsError

    with pytest.raises(SettingsError, match="spec_at_or_below"):
        Threshold(plain_above=2, spec_at_or_below=3)


class _Raises:
    name = "raises"

    def decide(self, view):
        raise ZeroDivisionError("boom")

    def observe(self, outcome):
        raise KeyError("also boom")


class _Garbage:
    name = "garbage"

    def decide(self, view):
        return "PLAIN"

    def observe(self, outcome):
        pass


def make_runtime(policy, *, plain=True, clock=None) -> GateRuntime:
    kwargs = {"clock": clock} if clock else {}
    return GateRuntime(
        GateConfig(policy=getattr(policy, "name", "x")),
        policy,
        sglang_version="test",
        adapter="test",
        num_draft_tokens=4,
        plain_step=OPEN_PLAIN_STEP if plain else None,
        **kwargs,
    )


def test_runtime_runs_spec_and_counts_when_policy_raises(caplog):
    rt = make_runtime(_Raises())
    for _ in range(3):
        assert rt.decide(4, 100).mode is Mode.SPEC
    rt.observe(Mode.SPEC, 0, [1, 2])
    assert rt.counters.policy_errors == 4
    # rate-limited: one warning for all four errors within a minute
    assert sum("policy" in r.message for r in caplog.records) == 1


def test_runtime_rejects_non_mode_return_values():
    rt = make_runtime(_Garbage())
    assert rt.decide(4, 100).mode is Mode.SPEC
    assert rt.counters.policy_errors == 1


def test_runtime_overrides_plain_when_plain_step_is_unavailable():
    rt = make_runtime(get_policy_factory("never").create(), plain=False)
    decision = rt.decide(4, 100)
    mode, step = decision.mode, decision.step
    assert (mode, step) == (Mode.SPEC, 0)
    assert rt.counters.overrides == {Overrides.PLAIN_STEP_UNAVAILABLE: 1}
    assert rt.counters.decisions_by_mode[Mode.PLAIN] == 1


def test_runtime_outcomes_carry_tokens_and_intervals():
    seen = []

    class Recorder:
        name = "rec"

        def decide(self, view):
            return Mode.SPEC

        def observe(self, outcome):
            seen.append(outcome)

    times = iter([10.0, 10.5, 11.25, 20.0, 20.1])
    rt = make_runtime(Recorder(), clock=lambda: next(times))
    rt.observe(Mode.SPEC, 0, [3, 1])  # first: no previous resolution
    rt.observe(Mode.SPEC, 1, [2, 2])
    rt.observe(Mode.PLAIN, 2, [1, 1])
    rt.note_non_decode_batch()  # a prefill ran in between
    rt.observe(Mode.SPEC, 3, [1, 1])
    rt.observe(Mode.SPEC, 4, [4, 1])
    assert [o.tokens for o in seen] == [4, 4, 2, 2, 5]
    assert [o.interval_s for o in seen] == [None, 0.5, 0.75, None, pytest.approx(0.1)]
    assert [o.mode for o in seen] == [Mode.SPEC, Mode.SPEC, Mode.PLAIN] + [
        Mode.SPEC
    ] * 2
    assert rt.counters.steps_by_mode == [4, 1]
    assert rt.counters.tokens_by_mode == [15, 2]


def test_step_view_seq_len_max_is_lazy_and_cached():
    class Lens(list):
        calls = 0

        def max(self):
            Lens.calls += 1
            return max(self)

    view = StepView()
    view.update(batch_size=3, step=0, seq_len_sum=60, seq_lens=Lens([10, 30, 20]))
    assert Lens.calls == 0
    assert view.seq_len_max == 30 and view.seq_len_max == 30
    assert Lens.calls == 1
    view.update(batch_size=0, step=1, seq_len_sum=0, seq_lens=None)
    assert view.seq_len_max == 0
