"""The policy tools in ``examples/`` run, and say what their docs say.

``bench_policy_overhead.py`` (timings and bytecode counts), ``steps_to_move.py``
and ``sim_seeds.py`` back the figures in README.md and docs/goodput.md; these
tests keep them runnable and check the properties those figures rest on.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from eagle_gate.goodput import Goodput
from eagle_gate.policies import AlwaysSpec

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SRC = Path(__file__).resolve().parents[2] / "src"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(script: str, *args: str) -> str:
    env = dict(os.environ, PYTHONPATH=str(SRC))
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.parametrize("stream", ["steady", "walk"])
def test_bytecode_count_is_exact_and_sees_the_policy(stream):
    bench = _load("bench_policy_overhead")
    goodput = bench.count_bytecodes(Goodput, 3000, stream)
    # the same inputs, the same count: it does not depend on the machine
    assert bench.count_bytecodes(Goodput, 3000, stream) == goodput
    always = bench.count_bytecodes(AlwaysSpec, 3000, stream)
    # only the policy's own module counts: AlwaysSpec's two one-line methods
    assert 0 < always < 10
    assert goodput > 20 * always
    assert sys.gettrace() is None  # tracing is switched off again
    # the figure docs/goodput.md quotes (about 500 per step on CPython
    # 3.11, eager PLAIN outcomes included): a dearer hot path fails here
    if sys.version_info[:2] == (3, 11):
        assert goodput < 505, goodput


def test_bench_policy_overhead_prints_every_policy():
    out = _run("bench_policy_overhead.py", "--steps", "2000", "--stream", "steady")
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines()[1:]}
    assert set(rows) == {"always", "never", "threshold", "goodput", "goodput-depths"}
    for median, p90, refill in rows.values():
        # the view's refill comes on top of decide + observe
        assert 0.0 < float(median) <= float(p90)
        assert float(refill) >= float(median)
    out = _run("bench_policy_overhead.py", "--steps", "2000", "--count-bytecodes")
    assert "bytecodes/step" in out and "goodput" in out


def test_bench_policy_overhead_repeats_and_keeps_the_lowest_median():
    out = _run(
        "bench_policy_overhead.py",
        "--steps",
        "2000",
        "--stream",
        "walk",
        "--repeat",
        "3",
    )
    assert "highest median" in out.splitlines()[0]
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines()[1:]}
    assert set(rows) == {"always", "never", "threshold", "goodput", "goodput-depths"}
    for median, p90, _refill, highest in rows.values():
        assert 0.0 < float(median) <= float(p90)
        assert float(median) <= float(highest)
    bad = subprocess.run(
        [sys.executable, str(EXAMPLES / "bench_policy_overhead.py"), "--repeat", "0"],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(SRC)),
    )
    assert bad.returncode != 0 and "--repeat 0: expected 1 or more" in bad.stderr


def test_steps_to_move_moves_in_every_case():
    out = _run("steps_to_move.py", "--seeds", "1")
    rows = [
        line
        for line in out.splitlines()
        if line.startswith("| load") or line.startswith("| acceptance")
    ]
    assert len(rows) == 4, out
    assert "never" not in out, out


def test_sim_seeds_suite_prints_every_row_of_the_policy_suite():
    out = _run("sim_seeds.py", "--suite", "--seeds", "1", "--quick")
    for row in ("acc-down b1", "acc-up b8", "close-plain-3 b4", "jitter", "ramp"):
        assert f"| {row}" in out, out
    assert "mean over rows:" in out


def test_steps_to_move_without_draft_matches():
    out = _run("steps_to_move.py", "--seeds", "1", "--sync", "none")
    assert "draft_matches False" in out and "| acceptance up" in out


def test_the_tests_seed_their_rows_as_sim_seeds_does():
    """A seed a test names (``support.suite_rows.SEED_STRIDE``, used by the
    simulator tests) is the seed ``sim_seeds.py`` reports."""
    from support.suite_rows import SEED_STRIDE

    assert _load("sim_seeds").SEED_STRIDE == SEED_STRIDE


def test_sim_seeds_reports_every_close_call_row():
    out = _run("sim_seeds.py", "--seeds", "1", "--quick", "--profile", "close-spec-5")
    for row in ("C=8", "C=32", "C=4..64"):
        assert f"close-spec-5    close    {row}" in out, out
    assert "rows whose mean gp/best(a,n) is below 0.995" in out


def test_sim_seeds_depths_prints_the_depth_columns_of_a_main_row():
    out = _run(
        "sim_seeds.py", "--depths", "--quick", "--seeds", "1",
        "--profile", "single-gpu-8b", "--workload", "ramp",
    )  # fmt: skip
    assert "| goodput-depths | sglang-ema | best depth | PLAIN | depth-oracle" in out
    row = next(line for line in out.splitlines() if "single-gpu-8b ramp" in line)
    assert row.count("|") == 11, row
