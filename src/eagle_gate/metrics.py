"""Prometheus metrics of the gate, on SGLang's own ``/metrics``.

SGLang (``--enable-metrics``) sets ``PROMETHEUS_MULTIPROC_DIR`` in the launcher
before it spawns the scheduler processes and serves ``/metrics`` from the HTTP
process with prometheus_client's ``MultiProcessCollector`` (both 0.5.9 and
0.5.23: ``sglang.srt.utils.common.set_prometheus_multiproc_dir`` and
``add_prometheus_middleware``). The gate's metrics are therefore defined in the
scheduler processes, written to that directory, and appear on SGLang's
``/metrics`` with nothing else to configure. They are defined only when that
directory is set (and not ``EAGLE_GATE_METRICS=0``), and only by TP rank 0 of
each data-parallel rank: all TP ranks of a DP rank make the same decisions, so
counting on every rank would multiply counters by the TP size.

The hot path never touches prometheus_client: the runtime counts in plain ints
and :meth:`GateMetrics.export` (called by the ops thread about once a second)
adds the differences. Gauges use ``multiprocess_mode="livemostrecent"`` (the
value of the live process that wrote last); counters and the histogram sum
over processes (DP ranks).

``METRICS`` below is the documented list (docs/operations.md, "Metrics
reference"; tests/unit/test_docs.py keeps the two equal).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from eagle_gate.counters import (
    DRAFT_EXTEND_PATHS,
    MODE_NAMES,
    PLAIN_EAGER_REASONS,
    PLAIN_PATHS,
    Overrides,
    PolicyErrors,
)
from eagle_gate.ops import STAGES as OPS_STAGES
from eagle_gate.runtime import GateRuntime
from eagle_gate.status_record import status_record

__all__ = ["METRICS", "DEPTH_METRICS", "GateMetrics", "metrics_wanted", "DWELL_BUCKETS"]

PREFIX = "eagle_gate_"
ENV_METRICS = "EAGLE_GATE_METRICS"
DWELL_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096, 16384)

#: name -> (type, labels, help). Every metric also has the label ``dp_rank``.
METRICS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "eagle_gate_info": (
        "gauge",
        ("adapter", "sglang_version", "policy", "gated"),
        "Always 1 for the current adapter, SGLang version and policy (0 for a "
        "policy replaced at runtime)",
    ),
    "eagle_gate_decode_steps_total": (
        "counter",
        ("mode",),
        "Decode steps that ran, by mode (spec: draft + verify, plain)",
    ),
    "eagle_gate_decode_tokens_total": (
        "counter",
        ("mode",),
        "Tokens emitted by decode steps, by the mode that produced them",
    ),
    "eagle_gate_decode_request_steps_total": (
        "counter",
        ("mode",),
        "Requests served by decode steps (batch size summed over steps), by "
        "mode; tokens{mode=spec} / request_steps{mode=spec} is the accept "
        "length of SPEC steps alone",
    ),
    "eagle_gate_spec_accept_length": (
        "gauge",
        (),
        "Mean tokens per request of the SPEC steps since the previous export "
        "(about one second), bonus token included; unchanged when none ran. "
        "SGLang's own acceptance metrics count every plain step as a verify "
        "with nothing accepted",
    ),
    "eagle_gate_mode": (
        "gauge",
        ("mode",),
        "1 for the mode the last resolved decode step ran, 0 for the other",
    ),
    "eagle_gate_spec_step_ratio": (
        "gauge",
        (),
        "Share of decode steps that speculated since the previous export "
        "(about one second); unchanged when no step ran",
    ),
    "eagle_gate_policy_errors_total": (
        "counter",
        ("reason",),
        "Policy calls that raised or returned garbage (the step ran SPEC), by "
        "reason: decide_raised, decide_invalid, observe_raised",
    ),
    "eagle_gate_spec_overrides_total": (
        "counter",
        ("reason",),
        "Steps that ran SPEC although the policy said PLAIN (or was not asked), "
        "by reason: plain_step_unavailable, plain_step_failed, degraded",
    ),
    "eagle_gate_slow_decisions_total": (
        "counter",
        (),
        "Policy decisions that took longer than the decide budget",
    ),
    "eagle_gate_plain_step_failures_total": (
        "counter",
        (),
        "Plain steps that raised (the stock step ran instead)",
    ),
    "eagle_gate_plain_steps_total": (
        "counter",
        ("path",),
        "Plain steps by how the target ran: graph (the plain step's own DECODE "
        "CUDA graphs) or eager",
    ),
    "eagle_gate_plain_eager_total": (
        "counter",
        ("reason",),
        "Plain steps that ran the target eagerly, by reason: graphs_off (no "
        "plain graphs in this process, see plain_graphs.reason in the status), "
        "bs_above_max, bs_not_captured, declined (SGLang's own check refused)",
    ),
    "eagle_gate_plain_graph_memory_mib": (
        "gauge",
        (),
        "MiB the plain step's DECODE CUDA graphs and their attention backend "
        "took at start on this TP rank (0 when they are off)",
    ),
    "eagle_gate_plain_graphs_captured": (
        "gauge",
        (),
        "1 when the plain step's DECODE CUDA graphs were captured in this "
        "process (plain_graphs.state captured in the status), else 0",
    ),
    "eagle_gate_plain_draft_extend_total": (
        "counter",
        ("path",),
        "Draft extends of the plain step (eager draft sync, lazy catch-up) by "
        "the path SGLang takes for them: graph (SGLang's own draft-extend CUDA "
        "graph) or eager; predicted with SGLang's batch-size check",
    ),
    "eagle_gate_degraded": (
        "gauge",
        (),
        "1 once the gate has degraded to SGLang's stock behaviour for the rest "
        "of the run (repeated plain-step failures)",
    ),
    "eagle_gate_config_version": (
        "gauge",
        (),
        "Runtime configuration version in effect (0: the launch configuration)",
    ),
    "eagle_gate_policy_estimate": (
        "gauge",
        ("name",),
        "Estimates the policy exposes through its optional estimates() method",
    ),
    "eagle_gate_dwell_steps": (
        "histogram",
        ("mode",),
        "Length in decode steps of each finished run of one mode",
    ),
    "eagle_gate_shadow": (
        "gauge",
        (),
        "1 while in shadow mode (the policy decides, every step runs SGLang's "
        "stock speculative step), else 0",
    ),
    "eagle_gate_shadow_decisions_total": (
        "counter",
        ("mode",),
        "Shadow-mode decisions by the mode the policy would have run",
    ),
    "eagle_gate_shadow_estimated_gain": (
        "gauge",
        (),
        "Relative throughput gain the policy estimates it would have reached "
        "over the shadow-mode steps so far (0.1: +10%); NaN while unknown",
    ),
    "eagle_gate_decision_log_dropped_total": (
        "counter",
        ("kind",),
        "Decision-log records left out by the rate limit "
        "(EAGLE_GATE_DECISION_LOG_RATE), by kind: decisions, outcomes (0 while "
        "the log is off)",
    ),
    "eagle_gate_status_agreement": (
        "gauge",
        (),
        "1 when every live scheduler of this server reports the same policy, "
        "settings, configuration version and shadow mode (agreement.all of "
        "the status), else 0. One process exports it: TP rank 0 of the lowest "
        "DP rank (dp_rank 0), from its background thread, reading the status "
        "directory at most once per round (about a second); 0 until its first "
        "check and while the directory cannot be read",
    ),
    "eagle_gate_depth_steps_total": (
        "counter",
        ("depth",),
        "Decode steps that ran, by SPEC depth (0: PLAIN); with --gate-depths only",
    ),
    "eagle_gate_depth_tokens_total": (
        "counter",
        ("depth",),
        "Tokens decode steps emitted (accept lengths summed), by SPEC depth",
    ),
    "eagle_gate_depth_request_steps_total": (
        "counter",
        ("depth",),
        "Requests served by decode steps, by SPEC depth; tokens / request_steps "
        "of a depth is its mean accept length",
    ),
    "eagle_gate_depth_build_memory_mib": (
        "gauge",
        ("depth",),
        "MiB of device memory SGLang's build of that depth's runtime state took "
        "at start (the depths --gate-depths added; CUDA only)",
    ),
    "eagle_gate_depth_build_seconds": (
        "gauge",
        ("depth",),
        "Seconds SGLang's build of that depth's runtime state took at start",
    ),
    "eagle_gate_ops_errors_total": (
        "counter",
        ("stage",),
        "Failed rounds of the background thread, by stage: control, metrics, "
        "decision_log, status (this process; every process counts its own in "
        "ops.errors of its status record)",
    ),
}

#: the kinds of records the decision log's rate limit drops.
DROPPED_KINDS = ("decisions", "outcomes")
#: the metrics only a server whose policy chooses depths exports (a binary
#: server has no series of them; the example dashboard, whose every query a
#: binary server's scrape must match, leaves them out).
DEPTH_METRICS = tuple(name for name in METRICS if name.startswith("eagle_gate_depth_"))
#: the depth series by the ``depths.per_depth`` status key they follow
#: (``_total``: counters; the build gauges only where measured).
DEPTH_SERIES = (
    ("steps", "eagle_gate_depth_steps_total"),
    ("tokens", "eagle_gate_depth_tokens_total"),
    ("request_steps", "eagle_gate_depth_request_steps_total"),
    ("mib_total", "eagle_gate_depth_build_memory_mib"),
    ("capture_s", "eagle_gate_depth_build_seconds"),
)


def metrics_wanted(environ: Mapping[str, str] | None = None) -> bool:
    """True when SGLang collects multiprocess metrics and the gate may add its."""
    env = os.environ if environ is None else environ
    if env.get(ENV_METRICS, "").strip().lower() in {"0", "false", "no", "off"}:
        return False
    return bool(env.get("PROMETHEUS_MULTIPROC_DIR"))


class GateMetrics:
    """The gate's metric objects in one process, and the export of deltas."""

    def __init__(
        self, runtime: GateRuntime, *, dp_rank: int | None, gated: bool
    ) -> None:
        # Imported here: prometheus_client picks its multiprocess value class
        # from PROMETHEUS_MULTIPROC_DIR when it is first imported.
        from prometheus_client import Counter, Gauge, Histogram

        self.dp = str(dp_rank or 0)
        self.gated = "true" if gated else "false"
        m: dict[str, Any] = {}
        for name, (kind, labels, doc) in METRICS.items():
            labelnames = (*labels, "dp_rank")
            if kind == "counter":
                m[name] = Counter(name, doc, labelnames, registry=None)
            elif kind == "gauge":
                m[name] = Gauge(
                    name,
                    doc,
                    labelnames,
                    registry=None,
                    multiprocess_mode="livemostrecent",
                )
            else:
                m[name] = Histogram(
                    name, doc, labelnames, registry=None, buckets=DWELL_BUCKETS
                )
        self.m = m
        dp = self.dp
        # Children created up front: every series exists (at 0) from the start.
        self.steps = [
            m["eagle_gate_decode_steps_total"].labels(mode, dp) for mode in MODE_NAMES
        ]
        self.tokens = [
            m["eagle_gate_decode_tokens_total"].labels(mode, dp) for mode in MODE_NAMES
        ]
        self.request_steps = [
            m["eagle_gate_decode_request_steps_total"].labels(mode, dp)
            for mode in MODE_NAMES
        ]
        self.accept_length = m["eagle_gate_spec_accept_length"].labels(dp)
        self.mode = [m["eagle_gate_mode"].labels(mode, dp) for mode in MODE_NAMES]
        self.dwell = [
            m["eagle_gate_dwell_steps"].labels(mode, dp) for mode in MODE_NAMES
        ]
        self.errors = {
            r: m["eagle_gate_policy_errors_total"].labels(r, dp)
            for r in PolicyErrors.ALL
        }
        self.overrides = {
            r: m["eagle_gate_spec_overrides_total"].labels(r, dp)
            for r in (
                Overrides.PLAIN_STEP_UNAVAILABLE,
                Overrides.PLAIN_STEP_FAILED,
                Overrides.DEGRADED,
            )
        }
        self.slow = m["eagle_gate_slow_decisions_total"].labels(dp)
        self.plain_failures = m["eagle_gate_plain_step_failures_total"].labels(dp)
        self.plain_paths = {
            path: m["eagle_gate_plain_steps_total"].labels(path, dp)
            for path in PLAIN_PATHS
        }
        self.plain_eager = {
            r: m["eagle_gate_plain_eager_total"].labels(r, dp)
            for r in PLAIN_EAGER_REASONS
        }
        self.plain_graph_mib = m["eagle_gate_plain_graph_memory_mib"].labels(dp)
        self.plain_graphs_captured = m["eagle_gate_plain_graphs_captured"].labels(dp)
        self.plain_draft_extend = {
            path: m["eagle_gate_plain_draft_extend_total"].labels(path, dp)
            for path in DRAFT_EXTEND_PATHS
        }
        self.degraded = m["eagle_gate_degraded"].labels(dp)
        self.config_version = m["eagle_gate_config_version"].labels(dp)
        self.ratio = m["eagle_gate_spec_step_ratio"].labels(dp)
        self.shadow = m["eagle_gate_shadow"].labels(dp)
        self.shadow_decisions = [
            m["eagle_gate_shadow_decisions_total"].labels(mode, dp)
            for mode in MODE_NAMES
        ]
        self.shadow_gain = m["eagle_gate_shadow_estimated_gain"].labels(dp)
        self.dropped = {
            kind: m["eagle_gate_decision_log_dropped_total"].labels(kind, dp)
            for kind in DROPPED_KINDS
        }
        self.ops_errors = {
            stage: m["eagle_gate_ops_errors_total"].labels(stage, dp)
            for stage in OPS_STAGES
        }
        #: only DP rank 0 (this is TP rank 0) says whether the server agrees:
        #: one series per server, and no other rank's 0 to mistake for "no".
        self.exports_agreement = not dp_rank
        self.agreement = (
            m["eagle_gate_status_agreement"].labels(dp)
            if self.exports_agreement
            else None
        )
        #: per-depth children by (metric, depth), made at the first export
        #: with a value (a binary server never makes one: no depth series).
        self.depth_children: dict[tuple[str, str], Any] = {}
        self._info_labels: tuple[str, ...] | None = None
        self._estimate_names: set[str] = set()
        self._last: dict[str, int] = {}
        self.degraded.set(0)
        self.config_version.set(0)
        self.export(runtime)

    def _add(self, key: str, child: Any, value: int) -> None:
        delta = value - self._last.get(key, 0)
        if delta > 0:
            child.inc(delta)
            self._last[key] = value

    def export(self, rt: GateRuntime) -> None:
        """Bring the metrics up to the runtime's status record (off the hot
        path): every value from :func:`eagle_gate.status_record.status_record`,
        but the finished dwells (drained from ``rt.counters``) and the decision
        log's drops (``rt.decision_log``), which the record does not carry."""
        s = status_record(rt)
        steps = [s["steps"][name] for name in MODE_NAMES]
        tokens = [s["tokens"][name] for name in MODE_NAMES]
        request_steps = [s["request_steps"][name] for name in MODE_NAMES]
        before = (self._last.get("steps0", 0), self._last.get("steps1", 0))
        spec_before = (self._last.get("tokens0", 0), self._last.get("reqsteps0", 0))
        for i in (0, 1):
            self._add(f"steps{i}", self.steps[i], steps[i])
            self._add(f"tokens{i}", self.tokens[i], tokens[i])
            self._add(f"reqsteps{i}", self.request_steps[i], request_steps[i])
        spec_requests = self._last.get("reqsteps0", 0) - spec_before[1]
        if spec_requests > 0:
            spec_tokens = self._last.get("tokens0", 0) - spec_before[0]
            self.accept_length.set(spec_tokens / spec_requests)
        ran = (steps[0] - before[0], steps[1] - before[1])
        if ran[0] + ran[1] > 0:
            self.ratio.set(ran[0] / (ran[0] + ran[1]))
        errors = s["policy_errors_by_reason"]
        for reason, child in self.errors.items():
            self._add(f"err:{reason}", child, errors.get(reason, 0))
        for reason, count in s["overrides"].items():
            child = self.overrides.get(reason)
            if child is None:
                child = self.m["eagle_gate_spec_overrides_total"].labels(
                    reason, self.dp
                )
                self.overrides[reason] = child
            self._add(f"ovr:{reason}", child, count)
        self._add("slow", self.slow, s["slow_decisions"])
        self._add("plainfail", self.plain_failures, s["plain_step_failures"])
        for path, child in self.plain_paths.items():
            self._add(f"ppath:{path}", child, s["plain_path"].get(path, 0))
        for reason, count in s["plain_eager_reasons"].items():
            child = self.plain_eager.get(reason)
            if child is None:
                child = self.m["eagle_gate_plain_eager_total"].labels(reason, self.dp)
                self.plain_eager[reason] = child
            self._add(f"peager:{reason}", child, count)
        graphs = s["plain_graphs"]
        self.plain_graph_mib.set(graphs.get("memory_mib") or 0.0)
        self.plain_graphs_captured.set(1 if graphs.get("state") == "captured" else 0)
        for path, child in self.plain_draft_extend.items():
            self._add(f"dext:{path}", child, s["draft_extend_path"].get(path, 0))
        self.degraded.set(1 if s["degraded"] else 0)
        self.config_version.set(s["config_version"])
        shadow = s["shadow_totals"]
        self.shadow.set(1 if s["shadow"] else 0)
        for i, name in enumerate(MODE_NAMES):
            self._add(f"shadow{i}", self.shadow_decisions[i], shadow["would_run"][name])
        gain = shadow["estimated_gain"]
        self.shadow_gain.set(float("nan") if gain is None else gain)
        log = rt.decision_log
        if log is not None:
            for kind, child in self.dropped.items():
                self._add(f"drop:{kind}", child, getattr(log, f"dropped_{kind}"))
        current = s["mode"]
        if current is not None:
            current = MODE_NAMES.index(current)
            self.mode[current].set(1)
            self.mode[1 - current].set(0)
        dwells = rt.counters.finished_dwells
        while dwells:
            try:
                mode, length = dwells.popleft()
            except IndexError:
                break
            self.dwell[mode].observe(length)
        depths = s.get("depths")
        if depths is not None:
            self._export_depths(depths["per_depth"])
        labels = (s["adapter"], s["sglang_version"], s["policy"], self.gated)
        if labels != self._info_labels:
            info = self.m["eagle_gate_info"]
            if self._info_labels is not None:
                info.labels(*self._info_labels, self.dp).set(0)
            info.labels(*labels, self.dp).set(1)
            self._info_labels = labels
        estimates = s["estimates"]
        gauge = self.m["eagle_gate_policy_estimate"]
        for name, value in estimates.items():
            gauge.labels(name, self.dp).set(value)
        self._estimate_names.update(estimates)

    def _export_depths(self, per_depth: Mapping[str, Mapping[str, Any]]) -> None:
        """The ``depth``-labelled series from the status's ``depths.per_depth``
        (a build gauge only where measured: no 0 standing for "unknown")."""
        for depth, entry in per_depth.items():
            for key, name in DEPTH_SERIES:
                value = entry.get(key)
                child = self.depth_children.get((name, depth))
                if child is None and value is not None:
                    child = self.m[name].labels(depth, self.dp)
                    self.depth_children[(name, depth)] = child
                if child is None or value is None:
                    continue
                if name.endswith("_total"):
                    self._add(f"{name}:{depth}", child, value)
                else:
                    child.set(value)

    def export_ops(self, stage_errors: Mapping[str, int]) -> None:
        """Bring ``eagle_gate_ops_errors_total`` up to the ops thread's counts."""
        for stage, count in dict(stage_errors).items():
            child = self.ops_errors.get(stage)
            if child is None:
                child = self.m["eagle_gate_ops_errors_total"].labels(stage, self.dp)
                self.ops_errors[stage] = child
            self._add(f"ops:{stage}", child, count)

    def set_status_agreement(self, agree: bool) -> None:
        """Set ``eagle_gate_status_agreement`` (only where this process exports it)."""
        if self.agreement is not None:
            self.agreement.set(1 if agree else 0)
