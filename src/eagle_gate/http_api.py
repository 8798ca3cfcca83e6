"""The gate's HTTP endpoints on SGLang's own server (the launcher process).

* ``GET /eagle_gate/status``: every scheduler's status record plus whether the
  ranks agree (see :func:`eagle_gate.status.aggregate`).
* ``POST /eagle_gate/policy`` with ``{"policy": NAME, "settings": {...}}``:
  validate and request a runtime change (:mod:`eagle_gate.control`). 202 with
  the new version; 400 naming the problem (nothing changes); 415 for a body
  that is not ``Content-Type: application/json``; 403 for a client the rules
  below refuse.

Access: the routes are added to SGLang's FastAPI ``app`` before it serves, so
SGLang's own API-key middleware (``--api-key`` / ``--admin-api-key``, both
0.5.9 and 0.5.23: ``sglang.srt.utils.auth``) covers them: the status route is a
normal endpoint (needs ``--api-key`` when set); the control route is marked
``ADMIN_OPTIONAL`` (needs the admin key when one is set, else the API key).

With no key configured, a loopback address is all the control route can go
by, and it is not authentication: any local process, and a browser on the
host, can reach it. So the control route always requires ``application/json``
(a cross-origin browser request with that type needs a CORS preflight, and
HTML forms cannot send it), and without a key it also refuses

* clients that are not on loopback (``::ffff:127.0.0.1`` counts as loopback);
* requests that carry an ``Origin`` other than a loopback origin of this very
  server (a web page the browser on the host is showing: SGLang allows every
  origin through CORS, so the preflight alone does not stop it);
* requests that carry proxy headers (``Forwarded``, ``X-Forwarded-For``,
  ``X-Real-IP``, ``X-Forwarded-Host``): a reverse proxy on the host makes every
  client look local, and a forwarded address is whatever the client wrote.

A reverse proxy that adds no such header is indistinguishable from a local
client: put the server behind one only with ``--admin-api-key`` (or
``--api-key``) set, or block ``/eagle_gate/policy`` at the proxy.

Installed by ``python -m eagle_gate.launch`` and by the 0.5.23 plugin entry
(:func:`install_when_imported`, in the launcher process).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import logging
import sys
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from eagle_gate.config import GateConfig, config_from_environment
from eagle_gate.control import ControlError, read_request, validate_change
from eagle_gate.control import write_request as write_control_request
from eagle_gate.status import aggregate, read_status
from eagle_gate.statusdir import StatusDir, StatusDirError, inherited_launch

logger = logging.getLogger("eagle_gate")

__all__ = ["install", "install_when_imported", "STATUS_PATH", "POLICY_PATH"]

STATUS_PATH = "/eagle_gate/status"
POLICY_PATH = "/eagle_gate/policy"
HTTP_SERVER_MODULE = "sglang.srt.entrypoints.http_server"
_ROUTES_FLAG = "eagle_gate_routes"
PROXY_HEADERS = ("forwarded", "x-forwarded-for", "x-real-ip", "x-forwarded-host")
_LOCAL_NAMES = {"localhost", "localhost.", "ip6-localhost"}


def _launch_config() -> GateConfig:
    return config_from_environment()


def _launch():
    launch = inherited_launch()
    if launch is None:
        raise StatusDirError(
            "this process has no eagle_gate launch (EAGLE_GATE_LAUNCH): the gate's "
            "launcher or its SGLang plugin did not run here"
        )
    return launch


def status_dir() -> str:
    """This launch's status directory (from ``EAGLE_GATE_LAUNCH``)."""
    return _launch().status_dir


def current_config(directory: StatusDir | None = None) -> GateConfig:
    """The configuration last requested (or launched with)."""
    config = _launch_config()
    launch = _launch()
    own = directory is None
    directory = StatusDir(launch.status_dir) if directory is None else directory
    try:
        request = read_request(directory, launch.launch_id)
    finally:
        if own:
            directory.close()
    if request:
        return dataclasses.replace(
            config,
            policy=request["policy"],
            settings=dict(request["settings"]),
            shadow=request["shadow"],
        )
    return config


def configured_keys() -> tuple[str | None, str | None] | None:
    """SGLang's ``(api_key, admin_api_key)`` in this process, None if unknown.

    Where SGLang keeps them differs by version, so the adapter this process
    chose (the launcher or SGLang's plugin entry chose it before the routes
    were installed) reads them its own way."""
    hs = sys.modules.get(HTTP_SERVER_MODULE)
    if hs is None:
        return None
    try:
        from eagle_gate.adapters import selected_adapter

        return selected_adapter().api_keys(hs)
    except Exception:
        return None


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        ip = ipaddress.ip_address(host.strip("[]").split("%")[0])
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped  # ::ffff:127.0.0.1 is 127.0.0.1
    return ip


def is_loopback(host: str | None) -> bool:
    if not host:
        return False
    ip = _ip(host)
    if ip is None:
        return host.lower() in _LOCAL_NAMES
    return ip.is_loopback


def _header(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is None:
        value = next((v for k, v in headers.items() if k.lower() == name), None)
    return value


def _same_local_origin(origin: str, host_header: str | None) -> bool:
    """``origin`` is a loopback origin of this server (its Host, same port)."""
    try:
        parts = urlsplit(origin)
        port = parts.port
    except ValueError:
        return False
    if parts.scheme not in ("http", "https") or not is_loopback(parts.hostname):
        return False
    if not host_header:
        return False
    try:
        host = urlsplit(f"//{host_header}")
        host_port = host.port
    except ValueError:
        return False
    default = 443 if parts.scheme == "https" else 80
    return (
        is_loopback(host.hostname)
        and (port or default) == (host_port or default)
        and _ip(parts.hostname or "") == _ip(host.hostname or "")
    )


def content_refusal(headers: Mapping[str, str]) -> tuple[int, dict] | None:
    """415 unless the body is declared ``application/json``."""
    ctype = (_header(headers, "content-type") or "").split(";")[0].strip().lower()
    if ctype != "application/json":
        return 415, {
            "error": f"{POLICY_PATH} takes Content-Type: application/json (got "
            f"{ctype or 'none'!r})"
        }
    return None


def access_refusal(
    client_host: str | None, headers: Mapping[str, str] | None = None
) -> dict[str, Any] | None:
    """Why the control endpoint refuses this client (403), or None."""
    keys = configured_keys()
    if keys and any(keys):
        return None  # SGLang's middleware has checked the key already
    headers = headers or {}
    no_key = "when the server has no --api-key / --admin-api-key"
    if not is_loopback(client_host):
        return {
            "error": f"{POLICY_PATH} accepts only loopback clients {no_key} "
            f"(client: {client_host or 'unknown'})"
        }
    proxied = [h for h in PROXY_HEADERS if _header(headers, h) is not None]
    if proxied:
        return {
            "error": f"{POLICY_PATH} refuses proxied requests {no_key} (header "
            f"{proxied[0]!r}): behind a proxy every client looks local; set "
            "--admin-api-key"
        }
    origin = _header(headers, "origin")
    if origin is not None and not _same_local_origin(origin, _header(headers, "host")):
        return {
            "error": f"{POLICY_PATH} refuses requests from web pages {no_key} "
            f"(Origin: {origin!r})"
        }
    return None


def status_payload() -> dict[str, Any]:
    """The status view; an unusable status directory is reported, not raised."""
    try:
        launch = _launch()
        directory = StatusDir(launch.status_dir)
        try:
            return aggregate(
                directory,
                read_status(directory, launch.launch_id),
                read_request(directory, launch.launch_id),
            )
        finally:
            directory.close()
    except (OSError, ValueError) as exc:
        return {"ok": False, "error": str(exc), "schedulers": []}


def handle_change(
    body: Any, client_host: str | None, headers: Mapping[str, str] | None = None
) -> tuple[int, dict[str, Any]]:
    """The control endpoint's logic, without HTTP (tested directly).

    ``headers``: the request's headers (a ``Content-Type: application/json``
    is required; see the module doc for the rest).
    """
    headers = headers or {}
    refusal = access_refusal(client_host, headers)
    if refusal is not None:
        return 403, refusal
    refused = content_refusal(headers)
    if refused is not None:
        return refused
    launch = _launch()
    directory = StatusDir(launch.status_dir)
    try:
        config = validate_change(body, current_config(directory))
        versions = [
            r.get("config_version")
            for r in read_status(directory, launch.launch_id)
            if isinstance(r.get("config_version"), int)
        ]
        record = write_control_request(
            directory,
            config,
            launch_id=launch.launch_id,
            source=client_host or "",
            at_least=max(versions, default=0),
        )
    except ControlError as exc:
        return 400, {"error": str(exc)}
    finally:
        directory.close()
    logger.info(
        "eagle_gate: runtime change %d requested by %s: policy %r %s shadow %s",
        record["version"],
        client_host,
        config.policy,
        config.settings,
        config.shadow,
    )
    return 202, {
        "accepted": True,
        "version": record["version"],
        "policy": config.policy,
        "settings": config.settings,
        "shadow": config.shadow,
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
        payload = status_payload()
        return JSONResponse(payload, status_code=503 if "error" in payload else 200)

    async def eagle_gate_policy(request: Request):
        host = request.client.host if request.client else None
        headers = request.headers
        refusal = access_refusal(host, headers)
        if refusal is not None:
            return JSONResponse(refusal, status_code=403)
        refused = content_refusal(headers)
        if refused is not None:
            return JSONResponse(refused[1], status_code=refused[0])
        try:
            body = json.loads(await request.body())
        except Exception:
            return JSONResponse(
                {"error": "the request body is not valid JSON"}, status_code=400
            )
        try:
            code, payload = handle_change(body, host, headers)
        except (OSError, ValueError) as exc:  # the status directory, not the body
            code, payload = 500, {"error": f"the request was not stored: {exc}"}
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
