"""Entry point for SGLang's own plugin system (``sglang.srt.plugins``, 0.5.23).

SGLang calls :func:`load` early in every process it starts (launcher, engine,
DP controller, schedulers, detokenizer). Installed but not enabled, it does
nothing. Enabled (``EAGLE_GATE_POLICY``, ``EAGLE_GATE_CONFIG``,
``EAGLE_GATE_SET`` or ``EAGLE_GATE_ENABLE=1`` in the environment, or the
launcher's resolved configuration), it validates the configuration,
checks the ops tunables, instruments SGLang and, in the launcher, starts the
launch (its private status directory, exported to every process SGLang
spawns: :mod:`eagle_gate.statusdir`).

SGLang 0.5.23's loader (``sglang.srt.plugins.load_plugins``) wraps both
``ep.load()`` and the call of the plugin in ``except Exception`` and only logs.
A gate that is asked for but cannot be set up must stop the launch instead,
whatever went wrong (a bad setting, a config file that is not UTF-8, a broken
policy plugin, an unsafe status directory), so every failure leaves here as
SystemExit, which that loader does not catch.
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger("eagle_gate")


def load() -> None:
    try:
        _load()
    except SystemExit:
        raise
    except Exception as exc:
        from eagle_gate.config import ConfigError

        what = str(exc) if isinstance(exc, ConfigError) else repr(exc)
        logger.critical("eagle_gate: cannot start: %s", what)
        raise SystemExit(f"eagle_gate: cannot start: {what}") from exc


def _load() -> None:
    from eagle_gate.config import config_from_environment, gate_requested

    if not gate_requested():
        return
    from eagle_gate import adapters
    from eagle_gate.ops import check_environment
    from eagle_gate.statusdir import ensure_launch

    adapter = adapters.select_adapter(
        allow_untested=os.environ.get(adapters.ENV_ALLOW_UNTESTED, "") == "1"
    )
    config = config_from_environment()
    check_environment()  # refuse here what the schedulers would meet later
    launch, _ = ensure_launch(config.status_dir)
    adapter._instrument()
    from eagle_gate import http_api

    # Routes on SGLang's app, when this process is the one serving HTTP.
    http_api.install_when_imported()
    logger.info(
        "eagle_gate plugin loaded in pid %d: SGLang %s, adapter %s, policy %r %s, "
        "status %s",
        os.getpid(),
        adapter.SGLANG_VERSIONS[0],
        adapter.NAME,
        config.policy,
        config.settings,
        launch.status_dir,
    )
