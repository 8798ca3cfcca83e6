"""Where the gate's settings come from, and in which order they win.

Sources, highest precedence first:

1. the command line (``--gate-policy NAME``, ``--gate-set KEY=VALUE``, ...);
2. the environment (``EAGLE_GATE_POLICY``, ``EAGLE_GATE_SET="k=v,k2=v2"``, ...);
3. the TOML config file (``--gate-config`` or ``EAGLE_GATE_CONFIG``)::

       policy = "threshold"
       status_dir = "/run/eagle_gate"
       draft_sync = "eager"
       plain_step = true
       plain_graphs = "auto"
       shadow = false

       [settings]
       plain_above = 16

4. the defaults (default policy: ``goodput``; the policy's own settings).

Every setting's flag, variable, file key, kind and default is declared once,
in :mod:`eagle_gate.options`; the merge here walks that table, so a setting
added there is read from every source, carried in JSON and shown by doctor.
Policy settings merge key by key: a key given on the command line overrides
the same key from the environment, which overrides the file. The launcher
resolves and validates everything once, before any model loads, and hands the
result to SGLang's processes in ``EAGLE_GATE_RESOLVED`` (JSON), so every
process runs exactly the configuration that was validated.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eagle_gate.options import (
    DEFAULT_DRAFT_SYNC,
    DEFAULT_LAZY_MAX_MIB,
    DEFAULT_PLAIN_GRAPHS,
    DEFAULT_POLICY,
    DRAFT_SYNC_CHOICES,
    OPTIONS,
    PLAIN_GRAPHS_CHOICES,
    ConfigError,
    Option,
    Origin,
    blame,
    config_options,
    file_keys,
    from_keywords,
    given,
    option,
)
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
    "Origin",
    "resolve_config",
    "resolve_config_with_origins",
    "config_file_source",
    "config_from_environment",
    "gate_requested",
    "split_env_set",
    "unvalidated",
    # declared in eagle_gate.options, importable from here as they always were
    "DEFAULT_DRAFT_SYNC",
    "DEFAULT_LAZY_MAX_MIB",
    "DEFAULT_PLAIN_GRAPHS",
    "DRAFT_SYNC_CHOICES",
    "PLAIN_GRAPHS_CHOICES",
]

#: each setting's variable, as other modules and tests have always named it
ENV_POLICY = option("policy").env
ENV_SET = option("settings").env
ENV_CONFIG = option("config").env
ENV_STATUS_DIR = option("status_dir").env
ENV_DRAFT_SYNC = option("draft_sync").env
ENV_PLAIN_STEP = option("plain_step").env
ENV_LAZY_MAX_MIB = option("lazy_max_mib").env
ENV_SHADOW = option("shadow").env
ENV_PLAIN_GRAPHS = option("plain_graphs").env
#: the launcher's validated configuration, handed to every SGLang process.
ENV_RESOLVED = "EAGLE_GATE_RESOLVED"
#: turns the gate on with all defaults (0.5.23's stock launcher path).
ENV_ENABLE = "EAGLE_GATE_ENABLE"


@dataclass(frozen=True)
class GateConfig:
    """A resolved, validated gate configuration.

    Its fields are the ``target="config"`` options of :mod:`eagle_gate.options`
    (a test keeps the two the same); JSON and the merge come from that table.
    """

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
    #: SPEC depths besides the configured one (``eagle_gate.depths``): "off",
    #: "auto" or ascending depths "1,2,3".
    depths: str = "off"

    def to_json(self) -> str:
        return json.dumps(
            {o.key: getattr(self, o.key) for o in config_options()}, sort_keys=True
        )

    @classmethod
    def from_json(cls, text: str) -> GateConfig:
        """The configuration a launcher wrote with :meth:`to_json`; each value
        is read by its option's parser again (a field it lacks: the default)."""
        try:
            data = json.loads(text)
            values = {"policy": str(data["policy"])}
            for o in config_options():
                if o.key != "policy" and given(data.get(o.key)):
                    values[o.key] = o.parse(data[o.key])
            return cls(**values)
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
            raise ConfigError(
                f"policy {self.policy!r}: {exc}", field="settings"
            ) from exc


def parse_assignments(items: Sequence[str], source: str) -> dict[str, str]:
    """Parse ``KEY=VALUE`` strings; ``source`` names where they came from."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(
                f"{source}: {item!r} is not a KEY=VALUE assignment "
                "(example: plain_above=16)",
                field="settings",
            )
        out[key] = value.strip()
    return out


def split_env_set(text: str) -> list[str]:
    """The ``KEY=VALUE`` items of ``EAGLE_GATE_SET`` (separated by , or ;)."""
    return [part for part in text.replace(";", ",").split(",") if part.strip()]


def load_config_file(
    path: str | os.PathLike[str], origin: Origin | None = None
) -> dict[str, Any]:
    """Read a TOML config file, naming the file (and line) on any problem.

    ``origin``: where the path came from, blamed when the file cannot be read;
    a problem inside the file is blamed on the file.
    """
    p = Path(path)
    named = origin or Origin("file", str(p))
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(
            f"config file {str(p)!r} does not exist", field="config", origin=named
        ) from None
    except OSError as exc:
        raise ConfigError(
            f"config file {str(p)!r} cannot be read: {exc}",
            field="config",
            origin=named,
        ) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"config file {str(p)!r} is not UTF-8 text (byte {exc.start}); TOML "
            "files are UTF-8",
            field="config",
            origin=Origin("file", str(p)),
        ) from None
    except tomllib.TOMLDecodeError as exc:
        # tomllib's message ends with "(at line L, column C)".
        raise ConfigError(
            f"config file {str(p)!r} does not parse: {exc}",
            field="config",
            origin=Origin("file", str(p)),
        ) from None
    allowed = file_keys()
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise ConfigError(
            f"config file {str(p)!r}: unknown key {unknown[0]!r}; "
            f"allowed: {', '.join(sorted(allowed))}",
            field="config",
            origin=Origin("file", str(p)),
        )
    for o in config_options():
        if o.file_check and o.key in data and not o.file_value_ok(data[o.key]):
            what = (
                f"[{o.key}] {o.file_check}"
                if o.kind == "table"
                else f"{o.key!r} {o.file_check}, got {data[o.key]!r}"
            )
            raise ConfigError(
                f"config file {str(p)!r}: {what}",
                field=o.key,
                origin=_file_origin(o, str(p)),
            )
    return data


def _file_origin(o: Option, path: str) -> Origin:
    shown = f"[{o.key}]" if o.kind == "table" else o.key
    return Origin("file", f"{shown} in {path}")


def _pick(
    o: Option, cli: Mapping[str, Any], env: Mapping[str, str], file_data, path
) -> tuple[Any, Origin]:
    """The value of ``o`` by precedence (cli, env, file), and where it came
    from; ``(None, default)`` when no source gives one."""
    if given(cli.get(o.key)):
        return cli[o.key], Origin("cli", o.flag)
    if given(env.get(o.env)):
        return env[o.env], Origin("env", o.env)
    if given(file_data.get(o.key)):
        return file_data[o.key], _file_origin(o, path)
    return None, Origin("default")


def config_file_source(
    cli: Mapping[str, Any], env: Mapping[str, str]
) -> tuple[str | None, Origin]:
    """The config file's path by precedence (``--gate-config``, then
    ``EAGLE_GATE_CONFIG``), and where it came from; None when neither names one."""
    o = option("config")
    path, origin = _pick(o, cli, env, {}, None)
    if path is None:
        return None, Origin("default", "no config file")
    return str(path), origin


def _cli(cli: Mapping[str, Any] | None, keywords: Mapping[str, Any]) -> dict:
    """The command line's values by option key, from ``cli`` and the older
    keywords; TypeError for a key no option has (a typo would else be lost)."""
    out = dict(cli or {})
    unknown = sorted(set(out) - {o.key for o in OPTIONS})
    if unknown:
        raise TypeError(f"resolve_config(): no gate option {unknown[0]!r}")
    out.update(from_keywords(keywords))
    return out


def resolve_config(
    cli: Mapping[str, Any] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    **keywords: Any,
) -> GateConfig:
    """Merge all sources by precedence and validate the result completely.

    ``cli``: what the command line gave, by option key (``options.cli_values``
    of the parsed ``--gate-*`` flags); the older keywords (``cli_policy=``,
    ``cli_sets=``, ...) are taken too. Validation includes constructing the
    policy once, so cross-setting checks in a policy's constructor also fail
    here, before any model loads. A ConfigError names the setting at fault
    (``field``) and where its value came from (``origin``) where it can.
    """
    return resolve_config_with_origins(cli, environ=environ, **keywords)[0]


def resolve_config_with_origins(
    cli: Mapping[str, Any] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    **keywords: Any,
) -> tuple[GateConfig, dict[str, Origin]]:
    """:func:`resolve_config`, and where each value came from: by field
    (``"policy"``, ``"status_dir"``, ...), ``"config"`` for the config file,
    and ``"settings.KEY"`` for each of the policy's settings."""
    cli = _cli(cli, keywords)
    env = os.environ if environ is None else environ
    config_path, path_origin = config_file_source(cli, env)
    file_data = load_config_file(config_path, path_origin) if config_path else {}
    origins: dict[str, Origin] = {"config": path_origin}

    values: dict[str, Any] = {}
    for o in config_options():
        if o.key == "settings":
            continue
        raw, origins[o.key] = _pick(o, cli, env, file_data, config_path)
        try:
            values[o.key] = o.default if raw is None else o.parse(raw)
        except ConfigError as exc:
            raise blame(exc, o.key, origins[o.key]) from None
    if values["plain_graphs"] == "on" and not values["plain_step"]:
        raise ConfigError(
            "plain_graphs: 'on' needs the plain step, but plain_step is off; "
            "with --gate-plain-step off no plain step runs, so there is nothing "
            "to capture (use --gate-plain-graphs auto or off)",
            field="plain_graphs",
            origin=origins["plain_graphs"],
        )

    if values["depths"] != "off" and values["draft_sync"] == "lazy":
        raise ConfigError(
            f"depths: {values['depths']!r} cannot run with draft_sync 'lazy': its "
            "buffer has the configured depth's width and catches up before SGLang "
            "switches depth; use --gate-draft-sync eager or none, or --gate-depths "
            "off",
            field="depths",
            origin=origins["depths"],
        )

    raw_settings, setting_origins = _raw_settings(cli, env, file_data, config_path)
    policy = values["policy"]
    where = f" (config file {config_path!r})" if config_path else ""
    values["settings"] = _policy_settings(
        policy, raw_settings, setting_origins, origins["policy"], where
    )
    for key in values["settings"]:
        origins[f"settings.{key}"] = setting_origins.get(key, Origin("default"))
    config = GateConfig(**values)
    try:
        config.create_policy()
    except ConfigError:
        raise
    except Exception as exc:  # the constructor refused, however it says so
        raise ConfigError(
            f"policy {policy!r} cannot be built with {values['settings']}: "
            f"{exc}{where}",
            field="settings",
        ) from None
    return config, origins


def _policy_settings(
    policy: str,
    raw: Mapping[str, Any],
    origins: Mapping[str, Origin],
    policy_origin: Origin,
    where: str,
) -> dict[str, Any]:
    """The policy's settings, validated by its schema. A refusal is traced to
    its key by validating one key at a time, in ``validate_settings``' own
    order, so that it says which key's value (and so which source) is at
    fault; the keys pass one by one only when the whole set was refused."""
    try:
        factory = get_policy_factory(policy)
    except LookupError as exc:
        raise ConfigError(
            f"{exc.args[0]}{where}", field="policy", origin=policy_origin
        ) from None
    except Exception as exc:  # a broken plugin (PluginError) or worse
        raise ConfigError(f"policy {policy!r} is not available: {exc}") from None
    schema = factory.settings
    try:
        try:
            return validate_settings(policy, schema, raw)
        except SettingsError as whole:
            for key in [*sorted(set(raw) - set(schema)), *raw]:
                try:
                    validate_settings(policy, schema, {key: raw[key]})
                except SettingsError as exc:
                    raise ConfigError(
                        f"{exc.args[0]}{where}", field="settings", origin=origins[key]
                    ) from None
            raise ConfigError(f"{whole.args[0]}{where}", field="settings") from None
    except ConfigError:
        raise
    except Exception as exc:  # a plugin's schema that cannot be used
        raise ConfigError(f"policy {policy!r} is not available: {exc}") from None


def _raw_settings(
    cli: Mapping[str, Any], env: Mapping[str, str], file_data, path
) -> tuple[dict[str, Any], dict[str, Origin]]:
    """The policy settings before validation, merged key by key (the command
    line over the environment over the file), and where each came from."""
    o = option("settings")
    raw: dict[str, Any] = dict(file_data.get(o.key, {}))
    origins = {key: Origin("file", f"[{o.key}] {key} in {path}") for key in raw}
    sources = (
        ("env", o.env, split_env_set(env.get(o.env, "")), "{key} in {where}"),
        ("cli", o.flag, list(cli.get(o.key) or ()), "{where} {key}=..."),
    )
    for source, where, items, shown in sources:
        try:
            given_here = parse_assignments(items, where)
        except ConfigError as exc:
            raise blame(exc, o.key, Origin(source, where)) from None
        raw.update(given_here)
        for key in given_here:
            origins[key] = Origin(source, shown.format(key=key, where=where))
    return raw, origins


def unvalidated(
    cli: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Each gate-wide field's value by the same precedence, read leniently: a
    field no source gives has its default, a value its option refuses is None,
    and a config file that cannot be read counts as none. For a report that
    goes on after :func:`resolve_config` refused (doctor's later rows)."""
    cli = _cli(cli, {})
    env = os.environ if environ is None else environ
    path, origin = config_file_source(cli, env)
    try:
        file_data = load_config_file(path, origin) if path else {}
    except ConfigError:
        file_data = {}
    out: dict[str, Any] = {}
    for o in config_options():
        if o.key == "settings":
            continue  # merged key by key and validated by the policy
        raw, _ = _pick(o, cli, env, file_data, path)
        try:
            out[o.key] = o.default if raw is None else o.parse(raw)
        except ConfigError:
            out[o.key] = None
    return out


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
