"""Policy discovery: a pluggy manager over the ``eagle_gate`` entry points."""

from __future__ import annotations

import functools

import pluggy

from eagle_gate import hookspecs
from eagle_gate.policy import PolicyFactory

__all__ = ["PolicyNotFound", "PluginError", "plugin_manager", "available_policies"]


class PluginError(RuntimeError):
    """A plugin could not be loaded or offers something invalid."""


class PolicyNotFound(LookupError):
    """The requested policy name is not offered by any installed plugin."""


@functools.lru_cache(maxsize=1)
def plugin_manager() -> pluggy.PluginManager:
    """The process-wide plugin manager, with every installed plugin loaded."""
    pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    try:
        pm.load_setuptools_entrypoints(hookspecs.PROJECT_NAME)
    except Exception as exc:  # a broken third-party plugin must be named
        raise PluginError(f"loading an eagle_gate plugin failed: {exc!r}") from exc
    if pm.get_plugin("builtin") is None:
        # Running from a source tree without installed metadata: the built-ins
        # still register under the name their entry point gives them.
        from eagle_gate import policies

        pm.register(policies, name="builtin")
    return pm


def available_policies(pm: pluggy.PluginManager | None = None) -> dict:
    """Map policy name -> PolicyFactory over all registered plugins."""
    pm = pm or plugin_manager()
    found: dict[str, PolicyFactory] = {}
    owners: dict[str, str] = {}
    for impl in pm.hook.eagle_gate_policies.get_hookimpls():
        owner = pm.get_name(impl.plugin) or repr(impl.plugin)
        for factory in impl.function() or []:
            if not isinstance(factory, PolicyFactory):
                raise PluginError(
                    f"plugin {owner!r} returned {factory!r} from eagle_gate_policies;"
                    " expected eagle_gate.PolicyFactory objects"
                )
            if factory.name in found:
                raise PluginError(
                    f"policy name {factory.name!r} is offered by both plugin "
                    f"{owners[factory.name]!r} and plugin {owner!r}"
                )
            found[factory.name] = factory
            owners[factory.name] = owner
    return found


def get_policy_factory(name: str) -> PolicyFactory:
    """Look a policy up by name, or raise listing the available ones."""
    policies = available_policies()
    try:
        return policies[name]
    except KeyError:
        raise PolicyNotFound(
            f"unknown policy {name!r}; available: {', '.join(sorted(policies))}"
        ) from None
