"""The resolved view of the speculative setup (#22), against this version's
own resolution: the installed SGLang resolves each command line (0.5.9 in
``ServerArgs.__post_init__``, 0.5.23 in ``resolve_once``), and the gate's
:class:`ResolvedSpec` must say what SGLang will run, not what was typed:
NEXTN as EAGLE, the shape SGLang's auto-chooser picks when no shape flags are
given, adaptive after SGLang's own switch-off, multi-layer, DP replicas, PD
decode. Each refusal then follows from the view, whichever way a setting
came about. In-process, on a config-only Llama checkpoint (resolution reads
the config, loads no weights): about a second per case.
"""

from __future__ import annotations

import json
import pickle
import types

import pytest
import sglang_env

from eagle_gate import adapters
from eagle_gate.adapters.refusals import (
    DP_LAZY_REFUSAL,
    MULTI_LAYER_REFUSAL,
    GateRefused,
    check_built_worker,
)
from eagle_gate.adapters.resolved import ResolvedSpec

VERSION = sglang_env.version()
ADAPTER = sglang_env.adapter()
ENV = {"SGLANG_ENABLE_SPEC_V2": "1"}
ON_0_5_23 = pytest.mark.skipif(VERSION != "0.5.23", reason="SGLang 0.5.23 only")
ON_0_5_9 = pytest.mark.skipif(VERSION != "0.5.9", reason="SGLang 0.5.9 only")
#: the gate's draft-sync settings, and None (no plain step)
TREE_SYNCS = ("eager", "lazy", "none", None)

#: a tiny Llama config: what SGLang's resolution reads of a checkpoint.
LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "num_hidden_layers": 2,
    "max_position_embeddings": 2048,
    "vocab_size": 1000,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "float32",
}


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama-config")
    (path / "config.json").write_text(json.dumps(LLAMA))
    return str(path)


@pytest.fixture(autouse=True)
def spec_v2(monkeypatch):
    """0.5.9 resolves with the spec-v2 switch the launcher sets."""
    monkeypatch.setenv("SGLANG_ENABLE_SPEC_V2", "1")


def resolve(model: str, *flags: str) -> tuple[object, ResolvedSpec]:
    return ADAPTER.resolve_argv(["--model-path", model, "--device", "cpu", *flags])


def sglang_auto_shape(server_args) -> tuple[int, int, int]:
    """The shape this version's own auto-chooser picks for this record."""
    if VERSION == "0.5.9":
        from sglang.srt.server_args import auto_choose_speculative_params

        return tuple(auto_choose_speculative_params(server_args))
    from sglang.srt.arg_groups.speculative_hook import (
        _auto_choose_speculative_params,
    )

    return tuple(_auto_choose_speculative_params(server_args, "LlamaForCausalLM"))


def test_no_shape_flags_read_sglangs_auto_chosen_tree(llama):
    """A Llama target with an EAGLE-3 draft and no shape flags: both versions
    pick 5 steps, topk 4, 8 draft tokens. The view says so (the raw topk is
    None). 0.5.23 gates that tree with eager draft sync (measured exact,
    scripts/measure_tree_draft.py) and refuses it with lazy or none; 0.5.9
    refuses it whatever the sync. Each refusal says what to pass instead."""
    server_args, spec = resolve(llama, "--speculative-algorithm", "EAGLE3")
    assert (spec.num_steps, spec.topk, spec.num_draft_tokens) == (5, 4, 8)
    assert (5, 4, 8) == sglang_auto_shape(server_args)
    assert spec.shape_auto and spec.algorithm == "EAGLE3"
    refused_syncs = ("lazy", "none") if VERSION == "0.5.23" else TREE_SYNCS
    for sync in refused_syncs:
        with pytest.raises(GateRefused) as refused:
            ADAPTER.check_spec(spec, ENV, draft_sync=sync)
        message = str(refused.value)
        assert "5 steps, topk 4, 8 draft tokens" in message
        assert "SGLang chose this shape itself" in message
        assert (
            "--speculative-num-steps 5 --speculative-eagle-topk 1 "
            "--speculative-num-draft-tokens 6" in message
        )
        if VERSION == "0.5.23":
            assert f"--gate-draft-sync {sync} was asked" in message, message
        else:
            assert "draft trees on SGLang 0.5.23 only" in message, message
    if VERSION == "0.5.23":
        for sync in ("eager", None):  # None: no plain step (SPEC only)
            gated, state = ADAPTER.check_spec(spec, ENV, draft_sync=sync)
            assert gated and state.startswith("gating EAGLE3, 5 steps, topk 4"), state
    # ... and the chain it says to pass is a shape SGLang resolves to a gated chain.
    _, fixed = resolve(
        llama,
        *("--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "5"),
        *("--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "6"),
    )
    for sync in TREE_SYNCS:
        assert ADAPTER.check_spec(fixed, ENV, draft_sync=sync)[0] is True


def test_nextn_is_gated_as_the_eagle_it_becomes(llama):
    _, spec = resolve(
        llama,
        *("--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3"),
        *("--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"),
    )
    assert spec.algorithm == "EAGLE"
    assert "--speculative-algorithm NEXTN runs as EAGLE" in spec.decided_by_sglang
    gated, state = ADAPTER.check_spec(spec, ENV, draft_sync="eager")
    assert gated and state.startswith("gating EAGLE, 3 steps, topk 1, 4 draft tokens")


def test_nextn_without_shape_flags_is_the_same_tree(llama):
    _, spec = resolve(llama, "--speculative-algorithm", "NEXTN")
    assert (spec.algorithm, spec.topk) == ("EAGLE", 4)
    with pytest.raises(GateRefused, match="SGLang chose this shape itself"):
        ADAPTER.check_spec(spec, ENV, draft_sync="lazy")
    if VERSION == "0.5.23":
        assert ADAPTER.check_spec(spec, ENV, draft_sync="eager")[0] is True


@ON_0_5_23
def test_an_explicit_topk_4_is_judged_like_the_auto_chosen_one(llama):
    _, spec = resolve(
        llama,
        *("--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3"),
        *("--speculative-eagle-topk", "4", "--speculative-num-draft-tokens", "6"),
    )
    assert (spec.topk, spec.shape_auto) == (4, False)
    assert ADAPTER.check_spec(spec, ENV, draft_sync="eager")[0] is True
    with pytest.raises(GateRefused, match="--speculative-eagle-topk 1") as refused:
        ADAPTER.check_spec(spec, ENV, draft_sync="none")
    assert "as resolved from the command line" in str(refused.value)


@ON_0_5_9
def test_0_5_9_refuses_an_explicit_tree_itself(llama):
    """0.5.9's spec v2 raises on a given topk > 1 while resolving (before the
    gate sees it), but lets its own auto-chosen topk 4 through: that one the
    gate refuses (test above)."""
    with pytest.raises(ValueError, match="only supports topk = 1"):
        resolve(
            llama, "--speculative-algorithm", "EAGLE3", "--speculative-eagle-topk", "4"
        )


def test_multi_layer_eagle_is_read_resolved_and_refused(llama):
    _, spec = resolve(
        llama,
        *("--speculative-algorithm", "EAGLE", "--enable-multi-layer-eagle"),
        *("--speculative-num-steps", "3", "--speculative-eagle-topk", "1"),
    )
    assert spec.multi_layer
    with pytest.raises(GateRefused) as refused:
        ADAPTER.check_spec(spec, ENV)
    assert str(refused.value) == MULTI_LAYER_REFUSAL


def test_the_worker_sglang_built_is_judged_too():
    """Activation reads the draft worker SGLang built beside the view: the
    multi-layer worker (not an EAGLEWorkerV2 subclass) is refused, and so is
    an EAGLEWorkerV2 whose topk is not the view's (what was judged is not
    what runs); one that agrees with the view passes, chain or tree."""
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2
    from sglang.srt.speculative.multi_layer_eagle_worker_v2 import (
        MultiLayerEagleWorkerV2,
    )

    spec = ResolvedSpec("EAGLE3", 3, 1, 4)
    multi = MultiLayerEagleWorkerV2.__new__(MultiLayerEagleWorkerV2)
    with pytest.raises(GateRefused) as refused:
        check_built_worker(multi, spec, "hint")
    assert str(refused.value) == MULTI_LAYER_REFUSAL
    tree = EAGLEWorkerV2.__new__(EAGLEWorkerV2)
    tree.topk = 4
    with pytest.raises(GateRefused, match="built a draft worker with topk 4"):
        check_built_worker(tree, spec, "hint")
    check_built_worker(tree, ResolvedSpec("EAGLE3", 5, 4, 8), "hint")
    chain = EAGLEWorkerV2.__new__(EAGLEWorkerV2)
    chain.topk = 1
    check_built_worker(chain, spec, "hint")
    with pytest.raises(GateRefused, match="built a draft worker with topk 1"):
        check_built_worker(chain, ResolvedSpec("EAGLE3", 5, 4, 8), "hint")
    with pytest.raises(GateRefused, match="SGLang built SimpleNamespace"):
        check_built_worker(types.SimpleNamespace(), spec, "hint")


@ON_0_5_23
def test_adaptive_is_judged_as_sglang_keeps_it(llama):
    """0.5.23 switches --speculative-adaptive off itself where adaptive cannot
    run (here: topk 2); the gate then judges what is left (the tree), not
    the flag. Kept on (no shape flags), the gate takes it over with eager
    sync (it chooses among SGLang's depths) and refuses it with lazy sync."""
    _, on = resolve(
        llama, "--speculative-algorithm", "EAGLE3", "--speculative-adaptive"
    )
    assert on.adaptive and on.topk == 1
    gated, _ = ADAPTER.check_spec(on, ENV, draft_sync="eager")
    assert gated
    with pytest.raises(GateRefused, match="--speculative-adaptive with --gate-draft"):
        ADAPTER.check_spec(on, ENV, draft_sync="lazy")
    _, off = resolve(
        llama,
        *("--speculative-algorithm", "EAGLE3", "--speculative-adaptive"),
        *("--speculative-num-steps", "3", "--speculative-eagle-topk", "2"),
        *("--speculative-num-draft-tokens", "6"),
    )
    assert not off.adaptive
    assert "--speculative-adaptive switched off" in off.decided_by_sglang
    with pytest.raises(GateRefused, match="draft tree"):
        ADAPTER.check_spec(off, ENV, draft_sync="lazy")


CHAIN = ("--speculative-num-steps", "2", "--speculative-eagle-topk", "1")


def test_overlap_as_sglang_resolves_it(llama):
    """0.5.23 turns overlap off for speculation on CPU itself (and gates the
    synchronous path); 0.5.9's spec v2 turns it on even against
    --disable-overlap-schedule, so that flag is no longer refused there."""
    _, spec = resolve(
        llama, "--speculative-algorithm", "EAGLE3", *CHAIN, "--disable-overlap-schedule"
    )
    if VERSION == "0.5.9":
        assert spec.overlap is True
    else:
        assert spec.overlap is False
    assert ADAPTER.check_spec(spec, ENV)[0] is True


def test_dp_replicas_and_dp_attention_are_gated(llama):
    _, replicas = resolve(
        llama, "--speculative-algorithm", "EAGLE3", *CHAIN, "--dp-size", "2"
    )
    assert (replicas.dp_size, replicas.attn_dp_size) == (2, 1)
    assert ADAPTER.check_spec(replicas, ENV)[0] is True
    assert "2 DP replicas" in replicas.describe()
    _, attention = resolve(
        llama,
        *("--speculative-algorithm", "EAGLE3", *CHAIN),
        *("--tp-size", "2", "--dp-size", "2", "--enable-dp-attention"),
    )
    assert attention.attn_dp_size == 2
    # the ranks vote on each step's mode (adapters/dp_vote.py); lazy sync's
    # catch-up would run on some ranks only
    assert ADAPTER.check_spec(attention, ENV, draft_sync="eager")[0] is True
    with pytest.raises(GateRefused) as refused:
        ADAPTER.check_spec(attention, ENV, draft_sync="lazy")
    assert str(refused.value) == DP_LAZY_REFUSAL


def test_pd_decode_is_in_the_view_and_gated(llama):
    _, spec = resolve(
        llama,
        *("--speculative-algorithm", "EAGLE3", *CHAIN),
        *("--disaggregation-mode", "decode"),
        *("--disaggregation-transfer-backend", "fake"),
    )
    assert spec.disaggregation_mode == "decode"
    assert ADAPTER.check_spec(spec, ENV)[0] is True
    assert "PD decode" in spec.describe()


def test_no_speculation_is_idle(llama):
    _, spec = resolve(llama)
    assert not spec.speculating and spec.describe() == "no speculation"
    assert ADAPTER.check_spec(spec, ENV)[0] is False


@ON_0_5_23
def test_0_5_23_the_scheduler_reads_the_record_sglang_resolved(llama):
    """The launcher resolves a copy and leaves the operator's record raw for
    SGLang's own launcher; the record SGLang resolves and hands each scheduler
    (pickled) gives the same view, without resolving again."""
    server_args, launcher_view = resolve(llama, "--speculative-algorithm", "EAGLE3")
    assert not getattr(server_args, "_resolution_finished", False)
    assert server_args.speculative_eagle_topk is None  # raw input, untouched
    server_args.resolve_once()  # what run_server does
    in_scheduler = pickle.loads(pickle.dumps(server_args))
    assert ADAPTER.resolve_spec(in_scheduler) == launcher_view


def test_check_server_args_is_check_spec_of_the_resolved_record(llama):
    server_args, spec = resolve(llama, "--speculative-algorithm", "EAGLE3", *CHAIN)
    assert ADAPTER.check_server_args(server_args, ENV) == ADAPTER.check_spec(spec, ENV)


def test_unsupported_algorithms_are_refused_after_resolution():
    with pytest.raises(adapters.GateRefused, match="NGRAM .* is not handled"):
        ADAPTER.check_spec(ResolvedSpec("NGRAM", 3, 1, 4), ENV)


def test_the_status_view_carries_the_resolved_setup_when_schedulers_agree(
    tmp_path,
):
    from eagle_gate.status import aggregate

    spec = ResolvedSpec("EAGLE3", 3, 1, 4, dp_size=2)
    shown = {**spec.as_dict(), "describe": spec.describe()}
    records = [
        {"pid": 1, "alive": True, "dp_rank": 0, "speculative": shown},
        {"pid": 2, "alive": True, "dp_rank": 1, "speculative": dict(shown)},
    ]
    assert aggregate(tmp_path, records, now=0.0)["speculative"] == shown
    records[1]["speculative"] = {**shown, "topk": 4}
    assert aggregate(tmp_path, records, now=0.0)["speculative"] is None


#: a MiMo config (a Qwen2 target that carries one MTP layer).
MIMO = dict(
    LLAMA,
    architectures=["MiMoForCausalLM"],
    model_type="qwen2",
    num_nextn_predict_layers=1,
)
SHAPE = (
    *("--speculative-num-steps", "3", "--speculative-eagle-topk", "1"),
    *("--speculative-num-draft-tokens", "4"),
)


def test_an_mtp_draft_is_named_by_sglangs_own_rule(tmp_path):
    """NEXTN on a MiMo target: SGLang builds ``MiMoMTP`` from the target's
    own checkpoint (``ModelConfig(is_draft_model=True)``); the view names it
    and says it is an MTP layer, not a separate head."""
    (tmp_path / "config.json").write_text(json.dumps(MIMO))
    model = str(tmp_path)
    _, spec = resolve(
        model,
        *("--speculative-algorithm", "NEXTN", "--speculative-draft-model-path", model),
        *SHAPE,
    )
    assert (spec.algorithm, spec.draft_model, spec.mtp) == ("EAGLE", "MiMoMTP", True)
    assert "MTP draft MiMoMTP" in spec.describe()
    assert "--speculative-algorithm NEXTN runs as EAGLE" in spec.describe()


def test_an_eagle3_head_is_named_and_is_not_mtp(llama, tmp_path):
    draft = dict(LLAMA, architectures=["LlamaForCausalLMEagle3"], num_hidden_layers=1)
    (tmp_path / "config.json").write_text(json.dumps(draft))
    _, spec = resolve(
        llama,
        *("--speculative-algorithm", "EAGLE3"),
        *("--speculative-draft-model-path", str(tmp_path)),
        *SHAPE,
    )
    assert (spec.draft_model, spec.mtp) == ("LlamaForCausalLMEagle3", False)
    assert "draft LlamaForCausalLMEagle3" in spec.describe()
    assert "MTP" not in spec.describe()


def test_the_schedulers_read_the_raw_flags_the_launcher_handed_over(llama):
    """0.5.9 resolves its record in place: a scheduler's status can say
    "NEXTN runs as EAGLE" only from the flags the launcher exported."""
    from eagle_gate.adapters.resolved import (
        REQUESTED_ENV,
        export_requested,
        requested_from_environment,
        sglang_decisions,
    )

    argv = ["--speculative-algorithm", "NEXTN", *SHAPE]
    server_args, _ = resolve(llama, *argv)
    env: dict[str, str] = {}
    export_requested(["--model-path", llama, *argv], env)
    requested = requested_from_environment(env)
    spec = ADAPTER.resolve_spec(server_args, requested)
    assert "--speculative-algorithm NEXTN runs as EAGLE" in spec.decided_by_sglang
    assert sglang_decisions(requested, spec) == spec.decided_by_sglang
    assert requested_from_environment({}) is None
    assert requested_from_environment({REQUESTED_ENV: "{not json"}) is None
