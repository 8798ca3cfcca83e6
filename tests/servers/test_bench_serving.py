"""``python -m eagle_gate.bench`` driving SGLang's real ``sglang.bench_serving``
against one stock CPU server (and a dead URL), on SGLang 0.5.9.

On 0.5.23 ``tests/servers/test_bench_e2e.py`` drives the same real
``sglang.bench_serving`` against three servers, a dead URL among them: this
module runs on 0.5.9 only, where that one cannot (about 3.5 minutes of a CI
session saved).

The CPU virtual environments install SGLang without its ``datasets``
dependency, which ``sglang.bench_serving`` 0.5.9 imports at module level; the
test puts a stub ``datasets`` module on the benchmark's ``PYTHONPATH`` then
(the ``random-ids`` dataset it uses never calls it). On a GPU install
``datasets`` is present. The orchestration itself, with a fake benchmark, is
tested in ``tests/unit/test_bench.py``.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest
import sglang_env
from support.server import cpu_server_env, free_port, serve

from eagle_gate.bench.__main__ import main
from eagle_gate.bench.runner import load_results

pytestmark = pytest.mark.skipif(
    sglang_env.version() == "0.5.23",
    reason="on 0.5.23 test_bench_e2e.py drives the real sglang.bench_serving "
    "against three servers and a dead URL (see the module doc)",
)


def test_real_bench_serving_against_stock_cpu_server(tiny_model, tmp_path, monkeypatch):
    env = cpu_server_env()
    for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "TOKENIZERS_PARALLELISM"):
        monkeypatch.setenv(key, env[key])
    if importlib.util.find_spec("datasets") is None:
        stub = tmp_path / "stub" / "datasets"
        stub.mkdir(parents=True)
        (stub / "__init__.py").write_text(
            "def load_dataset(*a, **k):\n    raise RuntimeError('datasets stub')\n"
        )
        old = os.environ.get("PYTHONPATH")
        monkeypatch.setenv(
            "PYTHONPATH", os.pathsep.join(p for p in (str(stub.parent), old) if p)
        )
    out = tmp_path / "out"
    dead_url = f"http://127.0.0.1:{free_port()}"
    # Every level sends the same prompts (same seed). With the radix cache on,
    # the second level's cached-prefix prefills stalled ~10 s once on this CPU
    # (SGLang 0.5.23), so the cache is off: this test checks orchestration.
    with serve(
        tiny_model, tmp_path / "server.log", args=["--disable-radix-cache"]
    ) as server:
        rc = main(
            [
                "--server",
                f"stock={server.base_url}",
                "--server",
                f"dead={dead_url}",
                "--concurrency",
                "1,2",
                "--num-prompts-per-level",
                "4",
                "--dataset-name",
                "random-ids",
                "--random-input-len",
                "16",
                "--random-output-len",
                "8",
                "--bench-python",
                sys.executable,
                "--run-timeout",
                "120",
                "--out",
                str(out),
            ]
        )
    doc = load_results(out)
    runs = {(r["server"], r["concurrency"]): r for r in doc["runs"]}
    logs = {
        k: Path(r["log_file"]).read_text()[-2000:]
        for k, r in runs.items()
        if r.get("log_file")
    }
    assert rc == 0
    for c in (1, 2):
        r = runs[("stock", c)]
        assert r["ok"], (r["error"], logs.get(("stock", c)))
        assert r["output_tok_s"] > 0 and r["completed"] == 4
        assert r["mean_tpot_ms"] is not None
        assert "sglang.bench_serving" in r["command"]
        assert not runs[("dead", c)]["ok"]
    info = doc["servers"][0]["info"]
    assert info["model_path"] == str(tiny_model)
    assert not info.get("speculative_algorithm")
