"""Turn real-server measurements into a simulator profile file.

Input: a results document of :mod:`eagle_gate.bench.runner` holding, for the
same model, hardware and dataset, a server **without** speculation (PLAIN) and
one **with** it (SPEC, e.g. EAGLE-3), measured over a closed-loop concurrency
grid. Output: a JSON profile (the format of :mod:`eagle_gate.sim.profiles`)
for ``python -m eagle_gate.sim --profile-file``.

Method
------

1. **Step-time tables.** In a closed loop of ``C`` clients the decode batch
   holds about ``C`` requests. A PLAIN step emits one token per request, so the
   PLAIN step interval at batch ``C`` starts as the measured mean TPOT of the
   PLAIN server (``C / tok_s`` when TPOT is missing). A SPEC step emits
   ``acc`` tokens per request (``acc`` = mean accept length, bonus token
   included), so the SPEC step interval starts as ``acc * TPOT`` of the SPEC
   server. These become ``plain_table`` / ``spec_table`` at ``x = C``
   (piecewise linear in between, linear beyond, as the simulator does).
2. **Acceptance.** ``acc`` is the accept length SGLang reported for the SPEC
   server (median over the levels; ``--accept-length`` overrides). The
   profile's single request class gets the per-token acceptance ``alpha``
   solving ``1 + alpha + ... + alpha**s = acc`` with ``s + 1`` =
   ``speculative_num_draft_tokens`` of the SPEC server (``--num-draft-tokens``
   overrides).
3. **Workload.** Prompt and output lengths come from the dataset options
   (random: ``[L * range_ratio, L]``) or, for other datasets, from the measured
   mean tokens per request (``[0.5 m, 1.5 m]``); ``max_running`` from the
   server's effective running-request limit; prefill cost from the TTFT of the
   lowest PLAIN level (half fixed, half per prompt token).
4. **Calibration.** The simulator then replays each level with ``never``
   (PLAIN) and ``always`` (SPEC), and each table value is multiplied by
   simulated / measured throughput (bounded to [0.5, 2] per round), for
   ``--calibrate-rounds`` rounds (default 6). This absorbs what TPOT does not
   show: prefill stalls, batches below ``C`` while requests are in prefill or
   between requests, and the HTTP turnaround. The report lists the remaining
   error per level.

Limits
------

* Only the default SPEC step (``num_draft_tokens``) is measured; other draft
  counts, the draft/verify/extend split and the draft **resync** cost after
  PLAIN steps keep the profile defaults (``resync_fixed`` 2 ms). A gated server
  whose PLAIN step works could measure the resync; today it cannot (the PLAIN
  step is not implemented yet, see the README).
* One acceptance for all requests (no request classes), averaged over the run
  as SGLang reports it (0.5.9: since server start, warm-up included).
* Tables are indexed by concurrency, not by measured batch size: with large
  prefills, ``max_running`` or KV-cache limits, the real batch is smaller than
  ``C``; the calibration makes throughput match but step times at a given
  batch size are then approximate. ``bench_serving``'s finite prompt count also
  includes a ramp-down tail at the end of each level, which the steady-state
  simulation does not have (more prompts per level make it smaller).
* The KV-length term (``per_kv``) is not fitted; long-context behaviour beyond
  the measured lengths is not extrapolated.
* The result describes this hardware, model, draft model, dataset and SGLang
  version only.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["CaptureError", "derive_profile", "solve_alpha", "write_profile"]


class CaptureError(ValueError):
    """The results do not hold what a profile needs."""


def solve_alpha(accept_length: float, num_draft_tokens: int) -> float:
    """Per-token acceptance ``alpha`` with ``sum(alpha**j, j=0..k-1) = acc``."""
    s = num_draft_tokens - 1
    acc = min(max(float(accept_length), 1.0), float(num_draft_tokens) - 1e-3)
    lo, hi = 0.0, 0.999
    for _ in range(60):
        mid = (lo + hi) / 2
        if sum(mid**j for j in range(s + 1)) < acc:
            lo = mid
        else:
            hi = mid
    return round((lo + hi) / 2, 4)


def _server(doc: Mapping[str, Any], name: str) -> dict[str, Any]:
    for s in doc.get("servers", []):
        if s["name"] == name:
            return s
    names = [s["name"] for s in doc.get("servers", [])]
    raise CaptureError(f"no server {name!r} in the results (have: {names})")


def _pick(doc: Mapping[str, Any], plain: str | None, spec: str | None) -> tuple:
    servers = list(doc.get("servers", []))
    if len(servers) < 1:
        raise CaptureError("the results hold no server")

    def is_spec(s: Mapping[str, Any]) -> bool:
        return bool((s.get("info") or {}).get("speculative_algorithm"))

    if plain is None:
        plain = next((s["name"] for s in servers if not is_spec(s)), servers[0]["name"])
    if spec is None:
        others = [s for s in servers if s["name"] != plain]
        spec = next(
            (s["name"] for s in others if is_spec(s)),
            others[0]["name"] if others else None,
        )
    if spec is None:
        raise CaptureError("need a second (speculative) server; pass --spec NAME")
    return _server(doc, plain), _server(doc, spec)


def _ok_runs(doc: Mapping[str, Any], name: str) -> dict[int, dict[str, Any]]:
    out = {}
    for r in doc.get("runs", []):
        if r["server"] == name and r.get("ok") and r.get("output_tok_s"):
            out[int(r["concurrency"])] = r
    return out


def _lengths(doc: Mapping[str, Any], runs: Mapping[int, Mapping[str, Any]]) -> tuple:
    opts = doc.get("options") or {}
    ds = str(opts.get("dataset_name") or "")
    if ds.startswith("random"):
        ratio = opts.get("random_range_ratio")
        ratio = 0.0 if ratio is None else float(ratio)  # bench_serving's default
        li, lo = int(opts["random_input_len"]), int(opts["random_output_len"])
        return (
            (max(1, int(li * ratio)), max(1, li)),
            (max(1, int(lo * ratio)), max(1, lo)),
        )

    def span(key: str) -> tuple[int, int]:
        means = [
            r[key] / r["completed"]
            for r in runs.values()
            if r.get(key) and r.get("completed")
        ]
        m = statistics.mean(means) if means else 256.0
        return (max(1, round(0.5 * m)), max(1, round(1.5 * m)))

    inp, outp = span("total_input_tokens"), span("total_output_tokens")
    if opts.get("sharegpt_output_len"):
        n = int(opts["sharegpt_output_len"])
        outp = (n, n)
    return inp, outp


def derive_profile(
    doc: Mapping[str, Any],
    *,
    plain: str | None = None,
    spec: str | None = None,
    name: str | None = None,
    accept_length: float | None = None,
    num_draft_tokens: int | None = None,
    calibrate_rounds: int = 6,
    quick: bool = False,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Build a profile mapping from bench results (see the module doc).

    Returns ``(profile, report)``: ``profile`` is JSON-able and loads with
    :func:`eagle_gate.sim.profiles.profile_from_mapping`; ``report`` says what
    was used and how well the calibrated simulation matches each level.
    """
    from eagle_gate.sim.profile_files import profile_from_mapping

    ps, ss = _pick(doc, plain, spec)
    p_runs, s_runs = _ok_runs(doc, ps["name"]), _ok_runs(doc, ss["name"])
    if not p_runs:
        raise CaptureError(f"no successful run of the PLAIN server {ps['name']!r}")
    if not s_runs:
        raise CaptureError(f"no successful run of the SPEC server {ss['name']!r}")
    notes: list[str] = []
    pinfo, sinfo = ps.get("info") or {}, ss.get("info") or {}

    # -- draft tokens and acceptance ------------------------------------------
    k = num_draft_tokens
    if k is None:
        topk = sinfo.get("speculative_eagle_topk")
        if isinstance(topk, int) and topk > 1 and sinfo.get("speculative_num_steps"):
            k = int(sinfo["speculative_num_steps"]) + 1
            notes.append(f"tree drafts (topk {topk}): modelled as a chain of {k}")
        elif sinfo.get("speculative_num_draft_tokens"):
            k = int(sinfo["speculative_num_draft_tokens"])
        else:
            k = 4
            notes.append("draft tokens unknown: assumed 4 (pass --num-draft-tokens)")
    k = max(2, int(k))
    acc = accept_length
    acc_src = "given"
    if acc is None:
        accs = [
            float(r["accept_length"]) for r in s_runs.values() if r.get("accept_length")
        ]
        if accs:
            acc, acc_src = statistics.median(accs), "median of the SPEC runs"
        elif sinfo.get("avg_spec_accept_length"):
            acc, acc_src = float(sinfo["avg_spec_accept_length"]), "server info"
    if acc is None:
        acc, acc_src = 1.0 + 0.6 * (1 - 0.6 ** (k - 1)) / 0.4, "assumed (alpha 0.6)"
        notes.append("accept length unknown: assumed alpha 0.6 (--accept-length)")
    alpha = solve_alpha(acc, k)
    acc_model = sum(alpha**j for j in range(k))

    # -- tables ------------------------------------------------------------------
    plain_pts = {}
    for c, r in sorted(p_runs.items()):
        t = r.get("mean_tpot_ms")
        plain_pts[c] = t / 1e3 if t else c / r["output_tok_s"]
    spec_pts = {}
    for c, r in sorted(s_runs.items()):
        t = r.get("mean_tpot_ms")
        spec_pts[c] = acc_model * (t / 1e3 if t else c / r["output_tok_s"])

    prompt_len, output_len = _lengths(doc, p_runs)
    max_running = 256
    lims = [
        int(v)
        for info in (pinfo, sinfo)
        for v in (
            info.get("effective_max_running_requests_per_dp"),
            info.get("max_running_requests"),
        )
        if isinstance(v, int | float) and v > 0
    ]
    if lims:
        max_running = min(lims)
    c_min = min(p_runs)
    ttft = p_runs[c_min].get("mean_ttft_ms")
    mean_prompt = (prompt_len[0] + prompt_len[1]) / 2
    prefill_fixed, prefill_per_tok = 0.010, 0.00002
    if ttft:
        prefill_fixed = 0.5 * ttft / 1e3
        prefill_per_tok = 0.5 * ttft / 1e3 / max(mean_prompt, 1.0)

    pname = name or f"captured-{ps['name']}-{ss['name']}"
    model = pinfo.get("model_path") or sinfo.get("model_path") or "?"
    mapping: dict[str, Any] = {
        "name": pname,
        "description": (
            f"captured by eagle_gate.bench from {ps['name']} (PLAIN) and "
            f"{ss['name']} (SPEC {sinfo.get('speculative_algorithm') or '?'}, "
            f"{k} draft tokens, accept length {acc:.2f}); model {model}, "
            f"tp {pinfo.get('tp_size', '?')}; {doc.get('description', '')}"
        ),
        "num_draft_tokens": k,
        "plain_table": [[c, round(v, 7)] for c, v in sorted(plain_pts.items())],
        "spec_table": [[c, round(v, 7)] for c, v in sorted(spec_pts.items())],
        "prefill_fixed": round(prefill_fixed, 7),
        "prefill_per_tok": round(prefill_per_tok, 10),
        "max_running": max_running,
        "noise": 0.02,
        "client_gap_s": 0.0,
        "prompt_len": list(prompt_len),
        "output_len": list(output_len),
        "classes": {"captured": alpha},
        "default_class": "captured",
    }
    if isinstance(pinfo.get("max_prefill_tokens"), int):
        mapping["max_prefill_tokens"] = int(pinfo["max_prefill_tokens"])
    profile_from_mapping(mapping)  # validate before calibrating

    fit = _calibrate(mapping, p_runs, s_runs, calibrate_rounds, quick)
    report = {
        "plain_server": ps["name"],
        "spec_server": ss["name"],
        "num_draft_tokens": k,
        "accept_length": acc,
        "accept_length_source": acc_src,
        "alpha": alpha,
        "calibrate_rounds": calibrate_rounds,
        "fit": fit,
        "max_abs_error": max((abs(f["error"]) for f in fit), default=None),
        "notes": notes,
    }
    return mapping, report


def _simulate(mapping: Mapping[str, Any], c: int, policy: str, quick: bool) -> float:
    from eagle_gate.policies import AlwaysSpec, NeverSpec
    from eagle_gate.sim.engine import Scenario, Segment, Simulator
    from eagle_gate.sim.profile_files import profile_from_mapping
    from eagle_gate.sim.workloads import grid_steps

    prof = profile_from_mapping(mapping)
    mean_p = sum(prof.prompt_len) / 2
    mean_o = sum(prof.output_len) / 2
    b = min(c, prof.max_running)
    step = prof.plain_time(b, 0) if policy == "never" else prof.spec_time(b, 0)
    dur = grid_steps(c, quick) * (step + b / mean_o * prof.prefill_time(int(mean_p)))
    scen = Scenario(
        name=f"capture-c{c}",
        segments=(Segment(dur, c),),
        closed_loop=True,
        warmup_s=0.1 * dur,
        seed=c,
    )
    pol = NeverSpec() if policy == "never" else AlwaysSpec()
    return Simulator(prof, scen).run(pol).tok_s


def _calibrate(
    mapping: dict[str, Any],
    p_runs: Mapping[int, Mapping[str, Any]],
    s_runs: Mapping[int, Mapping[str, Any]],
    rounds: int,
    quick: bool,
) -> list[dict[str, Any]]:
    """Scale the tables until the simulator reproduces the measured tok/s."""
    jobs = (("plain_table", "never", p_runs), ("spec_table", "always", s_runs))
    sims: dict[tuple[str, int], float] = {}
    for rnd in range(rounds + 1):
        for key, policy, runs in jobs:
            table = mapping[key]
            for i, (c, y) in enumerate(table):
                got = _simulate(mapping, int(c), policy, quick)
                sims[(policy, int(c))] = got
                if rnd == rounds or got <= 0:
                    continue
                f = got / float(runs[int(c)]["output_tok_s"])
                f = min(max(f, 0.5), 2.0)
                table[i] = [c, round(y * f, 7)]
    fit = []
    for key, policy, runs in jobs:
        for c, _ in mapping[key]:
            meas = float(runs[int(c)]["output_tok_s"])
            sim = sims[(policy, int(c))]
            fit.append(
                {
                    "mode": "PLAIN" if policy == "never" else "SPEC",
                    "concurrency": int(c),
                    "measured_tok_s": round(meas, 2),
                    "simulated_tok_s": round(sim, 2),
                    "error": round(sim / meas - 1.0, 4) if meas > 0 else math.nan,
                }
            )
    return fit


def write_profile(mapping: Mapping[str, Any], path: str | os.PathLike[str]) -> Path:
    """Write the profile as JSON (the format ``--profile-file`` reads)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(mapping, indent=1) + "\n")
    return p


def format_report(report: Mapping[str, Any]) -> str:
    lines = [
        f"PLAIN server {report['plain_server']}, SPEC server {report['spec_server']}: "
        f"{report['num_draft_tokens']} draft tokens, accept length "
        f"{report['accept_length']:.2f} ({report['accept_length_source']}) -> "
        f"alpha {report['alpha']:.3f}",
        f"calibration ({report['calibrate_rounds']} rounds): simulated vs measured",
        "| mode | concurrency | measured tok/s | simulated tok/s | error |",
        "|---|---:|---:|---:|---:|",
    ]
    for f in report["fit"]:
        lines.append(
            f"| {f['mode']} | {f['concurrency']} | {f['measured_tok_s']:.1f} | "
            f"{f['simulated_tok_s']:.1f} | {f['error']:+.1%} |"
        )
    for n in report.get("notes", []):
        lines.append(f"note: {n}")
    return "\n".join(lines)
