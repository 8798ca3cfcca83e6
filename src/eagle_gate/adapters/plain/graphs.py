"""The plain step's own DECODE CUDA graphs at run time (docs/plain-graphs.md):
the per-process record of what was captured, which path a plain step takes,
and the forward that binds the plain graphs for one step.

With speculation on, the target's CUDA graphs are captured for TARGET_VERIFY
and their ``can_run`` checks do not look at the forward mode, so a plain
DECODE step must run through a graph set of its own or eagerly. Building that
set at start is :mod:`eagle_gate.adapters.plain.capture`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from eagle_gate.adapters.plain.tensors import eager_target, swap_attrs

__all__ = [
    "PlainGraphs",
    "select_plain_path",
    "draft_extend_path",
    "predicted_draft_extend_path",
    "plain_decode_pins",
    "plain_target_forward",
]


@dataclass
class PlainGraphs:
    """The plain step's DECODE CUDA-graph set of one scheduler process (one TP
    rank): a second target attention backend and a DECODE graph runner bound
    to it, or the reason there is none (then plain steps run eagerly)."""

    setting: str = "auto"
    #: "captured", "off" (never tried) or "failed" (tried, dropped).
    state: str = "off"
    reason: str | None = None
    backend: Any = None
    runner: Any = None
    capture_bs: tuple[int, ...] = ()
    max_bs: int = 0
    disable_padding: bool = False
    backend_mib: float | None = None
    graphs_mib: float | None = None
    total_mib: float | None = None
    capture_s: float | None = None
    attention_backend: str | None = None
    #: called with ``(path, reason)`` for every plain step; the runtime's
    #: ``count_plain_path`` once the gate is active.
    on_path: Callable[[str, str | None], None] | None = None
    #: called with the path ("graph" or "eager") of every draft extend the
    #: plain step runs (eager sync, lazy catch-up); the runtime's
    #: ``count_draft_extend`` once the gate is active.
    on_draft_extend: Callable[[str], None] | None = None
    #: checks a test build recorded (CI's ``EAGLE_GATE_CI_PLAIN_GRAPHS``);
    #: None otherwise.
    report: dict[str, Any] | None = None

    @property
    def captured(self) -> bool:
        return self.state == "captured" and self.runner is not None

    def count(self, path: str, reason: str | None = None) -> None:
        if self.on_path is not None:
            self.on_path(path, reason)

    def count_draft_extend(self, path: str) -> None:
        if self.on_draft_extend is not None:
            self.on_draft_extend(path)

    def status(self) -> dict[str, Any]:
        """The ``plain_graphs`` block of the gate's status (JSON-able)."""
        return {
            "setting": self.setting,
            "state": self.state,
            "reason": self.reason,
            "capture_bs": list(self.capture_bs),
            "max_bs": self.max_bs,
            "disable_padding": self.disable_padding,
            "memory_mib": self.total_mib,
            "backend_mib": self.backend_mib,
            "graphs_mib": self.graphs_mib,
            "capture_s": self.capture_s,
            "attention_backend": self.attention_backend,
            "report": self.report,
        }


def select_plain_path(graphs: PlainGraphs | None, bs: int) -> tuple[str, str | None]:
    """``("graph", None)`` when a plain step of ``bs`` requests can replay the
    plain DECODE graphs, else ``("eager", reason)`` with the first reason that
    applies (CPU fields only: no device synchronisation)."""
    if graphs is None or not graphs.captured:
        return "eager", "graphs_off"
    if bs > graphs.max_bs:
        return "eager", "bs_above_max"
    if graphs.disable_padding and bs not in graphs.capture_bs:
        return "eager", "bs_not_captured"
    return "graph", None


def draft_extend_path(runner: Any, bs: int, *, mlp_sync_ok: bool = True) -> str:
    """``"graph"`` when SGLang's ``_draft_extend_for_decode`` will replay its
    own draft-extend CUDA graph for a batch of ``bs`` requests, else
    ``"eager"`` (docs/plain-graphs.md, "What runs where", the draft side).

    ``runner``: the draft worker's ``cuda_graph_runner_for_draft_extend``
    (None where SGLang captured none: CPU, graphs disabled, a draft backend
    without draft-extend graphs). The test is the one SGLang's ``can_run``
    (0.5.9) and ``can_run_graph`` (0.5.23) apply on a server without DP
    attention: ``bs <= max_bs``, or, with
    ``--disable-cuda-graph-padding``, ``bs`` among the captured sizes; where
    the runner needs MLP sync, also the batch's own graph flag
    (``mlp_sync_ok``, which the version's adapter reads). What only one
    version checks (0.5.23's capture width) is the adapter's to add.

    A prediction for status and metrics, so it reads CPU-side integers only
    (no device synchronisation) and never raises: anything it cannot read
    counts as "eager".
    """
    if runner is None:
        return "eager"
    try:
        if runner.disable_padding:
            fits = bs in runner.capture_bs
        else:
            fits = bs <= runner.max_bs
        if fits and runner.require_mlp_sync:
            fits = mlp_sync_ok
        return "graph" if fits else "eager"
    except Exception:
        return "eager"


def predicted_draft_extend_path(
    worker: Any, batch: Any, *, mlp_sync_flag: str, check_width: bool
) -> str:
    """The path ("graph" or "eager") SGLang's ``_draft_extend_for_decode``
    takes for ``batch``, read off the draft worker's
    ``cuda_graph_runner_for_draft_extend`` with :func:`draft_extend_path`.
    A version names the batch's MLP-sync graph flag (``mlp_sync_flag``) and
    whether its runner first refuses another per-request width than its
    ``captured_req_width`` (``check_width``). CPU fields only; never raises."""
    try:
        draft = worker.draft_worker
        runner = draft.cuda_graph_runner_for_draft_extend
        if (
            check_width
            and runner is not None
            and int(runner.captured_req_width)
            != int(draft.speculative_num_draft_tokens)
        ):
            return "eager"
        bs = int(batch.seq_lens.shape[0])
        sync_ok = bool(getattr(batch, mlp_sync_flag, False))
    except Exception:
        return "eager"
    return draft_extend_path(runner, bs, mlp_sync_ok=sync_ok)


_PLAIN_DECODE_PINS: Any = None


def plain_decode_pins() -> type:
    """A mixin for SGLang's decode graph runners (both versions) that pins
    what their constructors set for a speculative target: DECODE instead of
    TARGET_VERIFY, a hidden-state capture of at least LAST (a LAST graph
    serves NULL and LAST requests; FULL never reaches the plain step), and no
    spec info. Properties whose setters ignore (or raise to LAST) the
    constructor's assignments, so every reader sees the pinned values from
    the start. Put it first in the bases. Built on first use (SGLang's enums)."""
    global _PLAIN_DECODE_PINS
    if _PLAIN_DECODE_PINS is not None:
        return _PLAIN_DECODE_PINS
    from sglang.srt.model_executor.forward_batch_info import (
        CaptureHiddenMode,
        ForwardMode,
    )

    class PlainDecodePins:
        @property
        def capture_forward_mode(self):
            return ForwardMode.DECODE

        @capture_forward_mode.setter
        def capture_forward_mode(self, value):
            pass  # the constructor's TARGET_VERIFY

        @property
        def capture_hidden_mode(self):
            return self.__dict__.get("_eagle_gate_hidden", CaptureHiddenMode.LAST)

        @capture_hidden_mode.setter
        def capture_hidden_mode(self, value):
            self.__dict__["_eagle_gate_hidden"] = max(
                CaptureHiddenMode(value), CaptureHiddenMode.LAST
            )

        def get_spec_info(self, num_tokens):
            return None

    _PLAIN_DECODE_PINS = PlainDecodePins
    return PlainDecodePins


def plain_target_forward(
    model_runner: Any,
    graph_attr: str,
    graphs: PlainGraphs | None,
    bs: int,
    forward: Callable[[], Any],
) -> tuple[Any, bool]:
    """The plain step's target forward (docs/plain-graphs.md, "What runs where").

    Graph path: bind the plain attention backend and the plain DECODE runner
    (``graph_attr``: where the version keeps the target's graph runner) for
    this forward only, as SGLang's own adaptive and UNO workers swap them;
    SGLang's dispatch then replays or, if its own check refuses, runs eagerly
    on the plain backend ("declined"). Eager path: today's
    :class:`eager_target`. Returns ``(out, ran_graph)``; counts the path."""
    path, reason = select_plain_path(graphs, bs)
    if path == "graph":
        with swap_attrs(
            model_runner, **{"attn_backend": graphs.backend, graph_attr: graphs.runner}
        ):
            out = forward()
        ran_graph = bool(getattr(out, "can_run_cuda_graph", False))
        if not ran_graph:
            path, reason = "eager", "declined"
    else:
        with eager_target(model_runner, graph_attr):
            out = forward()
        ran_graph = False
    if graphs is not None:
        graphs.count(path, reason)
    return out, ran_graph
