"""Tensor-parallel agreement: ranks with different local timings decide alike.

Three real processes form a gloo group on loopback, as SGLang's TP ranks do on
their CPU group. Each runs a GateRuntime with the ``goodput`` policy (which
uses step timings) and a clock that makes SPEC look fast on ranks 0 and 2 and
slow on rank 1. With the agreement (rank 0's timings broadcast every few
steps, never per step) all three decision sequences are identical; without it
rank 1 diverges, which is what would deadlock a real TP server.
"""

from __future__ import annotations

import multiprocessing as mp

import pytest
from support.ports import reserve_port

WORLD = 3
STEPS = 400
BATCH = 8
ACCEPT = 3  # tokens per request in a SPEC step (same on every rank)
PLAIN_S = 0.010
SPEC_S = {0: 0.020, 1: 0.040, 2: 0.025}  # rank 1 finds SPEC slower than PLAIN


def _rank_main(rank: int, port: int, agree: bool, out) -> None:
    import torch.distributed as dist
    from support.plain_stub import OPEN_PLAIN_STEP

    from eagle_gate.agreement import TimingAgreement, torch_timing_broadcast
    from eagle_gate.config import GateConfig
    from eagle_gate.plugins import get_policy_factory
    from eagle_gate.policy import Mode
    from eagle_gate.runtime import GateRuntime

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD
    )
    group = dist.new_group(list(range(WORLD)), backend="gloo")
    now = [0.0]
    runtime = GateRuntime(
        GateConfig("goodput"),
        get_policy_factory("goodput").create(),
        sglang_version="test",
        adapter="test",
        tp_rank=rank,
        tp_size=WORLD,
        num_draft_tokens=4,
        plain_step=OPEN_PLAIN_STEP,
        clock=lambda: now[0],
        agreement=TimingAgreement(torch_timing_broadcast(group)) if agree else None,
    )
    decisions = []
    previous = None
    for _ in range(STEPS):
        decision = runtime.decide(BATCH, BATCH * 100)
        mode, step = decision.mode, decision.step
        decisions.append(int(mode))
        if previous is not None:
            ran, ran_step = previous
            now[0] += SPEC_S[rank] if ran is Mode.SPEC else PLAIN_S
            lens = [ACCEPT if ran is Mode.SPEC else 1] * BATCH
            runtime.observe(ran, ran_step, lens)
        previous = (mode, step)
    rounds = runtime.agreement.rounds if runtime.agreement else 0
    out.put((rank, decisions, rounds))
    dist.destroy_process_group()


def run_ranks(agree: bool) -> dict[int, tuple[list[int], int]]:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = reserve_port()
    procs = [
        ctx.Process(target=_rank_main, args=(r, port, agree, out)) for r in range(WORLD)
    ]
    for p in procs:
        p.start()
    results = {}
    for _ in range(WORLD):
        rank, decisions, rounds = out.get(timeout=120)
        results[rank] = (decisions, rounds)
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    return results


@pytest.mark.timeout(300)
def test_ranks_with_different_timings_make_identical_decisions():
    results = run_ranks(agree=True)
    sequences = [results[r][0] for r in range(WORLD)]
    assert sequences[0] == sequences[1] == sequences[2]
    # both modes were tried, and agreement ran at a bounded rate, not per step
    assert set(sequences[0]) == {0, 1}
    rounds = results[0][1]
    assert 0 < rounds <= STEPS // 8


@pytest.mark.timeout(300)
def test_without_agreement_the_same_ranks_diverge():
    results = run_ranks(agree=False)
    assert results[0][0] != results[1][0]


def test_agreement_releases_rank0_timings_in_order_and_checks_counts():
    from eagle_gate.agreement import TimingAgreement

    sent = []

    def rank0_says(values):
        sent.append(list(values))
        return [values[0], 0.5, None]

    agreement = TimingAgreement(rank0_says, every=4)
    assert [agreement.due(s) for s in range(5)] == [True, False, False, False, True]
    agreement.hold("spec", 7, [3, 1], 0.9)
    agreement.hold("plain", 8, [1, 1], None, 1, 0)
    assert agreement.release() == [
        ("spec", 7, [3, 1], 0.5, None, None),
        ("plain", 8, [1, 1], None, 1, 0),
    ]
    assert sent == [[2, 0.9, None]]
    agreement.hold("spec", 9, [2], 0.1)
    agreement.broadcast = lambda values: [3, 0.1, 0.1, 0.1]  # rank 0 held three
    with pytest.raises(RuntimeError, match="no longer in step"):
        agreement.release()


def test_without_a_group_outcomes_carry_no_timings():
    from eagle_gate.agreement import TimingAgreement

    agreement = TimingAgreement(None)
    agreement.hold("spec", 1, [2], 0.25)
    assert agreement.release() == [("spec", 1, [2], None, None, None)]
