"""Doctor's checks of a launch: the gate's settings (resolved as the launcher
resolves them, each with its origin), the status directory's rules and the
speculative setup SGLang resolves from a command line. Each runs the
launcher's own check without its side effects: nothing is created, cleared or
started."""

from __future__ import annotations

import argparse
import json
import logging
import os
import pwd
import stat
import tempfile
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from eagle_gate import adapters, config, options
from eagle_gate.adapters.resolved import requested_flags
from eagle_gate.config import ConfigError
from eagle_gate.depths import DEPTHS_OFF, depth_set, pinned_depth_refusal
from eagle_gate.doctor.report import Check
from eagle_gate.options import Origin
from eagle_gate.statusdir import StatusDirError, check_private

__all__ = [
    "check_settings",
    "check_speculative",
    "check_speculative_flags",
    "depths_row",
    "check_status_dir",
    "launch_environment",
    "resolve_speculative_setup",
]


# -- settings ------------------------------------------------------------------------
def check_settings(
    args: argparse.Namespace, env: Mapping[str, str]
) -> tuple[list[Check], config.GateConfig | None]:
    """Resolve the configuration exactly as the launcher does, and say where
    each value came from (``resolve_config_with_origins``); an invalid one is
    reported with the config module's own message and the origin its error
    names."""
    from eagle_gate.ops import ENVIRONMENT, check_environment

    cli = options.cli_values(args)
    path, path_origin = config.config_file_source(cli, env)
    checks = [Check("config file", True, path or "none", source=path_origin.source)]
    try:
        resolved, origins = config.resolve_config_with_origins(cli, environ=env)
    except ConfigError as exc:
        origin = exc.origin
        where = f" (from {origin})" if origin else ""
        fix = (
            f"correct or remove {origin.where if origin and origin.where else 'it'}; "
            "`eagle-gate policies` lists every policy's settings and allowed values"
        )
        source = origin.source if origin else None
        checks.append(
            Check("settings", False, str(exc) + where, fix=fix, source=source)
        )
        resolved = None
    else:
        for o in options.config_options():
            if o.key == "settings":
                continue
            value = getattr(resolved, o.key)
            if o.key == "status_dir" and value is None:
                value = "a fresh private directory per launch"
            checks.append(_setting_row(o.key, value, origins[o.key]))
        for key, value in resolved.settings.items():
            origin = origins[f"settings.{key}"]
            checks.append(_setting_row(f"{resolved.policy}.{key}", value, origin))
    given = [name for name in ENVIRONMENT if env.get(name, "").strip()]
    try:
        check_environment(env)
    except ConfigError as exc:
        fix = "correct or unset that variable (unset: its default is used)"
        checks.append(Check("ops tunables", False, str(exc), fix=fix, source="env"))
    else:
        detail = ", ".join(f"{n}={env[n]}" for n in given) or "defaults"
        checks.append(
            Check("ops tunables", True, detail, source="env" if given else "default")
        )
    return checks, resolved


def _setting_row(name: str, value: Any, origin: Origin) -> Check:
    shown = value if isinstance(value, str) else json.dumps(value)
    return Check(f"setting {name}", True, f"{shown} ({origin})", source=origin.source)


# -- status directory --------------------------------------------------------------
def check_status_dir(path: str | None) -> Check:
    """The status directory's owner and mode, by the rules of
    :mod:`eagle_gate.statusdir` (a real directory of this user, mode 0700).
    Without one, the directory the launcher makes its private one in."""
    name = "status directory"
    user = _user_name()
    if not path:
        parent = tempfile.gettempdir()
        try:
            st = os.stat(parent)
        except OSError as exc:
            return Check(
                name,
                False,
                f"{parent}: {exc}",
                fix="set TMPDIR to a directory of yours",
            )
        if not os.access(parent, os.W_OK | os.X_OK):
            detail = f"the launcher cannot make its private directory in {parent}"
            return Check(name, False, detail, fix="set TMPDIR to a directory of yours")
        if st.st_mode & 0o002 and not st.st_mode & stat.S_ISVTX:
            detail = (
                f"{parent} is world-writable without the sticky bit: another user "
                "could remove or replace the launch's status directory"
            )
            fix = f"chmod +t {parent}, or set TMPDIR to a directory of yours"
            return Check(name, False, detail, fix=fix)
        detail = f"each launch makes a private one in {parent} (mode 0700)"
        return Check(name, True, detail)
    p = Path(os.path.abspath(path))
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        parent = next(q for q in p.parents if q.exists())
        if not os.access(parent, os.W_OK | os.X_OK):
            detail = f"{p} does not exist and cannot be created in {parent}"
            fix = f"mkdir -m 700 {p} as {user}, or choose a directory of yours"
            return Check(name, False, detail, fix=fix)
        return Check(name, True, f"{p} will be created with mode 0700")
    except OSError as exc:
        return Check(name, False, f"{p}: {exc}", fix="choose a directory of yours")
    try:
        check_private(st, p)
    except StatusDirError as exc:
        fixes = []
        if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
            fixes.append("give a real directory, or no --gate-status-dir")
        else:
            if st.st_uid != os.geteuid():
                fixes.append(f"chown {user} {p} (or use a directory of your own)")
            if st.st_mode & 0o077:
                fixes.append(f"chmod 700 {p}")
        return Check(name, False, str(exc), fix="; ".join(fixes))
    detail = f"{p}: owner {user}, mode {stat.S_IMODE(st.st_mode):o}"
    return Check(name, True, detail)


def _user_name() -> str:
    """This user's name for a chown command (the uid when it has none)."""
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


# -- the speculative command line ---------------------------------------------------
def check_speculative_flags(
    adapter: ModuleType,
    sglang_argv: Sequence[str] | None,
    draft_sync: str | None,
    env: Mapping[str, str],
    depths: str = "off",
) -> Check:
    """The launcher's refusal check on the speculative setup SGLang resolves
    from this command line (NEXTN as EAGLE, the shape SGLang chooses itself,
    adaptive after its own switch-off), shown in the row's detail.
    ``draft_sync``: the plain step's draft sync, None when it has none;
    ``depths``: the ``--gate-depths`` setting."""
    return _speculative_flags(adapter, sglang_argv, draft_sync, env, depths)[0]


def check_speculative(
    adapter: ModuleType,
    sglang_argv: Sequence[str] | None,
    draft_sync: str | None,
    env: Mapping[str, str],
    depths: str = "off",
    policy: str = "",
    settings: Mapping[str, Any] | None = None,
) -> list[Check]:
    """:func:`check_speculative_flags`' row and, with ``--gate-depths`` on a
    setup the launcher accepts, the depths row (:func:`depths_row`): one
    resolution of the command line serves both."""
    row, spec = _speculative_flags(adapter, sglang_argv, draft_sync, env, depths)
    extra = None
    if row.ok and spec is not None:
        extra = depths_row(spec, depths, policy, settings or {})
    return [row] if extra is None else [row, extra]


def depths_row(
    spec: Any,
    setting: str,
    policy: str = "",
    settings: Mapping[str, Any] | None = None,
) -> Check | None:
    """What ``--gate-depths setting`` gives a resolved speculative setup
    before anything is built: the depth set, the KV each running request
    keeps in reserve (SGLang sizes it for the deepest depth, ``2*(max+1)``
    tokens with a chain, against ``2*(k+1)`` for the configured depth alone:
    paid whether or not a policy ever runs the deepest), and where the
    measured per-depth cost appears; failed where ``always depth=d`` pins a
    depth outside the set (the launcher's refusal, same message). None where
    depths are off or nothing speculates."""
    if setting == DEPTHS_OFF or not getattr(spec, "speculating", False):
        return None
    k = max(1, int(spec.num_steps or 1))
    depths = depth_set(setting, k)
    name = "draft depths"
    why = pinned_depth_refusal(policy, settings or {}, setting, k)
    if why:
        fix = "pin a depth of the set, or add it to --gate-depths"
        return Check(name, False, f"refused: {why}", fix=fix)
    if depths is None:
        detail = f"--gate-depths {setting}: only the configured depth {k}; binary"
        return Check(name, True, detail)
    deepest = depths[-1]
    detail = (
        f"SPEC depths {','.join(map(str, depths))} and PLAIN (configured {k}); "
        f"KV reserve per running request 2*({deepest}+1) = {2 * (deepest + 1)} "
        f"tokens (the configured depth alone: 2*({k}+1) = {2 * (k + 1)}); SGLang "
        "builds one runtime state per depth at start: the MiB and seconds each "
        "took are in the status, schedulers[].depths.per_depth (eagle-gate status)"
    )
    return Check(name, True, detail)


def _speculative_flags(
    adapter: ModuleType,
    sglang_argv: Sequence[str] | None,
    draft_sync: str | None,
    env: Mapping[str, str],
    depths: str,
) -> tuple[Check, Any]:
    """The flags row and SGLang's resolved setup (None when not resolved)."""
    name = "speculative flags"
    if sglang_argv is None:
        detail = "not checked: give the SGLang command line after --"
        return Check(name, True, detail), None
    env = dict(env)
    note = ""
    # what the launcher sets before SGLang parses anything, set here too
    for key, value in launch_environment(adapter, sglang_argv).items():
        if env.get(key) != value:
            env[key] = value
            note += f"; the launcher sets {key}={value}"
    try:
        spec = resolve_speculative_setup(adapter, sglang_argv, env)
    except Exception as exc:
        fix = (
            "correct the SGLang command line (SGLang's own argument resolution "
            "stopped; the launch would stop there too, before loading a model); "
            "doctor needs the model's config to be readable, as the launcher does"
        )
        detail = f"SGLang's resolution failed: {type(exc).__name__}: {exc}"
        return Check(name, False, detail, fix=fix), None
    try:
        _, state = adapter.check_spec(
            spec, environ=env, draft_sync=draft_sync, depths=depths
        )
    except adapters.GateRefused as exc:
        fix = (
            "change the SGLang command line as the refusal says, or serve this "
            "setup without eagle_gate; the launcher stops with the same message "
            "before loading a model"
        )
        detail = f"refused: {exc} [resolved: {spec.describe()}]"
        return Check(name, False, detail, fix=fix), spec
    return Check(name, True, state + note), spec


def launch_environment(
    adapter: ModuleType, sglang_argv: Sequence[str]
) -> dict[str, str]:
    """The variables the launcher sets for this command line before SGLang
    parses it (the adapter's ``launch_environment``). A flag value argparse
    refuses gives none: SGLang's own resolution then says what is wrong."""
    try:
        return dict(adapter.launch_environment(requested_flags(sglang_argv)))
    except SystemExit:
        return {}


def resolve_speculative_setup(
    adapter: ModuleType, sglang_argv: Sequence[str], env: Mapping[str, str]
) -> Any:
    """SGLang's own resolution of ``sglang_argv`` (the adapter's
    ``resolve_argv``: reads the model's config, loads no weights), with the
    variables SGLang reads while resolving (the adapter's ``LAUNCH_ENV_KEYS``)
    as ``env`` has them, and this process's environment and logging put back
    after."""
    keys = tuple(adapter.LAUNCH_ENV_KEYS)
    before = {key: os.environ.get(key) for key in keys}
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        for key in keys:
            if env.get(key) is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = env[key]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _, spec = adapter.resolve_argv(list(sglang_argv))
        return spec
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        root.handlers[:], root.level = handlers, level
