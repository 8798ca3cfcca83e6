"""Asking the servers over HTTP (reachable, ``/server_info``, the
acceptance length SGLang reports) and reading the gate's step counters from
its status directory. Used by :mod:`eagle_gate.bench.runner`."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

__all__ = [
    "accept_length_of",
    "fetch_server_info",
    "gate_counters",
    "server_reachable",
    "summarize_server_info",
]


def _get_json(url: str, timeout_s: float) -> Any:
    with urllib.request.urlopen(url, timeout=timeout_s) as r:
        return json.loads(r.read().decode("utf-8", "replace"))


def server_reachable(url: str, timeout_s: float = 5.0) -> str | None:
    """None if the server answers ``/health`` (or ``/v1/models``), else why not."""
    why = "no answer"
    for path in ("/health", "/v1/models"):
        try:
            with urllib.request.urlopen(url + path, timeout=timeout_s) as r:
                if r.status == 200:
                    return None
                why = f"GET {path}: HTTP {r.status}"
        except urllib.error.HTTPError as e:
            why = f"GET {path}: HTTP {e.code}"
        except (urllib.error.URLError, OSError, ValueError) as e:
            why = f"GET {path}: {getattr(e, 'reason', e)}"
    return f"server {url} unreachable ({why})"


def fetch_server_info(url: str, timeout_s: float = 10.0) -> dict[str, Any] | None:
    """The server's ``/server_info`` (or ``/get_server_info``); None if neither."""
    for path in ("/server_info", "/get_server_info"):
        try:
            info = _get_json(url + path, timeout_s)
        except (urllib.error.URLError, OSError, ValueError):
            continue
        if isinstance(info, dict):
            if "decode" in info and isinstance(info["decode"], list) and info["decode"]:
                info = info["decode"][0]  # PD disaggregation: the decode server
            return info
    return None


_INFO_KEYS = (
    "model_path",
    "tp_size",
    "dp_size",
    "speculative_algorithm",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
    "max_running_requests",
    "max_prefill_tokens",
    "chunked_prefill_size",
    "version",
)


def summarize_server_info(info: Mapping[str, Any] | None) -> dict[str, Any]:
    """The fields of a server info that matter here (JSON-able, small)."""
    if not info:
        return {}
    out = {k: info.get(k) for k in _INFO_KEYS if k in info}
    states = info.get("internal_states")
    if isinstance(states, list) and states and isinstance(states[0], dict):
        st = states[0]
        for key in ("avg_spec_accept_length", "effective_max_running_requests_per_dp"):
            if isinstance(st.get(key), int | float):
                out[key] = st[key]
    return out


def accept_length_of(info: Mapping[str, Any] | None) -> float | None:
    v = summarize_server_info(info).get("avg_spec_accept_length")
    return float(v) if isinstance(v, int | float) and v > 0 else None


# ---------------------------------------------------------------------------
# Gate status (optional)
# ---------------------------------------------------------------------------


def gate_counters(status_dir: str) -> dict[str, int] | None:
    """Summed SPEC/PLAIN step counters of the gate's rank-0 records, or None."""
    from eagle_gate.status import read_status

    try:
        records = read_status(status_dir)
    except (OSError, ValueError):  # missing or unsafe directory
        return None
    spec = plain = 0
    seen = False
    for rec in records:
        if rec.get("tp_rank") not in (0, None) or not rec.get("alive", True):
            continue
        steps = rec.get("steps")
        if isinstance(steps, dict):
            spec += int(steps.get("spec") or 0)
            plain += int(steps.get("plain") or 0)
            seen = True
    return {"spec": spec, "plain": plain} if seen else None
