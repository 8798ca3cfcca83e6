"""``eagle-gate doctor`` with ``--gate-depths`` (#33): before anything is
built it can show only the depth set, the KV reserve the deepest depth costs
every running request, and where the measured per-depth cost appears (the
full command line through SGLang's resolution: tests/inprocess/test_doctor.py)."""

from __future__ import annotations

from types import SimpleNamespace

from eagle_gate.doctor.launch_checks import depths_row


def test_doctor_row_shows_the_depth_set_and_the_kv_reserve():
    spec = SimpleNamespace(speculating=True, num_steps=3)
    row = depths_row(spec, "1,5")
    assert row is not None and row.ok and row.name == "draft depths"
    assert "SPEC depths 1,3,5 and PLAIN (configured 3)" in row.detail
    assert "2*(5+1) = 12 tokens" in row.detail
    assert "the configured depth alone: 2*(3+1) = 8" in row.detail
    assert "depths.per_depth" in row.detail
    assert "SPEC depths 1,2,3 and PLAIN" in depths_row(spec, "auto").detail
    assert depths_row(spec, "off") is None
    assert (
        depths_row(SimpleNamespace(speculating=False, num_steps=None), "auto") is None
    )
    single = depths_row(SimpleNamespace(speculating=True, num_steps=1), "auto")
    assert single is not None and "binary" in single.detail


def test_doctor_row_refuses_always_pinned_outside_the_set_as_the_launcher_does():
    from eagle_gate.depths import pinned_depth_refusal

    spec = SimpleNamespace(speculating=True, num_steps=3)
    row = depths_row(spec, "auto", "always", {"depth": 5})
    assert row is not None and not row.ok
    assert pinned_depth_refusal("always", {"depth": 5}, "auto", 3) in row.detail
    assert depths_row(spec, "auto", "always", {"depth": 2}).ok
