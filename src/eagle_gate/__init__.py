"""eagle_gate: speculate when it pays, decode plainly when it does not.

A plugin for stock SGLang that decides, before every decode batch of an EAGLE
speculative server, whether to run draft + verify (SPEC) or one plain target
decode (PLAIN). The public API is the policy contract below; see README.md.
"""

from eagle_gate.hookspecs import hookimpl, hookspec
from eagle_gate.policy import Mode, Policy, PolicyFactory, StepOutcome, StepView
from eagle_gate.settings import Setting, SettingsError

__version__ = "0.1.0"

__all__ = [
    "Mode",
    "Policy",
    "PolicyFactory",
    "Setting",
    "SettingsError",
    "StepOutcome",
    "StepView",
    "hookimpl",
    "hookspec",
]
