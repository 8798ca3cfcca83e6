"""What the shared adapter code asks of an SGLang version: the
:class:`SGLangAdapter` protocol.

Each supported version is a package (``eagle_gate.adapters.sglang_<version>``)
whose top level satisfies :class:`SGLangAdapter`, with a ``plain`` module
(:class:`VersionPlain`) and a ``graphs`` module (:class:`VersionGraphs`); the
shared modules (activation, plain-graph capture, the launcher and doctor)
reach a version only through these names. A new SGLang version's knowledge
goes into a new package that provides them; nothing else should need to
change.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from eagle_gate.adapters.patching import Instrumentor, PatchTarget
    from eagle_gate.adapters.plain.step import PlainStep, PlainStepParts
    from eagle_gate.adapters.resolved import ResolvedSpec
    from eagle_gate.config import GateConfig

__all__ = ["SGLangAdapter"]


class VersionPlain(Protocol):
    """A version's ``plain`` module: its plain step (plain/step.py)."""

    #: what the shared plain step asks of this version.
    PLAIN_PARTS: PlainStepParts

    def plain_step_blocker(self, batch: Any) -> str | None:
        """Why this decode batch cannot take the plain step (None: it can)."""
        ...

    def make_plain_step(self, draft_sync: str, graphs: Any = None) -> PlainStep: ...


class VersionGraphs(Protocol):
    """A version's ``graphs`` module: its part of the plain step's DECODE
    CUDA graphs (plain/capture.py builds them)."""

    #: where the target's model runner keeps its (verify-shaped) graph runner.
    GRAPH_ATTR: str
    #: the graph-side patch targets (checked, not wrapped).
    TARGETS: tuple[PatchTarget, ...]

    def version_blockers(self, model_runner: Any, server_args: Any) -> str | None:
        """This version's reason the plain step gets no graphs, or None."""
        ...

    def verify_graph_mib(self, model_runner: Any) -> float: ...

    def build_plain_backend(self, model_runner: Any) -> Any: ...

    def build_plain_runner(
        self, model_runner: Any, backend: Any, cls: Any = None
    ) -> Any: ...


class SGLangAdapter(Protocol):
    """One SGLang version family, as the shared code sees it (the version
    package's top level)."""

    #: the versions this adapter is written against (the first is reported).
    SGLANG_VERSIONS: tuple[str, ...]
    #: the adapter's name in logs, status and metrics ("sglang-0.5.23").
    NAME: str
    #: the modules the scheduler-side patches live in (the resolver's and
    #: ``Scheduler.__init__``'s): insisted on even where the gate is idle.
    SCHEDULER_MODULE: str
    RESOLVER_MODULE: str
    #: the wrappers on this version's worker, resolver and scheduler init.
    INSTRUMENTOR: Instrumentor
    #: every patch target the adapter relies on (checked by doctor and for
    #: untested versions), wrapped or not.
    TARGETS: tuple[PatchTarget, ...]
    #: the version's plain step and its plain-step graphs.
    plain: VersionPlain
    graphs: VersionGraphs

    def _instrument(self) -> None: ...

    def _uninstrument(self) -> None: ...

    def resolve_spec(self, server_args: Any, requested: Any = None) -> ResolvedSpec:
        """The speculative setup as this version's own resolution leaves it."""
        ...

    def resolve_argv(self, argv: list[str]) -> tuple[Any, ResolvedSpec]:
        """SGLang's ``prepare_server_args`` on ``argv``, and its resolved view."""
        ...

    def check_spec(
        self,
        spec: ResolvedSpec,
        environ: dict | None = None,
        *,
        draft_sync: str | None = None,
    ) -> tuple[bool, str]:
        """``(gated, state)`` for this resolved setup, or GateRefused."""
        ...

    def check_server_args(
        self,
        server_args: Any,
        environ: dict | None = None,
        *,
        draft_sync: str | None = None,
    ) -> tuple[bool, str]:
        """:meth:`check_spec` of ``server_args``'s resolved view."""
        ...

    def check_scheduler(self, scheduler: Any, config: GateConfig) -> None:
        """Refusals that need the built scheduler (GateRefused)."""
        ...

    #: a request's committed length from the scheduler's CPU bookkeeping.
    committed_len: Callable[[Any], int]

    def activate_in_scheduler(self, scheduler: Any, config: Any = None) -> Any: ...

    def serve(self, server_args: Any) -> None:
        """Run SGLang's server (the launcher's last step)."""
        ...
