"""Run a script that exports the gate's metrics in Prometheus multiprocess
mode (as SGLang's schedulers do), in a fresh process, and return the lines of
the scrape it prints.

A fresh process because prometheus_client picks its multiprocess value class
when it is first imported, from ``PROMETHEUS_MULTIPROC_DIR``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

#: appended to every probe script: collect the multiprocess directory, print it.
SCRAPE = r"""
from prometheus_client import CollectorRegistry, generate_latest, multiprocess
registry = CollectorRegistry()
multiprocess.MultiProcessCollector(registry)
print(generate_latest(registry).decode())
"""


def scrape_text(multiproc_dir: Path, script: str, *args: str) -> str:
    """Run ``script`` (which exports through ``GateMetrics``) with ``args``,
    then scrape; return the exposition text."""
    env = dict(os.environ, PROMETHEUS_MULTIPROC_DIR=str(multiproc_dir))
    out = subprocess.run(
        [sys.executable, "-c", script + SCRAPE, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def scrape_lines(multiproc_dir: Path, script: str, *args: str) -> set[str]:
    """:func:`scrape_text`, as a set of lines."""
    return set(scrape_text(multiproc_dir, script, *args).splitlines())
