"""Test hooks of the plain step: the one place where a test environment
reaches into the gate, instead of rebinding the gate's functions.

Nothing in the package registers a hook. CI's ``ci/cpu_spec`` does, in its
test environments only (switches ``EAGLE_GATE_CI_PLAIN_GRAPHS=construct``
and ``EAGLE_GATE_CI_PLAIN_TEMPERATURE_FILE``, docs/development.md). Both hooks
act once, when the gate builds its objects at scheduler start, never per
step: with none registered the gate builds exactly the objects it builds
without this module, and its steps run the same code.

* :func:`on_plain_graphs`: ``callback(graphs, *, version, scheduler, config,
  gated)`` runs after
  :func:`~eagle_gate.adapters.plain.capture.plain_graphs_for_scheduler`
  decided the plain step's DECODE graphs (``graphs``: the
  :class:`~eagle_gate.adapters.plain.graphs.PlainGraphs` it returns;
  ``version``: the version's graphs module). A callback may record what it
  checked on ``graphs.report`` (shown in the gate's status); an exception
  leaves the scheduler's start as any setup error does.
* :func:`wrap_plain_step`: ``wrapper(step) -> step``, where ``step`` has the
  signature of :func:`~eagle_gate.adapters.plain.step.plain_step`.
  :func:`~eagle_gate.adapters.plain.step.make_plain_step` builds its step
  over the wrapped function, once; wrappers registered later apply to plain
  steps built later.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = [
    "clear",
    "on_plain_graphs",
    "run_plain_graphs_hooks",
    "wrap_plain_step",
    "wrapped_plain_step",
]

PlainGraphsHook = Callable[..., None]
PlainStepWrapper = Callable[[Callable[..., Any]], Callable[..., Any]]

#: registered ``on_plain_graphs`` callbacks, in order (empty in production).
PLAIN_GRAPHS_HOOKS: list[PlainGraphsHook] = []
#: registered ``wrap_plain_step`` wrappers, in order (empty in production).
PLAIN_STEP_WRAPPERS: list[PlainStepWrapper] = []


def on_plain_graphs(callback: PlainGraphsHook) -> PlainGraphsHook:
    """Call ``callback(graphs, *, version, scheduler, config, gated)`` for
    every plain graph set decided from now on (see the module doc)."""
    PLAIN_GRAPHS_HOOKS.append(callback)
    return callback


def wrap_plain_step(wrapper: PlainStepWrapper) -> PlainStepWrapper:
    """Build every plain step from now on over ``wrapper(plain_step)``; the
    first registered wrapper is innermost (see the module doc)."""
    PLAIN_STEP_WRAPPERS.append(wrapper)
    return wrapper


def clear() -> None:
    """Forget every registered hook (for tests of this module)."""
    PLAIN_GRAPHS_HOOKS.clear()
    PLAIN_STEP_WRAPPERS.clear()


def run_plain_graphs_hooks(
    graphs: Any, *, version: Any, scheduler: Any, config: Any, gated: bool
) -> None:
    """Run the ``on_plain_graphs`` callbacks on ``graphs`` (none: nothing)."""
    for callback in tuple(PLAIN_GRAPHS_HOOKS):
        callback(
            graphs, version=version, scheduler=scheduler, config=config, gated=gated
        )


def wrapped_plain_step(step: Callable[..., Any]) -> Callable[..., Any]:
    """``step`` under every registered wrapper; ``step`` itself when none."""
    for wrapper in tuple(PLAIN_STEP_WRAPPERS):
        step = wrapper(step)
    return step
