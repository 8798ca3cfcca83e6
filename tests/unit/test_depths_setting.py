"""``--gate-depths``: which SPEC depths a gated server may run (#33)."""

from __future__ import annotations

import pytest

from eagle_gate.config import ConfigError, resolve_config
from eagle_gate.depths import depth_set, parse_depths


def test_the_setting_reads_off_auto_and_lists():
    assert parse_depths("depths", "OFF") == "off"
    assert parse_depths("depths", " auto ") == "auto"
    assert parse_depths("depths", "3, 1,3") == "1,3"
    assert parse_depths("depths", [5, 2]) == "2,5"
    for bad in ("0,1", "", "x", "1,99", "-1"):
        with pytest.raises(ValueError, match="expected off, auto or draft depths"):
            parse_depths("depths", bad)


def test_depth_sets_never_hold_plain_and_always_the_configured_depth():
    assert depth_set("off", 3) is None
    assert depth_set("auto", 3) == (1, 2, 3)
    assert depth_set("auto", 7) == (1, 4, 7)
    assert depth_set("auto", 1) is None  # nothing else to choose
    assert depth_set("1,5", 3) == (1, 3, 5)  # SGLang builds the configured one
    assert depth_set("3", 3) is None


def test_lazy_draft_sync_with_depths_fails_at_launch():
    env = {"EAGLE_GATE_DEPTHS": "auto", "EAGLE_GATE_DRAFT_SYNC": "lazy"}
    with pytest.raises(ConfigError, match="depths: 'auto' cannot run with draft_sync"):
        resolve_config(environ=env)
    env["EAGLE_GATE_DRAFT_SYNC"] = "none"
    assert resolve_config(environ=env).depths == "auto"


def test_always_pinned_to_a_depth_the_server_lacks_is_refused_at_launch():
    """``always depth=d`` outside the server's depths was a policy error on
    every step (SGLang's step ran): the launcher now refuses it once SGLang
    has resolved the configured depth, before a model loads. 0 (the
    configured depth), a depth in the set, another policy, and a server
    without --gate-depths (it ignores the setting) pass."""
    import types

    from eagle_gate import adapters, launch
    from eagle_gate.config import GateConfig
    from eagle_gate.depths import pinned_depth_refusal

    why = pinned_depth_refusal("always", {"depth": 4}, "auto", 3)
    assert "depth=4" in why and "SPEC depths 1,2,3" in why and "0 (the" in why
    assert pinned_depth_refusal("always", {"depth": 2}, "auto", 3) is None
    assert pinned_depth_refusal("always", {"depth": 0}, "auto", 3) is None
    assert pinned_depth_refusal("always", {}, "1,5", 3) is None
    assert pinned_depth_refusal("always", {"depth": 4}, "off", 3) is None
    assert pinned_depth_refusal("goodput", {"depth": 4}, "auto", 3) is None

    spec = types.SimpleNamespace(speculating=True, num_steps=3, describe=str)
    adapter = types.SimpleNamespace(
        resolve_spec=lambda server_args, flags: spec,
        check_spec=lambda spec, draft_sync, depths: (True, "gating"),
    )
    ok = GateConfig(policy="always", settings={"depth": 2}, depths="auto")
    assert launch.check_resolved(adapter, None, [], ok) == (True, "gating")
    bad = GateConfig(policy="always", settings={"depth": 5}, depths="auto")
    with pytest.raises(adapters.GateRefused, match="depth=5 is not one of"):
        launch.check_resolved(adapter, None, [], bad)
