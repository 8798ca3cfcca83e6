"""``python -m eagle_gate.bench``: benchmark real servers, capture a profile.

Commands::

    python -m eagle_gate.bench [run] --server baseline=http://127.0.0.1:30000 \\
        --server eagle3=http://127.0.0.1:30001 --server gated=http://127.0.0.1:30002 \\
        --concurrency 1,2,5,10,30,70,100,250 --out bench_out
    python -m eagle_gate.bench report bench_out          # reprint table, replot
    python -m eagle_gate.bench capture --results bench_out --out my-profile.json
    python -m eagle_gate.bench capture --server plain=URL --server spec=URL \\
        --concurrency 1,4,16,64 --out my-profile.json   # runs the bench first

``run`` is the default command. See :mod:`eagle_gate.bench.runner` and
:mod:`eagle_gate.bench.capture`.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from eagle_gate.bench.capture import (
    CaptureError,
    derive_profile,
    format_report,
    write_profile,
)
from eagle_gate.bench.runner import (
    BenchOptions,
    format_table,
    load_results,
    parse_concurrency,
    parse_server,
    run_grid,
    write_plot,
)

COMMANDS = ("run", "report", "capture")
DEFAULT_CONCURRENCY = "1,2,5,10,30,70,100,250"


def _add_bench_args(ap: argparse.ArgumentParser, *, servers_required: bool) -> None:
    g = ap.add_argument_group("servers and grid")
    g.add_argument(
        "--server",
        action="append",
        default=[],
        required=servers_required,
        metavar="NAME=URL",
        help="a server to benchmark (repeatable; ratios are to the first one)",
    )
    g.add_argument(
        "--concurrency",
        default=DEFAULT_CONCURRENCY,
        help=f"closed-loop concurrency levels (default {DEFAULT_CONCURRENCY})",
    )
    g.add_argument(
        "--num-prompts-per-level",
        type=int,
        default=None,
        metavar="N",
        help="prompts per level (default: max(4*C, 32))",
    )
    g.add_argument(
        "--gate-status",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="status directory of a gated server (adds its share of SPEC steps)",
    )
    d = ap.add_argument_group("passed to sglang.bench_serving")
    d.add_argument(
        "--dataset-name",
        default="random",
        help="random (samples ShareGPT text: needs --dataset-path offline), "
        "random-ids, sharegpt, ... (default random)",
    )
    d.add_argument("--dataset-path", default=None)
    d.add_argument("--random-input-len", type=int, default=1024)
    d.add_argument("--random-output-len", type=int, default=256)
    d.add_argument("--random-range-ratio", type=float, default=None)
    d.add_argument("--sharegpt-output-len", type=int, default=None)
    d.add_argument("--tokenizer", default=None)
    d.add_argument("--seed", type=int, default=1)
    d.add_argument("--warmup-requests", type=int, default=None)
    d.add_argument("--flush-cache", action="store_true")
    d.add_argument(
        "--bench-args",
        default="",
        metavar="'ARGS'",
        help="more bench_serving arguments, one shell-quoted string",
    )
    d.add_argument(
        "--bench-python",
        default=sys.executable,
        help="interpreter with sglang installed (default: this one)",
    )
    d.add_argument(
        "--bench-module",
        default="sglang.bench_serving",
        help="benchmark module (default sglang.bench_serving)",
    )
    d.add_argument(
        "--run-timeout",
        type=float,
        default=3600.0,
        metavar="S",
        help="seconds per bench_serving run before it is killed (default 3600)",
    )


def _options(args: argparse.Namespace) -> BenchOptions:
    return BenchOptions(
        dataset_name=args.dataset_name,
        dataset_path=args.dataset_path,
        random_input_len=args.random_input_len,
        random_output_len=args.random_output_len,
        random_range_ratio=args.random_range_ratio,
        sharegpt_output_len=args.sharegpt_output_len,
        tokenizer=args.tokenizer,
        seed=args.seed,
        num_prompts=args.num_prompts_per_level,
        warmup_requests=args.warmup_requests,
        flush_cache=args.flush_cache,
        extra_args=tuple(shlex.split(args.bench_args)),
        python=args.bench_python,
        module=args.bench_module,
        timeout_s=args.run_timeout,
    )


def _bench(args: argparse.Namespace, out_dir: Path) -> dict:
    servers = [parse_server(s) for s in args.server]
    concs = parse_concurrency(args.concurrency)
    gate = {}
    for item in args.gate_status:
        name, sep, directory = item.partition("=")
        if not sep or not directory:
            raise ValueError(f"--gate-status {item!r}: need NAME=DIR")
        gate[name] = directory
    unknown = sorted(set(gate) - {s.name for s in servers})
    if unknown:
        raise ValueError(f"--gate-status names no --server: {unknown}")
    return run_grid(servers, concs, _options(args), out_dir, gate_status=gate)


def _print_results(doc: dict, out_dir: Path) -> None:
    text = format_table(doc)
    print(text)
    (out_dir / "table.md").write_text(text + "\n")
    plot = write_plot(doc, out_dir)
    print()
    print(f"results: {out_dir / 'results.json'}")
    print(f"plot: {plot}" if plot else "plot: skipped (pip install matplotlib)")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in (*COMMANDS, "-h", "--help"):
        argv.insert(0, "run")
    ap = argparse.ArgumentParser(
        prog="python -m eagle_gate.bench", description=__doc__.split("\n\n")[0]
    )
    sub = ap.add_subparsers(dest="command", required=True)

    run = sub.add_parser(
        "run", help="benchmark servers over a concurrency grid (default command)"
    )
    _add_bench_args(run, servers_required=True)
    run.add_argument("--out", default="eagle_gate_bench_out", help="output directory")

    rep = sub.add_parser("report", help="reprint the table and replot from results")
    rep.add_argument("results", help="results.json or the directory holding it")

    cap = sub.add_parser(
        "capture", help="derive a simulator profile from PLAIN and SPEC measurements"
    )
    cap.add_argument(
        "--results",
        default=None,
        help="results.json (or its directory) of an earlier run; "
        "without it, the servers given with --server are benchmarked first",
    )
    _add_bench_args(cap, servers_required=False)
    cap.add_argument(
        "--bench-out",
        default=None,
        help="where the benchmark writes (default: OUT without suffix + '-bench')",
    )
    cap.add_argument("--plain", default=None, help="server name without speculation")
    cap.add_argument("--spec", default=None, help="server name with speculation")
    cap.add_argument("--name", default=None, help="profile name")
    cap.add_argument("--accept-length", type=float, default=None)
    cap.add_argument("--num-draft-tokens", type=int, default=None)
    cap.add_argument("--calibrate-rounds", type=int, default=6)
    cap.add_argument("--quick", action="store_true", help="shorter calibration runs")
    cap.add_argument("--out", required=True, help="profile file to write (.json)")

    args = ap.parse_args(argv)
    try:
        if args.command == "run":
            out_dir = Path(args.out)
            doc = _bench(args, out_dir)
            _print_results(doc, out_dir)
            return 0 if any(r.get("ok") for r in doc["runs"]) else 1
        if args.command == "report":
            doc = load_results(args.results)
            p = Path(args.results)
            _print_results(doc, p if p.is_dir() else p.parent)
            return 0
        # capture
        if args.results:
            doc = load_results(args.results)
        elif args.server:
            out = Path(args.out)
            bench_out = Path(
                args.bench_out or out.with_suffix("").as_posix() + "-bench"
            )
            doc = _bench(args, bench_out)
            _print_results(doc, bench_out)
            print()
        else:
            ap.error("capture needs --results FILE or --server NAME=URL (twice)")
        profile, report = derive_profile(
            doc,
            plain=args.plain,
            spec=args.spec,
            name=args.name,
            accept_length=args.accept_length,
            num_draft_tokens=args.num_draft_tokens,
            calibrate_rounds=args.calibrate_rounds,
            quick=args.quick,
        )
        path = write_profile(profile, args.out)
        print(format_report(report))
        print()
        print(f"profile: {path}")
        print(f"simulate it: python -m eagle_gate.sim --profile-file {path}")
        return 0
    except (CaptureError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
