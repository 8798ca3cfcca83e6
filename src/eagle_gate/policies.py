"""Built-in policies: ``always``, ``never`` and ``threshold``.

They are registered through the ``eagle_gate`` entry point like any
third-party plugin (``builtin = "eagle_gate.policies"`` in pyproject.toml).
"""

from __future__ import annotations

from eagle_gate.depths import MAX_DEPTH
from eagle_gate.hookspecs import hookimpl
from eagle_gate.policy import Mode, PolicyFactory, StepOutcome, StepView
from eagle_gate.settings import Setting, SettingsError

__all__ = ["AlwaysSpec", "NeverSpec", "Threshold"]


class AlwaysSpec:
    """Speculate on every step: SGLang's stock behaviour, for comparison.

    ``depth``: on a server with ``--gate-depths``, every SPEC step at this
    draft depth instead of the configured one (one of the server's depths:
    another is refused at launch, and set at runtime each step is a policy
    error and runs SGLang's step); 0, the
    default, is the configured depth. It pins a depth at runtime, e.g. to
    time each depth on one server (``examples/validate_gpu.py`` section 5).
    A server that cannot change depth ignores it, as the policy contract says.
    """

    name = "always"

    def __init__(self, depth: int = 0) -> None:
        self.depth = depth

    def decide(self, view: StepView) -> Mode:
        if self.depth:
            view.depth = self.depth
        return Mode.SPEC

    def observe(self, outcome: StepOutcome) -> None:
        return None


class NeverSpec:
    """Plain decode on every step: a server without speculation."""

    name = "never"

    def decide(self, view: StepView) -> Mode:
        return Mode.PLAIN

    def observe(self, outcome: StepOutcome) -> None:
        return None


class Threshold:
    """The reference design: PLAIN while the decode batch is large.

    In SPEC it switches to PLAIN when the batch size exceeds ``plain_above``;
    in PLAIN it resumes SPEC when the batch size falls to ``spec_at_or_below``
    or less. The gap between the two thresholds (hysteresis) and the minimum
    dwell of ``min_dwell_steps`` steps after every switch keep it from
    flapping when the batch size hovers around a threshold, because every
    switch back to SPEC costs a draft resync.
    """

    name = "threshold"

    def __init__(
        self, plain_above: int = 8, spec_at_or_below: int = 4, min_dwell_steps: int = 32
    ) -> None:
        if spec_at_or_below > plain_above:
            raise SettingsError(
                f"setting 'spec_at_or_below': value {spec_at_or_below!r} is not "
                f"allowed; expected an integer <= plain_above ({plain_above})"
            )
        self.plain_above = plain_above
        self.spec_at_or_below = spec_at_or_below
        self.min_dwell_steps = min_dwell_steps
        self._mode = Mode.SPEC
        self._last_switch_step: int | None = None

    def decide(self, view: StepView) -> Mode:
        mode = self._mode
        last = self._last_switch_step
        if last is not None and view.step - last < self.min_dwell_steps:
            return mode
        if mode is Mode.SPEC and view.batch_size > self.plain_above:
            mode = Mode.PLAIN
        elif mode is Mode.PLAIN and view.batch_size <= self.spec_at_or_below:
            mode = Mode.SPEC
        if mode is not self._mode:
            self._mode = mode
            self._last_switch_step = view.step
        return mode

    def observe(self, outcome: StepOutcome) -> None:
        return None


ALWAYS_SETTINGS = {
    "depth": Setting(
        int,
        0,
        "draft depth of every SPEC step, one of the server's --gate-depths "
        "(0: the configured depth)",
        0,
        MAX_DEPTH,
    ),
}

THRESHOLD_SETTINGS = {
    "plain_above": Setting(
        int, 8, "run PLAIN when the decode batch has more requests than this", 0
    ),
    "spec_at_or_below": Setting(
        int, 4, "resume SPEC when the batch has this many requests or fewer", 0
    ),
    "min_dwell_steps": Setting(
        int, 32, "decode steps to stay in a mode after switching", 0
    ),
}


@hookimpl
def eagle_gate_policies() -> list[PolicyFactory]:
    return [
        PolicyFactory(
            name="always",
            create=AlwaysSpec,
            description="speculate every step (SGLang's stock behaviour)",
            settings=ALWAYS_SETTINGS,
        ),
        PolicyFactory(
            name="never",
            create=NeverSpec,
            description="plain decode every step (no speculation)",
        ),
        PolicyFactory(
            name="threshold",
            create=Threshold,
            description="PLAIN above a batch size, SPEC again below a lower one",
            settings=THRESHOLD_SETTINGS,
        ),
    ]
