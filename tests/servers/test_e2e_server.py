"""End to end on a real SGLang server process on loopback, one per version.

EAGLE cannot run on CPU, so these servers do not speculate: the gate is active
in every scheduler process (status, log line, policy) but idle, and every step
is SGLang's own. What they prove is that ``python -m eagle_gate.launch``
reaches every spawned scheduler with the chosen policy, passes SGLang's
arguments through, serves tokens, and that bad input stops the launch early.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import psutil
import pytest
import sglang_env
from support.server import cpu_server_env, free_port, generate, serve
from support.spec_server import baseline_server_args

GATE_LAUNCH = [sys.executable, "-m", "eagle_gate.launch"]


def gate_server_args(model_dir, port):
    """The command line ``serve(launcher="gate")`` runs, for launches that
    must stop before a server is up."""
    return baseline_server_args(model_dir, port, launcher="gate")


def read_status_cli(status_dir) -> tuple[int, dict]:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "eagle_gate.cli",
            "status",
            "--status-dir",
            str(status_dir),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return out.returncode, json.loads(out.stdout)


def assert_every_scheduler_runs_the_gate(srv, status_dir, policy, settings):
    children = {p.pid for p in psutil.Process(srv.pid).children(recursive=True)}
    schedulers = [
        p for p in psutil.Process(srv.pid).children(recursive=True)
        if "scheduler" in " ".join(p.cmdline() + [p.name()]).lower()
    ]  # fmt: skip
    rc, status = read_status_cli(status_dir)
    assert rc == 0, status
    records = status["schedulers"]
    assert len(records) >= 1
    if schedulers:
        assert {r["pid"] for r in records} == {p.pid for p in schedulers}
    for record in records:
        assert record["pid"] in children and record["alive"]
        assert record["server_pid"] == srv.pid
        assert record["policy"] == policy
        assert record["settings"] == settings
        assert record["sglang_version"] == sglang_env.version()
        assert record["adapter"] == sglang_env.adapter().NAME
        assert record["gated"] is False
        assert record["state"].startswith("idle: speculation is off")
    log = srv.log_path.read_text(errors="replace")
    for record in records:
        assert f"eagle_gate active in scheduler pid {record['pid']}" in log


def test_gate_launcher_serves_and_every_scheduler_runs_the_gate(tiny_model, tmp_path):
    status_dir = tmp_path / "status"
    gate_args = [
        "--gate-policy", "threshold",
        "--gate-set", "plain_above=16",
        "--gate-set", "spec_at_or_below=2",
        "--gate-status-dir", str(status_dir),
    ]  # fmt: skip
    with serve(
        tiny_model, tmp_path / "gate.log", launcher="gate", gate_args=gate_args
    ) as srv:
        assert_every_scheduler_runs_the_gate(
            srv,
            status_dir,
            "threshold",
            {"plain_above": 16, "spec_at_or_below": 2, "min_dwell_steps": 32},
        )
        out = generate(srv.base_url, "The quick brown fox", max_new_tokens=6)
        assert len(out["output_ids"]) == 6
        tree = [srv.pid] + [
            c.pid for c in psutil.Process(srv.pid).children(recursive=True)
        ]
    assert not any(
        psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in tree
    )
    rc, status = read_status_cli(status_dir)
    assert rc == 1 and not any(r["alive"] for r in status["schedulers"])
    launcher_log = (tmp_path / "gate.log").read_text(errors="replace")
    assert "eagle_gate launcher pid" in launcher_log


@pytest.mark.skipif(
    sglang_env.version() != "0.5.23",
    reason="SGLang's entry-point plugin group exists from 0.5.23 on (0.5.9 has none)",
)
def test_stock_launcher_gets_the_gate_from_the_environment_on_0_5_23(
    tiny_model, tmp_path
):
    status_dir = tmp_path / "status"
    env = {"EAGLE_GATE_POLICY": "never", "EAGLE_GATE_STATUS_DIR": str(status_dir)}
    # plugins=None: SGLang loads its entry-point plugins, the gate among them
    with serve(tiny_model, tmp_path / "stock.log", env=env, plugins=None) as srv:
        assert_every_scheduler_runs_the_gate(srv, status_dir, "never", {})
        assert len(generate(srv.base_url, "Hello", max_new_tokens=3)["output_ids"]) == 3


def run_launch(args, env=None, timeout=120):
    t0 = time.monotonic()
    out = subprocess.run(
        args,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env or cpu_server_env(),
    )
    return out, time.monotonic() - t0


def test_bad_policy_setting_fails_before_the_model_loads(tmp_path):
    missing_model = tmp_path / "no-model-here"
    out, _ = run_launch(
        GATE_LAUNCH
        + ["--model-path", str(missing_model), "--gate-policy", "threshold"]
        + ["--gate-set", "min_dwell_steps=soon"]
    )
    assert out.returncode == 2
    assert "'min_dwell_steps'" in out.stderr and "'soon'" in out.stderr
    assert "no-model-here" not in out.stderr  # SGLang never looked at the model


def test_unknown_policy_lists_the_available_ones(tmp_path):
    out, _ = run_launch(GATE_LAUNCH + ["--model-path", "x", "--gate-policy", "turbo"])
    assert out.returncode == 2
    assert (
        "unknown policy 'turbo'; available: always, goodput, goodput-depths, never, "
        "threshold" in out.stderr
    )


def test_unhandled_speculative_algorithm_is_refused_at_launch(tiny_model):
    """Judged as SGLang resolves it (#22): STANDALONE stays STANDALONE."""
    out, _ = run_launch(
        gate_server_args(tiny_model, free_port())
        + ["--speculative-algorithm", "STANDALONE"]
        + ["--speculative-draft-model-path", str(tiny_model)]
    )
    assert out.returncode != 0
    assert (
        "--speculative-algorithm STANDALONE (as SGLang resolves it) is not handled "
        "by eagle_gate" in out.stderr + out.stdout
    )


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--enable-dp-attention", "--dp-size", "2", "--tp-size", "2"]
            + ["--gate-draft-sync", "lazy"],
            "lazy under data-parallel attention",
        ),
        (["--pp-size", "2"], "pipeline parallelism"),
        pytest.param(
            ["--speculative-use-rejection-sampling", "--gate-draft-sync", "lazy"],
            "draft_probs",
            marks=pytest.mark.skipif(
                sglang_env.version() != "0.5.23",
                reason="rejection sampling is an SGLang 0.5.23 setting",
            ),
        ),
    ],
)
def test_layouts_the_gate_cannot_serve_are_refused_before_the_model_loads(
    tiny_model, flags, message
):
    """Judged on SGLang's own argument resolution (#22), which reads the
    model's config; refused before any scheduler starts or weights load."""
    out, _ = run_launch(
        gate_server_args(tiny_model, free_port())
        + ["--speculative-algorithm", "EAGLE3"]
        + ["--speculative-draft-model-path", str(tiny_model)]
        + ["--speculative-num-steps", "3", "--speculative-eagle-topk", "1"]
        + flags
    )
    assert out.returncode == 2, out.stderr[-2000:]
    assert message in out.stderr
    assert "eagle_gate active in scheduler" not in out.stderr + out.stdout
    assert "Load weight" not in out.stderr + out.stdout


@pytest.mark.skipif(
    sglang_env.version() != "0.5.23", reason="0.5.9 has no plugin loading"
)
def test_stock_launcher_with_a_bad_gate_setting_stops_on_0_5_23(tmp_path):
    env = cpu_server_env(EAGLE_GATE_POLICY="turbo")
    out, _ = run_launch(
        [sys.executable, "-m", "sglang.launch_server", "--model-path", "x"], env=env
    )
    assert out.returncode != 0
    assert "unknown policy 'turbo'" in out.stderr + out.stdout


def test_help_shows_sglang_and_gate_arguments_in_separate_groups():
    out, _ = run_launch(GATE_LAUNCH + ["--help"])
    assert out.returncode == 0
    text = out.stdout
    sglang_at = text.index("SGLang server arguments (passed to SGLang unchanged)")
    gate_at = text.index("eagle_gate arguments")
    assert text.index("--model-path", sglang_at) < gate_at
    assert text.index("--gate-policy", gate_at) > gate_at
