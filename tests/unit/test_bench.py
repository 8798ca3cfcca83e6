"""``python -m eagle_gate.bench``: orchestration, table, capture.

The tests use a fake ``bench_serving`` module (a tiny script writing the same
JSONL result line) and a fake HTTP server, so they are fast and need no SGLang.
The run of SGLang's real ``sglang.bench_serving`` against a stock CPU server
is in ``tests/servers/test_bench_serving.py``.
"""

from __future__ import annotations

import json
import textwrap
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from eagle_gate.bench.__main__ import main
from eagle_gate.bench.capture import derive_profile, solve_alpha
from eagle_gate.bench.runner import (
    BenchOptions,
    format_table,
    load_results,
    parse_concurrency,
    parse_server,
)
from eagle_gate.sim.profile_files import load_profile_file
from eagle_gate.sim.profiles import SEED_PCIE_TP8

# a copy of shared/data/seed-pcie-tp8.json, the reference measurements
REFERENCE = Path(__file__).resolve().parents[1] / "data" / "seed-pcie-tp8.json"

# -- fakes -------------------------------------------------------------------

FAKE_BENCH = textwrap.dedent(
    """
    import argparse, json, sys
    ap = argparse.ArgumentParser()
    for a in ("--backend", "--base-url", "--dataset-name", "--output-file",
              "--random-input-len", "--random-output-len", "--seed"):
        ap.add_argument(a)
    ap.add_argument("--max-concurrency", type=int)
    ap.add_argument("--num-prompts", type=int)
    ap.add_argument("--disable-tqdm", action="store_true")
    a = ap.parse_args()
    c = a.max_concurrency
    if c == 3:
        print("Traceback: boom at concurrency 3", file=sys.stderr)
        sys.exit(1)
    spec = a.base_url.endswith("/spec")
    tok_s = 100.0 * c ** 0.5 * (0.8 if spec else 1.0)
    row = {
        "backend": a.backend, "max_concurrency": c,
        "completed": a.num_prompts, "duration": 1.0,
        "total_input_tokens": 16 * a.num_prompts,
        "total_output_tokens": 8 * a.num_prompts,
        "output_throughput": tok_s, "request_throughput": tok_s / 8,
        "mean_tpot_ms": 1000.0 * c / tok_s, "median_tpot_ms": 1000.0 * c / tok_s,
        "mean_ttft_ms": 20.0, "mean_e2e_latency_ms": 100.0,
        "accept_length": None,
    }
    with open(a.output_file, "a") as f:
        f.write(json.dumps(row) + "\\n")
    """
)

SPEC_INFO = {
    "model_path": "fake-model",
    "tp_size": 1,
    "speculative_algorithm": "EAGLE3",
    "speculative_num_steps": 3,
    "speculative_eagle_topk": 1,
    "speculative_num_draft_tokens": 4,
    "max_running_requests": 64,
    "internal_states": [{"avg_spec_accept_length": 2.5}],
}


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        if self.path.startswith("/spec"):
            path, info = self.path[len("/spec") :], SPEC_INFO
        else:
            path, info = self.path, {"model_path": "fake-model", "tp_size": 1}
        if path == "/health":
            body = b""
        elif path == "/server_info":
            body = json.dumps(info).encode()
        else:
            self.send_response(404)
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def fake_server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture
def fake_bench(tmp_path, monkeypatch):
    d = tmp_path / "fakebench"
    d.mkdir()
    (d / "fake_bench_serving.py").write_text(FAKE_BENCH)
    monkeypatch.setenv("PYTHONPATH", str(d))
    return "fake_bench_serving"


def _dead_url() -> str:
    from support.server import free_port

    return f"http://127.0.0.1:{free_port()}"


# -- unit --------------------------------------------------------------------


def test_parse_server_and_concurrency():
    assert parse_server("base=http://h:1/") == parse_server("base=http://h:1")
    assert parse_server("base=h:1").url == "http://h:1"
    assert parse_server("http://127.0.0.1:30000").name == "127.0.0.1-30000"
    with pytest.raises(ValueError):
        parse_server("bad name=http://h:1")
    assert parse_concurrency("1, 2,5,2") == [1, 2, 5]
    with pytest.raises(ValueError):
        parse_concurrency("1,0")
    with pytest.raises(ValueError):
        parse_concurrency("1,x")


def test_command_passes_dataset_options(tmp_path):
    opts = BenchOptions(random_input_len=64, random_output_len=8, extra_args=("--x",))
    assert opts.prompts_for(1) == 32 and opts.prompts_for(100) == 400
    cmd = opts.command("http://h:1", 10, tmp_path / "o.jsonl")
    assert cmd[1:3] == ["-m", "sglang.bench_serving"]
    joined = " ".join(cmd)
    for part in (
        "--backend sglang",
        "--base-url http://h:1",
        "--max-concurrency 10",
        "--num-prompts 40",
        "--dataset-name random",
        "--random-input-len 64",
        "--random-output-len 8",
    ):
        assert part in joined
    assert cmd[-1] == "--x"
    share = BenchOptions(dataset_name="sharegpt", dataset_path="d.json", num_prompts=7)
    cmd = share.command("http://h:1", 2, tmp_path / "o.jsonl")
    assert "--random-input-len" not in cmd and "d.json" in cmd
    assert cmd[cmd.index("--num-prompts") + 1] == "7"


def test_solve_alpha():
    a = solve_alpha(2.18, 4)
    assert abs(1 + a + a * a + a**3 - 2.18) < 1e-3
    assert solve_alpha(1.0, 4) == 0.0
    assert solve_alpha(9.0, 4) < 1.0


# -- orchestration with a fake bench_serving ---------------------------------


def test_grid_table_blank_cells_and_capture(tmp_path, fake_server, fake_bench, capsys):
    out = tmp_path / "out"
    rc = main(
        [
            "--server",
            f"base={fake_server}",
            "--server",
            f"spec={fake_server}/spec",
            "--server",
            f"dead={_dead_url()}",
            "--concurrency",
            "1,3,4",
            "--num-prompts-per-level",
            "4",
            "--bench-module",
            fake_bench,
            "--out",
            str(out),
        ]
    )
    text = capsys.readouterr().out
    assert rc == 0
    doc = load_results(out)
    runs = {(r["server"], r["concurrency"]): r for r in doc["runs"]}
    assert len(runs) == 9
    assert runs[("base", 4)]["ok"] and runs[("base", 4)]["output_tok_s"] == 200.0
    # accept length: not in the result line, so read from /server_info
    assert runs[("spec", 1)]["accept_length"] == 2.5
    assert runs[("base", 1)]["accept_length"] is None
    # a failing run and an unreachable server are blank cells with the error
    assert not runs[("spec", 3)]["ok"] and "boom" in runs[("spec", 3)]["error"]
    assert not runs[("dead", 1)]["ok"] and "unreachable" in runs[("dead", 1)]["error"]
    assert doc["servers"][1]["info"]["speculative_num_draft_tokens"] == 4
    assert "| 4 | 200.0 | 160.0 |  | 0.80 |  |" in text
    assert "| 3 |  |  |  |  |  |" in text
    assert "- spec C=3: bench_serving exited with code 1" in text
    assert "- dead: server" in text
    assert (out / "table.md").read_text() == format_table(doc) + "\n"
    assert (out / "raw" / "base-c4.jsonl").exists()
    assert (out / "logs" / "spec-c3.log").exists()

    # capture from these results; the simulator loads the profile
    prof_path = tmp_path / "captured.json"
    rc = main(
        [
            "capture",
            "--results",
            str(out),
            "--calibrate-rounds",
            "1",
            "--quick",
            "--out",
            str(prof_path),
        ]
    )
    text = capsys.readouterr().out
    assert rc == 0, text
    prof = load_profile_file(prof_path)
    assert prof.num_draft_tokens == 4
    assert [c for c, _ in prof.plain_table] == [1.0, 4.0]
    assert abs(prof.mean_accept(prof.classes["captured"]) - 2.5) < 0.01
    assert prof.max_running == 64
    assert prof.prompt_len == (1, 1024)  # random dataset, range ratio 0
    assert "PLAIN server base, SPEC server spec" in text

    # the report command reprints the same tables
    assert main(["report", str(out / "results.json")]) == 0
    assert format_table(doc) in capsys.readouterr().out


def test_capture_needs_both_servers(tmp_path, capsys):
    doc = {
        "tool": "eagle_gate.bench",
        "servers": [{"name": "only", "url": "x", "info": {}}],
        "runs": [],
        "concurrency": [1],
    }
    (tmp_path / "results.json").write_text(json.dumps(doc))
    rc = main(["capture", "--results", str(tmp_path), "--out", str(tmp_path / "p")])
    assert rc == 2
    assert "speculative" in capsys.readouterr().err


def test_capture_from_reference_table(tmp_path):
    """Capturing the README's reference measurements gives a profile that the
    simulator reproduces and that is close to the hand-calibrated built-in."""
    ref = json.loads(REFERENCE.read_text())
    runs = []
    for name, key in (("baseline", "baseline_tok_s"), ("eagle3", "eagle3_tok_s")):
        for c, t in zip(ref["concurrency"], ref[key], strict=True):
            runs.append(
                {
                    "server": name,
                    "concurrency": c,
                    "ok": True,
                    "output_tok_s": t,
                    "mean_tpot_ms": 1e3 * c / t,
                    "mean_ttft_ms": 60.0,
                    "completed": 4 * c,
                    "accept_length": 2.18 if name == "eagle3" else None,
                }
            )
    doc = {
        "tool": "eagle_gate.bench",
        "description": "reference",
        "options": {
            "dataset_name": "random",
            "random_input_len": 2500,
            "random_output_len": 600,
            "random_range_ratio": 0.3,
        },
        "concurrency": ref["concurrency"],
        "servers": [
            {"name": "baseline", "url": "a", "info": {"tp_size": 8}},
            {
                "name": "eagle3",
                "url": "b",
                "info": {
                    "speculative_algorithm": "EAGLE3",
                    "speculative_num_draft_tokens": 4,
                },
            },
        ],
        "runs": runs,
    }
    mapping, report = derive_profile(doc, calibrate_rounds=2, quick=True)
    assert report["max_abs_error"] < 0.03, report["fit"]
    path = tmp_path / "ref.json"
    path.write_text(json.dumps(mapping))
    prof = load_profile_file(path)
    for mine, theirs in (
        (prof.plain_table, SEED_PCIE_TP8.plain_table),
        (prof.spec_table, SEED_PCIE_TP8.spec_table),
    ):
        for (c1, y1), (c2, y2) in zip(mine, theirs, strict=True):
            assert c1 == c2 and abs(y1 / y2 - 1) < 0.15, (c1, y1, y2)
