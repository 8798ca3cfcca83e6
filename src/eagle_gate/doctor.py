"""``eagle-gate doctor``: everything the launcher would refuse, in one report.

Why: the launcher stops at the first problem, and only when a server is being
started. An operator who has just installed eagle_gate next to an SGLang wants
every problem at once, each with its fix, before any GPU time is spent. So
doctor runs the launcher's own checks (the adapter's version and patch-target
knowledge, the config module's validation, the status directory's rules, the
speculative refusals) and reports each as a row.

Doctor only reads: it starts no server and loads no model, and it never
creates, clears or changes a status directory (the launcher's ``prepare``
would; that is why doctor calls the checks one by one instead). Like the
launcher, it imports SGLang's patch-target modules and the policy plugins, and
builds the configured policy once.

The speculative row runs SGLang's own argument resolution on the command line
after ``--`` (as the launcher does before any model loads: it reads the
model's config, loads no weights), judges what SGLang will run (NEXTN as
EAGLE, the draft shape SGLang chooses itself, adaptive after SGLang's own
switch-off) and shows that resolved setup. What it cannot see: refusals that
need a built scheduler (lazy draft sync with attention backends that keep no
CPU sequence lengths, the lazy buffer's memory bound) still come at launch.

    eagle-gate doctor [--json] [--gate-* flags] [-- SGLang server arguments]

Exit status: 0 when every check is ok, 1 otherwise, 2 on a usage error.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import pwd
import stat
import sys
import tempfile
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from importlib.metadata import entry_points
from pathlib import Path
from types import ModuleType
from typing import Any

from eagle_gate import __version__, adapters, config
from eagle_gate.hookspecs import PROJECT_NAME

__all__ = ["Check", "run_checks", "main"]

#: SGLang 0.5.23's entry-point group for general plugins (its plugin loader).
SGLANG_PLUGIN_GROUP = "sglang.srt.plugins"
#: where the launcher's gate flags go in the config file, and their variables.
_FIELDS: dict[str, tuple[str, str]] = {
    "policy": ("gate_policy", config.ENV_POLICY),
    "status_dir": ("gate_status_dir", config.ENV_STATUS_DIR),
    "draft_sync": ("gate_draft_sync", config.ENV_DRAFT_SYNC),
    "plain_step": ("gate_plain_step", config.ENV_PLAIN_STEP),
    "lazy_max_mib": ("gate_lazy_max_mib", config.ENV_LAZY_MAX_MIB),
    "shadow": ("gate_shadow", config.ENV_SHADOW),
    "plain_graphs": ("gate_plain_graphs", config.ENV_PLAIN_GRAPHS),
}


@dataclass(frozen=True)
class Check:
    """One row of the report. ``fix`` says what to do when ``ok`` is False;
    ``source`` says where a setting came from (cli, env, file, default)."""

    name: str
    ok: bool
    detail: str
    fix: str = ""
    source: str | None = None


@dataclass(frozen=True)
class Origin:
    """Where one value came from: ``source`` and the flag, variable or file key."""

    source: str
    where: str = ""

    def __str__(self) -> str:
        return f"{self.source}: {self.where}" if self.where else self.source


# -- SGLang and its adapter ------------------------------------------------------
def check_sglang(allow_untested: bool) -> tuple[Check, ModuleType | None]:
    """The installed SGLang and the adapter that serves it.

    For a version no adapter supports, the nearest adapter is returned anyway
    (its patch targets are then checked, which is what
    ``--gate-allow-untested-sglang`` would rely on)."""
    supported = ", ".join(adapters.SUPPORTED)
    newest = list(adapters.SUPPORTED)[-1]
    install = (
        f"install a supported SGLang ({supported}): pip install 'sglang=={newest}'"
    )
    try:
        version = adapters.installed_sglang_version()
    except adapters.UnsupportedSGLang as exc:
        return Check("sglang", False, str(exc), fix=install), None
    if version in adapters.SUPPORTED:
        adapter = adapters.select_adapter(version)
        detail = f"SGLang {version}, served by adapter {adapter.NAME}"
        return Check("sglang", True, detail), adapter
    nearest = adapters.nearest_supported(version)
    adapter = importlib.import_module(adapters.SUPPORTED[nearest])
    if allow_untested:
        detail = (
            f"SGLang {version} is untested; --gate-allow-untested-sglang tries the "
            f"nearest adapter, {adapter.NAME}, if its patch targets fit (below)"
        )
        return Check("sglang", True, detail), adapter
    message = f"SGLang {version} is not supported"
    try:
        adapters.select_adapter(version)  # refuses, in its own words
    except adapters.UnsupportedSGLang as exc:
        message = str(exc)
    fix = (
        f"{install}; or pass --gate-allow-untested-sglang to try the nearest "
        f"adapter, {adapter.NAME}, whose patch targets are checked below"
    )
    return Check("sglang", False, message, fix=fix), adapter


def check_patch_targets(adapter: ModuleType) -> list[Check]:
    """Every patch target of ``adapter``, by the adapter's own check (the one
    ``--gate-allow-untested-sglang`` runs): present, expected parameters."""
    checks = []
    pin = adapter.SGLANG_VERSIONS[0]
    for target in adapter.TARGETS:
        name = f"patch {target.qualname}"
        try:
            with warnings.catch_warnings():  # SGLang's CPU import chatter
                warnings.simplefilter("ignore")
                target.check()
        except Exception as exc:
            fix = (
                f"this SGLang does not match the one adapter {adapter.NAME} was "
                f"written for: reinstall stock SGLang {pin} (pip install "
                f"--force-reinstall --no-deps 'sglang=={pin}') and drop whatever "
                "else patches it"
            )
            checks.append(Check(name, False, str(exc), fix=fix))
            continue
        params = ", ".join(target.params) if target.params else "any parameters"
        checks.append(Check(name, True, f"{target.module}: ({params})"))
    return checks


def check_version_fixes(adapter: ModuleType) -> list[Check]:
    """The SGLang bugs the adapter carries fixes for (its optional ``fixes``
    module): whether the installed code has each defect, by the same probe
    the launcher runs. A fix that cannot be judged stops the launch."""
    fixes = getattr(adapter, "fixes", None)
    if fixes is None:
        return []
    try:
        with warnings.catch_warnings():  # SGLang's CPU import chatter
            warnings.simplefilter("ignore")
            verdicts = fixes.judge()
    except Exception as exc:
        pin = adapter.SGLANG_VERSIONS[0]
        fix = (
            f"reinstall stock SGLang {pin} (pip install --force-reinstall "
            f"--no-deps 'sglang=={pin}')"
        )
        return [Check("fix (version fixes)", False, str(exc), fix=fix)]
    summaries = {f.name: f.summary for f in fixes.FIXES}
    return [
        Check(
            f"fix {name}",
            True,
            ("needed, applied at launch: " if defect else "not needed here: ")
            + summaries[name],
        )
        for name, defect in verdicts.items()
    ]


# -- entry points ------------------------------------------------------------------
def check_policy_plugins() -> list[Check]:
    """Load every ``eagle_gate`` entry point on its own (the launcher loads them
    all at once and stops at the first that fails), then list the policies."""
    from eagle_gate.plugins import available_policies

    checks = []
    for ep in entry_points(group=PROJECT_NAME):
        dist = ep.dist.name if ep.dist else "an unknown package"
        version = f" {ep.dist.version}" if ep.dist else ""
        name = f"plugin {ep.name}"
        try:
            ep.load()
        except Exception as exc:
            detail = f"{ep.value} (from {dist}) does not load: {exc!r}"
            fix = (
                f"repair or remove the package {dist} (pip uninstall {dist}): "
                "while it is installed every gated launch stops"
            )
            checks.append(Check(name, False, detail, fix=fix))
        else:
            checks.append(Check(name, True, f"{ep.value} ({dist}{version})"))
    try:
        names = ", ".join(sorted(available_policies()))
    except Exception as exc:
        fix = "repair or remove the plugin package named above"
        checks.append(Check("policies", False, str(exc), fix=fix))
    else:
        checks.append(Check("policies", True, names))
    return checks


def check_sglang_plugin(adapter: ModuleType | None, env: Mapping[str, str]) -> Check:
    """eagle_gate's entry in SGLang's own plugin group: what lets the stock
    ``python -m sglang.launch_server`` gate (SGLang 0.5.23 and later)."""
    name = "sglang plugin"
    if adapter is None or not adapter.HAS_SGLANG_PLUGINS:
        what = adapter.NAME if adapter else "this SGLang"
        detail = (
            f"{what} has no {SGLANG_PLUGIN_GROUP} loader, so no SGLang plugin is "
            "needed: start servers with python -m eagle_gate.launch"
        )
        return Check(name, True, detail)
    found = [
        ep for ep in entry_points(group=SGLANG_PLUGIN_GROUP) if ep.name == "eagle_gate"
    ]
    if not found:
        detail = (
            f"eagle_gate is not registered in {SGLANG_PLUGIN_GROUP}: the stock "
            "python -m sglang.launch_server will not gate"
        )
        fix = (
            "reinstall eagle_gate so its entry points are installed (pip install "
            "--force-reinstall --no-deps eagle_gate), or start servers with "
            "python -m eagle_gate.launch"
        )
        return Check(name, False, detail, fix=fix)
    ep = found[0]
    try:
        ep.load()
    except Exception as exc:
        fix = (
            "reinstall eagle_gate (pip install --force-reinstall --no-deps eagle_gate)"
        )
        return Check(name, False, f"{ep.value} does not load: {exc!r}", fix=fix)
    detail = f"{SGLANG_PLUGIN_GROUP}: eagle_gate = {ep.value}"
    allowed = env.get("SGLANG_PLUGINS", "")
    if allowed and "eagle_gate" not in [p.strip() for p in allowed.split(",")]:
        detail += f"; SGLANG_PLUGINS={allowed} leaves it out of stock launches"
        if config.gate_requested(env):
            fix = (
                f"add it: SGLANG_PLUGINS={allowed},eagle_gate (python -m "
                "eagle_gate.launch adds it for you)"
            )
            return Check(name, False, detail, fix=fix)
    return Check(name, True, detail)


# -- settings ------------------------------------------------------------------------
def _config_path(
    args: argparse.Namespace, env: Mapping[str, str]
) -> tuple[str | None, Origin]:
    if args.gate_config:
        return args.gate_config, Origin("cli", "--gate-config")
    if env.get(config.ENV_CONFIG):
        return env[config.ENV_CONFIG], Origin("env", config.ENV_CONFIG)
    return None, Origin("default", "no config file")


def origins(
    args: argparse.Namespace, env: Mapping[str, str]
) -> tuple[dict[str, Origin], dict[str, Origin]]:
    """Where each gate-wide field and each policy setting comes from, by the
    precedence of :func:`eagle_gate.config.resolve_config` (cli, env, file)."""
    path, _ = _config_path(args, env)
    try:
        file_data = config.load_config_file(path) if path else {}
    except config.ConfigError:
        file_data = {}  # resolve_config reports it
    fields = {}
    for field, (attr, var) in _FIELDS.items():
        if getattr(args, attr) not in (None, ""):
            fields[field] = Origin("cli", "--" + attr.replace("_", "-"))
        elif env.get(var):
            fields[field] = Origin("env", var)
        elif field in file_data:
            fields[field] = Origin("file", f"{field} in {path}")
        else:
            fields[field] = Origin("default")
    settings = {
        key: Origin("file", f"[settings] {key} in {path}")
        for key in file_data.get("settings", {})
    }
    for source, where, items in (
        ("env", config.ENV_SET, config._split_env_set(env.get(config.ENV_SET, ""))),
        ("cli", "--gate-set", args.gate_set),
    ):
        try:
            keys = config.parse_assignments(items, where)
        except config.ConfigError:
            continue  # resolve_config reports it
        for key in keys:
            shown = f"{key} in {where}" if source == "env" else f"{where} {key}=..."
            settings[key] = Origin(source, shown)
    return fields, settings


def _culprit(
    message: str,
    fields: dict[str, Origin],
    settings: dict[str, Origin],
    path_origin: Origin,
) -> Origin | None:
    """The origin of the value a config error message names, if it names one."""
    for key, origin in settings.items():
        if f"setting {key!r}" in message:
            return origin
    for field, origin in fields.items():
        if message.startswith(f"{field}:"):
            return origin
    if message.startswith(config.ENV_SET):
        return Origin("env", config.ENV_SET)
    if message.startswith("--gate-set"):
        return Origin("cli", "--gate-set")
    if message.startswith("unknown policy"):
        return fields["policy"]
    if message.startswith("config file"):
        if "does not exist" in message or "cannot be read" in message:
            return path_origin
        return Origin("file", message.split("'")[1] if "'" in message else "")
    return None


def resolve_arguments(args: argparse.Namespace) -> dict[str, Any]:
    """The ``cli_*`` arguments of :func:`eagle_gate.config.resolve_config`
    from the launcher's flags, as ``eagle_gate.launch.prepare`` passes them."""
    kwargs = {
        f"cli_{field}": getattr(args, attr) for field, (attr, _) in _FIELDS.items()
    }
    kwargs.update(cli_sets=args.gate_set, cli_config=args.gate_config)
    return kwargs


def check_settings(
    args: argparse.Namespace, env: Mapping[str, str]
) -> tuple[list[Check], config.GateConfig | None]:
    """Resolve the configuration exactly as the launcher does, and say where
    each value came from; an invalid one is reported with the config module's
    own message and its origin."""
    from eagle_gate.ops import ENVIRONMENT, check_environment

    path, path_origin = _config_path(args, env)
    fields, settings = origins(args, env)
    checks = [Check("config file", True, path or "none", source=path_origin.source)]
    try:
        resolved = config.resolve_config(**resolve_arguments(args), environ=env)
    except config.ConfigError as exc:
        message = str(exc)
        origin = _culprit(message, fields, settings, path_origin)
        where = f" (from {origin})" if origin else ""
        fix = (
            f"correct or remove {origin.where if origin and origin.where else 'it'}; "
            "`eagle-gate policies` lists every policy's settings and allowed values"
        )
        source = origin.source if origin else None
        checks.append(Check("settings", False, message + where, fix=fix, source=source))
        resolved = None
    else:
        for field, origin in fields.items():
            value = getattr(resolved, field)
            if field == "status_dir" and value is None:
                value = "a fresh private directory per launch"
            checks.append(_setting_row(field, value, origin))
        for key, value in resolved.settings.items():
            origin = settings.get(key, Origin("default"))
            checks.append(_setting_row(f"{resolved.policy}.{key}", value, origin))
    given = [name for name in ENVIRONMENT if env.get(name, "").strip()]
    try:
        check_environment(env)
    except config.ConfigError as exc:
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
    from eagle_gate.statusdir import StatusDirError, _check_private

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
        _check_private(st, p)
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
) -> Check:
    """The launcher's refusal check on the speculative setup SGLang resolves
    from this command line (NEXTN as EAGLE, the shape SGLang chooses itself,
    adaptive after its own switch-off), shown in the row's detail.
    ``draft_sync``: the plain step's draft sync, None when it has none."""
    name = "speculative flags"
    if sglang_argv is None:
        detail = "not checked: give the SGLang command line after --"
        return Check(name, True, detail)
    env = dict(env)
    note = ""
    if adapter.NAME == "sglang-0.5.9" and "--speculative-algorithm" in sglang_argv:
        if env.get("SGLANG_ENABLE_SPEC_V2") != "1":
            env["SGLANG_ENABLE_SPEC_V2"] = "1"  # the launcher sets it too
            note = "; the launcher sets SGLANG_ENABLE_SPEC_V2=1"
    try:
        spec = resolve_speculative_setup(adapter, sglang_argv, env)
    except Exception as exc:
        fix = (
            "correct the SGLang command line (SGLang's own argument resolution "
            "stopped; the launch would stop there too, before loading a model); "
            "doctor needs the model's config to be readable, as the launcher does"
        )
        detail = f"SGLang's resolution failed: {type(exc).__name__}: {exc}"
        return Check(name, False, detail, fix=fix)
    try:
        _, state = adapter.check_spec(spec, environ=env, draft_sync=draft_sync)
    except adapters.GateRefused as exc:
        fix = (
            "change the SGLang command line as the refusal says, or serve this "
            "setup without eagle_gate; the launcher stops with the same message "
            "before loading a model"
        )
        detail = f"refused: {exc} [resolved: {spec.describe()}]"
        return Check(name, False, detail, fix=fix)
    return Check(name, True, state + note)


def resolve_speculative_setup(
    adapter: ModuleType, sglang_argv: Sequence[str], env: Mapping[str, str]
) -> Any:
    """SGLang's own resolution of ``sglang_argv`` (the adapter's
    ``resolve_argv``: reads the model's config, loads no weights), with
    ``SGLANG_ENABLE_SPEC_V2`` as ``env`` has it (0.5.9 reads it while
    resolving) and this process's environment and logging put back after."""
    import logging

    key = "SGLANG_ENABLE_SPEC_V2"
    before = os.environ.get(key)
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        if env.get(key) is not None:
            os.environ[key] = env[key]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _, spec = adapter.resolve_argv(list(sglang_argv))
        return spec
    finally:
        if before is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = before
        root.handlers[:], root.level = handlers, level


# -- the report ------------------------------------------------------------------------
def run_checks(
    args: argparse.Namespace,
    sglang_argv: Sequence[str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> list[Check]:
    """Every check, in report order."""
    from eagle_gate.launch import _draft_sync

    env = dict(os.environ if environ is None else environ)
    allow = (
        args.gate_allow_untested_sglang or env.get(adapters.ENV_ALLOW_UNTESTED) == "1"
    )
    sglang, adapter = check_sglang(allow)
    checks = [sglang]
    if adapter is not None:
        checks += check_patch_targets(adapter)
        checks += check_version_fixes(adapter)
    checks += check_policy_plugins()
    checks.append(check_sglang_plugin(adapter, env))
    setting_checks, resolved = check_settings(args, env)
    checks += setting_checks
    if resolved is not None:
        status_dir, draft_sync = resolved.status_dir, _draft_sync(resolved)
    else:  # go on with the raw values, so that their checks still run
        status_dir = _raw("status_dir", args, env)
        draft_sync = _raw("draft_sync", args, env)
        if draft_sync not in config.DRAFT_SYNC_CHOICES:
            draft_sync = None
        if str(_raw("plain_step", args, env)).lower() in {"off", "false", "0", "no"}:
            draft_sync = None
    checks.append(check_status_dir(status_dir))
    if adapter is not None:
        checks.append(check_speculative_flags(adapter, sglang_argv, draft_sync, env))
    return checks


def _raw(field: str, args: argparse.Namespace, env: Mapping[str, str]) -> Any:
    """A gate-wide field's value before validation (cli, env, file; else None)."""
    attr, var = _FIELDS[field]
    if getattr(args, attr) not in (None, ""):
        return getattr(args, attr)
    if env.get(var):
        return env[var]
    path, _ = _config_path(args, env)
    try:
        return config.load_config_file(path).get(field) if path else None
    except config.ConfigError:
        return None


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


def build_parser() -> argparse.ArgumentParser:
    from eagle_gate.launch import add_gate_arguments

    parser = argparse.ArgumentParser(
        prog="eagle-gate doctor",
        description="Check this installation, the gate's settings and an SGLang "
        "command line the way the launcher would, without starting anything.",
        epilog="Put the SGLang server arguments to check after --, e.g. "
        "eagle-gate doctor -- --model-path M --speculative-algorithm EAGLE3",
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    add_gate_arguments(parser)
    return parser


def main(
    argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None
) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    sglang_argv = None
    if "--" in argv:
        cut = argv.index("--")
        argv, sglang_argv = argv[:cut], argv[cut + 1 :]
    args = build_parser().parse_args(argv)
    checks = run_checks(args, sglang_argv, environ)
    ok = all(c.ok for c in checks)
    if args.json:
        print(json.dumps({"ok": ok, "checks": [asdict(c) for c in checks]}, indent=1))
    else:
        print(format_table(checks))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
