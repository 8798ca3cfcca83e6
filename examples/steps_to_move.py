"""Steps the ``goodput`` policy takes to move to the better mode after a step
change in load or acceptance, on the seed profile's cost model.

    python examples/steps_to_move.py [--seeds N] [--profile NAME]

Each case runs ``--before`` decode steps in one condition (the policy settles
in the better mode there), then switches the condition at once; the count is
the number of steps after the change until the policy's chosen mode (its
"home", probes aside) is the new better mode and stays so for the next 200
steps. Step times come from the profile (``plain_time`` / ``spec_time``, its
resync and noise), accept lengths are drawn per request (geometric, like the
simulator), outcomes arrive 1-2 steps late (drawn per step, order kept), and
PLAIN outcomes carry ``draft_matches`` (eager draft sync: per request, whether
the first draft token would have been accepted; ``--sync none`` leaves it
None, as lazy and none sync do). The seed profile (8 PCIe GPUs, TP8) runs
PLAIN everywhere at its measured acceptance (alpha 0.6); with alpha 0.85 SPEC
wins at batch 1 (by ~23%), with 0.45 PLAIN does (by ~31%), so the cases are:

* load up: batch 1 -> 30 at alpha 0.85 (SPEC -> PLAIN)
* load down: batch 30 -> 1 at alpha 0.85 (PLAIN -> SPEC)
* acceptance down: alpha 0.85 -> 0.45 at batch 1 (SPEC -> PLAIN)
* acceptance up: alpha 0.45 -> 0.85 at batch 1 (PLAIN -> SPEC)

each from either initial mode (``initial_mode`` spec / plain: the policy
reaches the first condition from there). Prints the median and the largest
count over the seeds; "never" means it did not move within ``--after`` steps.
``--policy FILE:CLASS`` measures another policy class (it must expose its
chosen mode as ``home``).
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
from collections import deque

from eagle_gate.goodput import Goodput
from eagle_gate.policy import Mode, StepOutcome, StepView
from eagle_gate.sim.profiles import get_profile

CASES = (
    ("load up", (1, 0.85), (30, 0.85)),
    ("load down", (30, 0.85), (1, 0.85)),
    ("acceptance down", (1, 0.85), (1, 0.45)),
    ("acceptance up", (1, 0.45), (1, 0.85)),
)
STAY = 200


def better_mode(prof, b: int, alpha: float) -> Mode:
    spec = b * prof.mean_accept(alpha) / prof.spec_time(b, 0)
    return Mode.SPEC if spec > b / prof.plain_time(b, 0) else Mode.PLAIN


def run_case(
    prof,
    before,
    after,
    initial,
    seed,
    n_before,
    n_after,
    make=Goodput,
    eager=True,
) -> int | None:
    rng = random.Random(seed)
    pol = make(initial_mode=initial)
    view = StepView(num_draft_tokens=prof.num_draft_tokens)
    k = prof.num_draft_tokens
    pending: deque = deque()
    last_release = 0
    plain_run = 0
    homes = []
    for i in range(n_before + n_after):
        b, alpha = before if i < n_before else after
        ctx = b * 1500
        view.update(batch_size=b, step=i, seq_len_sum=ctx)
        mode = pol.decide(view)
        while pending and pending[0][0] <= i:
            pol.observe(pending.popleft()[1])
        if i >= n_before:
            homes.append(pol.home)  # the mode it has chosen (probes aside)
        noise = math.exp(rng.gauss(0.0, prof.noise))
        if mode is Mode.SPEC:
            dt = prof.spec_time(b, ctx)
            if plain_run:
                dt += prof.resync_time(b, plain_run)
            plain_run = 0
            lens = []
            la = math.log(alpha)
            for _ in range(b):
                j = int(math.log(1.0 - rng.random()) / la)
                lens.append(min(j + 1, k))
            matches = None
        else:
            dt = prof.plain_time(b, ctx)
            plain_run += 1
            lens = [1] * b
            matches = sum(rng.random() < alpha for _ in range(b)) if eager else None
        release = max(last_release, i + rng.randint(1, 2))
        last_release = release
        out = StepOutcome(mode, b, sum(lens), lens, dt * noise, i, matches)
        pending.append((release, out))
    want = better_mode(prof, *after)
    for t in range(len(homes) - STAY + 1):
        if all(h is want for h in homes[t : t + STAY]):
            return t
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="seed-pcie-tp8")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--seed-start", type=int, default=0, help="first seed")
    ap.add_argument("--before", type=int, default=3000)
    ap.add_argument("--after", type=int, default=6000)
    ap.add_argument("--sync", choices=("eager", "none"), default="eager")
    ap.add_argument("--policy", help="FILE:CLASS to measure instead of goodput")
    args = ap.parse_args()
    make = Goodput
    if args.policy:
        import importlib.util

        path, _, cls = args.policy.rpartition(":")
        spec = importlib.util.spec_from_file_location("_policy_under_test", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        make = getattr(module, cls)
    prof = get_profile(args.profile)
    print(f"profile {prof.name}: steps to the better mode after a step change")
    print(f"(draft sync {args.sync}: PLAIN draft_matches {args.sync == 'eager'})")
    last = args.seed_start + args.seeds - 1
    print(
        f"(median / largest over seeds {args.seed_start}-{last}; stays {STAY} "
        "steps after)"
    )
    print()
    print("| change | better mode | from initial spec | from initial plain |")
    print("|---|---|---:|---:|")
    for name, before, after in CASES:
        cells = []
        for initial in ("spec", "plain"):
            counts = [
                run_case(
                    prof,
                    before,
                    after,
                    initial,
                    s,
                    args.before,
                    args.after,
                    make,
                    args.sync == "eager",
                )
                for s in range(args.seed_start, args.seed_start + args.seeds)
            ]
            if any(c is None for c in counts):
                never = sum(c is None for c in counts)
                done = [c for c in counts if c is not None]
                med = f"{statistics.median(done):.0f}" if done else "-"
                cells.append(f"{med} (never: {never}/{len(counts)})")
            else:
                cells.append(f"{statistics.median(counts):.0f} / {max(counts)}")
        mode_b = better_mode(prof, *before).name
        mode_a = better_mode(prof, *after).name
        desc = f"batch {before[0]}->{after[0]}, alpha {before[1]}->{after[1]}"
        print(f"| {name} ({desc}) | {mode_b} -> {mode_a} | {cells[0]} | {cells[1]} |")


if __name__ == "__main__":
    main()
