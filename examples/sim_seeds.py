"""Is a simulator row's shortfall the policy, or the row's noise? Re-run rows
over several seeds.

    python examples/sim_seeds.py [--seeds 5] [--profile NAME ...] [--workload W ...]
        [--quick] [--below 0.995]
    python examples/sim_seeds.py --suite|--alternating [--seeds N] [--quick]
        [--seed-start 0] [--policy FILE:CLASS]
    python examples/sim_seeds.py --depths [--profile NAME ...] [--workload W ...]
        [--seeds 5] [--seed-start 0] [--quick]

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
chosen mode (probes); then, for draft depths (issue #33), the best fixed
depth of the row's profile (``spec-dN`` over ``Profile.spec_depths()``, the
depth with the best mean), ``sglang-ema`` and the depth-aware oracle
(``depth-oracle``) against ``oracle-mean``, goodput against
``depth-oracle``, and the depth-choosing ``goodput-depths``
(:mod:`eagle_gate.goodput_depths`) against goodput (mean, worst seed) and
``depth-oracle``. ``--seed-start`` picks other seeds (hold-outs);
``--policy FILE:CLASS`` runs another policy class in place of goodput (the
old one, for a before/after table).

``--depths`` runs instead the main job's rows (``python -m eagle_gate.sim``:
the ``close`` workload of the ``close-*`` profiles, ``grid``, ``ramp`` and
``mix`` of the others) for draft depths (issue #33): per row the mean tok/s
over the seeds of ``goodput-depths``, ``sglang-ema``, the best fixed depth
(``spec-dN``, the depth with the best mean), PLAIN, ``depth-oracle`` and
``goodput``, and ``goodput-depths`` against the best of ``sglang-ema``, the
fixed depths and PLAIN (``/max``), against ``depth-oracle`` and against
``goodput`` (means of the per-seed ratios, and the worst seed of the last).

``--alternating`` runs instead the alternating-acceptance rows
(:func:`eagle_gate.sim.workloads.alternating_rows`: every running request's
class flips between alpha 0.88 and 0.5 every 300, 1000 or 3000 steps, at
batch 1, 4, 16 and 128, under eager and lazy draft sync; 3 seeds unless
``--seeds`` says otherwise) and prints one markdown row per (period, batch,
sync): goodput's mean and worst seed against ``oracle-mean``, always-PLAIN
(``never``) and always-SPEC (``always``) against ``oracle-mean`` (what a
policy that never switches gets), switches and explored time share; a row
whose mean is below its target
(:data:`eagle_gate.sim.workloads.ALTERNATING_TARGETS`, by sync) is marked
``(miss)``. ``--seed-start``, ``--quick`` and ``--policy`` apply as for
``--suite``.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

from eagle_gate.goodput import Goodput
from eagle_gate.goodput_depths import GoodputDepths
from eagle_gate.policies import AlwaysSpec, NeverSpec
from eagle_gate.sim.baselines import DepthOracleMean, EmaTier, FixedDepth, OracleMean
from eagle_gate.sim.engine import Simulator
from eagle_gate.sim.profiles import BUILTIN_PROFILES, get_profile
from eagle_gate.sim.workloads import (
    ALTERNATING_TARGETS,
    SuiteRow,
    alternating_rows,
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


def suite(make, seeds: range, rows: list[SuiteRow], depths: bool = False) -> list[dict]:
    """Run ``rows`` (those of :func:`policy_suite` or
    :func:`alternating_rows`) over ``seeds``; one dict of figures per row:
    the policy's ratio to ``oracle-mean`` (mean, worst seed, per seed) and to
    the better fixed mode, the fixed modes' ratios to ``oracle-mean``,
    switches, explored time share, and the rows' draft sync. ``depths``:
    also each fixed depth of the row's profile (``spec-dN``), ``sglang-ema``
    and ``depth-oracle``, as ratios to ``oracle-mean`` (the best fixed depth:
    the one with the best mean), and the policy's ratio to ``depth-oracle``."""
    out = []
    for name, prof, scenario in rows:
        om, best, sw, expl, never_om, always_om = [], [], [], [], [], []
        by_depth: dict[int, list[float]] = {d: [] for d in prof.spec_depths()}
        ema_om, dor_om, pol_dor, gd_pol, gd_dor = [], [], [], [], []
        sync = None
        for seed in seeds:
            sc = scenario(seed * SEED_STRIDE)
            sync = sc.draft_sync
            tok = {}
            for key, factory in (
                ("always", AlwaysSpec),
                ("never", NeverSpec),
                ("oracle-mean", OracleMean),
            ):
                tok[key] = Simulator(prof, sc).run(factory()).tok_s
            res = Simulator(prof, sc).run(make())
            om.append(res.tok_s / tok["oracle-mean"])
            never_om.append(tok["never"] / tok["oracle-mean"])
            always_om.append(tok["always"] / tok["oracle-mean"])
            best.append(res.tok_s / max(tok["always"], tok["never"]))
            sw.append(res.switches or 0)
            expl.append((res.explored_s or 0.0) / res.clock_s)
            if depths:
                for d, xs in by_depth.items():
                    r = Simulator(prof, sc).run(FixedDepth(d))
                    xs.append(r.tok_s / tok["oracle-mean"])
                ema_om.append(
                    Simulator(prof, sc).run(EmaTier()).tok_s / tok["oracle-mean"]
                )
                dor = Simulator(prof, sc).run(DepthOracleMean()).tok_s
                dor_om.append(dor / tok["oracle-mean"])
                pol_dor.append(res.tok_s / dor)
                gd = Simulator(prof, sc).run(GoodputDepths()).tok_s
                gd_pol.append(gd / res.tok_s)
                gd_dor.append(gd / dor)
        out.append(
            {
                "row": name,
                "om_mean": statistics.mean(om),
                "om_worst": min(om),
                "best_mean": statistics.mean(best),
                "switches": statistics.mean(sw),
                "explored": statistics.mean(expl),
                "om": om,
                "never_om": statistics.mean(never_om),
                "always_om": statistics.mean(always_om),
                "sync": sync,
            }
        )
        if depths:
            d_best = max(by_depth, key=lambda d: statistics.mean(by_depth[d]))
            out[-1].update(
                depth_best=d_best,
                depth_best_om=statistics.mean(by_depth[d_best]),
                ema_om=statistics.mean(ema_om),
                dor_om=statistics.mean(dor_om),
                pol_dor=statistics.mean(pol_dor),
                gd_pol=statistics.mean(gd_pol),
                gd_pol_worst=min(gd_pol),
                gd_dor=statistics.mean(gd_dor),
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
        "| explored time | best depth/oracle-mean | sglang-ema/oracle-mean "
        "| depth-oracle/oracle-mean | mean/depth-oracle | goodput-depths/mean "
        "(worst seed) | goodput-depths/depth-oracle |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        flag = "" if r["om_mean"] >= 0.98 and r["om_worst"] >= 0.95 else " (miss)"
        print(
            f"| {r['row']}{flag} | {r['om_mean']:.4f} | {r['om_worst']:.4f} | "
            f"{r['best_mean']:.4f} | {r['switches']:.1f} | {r['explored']:.2%} | "
            f"{r['depth_best_om']:.4f} (d{r['depth_best']}) | {r['ema_om']:.4f} | "
            f"{r['dor_om']:.4f} | {r['pol_dor']:.4f} | {r['gd_pol']:.4f} "
            f"({r['gd_pol_worst']:.4f}) | {r['gd_dor']:.4f} |"
        )
    print()
    print(
        f"mean over rows: {statistics.mean(r['om_mean'] for r in rows):.4f} x "
        f"oracle-mean, {statistics.mean(r['best_mean'] for r in rows):.4f} x the "
        "better fixed mode, "
        f"{statistics.mean(r['pol_dor'] for r in rows):.4f} x depth-oracle; "
        f"goodput-depths {statistics.mean(r['gd_pol'] for r in rows):.4f} x the "
        f"policy, {statistics.mean(r['gd_dor'] for r in rows):.4f} x depth-oracle"
    )


def depth_rows(
    profiles: list[str] | None, workloads: list[str] | None, quick: bool, seeds: range
) -> list[dict]:
    """The main job's rows over ``seeds`` with draft depths: per row, each
    policy's tok/s per seed (``gd`` goodput-depths, ``ema``, ``never``,
    ``dor`` depth-oracle, ``gp`` goodput, ``dN`` fixed depth N)."""
    out: dict[str, dict[str, list[float]]] = {}
    for name in profiles or sorted(BUILTIN_PROFILES):
        prof = get_profile(name)
        default = ["close"] if name.startswith("close-") else ["grid", "ramp", "mix"]
        makers = {
            "gd": GoodputDepths,
            "ema": EmaTier,
            "never": NeverSpec,
            "dor": DepthOracleMean,
            "gp": Goodput,
        }
        for d in prof.spec_depths():
            makers[f"d{d}"] = lambda d=d: FixedDepth(d)
        for wl in workloads or default:
            for k in seeds:
                for label, sc in rows(prof, wl, quick, k * SEED_STRIDE):
                    row = out.setdefault(f"{name} {wl} {label}", {})
                    for key, make in makers.items():
                        tok = Simulator(prof, sc).run(make()).tok_s
                        row.setdefault(key, []).append(tok)
    return [{"row": row, **figs} for row, figs in out.items()]


def print_depths(rows: list[dict], seeds: range) -> None:
    print(
        f"draft depths, seeds {seeds.start}..{seeds.stop - 1}: mean tok/s; "
        "goodput-depths against the best of sglang-ema, the fixed depths and "
        "PLAIN (/max), depth-oracle and goodput (means of per-seed ratios)"
    )
    print()
    print(
        "| row | goodput-depths | sglang-ema | best depth | PLAIN | depth-oracle "
        "| goodput | /max | /depth-oracle | /goodput (worst seed) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        depths = [k for k in r if k[0] == "d" and k[1:].isdigit()]
        best = max(depths, key=lambda k: statistics.mean(r[k]))
        n = len(r["gd"])
        top = [
            max([r["ema"][i], r["never"][i]] + [r[k][i] for k in depths])
            for i in range(n)
        ]
        vs_max = statistics.mean(r["gd"][i] / top[i] for i in range(n))
        vs_dor = statistics.mean(r["gd"][i] / r["dor"][i] for i in range(n))
        vs_gp = [r["gd"][i] / r["gp"][i] for i in range(n)]
        m = {k: statistics.mean(v) for k, v in r.items() if k != "row"}
        print(
            f"| {r['row']} | {m['gd']:,.0f} | {m['ema']:,.0f} | {m[best]:,.0f} "
            f"({best}) | {m['never']:,.0f} | {m['dor']:,.0f} | {m['gp']:,.0f} | "
            f"{vs_max:.3f} | {vs_dor:.3f} | {statistics.mean(vs_gp):.3f} "
            f"({min(vs_gp):.3f}) |"
        )


def print_alternating(rows: list[dict], seeds: range, policy: str) -> None:
    print(
        f"alternating acceptance, seeds {seeds.start}..{seeds.stop - 1}: "
        f"{policy} / oracle-mean (mean, worst seed), always-PLAIN and "
        "always-SPEC / oracle-mean, switches per run, explored time share; "
        "(miss): mean below the target "
        + ", ".join(f"{k} {v}" for k, v in ALTERNATING_TARGETS.items())
    )
    print()
    print(
        "| row | target | mean/oracle-mean | worst seed | PLAIN/oracle-mean "
        "| SPEC/oracle-mean | switches | explored time |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    misses = 0
    for r in rows:
        target = ALTERNATING_TARGETS[r["sync"]]
        miss = r["om_mean"] < target
        misses += miss
        flag = " (miss)" if miss else ""
        print(
            f"| {r['row']}{flag} | {target:.2f} | {r['om_mean']:.4f} | "
            f"{r['om_worst']:.4f} | {r['never_om']:.4f} | {r['always_om']:.4f} | "
            f"{r['switches']:.1f} | {r['explored']:.2%} |"
        )
    print()
    print(
        f"rows below their target: {misses} of {len(rows)}; mean over rows: "
        f"{statistics.mean(r['om_mean'] for r in rows):.4f} x oracle-mean"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--seeds", type=int, help="seeds per row (default 5; 3 with --alternating)"
    )
    ap.add_argument("--profile", action="append", choices=sorted(BUILTIN_PROFILES))
    ap.add_argument("--workload", action="append")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--below", type=float, default=0.995)
    ap.add_argument(
        "--suite", action="store_true", help="the policy suite (docs/goodput.md)"
    )
    ap.add_argument(
        "--alternating",
        action="store_true",
        help="the alternating-acceptance rows (sim.workloads.alternating_rows)",
    )
    ap.add_argument(
        "--depths",
        action="store_true",
        help="the main job's rows with draft depths (goodput-depths, "
        "sglang-ema, fixed depths, PLAIN, depth-oracle, goodput)",
    )
    ap.add_argument("--seed-start", type=int, default=0)
    ap.add_argument("--policy", help="FILE:CLASS to run instead of goodput")
    args = ap.parse_args()
    if args.seeds is None:
        args.seeds = 3 if args.alternating else 5
    if args.suite or args.alternating:
        t0 = time.perf_counter()
        make = load_policy(args.policy) if args.policy else Goodput
        seeds = range(args.seed_start, args.seed_start + args.seeds)
        if args.alternating:
            figures = suite(make, seeds, alternating_rows(args.quick))
            print_alternating(figures, seeds, args.policy or "goodput")
        else:
            figures = suite(make, seeds, policy_suite(args.quick), depths=True)
            print_suite(figures, seeds)
        print(f"({time.perf_counter() - t0:.0f} s)")
        return
    if args.depths:
        t0 = time.perf_counter()
        seeds = range(args.seed_start, args.seed_start + args.seeds)
        print_depths(depth_rows(args.profile, args.workload, args.quick, seeds), seeds)
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
