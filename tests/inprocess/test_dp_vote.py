"""The DP-attention vote: the protocol
(``eagle_gate.adapters.dp_vote``), and the vote riding on each version's
MLP-sync gather (``adapters/sglang_*/dp.py``: 0.5.23's own
``MLPSyncBatchInfo.all_gather`` with a wider row, 0.5.9's replaced at the
row's width), driven by two gloo processes whose policies decide
differently step by step.

The gate under DP attention on real servers: ``tests/servers/test_dp_attention_cpu.py``.
"""

from __future__ import annotations

import pytest
import sglang_env
from support.two_ranks import run_ranks

from eagle_gate.adapters.dp_vote import (
    IDLE,
    WANTS_PLAIN,
    WANTS_SPEC,
    DPVote,
    agreed_mode,
)
from eagle_gate.decision import Decision
from eagle_gate.policy import Mode

VERSION = sglang_env.version()


@pytest.mark.parametrize(
    ("votes", "mode"),
    [
        ([IDLE, IDLE], None),  # nothing to decide
        ([WANTS_PLAIN, WANTS_PLAIN], Mode.PLAIN),
        # an idle rank runs SGLang's idle SPEC step: everyone SPEC
        ([WANTS_PLAIN, IDLE], Mode.SPEC),
        ([IDLE, WANTS_PLAIN, WANTS_PLAIN, IDLE], Mode.SPEC),
        ([WANTS_PLAIN, WANTS_PLAIN, WANTS_PLAIN], Mode.PLAIN),
        ([WANTS_PLAIN, WANTS_SPEC], Mode.SPEC),  # one SPEC rank: all SPEC
        ([WANTS_SPEC, IDLE], Mode.SPEC),
        ([WANTS_PLAIN, 7], Mode.SPEC),  # outside the protocol: stock
    ],
)
def test_the_agreed_mode(votes, mode):
    assert agreed_mode(votes) is mode


def test_a_vote_lives_from_its_gather_to_its_step():
    vote = DPVote()
    decision = Decision(Mode.PLAIN, step=4)
    assert vote.cast(decision) == WANTS_PLAIN
    assert vote.settle([WANTS_PLAIN, WANTS_SPEC]) is Mode.SPEC
    assert vote.disagreements == 1
    assert vote.take() == (Mode.SPEC, decision)
    # taken once: a batch without a gather finds nothing (stock step)
    assert vote.take() == (None, None) and vote.local == IDLE
    assert vote.cast(None, busy=True) == WANTS_SPEC  # an extend, gate off
    assert vote.cast(Decision(Mode.SPEC, step=5)) == WANTS_SPEC
    assert vote.cast(Decision(Mode.PLAIN), busy=False) == IDLE


def _info(**overrides):
    if VERSION == "0.5.9":
        from sglang.srt.managers.scheduler_dp_attn_mixin import MLPSyncBatchInfo

        values = dict(
            dp_size=2, tp_size=1, cp_size=1, num_tokens=5, num_tokens_for_logprob=6,
            can_cuda_graph=True, is_extend_in_batch=False, local_can_run_tbo=True,
            local_forward_mode=2,
        )  # fmt: skip
    else:
        from sglang.srt.managers.scheduler_components.dp_attn import MLPSyncBatchInfo

        values = dict(
            num_dp_ranks=2, tp_size=1, cp_size=1, num_tokens=5,
            num_tokens_for_logprob=6, can_run_decode_cuda_graph=True,
            can_run_draft_cuda_graph=False, can_run_prefill_cuda_graph=True,
            is_extend_in_batch=False, local_can_run_tbo=True, local_forward_mode=2,
            prefill_cuda_graph_max_prefix_len=9, is_health_check=True,
            attention_pairs=11,
        )  # fmt: skip
    values.update(overrides)
    return MLPSyncBatchInfo(**values)


def _dp_module():
    if VERSION == "0.5.9":
        from eagle_gate.adapters.sglang_0_5_9 import dp
    else:
        from eagle_gate.adapters.sglang_0_5_23 import dp
    return dp


def test_the_rows_are_sglangs_own_plus_the_vote():
    """Column for column against SGLang's own rows: a drift of the version's
    row layout fails here, not in a server."""
    dp = _dp_module()
    dp.VOTE.cast(Decision(Mode.PLAIN, step=1))
    info = _info()
    row = dp.local_row(info, "cpu")
    assert row[:-1].tolist() == info._get_local_tensor("cpu").tolist()
    assert row[-1].item() == WANTS_PLAIN and len(dp.ROW_FIELDS) == row.numel() - 1
    fallback = dp.fallback_row(info, "cpu")
    assert fallback[:-1].tolist() == info._get_fallback_tensor("cpu").tolist()
    assert fallback[-1].item() == IDLE
    dp.VOTE.take()


TWO_DP_RANKS = r"""
import datetime, json, sys, types
import torch, torch.distributed as dist
import wrapt
from eagle_gate.decision import Decision
from eagle_gate.policy import Mode

rank, init, with_vote = int(sys.argv[1]), sys.argv[2], sys.argv[3] == "1"
version = sys.argv[4]
dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=30))
group = dist.new_group([0, 1], backend="gloo")
# what all_gather reads of SGLang's parallel state on the CPU path
tp = types.SimpleNamespace(active_ranks_cpu=torch.ones(2, dtype=torch.int32))
if version == "0.5.9":
    from sglang.srt.managers import scheduler_dp_attn_mixin as sgl
    from eagle_gate.adapters.sglang_0_5_9 import dp
    sgl.get_tp_group = lambda: tp
    sizes = dict(dp_size=2, tp_size=1, cp_size=1)
    flags = dict(can_cuda_graph=True)
    if with_vote:
        sgl.MLPSyncBatchInfo.all_gather = dp.all_gather
else:
    from sglang.srt.managers.scheduler_components import dp_attn as sgl
    from eagle_gate.adapters.sglang_0_5_23 import dp
    sgl.get_parallel = lambda: types.SimpleNamespace(tp_group=tp)
    sizes = dict(num_dp_ranks=2, tp_size=1, cp_size=1)
    flags = dict(can_run_decode_cuda_graph=True, can_run_draft_cuda_graph=True,
                 can_run_prefill_cuda_graph=False)
    if with_vote:
        sgl.MLPSyncBatchInfo._get_local_tensor = dp.local_row
        sgl.MLPSyncBatchInfo._get_fallback_tensor = dp.fallback_row
        wrapt.wrap_function_wrapper(sgl.MLPSyncBatchInfo, "all_gather",
                                    dp.settle_after_gather)
# each rank's own decisions: P(LAIN), S(PEC), -: no batch here
plan = ["PPSP-P-", "PSPP--P"][rank]
modes, tokens = [], []
for step, c in enumerate(plan):
    busy = c != "-"
    local = Mode.PLAIN if c == "P" else Mode.SPEC
    dp.VOTE.cast(Decision(local, step) if busy else None, busy=busy)
    n = 3 + rank if busy else 0
    info = sgl.MLPSyncBatchInfo(
        **sizes, **flags, num_tokens=n, num_tokens_for_logprob=n,
        is_extend_in_batch=False, local_can_run_tbo=False,
        local_forward_mode=2 if busy else 0)
    info.all_gather(device="cpu", group=group)
    agreed, mine = dp.VOTE.take()
    ran = agreed if with_vote else (mine.mode if busy else None)
    modes.append({None: "-", Mode.PLAIN: "P", Mode.SPEC: "S"}[ran])
    tokens.append(info.global_num_tokens)
print(json.dumps({"rank": rank, "modes": "".join(modes), "tokens": tokens,
                  "disagreements": dp.VOTE.disagreements}))
# both ranks reach the teardown together: gloo aborts a process ("terminate
# called without an active exception") whose peer tears down mid-exchange
dist.barrier()
dist.destroy_process_group()
"""


@pytest.mark.parametrize("with_vote", [True, False], ids=["vote", "no-vote"])
def test_two_dp_ranks_run_the_same_mode_every_step(tmp_path, with_vote):
    """Two DP ranks decide differently at most steps (rank 0: ``PPSP-P-``,
    rank 1: ``PSPP--P``; ``-``: no batch). With the vote in SGLang's real
    gather both run, step by step, PLAIN only where both have a batch and
    want it: ``PSSP-SS`` (an idle rank runs SGLang's idle SPEC step, so the
    busy one runs SPEC with it), and SGLang's own columns arrive as before
    (each rank's token count). Without the vote (the negative control) each rank
    runs its own choice and the sequences differ: what would hang or mix
    activations in a real DP-attention server."""
    vote = "1" if with_vote else "0"
    r0, r1 = run_ranks(tmp_path, TWO_DP_RANKS, vote, VERSION, timeout_s=180)
    busy = {"P", "S"}
    assert r0["tokens"] == r1["tokens"]
    for step, (a, b) in enumerate(zip("PPSP-P-", "PSPP--P", strict=True)):
        assert r0["tokens"][step] == [3 if a in busy else 0, 4 if b in busy else 0]
    if with_vote:
        assert r0["modes"] == r1["modes"] == "PSSP-SS"
        assert (r0["disagreements"], r1["disagreements"]) == (2, 2)
    else:
        assert r0["modes"] != r1["modes"]


def test_what_the_gate_refuses_under_dp_attention(monkeypatch):
    """Where a version gates DP attention (``dp.GATES_DP_ATTENTION``): eager
    and none sync are gated, lazy is refused (its catch-up extends run on
    some ranks only), and so are the version's own ways around the gather
    (0.5.9: no gather at all; 0.5.23: its DP spec/prefill coordination).
    Where it does not, the DP-attention refusal stands."""
    from eagle_gate.adapters import refusals
    from eagle_gate.adapters.resolved import ResolvedSpec

    adapter = sglang_env.adapter()
    dp = _dp_module()
    spec = ResolvedSpec("EAGLE3", 3, 1, 4, attn_dp_size=2, dp_size=2)
    env = {"SGLANG_ENABLE_SPEC_V2": "1"}
    monkeypatch.setattr(dp, "GATES_DP_ATTENTION", False)
    with pytest.raises(refusals.GateRefused) as refused:
        adapter.check_spec(spec, env, draft_sync="eager")
    assert str(refused.value) == refusals.DP_ATTENTION_REFUSAL
    monkeypatch.setattr(dp, "GATES_DP_ATTENTION", True)
    for sync in ("eager", "none", None):
        assert adapter.check_spec(spec, env, draft_sync=sync)[0] is True
    with pytest.raises(refusals.GateRefused) as refused:
        adapter.check_spec(spec, env, draft_sync="lazy")
    assert str(refused.value) == refusals.DP_LAZY_REFUSAL
    switch = (
        "SGLANG_SCHEDULER_SKIP_ALL_GATHER"
        if VERSION == "0.5.9"
        else "SGLANG_ENABLE_DP_SPEC_PREFILL_COORDINATION"
    )
    # read as SGLang reads its own switch ("y" is on for it, "on" is not)
    for value in ("1", "y"):
        with pytest.raises(refusals.GateRefused, match=f"{switch}=1 with data-par"):
            adapter.check_spec(spec, {**env, switch: value}, draft_sync="eager")
    assert adapter.check_spec(spec, {**env, switch: "on"}, draft_sync="eager")[0]
    # without DP attention the switch is none of the gate's business
    chain = ResolvedSpec("EAGLE3", 3, 1, 4)
    assert adapter.check_spec(chain, {**env, switch: "1"}, draft_sync="eager")[0]
