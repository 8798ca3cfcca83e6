"""What the simulator runs and what a run produced: a :class:`Scenario` (a
load schedule of :class:`Segment` s) and a :class:`SimResult`. The
simulator itself is :mod:`eagle_gate.sim.engine`, which re-exports these."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Scenario", "Segment", "SimResult"]


@dataclass(frozen=True)
class Segment:
    """A stretch of the load schedule.

    ``level`` is the number of concurrent clients (closed loop) or the arrival
    rate in requests/s (open loop). ``class_probs`` maps request class ->
    probability (``None``: the profile's default class only).
    """

    duration_s: float
    level: float
    class_probs: Mapping[str, float] | None = None


@dataclass(frozen=True)
class Scenario:
    """A load schedule. Measurement excludes the first ``warmup_s`` seconds."""

    name: str
    segments: Sequence[Segment]
    closed_loop: bool = True
    warmup_s: float = 0.0
    #: closed loop: start with the first segment's clients already decoding at
    #: random progress (a steady state instead of a synchronized start).
    staggered_start: bool = True
    seed: int = 0
    #: share of decode intervals reported as unknown (``interval_s=None``) on
    #: top of those after prefills: adapters that cannot time every step.
    unknown_share: float = 0.0
    #: outcomes arrive 1..max_delay steps after their decision (1 or 2 as in
    #: serving with overlap scheduling; order kept).
    max_delay: int = 1
    #: the gate's draft sync: "eager" PLAIN outcomes carry ``draft_matches``;
    #: "lazy" and "none" do not (None).
    draft_sync: str = "eager"
    #: at each segment's start every running request takes a class from
    #: that segment's mix (content that changes mid-request): acceptance
    #: moves for the whole batch at once, not as requests turn over.
    reclass_running: bool = False

    @property
    def duration_s(self) -> float:
        return sum(s.duration_s for s in self.segments)


@dataclass
class SimResult:
    """What one run produced."""

    policy: str
    scenario: str
    tokens: int  # output tokens emitted inside the measurement window
    time_s: float  # length of the measurement window
    tpot_s: float  # mean time per output token of requests completed in it
    decode_steps: int
    spec_steps: int
    completed: int
    total_tokens: int  # all output tokens emitted in the run
    clock_s: float  # simulated time at the end
    busy_s: float  # sum of all step, prefill and idle durations
    explored_share: float | None = None
    switches: int | None = None
    #: seconds of decode steps whose mode was not the policy's ``home`` (its
    #: chosen mode, probes aside), for policies that expose one; else None.
    explored_s: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def tok_s(self) -> float:
        return self.tokens / self.time_s if self.time_s > 0 else 0.0
