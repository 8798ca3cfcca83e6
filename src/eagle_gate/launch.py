"""``python -m eagle_gate.launch``: SGLang's server, with the gate in front.

Every argument of ``python -m sglang.launch_server`` passes through unchanged;
the gate's own flags (``--gate-*``) are taken out first. The gate's settings are
resolved and validated before SGLang parses its arguments or loads a model, so
a bad setting costs nothing. The speculative setup is judged after SGLang's own
argument resolution (which reads the model's config) and before any model
loads: the gate reads what SGLang will run, not the raw flags.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from eagle_gate import adapters, options
from eagle_gate.adapters.resolved import export_requested, requested_flags
from eagle_gate.config import ENV_RESOLVED, ConfigError, GateConfig, resolve_config
from eagle_gate.depths import pinned_depth_refusal
from eagle_gate.ops import check_environment
from eagle_gate.statusdir import start_launch

logger = logging.getLogger("eagle_gate")

PROG = "python -m eagle_gate.launch"


def add_gate_arguments(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
) -> None:
    """The gate's ``--gate-*`` flags, from the one table of them
    (:data:`eagle_gate.options.OPTIONS`)."""
    options.add_arguments(parser)


def split_argv(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    """Take the gate's flags out of ``argv``; return them and SGLang's argv."""
    parser = argparse.ArgumentParser(prog=PROG, add_help=False, allow_abbrev=False)
    add_gate_arguments(parser)
    gate_args, rest = parser.parse_known_args(list(argv))
    return gate_args, rest


def print_help(adapter_available: bool) -> None:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="SGLang's HTTP server with eagle_gate deciding, before every "
        "decode batch, between speculative (draft + verify) and plain decoding.",
    )
    sglang_group = parser.add_argument_group(
        "SGLang server arguments (passed to SGLang unchanged)"
    )
    if adapter_available:
        from sglang.srt.server_args import ServerArgs

        ServerArgs.add_cli_args(sglang_group)
    else:
        sglang_group.description = "(SGLang is not importable here)"
    add_gate_arguments(parser.add_argument_group("eagle_gate arguments"))
    parser.print_help()


def prepare(argv: Sequence[str], environ: dict | None = None):
    """Everything up to SGLang's own argument parsing: adapter, config, env.

    Returns ``(adapter, config, sglang_argv)``. Raises ConfigError (also for
    an ops tunable that is not allowed, or an unsafe status directory),
    adapters.UnsupportedSGLang on bad input.
    """
    env = os.environ if environ is None else environ
    gate_args, rest = split_argv(argv)
    cli = options.cli_values(gate_args)
    allow_untested = options.option("allow_untested_sglang")
    allow = cli["allow_untested_sglang"] or env.get(allow_untested.env, "") == "1"
    adapter = adapters.select_adapter(allow_untested=allow)
    if allow:
        env[allow_untested.env] = "1"
    config = resolve_config(cli, environ=env)
    check_environment(env)
    env[ENV_RESOLVED] = config.to_json()
    if cli["decision_log"]:
        env[options.option("decision_log").env] = os.path.abspath(cli["decision_log"])
    # Not a judgement: a version may resolve its arguments (0.5.9: and choose
    # its worker) from variables that must be set before SGLang parses anything.
    for key, value in adapter.launch_environment(requested_flags(rest)).items():
        if env.get(key) != value:
            logger.info(
                "eagle_gate: speculation requested on SGLang %s: setting %s=%s "
                "(the gate patches the worker this selects)",
                adapter.SGLANG_VERSIONS[0],
                key,
                value,
            )
            env[key] = value
    plugins = env.get("SGLANG_PLUGINS")
    if plugins and "eagle_gate" not in [p.strip() for p in plugins.split(",")]:
        logger.info("eagle_gate: adding eagle_gate to SGLANG_PLUGINS=%s", plugins)
        env["SGLANG_PLUGINS"] = plugins + ",eagle_gate"
    # The schedulers' status says what SGLang changed (0.5.9 resolves in place).
    export_requested(rest, env)
    # Last, once no gate setting can refuse: this launch's private status
    # directory, cleared of a previous run's files, exported to every process.
    # The speculative setup is judged in run(), on SGLang's own resolution.
    start_launch(config.status_dir, env)
    return adapter, config, rest


def check_resolved(
    adapter, server_args, sglang_argv: Sequence[str], config: GateConfig
) -> tuple[bool, str]:
    """Judge the speculative setup as SGLang resolved it (NEXTN as EAGLE, the
    shape SGLang chose itself, adaptive after SGLang's own switch-off), before
    any model loads; the raw flags only say what SGLang changed. Raises
    GateRefused."""
    spec = adapter.resolve_spec(server_args, requested_flags(sglang_argv))
    if spec.speculating:
        logger.info("eagle_gate: SGLang resolved speculation: %s", spec.describe())
    verdict = adapter.check_spec(
        spec, draft_sync=plain_draft_sync(config), depths=config.depths
    )
    if spec.speculating:
        why = pinned_depth_refusal(
            config.policy, config.settings, config.depths, spec.num_steps or 1
        )
        if why:
            raise adapters.GateRefused(why)
    return verdict


def plain_draft_sync(config: GateConfig) -> str | None:
    """The draft sync the plain step will use (None: no plain step), as the
    refusals judge it (the launcher here, ``eagle-gate doctor`` too)."""
    return config.draft_sync if config.plain_step else None


def _fail(message: str) -> int:
    print(f"eagle_gate: {message}", file=sys.stderr)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(
        level=logging.INFO, format="[%(asctime)s] %(message)s", datefmt="%H:%M:%S"
    )
    if "-h" in argv or "--help" in argv:
        try:
            adapters.select_adapter(
                allow_untested=options.option("allow_untested_sglang").flag in argv
            )
            available = True
        except adapters.UnsupportedSGLang:
            available = False
        print_help(available)
        return 0
    try:
        adapter, config, sglang_argv = prepare(argv)
    except (ConfigError, adapters.UnsupportedSGLang, adapters.GateRefused) as exc:
        return _fail(str(exc))
    return run(adapter, config, sglang_argv)


def run(adapter, config: GateConfig, sglang_argv: list[str]) -> int:
    adapter._instrument()
    adapter.load_sglang_plugins()  # a no-op where SGLang has no plugin loader
    from sglang.srt.server_args import prepare_server_args

    server_args = prepare_server_args(sglang_argv)
    try:
        if config.depths != "off" and adapter.depths is not None:
            # SGLang builds a runtime state per depth (0.5.23; the gate drives
            # them, adapters/sglang_0_5_23/depths.py); 0.5.9 refuses below
            extra = adapter.depths.launch_args(server_args, config.depths)
            if extra:
                sglang_argv = [*sglang_argv, *extra]
                server_args = prepare_server_args(sglang_argv)
        gated, state = check_resolved(adapter, server_args, sglang_argv, config)
    except adapters.GateRefused as exc:
        return _fail(str(exc))
    if config.depths == "off" and adapter.depths is not None:
        note = adapter.depths.operators_note(server_args)
        if note:
            logger.info("eagle_gate: %s", note)
    logger.info(
        "eagle_gate launcher pid %d: SGLang %s, adapter %s, policy %r %s, %s",
        os.getpid(),
        adapter.SGLANG_VERSIONS[0],
        adapter.NAME,
        config.policy,
        config.settings,
        state,
    )
    from sglang.srt.utils import kill_process_tree

    from eagle_gate import http_api

    # GET /eagle_gate/status, POST /eagle_gate/policy on SGLang's own app.
    http_api.install_when_imported()
    try:
        adapter.serve(server_args)
    finally:
        kill_process_tree(os.getpid(), include_parent=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
