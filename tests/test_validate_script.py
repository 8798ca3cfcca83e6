"""``examples/validate_gpu.py`` runs for real, on CPU, against real servers.

The script a user with a GPU runs is itself tested here: it starts a server
without speculation and gated EAGLE-3 servers of the tiny target and the
trained draft (SGLang's real speculative path on CPU, with ``--device cpu`` and
the CPU flags passed through after ``--`` and the CI-only stand-ins of
``ci/cpu_spec`` in the environment), on a small prompt set, and must report
identical outputs, acceptance from the decision log, and the plain-step
throughput table. The numbers say nothing about a GPU.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import sglang_env
from support.gated_server import with_pythonpath
from support.server import cpu_server_args
from support.spec_server import spec_server_env
from support.timings import note

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "validate_gpu.py"


def cpu_flags(model_dir) -> list[str]:
    """What every server gets on CPU: the stock CPU flags, Triton attention."""
    args = cpu_server_args(model_dir, 0)
    flags = args[args.index("--device") :]
    backend = flags.index("--attention-backend")
    flags[backend + 1] = "triton"
    return flags + ["--disable-cuda-graph", "--triton-attention-num-kv-splits", "1"]


def test_validate_script_reports_identity_acceptance_and_cost(
    spec_models, test_plugins, tmp_path
):
    target, draft = spec_models
    out_dir = tmp_path / "validate"
    env = with_pythonpath(spec_server_env(launcher="gate"), test_plugins)
    cmd = [
        sys.executable, str(SCRIPT),
        "--model-path", str(target), "--draft-model-path", str(draft),
        "--algorithm", "EAGLE3", "--num-steps", "3",
        "--prompts", "2", "--max-new-tokens", "12", "--switch-every", "3",
        "--strategies", "eager", "--concurrency", "1", "--no-eager-plain",
        "--startup-timeout", "400", "--out", str(out_dir),
        "--", *cpu_flags(target),
    ]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)
    report = proc.stdout
    note(f"SGLang {sglang_env.version()}: examples/validate_gpu.py on CPU:\n{report}")
    assert proc.returncode == 0, report + proc.stderr[-3000:]
    assert "RESULT: outputs identical" in report
    eager = next(line for line in report.splitlines() if line.split()[:1] == ["eager"])
    strategy, identical, after, other = eager.split()
    assert identical == "2/2"
    assert float(after) > 0 and float(other) > 0  # SPEC steps on both sides
    table = report.split("== 3.")[1].splitlines()
    (row,) = [line.split() for line in table if line.split()[:1] == ["1"]]
    # C, no-spec, plain, ratio, graph share, eager, eager ratio (skipped here)
    assert len(row) == 7 and float(row[3]) > 0
    assert row[4] == "0.00"  # on CPU every plain step runs the target eagerly
    (graphs,) = [line.split() for line in table if line.split()[:1] == ["0/0"]]
    assert graphs[1:3] == ["off", "device_not_cuda"]
    assert "RESULT: plain graphs not captured: rank 0/0: off (device_not_cuda)" in (
        report
    )
