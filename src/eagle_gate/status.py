"""Machine-readable proof that every scheduler process runs the gate.

Each SGLang scheduler process in which the gate activates writes one JSON file,
``scheduler-<pid>.json``, into the status directory of its launch
(:mod:`eagle_gate.statusdir`; setting ``status_dir``, default a private
``$TMPDIR/eagle_gate-<server pid>-XXXXXXXX``), about once a second.
``eagle-gate status`` and ``GET /eagle_gate/status`` read them back (strictly:
regular files of this user, standard JSON, the launch's id) and check that
each writer is still alive and still writing (``updated_at``).
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from pathlib import Path
from typing import Any

from eagle_gate.statusdir import StatusDir, alive, as_status_dir, finite

__all__ = ["write_process_status", "read_status", "aggregate", "STALE_AFTER_S"]

_NAME = re.compile(r"^scheduler-(\d+)\.json$")
#: a live record older than max(STALE_AFTER_S, STALE_ROUNDS x its writer's
#: interval) is stale: its ops thread is dead, hung or cannot write.
STALE_AFTER_S = 10.0
STALE_ROUNDS = 5


def write_process_status(
    directory: StatusDir | str | os.PathLike[str], record: dict
) -> Path:
    """Atomically write this process's status record; return its path.

    Non-finite numbers become null, so readers always get standard JSON.
    """
    return as_status_dir(directory).write_json(
        f"scheduler-{os.getpid()}.json", finite(record)
    )


def read_status(
    directory: StatusDir | str | os.PathLike[str], launch_id: str | None = None
) -> list[dict[str, Any]]:
    """The records in ``directory`` of launch ``launch_id`` (every launch when
    None), each with ``alive`` added, ordered by rank.

    A file that is not a valid record (a symlink, another owner, not standard
    JSON, a pid that does not match its name) is skipped. Raises StatusDirError
    (a ValueError) when the directory itself is missing or unsafe.
    """
    d = as_status_dir(directory)
    records = []
    for name in sorted(d.names()):
        match = _NAME.match(name)
        if match is None:
            continue
        try:
            record = d.read_json(name)
        except (OSError, ValueError):
            continue
        pid = record.get("pid") if isinstance(record, dict) else None
        if isinstance(pid, bool) or pid != int(match.group(1)):
            continue
        if launch_id is not None and record.get("launch_id") != launch_id:
            continue
        record["alive"] = alive(pid)
        records.append(record)

    def rank(r: dict[str, Any]) -> tuple[int, int]:
        dp, tp = r.get("dp_rank"), r.get("tp_rank")
        return (
            dp if isinstance(dp, int) else 0,
            tp if isinstance(tp, int) else 0,
        )

    records.sort(key=rank)
    return records


def _agree(records: list[dict[str, Any]], key: str) -> bool:
    values = {json.dumps(r.get(key), sort_keys=True) for r in records}
    return len(values) <= 1


def _age(record: dict[str, Any], now: float) -> float | None:
    updated = record.get("updated_at")
    if isinstance(updated, bool) or not isinstance(updated, int | float):
        return None
    return now - updated if math.isfinite(updated) else None


def _stale_after(record: dict[str, Any]) -> float:
    ops = record.get("ops")
    interval = ops.get("interval_s") if isinstance(ops, dict) else None
    if isinstance(interval, bool) or not isinstance(interval, int | float):
        interval = 1.0
    return max(STALE_AFTER_S, STALE_ROUNDS * float(interval))


def _version(record: dict[str, Any]) -> int:
    v = record.get("config_version")
    return v if isinstance(v, int) and not isinstance(v, bool) else 0


def _speculative(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The speculative setup SGLang resolved (each record's ``speculative``),
    server-wide when every live scheduler reports the same; None otherwise."""
    if not records or not _agree(records, "speculative"):
        return None
    value = records[0].get("speculative")
    return value if isinstance(value, dict) else None


def aggregate(
    directory: StatusDir | str | os.PathLike[str],
    records: list[dict[str, Any]],
    request: dict[str, Any] | None = None,
    *,
    now: float | None = None,
) -> dict[str, Any]:
    """One server-wide view: the records, whether the ranks agree, and the
    last runtime-control request (``eagle_gate.control``).

    ``agreement``: every scheduler reports the same policy, settings,
    configuration version and shadow mode; ``shadow``: every live scheduler
    is in shadow mode; ``pending``: a requested version not yet in effect
    everywhere; ``stale``: pids of live schedulers whose record was not
    rewritten in time (each record gets ``age_s`` and ``stale``); ``ok``: at
    least one scheduler, all alive and fresh, agreeing, none degraded.
    """
    now = time.time() if now is None else now
    live = [r for r in records if r.get("alive")]
    stale = []
    for r in records:
        age = _age(r, now)
        r["age_s"] = None if age is None else round(age, 3)
        r["stale"] = bool(r.get("alive")) and (age is None or age > _stale_after(r))
        if r["stale"]:
            stale.append(r.get("pid"))
    agreement = {
        key: _agree(live, key)
        for key in ("policy", "settings", "config_version", "shadow")
    }
    requested = request.get("version", 0) if request else 0
    requested = requested if isinstance(requested, int) else 0
    versions = [_version(r) for r in live]
    pending = bool(live) and requested > min(versions)
    degraded = any(r.get("degraded") for r in live)
    ok = (
        bool(records)
        and len(live) == len(records)
        and not stale
        and all(agreement.values())
    )
    return {
        "status_dir": str(directory),
        "speculative": _speculative(live),
        "ok": ok and not degraded,
        "agreement": {**agreement, "all": all(agreement.values())},
        "degraded": degraded,
        "shadow": bool(live) and all(r.get("shadow") is True for r in live),
        "stale": stale,
        "requested": request,
        "pending": pending,
        "schedulers": records,
    }
