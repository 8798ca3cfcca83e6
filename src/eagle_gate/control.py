"""Changing the policy, its settings or shadow mode on a running server.

Flow (see docs/operations.md, "Changing the policy at runtime"):

1. ``POST /eagle_gate/policy`` (HTTP process, :mod:`eagle_gate.http_api`)
   validates the change with :func:`validate_change` exactly like a launch
   configuration (unknown policy, unknown setting, bad value, a policy
   constructor that refuses: 400 naming the problem; nothing changes) and
   writes it as the next numbered version into ``<status_dir>/control.json``
   (:func:`write_request`: an ``O_EXCL`` temporary file renamed into place),
   stamped with the launch id (:mod:`eagle_gate.statusdir`).
2. Every scheduler process picks the request up, but only at decode steps that
   are multiples of ``tick_every`` (``GateRuntime.on_tick``): TP rank 0 checks
   the file (one ``stat``; a read only when it changed) and, with ``tp_size >
   1``, broadcasts the version it read over the scheduler's CPU process group
   (the attention-TP group: the ranks that run the same decode batches) at that
   step; when the version is new it broadcasts the configuration too. Every
   rank therefore switches at the same step (:class:`ControlAgreement`).
   Rank 0 validates the file before the broadcast, and nothing it reads can
   keep it from broadcasting, so no rank is ever left waiting.
3. Each scheduler reports ``config_version`` in its status; the HTTP status
   says whether all ranks agree.

What is read back from disk is validated exactly like an HTTP request (strict
JSON, the launch id, a version in 1..2**63-1, the policy and its settings);
a file that fails is ignored (and logged), so a request of a previous run, or
a damaged one, never reaches a policy.

A server that is not speculating (the gate idle) has no decode steps to agree
on and nothing that uses the policy; there the ops thread applies requests as
soon as it sees them.

No SGLang or torch at module level (torch is imported only for a TP broadcast).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from eagle_gate.config import GateConfig
from eagle_gate.plugins import get_policy_factory
from eagle_gate.settings import SettingsError, validate_settings
from eagle_gate.statusdir import StatusDir, as_status_dir

logger = logging.getLogger("eagle_gate")

__all__ = [
    "CONTROL_FILE",
    "MAX_VERSION",
    "ControlError",
    "ControlAgreement",
    "ControlFile",
    "parse_request",
    "read_request",
    "validate_change",
    "validate_config",
    "write_request",
]

CONTROL_FILE = "control.json"
#: versions travel as one int64 in the TP broadcast.
MAX_VERSION = 2**63 - 1
_BODY_KEYS = {"policy", "settings", "shadow"}
_RECORD_KEYS = {"v", "launch_id", "version", "policy", "settings", "shadow"}
_RECORD_KEYS |= {"requested_at", "source"}
_LOG_EVERY_S = 60.0


class ControlError(ValueError):
    """A requested change is invalid; the message names the problem."""


def validate_config(policy: Any, settings: Any, base: GateConfig) -> GateConfig:
    """``base`` with exactly ``policy`` and ``settings`` (over that policy's
    defaults), fully validated: the policy exists, every setting is known and
    allowed, and the policy can be built with them."""
    if not isinstance(policy, str) or not policy:
        raise ControlError(f"'policy' must be a policy name, got {policy!r}")
    if not isinstance(settings, Mapping):
        raise ControlError(f"'settings' must be a JSON object, got {settings!r}")
    bad_key = next((k for k in settings if not isinstance(k, str)), None)
    if bad_key is not None:
        raise ControlError(f"setting names must be text, got {bad_key!r}")
    try:
        factory = get_policy_factory(policy)
    except LookupError as exc:
        raise ControlError(str(exc.args[0])) from None
    except Exception as exc:  # a broken plugin: refuse, naming it
        raise ControlError(f"policy {policy!r} is not available: {exc}") from None
    try:
        values = validate_settings(policy, factory.settings, settings)
    except SettingsError as exc:
        raise ControlError(str(exc)) from None
    # replace(): launch-time fields other than policy and settings carry over.
    config = dataclasses.replace(base, policy=policy, settings=values)
    try:
        config.create_policy()
    except Exception as exc:  # a constructor that refuses, however it says so
        raise ControlError(
            f"policy {policy!r} cannot be built with {values}: {exc}"
        ) from None
    return config


def validate_change(body: Any, current: GateConfig) -> GateConfig:
    """The configuration ``body`` asks for, fully validated.

    ``body``: ``{"policy": NAME, "settings": {KEY: VALUE, ...}, "shadow":
    BOOL}``, every key optional. Without ``policy`` the current policy stays
    and ``settings`` merge over its current settings; with another policy,
    ``settings`` apply over that policy's defaults. Without ``shadow`` shadow
    mode stays as it is.
    """
    if not isinstance(body, Mapping):
        raise ControlError(
            'the request body must be a JSON object like {"policy": "threshold", '
            '"settings": {"plain_above": 16}}'
        )
    unknown = sorted(str(k) for k in set(body) - _BODY_KEYS)
    if unknown:
        raise ControlError(
            f"unknown key {unknown[0]!r} in the request; allowed: policy, "
            "settings, shadow"
        )
    shadow = body.get("shadow", current.shadow)
    if not isinstance(shadow, bool):
        raise ControlError(f"'shadow' must be true or false, got {shadow!r}")
    policy = body.get("policy", current.policy)
    settings = body.get("settings", {})
    if not isinstance(policy, str) or not policy:
        raise ControlError(f"'policy' must be a policy name, got {policy!r}")
    if not isinstance(settings, Mapping):
        raise ControlError(f"'settings' must be a JSON object, got {settings!r}")
    raw: dict[str, Any] = {}
    if policy == current.policy:
        raw.update(current.settings)
    raw.update(settings)
    config = validate_config(policy, raw, current)
    return dataclasses.replace(config, shadow=shadow)


def parse_request(data: Any, launch_id: str | None = None) -> dict[str, Any] | None:
    """A control record read back from disk, validated as strictly as an HTTP
    request; None when it belongs to another launch (``launch_id`` given).

    Raises ControlError naming what is wrong.
    """
    if not isinstance(data, Mapping):
        raise ControlError(f"{CONTROL_FILE} must hold a JSON object")
    unknown = sorted(str(k) for k in set(data) - _RECORD_KEYS)
    if unknown:
        raise ControlError(f"{CONTROL_FILE}: unknown key {unknown[0]!r}")
    stamp = data.get("launch_id")
    if stamp is not None and not isinstance(stamp, str):
        raise ControlError(f"{CONTROL_FILE}: launch_id {stamp!r} is not text")
    if launch_id is not None and stamp != launch_id:
        return None
    version = data.get("version")
    if (
        isinstance(version, bool)
        or not isinstance(version, int)
        or not 1 <= version <= MAX_VERSION
    ):
        raise ControlError(
            f"{CONTROL_FILE}: version {version!r} is not allowed; expected an "
            f"integer in [1, {MAX_VERSION}]"
        )
    requested_at = data.get("requested_at", 0.0)
    if (
        isinstance(requested_at, bool)
        or not isinstance(requested_at, int | float)
        or not math.isfinite(requested_at)
    ):
        raise ControlError(f"{CONTROL_FILE}: requested_at {requested_at!r}")
    source = data.get("source", "")
    if not isinstance(source, str):
        raise ControlError(f"{CONTROL_FILE}: source {source!r} is not text")
    shadow = data.get("shadow", False)
    if not isinstance(shadow, bool):
        raise ControlError(f"{CONTROL_FILE}: shadow {shadow!r} is not true or false")
    config = validate_config(
        data.get("policy"), data.get("settings", {}), GateConfig("never")
    )
    return {
        "launch_id": stamp,
        "version": version,
        "policy": config.policy,
        "settings": config.settings,
        "requested_at": float(requested_at),
        "source": source,
        "shadow": shadow,
    }


_last_warning = [-_LOG_EVERY_S]


def _warn(directory: Any, exc: BaseException) -> None:
    now = time.monotonic()
    if now - _last_warning[0] >= _LOG_EVERY_S:
        _last_warning[0] = now
        logger.warning(
            "eagle_gate: ignoring %s in %s: %s (logged at most once a minute)",
            CONTROL_FILE,
            directory,
            exc,
        )


def read_request(
    status_dir: StatusDir | str | os.PathLike[str], launch_id: str | None = None
) -> dict[str, Any] | None:
    """The last valid control request of launch ``launch_id`` (any launch when
    None) in ``status_dir``, or None. Never raises: an unreadable or invalid
    file is ignored with a log line at most once a minute."""
    directory = as_status_dir(status_dir)
    try:
        data = directory.read_json(CONTROL_FILE)
        return None if data is None else parse_request(data, launch_id)
    except Exception as exc:
        _warn(directory, exc)
        return None


def write_request(
    status_dir: StatusDir | str | os.PathLike[str],
    config: GateConfig,
    *,
    launch_id: str | None = None,
    source: str = "",
    at_least: int = 0,
) -> dict[str, Any]:
    """Write ``config`` as the next version (above the last request and above
    ``at_least``, the highest version a scheduler reports); return the record.

    Single writer: the HTTP process (its handlers run on one event loop and do
    not await between reading the old version and renaming the new file).
    """
    directory = as_status_dir(status_dir)
    previous = read_request(directory, launch_id)
    version = max(previous["version"] if previous else 0, at_least) + 1
    if version > MAX_VERSION:
        raise ControlError(f"no version left after {MAX_VERSION}")
    record: dict[str, Any] = {
        "v": 1,
        "launch_id": launch_id,
        "version": version,
        "policy": config.policy,
        "settings": config.settings,
        "shadow": config.shadow,
        "requested_at": time.time(),
        "source": source,
    }
    try:
        text = json.dumps(record, sort_keys=True, allow_nan=False)
    except ValueError as exc:  # validated settings are finite; belt and braces
        raise ControlError(f"the request cannot be stored: {exc}") from None
    directory.write_text(CONTROL_FILE, text)
    return record


class ControlFile:
    """Cheap polling of ``control.json``: one ``stat`` per poll, a read (and a
    full validation) only when the file changed. Never raises."""

    def __init__(
        self,
        status_dir: StatusDir | str | os.PathLike[str],
        launch_id: str | None = None,
    ) -> None:
        self.directory = as_status_dir(status_dir)
        self.path = self.directory.path / CONTROL_FILE
        self.launch_id = launch_id
        self._sig: tuple[int, int, int] | None = None
        self._last: tuple[int, str] = (0, "")

    def poll(self) -> tuple[int, str]:
        """``(version, config JSON)`` of the newest valid request of this
        launch (``(0, "")``: none). A version is never lower than the last one."""
        try:
            st = self.directory.stat(CONTROL_FILE)
        except Exception:
            return self._last
        sig = (st.st_ino, st.st_mtime_ns, st.st_size)
        if sig == self._sig:
            return self._last
        self._sig = sig
        record = read_request(self.directory, self.launch_id)
        if record is None or record["version"] <= self._last[0]:
            return self._last
        text = json.dumps(
            {
                "policy": record["policy"],
                "settings": record["settings"],
                "shadow": record["shadow"],
            },
            sort_keys=True,
        )
        self._last = (record["version"], text)
        return self._last


def config_from_request(text: str, base: GateConfig) -> GateConfig:
    """``base`` with the policy, settings and shadow mode of a request (other
    fields stay)."""
    data = json.loads(text)
    return dataclasses.replace(
        base,
        policy=str(data["policy"]),
        settings=dict(data.get("settings") or {}),
        shadow=bool(data.get("shadow", base.shadow)),
    )


#: (rank 0's version, its config JSON or None) -> the agreed (version, JSON)
Broadcast = Callable[[int, str | None], tuple[int, str | None]]


class ControlAgreement:
    """The ``GateRuntime.on_tick`` hook that applies control requests.

    ``broadcast``: None with ``tp_size == 1``; otherwise a function every rank
    calls at the same step, returning rank 0's ``(version, config JSON)``
    (:func:`torch_broadcast`). Nothing before the broadcast can raise, so a
    bad file on rank 0 never leaves the other ranks waiting in it.
    """

    def __init__(
        self,
        control: ControlFile,
        *,
        is_source: bool,
        broadcast: Broadcast | None = None,
    ) -> None:
        self.control = control
        self.is_source = is_source
        self.broadcast = broadcast
        self.poll_errors = 0

    def _read(self) -> tuple[int, str]:
        try:
            version, text = self.control.poll()
            if (
                isinstance(version, int)
                and 0 <= version <= MAX_VERSION
                and isinstance(text, str)
            ):
                return version, text
        except Exception:
            self.poll_errors += 1
        return 0, ""

    def __call__(self, rt: Any, step: int) -> None:
        """At a tick of runtime ``rt`` (``GateRuntime.on_tick``): apply rank
        0's newest request, on every rank alike."""
        version, text = self._read() if self.is_source else (0, "")
        if self.broadcast is not None:
            version, text = self.broadcast(version, text)
        if version > rt.config_version and text:
            rt.apply_config(config_from_request(text, rt.config), version)


def torch_broadcast(cpu_group: Any) -> Broadcast:
    """A :data:`Broadcast` over a torch.distributed (gloo) CPU group.

    Every rank sends one int64 (rank 0's version) per tick; the configuration
    itself travels (``broadcast_object_list``) only when the version is new to
    this rank's runtime, which is the same on all ranks. A version that does
    not fit an int64 is sent as 0 (no change) rather than raising before the
    collective.
    """
    import torch
    import torch.distributed as dist

    src = dist.get_global_rank(cpu_group, 0)
    buf = torch.zeros(1, dtype=torch.int64)
    state = {"known": 0}

    def broadcast(version: int, text: str | None) -> tuple[int, str | None]:
        ok = isinstance(version, int) and 0 <= version <= MAX_VERSION
        buf[0] = version if ok else 0
        dist.broadcast(buf, src=src, group=cpu_group)
        agreed = int(buf[0])
        if agreed <= state["known"]:
            return agreed, None
        obj = [text if ok and isinstance(text, str) else ""]
        dist.broadcast_object_list(obj, src=src, group=cpu_group)
        state["known"] = agreed
        return agreed, obj[0]

    return broadcast
