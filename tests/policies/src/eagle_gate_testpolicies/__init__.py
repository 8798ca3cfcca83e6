"""Test-only policies for end-to-end tests on real speculative servers.

Installed by the tests into a temporary directory on the servers'
``PYTHONPATH`` (never into the package), and found like any third-party
plugin, through the ``eagle_gate`` entry point.

* ``schedule``: a fixed pattern of modes by decode step, counted from the
  policy's first decision (a runtime change starts it afresh), e.g.
  ``"s3,p2"`` (3 SPEC steps, 2 PLAIN steps, repeated), or with
  ``repeat = false`` played once and then SPEC for good: forces PLAIN
  stretches of known lengths. ``s<N>@<D>`` runs those SPEC steps at draft
  depth ``D`` (a server with ``--gate-depths``; ``view.depth``).
* ``coin``: a seeded random switcher (``seed``, ``plain_share``), a
  deterministic function of the step; on a server with ``--gate-depths``
  each SPEC step also draws its depth from ``view.depths`` (a second draw:
  the modes are the same as on a binary server).
* ``flaky``: PLAIN, but ``decide`` raises on every ``every``-th step from
  ``from_step`` on (a policy that fails mid-run).
"""

from __future__ import annotations

import random

import eagle_gate
from eagle_gate import Mode, PolicyFactory, Setting

_CODES = {"s": Mode.SPEC, "p": Mode.PLAIN}


def parse_steps(pattern: str) -> list[tuple[Mode, int | None]]:
    """``"s2@1,p1"`` -> [(SPEC, 1), (SPEC, 1), (PLAIN, None)]: each step's
    mode and SPEC depth (None: the configured one)."""
    steps: list[tuple[Mode, int | None]] = []
    for part in pattern.split(","):
        part = part.strip().lower()
        count, _, depth = part[1:].partition("@")
        if (
            not part
            or part[0] not in _CODES
            or not count.isdigit()
            or (depth and (part[0] != "s" or not depth.isdigit()))
        ):
            raise ValueError(f"bad pattern part {part!r}: use s<N>, s<N>@<D> or p<N>")
        steps += [(_CODES[part[0]], int(depth) if depth else None)] * int(count)
    if not steps:
        raise ValueError("empty pattern")
    return steps


def parse_pattern(pattern: str) -> list[Mode]:
    """``"s3,p2"`` -> [SPEC, SPEC, SPEC, PLAIN, PLAIN]."""
    return [mode for mode, _ in parse_steps(pattern)]


class Schedule:
    name = "schedule"

    def __init__(self, pattern: str = "s2,p2", repeat: bool = True) -> None:
        self.steps = parse_steps(pattern)
        self.modes = [mode for mode, _ in self.steps]
        self.repeat = repeat
        self.first_step: int | None = None

    def decide(self, view: eagle_gate.StepView) -> Mode:
        if self.first_step is None:
            self.first_step = view.step
        step = view.step - self.first_step
        if step >= len(self.steps) and not self.repeat:
            return Mode.SPEC
        mode, depth = self.steps[step % len(self.steps)]
        if depth is not None:
            view.depth = depth
        return mode

    def observe(self, outcome: eagle_gate.StepOutcome) -> None:
        pass


class Coin:
    name = "coin"

    def __init__(self, seed: int = 0, plain_share: float = 0.5) -> None:
        self.seed = seed
        self.plain_share = plain_share

    def decide(self, view: eagle_gate.StepView) -> Mode:
        rng = random.Random(self.seed * 1_000_003 + view.step)
        if rng.random() < self.plain_share:
            return Mode.PLAIN
        if len(view.depths) > 1:
            view.depth = rng.choice(view.depths)
        return Mode.SPEC

    def observe(self, outcome: eagle_gate.StepOutcome) -> None:
        pass


class Flaky:
    name = "flaky"

    def __init__(self, every: int = 3, from_step: int = 0) -> None:
        self.every = every
        self.from_step = from_step

    def decide(self, view: eagle_gate.StepView) -> Mode:
        if view.step >= self.from_step and view.step % self.every == 0:
            raise RuntimeError(f"flaky policy fails at step {view.step}")
        return Mode.PLAIN

    def observe(self, outcome: eagle_gate.StepOutcome) -> None:
        pass


@eagle_gate.hookimpl
def eagle_gate_policies():
    return [
        PolicyFactory(
            "schedule",
            Schedule,
            "a fixed pattern of modes by decode step",
            {
                "pattern": Setting(str, "s2,p2", "s<N>/p<N> parts, comma-separated"),
                "repeat": Setting(bool, True, "repeat the pattern (else SPEC after)"),
            },
        ),
        PolicyFactory(
            "coin",
            Coin,
            "seeded random SPEC/PLAIN by step",
            {
                "seed": Setting(int, 0, "random seed"),
                "plain_share": Setting(float, 0.5, "share of PLAIN steps", 0.0, 1.0),
            },
        ),
        PolicyFactory(
            "flaky",
            Flaky,
            "PLAIN, raising on every every-th step",
            {
                "every": Setting(int, 3, "raise on steps divisible by this", 1),
                "from_step": Setting(int, 0, "first step that may raise", 0),
            },
        ),
    ]
