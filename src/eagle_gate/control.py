"""Changing the policy or its settings on a running server.

Flow (see README "Operating the gate"):

1. ``POST /eagle_gate/policy`` (HTTP process, :mod:`eagle_gate.http_api`)
   validates the change with :func:`validate_change` exactly like a launch
   configuration (unknown policy, unknown setting, bad value, a policy
   constructor that refuses: 400 naming the problem; nothing changes) and
   writes it as the next numbered version into ``<status_dir>/control.json``
   (:func:`write_request`, atomic rename).
2. Every scheduler process picks the request up, but only at decode steps that
   are multiples of ``tick_every`` (``GateRuntime.on_tick``): TP rank 0 checks
   the file (one ``stat``; a read only when it changed) and, with ``tp_size >
   1``, broadcasts the version it read over the scheduler's CPU process group
   (the attention-TP group: the ranks that run the same decode batches) at that
   step; when the version is new it broadcasts the configuration too. Every
   rank therefore switches at the same step (:class:`ControlAgreement`).
3. Each scheduler reports ``config_version`` in its status; the HTTP status
   says whether all ranks agree.

A server that is not speculating (the gate idle) has no decode steps to agree
on and nothing that uses the policy; there the ops thread applies requests as
soon as it sees them.

No SGLang or torch at module level (torch is imported only for a TP broadcast).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from eagle_gate.config import ConfigError, GateConfig
from eagle_gate.plugins import get_policy_factory
from eagle_gate.settings import SettingsError, validate_settings

__all__ = [
    "CONTROL_FILE",
    "ControlError",
    "ControlAgreement",
    "ControlFile",
    "read_request",
    "validate_change",
    "write_request",
]

CONTROL_FILE = "control.json"
_BODY_KEYS = {"policy", "settings"}


class ControlError(ValueError):
    """A requested change is invalid; the message names the problem."""


def validate_change(body: Any, current: GateConfig) -> GateConfig:
    """The configuration ``body`` asks for, fully validated.

    ``body``: ``{"policy": NAME, "settings": {KEY: VALUE, ...}}``, both keys
    optional. Without ``policy`` the current policy stays and ``settings``
    merge over its current settings; with another policy, ``settings`` apply
    over that policy's defaults.
    """
    if not isinstance(body, Mapping):
        raise ControlError(
            'the request body must be a JSON object like {"policy": "threshold", '
            '"settings": {"plain_above": 16}}'
        )
    unknown = sorted(set(body) - _BODY_KEYS)
    if unknown:
        raise ControlError(
            f"unknown key {unknown[0]!r} in the request; allowed: policy, settings"
        )
    policy = body.get("policy", current.policy)
    if not isinstance(policy, str) or not policy:
        raise ControlError(f"'policy' must be a policy name, got {policy!r}")
    settings = body.get("settings", {})
    if not isinstance(settings, Mapping):
        raise ControlError(f"'settings' must be a JSON object, got {settings!r}")
    raw: dict[str, Any] = {}
    if policy == current.policy:
        raw.update(current.settings)
    raw.update(settings)
    try:
        factory = get_policy_factory(policy)
    except LookupError as exc:
        raise ControlError(str(exc.args[0])) from None
    try:
        values = validate_settings(policy, factory.settings, raw)
    except SettingsError as exc:
        raise ControlError(str(exc)) from None
    # replace(): launch-time fields other than policy and settings carry over.
    config = dataclasses.replace(current, policy=policy, settings=values)
    try:
        config.create_policy()
    except (ConfigError, SettingsError, ValueError, TypeError) as exc:
        raise ControlError(str(exc)) from None
    return config


def read_request(status_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The last control request in ``status_dir``, or None."""
    try:
        data = json.loads((Path(status_dir) / CONTROL_FILE).read_text("utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_request(
    status_dir: str | os.PathLike[str], config: GateConfig, *, source: str = ""
) -> dict[str, Any]:
    """Write ``config`` as the next version; return the record written.

    Single writer: the HTTP process (its handlers run on one event loop and do
    not await between reading the old version and renaming the new file).
    """
    d = Path(status_dir)
    d.mkdir(parents=True, exist_ok=True)
    previous = read_request(d)
    version = int(previous.get("version", 0)) + 1 if previous else 1
    record = {
        "version": version,
        "policy": config.policy,
        "settings": config.settings,
        "requested_at": time.time(),
        "source": source,
    }
    tmp = d / f".{CONTROL_FILE}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(record, sort_keys=True), encoding="utf-8")
    os.replace(tmp, d / CONTROL_FILE)
    return record


class ControlFile:
    """Cheap polling of ``control.json``: one ``stat`` per poll, a read only
    when size or mtime changed."""

    def __init__(self, status_dir: str | os.PathLike[str]) -> None:
        self.path = Path(status_dir) / CONTROL_FILE
        self._sig: tuple[int, int] | None = None
        self._last: tuple[int, str] = (0, "")

    def poll(self) -> tuple[int, str]:
        """``(version, config JSON)`` of the newest request (``(0, "")``: none)."""
        try:
            st = os.stat(self.path)
        except OSError:
            return self._last
        sig = (st.st_mtime_ns, st.st_size)
        if sig == self._sig:
            return self._last
        self._sig = sig
        try:
            data = json.loads(self.path.read_text("utf-8"))
            version = int(data["version"])
            text = json.dumps(
                {"policy": data["policy"], "settings": data.get("settings") or {}},
                sort_keys=True,
            )
        except (OSError, ValueError, KeyError, TypeError):
            return self._last
        self._last = (version, text)
        return self._last


def config_from_request(text: str, base: GateConfig) -> GateConfig:
    """``base`` with the policy and settings of a request (other fields stay)."""
    data = json.loads(text)
    return dataclasses.replace(
        base,
        policy=str(data["policy"]),
        settings=dict(data.get("settings") or {}),
    )


#: (rank 0's version, its config JSON or None) -> the agreed (version, JSON)
Broadcast = Callable[[int, str | None], tuple[int, str | None]]


class ControlAgreement:
    """The ``GateRuntime.on_tick`` hook that applies control requests.

    ``broadcast``: None with ``tp_size == 1``; otherwise a function every rank
    calls at the same step, returning rank 0's ``(version, config JSON)``
    (:func:`torch_broadcast`).
    """

    def __init__(
        self,
        runtime: Any,
        control: ControlFile,
        *,
        is_source: bool,
        broadcast: Broadcast | None = None,
    ) -> None:
        self.runtime = runtime
        self.control = control
        self.is_source = is_source
        self.broadcast = broadcast

    def __call__(self, step: int) -> None:
        rt = self.runtime
        if self.is_source:
            version, text = self.control.poll()
        else:
            version, text = 0, ""
        if self.broadcast is not None:
            version, text = self.broadcast(version, text)
        if version > rt.config_version and text:
            rt.apply_config(config_from_request(text, rt.config), version)


def torch_broadcast(cpu_group: Any) -> Broadcast:
    """A :data:`Broadcast` over a torch.distributed (gloo) CPU group.

    Every rank sends one int64 (rank 0's version) per tick; the configuration
    itself travels (``broadcast_object_list``) only when the version is new to
    this rank's runtime, which is the same on all ranks.
    """
    import torch
    import torch.distributed as dist

    src = dist.get_global_rank(cpu_group, 0)
    buf = torch.zeros(1, dtype=torch.int64)
    state = {"known": 0}

    def broadcast(version: int, text: str | None) -> tuple[int, str | None]:
        buf[0] = version
        dist.broadcast(buf, src=src, group=cpu_group)
        agreed = int(buf[0])
        if agreed <= state["known"]:
            return agreed, None
        obj = [text]
        dist.broadcast_object_list(obj, src=src, group=cpu_group)
        state["known"] = agreed
        return agreed, obj[0]

    return broadcast
