"""Typed, validated policy settings.

A policy declares its settings as ``{name: Setting(...)}``. Values arrive as
strings (``--gate-set KEY=VALUE``, environment) or as TOML values (config file);
:func:`validate_settings` turns them into typed values or raises
:class:`SettingsError` naming the key, the value and what is allowed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Setting", "SettingsError", "validate_settings", "describe_setting"]

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


class SettingsError(ValueError):
    """A gate setting is unknown, malformed or out of range."""


@dataclass(frozen=True)
class Setting:
    """One policy setting: its type, default, bounds and a line of help."""

    type: type
    default: Any
    help: str = ""
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[Any, ...] | None = None

    def allowed(self) -> str:
        """Human-readable description of the allowed values."""
        if self.choices is not None:
            return "one of " + ", ".join(repr(c) for c in self.choices)
        kind = {int: "an integer", float: "a number", bool: "a boolean", str: "text"}
        text = kind.get(self.type, self.type.__name__)
        if self.minimum is not None and self.maximum is not None:
            text += f" in [{self.minimum}, {self.maximum}]"
        elif self.minimum is not None:
            text += f" >= {self.minimum}"
        elif self.maximum is not None:
            text += f" <= {self.maximum}"
        return text

    def coerce(self, key: str, raw: Any) -> Any:
        """Convert ``raw`` (a string, a TOML or JSON value) and check its bounds.

        NaN and infinities are refused (they pass every ``<``/``>`` bound check
        and are not JSON), and so are integers outside int64 and numbers too
        large for a float: every value must survive the trip to each scheduler.
        """
        if raw is None and self.default is None:
            # an optional setting left unset: its resolved value (None) must
            # survive the trip through the control file to every scheduler
            return None
        value = self._convert(key, raw)
        if self.type is float and not math.isfinite(value):
            raise self._error(key, raw)
        if self.type is int and not _INT64_MIN <= value <= _INT64_MAX:
            raise SettingsError(
                f"setting {key!r}: value {_shown(raw)} is not allowed; expected "
                f"{self.allowed()} (and within 64-bit integers)"
            )
        if self.choices is not None and value not in self.choices:
            raise self._error(key, raw)
        if self.minimum is not None and value < self.minimum:
            raise self._error(key, raw)
        if self.maximum is not None and value > self.maximum:
            raise self._error(key, raw)
        return value

    def _convert(self, key: str, raw: Any) -> Any:
        if self.type is bool:
            if isinstance(raw, bool):
                return raw
            if isinstance(raw, str) and raw.strip().lower() in _TRUE | _FALSE:
                return raw.strip().lower() in _TRUE
            raise self._error(key, raw)
        if self.type is int:
            if isinstance(raw, bool):
                raise self._error(key, raw)
            if isinstance(raw, int):
                return raw
            if isinstance(raw, str):
                try:
                    return int(raw.strip(), 10)
                except ValueError:
                    raise self._error(key, raw) from None
            raise self._error(key, raw)
        if self.type is float:
            if isinstance(raw, bool):
                raise self._error(key, raw)
            try:
                if isinstance(raw, (int, float)):
                    return float(raw)
                if isinstance(raw, str):
                    return float(raw.strip())
            except (ValueError, OverflowError):
                raise self._error(key, raw) from None
            raise self._error(key, raw)
        if self.type is str:
            if isinstance(raw, str):
                return raw
            raise self._error(key, raw)
        raise TypeError(f"unsupported setting type {self.type!r} for {key!r}")

    def _error(self, key: str, raw: Any) -> SettingsError:
        return SettingsError(
            f"setting {key!r}: value {_shown(raw)} is not allowed; expected "
            f"{self.allowed()}"
        )


def _shown(raw: Any) -> str:
    """``repr(raw)``, shortened (a 400-digit number says nothing more)."""
    text = repr(raw)
    return text if len(text) <= 80 else text[:60] + f"...({len(text)} characters)"


def describe_setting(name: str, setting: Setting) -> str:
    """One line for help texts: ``name (allowed, default X): help``."""
    return f"{name} ({setting.allowed()}, default {setting.default!r}): {setting.help}"


def validate_settings(
    policy_name: str, schema: Mapping[str, Setting], raw: Mapping[str, Any]
) -> dict[str, Any]:
    """Return every setting of ``schema`` with ``raw`` applied over the defaults."""
    unknown = sorted(set(raw) - set(schema))
    if unknown:
        known = ", ".join(sorted(schema)) or "(this policy has no settings)"
        raise SettingsError(
            f"unknown setting {unknown[0]!r} for policy {policy_name!r}; "
            f"allowed: {known}"
        )
    values = {name: s.default for name, s in schema.items()}
    for key, value in raw.items():
        values[key] = schema[key].coerce(key, value)
    return values
