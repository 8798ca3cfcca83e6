"""Fixes for SGLang 0.5.23 bugs that gated servers meet: none.

The one fix the gate carries for 0.5.9 (``logprob-aux-hidden-states``,
:mod:`eagle_gate.adapters.sglang_0_5_9.fixes`: ``LogitsProcessor.
_get_pruned_states`` leaving ``aux_pruned_states`` None on a prefill with
input logprobs, so EAGLE-3's hidden-state capture dies in ``torch.cat``) is
fixed upstream in 0.5.23: its input-logprob branch slices the aux hidden
states with the same per-request rows as the hidden states (packed or as a
list), and 0.5.9's own behaviour probe finds no defect in 0.5.23's code.

The module keeps the version's ``fixes`` API (:class:`~eagle_gate.adapters.
protocol.VersionFixes`) so the launcher, activation and doctor ask every
version the same way.
"""

from __future__ import annotations

from typing import Any

__all__ = ["FIXES", "apply_fixes", "applied", "judge"]

#: every fix this adapter carries (none).
FIXES: tuple[Any, ...] = ()


def judge() -> dict[str, bool]:
    """Whether the installed SGLang has each fix's defect: no fixes, so {}."""
    return {}


def apply_fixes() -> list[str]:
    """Nothing to apply on 0.5.23; returns the (empty) applied list."""
    return applied()


def applied() -> list[str]:
    """The fixes applied in this process: none on 0.5.23."""
    return []
