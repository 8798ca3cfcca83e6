"""Choose the adapter for the installed SGLang.

Each supported SGLang version family has exactly one adapter package
(``sglang_<version>``) holding all knowledge of that version; what every
version shares lives beside them (see docs/architecture.md). Any other
version is refused with the supported list, unless the operator opts in
(``--gate-allow-untested-sglang`` / ``EAGLE_GATE_ALLOW_UNTESTED_SGLANG=1``)
to try the nearest adapter; even then
every patch target must exist with the signature that adapter expects.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import os
from types import ModuleType

from eagle_gate.adapters.patching import GatePatchError
from eagle_gate.adapters.refusals import GateRefused

logger = logging.getLogger("eagle_gate")

__all__ = [
    "SUPPORTED",
    "UnsupportedSGLang",
    "GatePatchError",
    "GateRefused",
    "installed_sglang_version",
    "select_adapter",
    "selected_adapter",
]

#: SGLang version -> adapter module.
SUPPORTED: dict[str, str] = {
    "0.5.9": "eagle_gate.adapters.sglang_0_5_9",
    "0.5.23": "eagle_gate.adapters.sglang_0_5_23",
}
ENV_ALLOW_UNTESTED = "EAGLE_GATE_ALLOW_UNTESTED_SGLANG"
#: the adapter this process chose for the installed SGLang (selected_adapter).
_SELECTED: ModuleType | None = None


class UnsupportedSGLang(RuntimeError):
    """The installed SGLang is not one eagle_gate supports."""


def installed_sglang_version() -> str:
    """The installed SGLang's version, without importing SGLang (slow)."""
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        raise UnsupportedSGLang(
            "SGLang is not installed; eagle_gate supports SGLang "
            + ", ".join(SUPPORTED)
        ) from None


def _key(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
        if not piece.isdigit():
            break
    return tuple(parts)


def nearest_supported(version: str) -> str:
    """The supported version closest to ``version`` (by release numbers)."""
    target = _key(version)

    def distance(candidate: str) -> tuple:
        key = _key(candidate)
        width = max(len(key), len(target))
        a = key + (0,) * (width - len(key))
        b = target + (0,) * (width - len(target))
        return tuple(abs(x - y) for x, y in zip(a, b, strict=True))

    return min(SUPPORTED, key=distance)


def select_adapter(
    version: str | None = None, *, allow_untested: bool = False
) -> ModuleType:
    """Return the adapter module for ``version`` (default: the installed one,
    which :func:`selected_adapter` then remembers for this process)."""
    global _SELECTED
    adapter = _select(version or installed_sglang_version(), allow_untested)
    if version is None:
        _SELECTED = adapter
    return adapter


def selected_adapter() -> ModuleType:
    """The adapter this process chose for the installed SGLang (the launcher
    and SGLang's plugin entry choose it first), else the one
    :func:`select_adapter` gives now, the nearest allowed when
    ``EAGLE_GATE_ALLOW_UNTESTED_SGLANG=1`` (which the launcher exports).
    Remembered, so code that runs often (the HTTP routes) pays neither the
    version lookup nor an untested version's target checks again. Raises
    UnsupportedSGLang."""
    if _SELECTED is not None:
        return _SELECTED
    return select_adapter(allow_untested=os.environ.get(ENV_ALLOW_UNTESTED, "") == "1")


def _select(version: str, allow_untested: bool) -> ModuleType:
    if version in SUPPORTED:
        return importlib.import_module(SUPPORTED[version])
    supported = ", ".join(SUPPORTED)
    if not allow_untested:
        raise UnsupportedSGLang(
            f"SGLang {version} is not supported by eagle_gate; supported: "
            f"{supported}. To try the nearest adapter anyway, pass "
            f"--gate-allow-untested-sglang (or set {ENV_ALLOW_UNTESTED}=1)."
        )
    nearest = nearest_supported(version)
    adapter = importlib.import_module(SUPPORTED[nearest])
    for target in adapter.TARGETS:
        try:
            target.check()
        except GatePatchError as exc:
            raise UnsupportedSGLang(
                f"SGLang {version} is not supported (supported: {supported}) and "
                f"the nearest adapter ({nearest}) does not fit it: {exc}"
            ) from exc
    logger.warning(
        "eagle_gate: SGLang %s is untested; using the %s adapter, all of whose "
        "patch targets exist with the expected signatures",
        version,
        nearest,
    )
    return adapter
