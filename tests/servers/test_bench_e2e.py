"""``python -m eagle_gate.bench`` once end to end, against real CPU servers.

A server without speculation, a stock EAGLE-3 server and a gated one (SGLang's
real speculative path on CPU, see ``support.spec_server``), two small
concurrencies: the bench tool drives ``sglang.bench_serving`` against each and
prints its table with ratios to the first server. The numbers describe a tiny
model on CPU stand-ins, nothing more.

It runs once, in the SGLang 0.5.23 environment: ``sglang.bench_serving``
imports ``datasets``, and the ``datasets`` release that pip resolves beside
0.5.9's pins needs a huggingface-hub that 0.5.9's transformers refuses.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import sglang_env
from support.server import free_port, serve, serve_together
from support.timings import note

pytestmark = pytest.mark.skipif(
    sglang_env.version() != "0.5.23",
    reason="the bench tool runs end to end once, in the 0.5.23 environment "
    "(see the module doc)",
)


def test_bench_tool_against_baseline_eagle3_and_gated_servers(spec_models, tmp_path):
    target, draft = spec_models
    # name: how serve() starts it
    servers = {
        "baseline": {},
        "eagle3": {"draft_dir": draft},
        "gated": {
            "draft_dir": draft,
            "launcher": "gate",
            "gate_args": [
                "--gate-policy",
                "goodput",
                "--gate-status-dir",
                str(tmp_path / "status"),
            ],  # fmt: skip
        },
    }
    managers = [
        serve(target, tmp_path / f"{name}.log", **how) for name, how in servers.items()
    ]
    with serve_together(managers) as started:
        urls = {name: srv.base_url for name, srv in zip(servers, started, strict=True)}
        cmd = [sys.executable, "-m", "eagle_gate.bench"]
        for name, url in urls.items():
            cmd += ["--server", f"{name}={url}"]
        # a server that is not there: its runs fail, the others go on
        # (tests/servers/test_bench_serving.py checks this on 0.5.9)
        cmd += ["--server", f"dead=http://127.0.0.1:{free_port()}"]
        cmd += [
            "--gate-status", f"gated={tmp_path / 'status'}",
            "--concurrency", "1,2", "--num-prompts-per-level", "2",
            "--dataset-name", "random-ids", "--random-input-len", "12",
            "--random-output-len", "8", "--random-range-ratio", "1.0",
            "--tokenizer", str(target), "--run-timeout", "600",
            "--out", str(tmp_path / "bench"),
        ]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1500)
    note(f"SGLang {sglang_env.version()}: python -m eagle_gate.bench on CPU:")
    note(proc.stdout)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    table = proc.stdout
    for name in ("baseline", "eagle3", "gated"):
        assert name in table
    doc = json.loads((tmp_path / "bench" / "results.json").read_text())
    runs = {(r["server"], r["concurrency"]): r for r in doc["runs"]}
    assert set(runs) == {(n, c) for n in (*servers, "dead") for c in (1, 2)}
    failed = {k: r.get("error") for k, r in runs.items() if not r.get("ok")}
    assert set(failed) == {("dead", 1), ("dead", 2)}, failed
    assert all(failed.values()), failed  # (each failed run says why)
    runs = {k: r for k, r in runs.items() if k[0] != "dead"}
    info = {s["name"]: s["info"] for s in doc["servers"] if s.get("info")}
    assert info["baseline"]["model_path"] == str(target)
    assert not info["baseline"].get("speculative_algorithm")
    assert info["eagle3"].get("speculative_algorithm"), info["eagle3"]
    assert all(r["output_tok_s"] > 0 for r in runs.values())
    # the ratio columns of the first table: a number for every level
    first = table.split("output tok/s")[1]
    assert "eagle3 / baseline" in first and "gated / baseline" in first
