"""PD disaggregation, decode side (#22): ``--disaggregation-mode decode``
runs ordinary DECODE batches through ``EAGLEWorkerV2`` and the spec-v2
resolver in its own overlap loop (``event_loop_overlap_disagg_decode``), so
the gate's patches are hit there. A real CPU EAGLE-3 decode server with
SGLang's ``fake`` transfer backend, the gate switching every 2 steps: requests
complete, both modes ran, nothing failed or degraded, and the status shows the
resolved setup (PD decode).

Not compared token for token: the fake backend transfers nothing, so the
decode side starts each request from whatever its KV pool and metadata
buffers hold (a stock decode server without the gate, and one without
speculation, each answered differently run to run). A CPU-only detail:
0.5.23's default retraction backup for decode (``host_pool``) pins its host
pool with ``cudaHostRegister`` (``mem_cache/pool_host/common.py``), a
GPU-only call, so the test passes ``--disaggregation-decode-retraction-backup
none`` there (0.5.9 has no such backup).

Cost: one decode server, about 1.5 min on two cores.
"""

from __future__ import annotations

import json
import time
import urllib.request

import sglang_env
from support.gated_server import status
from support.server import serve
from support.timings import note

PD = [
    *("--disaggregation-mode", "decode"),
    *("--disaggregation-transfer-backend", "fake"),
]
if sglang_env.version() == "0.5.23":  # its default backup pins with CUDA
    PD += ["--disaggregation-decode-retraction-backup", "none"]
PROMPTS = ["Once upon a time the tiny model", "The quick brown fox"]
NEW = 12


def generate_decode(base_url: str, prompt: str, room: int) -> dict:
    """One greedy request as a PD router hands it to the decode side (the
    fake backend ignores the bootstrap address, SGLang still parses it)."""
    body = {
        "text": prompt,
        "sampling_params": {
            "temperature": 0.0,
            "max_new_tokens": NEW,
            "ignore_eos": True,
        },
        "bootstrap_host": "2.2.2.2",
        "bootstrap_port": 8998,
        "bootstrap_room": room,
    }
    request = urllib.request.Request(
        f"{base_url}/generate",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=600) as reply:
        return json.loads(reply.read())


def test_a_pd_decode_server_is_gated(spec_models, test_plugins, tmp_path):
    target, draft = spec_models
    t0 = time.monotonic()
    gate_args = [
        *("--gate-policy", "schedule", "--gate-set", "pattern=s2,p2"),
        *("--gate-status-dir", str(tmp_path / "status")),
    ]
    with serve(
        target,
        tmp_path / "decode.log",
        draft_dir=draft,
        launcher="gate",
        gate_args=gate_args,
        args=PD,
        env={"EAGLE_GATE_OPS_INTERVAL_S": "0.2"},
        pythonpath=[test_plugins],
    ) as srv:
        outputs = [
            generate_decode(srv.base_url, p, 1000 + i) for i, p in enumerate(PROMPTS)
        ]
        time.sleep(1.0)
        (record,) = status(srv.base_url)["schedulers"]
        log = srv.log_path.read_text(errors="replace")
    assert [len(o["output_ids"]) for o in outputs] == [NEW] * len(PROMPTS)
    assert record["speculative"]["disaggregation_mode"] == "decode"
    assert "PD decode" in record["state"] and record["state"].startswith("gating")
    assert record["steps"]["spec"] > 0 and record["steps"]["plain"] > 0
    assert record["plain_step_failures"] == 0 and not record["degraded"]
    assert "event_loop_overlap_disagg_decode" not in log  # no traceback there
    note(f"PD decode: gated decode server, {time.monotonic() - t0:.0f} s")
