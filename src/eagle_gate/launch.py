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

from eagle_gate import adapters
from eagle_gate.adapters.resolved import requested_flags
from eagle_gate.config import ENV_RESOLVED, ConfigError, GateConfig, resolve_config
from eagle_gate.ops import check_environment
from eagle_gate.statusdir import start_launch

logger = logging.getLogger("eagle_gate")

PROG = "python -m eagle_gate.launch"


def add_gate_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup):
    parser.add_argument(
        "--gate-policy",
        metavar="NAME",
        help="policy deciding SPEC or PLAIN per decode batch (env EAGLE_GATE_POLICY;"
        " default: goodput). Built-ins: always, never, threshold, goodput; plugins "
        "add more",
    )
    parser.add_argument(
        "--gate-set",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="a policy setting, repeatable (env EAGLE_GATE_SET='k=v,k2=v2')",
    )
    parser.add_argument(
        "--gate-config",
        metavar="FILE.toml",
        help="TOML file with policy, [settings] and status_dir (env EAGLE_GATE_CONFIG)",
    )
    parser.add_argument(
        "--gate-status-dir",
        metavar="DIR",
        help="where each scheduler process writes its gate status "
        "(env EAGLE_GATE_STATUS_DIR; created with mode 0700, or an existing "
        "private directory of yours; default a fresh private "
        "$TMPDIR/eagle_gate-<server pid>-XXXXXXXX). Files of a previous run "
        "there are removed at launch",
    )
    parser.add_argument(
        "--gate-draft-sync",
        choices=("eager", "lazy", "none"),
        help="how a PLAIN step keeps the EAGLE draft model's state: eager (a "
        "draft extend per plain step, exact resume), lazy (buffer the target's "
        "hidden states, catch the draft up when SPEC resumes) or none (cold "
        "recovery) (env EAGLE_GATE_DRAFT_SYNC; default eager)",
    )
    parser.add_argument(
        "--gate-lazy-max-mib",
        metavar="N",
        help="memory bound of the lazy draft-sync buffer per scheduler process; "
        "a launch whose buffer would exceed it is refused "
        "(env EAGLE_GATE_LAZY_MAX_MIB; default 2048)",
    )
    parser.add_argument(
        "--gate-plain-step",
        choices=("on", "off"),
        help="off: PLAIN decisions run SGLang's speculative step and are counted "
        "as overrides (env EAGLE_GATE_PLAIN_STEP; default on)",
    )
    parser.add_argument(
        "--gate-plain-graphs",
        choices=("auto", "on", "off"),
        help="DECODE CUDA graphs for the plain step: auto (capture at start when "
        "possible, else run plain steps eagerly), on (refuse the launch when they "
        "cannot be captured), off (always eager) (env EAGLE_GATE_PLAIN_GRAPHS; "
        "default auto)",
    )
    parser.add_argument(
        "--gate-shadow",
        nargs="?",
        const="on",
        choices=("on", "off"),
        help="shadow mode: the policy decides and observes as usual, but every "
        "step runs SGLang's stock speculative step; status, metrics and the "
        "decision log say what it would have run (env EAGLE_GATE_SHADOW; "
        "default off; switch at runtime with POST /eagle_gate/policy "
        '{"shadow": false})',
    )
    parser.add_argument(
        "--gate-decision-log",
        metavar="DIR",
        help="opt in to a rate-limited JSON-lines log of decisions and outcomes, "
        "one file per scheduler process in DIR (env EAGLE_GATE_DECISION_LOG)",
    )
    parser.add_argument(
        "--gate-allow-untested-sglang",
        action="store_true",
        help="try the nearest adapter on an unsupported SGLang version, after "
        "checking every patch target (env EAGLE_GATE_ALLOW_UNTESTED_SGLANG=1)",
    )


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
    allow = gate_args.gate_allow_untested_sglang or (
        env.get(adapters.ENV_ALLOW_UNTESTED, "") == "1"
    )
    adapter = adapters.select_adapter(allow_untested=allow)
    if allow:
        env[adapters.ENV_ALLOW_UNTESTED] = "1"
    config = resolve_config(
        cli_policy=gate_args.gate_policy,
        cli_sets=gate_args.gate_set,
        cli_config=gate_args.gate_config,
        cli_status_dir=gate_args.gate_status_dir,
        cli_draft_sync=gate_args.gate_draft_sync,
        cli_plain_step=gate_args.gate_plain_step,
        cli_lazy_max_mib=gate_args.gate_lazy_max_mib,
        cli_shadow=gate_args.gate_shadow,
        cli_plain_graphs=gate_args.gate_plain_graphs,
        environ=env,
    )
    check_environment(env)
    env[ENV_RESOLVED] = config.to_json()
    if gate_args.gate_decision_log:
        from eagle_gate.decision_log import ENV_DECISION_LOG

        env[ENV_DECISION_LOG] = os.path.abspath(gate_args.gate_decision_log)
    # Not a judgement: 0.5.9 resolves its arguments (and chooses its worker)
    # from this variable, so it must be set before SGLang parses anything.
    flags = requested_flags(rest)
    if adapter.NAME == "sglang-0.5.9" and flags.speculative_algorithm:
        if env.get("SGLANG_ENABLE_SPEC_V2") != "1":
            logger.info(
                "eagle_gate: speculation requested on SGLang 0.5.9: setting "
                "SGLANG_ENABLE_SPEC_V2=1 (the gate patches the spec-v2 worker)"
            )
            env["SGLANG_ENABLE_SPEC_V2"] = "1"
    plugins = env.get("SGLANG_PLUGINS")
    if plugins and "eagle_gate" not in [p.strip() for p in plugins.split(",")]:
        logger.info("eagle_gate: adding eagle_gate to SGLANG_PLUGINS=%s", plugins)
        env["SGLANG_PLUGINS"] = plugins + ",eagle_gate"
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
    return adapter.check_spec(spec, draft_sync=_draft_sync(config))


def _draft_sync(config: GateConfig) -> str | None:
    """The draft sync the plain step will use (None: no plain step)."""
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
                allow_untested="--gate-allow-untested-sglang" in argv
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
    if hasattr(adapter, "load_sglang_plugins"):
        adapter.load_sglang_plugins()
    from sglang.srt.server_args import prepare_server_args

    server_args = prepare_server_args(sglang_argv)
    try:
        gated, state = check_resolved(adapter, server_args, sglang_argv, config)
    except adapters.GateRefused as exc:
        return _fail(str(exc))
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
