"""Median cost of one ``decide`` + ``observe`` pair for every built-in policy.

    python examples/bench_policy_overhead.py [--steps N] [--stream walk|steady]
                                             [--count-bytecodes]

Each policy sees a synthetic decode stream through the real contract: one
reused StepView, frozen StepOutcome objects built before the timed loop,
outcomes delivered one step late like the server does. ``walk``: batch sizes
jump between 1 and 256 every step (many buckets, most of them young; the worst
case). ``steady``: batch sizes drift within 24-31 (one bucket, the usual
case). Prints the median and 90th percentile in microseconds.

``--count-bytecodes`` prints instead the Python bytecodes the policy's own
code executes per step (its module's functions only; after a warm-up fifth of
the stream). Unlike the timings it does not depend on the machine's load, so
two versions of a policy can be compared on a busy machine; it depends on the
Python version.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from eagle_gate.goodput import Goodput
from eagle_gate.policies import AlwaysSpec, NeverSpec, Threshold
from eagle_gate.policy import Mode, StepOutcome, StepView

POLICIES = {
    "always": AlwaysSpec,
    "never": NeverSpec,
    "threshold": Threshold,
    "goodput": Goodput,
}


def stream(kind: str, steps: int) -> tuple[list[int], list[tuple]]:
    """Batch sizes, and both modes' outcomes for every step."""
    if kind == "walk":
        sizes = [1 + (i * 7919 // 97) % 256 for i in range(steps)]
    else:
        sizes = [24 + (i // 7) % 8 for i in range(steps)]
    outs = []
    for i, b in enumerate(sizes):
        spec = StepOutcome(Mode.SPEC, b, 2 * b, (2,) * 4, 0.01 + b * 1e-4, i)
        # eager draft sync: PLAIN outcomes carry the draft's matches (all:
        # SPEC accepts the first draft token of every request, too)
        plain = StepOutcome(Mode.PLAIN, b, b, (1,) * 4, 0.008 + b * 5e-5, i, b)
        outs.append((spec, plain))
    return sizes, outs


def bench(make, steps: int, kind: str = "walk") -> tuple[float, float]:
    policy = make()
    view = StepView(num_draft_tokens=4)
    sizes, outs = stream(kind, steps)
    clock = time.perf_counter_ns
    samples = []
    pending = None
    for i, b in enumerate(sizes):
        t0 = clock()
        view.update(batch_size=b, step=i, seq_len_sum=b * 1500)
        mode = policy.decide(view)
        if pending is not None:
            policy.observe(pending)
        t1 = clock()
        samples.append(t1 - t0)
        pending = outs[i][0 if mode == Mode.SPEC else 1]
    samples.sort()
    return statistics.median(samples) / 1e3, samples[int(0.9 * len(samples))] / 1e3


def count_bytecodes(make, steps: int, kind: str = "walk") -> float:
    """Bytecodes executed per step in the policy class's own modules (its
    module and those beside it that share its name: ``goodput.py`` with
    ``goodput_estimates.py`` and ``goodput_report.py``)."""
    policy = make()
    view = StepView(num_draft_tokens=4)
    sizes, outs = stream(kind, steps)
    module_file = sys.modules[type(policy).__module__].__file__
    stem = module_file[: -len(".py")]
    count = 0

    def count_op(frame, event, arg):
        nonlocal count
        if event == "opcode":
            count += 1
        return count_op

    def enter(frame, event, arg):
        if not frame.f_code.co_filename.startswith(stem):
            return None
        frame.f_trace_opcodes = True
        frame.f_trace_lines = False
        return count_op

    warm = steps // 5
    pending = None
    try:
        for i, b in enumerate(sizes):
            if i == warm:
                sys.settrace(enter)
            view.update(batch_size=b, step=i, seq_len_sum=b * 1500)
            mode = policy.decide(view)
            if pending is not None:
                policy.observe(pending)
            pending = outs[i][0 if mode == Mode.SPEC else 1]
    finally:
        sys.settrace(None)
    return count / (steps - warm)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=200_000)
    ap.add_argument("--stream", choices=("walk", "steady"), default="walk")
    ap.add_argument(
        "--count-bytecodes",
        action="store_true",
        help="count the bytecodes each policy executes per step instead of timing",
    )
    args = ap.parse_args()
    if args.count_bytecodes:
        steps = min(args.steps, 20_000)  # tracing is slow; the count is exact
        print(f"{'policy':<10} {'bytecodes/step':>15}  ({args.stream}, {steps} steps)")
        for name, make in POLICIES.items():
            print(f"{name:<10} {count_bytecodes(make, steps, args.stream):>15.1f}")
        return
    head = f"{'policy':<10} {'median us':>10} {'p90 us':>8}"
    print(f"{head}  (decide+observe, {args.stream})")
    for name, make in POLICIES.items():
        med, p90 = bench(make, args.steps, args.stream)
        print(f"{name:<10} {med:>10.2f} {p90:>8.2f}")


if __name__ == "__main__":
    main()
