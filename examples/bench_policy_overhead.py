"""Median cost of one ``decide`` + ``observe`` pair for every built-in policy.

    python examples/bench_policy_overhead.py [--steps N] [--stream walk|steady]
                                             [--count-bytecodes] [--depths 1,3,5,7]
                                             [--repeat R]

Each policy sees a synthetic decode stream through the real contract: one
reused StepView, frozen StepOutcome objects built before the timed loop,
outcomes delivered one step late like the server does. ``walk``: batch sizes
jump between 1 and 256 every step (many buckets, most of them young; the worst
case). ``steady``: batch sizes drift within 24-31 (one bucket, the usual
case). Prints the median and 90th percentile of ``decide`` + ``observe`` in
microseconds, and the median with the view's refill (``StepView.update``,
the adapter's work before every step, whatever the policy) counted in too.

``goodput-depths`` runs on a server offering ``--depths`` (default 1, 3, 5,
7; the configured depth is 3): its SPEC outcomes say which depth ran and
carry per-position counts (each position accepted by 70% of the requests
that reached it), and a SPEC step costs more per depth. The other policies
see the binary server.

``--repeat R`` runs every policy R times, round-robin (a noisy spell of
the machine hits each policy alike), and prints the lowest of the R medians
with the highest beside it: noise only adds time, so the lowest is the
closest to a quiet machine, and the spread says how noisy it was.

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
from eagle_gate.goodput_depths import GoodputDepths
from eagle_gate.policies import AlwaysSpec, NeverSpec, Threshold
from eagle_gate.policy import Mode, StepOutcome, StepView

POLICIES = {
    "always": AlwaysSpec,
    "never": NeverSpec,
    "threshold": Threshold,
    "goodput": Goodput,
    "goodput-depths": GoodputDepths,
}
#: policies that choose a depth: they see a server offering ``--depths``.
DEPTH_POLICIES = ("goodput-depths",)
#: per-position acceptance of the synthetic stream's SPEC steps.
_ALPHA = 0.7


def stream(kind: str, steps: int) -> list[int]:
    """Batch sizes, one per step."""
    if kind == "walk":
        return [1 + (i * 7919 // 97) % 256 for i in range(steps)]
    return [24 + (i // 7) % 8 for i in range(steps)]


def outcome(mode: Mode, depth: int, b: int, step: int, depths: bool) -> StepOutcome:
    """The outcome of step ``step`` (built outside the timed region)."""
    if mode != Mode.SPEC:
        # eager draft sync: PLAIN outcomes carry the draft's matches
        return StepOutcome(Mode.PLAIN, b, b, (1,) * 4, 0.008 + b * 5e-5, step, b)
    if not depths:
        return StepOutcome(Mode.SPEC, b, 2 * b, (2,) * 4, 0.01 + b * 1e-4, step)
    at_least = tuple(round(b * _ALPHA**j) for j in range(1, depth + 1))
    dt = 0.008 + b * 5e-5 + 0.0015 * depth + b * (depth + 1) * 1e-5
    tokens = b + sum(at_least)
    return StepOutcome(
        Mode.SPEC,
        b,
        tokens,
        (2,) * 4,
        dt,
        step,
        depth=depth,
        accepted_at_least=at_least,
    )


def _view(depths: tuple[int, ...] | None) -> StepView:
    return StepView(num_draft_tokens=4, depths=depths)


def bench(
    make, steps: int, kind: str = "walk", depths=None
) -> tuple[float, float, float]:
    """Median and 90th percentile of decide + observe, and the median with
    the view's refill, in microseconds."""
    policy = make()
    view = _view(depths)
    sizes = stream(kind, steps)
    clock = time.perf_counter_ns
    samples = []
    with_refill = []
    pending = None
    for i, b in enumerate(sizes):
        t0 = clock()
        view.update(batch_size=b, step=i, seq_len_sum=b * 1500)
        t1 = clock()
        mode = policy.decide(view)
        if pending is not None:
            policy.observe(pending)
        t2 = clock()
        samples.append(t2 - t1)
        with_refill.append(t2 - t0)
        pending = outcome(mode, view.depth, b, i, depths is not None)
    samples.sort()
    return (
        statistics.median(samples) / 1e3,
        samples[int(0.9 * len(samples))] / 1e3,
        statistics.median(with_refill) / 1e3,
    )


def count_bytecodes(make, steps: int, kind: str = "walk", depths=None) -> float:
    """Bytecodes executed per step in the policy class's own modules: those
    of its class and the classes it derives from, each with the modules beside
    it that share its name (``goodput.py`` with ``goodput_estimates.py`` and
    ``goodput_report.py``; ``goodput_depths.py`` with all of those)."""
    policy = make()
    view = _view(depths)
    sizes = stream(kind, steps)
    stems = tuple(
        {
            sys.modules[cls.__module__].__file__[: -len(".py")]
            for cls in type(policy).__mro__
            if cls.__module__.startswith("eagle_gate.")
        }
    )
    count = 0

    def count_op(frame, event, arg):
        nonlocal count
        if event == "opcode":
            count += 1
        return count_op

    def enter(frame, event, arg):
        if not frame.f_code.co_filename.startswith(stems):
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
            pending = outcome(mode, view.depth, b, i, depths is not None)
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
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="runs per policy, round-robin; prints the lowest median (and the highest)",
    )
    ap.add_argument(
        "--depths",
        default="1,3,5,7",
        help="the SPEC depths goodput-depths is offered (comma-separated)",
    )
    args = ap.parse_args()
    depths = tuple(sorted(int(d) for d in args.depths.split(",")))

    def offered(name: str):
        return depths if name in DEPTH_POLICIES else None

    if args.count_bytecodes:
        steps = min(args.steps, 20_000)  # tracing is slow; the count is exact
        print(f"{'policy':<14} {'bytecodes/step':>15}  ({args.stream}, {steps} steps)")
        for name, make in POLICIES.items():
            n = count_bytecodes(make, steps, args.stream, offered(name))
            print(f"{name:<14} {n:>15.1f}")
        return
    if args.repeat < 1:
        ap.error(f"--repeat {args.repeat}: expected 1 or more")
    runs: dict[str, list[tuple[float, float, float]]] = {n: [] for n in POLICIES}
    for _ in range(args.repeat):
        for name, make in POLICIES.items():
            runs[name].append(bench(make, args.steps, args.stream, offered(name)))
    head = f"{'policy':<14} {'median us':>10} {'p90 us':>8} {'+refill us':>11}"
    if args.repeat > 1:
        head += f" {'highest median':>15}"
    print(f"{head}  (decide+observe; +refill: with StepView.update, {args.stream})")
    for name, results in runs.items():
        med, p90, refill = min(results)  # (the run with the lowest median)
        line = f"{name:<14} {med:>10.2f} {p90:>8.2f} {refill:>11.2f}"
        if args.repeat > 1:
            line += f" {max(results)[0]:>15.2f}"
        print(line)


if __name__ == "__main__":
    main()
