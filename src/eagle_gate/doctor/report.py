"""The rows of ``eagle-gate doctor``'s report, and the table a person reads."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass

from eagle_gate import __version__

__all__ = ["Check", "format_table"]


@dataclass(frozen=True)
class Check:
    """One row of the report. ``fix`` says what to do when ``ok`` is False;
    ``source`` says where a setting came from (cli, env, file, default)."""

    name: str
    ok: bool
    detail: str
    fix: str = ""
    source: str | None = None


def format_table(checks: Sequence[Check]) -> str:
    """The human report: one row per check, then each problem with its fix."""
    width = min(max(len(c.name) for c in checks), 44)  # longer names overflow
    lines = [
        f"eagle-gate doctor (eagle_gate {__version__}, Python {sys.version.split()[0]})"
    ]
    for c in checks:
        detail = c.detail  # a problem's full text follows the table
        if not c.ok and len(detail) > 100:
            detail = detail[:97] + "..."
        lines.append(f"  {'ok' if c.ok else 'FAIL':<4}  {c.name:<{width}}  {detail}")
    problems = [c for c in checks if not c.ok]
    if not problems:
        lines.append(f"all {len(checks)} checks ok")
        return "\n".join(lines)
    lines.append(f"{len(problems)} problem{'s' if len(problems) > 1 else ''}:")
    for c in problems:
        lines.append(f"  {c.name}: {c.detail}")
        lines.append(f"    fix: {c.fix}")
    return "\n".join(lines)
