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

The checks live beside this module: :mod:`.install` (SGLang, patch targets,
fixes, plugins), :mod:`.launch_checks` (settings, status directory, the
speculative setup) and :mod:`.report` (the rows and the table).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict

from eagle_gate import config, options
from eagle_gate.doctor.install import (
    SGLANG_PLUGIN_GROUP,
    check_patch_targets,
    check_policy_plugins,
    check_sglang,
    check_sglang_plugin,
    check_version_fixes,
)
from eagle_gate.doctor.launch_checks import (
    check_settings,
    check_speculative,
    check_speculative_flags,
    check_status_dir,
    resolve_speculative_setup,
)
from eagle_gate.doctor.report import Check, format_table
from eagle_gate.launch import plain_draft_sync
from eagle_gate.options import Origin

__all__ = [
    "SGLANG_PLUGIN_GROUP",
    "Check",
    "Origin",
    "build_parser",
    "check_patch_targets",
    "check_policy_plugins",
    "check_settings",
    "check_sglang",
    "check_sglang_plugin",
    "check_speculative",
    "check_speculative_flags",
    "check_status_dir",
    "check_version_fixes",
    "format_table",
    "main",
    "resolve_speculative_setup",
    "run_checks",
]


def run_checks(
    args: argparse.Namespace,
    sglang_argv: Sequence[str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> list[Check]:
    """Every check, in report order."""
    env = dict(os.environ if environ is None else environ)
    allow_untested = options.option("allow_untested_sglang")
    allow = args.gate_allow_untested_sglang or env.get(allow_untested.env) == "1"
    sglang, adapter = check_sglang(allow)
    checks = [sglang]
    if adapter is not None:
        checks += check_patch_targets(adapter)
        checks += check_version_fixes(adapter)
    checks += check_policy_plugins()
    checks.append(check_sglang_plugin(adapter, env))
    setting_checks, resolved = check_settings(args, env)
    checks += setting_checks
    policy, settings = "", {}
    if resolved is not None:
        status_dir, draft_sync = resolved.status_dir, plain_draft_sync(resolved)
        depths = resolved.depths
        policy, settings = resolved.policy, resolved.settings
    else:  # go on with the values as given, so that their checks still run
        raw = config.unvalidated(options.cli_values(args), env)
        status_dir = raw["status_dir"]
        draft_sync = None if raw["plain_step"] is False else raw["draft_sync"]
        depths = raw.get("depths") or "off"
    checks.append(check_status_dir(status_dir))
    if adapter is not None:
        checks += check_speculative(
            adapter, sglang_argv, draft_sync, env, depths, policy, settings
        )
    return checks


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="eagle-gate doctor",
        description="Check this installation, the gate's settings and an SGLang "
        "command line the way the launcher would, without starting anything.",
        epilog="Put the SGLang server arguments to check after --, e.g. "
        "eagle-gate doctor -- --model-path M --speculative-algorithm EAGLE3",
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    options.add_arguments(parser)
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
