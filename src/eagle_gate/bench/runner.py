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
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
# Inputs
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ServerSpec:
    """One server to benchmark: a display name and its base URL."""

    name: str
    url: str


def parse_server(text: str) -> ServerSpec:
    """``NAME=URL`` (or a bare URL, named after its port) -> :class:`ServerSpec`."""
    text = text.strip()
    name, sep, url = text.partition("=")
    if not sep or "://" in name:
        url, name = text, ""
    url = url.strip().rstrip("/")
    if not url:
        raise ValueError(f"--server {text!r}: need NAME=URL")
    if "://" not in url:
        url = "http://" + url
    if not name:
        name = url.split("://", 1)[1].replace(":", "-").replace("/", "-")
    if not all(ch.isalnum() or ch in "-_." for ch in name):
        raise ValueError(
            f"--server {text!r}: the name may hold letters, digits, '-', '_', '.'"
        )
    return ServerSpec(name=name.strip(), url=url)


def parse_concurrency(text: str) -> list[int]:
    """``"1,2,5"`` -> ``[1, 2, 5]`` (positive, duplicates dropped, order kept)."""
    out: list[int] = []
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        try:
            c = int(part)
        except ValueError:
            raise ValueError(f"concurrency {part!r} is not an integer") from None
        if c < 1:
            raise ValueError(f"concurrency {c} must be >= 1")
        if c not in out:
            out.append(c)
    if not out:
        raise ValueError("no concurrency given")
    return out


@dataclass(frozen=True)
class BenchOptions:
    """How to run ``sglang.bench_serving`` (the dataset options pass through)."""

    dataset_name: str = "random"
    dataset_path: str | None = None
    random_input_len: int = 1024
    random_output_len: int = 256
    random_range_ratio: float | None = None
    sharegpt_output_len: int | None = None
    tokenizer: str | None = None
    seed: int = 1
    #: prompts per concurrency level; ``None``: ``max(prompts_factor*C, min_prompts)``
    num_prompts: int | None = None
    prompts_factor: int = 4
    min_prompts: int = 32
    warmup_requests: int | None = None
    flush_cache: bool = False
    extra_args: tuple[str, ...] = ()
    python: str = field(default_factory=lambda: sys.executable)
    module: str = "sglang.bench_serving"
    timeout_s: float = 3600.0

    def prompts_for(self, concurrency: int) -> int:
        if self.num_prompts is not None:
            return self.num_prompts
        return max(self.prompts_factor * concurrency, self.min_prompts)

    def command(self, url: str, concurrency: int, output_file: Path) -> list[str]:
        cmd = [
            self.python,
            "-m",
            self.module,
            "--backend",
            "sglang",
            "--base-url",
            url,
            "--max-concurrency",
            str(concurrency),
            "--num-prompts",
            str(self.prompts_for(concurrency)),
            "--output-file",
            str(output_file),
            "--dataset-name",
            self.dataset_name,
            "--seed",
            str(self.seed),
            "--disable-tqdm",
        ]
        if self.dataset_path:
            cmd += ["--dataset-path", self.dataset_path]
        if self.dataset_name.startswith("random"):
            cmd += [
                "--random-input-len",
                str(self.random_input_len),
                "--random-output-len",
                str(self.random_output_len),
            ]
            if self.random_range_ratio is not None:
                cmd += ["--random-range-ratio", str(self.random_range_ratio)]
        if self.sharegpt_output_len is not None:
            cmd += ["--sharegpt-output-len", str(self.sharegpt_output_len)]
        if self.tokenizer:
            cmd += ["--tokenizer", self.tokenizer]
        if self.warmup_requests is not None:
            cmd += ["--warmup-requests", str(self.warmup_requests)]
        if self.flush_cache:
            cmd += ["--flush-cache"]
        return cmd + list(self.extra_args)

    def describe(self) -> str:
        if self.dataset_name.startswith("random"):
            ds = (
                f"{self.dataset_name} {self.random_input_len} in / "
                f"{self.random_output_len} out"
            )
            if self.random_range_ratio is not None:
                ds += f" (range ratio {self.random_range_ratio:g})"
        else:
            ds = self.dataset_name
            if self.sharegpt_output_len is not None:
                ds += f", {self.sharegpt_output_len} out"
        if self.num_prompts is not None:
            n = f"{self.num_prompts} prompts per level"
        else:
            n = f"max({self.prompts_factor}*C, {self.min_prompts}) prompts per level"
        return f"{ds}, {n}"

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["extra_args"] = list(self.extra_args)
        return d


@dataclass
class RunResult:
    """One (server, concurrency) measurement; ``ok=False`` carries ``error``."""

    server: str
    concurrency: int
    num_prompts: int
    ok: bool = False
    error: str | None = None
    warning: str | None = None
    output_tok_s: float | None = None
    mean_tpot_ms: float | None = None
    median_tpot_ms: float | None = None
    mean_ttft_ms: float | None = None
    mean_e2e_ms: float | None = None
    request_throughput: float | None = None
    completed: int | None = None
    total_input_tokens: int | None = None
    total_output_tokens: int | None = None
    duration_s: float | None = None
    accept_length: float | None = None
    spec_share: float | None = None
    gate_steps: dict[str, int] | None = None
    wall_s: float | None = None
    command: str | None = None
    raw_file: str | None = None
    log_file: str | None = None


# ---------------------------------------------------------------------------
# HTTP
# ---------------------------------------------------------------------------


def _get_json(url: str, timeout_s: float) -> Any:
    with urllib.request.urlopen(url, timeout=timeout_s) as r:
        return json.loads(r.read().decode("utf-8", "replace"))


def server_reachable(url: str, timeout_s: float = 5.0) -> str | None:
    """None if the server answers ``/health`` (or ``/v1/models``), else why not."""
    why = "no answer"
    for path in ("/health", "/v1/models"):
        try:
            with urllib.request.urlopen(url + path, timeout=timeout_s) as r:
                if r.status == 200:
                    return None
                why = f"GET {path}: HTTP {r.status}"
        except urllib.error.HTTPError as e:
            why = f"GET {path}: HTTP {e.code}"
        except (urllib.error.URLError, OSError, ValueError) as e:
            why = f"GET {path}: {getattr(e, 'reason', e)}"
    return f"server {url} unreachable ({why})"


def fetch_server_info(url: str, timeout_s: float = 10.0) -> dict[str, Any] | None:
    """The server's ``/server_info`` (or ``/get_server_info``); None if neither."""
    for path in ("/server_info", "/get_server_info"):
        try:
            info = _get_json(url + path, timeout_s)
        except (urllib.error.URLError, OSError, ValueError):
            continue
        if isinstance(info, dict):
            if "decode" in info and isinstance(info["decode"], list) and info["decode"]:
                info = info["decode"][0]  # PD disaggregation: the decode server
            return info
    return None


_INFO_KEYS = (
    "model_path",
    "tp_size",
    "dp_size",
    "speculative_algorithm",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
    "max_running_requests",
    "max_prefill_tokens",
    "chunked_prefill_size",
    "version",
)


def summarize_server_info(info: Mapping[str, Any] | None) -> dict[str, Any]:
    """The fields of a server info that matter here (JSON-able, small)."""
    if not info:
        return {}
    out = {k: info.get(k) for k in _INFO_KEYS if k in info}
    states = info.get("internal_states")
    if isinstance(states, list) and states and isinstance(states[0], dict):
        st = states[0]
        for key in ("avg_spec_accept_length", "effective_max_running_requests_per_dp"):
            if isinstance(st.get(key), int | float):
                out[key] = st[key]
    return out


def accept_length_of(info: Mapping[str, Any] | None) -> float | None:
    v = summarize_server_info(info).get("avg_spec_accept_length")
    return float(v) if isinstance(v, int | float) and v > 0 else None


# ---------------------------------------------------------------------------
# Gate status (optional)
# ---------------------------------------------------------------------------


def _gate_counters(status_dir: str) -> dict[str, int] | None:
    """Summed SPEC/PLAIN step counters of the gate's rank-0 records, or None."""
    from eagle_gate.status import read_status

    try:
        records = read_status(status_dir)
    except (OSError, ValueError):  # missing or unsafe directory
        return None
    spec = plain = 0
    seen = False
    for rec in records:
        if rec.get("tp_rank") not in (0, None) or not rec.get("alive", True):
            continue
        steps = rec.get("steps")
        if isinstance(steps, dict):
            spec += int(steps.get("spec") or 0)
            plain += int(steps.get("plain") or 0)
            seen = True
    return {"spec": spec, "plain": plain} if seen else None


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
    before = _gate_counters(gate_status_dir) if gate_status_dir else None
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
        after = _gate_counters(gate_status_dir)
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
                        f"{_fmt(res.mean_tpot_ms, '.2f')} ms ({res.wall_s:.0f}s)"
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


# ---------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------


def _fmt(v: float | None, spec: str) -> str:
    return "" if v is None else format(v, spec)


def _cells(doc: Mapping[str, Any]) -> dict[tuple[str, int], dict[str, Any]]:
    return {(r["server"], int(r["concurrency"])): r for r in doc.get("runs", [])}


def _md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |"]
    lines.append("|" + "|".join("---:" for _ in header) + "|")
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def format_table(doc: Mapping[str, Any]) -> str:
    """Markdown tables in the style of the README's reference table."""
    names = [s["name"] for s in doc.get("servers", [])]
    concs = [int(c) for c in doc.get("concurrency", [])]
    cells = _cells(doc)

    def val(name: str, c: int, key: str) -> float | None:
        r = cells.get((name, c))
        if not r or not r.get("ok"):
            return None
        v = r.get(key)
        return float(v) if isinstance(v, int | float) else None

    lines = [f"output tok/s (sglang.bench_serving; {doc.get('description', '')})", ""]
    base = names[0] if names else None
    header = ["concurrency", *[f"{n} (tok/s)" for n in names]]
    header += [f"{n} / {base}" for n in names[1:]]
    rows = []
    for c in concs:
        row = [str(c)] + [_fmt(val(n, c, "output_tok_s"), ".1f") for n in names]
        b = val(base, c, "output_tok_s") if base else None
        for n in names[1:]:
            v = val(n, c, "output_tok_s")
            row.append(f"{v / b:.2f}" if v is not None and b else "")
        rows.append(row)
    lines += _md_table(header, rows)

    def metric_table(title, key, fmt, only_reported):
        cols = names
        if only_reported:
            cols = [n for n in names if any(val(n, c, key) is not None for c in concs)]
            if not cols:
                return []
        rows = [[str(c)] + [fmt(val(n, c, key)) for n in cols] for c in concs]
        return ["", title, "", *_md_table(["concurrency", *cols], rows)]

    lines += metric_table(
        "mean TPOT (ms)", "mean_tpot_ms", lambda v: _fmt(v, ".2f"), False
    )
    lines += metric_table(
        "accept length (tokens per SPEC step and request)",
        "accept_length",
        lambda v: _fmt(v, ".2f"),
        True,
    )
    lines += metric_table(
        "gate: share of decode steps run as SPEC",
        "spec_share",
        lambda v: "" if v is None else f"{v:.0%}",
        True,
    )

    notes = []
    for s in doc.get("servers", []):
        if s.get("error"):
            notes.append(f"- {s['name']}: {s['error']}")
    for r in doc.get("runs", []):
        srv_err = any(
            s["name"] == r["server"] and s.get("error") for s in doc.get("servers", [])
        )
        if not r.get("ok") and not srv_err:
            notes.append(f"- {r['server']} C={r['concurrency']}: {r.get('error')}")
        elif r.get("warning"):
            notes.append(f"- {r['server']} C={r['concurrency']}: {r['warning']}")
    if notes:
        lines += ["", "blank cells / warnings:", *notes]
    return "\n".join(lines)


def write_plot(doc: Mapping[str, Any], out_dir: str | os.PathLike[str]) -> str | None:
    """``throughput.png``: tok/s vs concurrency per server, and the ratios to
    the first server; None when matplotlib is not installed or nothing ran."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    names = [s["name"] for s in doc.get("servers", [])]
    concs = [int(c) for c in doc.get("concurrency", [])]
    cells = _cells(doc)

    def series(name: str) -> tuple[list[int], list[float]]:
        xs, ys = [], []
        for c in concs:
            r = cells.get((name, c))
            if r and r.get("ok") and r.get("output_tok_s") is not None:
                xs.append(c)
                ys.append(float(r["output_tok_s"]))
        return xs, ys

    if not any(series(n)[0] for n in names):
        return None
    fig, (ax, ax2) = plt.subplots(
        2, 1, figsize=(7, 7), sharex=True, gridspec_kw={"height_ratios": [3, 2]}
    )
    for n in names:
        xs, ys = series(n)
        if xs:
            ax.plot(xs, ys, marker="o", label=n)
    base = dict(zip(*series(names[0]), strict=True))
    for n in names[1:]:
        xs, ys = series(n)
        pts = [(x, y / base[x]) for x, y in zip(xs, ys, strict=True) if base.get(x)]
        if pts:
            ax2.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=n)
    ax2.axhline(1.0, color="grey", lw=0.8)
    ax.set_xscale("log")
    ax.set_ylabel("output tok/s")
    ax.set_title(f"sglang.bench_serving: {doc.get('description', '')}", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    ax2.set_xlabel("concurrency (closed loop)")
    ax2.set_ylabel(f"ratio to {names[0]}")
    ax2.grid(True, alpha=0.3)
    if len(names) > 1:
        ax2.legend(fontsize=8)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "throughput.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)
