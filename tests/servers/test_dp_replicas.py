"""DP replicas (``--dp-size 2`` without DP attention, #22): each replica is
its own scheduler with its own EAGLE worker, and the gate in each gates that
replica's batches. A real CPU EAGLE-3 server with two replicas, the gate
switching every 2 steps (``schedule`` ``s2,p2``), answers exactly as a server
without speculation, and the status shows both replicas (``dp_rank`` 0 and
1), each with SPEC and PLAIN steps and SGLang's resolved setup.

Cost: one baseline and one two-replica speculative server, about 2-4 min on
two cores.
"""

from __future__ import annotations

import time

import sglang_env
from support.gated_server import generate_many, status
from support.server import serve
from support.timings import note

REQUESTS = [
    ("Two replicas gate their own batches", 12),
    ("The quick brown fox", 10),
    ("One two three four five", 12),
    ("Speculative decoding drafts tokens and", 10),
]


def test_two_dp_replicas_each_gate_their_batches(spec_models, test_plugins, tmp_path):
    target, draft = spec_models
    t0 = time.monotonic()
    with serve(target, tmp_path / "baseline.log") as srv:
        expected = [r["output_ids"] for r in generate_many(srv.base_url, REQUESTS)]
    gate_args = [
        *("--gate-policy", "schedule", "--gate-set", "pattern=s2,p2"),
        *("--gate-status-dir", str(tmp_path / "status")),
    ]
    extra = {"EAGLE_GATE_OPS_INTERVAL_S": "0.2"}
    if sglang_env.version() == "0.5.23":
        # 0.5.23 refuses more CPU ranks than NUMA nodes unless each rank gets
        # its cores (one each on a 2-core machine)
        extra["SGLANG_CPU_OMP_THREADS_BIND"] = "0|1"
    with serve(
        target,
        tmp_path / "gated.log",
        draft_dir=draft,
        launcher="gate",
        gate_args=gate_args,
        args=["--dp-size", "2", "--load-balance-method", "round_robin"],
        env=extra,
        pythonpath=[test_plugins],
    ) as srv:
        got = [r["output_ids"] for r in generate_many(srv.base_url, REQUESTS)]
        time.sleep(1.0)  # the ops threads rewrite the records
        view = status(srv.base_url)
    assert got == expected
    records = view["schedulers"]
    assert sorted(r["dp_rank"] for r in records) == [0, 1], records
    for r in records:
        assert r["state"].startswith("gating EAGLE3, 3 steps, topk 1"), r["state"]
        assert r["speculative"]["dp_size"] == 2
        assert r["speculative"]["attn_dp_size"] == 1
        assert r["steps"]["spec"] > 0 and r["steps"]["plain"] > 0, r["steps"]
    assert view["speculative"]["dp_size"] == 2
    note(f"DP replicas: 2 gated replicas, {time.monotonic() - t0:.0f} s")
