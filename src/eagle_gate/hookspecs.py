"""pluggy hook specifications: the documented plugin contract.

A plugin is a module (or object) registered under the ``eagle_gate``
entry-point group that implements one or more of these hooks::

    # pyproject.toml of your package
    [project.entry-points.eagle_gate]
    my_policies = "my_package.gate_plugin"

    # my_package/gate_plugin.py
    import eagle_gate

    @eagle_gate.hookimpl
    def eagle_gate_policies():
        return [eagle_gate.PolicyFactory(name="mine", create=MyPolicy, ...)]

The built-in policies are registered exactly the same way (see
``eagle_gate.policies`` and eagle_gate's own pyproject.toml).
"""

from __future__ import annotations

import pluggy

PROJECT_NAME = "eagle_gate"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec
def eagle_gate_policies() -> list:
    """Return the :class:`eagle_gate.PolicyFactory` objects this plugin offers.

    Policy names must be unique across all installed plugins; a clash stops
    the launch naming both plugins.
    """
