"""Median cost of one ``decide`` + ``observe`` pair for every built-in policy.

    python examples/bench_policy_overhead.py [--steps N]

Each policy sees a synthetic decode stream (batch sizes drifting between 1
and 256, outcomes delivered one step late like the server does) through the
real contract: one reused StepView, frozen StepOutcome objects built before the
timed loop. Prints the median and 90th percentile in microseconds.
"""

from __future__ import annotations

import argparse
import statistics
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


def bench(make, steps: int) -> tuple[float, float]:
    policy = make()
    view = StepView(num_draft_tokens=4)
    # prebuilt inputs: a batch size walk, both modes' outcomes per step
    sizes = [1 + (i * 7919 // 97) % 256 for i in range(steps)]
    outs = []
    for i, b in enumerate(sizes):
        spec = StepOutcome(Mode.SPEC, b, 2 * b, (2,) * 4, 0.01 + b * 1e-4, i)
        plain = StepOutcome(Mode.PLAIN, b, b, (1,) * 4, 0.008 + b * 5e-5, i)
        outs.append((spec, plain))
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=200_000)
    args = ap.parse_args()
    print(f"{'policy':<10} {'median us':>10} {'p90 us':>8}  (decide+observe)")
    for name, make in POLICIES.items():
        med, p90 = bench(make, args.steps)
        print(f"{name:<10} {med:>10.2f} {p90:>8.2f}")


if __name__ == "__main__":
    main()
