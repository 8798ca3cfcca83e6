"""What a server whose policy chooses SPEC depths (``--gate-depths``, #33)
ran at each depth, and what building each depth's runtime state cost.

:class:`DepthStats` exists only where the runtime's ``depth_control`` is set
(:meth:`GateRuntime.enable_depths <eagle_gate.runtime.GateRuntime.enable_depths>`);
a binary server has none and its status has no ``depths`` key, so its
record and metrics are what they were before depths existed.

Counts are plain-int lists indexed by depth (0 = PLAIN, 1..max), allocated
once when depths are enabled: :meth:`DepthStats.count` on the hot path
writes three list slots and allocates nothing. The build costs are measured
by the adapter while SGLang builds the states at startup
(``adapters/sglang_0_5_23/depths.py``) and handed over once.

The status shape (docs/operations.md, "Draft depths in the status"):
``{"set", "configured", "max", "out_of_range", "measure_errors", "per_depth":
{"0": ..., "1": ...}, "unused_builds": {}}``, each ``per_depth`` entry with
the counts (``steps``, ``request_steps``, ``tokens``, ``mean_accept``) and
the build's cost (``built``, ``capture_s``, ``mib_total``,
``mib_verify_graphs``, ``mib_draft_graphs``, ``mib_other``,
``verify_graph_bs``, ``draft_extend_graph_bs``); ``unused_builds``: states
SGLang built at depths outside the set, by depth, with the same cost keys.

No SGLang, no torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from eagle_gate.policy import Mode

__all__ = ["DepthStats", "BUILD_KEYS", "COUNT_KEYS"]

#: the counts of one depth in the status.
COUNT_KEYS = ("steps", "request_steps", "tokens", "mean_accept")
#: what building one depth's runtime state cost, in the status (None where
#: not measured: depth 0, the configured depth SGLang built with the server,
#: memory without CUDA).
BUILD_KEYS = (
    "built",
    "capture_s",
    "mib_total",
    "mib_verify_graphs",
    "mib_draft_graphs",
    "mib_other",
    "verify_graph_bs",
    "draft_extend_graph_bs",
)
#: ``built`` of the configured depth: SGLang's own startup state, whose
#: graphs are in SGLang's usual graph-memory log, not measured apart.
BUILT_AT_STARTUP = "startup"
#: ``built`` of a depth whose state the gate saw SGLang build.
BUILT_ADAPTIVE = "adaptive"


class DepthStats:
    """Per-depth counts of one scheduler process, and per-depth build costs."""

    __slots__ = (
        "depths",
        "configured",
        "steps",
        "request_steps",
        "tokens",
        "out_of_range",
        "builds",
        "unused_builds",
        "measure_errors",
    )

    def __init__(
        self,
        depths: Sequence[int],
        configured: int,
        builds: Mapping[int, Mapping[str, Any]] | None = None,
        measure_errors: int = 0,
    ) -> None:
        self.depths = tuple(sorted(int(d) for d in depths))
        self.configured = int(configured)
        size = max(self.depths) + 1
        #: per depth (index 0: PLAIN): decode steps, requests x steps, tokens
        #: (the sum of accept lengths, bonus token included).
        self.steps = [0] * size
        self.request_steps = [0] * size
        self.tokens = [0] * size
        #: SPEC steps reported at a depth outside 0..max (a third-party
        #: adapter's): counted here, not in a depth.
        self.out_of_range = 0
        #: depth -> what building its state cost (the adapter's measurement);
        #: states of depths outside the set (SGLang's depth-0 verify under an
        #: operator's own adaptive config) are kept apart: never PLAIN's cost.
        measured = {int(d): dict(b) for d, b in (builds or {}).items()}
        self.builds = {d: b for d, b in measured.items() if d in self.depths}
        self.unused_builds = {d: b for d, b in measured.items() if d not in self.builds}
        #: measurements the adapter gave up (the build itself ran).
        self.measure_errors = int(measure_errors)

    def count(
        self, mode: Mode, depth: int | None, request_steps: int, tokens: int
    ) -> None:
        """One resolved decode step: PLAIN counts at depth 0, SPEC at
        ``depth`` (None or 0: the configured one). Hot path: no allocation."""
        d = 0 if mode is Mode.PLAIN else depth or self.configured
        if 0 <= d < len(self.steps):
            self.steps[d] += 1
            self.request_steps[d] += request_steps
            self.tokens[d] += tokens
        else:
            self.out_of_range += 1

    def entry(self, depth: int) -> dict[str, Any]:
        """One depth's status entry: its counts and its build's cost."""
        n = self.request_steps[depth] if depth < len(self.steps) else 0
        tokens = self.tokens[depth] if depth < len(self.steps) else 0
        out: dict[str, Any] = {
            "steps": self.steps[depth] if depth < len(self.steps) else 0,
            "request_steps": n,
            "tokens": tokens,
            "mean_accept": tokens / n if n else None,
        }
        build = self.builds.get(depth)
        for key in BUILD_KEYS:
            out[key] = None if build is None else build.get(key)
        if depth == self.configured and build is None:
            out["built"] = BUILT_AT_STARTUP
        return out

    def as_status(self) -> dict[str, Any]:
        """The status record's ``depths`` (JSON-able; read off the hot path)."""
        shown = (0, *self.depths)
        return {
            "set": list(self.depths),
            "configured": self.configured,
            "max": self.depths[-1],
            "out_of_range": self.out_of_range,
            "measure_errors": self.measure_errors,
            "per_depth": {str(d): self.entry(d) for d in shown},
            "unused_builds": {str(d): dict(b) for d, b in self.unused_builds.items()},
        }
