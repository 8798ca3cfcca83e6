"""The depth contract (issue #33): a policy may choose a SPEC depth per step
through ``view.depth``; policies that never touch it run the configured one.

Pure Python, no SGLang, no torch.
"""

from __future__ import annotations

import pytest
from test_policy_core import make_runtime

from eagle_gate import Mode, StepView
from eagle_gate.policy import StepOutcome


def test_a_binary_view_offers_only_the_configured_depth():
    view = StepView(num_draft_tokens=4)
    assert view.configured_depth == 3
    assert view.depths == (3,)
    assert view.depth == 3


def test_depths_are_sorted_unique_and_hold_the_configured_depth():
    view = StepView(num_draft_tokens=4, depths=[7, 1, 3, 5, 3])
    assert view.depths == (1, 3, 5, 7)
    with pytest.raises(ValueError, match="configured depth"):
        StepView(num_draft_tokens=4, depths=(1, 5))
    with pytest.raises(ValueError, match=">= 1"):
        StepView(num_draft_tokens=4, depths=(0, 3))


def test_update_resets_a_chosen_depth_so_it_never_outlives_its_step():
    view = StepView(num_draft_tokens=4, depths=(1, 3, 5))
    view.update(batch_size=2, step=0, seq_len_sum=10)
    view.depth = 5  # the policy's choice for step 0
    view.update(batch_size=2, step=1, seq_len_sum=12)
    assert view.depth == 3


def test_outcomes_default_to_unknown_depth_and_acceptance():
    out = StepOutcome(
        mode=Mode.SPEC,
        batch_size=1,
        tokens=2,
        accept_lens=(2,),
        interval_s=None,
        step=0,
    )
    assert out.depth is None and out.accepted_at_least is None


def test_the_runtime_reports_the_depth_that_ran():
    seen = []

    class Recorder:
        name = "rec"

        def decide(self, view):
            return Mode.SPEC

        def observe(self, outcome):
            seen.append(outcome)

    rt = make_runtime(Recorder())
    rt.observe(Mode.SPEC, 0, [3, 1])
    rt.observe(Mode.PLAIN, 1, [1, 1])
    assert [o.depth for o in seen] == [3, 0]
