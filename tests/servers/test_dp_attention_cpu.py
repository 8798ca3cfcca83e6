"""DP attention on CPU (#24): SGLang's own, then the gate under it.

Servers with ``--enable-dp-attention --dp-size 2 --tp 2`` (one core per rank)
and the DP stand-ins of ``ci/cpu_spec`` (``EAGLE_GATE_CI_DP=1``), serving a
tiny Qwen3 built from the tiny Llama target (``support.qwen3_target``:
SGLang's Llama is not built for DP attention). One DP-attention server
without speculation is the reference of both tests:

* it answers exactly as a server without DP attention: one request alone
  (one DP rank idle, running padded dummy rows or zero rows during the
  other's prefill) and three at once (the round-robin balancer splits them
  2 / 1, so the ranks decode different batch sizes and the smaller is
  padded);
* an EAGLE-3 server with the gate answers exactly as it. The ranks vote on
  every step's mode in SGLang's MLP-sync gather (``adapters/dp_vote.py``):
  PLAIN only when both have a decode batch and want it. What runs is bounded
  by where stock SGLang's own speculative DP path stops on CPU (the same
  code a GPU runs eagerly with the Triton backend): 0.5.23 dies as soon as a
  rank runs an idle verify (``EagleVerifyInput`` has no ``kv_indptr`` in
  ``triton_backend.init_forward_metadata``), so the gate runs ``never``
  there, one request per rank, both PLAIN every step and finishing together
  (no rank ever idle); 0.5.9 dies when the ranks' batch sizes differ (its
  padded draft batch outgrows the attention metadata), so one request per
  rank with the gate switching (``schedule s1,p2``: each rank counts its own
  steps and the rank that decoded first is a step ahead, so the ranks
  disagree at about a third of the steps and the vote settles each), then
  one request alone (the other rank idle: the agreed mode is SPEC, its PLAIN
  decisions counted as ``dp_ranks``). Every PLAIN step ran on both ranks
  (equal PLAIN counts: a rank running PLAIN alone would have more).

The vote through SGLang's real gathers with ranks deciding differently at
most steps, and its negative control: ``tests/inprocess/test_dp_vote.py``.

Cost: three servers per version, about 4-5 min on two cores.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import sglang_env
from support.gated_server import (
    abort,
    generate,
    generate_many,
    log_failures,
    set_policy,
    status,
)
from support.qwen3_target import build_qwen3_target
from support.server import serve
from support.spec_server import shim_first_calls
from support.timings import note

VERSION = sglang_env.version()
DP = ["--enable-dp-attention", "--dp-size", "2", "--tp", "2"]
#: one core per rank (SGLang refuses more CPU ranks than NUMA nodes otherwise)
DP_ENV = {"EAGLE_GATE_CI_DP": "1", "SGLANG_CPU_OMP_THREADS_BIND": "0|1"}

#: SGLang's own DP attention: alone (an idle rank), then three at once (2 / 1)
STOCK = [
    [("The quick brown fox", 8)],
    [
        ("One two three four five", 8),
        ("Speculative decoding drafts tokens and", 8),
        ("Data parallel attention on a CPU", 8),
    ],
]
#: the gate: one request per rank, then (0.5.9) one alone
GATED = [[("One two three four", 12), ("Speculative decoding drafts", 12)]]
if VERSION == "0.5.9":
    GATED.append([("Data parallel attention", 8)])
#: 0.5.9 then: goodput switched on at runtime, one request per rank; and an
#: abort during PLAIN steps (the victim on one rank, the keeper on the other)
GOODPUT = [("Goodput under data parallel", 10), ("attention on two ranks", 10)]
KEEPER = ("The keeper decodes on", 24)

# Stand-ins whose first call the DP server's log must show: the padded-row
# fill value proves a rank padded its batch (idle or smaller than the other's).
EXPECTED_SHIMS = {
    "0.5.23": {"get_cpu_graph_seq_len_fill_value(1)"},
    "0.5.9": {
        "get_cuda_graph_seq_len_fill_value(1)",
        "forward_batch_info torch.tensor(pin_memory dropped)",
        "dp_attention.memcpy_triton(torch copy)",
        "GroupCoordinator.all_gather_into_tensor(cpu, direct)",
    },
}


def answers(base_url: str, groups: list[list[tuple[str, int]]]) -> list[list[int]]:
    """Each group's requests at once, the groups one after another."""
    out: list[list[int]] = []
    for group in groups:
        out += [r["output_ids"] for r in generate_many(base_url, group)]
    return out


@pytest.fixture(scope="module")
def qwen3(spec_models, tmp_path_factory):
    llama, _ = spec_models
    return build_qwen3_target(llama, tmp_path_factory.mktemp("tiny-qwen3") / "qwen3")


@pytest.fixture(scope="module")
def dp_reference(qwen3, tmp_path_factory) -> dict:
    """The DP-attention server without speculation: every request set's
    answers, and which stand-ins its log shows were called."""
    t0 = time.monotonic()
    log = tmp_path_factory.mktemp("dp-no-spec") / "server.log"
    with serve(
        qwen3,
        log,
        args=DP,
        env={"EAGLE_GATE_CI_SPEC_LOG": "1", **DP_ENV},
    ) as srv:
        out = {
            "stock": answers(srv.base_url, STOCK),
            "gated": answers(srv.base_url, GATED),
            "goodput": answers(srv.base_url, [GOODPUT]),
            "keeper": answers(srv.base_url, [[KEEPER]])[0],
        }
    out["shims"] = shim_first_calls(log.read_text(errors="replace"))
    took = time.monotonic() - t0
    note(f"SGLang {VERSION}: DP-attention server without speculation, {took:.0f} s")
    return out


def test_dp_attention_matches_a_server_without_it(qwen3, dp_reference, tmp_path):
    with serve(qwen3, tmp_path / "baseline.log") as srv:
        expected = answers(srv.base_url, STOCK)
    assert dp_reference["stock"] == expected
    assert all(len(ids) == 8 for ids in expected)
    assert EXPECTED_SHIMS[VERSION] <= dp_reference["shims"], dp_reference["shims"]


def test_dp_ranks_gate_together(
    qwen3, dp_reference, spec_models, test_plugins, tmp_path
):
    _, draft = spec_models
    t0 = time.monotonic()
    policy = (
        ["--gate-policy", "never"]
        if VERSION == "0.5.23"
        else ["--gate-policy", "schedule", "--gate-set", "pattern=s1,p2"]
    )
    gate_args = [*policy, "--gate-status-dir", str(tmp_path / "status")]
    env = {
        "EAGLE_GATE_OPS_INTERVAL_S": "0.2",
        "EAGLE_GATE_CONTROL_EVERY": "1",  # runtime changes at the next decode step
        **DP_ENV,
    }
    with serve(
        qwen3,
        tmp_path / "gated.log",
        draft_dir=draft,
        launcher="gate",
        gate_args=gate_args,
        args=DP,
        env=env,
        pythonpath=[test_plugins],
    ) as srv:
        got = answers(srv.base_url, GATED)
        time.sleep(1.0)  # the ops threads rewrite the records
        view = status(srv.base_url)
        if VERSION == "0.5.9":
            later = goodput_and_abort(srv.base_url, dp_reference)
        log = srv.log_path.read_text(errors="replace")
    assert got == dp_reference["gated"]
    assert not log_failures(log), log[-4000:]
    ranks = sorted(view["schedulers"], key=lambda r: r["dp_rank"])
    assert [r["dp_rank"] for r in ranks] == [0, 1], ranks
    for r in ranks:
        assert r["state"].startswith("gating EAGLE3, 3 steps, topk 1"), r["state"]
        assert r["speculative"]["attn_dp_size"] == 2
        assert r["plain_step_failures"] == 0 and r["internal_errors"] == 0
        assert r["plain_graphs"]["reason"] == "dp_attention"
    plain = [r["steps"]["plain"] for r in ranks]
    spec = [r["steps"]["spec"] for r in ranks]
    overruled = [r["overrides"].get("dp_ranks", 0) for r in ranks]
    # PLAIN only together: both ranks ran the same PLAIN steps
    assert plain[0] == plain[1] > 0, [r["steps"] for r in ranks]
    if VERSION == "0.5.23":  # never: every step PLAIN, none overruled
        assert spec == [0, 0] and overruled == [0, 0], (spec, overruled)
    else:  # the request alone: its rank's PLAIN decisions overruled
        assert max(overruled) >= 1, overruled
    tail = f"; then {later}" if VERSION == "0.5.9" else ""
    note(
        f"SGLang {VERSION}: DP attention gated (2 ranks): PLAIN {plain}, SPEC "
        f"{spec}, overruled {overruled}, {time.monotonic() - t0:.0f} s{tail}"
    )


def goodput_and_abort(base_url: str, reference: dict) -> str:
    """0.5.9's DP-attention server, after the scripted steps: ``goodput``
    switched on at runtime answers as the reference; then, every step PLAIN
    (``never``), a request aborted mid-decode on one rank while the other's
    keeper decodes on: the keeper's answer is untouched (its rank runs on
    alone: SPEC, the aborted rank idle) and nothing failed."""
    set_policy(base_url, "goodput")
    assert answers(base_url, [GOODPUT]) == reference["goodput"]
    policies = {r["policy"] for r in status(base_url)["schedulers"]}
    assert policies == {"goodput"}, policies
    set_policy(base_url, "never")

    def plain_steps() -> int:
        return sum(r["steps"]["plain"] for r in status(base_url)["schedulers"])

    before = plain_steps()
    with ThreadPoolExecutor(2) as pool:
        victim = pool.submit(generate, base_url, "abort me please", 400, rid="victim")
        keeper = pool.submit(generate, base_url, *KEEPER)
        deadline = time.monotonic() + 120
        while plain_steps() < before + 4:  # both ranks in PLAIN steps
            assert time.monotonic() < deadline, "no PLAIN steps"
            time.sleep(0.2)
        assert abort(base_url, "victim") == 200
        kept, aborted = keeper.result(), victim.result()
    assert kept["output_ids"] == reference["keeper"]
    assert aborted["meta_info"]["finish_reason"]["type"] == "abort"
    time.sleep(1.0)
    view = status(base_url)
    assert view["ok"], view
    for r in view["schedulers"]:
        assert r["plain_step_failures"] == 0 and r["internal_errors"] == 0, r
    return "goodput answered as the reference, an abort during PLAIN kept the keeper"
