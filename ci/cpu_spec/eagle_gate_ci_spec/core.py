"""What every part of ``eagle_gate_ci_spec`` shares: the switches (read from
the environment once, at import), the per-process call counters, the log, the
installed SGLang version and the ``sgl_kernel`` stand-in ops' installer.

Imports nothing heavy: the package is imported by every Python process of a
CI environment (``eagle_gate_ci_spec.pth``).
"""

from __future__ import annotations

import os
import sys

ENABLED = os.environ.get("EAGLE_GATE_CI_SPEC") == "1"
DP = os.environ.get("EAGLE_GATE_CI_DP") == "1"
LOG = os.environ.get("EAGLE_GATE_CI_SPEC_LOG") == "1"
FORCE_OVERLAP = os.environ.get("EAGLE_GATE_CI_FORCE_OVERLAP") == "1"
CPU_SEQLENS = {"1": True, "0": False}.get(
    os.environ.get("EAGLE_GATE_CI_CPU_SEQLENS", "")
)
PLAIN_GRAPHS = os.environ.get("EAGLE_GATE_CI_PLAIN_GRAPHS", "")
PLAIN_TEMPERATURE_FILE = os.environ.get("EAGLE_GATE_CI_PLAIN_TEMPERATURE_FILE", "")
#: SGLang's Triton attention kernels on CPU: ``torch`` (the stand-ins of
#: ``attention``) or ``triton`` (the real kernels, interpreted).
ATTENTION = os.environ.get("EAGLE_GATE_CI_ATTENTION", "torch")
ATTENTION_CHOICES = ("torch", "triton")

STUB_MARK = "eagle-gate-cpu-stub"  # in the stand-in sgl_kernel's __version__
PREFIX = "[eagle_gate_ci_spec]"

_CALLS: dict[str, int] = {}
_INSTALLED: list[str] = []  # what install() set up in this process


def calls() -> dict[str, int]:
    """Calls of each stand-in in this process so far."""
    return dict(_CALLS)


def installed() -> list[str]:
    """Names of the stand-ins and patches installed in this process."""
    return list(_INSTALLED)


def _log(msg: str) -> None:
    if LOG:
        print(f"{PREFIX} pid {os.getpid()} {msg}", file=sys.stderr, flush=True)


def _count(name: str) -> None:
    n = _CALLS.get(name, 0) + 1
    _CALLS[name] = n
    if n == 1:
        _log(f"first call: {name}")


def _applied(what: str) -> None:
    _INSTALLED.append(what)
    _log(f"patched {what}")


def _set_sgl_kernel_ops(mod, ops: dict) -> None:
    if STUB_MARK not in str(getattr(mod, "__version__", "")):
        _log(f"sgl_kernel {getattr(mod, '__version__', '?')} is real: left alone")
        return
    for name, fn in ops.items():
        setattr(mod, name, fn)
    _applied(f"sgl_kernel stand-in ops: {', '.join(sorted(ops))}")


def sglang_version() -> str | None:
    from importlib import metadata

    try:
        return metadata.version("sglang")
    except metadata.PackageNotFoundError:
        return None
