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
