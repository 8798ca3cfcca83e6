"""SGLang's DP attention serves on CPU, token-identical to a server without it (#24).

A stock server with ``--enable-dp-attention --dp-size 2 --tp 2`` (one core per
rank, torch_native attention, no speculation) and the DP stand-ins of
``ci/cpu_spec`` (``EAGLE_GATE_CI_DP=1``) answers greedy requests exactly as a
server without DP attention serving the same model:

* one request alone, so one DP rank is idle (it runs padded dummy rows, or
  zero rows during the other's prefill) while the other prefills and decodes;
* three concurrent requests, which the round-robin balancer splits 2 / 1, so
  the ranks decode different batch sizes and the smaller one is padded.

The model is a tiny Qwen3 built from the tiny Llama target
(``support.qwen3_target``): SGLang's Llama is not built for DP attention.

Not here: EAGLE-3 with DP attention, which stock SGLang stops on in its own
code (device-independent, so eager GPU runs would stop there too). 0.5.23
serves it while both ranks verify, then an idle rank's eager verify step
raises in the Triton backend (``EagleVerifyInput`` has no ``kv_indptr``).
0.5.9 serves it with an idle rank and with equal batches, then fails an
assertion in the draft's Triton decode attention when the ranks' batch sizes
differ (the padded draft batch has more rows than its ``kv_indptr``).

Cost: one pair of servers, 3-4 min on two cores (measured with both SGLang
versions side by side and another load on the machine).
"""

from __future__ import annotations

import time

import sglang_env
from support.qwen3_target import build_qwen3_target
from support.server import free_port, running_server
from support.spec_server import (
    baseline_server_args,
    baseline_server_env,
    generate_concurrent,
    generate_greedy,
    shim_first_calls,
)
from support.timings import note

NEW_TOKENS = 8
ALONE = "The quick brown fox"
TOGETHER = [
    "One two three four five",
    "Speculative decoding drafts tokens and",
    "Data parallel attention on a CPU",
]

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


def _outputs(base_url: str) -> dict:
    alone = generate_greedy(base_url, ALONE, NEW_TOKENS)["output_ids"]
    together = [
        r["output_ids"] for r in generate_concurrent(base_url, TOGETHER, NEW_TOKENS)
    ]
    return {"alone": alone, "together": together}


def test_dp_attention_matches_a_server_without_it(spec_models, tmp_path):
    llama, _draft = spec_models
    target = build_qwen3_target(llama, tmp_path / "tiny-qwen3")
    t0 = time.monotonic()
    port = free_port()
    with running_server(
        baseline_server_args(target, port),
        port,
        baseline_server_env(),
        tmp_path / "baseline.log",
    ) as srv:
        expected = _outputs(srv.base_url)
    port = free_port()
    args = baseline_server_args(target, port)
    args += ["--enable-dp-attention", "--dp-size", "2", "--tp", "2"]
    env = baseline_server_env(
        EAGLE_GATE_CI_DP="1",
        EAGLE_GATE_CI_SPEC_LOG="1",
        # one core per rank; SGLang refuses more ranks than NUMA nodes otherwise
        SGLANG_CPU_OMP_THREADS_BIND="0|1",
    )
    log = tmp_path / "dp_attention.log"
    with running_server(args, port, env, log, ready_timeout_s=400) as srv:
        got = _outputs(srv.base_url)
    assert got == expected
    assert all(len(ids) == NEW_TOKENS for ids in [got["alone"], *got["together"]])
    shims = shim_first_calls(log.read_text(errors="replace"))
    assert EXPECTED_SHIMS[sglang_env.version()] <= shims, shims
    note(
        f"SGLang {sglang_env.version()}: DP attention (2 ranks) on CPU, "
        f"{time.monotonic() - t0:.0f} s"
    )
