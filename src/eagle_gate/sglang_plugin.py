"""Entry point for SGLang's own plugin system (``sglang.srt.plugins``, 0.5.23).

SGLang calls :func:`load` early in every process it starts (launcher, engine,
schedulers, detokenizer). Installed but not enabled, it does nothing. Enabled
(``EAGLE_GATE_POLICY``, ``EAGLE_GATE_CONFIG``, ``EAGLE_GATE_SET`` or
``EAGLE_GATE_ENABLE=1`` in the environment, or the launcher's resolved
configuration), it validates the configuration and instruments SGLang.

SGLang's loader catches and only logs exceptions from plugins. A gate that is
asked for but cannot be installed must stop the launch instead, so failures
leave here as SystemExit, which that loader does not catch.
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger("eagle_gate")


def load() -> None:
    from eagle_gate.config import ConfigError, config_from_environment, gate_requested

    if not gate_requested():
        return
    from eagle_gate import adapters

    try:
        adapter = adapters.select_adapter(
            allow_untested=os.environ.get(adapters.ENV_ALLOW_UNTESTED, "") == "1"
        )
        config = config_from_environment()
        adapter._instrument()
    except (
        ConfigError,
        adapters.UnsupportedSGLang,
        adapters.GatePatchError,
        LookupError,
    ) as exc:
        logger.critical("eagle_gate: cannot start: %s", exc)
        raise SystemExit(f"eagle_gate: cannot start: {exc}") from exc
    from eagle_gate import http_api

    # Routes on SGLang's app, when this process is the one serving HTTP.
    http_api.install_when_imported()
    logger.info(
        "eagle_gate plugin loaded in pid %d: SGLang %s, adapter %s, policy %r %s",
        os.getpid(),
        adapter.SGLANG_VERSIONS[0],
        adapter.NAME,
        config.policy,
        config.settings,
    )
