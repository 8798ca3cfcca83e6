"""A third-party eagle_gate policy in one file: ``alternate``.

It switches between SPEC and PLAIN every ``period`` decode steps. Useless for
throughput, useful for testing: it forces mode switches on a live server (the
GPU validation script uses it to check outputs across switches).
"""

import eagle_gate
from eagle_gate import Mode, PolicyFactory, Setting


class Alternate:
    name = "alternate"

    def __init__(self, period: int = 4, start: str = "spec") -> None:
        self.period = period
        self.first = Mode.SPEC if start == "spec" else Mode.PLAIN
        self.other = Mode.PLAIN if self.first is Mode.SPEC else Mode.SPEC

    def decide(self, view: eagle_gate.StepView) -> Mode:
        return self.first if (view.step // self.period) % 2 == 0 else self.other

    def observe(self, outcome: eagle_gate.StepOutcome) -> None:
        pass


@eagle_gate.hookimpl
def eagle_gate_policies():
    return [
        PolicyFactory(
            name="alternate",
            create=Alternate,
            description="switch between SPEC and PLAIN every `period` steps",
            settings={
                "period": Setting(int, 4, "decode steps per mode", minimum=1),
                "start": Setting(
                    str, "spec", "mode of the first period", choices=("spec", "plain")
                ),
            },
        )
    ]
