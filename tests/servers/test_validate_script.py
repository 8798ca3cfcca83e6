"""``examples/validate_gpu.py`` runs for real, on CPU, against real servers.

The script a user with a GPU runs is itself tested here: it starts a server
without speculation and gated EAGLE-3 servers of the tiny target and the
trained draft (SGLang's real speculative path on CPU, with ``--device cpu`` and
the CPU flags passed through after ``--`` and the CI-only stand-ins of
``ci/cpu_spec`` in the environment), on a small prompt set, and must report
identical outputs, acceptance from the decision log, the plain-step
throughput table and the outputs with plain graphs ``auto`` (every plain step
eager on CPU). The numbers say nothing about a GPU. Its pure helpers are
tested without servers at the end.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import sglang_env
from support.gated_server import with_pythonpath
from support.server import READY_TIMEOUT_S, cpu_server_args
from support.spec_server import TRITON_CPU_ARGS, spec_server_env
from support.timings import note

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "validate_gpu.py"
#: section 5: 0.5.9 times depth 2 on a server of its own; 0.5.23 depths 1
#: and 3 (the configured one) on one --gate-depths server, with 5b
DEPTHS = "2" if sglang_env.version() == "0.5.9" else "1"
ADAPTIVE = sglang_env.version() != "0.5.9"


def cpu_flags(model_dir) -> list[str]:
    """What every server gets on CPU: the stock CPU flags, Triton attention."""
    args = cpu_server_args(model_dir, 0)
    flags = args[args.index("--device") :]
    backend = flags.index("--attention-backend")
    flags[backend + 1] = "triton"
    return flags + list(TRITON_CPU_ARGS)


# four servers one after the other, up to five with section 5's: past the
# suite's 600 s per test when four CI sessions share two cores (the script's
# own run gets 1200 s below)
@pytest.mark.timeout(1300)
def test_validate_script_reports_identity_acceptance_and_cost(
    spec_models, test_plugins, tmp_path
):
    target, draft = spec_models
    out_dir = tmp_path / "validate"
    env = with_pythonpath(spec_server_env(launcher="gate"), test_plugins)
    # section 5's runtime depth changes land at the next step, not the 64th
    env["EAGLE_GATE_CONTROL_EVERY"] = "1"
    cmd = [
        sys.executable, str(SCRIPT),
        "--model-path", str(target), "--draft-model-path", str(draft),
        "--algorithm", "EAGLE3", "--num-steps", "3",
        "--prompts", "2", "--max-new-tokens", "12", "--switch-every", "3",
        "--strategies", "eager", "--concurrency", "1", "--no-eager-plain",
        "--no-graph-fallback", "--depths", DEPTHS,
        "--startup-timeout", str(READY_TIMEOUT_S), "--out", str(out_dir),
        "--", *cpu_flags(target),
    ]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)
    report = proc.stdout
    note(f"SGLang {sglang_env.version()}: examples/validate_gpu.py on CPU:\n{report}")
    assert proc.returncode == 0, report + proc.stderr[-3000:]
    assert "RESULT: outputs identical\n" in report
    section = report.split("== 1+2.")[1].split("== 3.")[0].splitlines()
    eager = next(line for line in section if line.split()[:1] == ["eager"])
    strategy, identical, after, other = eager.split()
    assert identical == "2/2"
    assert float(after) > 0 and float(other) > 0  # SPEC steps on both sides
    table = report.split("== 3.")[1].split("== 4c.")[0].splitlines()
    (row,) = [line.split() for line in table if line.split()[:1] == ["1"]]
    # C, no-spec, plain, ratio, graph share, eager, eager ratio (skipped here)
    assert len(row) == 7 and float(row[3]) > 0
    assert row[4] == "0.00"  # on CPU every plain step runs the target eagerly
    (graphs,) = [line.split() for line in table if line.split()[:1] == ["0/0"]]
    assert graphs[1:3] == ["off", "device_not_cuda"]
    assert "RESULT: plain graphs not captured: rank 0/0: off (device_not_cuda)" in (
        report
    )
    # 4c: strategy, identical (alternate), identical (never), plain target
    # path graph/eager, draft-extend path graph/eager (n/a until reported)
    table = report.split("== 4c.")[1].split("RESULT:")[0].splitlines()
    rows = [line.split() for line in table]
    (row,) = [r for r in rows if len(r) == 5 and r[0] == "eager"]
    assert row[1] == "2/2"
    same, requests = row[2].split("/")  # never: the C=1 requests, 4 of 2 prompts
    assert same == requests == "4"
    graph, eager_steps = map(int, row[3].split("/"))
    assert graph == 0 and eager_steps > 0  # alternate ran plain steps, eagerly
    assert row[4] == "n/a" or int(row[4].split("/")[0]) == 0
    assert "RESULT: outputs identical with plain graphs (alternate, never)" in report
    assert "== 4d." not in report and "fallback" not in report  # skipped
    # 5: per-depth step cost, depth 0 (the plain step) and the timed depths
    table = report.split("== 5.")[1].split("== 5b.")[0].splitlines()
    rows = [r.split() for r in table if r.split()[:1] and r.split()[0].isdigit()]
    by_depth = {int(r[1]): r for r in rows}
    timed = {0, 1, 3} if ADAPTIVE else {0, 2}
    assert set(by_depth) == timed, table
    for depth, (bs, _, ms, per_req, tps, steps) in by_depth.items():
        assert bs == "1" and float(ms) > 0 and float(tps) > 0 and int(steps) >= 3
        # the plain step emits one token per request; depth d at most d + 1
        assert (
            float(per_req) == 1.0 if depth == 0 else 1.0 <= float(per_req) <= depth + 1
        )
    assert float(by_depth[max(timed)][3]) > 1.0  # the trained draft is accepted
    assert "best depth per batch size: bs 1:" in report
    # each timed depth's C=1 requests (4 of 2 prompts) token-identical to the
    # server without speculation (depth 0 on 0.5.9: section 3's never server)
    compared = sorted(timed) if ADAPTIVE else sorted(timed - {0})
    assert (
        "outputs at C=1 against the server without speculation: "
        + ", ".join(f"depth {d} 4/4" for d in compared)
        + "\n"
    ) in report
    section = report.split("== 5b.")[1].split("RESULT:")[0]
    if not ADAPTIVE:
        assert "skipped: this SGLang has no --speculative-adaptive" in section
        return
    # 5b: depth 1 built for the gate (its seconds, and SGLang's log line's),
    # depth 3 the startup state; no memory measured off CUDA
    rows = {r.split()[0]: r.split() for r in section.splitlines()[2:] if r.strip()}
    assert set(rows) == {"1", "3"}, section
    # (seconds: measured, about 0 without graphs to capture; SGLang's line found)
    assert rows["1"][1] == "adaptive" and float(rows["1"][2]) >= 0, section
    assert rows["1"][3] == "-" and float(rows["1"][7]) >= 0, section
    assert rows["3"][1] == "startup" and rows["3"][7] == "-", section


def load_script():
    spec = importlib.util.spec_from_file_location("validate_gpu", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_validate_script_helpers():
    v = load_script()
    records = [
        {"tp_rank": 0, "dp_rank": 0, "plain_path": {"graph": 3, "eager": 1}},
        {"tp_rank": 1, "dp_rank": 0, "plain_path": {"graph": 3, "eager": 1}},
        {"tp_rank": 0, "dp_rank": 1, "plain_path": {"graph": 2, "eager": 4}},
    ]
    # TP rank 0 of each DP rank: every TP rank runs the same steps
    assert v.sum_counts(records, "plain_path") == {"graph": 5, "eager": 5}
    assert v.sum_counts(records, "draft_extend_path") is None  # not reported
    assert v.fmt_paths({"graph": 5, "eager": 5}) == "5/5"
    assert v.fmt_paths({"eager": 2}) == "0/2"
    assert v.fmt_paths(None) == "n/a"
    reasons = {"graphs_off": 0, "bs_above_max": 12, "declined": 1}
    assert v.fmt_reasons(reasons) == "bs_above_max 12, declined 1"
    assert v.fmt_reasons(dict.fromkeys(reasons, 0)) == "-"
    assert v.fmt_reasons(None) == "n/a"
    assert v.fallback_result(18, 18, {"graph": 20, "eager": 13}, reasons) == (
        "fallback above --cuda-graph-max-bs: identical, 12 eager (bs_above_max), "
        "1 eager (declined), 20 graph"
    )
    assert v.fallback_result(17, 18, None, None) == (
        "fallback above --cuda-graph-max-bs: OUTPUTS DIFFER (17/18), "
        "0 eager (bs_above_max), 0 graph"
    )
    assert v.count_same([[1, 2], [3]], [[1, 2], [4]]) == 1
    # SGLang 0.5.9 has --cuda-graph-max-bs; 0.5.23 --cuda-graph-max-bs-decode
    # (and refuses the former as ambiguous)
    assert v.pick_max_bs_flag(["--cuda-graph-max-bs", "--cuda-graph-bs"]) == (
        "--cuda-graph-max-bs"
    )
    assert (
        v.pick_max_bs_flag(
            ["--cuda-graph-max-bs-decode", "--cuda-graph-max-bs-prefill"]
        )
        == "--cuda-graph-max-bs-decode"
    )
    assert v.pick_max_bs_flag(["--tp"]) is None


def test_validate_script_depth_helpers(tmp_path):
    v = load_script()
    spec = ["--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
            "--speculative-num-draft-tokens", "4"]  # fmt: skip
    assert v.at_depth(spec, 5) == [
        "--speculative-num-steps", "5", "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", "6",
    ]  # fmt: skip
    assert spec[1] == "3"  # the configured shape is left alone

    def outcome(bs, tokens, interval):
        return {"kind": "outcome", "batch_size": bs, "tokens": tokens,
                "interval_s": interval}  # fmt: skip

    rank0 = [{"kind": "start", "tp_rank": 0}, outcome(2, 6, 0.010),
             outcome(2, 4, 0.030), outcome(2, 4, 0.020), outcome(1, 3, None),
             {"kind": "decision", "batch_size": 2}, outcome(1, 2, 0.005)]  # fmt: skip
    rank1 = [{"kind": "start", "tp_rank": 1}, outcome(2, 99, 9.0)]
    logs = tmp_path / "logs"
    logs.mkdir()
    for name, records in (("a", rank0), ("b", rank1)):
        lines = "\n".join(map(json.dumps, records))
        (logs / f"decisions-{name}.jsonl").write_text(lines + "\n")
    costs = v.step_costs(v.timed_outcomes(logs))
    # rank 1 left out; the step without an interval left out
    assert costs == {1: (0.005, 2.0, 1), 2: (0.020, 14 / 6, 3)}
    rows = v.depth_rows({0: {2: (0.010, 1.0, 5)}, 3: costs})
    # batch size 1 seen once: below min_steps
    assert [(bs, d) for bs, d, *_ in rows] == [(2, 0), (2, 3)]
    assert rows[1][4] == pytest.approx(2 * (14 / 6) / 0.020)
    log = (
        "[x] Built adaptive runtime state steps=1: elapsed=0.52s, mem=0.31GB\n"
        "[x] Built adaptive runtime state steps=5: elapsed=1.50s, mem=-0.02GB\n"
    )
    assert v.adaptive_state_costs(log) == {1: (0.52, 0.31), 5: (1.5, -0.02)}
    # a --gate-depths server's records carry the depth that ran: split by it
    mixed = [{"kind": "start", "tp_rank": 0}, outcome(2, 6, 0.010) | {"depth": 3},
             outcome(2, 2, 0.004) | {"depth": 0}, outcome(2, 3, 0.006) | {"depth": 1},
             outcome(2, 5, 0.012) | {"depth": 3}]  # fmt: skip
    depth_logs = tmp_path / "depth-logs"
    depth_logs.mkdir()
    (depth_logs / "d.jsonl").write_text("\n".join(map(json.dumps, mixed)) + "\n")
    timed = v.timed_outcomes(depth_logs)
    assert v.step_costs(timed, 3) == {2: (0.011, 11 / 4, 2)}
    assert v.step_costs(timed, 0) == {2: (0.004, 1.0, 1)}
    assert v.step_costs(timed, 2) == {}
    builds = {
        "0": {"steps": 4},
        "3": {"built": "startup"},
        "1": {"built": "adaptive", "capture_s": 1.25, "mib_total": 612.4,
              "mib_verify_graphs": 300.0, "mib_draft_graphs": 120.0,
              "verify_graph_bs": [1, 2, 4, 8]},
    }  # fmt: skip
    assert v.build_rows(builds, {1: (1.3, 0.61)}) == [
        (1, "adaptive", "1.25", "612", "300", "120", "1..8", "1.30", "0.61"),
        (3, "startup", "-", "-", "-", "-", "-", "-", "-"),
    ]


def test_validate_script_finds_sglangs_graph_max_bs_flag():
    """Section 4d appends SGLang's largest-graph flag; the names differ by
    version (0.5.23 refuses ``--cuda-graph-max-bs`` as ambiguous)."""
    expected = {"0.5.9": "--cuda-graph-max-bs", "0.5.23": "--cuda-graph-max-bs-decode"}
    assert load_script().graph_max_bs_flag() == expected[sglang_env.version()]
