"""Where the gate's settings come from, and in which order they win.

Sources, highest precedence first:

1. command line: ``--gate-policy NAME``, ``--gate-set KEY=VALUE`` (repeatable),
   ``--gate-config FILE.toml``, ``--gate-status-dir DIR``,
   ``--gate-draft-sync eager|lazy|none``, ``--gate-plain-step on|off``,
   ``--gate-lazy-max-mib N``, ``--gate-shadow``,
   ``--gate-plain-graphs auto|on|off``;
2. environment: ``EAGLE_GATE_POLICY``, ``EAGLE_GATE_SET`` ("k=v,k2=v2"),
   ``EAGLE_GATE_CONFIG``, ``EAGLE_GATE_STATUS_DIR``, ``EAGLE_GATE_DRAFT_SYNC``,
   ``EAGLE_GATE_PLAIN_STEP``, ``EAGLE_GATE_LAZY_MAX_MIB``,
   ``EAGLE_GATE_SHADOW`` (on/off), ``EAGLE_GATE_PLAIN_GRAPHS``;
3. the TOML config file (from 1 or 2)::

       policy = "threshold"
       status_dir = "/run/eagle_gate"
       draft_sync = "eager"
       plain_step = true
       plain_graphs = "auto"
       shadow = false

       [settings]
       plain_above = 16

4. the policy's own defaults (default policy: ``goodput``).

Settings merge key by key: a key given on the command line overrides the same
key from the environment, which overrides the file. The launcher resolves and
validates everything once, before any model loads, and hands the result to
SGLang's processes in ``EAGLE_GATE_RESOLVED`` (JSON), so every process runs
exactly the configuration that was validated.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eagle_gate.plugins import get_policy_factory
from eagle_gate.settings import SettingsError, validate_settings

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = [
    "DEFAULT_POLICY",
    "ENV_CONFIG",
    "ENV_POLICY",
    "ENV_RESOLVED",
    "ENV_SET",
    "ENV_STATUS_DIR",
    "ConfigError",
    "GateConfig",
    "resolve_config",
    "config_from_environment",
    "gate_requested",
]

DEFAULT_POLICY = "goodput"
ENV_POLICY = "EAGLE_GATE_POLICY"
ENV_SET = "EAGLE_GATE_SET"
ENV_CONFIG = "EAGLE_GATE_CONFIG"
ENV_STATUS_DIR = "EAGLE_GATE_STATUS_DIR"
ENV_RESOLVED = "EAGLE_GATE_RESOLVED"
ENV_DRAFT_SYNC = "EAGLE_GATE_DRAFT_SYNC"
ENV_PLAIN_STEP = "EAGLE_GATE_PLAIN_STEP"
ENV_LAZY_MAX_MIB = "EAGLE_GATE_LAZY_MAX_MIB"
ENV_SHADOW = "EAGLE_GATE_SHADOW"
ENV_PLAIN_GRAPHS = "EAGLE_GATE_PLAIN_GRAPHS"
#: default bound of the lazy draft-sync buffer, per scheduler process.
DEFAULT_LAZY_MAX_MIB = 2048

#: how a plain step keeps the EAGLE draft model's state (see README).
DRAFT_SYNC_CHOICES = ("eager", "lazy", "none")
DEFAULT_DRAFT_SYNC = "eager"
#: whether the plain step gets its own DECODE CUDA-graph set (docs/plain-graphs.md).
PLAIN_GRAPHS_CHOICES = ("auto", "on", "off")
DEFAULT_PLAIN_GRAPHS = "auto"
#: turns the gate on with all defaults (0.5.23's stock launcher path).
ENV_ENABLE = "EAGLE_GATE_ENABLE"

_FILE_KEYS = {
    "policy",
    "settings",
    "status_dir",
    "draft_sync",
    "plain_step",
    "plain_graphs",
    "lazy_max_mib",
    "shadow",
}


class ConfigError(ValueError):
    """The gate's configuration is invalid; the message says what and where."""


@dataclass(frozen=True)
class GateConfig:
    """A resolved, validated gate configuration."""

    policy: str
    settings: dict[str, Any] = field(default_factory=dict)
    status_dir: str | None = None
    #: how a plain step keeps the draft model's state: "eager", "lazy", "none".
    draft_sync: str = DEFAULT_DRAFT_SYNC
    #: False: PLAIN decisions run SGLang's speculative step (an override).
    plain_step: bool = True
    #: memory bound of the lazy draft-sync buffer (MiB per scheduler process).
    lazy_max_mib: int = DEFAULT_LAZY_MAX_MIB
    #: shadow mode: the policy is asked and observes as usual, but every step
    #: runs SGLang's stock speculative step; what it would have run is counted.
    shadow: bool = False
    #: DECODE CUDA graphs for the plain step: "auto" (capture when possible,
    #: else eager), "on" (refuse the launch when they cannot be captured),
    #: "off" (plain steps always run the target eagerly).
    plain_graphs: str = DEFAULT_PLAIN_GRAPHS

    def to_json(self) -> str:
        return json.dumps(
            {
                "policy": self.policy,
                "settings": self.settings,
                "status_dir": self.status_dir,
                "draft_sync": self.draft_sync,
                "plain_step": self.plain_step,
                "lazy_max_mib": self.lazy_max_mib,
                "shadow": self.shadow,
                "plain_graphs": self.plain_graphs,
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> GateConfig:
        try:
            data = json.loads(text)
            return cls(
                policy=str(data["policy"]),
                settings=dict(data.get("settings") or {}),
                status_dir=data.get("status_dir"),
                draft_sync=data.get("draft_sync", DEFAULT_DRAFT_SYNC),
                plain_step=bool(data.get("plain_step", True)),
                lazy_max_mib=int(data.get("lazy_max_mib", DEFAULT_LAZY_MAX_MIB)),
                shadow=bool(data.get("shadow", False)),
                plain_graphs=_choice(
                    "plain_graphs",
                    data.get("plain_graphs"),
                    PLAIN_GRAPHS_CHOICES,
                    DEFAULT_PLAIN_GRAPHS,
                ),
            )
        except ConfigError:
            raise
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"{ENV_RESOLVED} is not valid: {exc}") from exc

    def create_policy(self):
        """Instantiate the configured policy (raises ConfigError if invalid)."""
        factory = get_policy_factory(self.policy)
        try:
            return factory.create(**self.settings)
        except SettingsError as exc:
            raise ConfigError(f"policy {self.policy!r}: {exc}") from exc


def parse_assignments(items: Sequence[str], source: str) -> dict[str, str]:
    """Parse ``KEY=VALUE`` strings; ``source`` names where they came from."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(
                f"{source}: {item!r} is not a KEY=VALUE assignment "
                "(example: plain_above=16)"
            )
        out[key] = value.strip()
    return out


def _split_env_set(text: str) -> list[str]:
    return [part for part in text.replace(";", ",").split(",") if part.strip()]


def load_config_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a TOML config file, naming the file (and line) on any problem."""
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config file {str(p)!r} does not exist") from None
    except OSError as exc:
        raise ConfigError(f"config file {str(p)!r} cannot be read: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"config file {str(p)!r} is not UTF-8 text (byte {exc.start}); TOML "
            "files are UTF-8"
        ) from None
    except tomllib.TOMLDecodeError as exc:
        # tomllib's message ends with "(at line L, column C)".
        raise ConfigError(f"config file {str(p)!r} does not parse: {exc}") from None
    unknown = sorted(set(data) - _FILE_KEYS)
    if unknown:
        raise ConfigError(
            f"config file {str(p)!r}: unknown key {unknown[0]!r}; "
            f"allowed: {', '.join(sorted(_FILE_KEYS))}"
        )
    if "policy" in data and not isinstance(data["policy"], str):
        raise ConfigError(
            f"config file {str(p)!r}: 'policy' must be a string, got {data['policy']!r}"
        )
    if "settings" in data and not isinstance(data["settings"], dict):
        raise ConfigError(
            f"config file {str(p)!r}: [settings] must be a table of KEY = VALUE"
        )
    if "status_dir" in data and (
        not isinstance(data["status_dir"], str) or not data["status_dir"]
    ):
        raise ConfigError(
            f"config file {str(p)!r}: 'status_dir' must be a path, got "
            f"{data['status_dir']!r}"
        )
    return data


def resolve_config(
    *,
    cli_policy: str | None = None,
    cli_sets: Sequence[str] = (),
    cli_config: str | None = None,
    cli_status_dir: str | None = None,
    cli_draft_sync: str | None = None,
    cli_plain_step: str | None = None,
    cli_lazy_max_mib: str | None = None,
    cli_shadow: str | None = None,
    cli_plain_graphs: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> GateConfig:
    """Merge all sources by precedence and validate the result completely.

    Validation includes constructing the policy once, so cross-setting checks
    in a policy's constructor also fail here, before any model loads.
    """
    env = os.environ if environ is None else environ
    config_path = cli_config or env.get(ENV_CONFIG) or None
    file_data = load_config_file(config_path) if config_path else {}

    policy = cli_policy or env.get(ENV_POLICY) or file_data.get("policy")
    policy = policy or DEFAULT_POLICY
    status_dir = (
        cli_status_dir or env.get(ENV_STATUS_DIR) or file_data.get("status_dir")
    )

    draft_sync = _choice(
        "draft_sync",
        cli_draft_sync or env.get(ENV_DRAFT_SYNC) or file_data.get("draft_sync"),
        DRAFT_SYNC_CHOICES,
        DEFAULT_DRAFT_SYNC,
    )
    plain_step = _switch(
        "plain_step",
        cli_plain_step if cli_plain_step is not None else env.get(ENV_PLAIN_STEP),
        file_data.get("plain_step", True),
    )

    plain_graphs = _choice(
        "plain_graphs",
        cli_plain_graphs or env.get(ENV_PLAIN_GRAPHS) or file_data.get("plain_graphs"),
        PLAIN_GRAPHS_CHOICES,
        DEFAULT_PLAIN_GRAPHS,
    )
    if plain_graphs == "on" and not plain_step:
        raise ConfigError(
            "plain_graphs: 'on' needs the plain step, but plain_step is off; "
            "with --gate-plain-step off no plain step runs, so there is nothing "
            "to capture (use --gate-plain-graphs auto or off)"
        )

    shadow = _switch(
        "shadow",
        cli_shadow if cli_shadow is not None else env.get(ENV_SHADOW),
        file_data.get("shadow", False),
    )

    lazy_max_mib = _positive_int(
        "lazy_max_mib",
        cli_lazy_max_mib or env.get(ENV_LAZY_MAX_MIB) or file_data.get("lazy_max_mib"),
        DEFAULT_LAZY_MAX_MIB,
    )

    raw: dict[str, Any] = dict(file_data.get("settings", {}))
    raw.update(parse_assignments(_split_env_set(env.get(ENV_SET, "")), ENV_SET))
    raw.update(parse_assignments(cli_sets, "--gate-set"))

    where = f" (config file {config_path!r})" if config_path else ""
    try:
        factory = get_policy_factory(policy)
        values = validate_settings(policy, factory.settings, raw)
    except (LookupError, SettingsError) as exc:
        raise ConfigError(f"{exc.args[0]}{where}") from None
    except Exception as exc:  # a broken plugin (PluginError) or worse
        raise ConfigError(f"policy {policy!r} is not available: {exc}") from None
    config = GateConfig(
        policy=policy,
        settings=values,
        status_dir=status_dir,
        draft_sync=draft_sync,
        plain_step=plain_step,
        lazy_max_mib=lazy_max_mib,
        shadow=shadow,
        plain_graphs=plain_graphs,
    )
    try:
        config.create_policy()
    except ConfigError:
        raise
    except Exception as exc:  # the constructor refused, however it says so
        raise ConfigError(
            f"policy {policy!r} cannot be built with {values}: {exc}{where}"
        ) from None
    return config


def _choice(name: str, value: Any, choices: tuple[str, ...], default: str) -> str:
    if value is None or value == "":
        return default
    if value not in choices:
        raise ConfigError(
            f"{name}: value {value!r} is not allowed; expected one of "
            + ", ".join(repr(c) for c in choices)
        )
    return value


def _positive_int(name: str, value: Any, default: int) -> int:
    if value is None or value == "":
        return default
    if not isinstance(value, bool):
        try:
            number = int(str(value).strip(), 10)
        except ValueError:
            number = 0
        if number >= 1:
            return number
    raise ConfigError(
        f"{name}: value {value!r} is not allowed; expected an integer >= 1"
    )


def _switch(name: str, value: Any, fallback: Any) -> bool:
    raw = fallback if value is None or value == "" else value
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in {"on", "true", "1", "yes"}:
        return True
    if text in {"off", "false", "0", "no"}:
        return False
    raise ConfigError(f"{name}: value {raw!r} is not allowed; expected on or off")


def gate_requested(environ: Mapping[str, str] | None = None) -> bool:
    """True when the environment asks for the gate (stock-launcher path)."""
    env = os.environ if environ is None else environ
    if env.get(ENV_ENABLE, "").strip().lower() in {"0", "false", "no", "off"}:
        return False
    return any(
        env.get(name)
        for name in (ENV_RESOLVED, ENV_POLICY, ENV_CONFIG, ENV_SET, ENV_ENABLE)
    )


def config_from_environment(environ: Mapping[str, str] | None = None) -> GateConfig:
    """The configuration a child process should run.

    Prefers the launcher's validated ``EAGLE_GATE_RESOLVED``; without it (stock
    ``sglang.launch_server`` on 0.5.23) resolves from the environment.
    """
    env = os.environ if environ is None else environ
    resolved = env.get(ENV_RESOLVED)
    if resolved:
        return GateConfig.from_json(resolved)
    return resolve_config(environ=env)
