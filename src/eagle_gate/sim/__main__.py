"""``python -m eagle_gate.sim``: compare gate policies in the step simulator.

Examples::

    python -m eagle_gate.sim                       # all built-in profiles
    python -m eagle_gate.sim --workload close --profile close-plain-3
    python -m eagle_gate.sim --profile seed-pcie-tp8 --workload grid
    python -m eagle_gate.sim --profile-file my.toml --quick
    python -m eagle_gate.sim replay decisions-1234.jsonl --policy threshold

Prints, per profile and workload, output tok/s and mean TPOT of every policy
(always, never, threshold, threshold* = tuned by grid search, sglang-ema,
goodput, oracle = per-step oracle that knows each step's acceptance draws,
oracle-mean = the same knowing only the expected acceptance) with goodput's
ratios to the better of always/never, to threshold* and to both oracles;
writes the tables (and a PNG plot of the grid when matplotlib is installed)
under ``--out``. The close-call profiles (``close-*``) run the ``close``
workload unless ``--workload`` says otherwise.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from eagle_gate.sim.profile_files import load_profile_file
from eagle_gate.sim.profiles import (
    BUILTIN_PROFILES,
    CLOSE_PROFILES,
    get_profile,
)
from eagle_gate.sim.report import format_table, run_profile, write_plot
from eagle_gate.sim.workloads import WORKLOADS

DEFAULT_WORKLOADS = ("grid", "ramp", "mix")
#: what the close-call profiles run by default.
CLOSE_WORKLOADS = ("close",)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["replay"]:
        from eagle_gate.sim.replay import main as replay_main

        return replay_main(argv[1:])
    ap = argparse.ArgumentParser(
        prog="python -m eagle_gate.sim", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument(
        "--profile",
        action="append",
        choices=sorted(BUILTIN_PROFILES),
        help="built-in profile (repeatable; default: all built-ins)",
    )
    ap.add_argument(
        "--profile-file",
        action="append",
        default=[],
        help="user profile, JSON or TOML (see eagle_gate.sim.profiles); repeatable",
    )
    ap.add_argument(
        "--workload",
        action="append",
        choices=WORKLOADS,
        help=f"workload (repeatable; default: {', '.join(DEFAULT_WORKLOADS)}, "
        "and close for the close-* profiles)",
    )
    ap.add_argument(
        "--out", default="eagle_gate_sim_out", help="output directory for tables/plots"
    )
    ap.add_argument("--quick", action="store_true", help="shorter runs")
    ap.add_argument(
        "--no-cpu-seq-lens",
        action="store_true",
        help="policies see no sequence lengths (StepView.seq_len_sum is None), "
        "the strictest case; on SGLang 0.5.23 with FA3/trtllm attention the "
        "adapters pass an estimate instead",
    )
    args = ap.parse_args(argv)

    profiles = [get_profile(n) for n in (args.profile or [])]
    try:
        profiles += [load_profile_file(f) for f in args.profile_file]
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not profiles:
        profiles = list(BUILTIN_PROFILES.values())
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)

    t0 = time.perf_counter()
    plot_note = False
    for prof in profiles:
        if args.workload:
            workloads = list(args.workload)
        elif prof.name in CLOSE_PROFILES:
            workloads = list(CLOSE_WORKLOADS)
        else:
            workloads = list(DEFAULT_WORKLOADS)
        rep = run_profile(
            prof, workloads, quick=args.quick, cpu_seq_lens=not args.no_cpu_seq_lens
        )
        texts = [format_table(rep, wl) for wl in workloads]
        for text in texts:
            print(text)
            print()
        (out_dir / f"{prof.name}.txt").write_text("\n\n".join(texts) + "\n")
        if "grid" in workloads:
            path = write_plot(rep, out_dir)
            if path is None:
                plot_note = True
            else:
                print(f"plot: {path}")
    if plot_note:
        print(
            "note: matplotlib is not installed, no plots "
            "(pip install 'eagle_gate[plot]')"
        )
    print(f"tables written to {out_dir}/ ({time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
