"""Which SPEC depths a gated server may run (``--gate-depths``, issue #33).

No SGLang, no torch. A depth is a SPEC step's number of draft steps ``s``
(``s + 1`` tokens verified per request, a chain); PLAIN is depth 0 in the
gate's sense, a true target decode, and never appears in a depth set.

The setting is ``off`` (the configured SPEC step only: today's binary gate),
``auto`` (1, half the configured depth rounded up, and the configured depth
``k``: never deeper than what the operator sized the server for) or a list
like ``1,2,3`` (the configured depth is always added: SGLang builds its state
at startup anyway). Only SGLang 0.5.23 can change the depth per batch (its
adaptive runtime states, ``adapters/sglang_0_5_23/depths.py``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = [
    "DEPTHS_OFF",
    "DEPTHS_AUTO",
    "MAX_DEPTH",
    "parse_depths",
    "depth_set",
    "pinned_depth_refusal",
]

DEPTHS_OFF = "off"
DEPTHS_AUTO = "auto"
#: deeper chains than this are not a per-batch choice anyone measured.
MAX_DEPTH = 16


def parse_depths(key: str, value: object) -> str:
    """The setting's canonical text: ``off``, ``auto`` or ascending depths
    ``"1,2,3"``; raises ``ValueError`` naming the value and what is allowed."""
    if isinstance(value, (list, tuple)):  # a TOML array
        value = ",".join(map(str, value))
    text = str(value).strip().lower()
    if text in (DEPTHS_OFF, DEPTHS_AUTO):
        return text
    try:
        depths = sorted({int(p, 10) for p in text.split(",") if p.strip()})
    except ValueError:
        depths = []
    if not depths or depths[0] < 1 or depths[-1] > MAX_DEPTH:
        raise ValueError(
            f"{key}: value {value!r} is not allowed; expected off, auto or draft "
            f"depths from 1 to {MAX_DEPTH} like 1,2,3 (PLAIN, depth 0, is always "
            "there)"
        )
    return ",".join(map(str, depths))


def depth_set(setting: str, configured: int) -> tuple[int, ...] | None:
    """The SPEC depths a server whose configured SPEC step drafts
    ``configured`` steps runs under ``setting`` (a :func:`parse_depths`
    text), ascending; None where that is the configured depth alone (off, or
    nothing else to choose)."""
    if setting == DEPTHS_OFF:
        return None
    k = max(1, int(configured))
    if setting == DEPTHS_AUTO:
        depths = {1, math.ceil(k / 2), k}
    else:
        depths = {int(d) for d in setting.split(",")} | {k}
    out = tuple(sorted(depths))
    return out if len(out) > 1 else None


def pinned_depth_refusal(
    policy: str, settings: Mapping[str, Any], setting: str, configured: int
) -> str | None:
    """Why the built-in ``always`` policy's ``depth`` setting cannot run on
    a server whose depths are ``setting`` around ``configured`` (None where
    it can): a depth outside the server's set would be a policy error on
    every step, so the launcher refuses it before a model loads. A server
    without ``--gate-depths`` ignores the setting (the policy contract)."""
    if policy != "always":
        return None
    pinned = int(settings.get("depth", 0) or 0)
    depths = depth_set(setting, configured)
    if not pinned or depths is None or pinned in depths:
        return None
    listed = ",".join(map(str, depths))
    return (
        f"policy always: setting depth={pinned} is not one of this server's "
        f"SPEC depths {listed} (--gate-depths {setting}, configured "
        f"{max(1, int(configured))}); expected 0 (the configured depth) or one "
        f"of {listed}, or add {pinned} to --gate-depths"
    )
