"""Is a simulator row's shortfall the policy, or the row's noise? Re-run rows
over several seeds.

    python examples/sim_seeds.py [--seeds 5] [--profile NAME ...] [--workload W ...]
        [--quick] [--below 0.995]

One ``python -m eagle_gate.sim`` table runs each row once (seed 0), so a row's
ratio carries that scenario's noise: which requests finish inside the window,
where the prefills fall, the acceptance draws. Long-context rows swing about
+-1% from seed to seed, close-call rows about +-0.3%. This script runs
``always``, ``never``, ``goodput`` and the expected-acceptance oracle
(``oracle-mean``) on every row with ``--seeds`` different seeds (common random
numbers across the policies within a seed) and prints, per row, the mean and
the smallest ratio over the seeds of goodput to the better fixed mode
(``gp/best(a,n)``) and to ``oracle-mean``, with the standard error of the
mean. Rows whose mean is below ``--below`` are listed at the end.

``--suite`` runs instead the policy suite
(:func:`eagle_gate.sim.workloads.policy_suite`: acceptance drift, close calls
at batch 1/4/8, batch jitter, a load ramp through a crossover; outcomes 1-2
steps late) and prints one markdown row per suite row: goodput's mean and
worst seed against ``oracle-mean``, its mean against the better fixed mode,
its switches (mean per run) and the share of the time it spent away from its
chosen mode (probes). ``--seed-start`` picks other seeds (hold-outs);
``--policy FILE:CLASS`` runs another policy class in place of goodput (the
old one, for a before/after table).
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

from eagle_gate.goodput import Goodput
from eagle_gate.policies import AlwaysSpec, NeverSpec
from eagle_gate.sim.baselines import OracleMean
from eagle_gate.sim.engine import Simulator
from eagle_gate.sim.profiles import BUILTIN_PROFILES, get_profile
from eagle_gate.sim.workloads import (
    close_scenarios,
    grid_scenarios,
    mix_scenarios,
    policy_suite,
    ramp_scenario,
)

#: seeds far enough apart that no two rows' scenario seeds coincide (the
#: workloads add up to ~5000 to their seed)
SEED_STRIDE = 10007


def rows(profile, workload: str, quick: bool, seed: int) -> list:
    if workload == "grid":
        return [(f"C={c}", sc) for c, sc in grid_scenarios(profile, quick, seed)]
    if workload == "mix":
        return [(f"C={c}", sc) for c, sc in mix_scenarios(profile, quick, seed)]
    if workload == "ramp":
        return [("ramp", ramp_scenario(profile, quick, seed))]
    if workload == "close":
        return close_scenarios(profile, quick, seed)
    raise SystemExit(f"unknown workload {workload!r}; allowed: grid, mix, ramp, close")


def ratios(profile, scenario) -> tuple[float, float]:
    """(goodput / better of always and never, goodput / oracle-mean)."""
    tok = {}
    for name, make in (
        ("always", AlwaysSpec),
        ("never", NeverSpec),
        ("goodput", Goodput),
        ("oracle-mean", OracleMean),
    ):
        tok[name] = Simulator(profile, scenario).run(make()).tok_s
    best = max(tok["always"], tok["never"])
    return tok["goodput"] / best, tok["goodput"] / tok["oracle-mean"]


def summary(xs: list[float]) -> str:
    se = statistics.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else 0.0
    return f"{statistics.mean(xs):.4f} +-{se:.4f}  min {min(xs):.4f}"


def load_policy(spec: str):
    """``FILE:CLASS`` -> the class (a policy factory)."""
    import importlib.util

    path, _, cls = spec.rpartition(":")
    mod_spec = importlib.util.spec_from_file_location("_policy_under_test", path)
    module = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(module)
    return getattr(module, cls)


def suite(make, seeds: range, quick: bool) -> list[dict]:
    """Run the policy suite; one dict of figures per row."""
    out = []
    for name, prof, scenario in policy_suite(quick):
        om, best, sw, expl = [], [], [], []
        for seed in seeds:
            sc = scenario(seed * SEED_STRIDE)
            tok = {}
            for key, factory in (
                ("always", AlwaysSpec),
                ("never", NeverSpec),
                ("oracle-mean", OracleMean),
            ):
                tok[key] = Simulator(prof, sc).run(factory()).tok_s
            res = Simulator(prof, sc).run(make())
            om.append(res.tok_s / tok["oracle-mean"])
            best.append(res.tok_s / max(tok["always"], tok["never"]))
            sw.append(res.switches or 0)
            expl.append((res.explored_s or 0.0) / res.clock_s)
        out.append(
            {
                "row": name,
                "om_mean": statistics.mean(om),
                "om_worst": min(om),
                "best_mean": statistics.mean(best),
                "switches": statistics.mean(sw),
                "explored": statistics.mean(expl),
                "om": om,
            }
        )
    return out


def print_suite(rows: list[dict], seeds: range) -> None:
    print(
        f"policy suite, seeds {seeds.start}..{seeds.stop - 1}: goodput / "
        "oracle-mean (mean, worst seed), / better fixed mode, switches per "
        "run, explored time share"
    )
    print()
    print(
        "| row | mean/oracle-mean | worst seed | mean/best fixed | switches "
        "| explored time |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        flag = "" if r["om_mean"] >= 0.98 and r["om_worst"] >= 0.95 else " (miss)"
        print(
            f"| {r['row']}{flag} | {r['om_mean']:.4f} | {r['om_worst']:.4f} | "
            f"{r['best_mean']:.4f} | {r['switches']:.1f} | {r['explored']:.2%} |"
        )
    print()
    print(
        f"mean over rows: {statistics.mean(r['om_mean'] for r in rows):.4f} x "
        f"oracle-mean, {statistics.mean(r['best_mean'] for r in rows):.4f} x the "
        "better fixed mode"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--profile", action="append", choices=sorted(BUILTIN_PROFILES))
    ap.add_argument("--workload", action="append")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--below", type=float, default=0.995)
    ap.add_argument(
        "--suite", action="store_true", help="the policy suite (docs/goodput.md)"
    )
    ap.add_argument("--seed-start", type=int, default=0)
    ap.add_argument("--policy", help="FILE:CLASS to run instead of goodput")
    args = ap.parse_args()
    if args.suite:
        t0 = time.perf_counter()
        make = load_policy(args.policy) if args.policy else Goodput
        seeds = range(args.seed_start, args.seed_start + args.seeds)
        print_suite(suite(make, seeds, args.quick), seeds)
        print(f"({time.perf_counter() - t0:.0f} s)")
        return
    t0 = time.perf_counter()
    low = []
    print(f"goodput over {args.seeds} seeds: mean +-standard error, smallest")
    print(
        f"{'profile':<15} {'workload':<8} {'row':<9} {'gp/best(a,n)':<32} "
        "gp/oracle-mean"
    )
    for name in args.profile or sorted(BUILTIN_PROFILES):
        prof = get_profile(name)
        default = ["close"] if name.startswith("close-") else ["grid", "ramp", "mix"]
        for wl in args.workload or default:
            per_row: dict[str, tuple[list[float], list[float]]] = {}
            for k in range(args.seeds):
                for label, sc in rows(prof, wl, args.quick, k * SEED_STRIDE):
                    best, om = ratios(prof, sc)
                    b, o = per_row.setdefault(label, ([], []))
                    b.append(best)
                    o.append(om)
            for label, (b, o) in per_row.items():
                print(f"{name:<15} {wl:<8} {label:<9} {summary(b):<32} {summary(o)}")
                if statistics.mean(b) < args.below:
                    low.append(f"{name} {wl} {label}: {statistics.mean(b):.4f}")
    print()
    print(f"rows whose mean gp/best(a,n) is below {args.below}: {len(low)}")
    for line in low:
        print("  " + line)
    print(f"({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
