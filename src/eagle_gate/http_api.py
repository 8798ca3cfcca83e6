"""The gate's HTTP endpoints on SGLang's own server (the launcher process).

* ``GET /eagle_gate/status``: every scheduler's status record plus whether the
  ranks agree (see :func:`eagle_gate.status.aggregate`).
* ``POST /eagle_gate/policy`` with ``{"policy": NAME, "settings": {...}}``:
  validate and request a runtime change (:mod:`eagle_gate.control`). 202 with
  the new version; 400 naming the problem (nothing changes); 403 for a client
  that is not on loopback when the server has no API key.

Access: the routes are added to SGLang's FastAPI ``app`` before it serves, so
SGLang's own API-key middleware (``--api-key`` / ``--admin-api-key``, both
0.5.9 and 0.5.23: ``sglang.srt.utils.auth``) covers them: the status route is a
normal endpoint (needs ``--api-key`` when set); the control route is marked
``ADMIN_OPTIONAL`` (needs the admin key when one is set, else the API key).
With no key configured, the control route accepts loopback clients only.

Installed by ``python -m eagle_gate.launch`` and by the 0.5.23 plugin entry
(:func:`install_when_imported`, in the launcher process).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import os
import sys
from typing import Any

from eagle_gate.config import GateConfig, config_from_environment
from eagle_gate.control import ControlError, read_request, validate_change
from eagle_gate.control import write_request as write_control_request
from eagle_gate.runtime import default_status_dir
from eagle_gate.status import aggregate, read_status

logger = logging.getLogger("eagle_gate")

__all__ = ["install", "install_when_imported", "STATUS_PATH", "POLICY_PATH"]

STATUS_PATH = "/eagle_gate/status"
POLICY_PATH = "/eagle_gate/policy"
HTTP_SERVER_MODULE = "sglang.srt.entrypoints.http_server"
_ROUTES_FLAG = "eagle_gate_routes"


def _launch_config() -> GateConfig:
    return config_from_environment()


def status_dir() -> str:
    config = _launch_config()
    return config.status_dir or str(default_status_dir(os.getpid()))


def current_config() -> GateConfig:
    """The configuration last requested (or launched with)."""
    config = _launch_config()
    request = read_request(status_dir())
    if request and "policy" in request:
        return dataclasses.replace(
            config,
            policy=str(request["policy"]),
            settings=dict(request.get("settings") or {}),
        )
    return config


def configured_keys() -> tuple[str | None, str | None] | None:
    """SGLang's ``(api_key, admin_api_key)`` in this process, None if unknown."""
    hs = sys.modules.get(HTTP_SERVER_MODULE)
    if hs is None:
        return None
    try:  # 0.5.23
        serving = hs.get_serving()
        return serving.api_key, serving.admin_api_key
    except Exception:
        pass
    try:  # 0.5.9
        args = hs._global_state.tokenizer_manager.server_args
        return args.api_key, getattr(args, "admin_api_key", None)
    except Exception:
        return None


def is_loopback(host: str | None) -> bool:
    if not host:
        return False
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return host == "localhost"


def status_payload() -> dict[str, Any]:
    directory = status_dir()
    return aggregate(directory, read_status(directory), read_request(directory))


def access_refusal(client_host: str | None) -> dict[str, Any] | None:
    """Why the control endpoint refuses this client (403), or None."""
    keys = configured_keys()
    if keys and any(keys):
        return None  # SGLang's middleware has checked the key already
    if is_loopback(client_host):
        return None
    return {
        "error": f"{POLICY_PATH} accepts only loopback clients when the server "
        "has no --api-key / --admin-api-key (client: "
        f"{client_host or 'unknown'})"
    }


def handle_change(body: Any, client_host: str | None) -> tuple[int, dict[str, Any]]:
    """The control endpoint's logic, without HTTP (tested directly)."""
    refusal = access_refusal(client_host)
    if refusal is not None:
        return 403, refusal
    try:
        config = validate_change(body, current_config())
    except ControlError as exc:
        return 400, {"error": str(exc)}
    record = write_control_request(status_dir(), config, source=client_host or "")
    logger.info(
        "eagle_gate: runtime change %d requested by %s: policy %r %s",
        record["version"],
        client_host,
        config.policy,
        config.settings,
    )
    return 202, {
        "accepted": True,
        "version": record["version"],
        "policy": config.policy,
        "settings": config.settings,
        "applies": "on every scheduler at the same decode step (a multiple of "
        "tick_every) when gating, at once when idle; watch config_version in "
        f"GET {STATUS_PATH}",
    }


def install(app: Any) -> bool:
    """Add the routes to SGLang's FastAPI ``app`` (idempotent)."""
    if getattr(app.state, _ROUTES_FLAG, False):
        return False
    from starlette.requests import Request
    from starlette.responses import JSONResponse

    async def eagle_gate_status(request: Request):
        return JSONResponse(status_payload())

    async def eagle_gate_policy(request: Request):
        host = request.client.host if request.client else None
        refusal = access_refusal(host)
        if refusal is not None:
            return JSONResponse(refusal, status_code=403)
        try:
            body = await request.json()
        except Exception:
            return JSONResponse(
                {"error": "the request body is not valid JSON"}, status_code=400
            )
        code, payload = handle_change(body, host)
        return JSONResponse(payload, status_code=code)

    # FastAPI resolves annotations from module globals; these are local.
    eagle_gate_status.__annotations__["request"] = Request
    eagle_gate_policy.__annotations__["request"] = Request
    try:
        from sglang.srt.utils.auth import AuthLevel, auth_level

        eagle_gate_policy = auth_level(AuthLevel.ADMIN_OPTIONAL)(eagle_gate_policy)
    except Exception:  # no per-route levels: SGLang's key check covers all routes
        pass
    app.add_api_route(STATUS_PATH, eagle_gate_status, methods=["GET"])
    app.add_api_route(POLICY_PATH, eagle_gate_policy, methods=["POST"])
    setattr(app.state, _ROUTES_FLAG, True)
    return True


def install_when_imported() -> None:
    """Install on SGLang's ``app`` as soon as its HTTP server module imports."""
    import wrapt

    def on_import(module: Any) -> None:
        app = getattr(module, "app", None)
        if app is None:
            logger.warning("eagle_gate: %s has no app; no HTTP routes", module)
            return
        install(app)

    wrapt.register_post_import_hook(on_import, HTTP_SERVER_MODULE)
