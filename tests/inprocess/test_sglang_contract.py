"""Contract tests against the REAL installed SGLang (0.5.9 or 0.5.23).

Every patch target exists with the signature the adapter expects; the
instrumentation is idempotent and removable on the real classes; unsupported
versions are refused; a patch that cannot apply raises naming the target.
"""

from __future__ import annotations

import importlib

import pytest
import sglang_env

from eagle_gate import adapters
from eagle_gate.adapters.patching import (
    GatePatchError,
    Instrumentor,
    PatchTarget,
    _GateWrapper,
)


@pytest.fixture
def adapter():
    a = sglang_env.adapter()
    yield a
    a._uninstrument()


def _current(target: PatchTarget):
    owner, name = target.owner_and_name()
    return vars(owner)[name]


def test_installed_version_is_supported_and_selects_its_adapter():
    version = sglang_env.version()
    assert version in adapters.SUPPORTED
    a = adapters.select_adapter()
    assert version in a.SGLANG_VERSIONS


def test_every_patch_target_exists_with_expected_signature(adapter):
    assert len(adapter.TARGETS) >= 4
    for target in adapter.TARGETS:
        target.check()


def test_instrument_is_idempotent_and_removable(adapter):
    wrapped_targets = [t for t, _ in adapter.INSTRUMENTOR.patches]
    originals = {t.dotted: _current(t) for t in wrapped_targets}
    adapter._instrument()
    adapter.INSTRUMENTOR.require_applied()
    first = {t.dotted: _current(t) for t in wrapped_targets}
    assert all(isinstance(w, _GateWrapper) for w in first.values())
    adapter._instrument()
    adapter.INSTRUMENTOR.require_applied()
    assert {t.dotted: _current(t) for t in wrapped_targets} == first
    assert all(first[k].__wrapped__ is originals[k] for k in originals)

    adapter._uninstrument()
    assert {t.dotted: _current(t) for t in wrapped_targets} == originals
    adapter._uninstrument()  # twice is harmless
    assert {t.dotted: _current(t) for t in wrapped_targets} == originals

    adapter._instrument()  # and it comes back
    assert all(isinstance(_current(t), _GateWrapper) for t in wrapped_targets)


def test_unsupported_version_is_refused_with_the_supported_list():
    with pytest.raises(adapters.UnsupportedSGLang) as err:
        adapters.select_adapter("0.5.10")
    message = str(err.value)
    assert "0.5.10" in message and "0.5.9" in message and "0.5.23" in message
    assert "--gate-allow-untested-sglang" in message


def test_opt_in_uses_nearest_adapter_only_if_its_targets_fit():
    installed = sglang_env.version()
    # A version nearest to the installed one: its adapter fits.
    near = {"0.5.9": "0.5.9.post9", "0.5.23": "0.5.24"}[installed]
    assert (
        installed in adapters.select_adapter(near, allow_untested=True).SGLANG_VERSIONS
    )
    # A version nearest to the OTHER adapter: its targets do not exist here.
    far = {"0.5.9": "0.5.22", "0.5.23": "0.5.8"}[installed]
    with pytest.raises(adapters.UnsupportedSGLang) as err:
        adapters.select_adapter(far, allow_untested=True)
    assert "patch target" in str(err.value)


def test_a_target_with_another_signature_is_refused_by_name():
    target = PatchTarget(
        "sglang.srt.managers.schedule_batch", "Req.__init__", ("self", "request_id")
    )
    with pytest.raises(GatePatchError) as err:
        target.check()
    assert "sglang.srt.managers.schedule_batch.Req.__init__" in str(err.value)
    missing = PatchTarget(
        "sglang.srt.managers.schedule_batch", "Req.no_such", ("self",)
    )
    with pytest.raises(GatePatchError, match="Req.no_such does not exist"):
        missing.check()


def test_a_patch_that_cannot_apply_stops_instrumentation():
    importlib.import_module("sglang.srt.managers.schedule_batch")
    bad = Instrumentor(
        [
            (
                PatchTarget(
                    "sglang.srt.managers.schedule_batch", "Req.vanished", ("self",)
                ),
                lambda wrapped, instance, args, kwargs: wrapped(*args, **kwargs),
            )
        ]
    )
    with pytest.raises(GatePatchError, match="Req.vanished"):
        bad.instrument()  # module already imported: applied (and failing) at once


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"algorithm": "NGRAM"}, "NGRAM .*is not handled"),
        ({"multi_layer": True}, "multi-layer EAGLE"),
        # a draft tree with lazy sync (0.5.23 gates trees with eager sync only)
        ({"topk": 4, "num_draft_tokens": 8}, "--speculative-eagle-topk 1"),
    ],
)
def test_setups_no_version_handles_are_refused(adapter, fields, message):
    """Judged on the resolved view (tests/inprocess/test_resolved_view.py checks that
    view against each version's own resolution), with lazy draft sync."""
    from eagle_gate.adapters.resolved import ResolvedSpec

    spec = ResolvedSpec(**{"algorithm": "EAGLE3", "num_steps": 3, "topk": 1, **fields})
    env = {"SGLANG_ENABLE_SPEC_V2": "1"}
    with pytest.raises(adapters.GateRefused, match=message):
        adapter.check_spec(spec, environ=env, draft_sync="lazy")
    ok = ResolvedSpec("EAGLE3", 3, 1, 4)
    gated, state = adapter.check_spec(ok, environ=env)
    assert gated and state.startswith("gating EAGLE3, 3 steps, topk 1, 4 draft tokens")
    assert adapter.check_spec(ResolvedSpec(None), environ=env)[0] is False


#: 0.5.23 concepts: adaptive speculation and rejection sampling do not exist in
#: 0.5.9, whose adapter does not read them.
ON_0_5_23_ONLY = pytest.mark.skipif(
    sglang_env.version() != "0.5.23", reason="an SGLang 0.5.23 setting"
)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        # DP attention is gated (the vote), but not with lazy draft sync
        ({"attn_dp_size": 2, "dp_size": 2}, "lazy under data-parallel attention"),
        ({"pp_size": 2}, "pipeline parallelism"),
    ],
)
def test_parallel_layouts_the_gate_cannot_coordinate_are_refused(
    adapter, fields, message
):
    """DP attention with lazy draft sync: its catch-up extends run on the
    ranks whose requests had PLAIN stretches only (the ranks' collectives
    would stop matching); eager and none are gated, the ranks voting on each
    step's mode. PP: the earlier stages pre-build the verify input, so the
    gate could only run SPEC; refused rather than idle. DP replicas without
    DP attention each gate their own batches."""
    from eagle_gate.adapters.resolved import ResolvedSpec

    spec = ResolvedSpec("EAGLE3", 3, 1, 4, **fields)
    with pytest.raises(adapters.GateRefused, match=message):
        adapter.check_spec(
            spec, environ={"SGLANG_ENABLE_SPEC_V2": "1"}, draft_sync="lazy"
        )
    replicas = ResolvedSpec("EAGLE3", 3, 1, 4, dp_size=2)
    assert adapter.check_spec(replicas, environ={"SGLANG_ENABLE_SPEC_V2": "1"})[0]


@ON_0_5_23_ONLY
@pytest.mark.parametrize("draft_sync", ["lazy", "none"])
def test_rejection_sampling_needs_eager_draft_sync(adapter, draft_sync):
    """With rejection sampling the next verify reads the draft distribution
    of the proposal; ``lazy`` and ``none`` leave it stale after a plain step.
    Refused with a message; ``eager`` (SGLang's own draft extend) is exact."""
    from eagle_gate.adapters.resolved import ResolvedSpec

    spec = ResolvedSpec("EAGLE3", 3, 1, 4, rejection_sampling=True)
    env = {"SGLANG_ENABLE_SPEC_V2": "1"}
    with pytest.raises(adapters.GateRefused, match="draft_probs"):
        adapter.check_spec(spec, environ=env, draft_sync=draft_sync)
    assert adapter.check_spec(spec, environ=env, draft_sync="eager")[0]


@ON_0_5_23_ONLY
def test_lazy_sync_is_refused_where_sglang_keeps_no_cpu_lengths(adapter):
    """0.5.23's overlap scheduler skips the CPU copy of the sequence lengths
    when no attention backend needs it (Triton, FA3, trtllm_mha); lazy sync
    keeps its bookkeeping from those lengths, so the scheduler refuses it at
    start, naming the backend. Without overlap the batch keeps its own."""
    import types

    from eagle_gate.config import GateConfig

    class FlashAttentionBackend:
        needs_cpu_seq_lens = False

    scheduler = types.SimpleNamespace(
        enable_overlap=True,
        future_map=types.SimpleNamespace(needs_cpu_seq_lens=False),
        tp_worker=types.SimpleNamespace(
            model_runner=types.SimpleNamespace(attn_backend=FlashAttentionBackend())
        ),
    )
    with pytest.raises(adapters.GateRefused, match="FlashAttentionBackend"):
        adapter.check_scheduler(scheduler, GateConfig("never", draft_sync="lazy"))
    adapter.check_scheduler(scheduler, GateConfig("never", draft_sync="eager"))
    scheduler.enable_overlap = False
    adapter.check_scheduler(scheduler, GateConfig("never", draft_sync="lazy"))
    scheduler.enable_overlap = True
    scheduler.future_map.needs_cpu_seq_lens = True
    adapter.check_scheduler(scheduler, GateConfig("never", draft_sync="lazy"))
