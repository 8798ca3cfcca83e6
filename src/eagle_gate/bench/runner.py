"""Run ``sglang.bench_serving`` against several servers over a concurrency grid.

For every server (``NAME=URL``) and every concurrency ``C`` this runs SGLang's
own benchmark client as a subprocess::

    python -m sglang.bench_serving --backend sglang --base-url URL \\
        --max-concurrency C --num-prompts N --output-file RAW.jsonl \\
        --dataset-name ... [--random-input-len ... --random-output-len ...]

(``N`` defaults to ``max(4*C, 32)``; with ``--request-rate`` left at infinity
this is a closed loop of ``C`` clients), and collects from its JSONL result the
output token throughput, mean/median TPOT, mean TTFT and the acceptance length
(bench_serving reads it from the server's ``internal_states``; when it did not,
it is read from ``/server_info`` or ``/get_server_info`` after the run). A run
that fails (server unreachable, non-zero exit, timeout, no result line) becomes
a blank cell with its error; the grid goes on.

Outputs under ``--out``: ``results.json`` (rewritten after every run, so an
interrupted grid keeps what finished), ``raw/NAME-cC.jsonl`` (bench_serving's
own result), ``logs/NAME-cC.log`` (its console output), ``table.md`` and, when
matplotlib is importable, ``throughput.png``.

Acceptance length is what SGLang reports: in 0.5.9 the average since the
server started (so it includes earlier levels and warm-up requests), in 0.5.23
the average since it was last read. For a gated server started with a status
directory, ``--gate-status NAME=DIR`` adds the share of SPEC steps per level
(difference of the gate's step counters before and after the run).

This module runs the subprocesses and writes the result files; the options
and result records are in :mod:`eagle_gate.bench.options`, the HTTP probes
and gate counters in :mod:`eagle_gate.bench.probe`, the markdown tables and
the plot in :mod:`eagle_gate.bench.report` (all re-exported here).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from eagle_gate.bench.options import (
    BenchOptions,
    RunResult,
    ServerSpec,
    parse_concurrency,
    parse_server,
)
from eagle_gate.bench.probe import (
    accept_length_of,
    fetch_server_info,
    gate_counters,
    server_reachable,
    summarize_server_info,
)
from eagle_gate.bench.report import fmt_cell, format_table, write_plot

__all__ = [
    "BenchOptions",
    "RunResult",
    "ServerSpec",
    "fetch_server_info",
    "format_table",
    "load_results",
    "parse_concurrency",
    "parse_server",
    "run_grid",
    "summarize_server_info",
    "write_plot",
]

RESULTS_FORMAT = 1


# ---------------------------------------------------------------------------
# One run
# ---------------------------------------------------------------------------


def _tail_reason(log_file: Path, n_lines: int = 3) -> str:
    try:
        lines = log_file.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    lines = [ln.strip() for ln in lines if ln.strip()]
    return " | ".join(lines[-n_lines:])[-600:]


def _read_result(raw_file: Path) -> dict[str, Any] | None:
    try:
        lines = raw_file.read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        line = line.strip()
        if not line:
            continue
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if isinstance(data, dict):
            return data
    return None


def _num(d: Mapping[str, Any], key: str) -> float | None:
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    v = float(v)
    return v if v == v else None  # NaN -> None


def run_one(
    server: ServerSpec,
    concurrency: int,
    opts: BenchOptions,
    out_dir: Path,
    *,
    env: Mapping[str, str] | None = None,
    gate_status_dir: str | None = None,
) -> RunResult:
    """Run bench_serving once; never raises for a failed run."""
    stem = f"{server.name}-c{concurrency}"
    raw = out_dir / "raw" / f"{stem}.jsonl"
    log = out_dir / "logs" / f"{stem}.log"
    raw.parent.mkdir(parents=True, exist_ok=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        raw.unlink()  # bench_serving appends
    cmd = opts.command(server.url, concurrency, raw)
    res = RunResult(
        server=server.name,
        concurrency=concurrency,
        num_prompts=opts.prompts_for(concurrency),
        command=shlex.join(cmd),
        raw_file=str(raw),
        log_file=str(log),
    )
    before = gate_counters(gate_status_dir) if gate_status_dir else None
    t0 = time.monotonic()
    try:
        with open(log, "wb") as fh:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=fh,
                stderr=subprocess.STDOUT,
                env=dict(env) if env is not None else None,
                start_new_session=True,
            )
            try:
                rc = proc.wait(timeout=opts.timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                res.wall_s = time.monotonic() - t0
                res.error = f"bench_serving timed out after {opts.timeout_s:.0f}s"
                return res
    except OSError as e:
        res.error = f"cannot start bench_serving: {e}"
        return res
    res.wall_s = time.monotonic() - t0
    data = _read_result(raw)
    if rc != 0:
        res.error = f"bench_serving exited with code {rc}: {_tail_reason(log)}"
        return res
    if data is None or _num(data, "output_throughput") is None:
        res.error = f"bench_serving wrote no result: {_tail_reason(log)}"
        return res
    res.output_tok_s = _num(data, "output_throughput")
    res.mean_tpot_ms = _num(data, "mean_tpot_ms")
    res.median_tpot_ms = _num(data, "median_tpot_ms")
    res.mean_ttft_ms = _num(data, "mean_ttft_ms")
    res.mean_e2e_ms = _num(data, "mean_e2e_latency_ms")
    res.request_throughput = _num(data, "request_throughput")
    res.duration_s = _num(data, "duration")
    for key in ("completed", "total_input_tokens", "total_output_tokens"):
        v = _num(data, key)
        setattr(res, key, None if v is None else int(v))
    acc = _num(data, "accept_length")
    if acc is None or acc <= 0:
        acc = accept_length_of(fetch_server_info(server.url))
    res.accept_length = acc
    if not res.completed:
        res.error = "no request completed"
        return res
    if res.completed < res.num_prompts:
        res.warning = f"only {res.completed}/{res.num_prompts} requests completed"
    if gate_status_dir:
        after = gate_counters(gate_status_dir)
        if before is not None and after is not None:
            ds = after["spec"] - before["spec"]
            dp = after["plain"] - before["plain"]
            res.gate_steps = {"spec": ds, "plain": dp}
            res.spec_share = ds / (ds + dp) if ds + dp > 0 else None
    res.ok = True
    return res


# ---------------------------------------------------------------------------
# The grid
# ---------------------------------------------------------------------------


def run_grid(
    servers: Sequence[ServerSpec],
    concurrencies: Sequence[int],
    opts: BenchOptions,
    out_dir: str | os.PathLike[str],
    *,
    gate_status: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Benchmark every server at every concurrency; return the results document.

    The document is also written to ``OUT/results.json`` after every run.
    """
    names = [s.name for s in servers]
    if len(set(names)) != len(names):
        raise ValueError(f"server names must differ: {names}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    gate_status = dict(gate_status or {})
    doc: dict[str, Any] = {
        "tool": "eagle_gate.bench",
        "format": RESULTS_FORMAT,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "options": opts.to_json(),
        "description": opts.describe(),
        "concurrency": list(concurrencies),
        "servers": [],
        "runs": [],
    }
    path = out / "results.json"

    def save() -> None:
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(doc, indent=1, sort_keys=False) + "\n")
        os.replace(tmp, path)

    for server in servers:
        entry: dict[str, Any] = {"name": server.name, "url": server.url}
        why = server_reachable(server.url)
        entry["error"] = why
        info = None if why else fetch_server_info(server.url)
        entry["info"] = summarize_server_info(info)
        doc["servers"].append(entry)
        for c in concurrencies:
            if why:
                res = RunResult(
                    server=server.name,
                    concurrency=c,
                    num_prompts=opts.prompts_for(c),
                    error=why,
                )
            else:
                log(f"[eagle_gate.bench] {server.name} C={c} ...")
                res = run_one(
                    server,
                    c,
                    opts,
                    out,
                    env=env,
                    gate_status_dir=gate_status.get(server.name),
                )
                if res.ok:
                    log(
                        f"[eagle_gate.bench] {server.name} C={c}: "
                        f"{res.output_tok_s:.1f} tok/s, TPOT "
                        f"{fmt_cell(res.mean_tpot_ms, '.2f')} ms ({res.wall_s:.0f}s)"
                    )
                else:
                    log(f"[eagle_gate.bench] {server.name} C={c} FAILED: {res.error}")
            doc["runs"].append(dataclasses.asdict(res))
            save()
    save()
    return doc


def load_results(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a ``results.json`` (the file or the directory holding it)."""
    p = Path(path)
    if p.is_dir():
        p = p / "results.json"
    doc = json.loads(p.read_text())
    if not isinstance(doc, dict) or doc.get("tool") != "eagle_gate.bench":
        raise ValueError(f"{p}: not an eagle_gate.bench results file")
    return doc
