"""Timings of the slow test groups (real servers), printed at the end of the
run by ``conftest.pytest_terminal_summary`` so CI shows where its time goes."""

from __future__ import annotations

LINES: list[str] = []


def note(line: str) -> None:
    LINES.append(line)
