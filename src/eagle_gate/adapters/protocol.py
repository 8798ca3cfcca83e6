"""What the shared code asks of an SGLang version: the
:class:`SGLangAdapter` protocol.

Each supported version is a package (``eagle_gate.adapters.sglang_<version>``)
whose top level satisfies :class:`SGLangAdapter`, with a ``plain`` module
(:class:`VersionPlain`), a ``graphs`` module (:class:`VersionGraphs`), a
``dp`` module (:class:`VersionDP`) and a ``fixes`` module
(:class:`VersionFixes`). Everything outside the version packages (hooks,
activation, plain-graph capture, the launcher, doctor, the HTTP routes)
reaches a version only through the names declared here, so a new SGLang
version's knowledge goes into a new package that provides them and nothing
else needs to change. ``tests/unit/test_package_structure.py`` checks every
version package against these classes (names, callables, parameter names).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import argparse

    from eagle_gate.adapters.dp_vote import DPVote
    from eagle_gate.adapters.patching import Instrumentor, PatchTarget
    from eagle_gate.adapters.plain.step import PlainStep, PlainStepParts
    from eagle_gate.adapters.resolved import ResolvedSpec
    from eagle_gate.config import GateConfig

__all__ = [
    "SGLangAdapter",
    "VersionDP",
    "VersionFixes",
    "VersionGraphs",
    "VersionPlain",
]


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


class VersionDP(Protocol):
    """A version's ``dp`` module: the DP-attention vote in its MLP-sync
    gather (:mod:`eagle_gate.adapters.dp_vote`)."""

    #: whether this version gates DP attention (else refused at launch).
    GATES_DP_ATTENTION: bool
    #: this scheduler process's vote (activation hands it to the runtime).
    VOTE: DPVote
    #: ``(target, wrapper)`` pairs that put the vote into the gather
    #: (``hooks.version_patches`` installs them with the three wrappers).
    PATCHES: tuple[tuple[PatchTarget, Callable], ...]
    #: the gather row's columns before the vote, in SGLang's order.
    ROW_FIELDS: tuple[str, ...]

    def local_row(self, info: Any, device: Any, dtype: Any = None) -> Any:
        """This rank's gather row, its vote in the last column."""
        ...

    def fallback_row(self, info: Any, device: Any, dtype: Any = None) -> Any:
        """An inactive rank's gather row, voting idle."""
        ...


class VersionFixes(Protocol):
    """A version's ``fixes`` module: the SGLang defects of that version the
    gate cures where the installed code has them (possibly none)."""

    #: the fixes, in the order they are judged (each has ``name``, ``summary``).
    FIXES: tuple[Any, ...]

    def judge(self) -> dict[str, bool]:
        """Fix name -> whether the installed code has the defect (doctor)."""
        ...

    def apply_fixes(self) -> list[str]:
        """Apply the needed fixes in this process; their names."""
        ...

    def applied(self) -> list[str]:
        """The fixes applied in this process (status, startup log)."""
        ...


class SGLangAdapter(Protocol):
    """One SGLang version family, as the shared code sees it (the version
    package's top level)."""

    #: the versions this adapter is written against (the first is reported).
    SGLANG_VERSIONS: tuple[str, ...]
    #: the adapter's name in logs, status and metrics (e.g. sglang-0.5.23).
    NAME: str
    #: the modules the scheduler-side patches live in (the resolver's and
    #: ``Scheduler.__init__``'s): insisted on even where the gate is idle.
    SCHEDULER_MODULE: str
    RESOLVER_MODULE: str
    #: the module of the EAGLE worker the gate wraps.
    WORKER_MODULE: str
    #: what ``hooks.version_patches`` wraps: the worker's
    #: ``forward_batch_generation`` (and the name of its batch parameter),
    #: the scheduler's spec-v2 result resolver and ``Scheduler.__init__``.
    WORKER_TARGET: PatchTarget
    WORKER_BATCH_PARAM: str
    RESOLVER_TARGET: PatchTarget
    SCHEDULER_INIT_TARGET: PatchTarget
    #: the wrappers on this version's worker, resolver and scheduler init.
    INSTRUMENTOR: Instrumentor
    #: every patch target the adapter relies on (checked by doctor and for
    #: untested versions), wrapped or not.
    TARGETS: tuple[PatchTarget, ...]
    #: environment variables this version reads while resolving its
    #: arguments (doctor resolves with them as the launcher leaves them).
    LAUNCH_ENV_KEYS: tuple[str, ...]
    #: whether this SGLang loads ``sglang.srt.plugins`` entry points (then
    #: the stock launcher can gate, through ``eagle_gate.sglang_plugin``).
    HAS_SGLANG_PLUGINS: bool
    #: the version's plain step, plain-step graphs, DP vote and fixes.
    plain: VersionPlain
    graphs: VersionGraphs
    dp: VersionDP
    fixes: VersionFixes
    #: per-batch SPEC depth (``--gate-depths``): the version's module with
    #: ``launch_args(server_args, setting)``, ``operators_note(server_args)``
    #: (the operator's own adaptive flag) and ``install(runtime, scheduler,
    #: setting)``, or None where depths cannot change (0.5.9).
    depths: Any

    def _instrument(self) -> None: ...

    def _uninstrument(self) -> None: ...

    def launch_environment(self, requested: argparse.Namespace) -> dict[str, str]:
        """Environment the launcher sets before SGLang parses anything, given
        the raw flags (``resolved.requested_flags``)."""
        ...

    def load_sglang_plugins(self) -> None:
        """Run SGLang's plugin loading in the launcher (a no-op without
        ``HAS_SGLANG_PLUGINS``)."""
        ...

    def api_keys(self, http_server: Any) -> tuple[str | None, str | None] | None:
        """SGLang's ``(api_key, admin_api_key)`` from its HTTP server module
        (``sglang.srt.entrypoints.http_server``), None if unknown."""
        ...

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
        depths: str = "off",
    ) -> tuple[bool, str]:
        """``(gated, state)`` for this resolved setup under the gate's draft
        sync and ``--gate-depths`` setting, or GateRefused."""
        ...

    def check_server_args(
        self,
        server_args: Any,
        environ: dict | None = None,
        *,
        draft_sync: str | None = None,
        depths: str = "off",
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
