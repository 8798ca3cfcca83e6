"""What the gate itself adds per decode step, around the policy.

    python examples/bench_gate_overhead.py [--steps N] [--count-bytecodes]

Drives the real worker wrapper and resolver wrapper (the functions eagle_gate
installs on SGLang's ``EAGLEWorkerV2.forward_batch_generation`` and the
spec-v2 resolver) with a policy that answers at once, so what is measured is
the gate's own path: inspecting the batch, ``GateRuntime.decide`` (ring,
counters, tick check), tagging the result, ``GateRuntime.observe`` (outcome
contract, counters, dwell) and the policy call. The stock step and SGLang's
resolver are stand-ins that return at once, and the batch is a plain object
with the fields the wrapper reads, so no SGLang is needed. Half the steps
decide PLAIN (the plain step is a stand-in too) and half SPEC.

``--count-bytecodes`` prints the Python bytecodes executed per step in
eagle_gate's own modules (the policy's module excluded). Unlike timings it
does not depend on the machine's load, so two versions of the gate can be
compared on a busy machine; it depends on the Python version. (Python 3.11:
664.5 per step at commit 45076cf, with the API of then; 632.0 at b8cc5b1,
before the runtime was split into decision flow, guards, facts and status;
644.0 after it, whose median wall time per step was lower all the same:
8.8-8.9 us against 9.0-9.5 us, interleaved runs on one busy machine.)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from types import SimpleNamespace

import eagle_gate
from eagle_gate.adapters.hooks import ACTIVE, make_worker_wrapper, resolver_wrapper
from eagle_gate.adapters.plain.step import PlainStep
from eagle_gate.config import GateConfig
from eagle_gate.policy import Mode
from eagle_gate.runtime import GateRuntime


class Alternate:
    """PLAIN on odd steps, SPEC on even ones; learns nothing."""

    name = "bench-alternate"

    def decide(self, view):
        return Mode.PLAIN if view.step & 1 else Mode.SPEC

    def observe(self, outcome):
        pass


class _Mode:
    def is_extend(self):
        return False

    def is_idle(self):
        return False


def make_batch(bs: int):
    seq = list(range(100, 100 + bs))
    return SimpleNamespace(
        forward_mode=_Mode(),
        is_extend_in_batch=False,
        seq_lens=SimpleNamespace(shape=(bs,)),
        seq_lens_sum=sum(seq),
        seq_lens_cpu=seq,
        reqs=[None] * bs,
    )


def make_gate():
    def plain_run(worker, batch, *args, **kwargs):
        return SimpleNamespace()

    runtime = GateRuntime(
        GateConfig("bench-alternate"),
        Alternate(),
        sglang_version="bench",
        adapter="bench",
        num_draft_tokens=4,
        plain_step=PlainStep(run=plain_run, blocker=lambda batch: None),
    )
    ACTIVE.runtime = runtime
    return runtime


def stock_step(batch, *args, **kwargs):
    return SimpleNamespace()


def resolve(result, batch):
    return result.tokens


def run(steps: int, trace=None) -> list[int]:
    make_gate()
    worker = make_worker_wrapper("batch")
    batches = [make_batch(8), make_batch(9)]
    instance = object()  # the worker / result processor the wrappers see
    spec_tokens = [[1, 2, 3]] * 8
    plain_tokens = [[1]] * 9
    samples = []
    clock = time.perf_counter_ns
    warm = steps // 5
    try:
        for i in range(steps):
            if trace is not None and i == warm:
                sys.settrace(trace)
            batch = batches[i & 1]
            t0 = clock()
            result = worker(stock_step, instance, (batch,), {})
            result.tokens = plain_tokens if i & 1 else spec_tokens
            resolver_wrapper(resolve, instance, (result, batch), {})
            samples.append(clock() - t0)
    finally:
        sys.settrace(None)
        runtime = ACTIVE.runtime
        ACTIVE.runtime = None
    steps_run = sum(runtime.status()["steps"].values())
    if steps_run != steps:  # the benchmark measures the gate's real path only
        raise SystemExit(f"{steps_run} of {steps} steps went through the gate")
    return samples[warm:]


def count_bytecodes(steps: int) -> float:
    root = os.path.dirname(eagle_gate.__file__)
    excluded = {os.path.abspath(__file__)}
    count = 0

    def count_op(frame, event, arg):
        nonlocal count
        if event == "opcode":
            count += 1
        return count_op

    def enter(frame, event, arg):
        name = frame.f_code.co_filename
        if not name.startswith(root) or name in excluded:
            return None
        frame.f_trace_opcodes = True
        frame.f_trace_lines = False
        return count_op

    run(steps, trace=enter)
    return count / (steps - steps // 5)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--count-bytecodes", action="store_true")
    args = ap.parse_args()
    if args.count_bytecodes:
        print(f"gate bytecodes per step: {count_bytecodes(args.steps):.1f}")
        return
    samples = sorted(run(args.steps))
    print(
        f"gate wrapper + decide + resolve + observe per step: median "
        f"{statistics.median(samples) / 1e3:.2f} us, p90 "
        f"{samples[int(0.9 * len(samples))] / 1e3:.2f} us"
    )


if __name__ == "__main__":
    main()
