"""Patching SGLang: the functions the gate wraps, and the instrumentor that
wraps them.

Modelled on OpenTelemetry's instrumentors: each patch is a
:class:`PatchTarget` (a dotted function or method and the leading parameters
the gate relies on) and a ``wrapt`` wrapper. :class:`Instrumentor` installs
the wrappers when their target modules are imported (post-import hooks, at
once for modules already imported), is idempotent, and puts the originals
back on ``uninstrument()``. A target that is missing, inherited or has other
parameters raises :class:`GatePatchError`: the launch stops rather than run
a gate that is not in place (SGLang 0.5.23's own hook registry only logs
such failures).
"""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import wrapt

__all__ = ["GatePatchError", "PatchTarget", "Instrumentor"]


class GatePatchError(RuntimeError):
    """A patch target is missing or has an unexpected signature."""


@dataclass(frozen=True)
class PatchTarget:
    """A function or method the gate wraps, and the signature it expects."""

    module: str
    qualname: str
    #: the leading parameter names the adapter relies on, in order.
    params: tuple[str, ...]

    @property
    def dotted(self) -> str:
        return f"{self.module}.{self.qualname}"

    def owner_and_name(self, module: Any | None = None) -> tuple[Any, str]:
        if module is None:
            try:
                module = importlib.import_module(self.module)
            except Exception as exc:
                raise GatePatchError(
                    f"patch target {self.dotted}: module {self.module!r} does not "
                    f"import: {exc!r}"
                ) from exc
        owner: Any = module
        *path, name = self.qualname.split(".")
        for part in path:
            owner = getattr(owner, part, None)
            if owner is None:
                raise GatePatchError(
                    f"patch target {self.dotted}: {part!r} not found in {self.module}"
                )
        if name not in vars(owner) and not hasattr(owner, name):
            raise GatePatchError(f"patch target {self.dotted} does not exist")
        return owner, name

    def check(self, module: Any | None = None) -> None:
        """Raise GatePatchError unless the target exists with our signature."""
        owner, name = self.owner_and_name(module)
        func = inspect.getattr_static(owner, name)
        func = getattr(func, "__wrapped__", func)
        try:
            params = tuple(inspect.signature(func).parameters)
        except (TypeError, ValueError) as exc:
            raise GatePatchError(f"patch target {self.dotted}: {exc}") from exc
        if params[: len(self.params)] != self.params:
            raise GatePatchError(
                f"patch target {self.dotted} has parameters {params}; "
                f"eagle_gate expects them to start with {self.params}"
            )


class _GateWrapper(wrapt.FunctionWrapper):
    """Marks wrappers installed by eagle_gate (idempotence, removal)."""


class Instrumentor:
    """Installs wrapt wrappers when their target modules are imported.

    Modelled on OpenTelemetry's instrumentors: ``instrument()`` registers
    post-import hooks (applied at once for modules already imported) and is
    idempotent; ``uninstrument()`` restores the original functions.
    """

    def __init__(self, patches: Sequence[tuple[PatchTarget, Callable]]) -> None:
        self.patches = tuple(patches)
        self._enabled = False
        self._hooks_registered = False
        self._applied: dict[str, tuple[Any, str, Any]] = {}

    @property
    def targets(self) -> tuple[PatchTarget, ...]:
        """The wrapped targets, in order."""
        return tuple(target for target, _ in self.patches)

    @property
    def is_instrumented(self) -> bool:
        return self._enabled

    def applied(self) -> list[str]:
        return sorted(self._applied)

    def instrument(self) -> None:
        if self._enabled:
            return
        self._enabled = True
        if not self._hooks_registered:
            self._hooks_registered = True
            for target, wrapper in self.patches:
                wrapt.register_post_import_hook(
                    self._hook(target, wrapper), target.module
                )
        else:  # re-instrument after uninstrument: modules already imported
            for target, wrapper in self.patches:
                if target.module in sys.modules:
                    self._apply(target, wrapper, sys.modules[target.module])

    def _hook(self, target: PatchTarget, wrapper: Callable) -> Callable[[Any], None]:
        def on_import(module: Any) -> None:
            if self._enabled:
                self._apply(target, wrapper, module)

        return on_import

    def _apply(self, target: PatchTarget, wrapper: Callable, module: Any) -> None:
        target.check(module)
        owner, name = target.owner_and_name(module)
        current = vars(owner).get(name)
        if isinstance(current, _GateWrapper):
            self._applied.setdefault(target.dotted, (owner, name, current.__wrapped__))
            return
        if current is None:
            raise GatePatchError(
                f"patch target {target.dotted} is inherited, not defined on "
                f"{owner.__name__}; eagle_gate will not patch a base class by accident"
            )
        setattr(owner, name, _GateWrapper(current, wrapper))
        self._applied[target.dotted] = (owner, name, current)

    def uninstrument(self) -> None:
        self._enabled = False
        for owner, name, original in self._applied.values():
            if isinstance(vars(owner).get(name), _GateWrapper):
                setattr(owner, name, original)
        self._applied.clear()

    def require_applied(self, modules: Sequence[str] | None = None) -> None:
        """Import the target modules (all, or those named) and insist that
        every wrapper in them is in place; raise GatePatchError naming the
        first target that is not."""
        for target, wrapper in self.patches:
            if modules is not None and target.module not in modules:
                continue
            module = importlib.import_module(target.module)
            if target.dotted not in self._applied:
                # The hook did not run (instrument() not called): apply now.
                if not self._enabled:
                    raise GatePatchError(
                        f"eagle_gate is not instrumented; {target.dotted} unpatched"
                    )
                self._apply(target, wrapper, module)
