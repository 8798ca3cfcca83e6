"""Doctor's checks of the installation: SGLang and its adapter, the patch
targets, the version's fixes, the policy plugins and SGLang's own plugin entry.
Each runs the launcher's own check, one by one, so that every problem is
reported at once."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Mapping
from importlib.metadata import entry_points
from types import ModuleType

from eagle_gate import adapters
from eagle_gate.config import gate_requested
from eagle_gate.doctor.report import Check
from eagle_gate.hookspecs import PROJECT_NAME

__all__ = [
    "SGLANG_PLUGIN_GROUP",
    "check_patch_targets",
    "check_policy_plugins",
    "check_sglang",
    "check_sglang_plugin",
    "check_version_fixes",
]

#: SGLang 0.5.23's entry-point group for general plugins (its plugin loader).
SGLANG_PLUGIN_GROUP = "sglang.srt.plugins"


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
    """The SGLang bugs the adapter carries fixes for (its ``fixes`` module;
    a version with none has an empty one): whether the installed code has
    each defect, by the same probe the launcher runs. A fix that cannot be
    judged stops the launch."""
    fixes = adapter.fixes
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
        if gate_requested(env):
            fix = (
                f"add it: SGLANG_PLUGINS={allowed},eagle_gate (python -m "
                "eagle_gate.launch adds it for you)"
            )
            return Check(name, False, detail, fix=fix)
    return Check(name, True, detail)
