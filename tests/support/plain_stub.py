"""A plain step for runtime tests that never run one: its blocker never
blocks, so a PLAIN decision runs PLAIN (what an adapter's plain step does for
a batch it can serve)."""

from __future__ import annotations

from typing import Any


class OpenPlainStep:
    before_spec = None

    @staticmethod
    def blocker(batch: Any) -> None:
        return None

    def run(self, worker: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("this test never runs the plain step")


OPEN_PLAIN_STEP = OpenPlainStep()
