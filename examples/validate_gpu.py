#!/usr/bin/env python3
"""Validate eagle_gate's plain step on a GPU server (run by a user with a GPU).

What it checks, against real models on your GPU:

1. **Outputs**: a server without speculation and a gated EAGLE server whose
   policy forces a mode switch every few decode steps (``alternate``, from
   ``examples/third_party_policy``) answer a fixed prompt set with greedy
   sampling token for token identically, for each draft strategy.
2. **Acceptance across switches**: from the gate's decision log, the mean
   accept length of SPEC steps right after a PLAIN stretch, against the mean
   of the other SPEC steps, per draft strategy (``eager`` should keep them
   equal, ``lazy`` too for PLAIN stretches up to the draft-token count;
   ``none`` shows the cold-recovery dip).
3. **Plain-step cost**: output tok/s of the gated server with policy
   ``never`` (every step a plain step) against the server without
   speculation, at a few concurrencies, as ratios (1.0 = the plain step costs
   what a step of a server without speculation costs): with the plain step's
   own DECODE CUDA graphs (``--gate-plain-graphs auto``, what each TP rank
   captured and the MiB it took, from the gate's status; the share of plain
   steps that replayed a graph per level) and, for comparison, eager
   (``--gate-plain-graphs off``; skip with ``--no-eager-plain``). These are
   tables 4a and 4b of docs/design/2026-12-plain-graphs.md section 9.
4c. **Outputs with plain graphs** (``--gate-plain-graphs auto``), per draft
   strategy: the section 1 ``alternate`` outputs again; the outputs of the
   section 3 ``never`` server's requests at concurrency 1 (every prompt, one
   at a time), draft strategy ``eager`` only (the one section 3 runs;
   ``never`` per strategy would cost a server each); and, from the gate's
   status, the plain steps of the ``alternate`` servers by target path
   (``plain_path``: a plain graph replayed, or eager) and by draft-extend path
   (``draft_extend_path``; ``n/a`` where the gate does not report it).
4d. **Fallback**: a gated server with policy ``never`` whose graphs stop at
   ``--fallback-max-bs`` (8; SGLang's ``--cuda-graph-max-bs``, or
   ``--cuda-graph-max-bs-decode`` where SGLang renamed it, as 0.5.23 did):
   greedy outputs one by one (graph replays) and of twice that many requests
   sent at once (16: eager steps), each against the server without
   speculation at the same concurrency, with the plain steps by path and the
   eager reasons (``plain_eager_reasons``: ``bs_above_max`` expected). Skip
   with ``--no-graph-fallback``.

5. **Per-depth step cost** (the cost model of per-batch draft depth, #33):
   per decode batch size, the median step time, tokens per request per step
   and tokens/s of each draft depth of ``--depths`` (default ``1,2,3,5``;
   ``""`` skips it) and of depth 0, the gate's plain step, from the gate's
   decision log. On an SGLang with adaptive runtime states (0.5.23): one gated
   server with ``--gate-depths`` (the configured depth is added), policy
   ``always`` pinned to each depth in turn at runtime (``depth=d``), then
   ``never`` (a change lands at a multiple of ``EAGLE_GATE_CONTROL_EVERY``
   decode steps: traffic runs until it has, and each step's decision-log
   record says the depth it ran). Each depth's outputs at C=1 are compared
   with the server without speculation's (a difference fails the run, as in
   sections 1-4). Elsewhere (0.5.9): a gated server per depth
   (``--speculative-num-steps d --speculative-num-draft-tokens d+1``, policy
   ``always``) and section 3's ``never`` server. 5b (0.5.23): what each
   depth's runtime state cost to build, as the gate measured it (status
   ``depths.per_depth``: seconds, device MiB in all and of the verify and
   draft graphs, captured batch sizes) beside the seconds and GB SGLang's own
   log line gives, so the first GPU run checks one against the other.

What needs a GPU: sections 3 and 4 only say something about the plain step's
CUDA graphs where they are captured (CUDA, graphs not disabled); elsewhere
every plain step runs the target eagerly (status reason, e.g.
``device_not_cuda``), section 4d then adds nothing and costs a server. The exit
code is 1 if any output differs from the server without speculation. Greedy
outputs at concurrency above 1 can differ from a server without speculation
for reasons other than the gate (other kernels or KV splits at another batch
size, batches formed differently), and on a GPU so can rare greedy ties at
batch size 1 (docs/design/2026-12-plain-graphs.md section 8): read a mismatch, do not
assume.

Usage (one GPU, Llama-3.1-8B with its EAGLE-3 draft, for example)::

    pip install ./examples/third_party_policy
    python examples/validate_gpu.py \\
        --model-path meta-llama/Llama-3.1-8B-Instruct \\
        --draft-model-path jamesliu1/sglang-EAGLE3-Llama-3.1-Instruct-8B \\
        --algorithm EAGLE3 -- --tp 1 --mem-fraction-static 0.7

Arguments after ``--`` go to every server. ``--no-speculation-smoke`` runs the
same plumbing without speculation (the gate idle); it validates nothing about
the plain step.

On CPU, CI runs this script for real against SGLang's speculative path on a
tiny model (``tests/servers/test_validate_script.py``): ``--prompts 2
--strategies eager --concurrency 1 --no-eager-plain --no-graph-fallback``
and ``--depths 2`` on 0.5.9 (a server per depth), ``--depths 1`` on 0.5.23
(one ``--gate-depths`` server, and 5b) with
``-- --device cpu --attention-backend triton ...`` and the CI-only CPU
stand-ins of ``ci/cpu_spec`` in the environment. That checks the script and
shows what it reports (every plain step eager, reason ``device_not_cuda``);
the numbers of section 3 say nothing about a GPU.

Status: written against eagle_gate's plain step for SGLang 0.5.9 and 0.5.23;
it has NOT been run on a GPU yet.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number.",
    "Explain in two sentences what a hash map is.",
    "def quicksort(xs):",
    "List three prime numbers greater than 100.",
    "The capital of France is",
    "Translate to French: the cat sleeps on the warm windowsill.",
    "SELECT name, COUNT(*) FROM orders GROUP BY",
    "Once upon a time, in a village by the sea,",
]


def free_port() -> int:
    """A free port between SGLang's own picks (22000-29999) and the kernel's
    ephemeral range (32768+), where client connections and other tools'
    ``bind(0)`` ports would race a server for it."""
    for port in random.sample(range(30_000, 32_700), 200):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 30000-32699 for a server")


def post(
    url: str, payload: dict, timeout: float = 600, headers: dict | None = None
) -> dict:
    request = urllib.request.Request(
        url,
        json.dumps(payload).encode(),
        {"Content-Type": "application/json", **(headers or {})},
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


@contextlib.contextmanager
def server(cmd: list[str], env: dict, log: Path, timeout: float):
    port = int(cmd[cmd.index("--port") + 1])
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited ({proc.returncode}); see {log}")
            try:
                with urllib.request.urlopen(base + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"server not healthy in {timeout:.0f}s; see {log}")
            time.sleep(1)
        yield base
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def greedy_outputs(
    base: str, max_new_tokens: int, prompts: list[str], concurrency: int = 1
) -> list[list[int]]:
    """Greedy output ids: of each prompt one after the other (``concurrency``
    1), or of ``concurrency`` requests (the prompts in turn) sent at once."""
    params = {"temperature": 0, "max_new_tokens": max_new_tokens, "ignore_eos": True}
    one = lambda p: post(  # noqa: E731
        base + "/generate", {"text": p, "sampling_params": params}
    )["output_ids"]
    if concurrency == 1:
        return [one(p) for p in prompts]
    batch = [prompts[i % len(prompts)] for i in range(concurrency)]
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(one, batch))


def count_same(outputs: list[list[int]], reference: list[list[int]]) -> int:
    return sum(o == r for o, r in zip(outputs, reference, strict=True))


def throughput(
    base: str, concurrency: int, max_new_tokens: int, prompts: list[str]
) -> tuple[float, list[list[int]]]:
    """Output tok/s of ``max(4 x concurrency, len(prompts))`` greedy requests
    (the prompts in turn, ``concurrency`` at a time), and their output ids."""
    params = {"temperature": 0, "max_new_tokens": max_new_tokens, "ignore_eos": True}
    n = max(concurrency * 4, len(prompts))
    prompts = [prompts[i % len(prompts)] for i in range(n)]
    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        done = list(
            pool.map(
                lambda p: post(
                    base + "/generate", {"text": p, "sampling_params": params}
                ),
                prompts,
            )
        )
    tokens = sum(len(d["output_ids"]) for d in done)
    return tokens / (time.monotonic() - t0), [d["output_ids"] for d in done]


def switch_acceptance(log_dir: Path) -> tuple[float | None, float | None]:
    """Mean accept length of SPEC steps right after PLAIN, and of the others,
    from the gate's JSON-lines decision log (records with mode/accept_lens)."""
    after, other = [], []
    for path in sorted(log_dir.glob("*.jsonl")):
        previous = None
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record.get("kind") != "outcome" or not record.get("accept_lens"):
                continue
            lens, mode = record["accept_lens"], record["mode"]
            if mode == "spec":
                mean = sum(lens) / len(lens)
                (after if previous == "plain" else other).append(mean)
            previous = mode
    avg = lambda xs: sum(xs) / len(xs) if xs else None  # noqa: E731
    return avg(after), avg(other)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--draft-model-path")
    parser.add_argument("--algorithm", default="EAGLE3", choices=("EAGLE", "EAGLE3"))
    parser.add_argument("--num-steps", type=int, default=3)
    parser.add_argument("--switch-every", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--concurrency", default="1,8,32")
    parser.add_argument("--strategies", default="eager,lazy,none")
    parser.add_argument(
        "--prompts", type=int, default=len(PROMPTS), help="use the first N prompts"
    )
    parser.add_argument("--startup-timeout", type=float, default=900)
    parser.add_argument("--no-speculation-smoke", action="store_true")
    parser.add_argument(
        "--no-eager-plain",
        action="store_true",
        help="skip the eager plain-step server of section 3 (one server less)",
    )
    parser.add_argument(
        "--no-graph-fallback",
        action="store_true",
        help="skip section 4d, the fallback server (nothing new without graphs)",
    )
    parser.add_argument(
        "--fallback-max-bs",
        type=int,
        default=8,
        help="section 4d: SGLang's largest CUDA graph batch size (default 8)",
    )
    parser.add_argument(
        "--depths",
        default="1,2,3,5",
        help="section 5: draft depths to time, comma-separated ('' skips it)",
    )
    parser.add_argument("--out", default=None)
    parser.add_argument("server_args", nargs="*", help="after --: for every server")
    args = parser.parse_args()
    if not args.no_speculation_smoke and not args.draft_model_path:
        parser.error("--draft-model-path is required (or --no-speculation-smoke)")

    out = Path(args.out or tempfile.mkdtemp(prefix="eagle_gate_validate_"))
    out.mkdir(parents=True, exist_ok=True)
    py = sys.executable
    common = ["--model-path", args.model_path, "--host", "127.0.0.1"]
    common += list(args.server_args)
    spec = []
    if not args.no_speculation_smoke:
        spec = [
            "--speculative-algorithm", args.algorithm,
            "--speculative-draft-model-path", args.draft_model_path,
            "--speculative-num-steps", str(args.num_steps),
            "--speculative-eagle-topk", "1",
            "--speculative-num-draft-tokens", str(args.num_steps + 1),
        ]  # fmt: skip
    env = dict(os.environ)
    levels = [int(c) for c in args.concurrency.split(",")]
    prompts = PROMPTS[: max(1, args.prompts)]
    strategies = args.strategies.split(",")
    fallback_c = 2 * args.fallback_max_bs
    failures = 0
    differ = []  # the comparisons with plain graphs auto that differ

    def stock(port):
        return [py, "-m", "sglang.launch_server", *common, "--port", str(port)]

    def gated(port, policy, strategy, extra=(), steps=None):
        shape = spec if steps is None else at_depth(spec, steps)
        return [
            py, "-m", "eagle_gate.launch", *common, *shape, "--port", str(port),
            "--gate-policy", policy, "--gate-draft-sync", strategy, *extra,
        ]  # fmt: skip

    print(f"== reference: server without speculation (logs in {out})")
    with server(stock(free_port()), env, out / "nospec.log", args.startup_timeout) as b:
        reference = greedy_outputs(b, args.max_new_tokens, prompts)
        if not args.no_graph_fallback:
            reference_c = greedy_outputs(b, args.max_new_tokens, prompts, fallback_c)
        reference_tps = {
            c: throughput(b, c, args.max_new_tokens, prompts)[0] for c in levels
        }

    print("\n== 1+2. outputs and acceptance across forced switches")
    header = ("strategy", "identical", "accept after PLAIN", "other SPEC")
    print("{:>10} {:>10} {:>19} {:>11}".format(*header))
    alternate, paths = {}, {}
    for strategy in strategies:
        log_dir = out / f"decisions-{strategy}"
        extra = ["--gate-set", f"period={args.switch_every}"]
        extra += ["--gate-decision-log", str(log_dir), "--gate-plain-graphs", "auto"]
        cmd = gated(free_port(), "alternate", strategy, extra)
        with server(cmd, env, out / f"gated-{strategy}.log", args.startup_timeout) as b:
            outputs = greedy_outputs(b, args.max_new_tokens, prompts)
            paths[strategy] = status_counts(b, "plain_path", "draft_extend_path")
        same = alternate[strategy] = count_same(outputs, reference)
        failures += same != len(prompts)
        if same != len(prompts):
            differ.append(f"alternate {strategy}")
        after, other = switch_acceptance(log_dir)
        fmt = lambda x: "n/a" if x is None else f"{x:.2f}"  # noqa: E731
        identical = f"{same}/{len(prompts)}"
        print(f"{strategy:>10} {identical:>10} {fmt(after):>19} {fmt(other):>11}")

    print("\n== 3. plain-step throughput: gated (policy never) / no speculation")
    plain_tps, shares, graph_rows = {}, {}, []
    never_log = out / "decisions-never"
    never_extra = ["--gate-plain-graphs", "auto", "--gate-decision-log", str(never_log)]
    with server(
        gated(free_port(), "never", "eager", never_extra),
        env,
        out / "never.log",
        args.startup_timeout,
    ) as b:
        graph_rows = plain_graph_rows(b)
        never_outputs = None  # the C=1 requests: one at a time, as the reference's
        for c in levels:
            before = plain_paths(b)
            plain_tps[c], outputs = throughput(b, c, args.max_new_tokens, prompts)
            after = plain_paths(b)
            ran = {k: after[k] - before[k] for k in after}
            total = ran["graph"] + ran["eager"]
            shares[c] = ran["graph"] / total if total else None
            never_outputs = outputs if c == 1 else never_outputs
        if never_outputs is None:
            never_outputs = greedy_outputs(b, args.max_new_tokens, prompts)
    never_n = len(never_outputs)
    never_same = count_same(
        never_outputs, [reference[i % len(prompts)] for i in range(never_n)]
    )
    failures += never_same != never_n
    if never_same != never_n:
        differ.append("never eager")
    eager_tps = {}
    if not args.no_eager_plain:
        off = ["--gate-plain-graphs", "off"]
        cmd = gated(free_port(), "never", "eager", off)
        with server(cmd, env, out / "never-eager.log", args.startup_timeout) as b:
            for c in levels:
                eager_tps[c] = throughput(b, c, args.max_new_tokens, prompts)[0]
    print("plain-step CUDA graphs (--gate-plain-graphs auto), per scheduler:")
    print(f"{'rank':>5} {'state':>9} {'reason':>16} {'sizes':>12} {'MiB':>8} "
          f"{'capture s':>9}")  # fmt: skip
    for row in graph_rows:
        print(f"{row[0]:>5} {row[1]:>9} {row[2]:>16} {row[3]:>12} {row[4]:>8} "
              f"{row[5]:>9}")  # fmt: skip
    print(
        f"{'C':>5} {'no-spec tok/s':>14} {'plain tok/s':>12} {'ratio':>7} "
        f"{'graph share':>12} {'eager tok/s':>12} {'eager ratio':>12}"
    )
    for c in levels:
        ratio = plain_tps[c] / reference_tps[c]
        share = "n/a" if shares[c] is None else f"{shares[c]:.2f}"
        eager = f"{eager_tps[c]:.1f}" if c in eager_tps else "-"
        eratio = f"{eager_tps[c] / reference_tps[c]:.3f}" if c in eager_tps else "-"
        print(
            f"{c:>5} {reference_tps[c]:>14.1f} {plain_tps[c]:>12.1f} {ratio:>7.3f} "
            f"{share:>12} {eager:>12} {eratio:>12}"
        )

    print(
        "\n== 4c. outputs with plain graphs (--gate-plain-graphs auto), per draft sync"
    )
    print("requests identical to no speculation: alternate = the section 1 servers,")
    print("never = the section 3 server's requests at C=1 (draft sync eager only);")
    print("plain steps of the alternate servers since start by path, graph/eager")
    print("(n/a: not in the gate's status)")
    print(f"{'strategy':>10} {'alternate':>10} {'never':>6} {'plain target':>13} "
          f"{'draft extend':>13}")  # fmt: skip
    for strategy in strategies + ["eager"] * ("eager" not in strategies):
        alt = f"{alternate[strategy]}/{len(prompts)}" if strategy in alternate else "-"
        never = f"{never_same}/{never_n}" if strategy == "eager" else "-"
        counts = paths.get(strategy, {})
        target = fmt_paths(counts.get("plain_path")) if counts else "-"
        extend = fmt_paths(counts.get("draft_extend_path")) if counts else "-"
        print(f"{strategy:>10} {alt:>10} {never:>6} {target:>13} {extend:>13}")

    fallback = None
    if not args.no_graph_fallback:
        fallback = run_fallback(args, gated, env, out, prompts, fallback_c)
    if fallback is not None:
        same_1 = count_same(fallback["outputs"], reference)
        same_c = count_same(fallback["outputs_c"], reference_c)
        failures += same_1 != len(prompts) or same_c != fallback_c
        fallback["result"] = fallback_result(
            same_1 + same_c, len(prompts) + fallback_c,
            fallback["plain_path"], fallback["plain_eager_reasons"],
        )  # fmt: skip
        print(f"{'identical C=1':>13} {'identical C=' + str(fallback_c):>14} "
              f"{'plain target':>13}  eager reasons")  # fmt: skip
        print(f"{f'{same_1}/{len(prompts)}':>13} {f'{same_c}/{fallback_c}':>14} "
              f"{fmt_paths(fallback['plain_path']):>13}  "
              f"{fmt_reasons(fallback['plain_eager_reasons'])}")  # fmt: skip

    depths = [int(d) for d in args.depths.split(",") if d.strip()]
    if depths and not args.no_speculation_smoke:
        failures += run_depths(
            args, gated, env, out, prompts, levels, never_log, reference
        )

    states = {row[1] for row in graph_rows}
    print("\nRESULT:", "outputs identical" if not failures else "OUTPUTS DIFFER")
    print(
        "RESULT: plain graphs "
        + ("captured on every scheduler" if states == {"captured"} else
           "not captured: " + "; ".join(f"rank {r[0]}: {r[1]} ({r[2]})"
                                        for r in graph_rows))
    )  # fmt: skip
    print(
        "RESULT: outputs identical with plain graphs (alternate, never)"
        if not differ
        else "RESULT: OUTPUTS DIFFER with plain graphs: " + ", ".join(differ)
    )
    if fallback is not None:
        print("RESULT:", fallback["result"])
    return 1 if failures else 0


def run_fallback(args, gated, env, out: Path, prompts, concurrency) -> dict | None:
    """Section 4d: policy never, plain graphs auto, SGLang's graphs up to
    ``--fallback-max-bs``; greedy outputs one by one and at ``concurrency``,
    the plain steps by path and the eager reasons since start (None when this
    SGLang has no flag for the largest graph batch size)."""
    flag = graph_max_bs_flag()
    print(
        f"\n== 4d. fallback above the largest plain graph: policy never, "
        f"--gate-plain-graphs auto, -- {flag} {args.fallback_max_bs}"
    )
    if flag is None:
        print("skipped: this SGLang has neither --cuda-graph-max-bs nor "
              "--cuda-graph-max-bs-decode")  # fmt: skip
        return None
    extra = ["--gate-plain-graphs", "auto", flag, str(args.fallback_max_bs)]
    cmd = gated(free_port(), "never", "eager", extra)
    with server(cmd, env, out / "fallback.log", args.startup_timeout) as b:
        result = {
            "outputs": greedy_outputs(b, args.max_new_tokens, prompts),
            "outputs_c": greedy_outputs(b, args.max_new_tokens, prompts, concurrency),
        }
        result.update(status_counts(b, "plain_path", "plain_eager_reasons"))
    return result


def at_depth(spec: list[str], steps: int) -> list[str]:
    """The speculative flags ``spec`` with ``steps`` draft steps (a chain:
    ``steps + 1`` draft tokens)."""
    shape = list(spec)
    shape[shape.index("--speculative-num-steps") + 1] = str(steps)
    shape[shape.index("--speculative-num-draft-tokens") + 1] = str(steps + 1)
    return shape


def timed_outcomes(log_dir: Path) -> list[dict]:
    """The outcome records with a measured interval in the gate's decision
    logs under ``log_dir``, TP rank 0's logs only (every TP rank runs the
    same steps): read once, then cut by :func:`step_costs`."""
    records = []
    for path in sorted(log_dir.glob("*.jsonl")):
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        if any(r.get("kind") == "start" and r.get("tp_rank", 0) != 0 for r in lines):
            continue
        records += [
            r
            for r in lines
            if r.get("kind") == "outcome"
            and r.get("interval_s") is not None
            and r.get("batch_size")
        ]
    return records


def step_costs(
    records: list[dict], depth: int | None = None
) -> dict[int, tuple[float, float, int]]:
    """Per decode batch size: (median step seconds, mean tokens per request
    per step, steps) of ``records`` (:func:`timed_outcomes`); with
    ``depth``, only the steps that ran at it (a ``--gate-depths`` server's
    records say, 0 for PLAIN)."""
    by_bs: dict[int, list[tuple[float, float]]] = {}
    for r in records:
        if depth is not None and r.get("depth") != depth:
            continue
        bs = r["batch_size"]
        by_bs.setdefault(bs, []).append((r["interval_s"], r["tokens"] / bs))
    return {
        bs: (statistics.median(t for t, _ in xs), sum(k for _, k in xs) / len(xs),
             len(xs))
        for bs, xs in sorted(by_bs.items())
    }  # fmt: skip


#: SGLang 0.5.23's log line for each adaptive runtime state it builds
#: (``EAGLEWorkerV2.build_adaptive_runtime_state``)
_STATE_LINE = re.compile(
    r"Built adaptive runtime state steps=(\d+): elapsed=([\d.]+)s, mem=(-?[\d.]+)GB"
)


def adaptive_state_costs(log_text: str) -> dict[int, tuple[float, float]]:
    """Per depth: (build seconds, GB) of each runtime state SGLang built, as
    its log says (the configured depth's state is the startup one: no line)."""
    return {
        int(m[1]): (float(m[2]), float(m[3])) for m in _STATE_LINE.finditer(log_text)
    }


def depth_rows(
    costs: dict[int, dict[int, tuple[float, float, int]]], min_steps: int = 3
) -> list[tuple[int, int, float, float, float, int]]:
    """(batch size, depth, ms/step, tokens/request/step, tokens/s, steps) of
    every batch size seen at least ``min_steps`` times at a depth, by batch
    size then depth (depth 0: the plain step)."""
    rows = []
    for depth, by_bs in costs.items():
        for bs, (secs, per_req, n) in by_bs.items():
            if n >= min_steps and secs > 0:
                rows.append((bs, depth, secs * 1e3, per_req, bs * per_req / secs, n))
    return sorted(rows)


def run_depths(args, gated, env, out, prompts, levels, never_log, reference) -> int:
    """Section 5 (see the module doc); the number of depths whose outputs at
    C=1 differ from ``reference``'s, the server without speculation's."""
    depths = [int(d) for d in args.depths.split(",") if d.strip()]
    adaptive = "--speculative-adaptive" in sglang_options()
    print(
        "\n== 5. per-depth step cost: policy always at each depth, depth 0 = the "
        + (
            "plain step (policy never), one --gate-depths server"
            if adaptive
            else "plain step (section 3's never server), one server per depth"
        )
    )
    outputs: dict[int, list[list[int]]] = {}  # each depth's C=1 outputs
    if adaptive:
        costs, builds, sglang_built = time_depths_on_one_server(
            args, gated, env, out, prompts, levels, depths, outputs
        )
    else:  # (depth 0's outputs: section 3 compared them)
        costs = {0: step_costs(timed_outcomes(never_log))}
        for depth in depths:
            log_dir = out / f"decisions-depth-{depth}"
            extra = ["--gate-decision-log", str(log_dir)]
            cmd = gated(free_port(), "always", "eager", extra, steps=depth)
            with server(
                cmd, env, out / f"depth-{depth}.log", args.startup_timeout
            ) as b:
                for c in levels:
                    _, outs = throughput(b, c, args.max_new_tokens, prompts)
                    if c == 1:
                        outputs[depth] = outs
            costs[depth] = step_costs(timed_outcomes(log_dir))
    print(f"{'bs':>5} {'depth':>6} {'ms/step':>9} {'tok/req':>8} {'tok/s':>9} "
          f"{'steps':>6}")  # fmt: skip
    best: dict[int, tuple[float, int]] = {}
    for bs, depth, ms, per_req, tps, n in depth_rows(costs):
        print(f"{bs:>5} {depth:>6} {ms:>9.2f} {per_req:>8.2f} {tps:>9.1f} {n:>6}")
        if tps > best.get(bs, (0.0, 0))[0]:
            best[bs] = (tps, depth)
    print("best depth per batch size:", ", ".join(
        f"bs {bs}: {d}" for bs, (_, d) in sorted(best.items())) or "-")  # fmt: skip
    same = {
        d: count_same(o, [reference[i % len(prompts)] for i in range(len(o))])
        for d, o in outputs.items()
    }
    print("outputs at C=1 against the server without speculation:", ", ".join(
        f"depth {d} {same[d]}/{len(outputs[d])}" for d in sorted(outputs)
    ) or "not compared (no C=1 level)")  # fmt: skip
    differ = sum(same[d] != len(outputs[d]) for d in outputs)
    print("\n== 5b. what each depth's runtime state cost to build: the gate's "
          "measurement (status) beside SGLang's log line")  # fmt: skip
    if not adaptive:
        print(
            "skipped: this SGLang has no --speculative-adaptive (one depth per server)"
        )
        return differ
    line = "{:>6} {:>8} {:>7} {:>9} {:>7} {:>7} {:>9} {:>9} {:>10}"
    print(line.format("depth", "built", "gate s", "gate MiB", "verify", "draft",
                      "graph bs", "SGLang s", "SGLang GB"))  # fmt: skip
    for row in build_rows(builds, sglang_built):
        print(line.format(*row))
    return differ


def time_depths_on_one_server(args, gated, env, out, prompts, levels, depths, outputs):
    """Section 5 on an SGLang with adaptive runtime states: one gated server
    with ``--gate-depths``, policy ``always`` pinned to each of its depths in
    turn at runtime (``depth=d``), then ``never``; each step's depth comes from
    its decision-log record, so a change that lands mid-request splits
    exactly. Returns (costs by depth, the status's ``depths.per_depth``,
    SGLang's logged build costs); ``outputs`` gets each depth's C=1 outputs."""
    log_dir = out / "decisions-depths"
    extra = ["--gate-depths", ",".join(map(str, depths)),
             "--gate-decision-log", str(log_dir)]  # fmt: skip
    cmd = gated(free_port(), "always", "eager", extra)
    log = out / "depths.log"
    with server(cmd, env, log, args.startup_timeout) as b:
        record = gate_status(b)[0]
        served = [int(d) for d in record["depths"]["set"]]

        def traffic():  # one request: a change waits for decode steps only
            greedy_outputs(b, args.max_new_tokens, prompts[:1])

        for depth in [*served, 0]:
            if depth:
                set_policy(b, "always", {"depth": depth}, traffic)
            else:
                set_policy(b, "never", {}, traffic)
            for c in levels:
                _, outs = throughput(b, c, args.max_new_tokens, prompts)
                if c == 1:
                    outputs[depth] = outs
        time.sleep(1.5)  # the status record is rewritten about once a second
        builds = gate_status(b)[0]["depths"]["per_depth"]
    timed = timed_outcomes(log_dir)  # read once, cut by depth
    costs = {d: step_costs(timed, d) for d in [0, *served]}
    return costs, builds, adaptive_state_costs(log.read_text(errors="replace"))


def build_rows(builds: dict, sglang_built: dict[int, tuple[float, float]]) -> list:
    """One row per SPEC depth of the status's ``depths.per_depth``: depth,
    how it was built (``startup``: the configured state; ``adaptive``: one
    SGLang built for the gate), the gate's capture seconds and MiB (device
    memory lost in all; of it the verify and draft graphs; ``-`` where not
    measured: memory only on CUDA), the verify-graph batch sizes, and
    SGLang's own logged seconds and GB for the same state."""

    def num(x, fmt):
        return "-" if x is None else format(x, fmt)

    rows = []
    for key in sorted(builds, key=int):
        depth, entry = int(key), builds[key]
        if depth == 0:
            continue
        sizes = entry.get("verify_graph_bs") or []
        secs, gb = sglang_built.get(depth, (None, None))
        rows.append((
            depth, entry.get("built", "-"), num(entry.get("capture_s"), ".2f"),
            num(entry.get("mib_total"), ".0f"),
            num(entry.get("mib_verify_graphs"), ".0f"),
            num(entry.get("mib_draft_graphs"), ".0f"),
            f"{sizes[0]}..{sizes[-1]}" if sizes else "-",
            num(secs, ".2f"), num(gb, ".2f"),
        ))  # fmt: skip
    return rows


def set_policy(
    base: str,
    policy: str,
    settings: dict,
    traffic: Callable[[], object],
    timeout: float = 900,
) -> None:
    """A runtime policy change (``POST /eagle_gate/policy``; the
    ``EAGLE_GATE_API_KEY`` environment variable is sent where set), waited
    for: a gating scheduler applies a change at its next decode step that is a
    multiple of ``EAGLE_GATE_CONTROL_EVERY`` (64), so ``traffic()`` is sent
    until every status record's ``config_version`` has it. The steps before
    it ran the old setting, and their decision-log records say so."""
    key = os.environ.get("EAGLE_GATE_API_KEY")
    reply = post(
        base + "/eagle_gate/policy",
        {"policy": policy, "settings": settings},
        timeout=30,
        headers={"Authorization": "Bearer " + key} if key else None,
    )
    if not reply.get("accepted"):
        raise RuntimeError(f"policy change not accepted: {reply}")
    version = int(reply["version"])
    deadline = time.monotonic() + timeout
    while True:
        time.sleep(1.5)  # status records are rewritten about once a second
        if all(rec.get("config_version", -1) >= version for rec in gate_status(base)):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"policy change {version} not applied in {timeout} s")
        traffic()


def gate_status(base: str) -> list[dict]:
    """The gate's per-scheduler status records (``GET /eagle_gate/status``)."""
    with urllib.request.urlopen(base + "/eagle_gate/status", timeout=30) as r:
        return json.loads(r.read())["schedulers"]


def plain_graph_rows(base: str) -> list[tuple]:
    """(rank, state, reason, sizes, MiB, capture s) of every scheduler."""
    rows = []
    for record in gate_status(base):
        graphs = record.get("plain_graphs") or {}
        sizes = graphs.get("capture_bs") or []
        mib, secs = graphs.get("memory_mib"), graphs.get("capture_s")
        rows.append(
            (
                f"{record.get('dp_rank') or 0}/{record.get('tp_rank', 0)}",
                graphs.get("state", "?"),
                graphs.get("reason") or "-",
                f"{len(sizes)} ({sizes[0]}..{sizes[-1]})" if sizes else "-",
                "-" if mib is None else f"{mib:.1f}",
                "-" if secs is None else f"{secs:.1f}",
            )
        )
    return rows


def sum_counts(records: list[dict], key: str) -> dict[str, int] | None:
    """The counter dict ``key`` of the status records summed over the
    TP-rank-0 schedulers (every TP rank runs the same steps; DP ranks add up);
    None when no such record has it (a gate that does not report it)."""
    total, seen = {}, False
    for record in records:
        counts = record.get(key)
        if record.get("tp_rank", 0) != 0 or not isinstance(counts, dict):
            continue
        seen = True
        for name, n in counts.items():
            total[name] = total.get(name, 0) + int(n)
    return total if seen else None


def status_counts(base: str, *keys: str) -> dict[str, dict[str, int] | None]:
    """``sum_counts`` of each of ``keys`` from the gate's status now."""
    time.sleep(1.5)  # status records are rewritten about once a second
    records = gate_status(base)
    return {key: sum_counts(records, key) for key in keys}


def plain_paths(base: str) -> dict[str, int]:
    """Plain steps by target path (graph, eager) since start."""
    counts = status_counts(base, "plain_path")["plain_path"] or {}
    return {"graph": counts.get("graph", 0), "eager": counts.get("eager", 0)}


def fmt_paths(counts: dict[str, int] | None) -> str:
    """``graph/eager`` of a path counter; ``n/a`` without one."""
    if counts is None:
        return "n/a"
    return f"{counts.get('graph', 0)}/{counts.get('eager', 0)}"


def fmt_reasons(reasons: dict[str, int] | None) -> str:
    """The eager reasons that occurred, ``bs_above_max 12, graphs_off 3``."""
    if reasons is None:
        return "n/a"
    return ", ".join(f"{r} {n}" for r, n in reasons.items() if n) or "-"


def fallback_result(
    same: int,
    total: int,
    paths: dict[str, int] | None,
    reasons: dict[str, int] | None,
) -> str:
    """Section 4d's RESULT line (without ``RESULT: ``)."""
    verdict = "identical" if same == total else f"OUTPUTS DIFFER ({same}/{total})"
    others = dict(reasons or {})
    eager = [f"{others.pop('bs_above_max', 0)} eager (bs_above_max)"]
    eager += [f"{n} eager ({r})" for r, n in others.items() if n]
    graph = (paths or {}).get("graph", 0)
    return (
        f"fallback above --cuda-graph-max-bs: {verdict}, {', '.join(eager)}, "
        f"{graph} graph"
    )


def pick_max_bs_flag(options: list[str]) -> str | None:
    """SGLang's flag for the largest decode CUDA graph batch size among its
    options: ``--cuda-graph-max-bs`` (0.5.9), ``--cuda-graph-max-bs-decode``
    (0.5.23, which refuses the former as ambiguous)."""
    for flag in ("--cuda-graph-max-bs", "--cuda-graph-max-bs-decode"):
        if flag in options:
            return flag
    return None


def sglang_options() -> list[str]:
    """Every command-line option of this Python's SGLang (the one the servers
    run)."""
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return [o for a in parser._actions for o in a.option_strings]


def graph_max_bs_flag() -> str | None:
    """``pick_max_bs_flag`` over this SGLang's options."""
    return pick_max_bs_flag(sglang_options())


if __name__ == "__main__":
    sys.exit(main())
