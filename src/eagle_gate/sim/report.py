"""Run the comparison policies over the workloads and format the tables."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eagle_gate.goodput import Goodput
from eagle_gate.goodput_depths import GoodputDepths
from eagle_gate.policies import AlwaysSpec, NeverSpec, Threshold
from eagle_gate.sim.baselines import (
    DepthOracleMean,
    EmaTier,
    Oracle,
    OracleMean,
    tune_threshold,
)
from eagle_gate.sim.engine import Scenario, SimResult, Simulator
from eagle_gate.sim.profiles import Profile
from eagle_gate.sim.workloads import (
    close_scenarios,
    grid_scenarios,
    mix_scenarios,
    open_ramp_scenario,
    ramp_scenario,
)

__all__ = ["ProfileReport", "run_profile", "format_table", "POLICY_ORDER"]

#: column order of the tables
POLICY_ORDER: tuple[str, ...] = (
    "always",
    "never",
    "threshold",
    "threshold*",
    "sglang-ema",
    "goodput",
    "goodput-depths",
    "oracle",
    "oracle-mean",
    "depth-oracle",
)


@dataclass
class ProfileReport:
    """Results of one profile: workload -> list of (row label, {policy: result})."""

    profile: Profile
    tuned: tuple[int, int]
    results: dict[str, list[tuple[str, dict[str, SimResult]]]] = field(
        default_factory=dict
    )


def policy_factories(tuned: tuple[int, int]) -> dict[str, Callable[[], Any]]:
    pa, sb = tuned
    return {
        "always": AlwaysSpec,
        "never": NeverSpec,
        "threshold": Threshold,
        "threshold*": lambda: _named(Threshold(pa, sb), "threshold*"),
        "sglang-ema": EmaTier,
        "goodput": Goodput,
        "goodput-depths": GoodputDepths,
        "oracle": Oracle,
        "oracle-mean": OracleMean,
        "depth-oracle": DepthOracleMean,
    }


def _named(policy: Any, name: str) -> Any:
    policy.name = name
    return policy


def _run_all(
    profile: Profile,
    rows: Sequence[tuple[str, Scenario]],
    factories: dict[str, Callable[[], Any]],
    cpu_seq_lens: bool = True,
) -> list[tuple[str, dict[str, SimResult]]]:
    out = []
    for label, scen in rows:
        res = {}
        for name, make in factories.items():
            r = Simulator(profile, scen, cpu_seq_lens=cpu_seq_lens).run(make())
            r.policy = name
            res[name] = r
        out.append((label, res))
    return out


def tune_threshold_for(profile: Profile, quick: bool = True) -> tuple[int, int]:
    """Grid-search ``threshold`` on the concurrency grid (mean ratio of its
    throughput to the better of always/never over the grid)."""
    scen = grid_scenarios(profile, quick=True)
    best_ref = []
    for _, sc in scen:
        a = Simulator(profile, sc).run(AlwaysSpec()).tok_s
        n = Simulator(profile, sc).run(NeverSpec()).tok_s
        best_ref.append(max(a, n))

    def evaluate(make: Callable[[], Any]) -> float:
        total = 0.0
        for (_, sc), ref in zip(scen, best_ref, strict=True):
            total += math.log(Simulator(profile, sc).run(make()).tok_s / ref)
        return total

    best, _ = tune_threshold(evaluate, lambda pa, sb: Threshold(pa, sb))
    return best


def run_profile(
    profile: Profile,
    workloads: Sequence[str],
    quick: bool = False,
    cpu_seq_lens: bool = True,
) -> ProfileReport:
    """``cpu_seq_lens=False``: the policies see no sequence lengths."""
    tuned = tune_threshold_for(profile, quick=quick)
    rep = ProfileReport(profile=profile, tuned=tuned)
    fac = policy_factories(tuned)
    for wl in workloads:
        if wl == "grid":
            rows = [(f"C={c}", sc) for c, sc in grid_scenarios(profile, quick)]
        elif wl == "ramp":
            rows = [("ramp", ramp_scenario(profile, quick))]
        elif wl == "mix":
            rows = [(f"C={c}", sc) for c, sc in mix_scenarios(profile, quick)]
        elif wl == "open-ramp":
            rows = [("open-ramp", open_ramp_scenario(profile, quick))]
        elif wl == "close":
            rows = close_scenarios(profile, quick)
        else:
            raise ValueError(f"unknown workload {wl!r}")
        rep.results[wl] = _run_all(profile, rows, fac, cpu_seq_lens)
    return rep


def _ratio(a: float, b: float) -> str:
    return f"{a / b:5.3f}" if b > 0 else "  -  "


def format_table(rep: ProfileReport, workload: str) -> str:
    rows = rep.results[workload]
    names = [n for n in POLICY_ORDER if n in rows[0][1]]
    pa, sb = rep.tuned
    head = (
        f"== profile {rep.profile.name} / workload {workload} "
        f"(threshold* = plain_above {pa}, spec_at_or_below {sb}) =="
    )
    lines = [head, "output tok/s"]
    w = max(11, *(len(n) + 1 for n in names))
    hdr = f"{'':>9}" + "".join(f"{n:>{w}}" for n in names)
    hdr += "  gp/best(a,n)  gp/thr*  gp/oracle  gp/or-mean  explored  switches"
    lines.append(hdr)
    for label, res in rows:
        line = f"{label:>9}" + "".join(f"{res[n].tok_s:>{w}.1f}" for n in names)
        gp = res["goodput"].tok_s
        best = max(res["always"].tok_s, res["never"].tok_s)
        share = res["goodput"].explored_share or 0.0
        om = res["oracle-mean"].tok_s if "oracle-mean" in res else 0.0
        line += (
            f"  {_ratio(gp, best):>12}  {_ratio(gp, res['threshold*'].tok_s):>7}"
            f"  {_ratio(gp, res['oracle'].tok_s):>9}  {_ratio(gp, om):>10}"
            f"  {share:8.2%}  {res['goodput'].switches or 0:8d}"
        )
        lines.append(line)
    lines.append("mean TPOT (ms)")
    lines.append(f"{'':>9}" + "".join(f"{n:>{w}}" for n in names))
    for label, res in rows:
        lines.append(
            f"{label:>9}" + "".join(f"{res[n].tpot_s * 1e3:>{w}.2f}" for n in names)
        )
    return "\n".join(lines)


def write_plot(rep: ProfileReport, out_dir: Path) -> str | None:
    """PNG of grid throughput vs concurrency; None if matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    rows = rep.results.get("grid")
    if not rows:
        return None
    xs = [int(label.split("=")[1]) for label, _ in rows]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name in POLICY_ORDER:
        if name in rows[0][1]:
            ax.plot(xs, [res[name].tok_s for _, res in rows], marker="o", label=name)
    ax.set_xscale("log")
    ax.set_xlabel("concurrency (closed loop)")
    ax.set_ylabel("output tok/s")
    ax.set_title(f"eagle_gate sim: {rep.profile.name}")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{rep.profile.name}-grid.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)
