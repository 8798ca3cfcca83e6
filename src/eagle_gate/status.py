"""Machine-readable proof that every scheduler process runs the gate.

Each SGLang scheduler process in which the gate activates writes one JSON file,
``scheduler-<pid>.json``, into the status directory (setting ``status_dir``;
default ``$TMPDIR/eagle_gate-<server pid>``). ``eagle-gate status`` reads them
and checks that each writer is still alive.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["write_process_status", "read_status", "aggregate"]


def write_process_status(directory: str | os.PathLike[str], record: dict) -> Path:
    """Atomically write this process's status record; return its path."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"scheduler-{os.getpid()}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, sort_keys=True, indent=1), encoding="utf-8")
    os.replace(tmp, path)
    return path


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_status(directory: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """All records in ``directory``, each with ``alive`` added, ordered by rank."""
    records = []
    for path in sorted(Path(directory).glob("scheduler-*.json")):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        record["alive"] = _alive(int(record.get("pid", -1)))
        records.append(record)
    records.sort(key=lambda r: (r.get("dp_rank") or 0, r.get("tp_rank") or 0))
    return records


def _agree(records: list[dict[str, Any]], key: str) -> bool:
    values = {json.dumps(r.get(key), sort_keys=True) for r in records}
    return len(values) <= 1


def aggregate(
    directory: str | os.PathLike[str],
    records: list[dict[str, Any]],
    request: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One server-wide view: the records, whether the ranks agree, and the
    last runtime-control request (``eagle_gate.control``).

    ``agreement``: every scheduler reports the same policy, settings and
    configuration version; ``pending``: a requested version not yet in effect
    everywhere; ``ok``: at least one scheduler, all alive, agreeing, none
    degraded.
    """
    live = [r for r in records if r.get("alive")]
    agreement = {
        key: _agree(live, key) for key in ("policy", "settings", "config_version")
    }
    requested = int(request.get("version", 0)) if request else 0
    versions = [int(r.get("config_version") or 0) for r in live]
    pending = bool(live) and requested > min(versions)
    degraded = any(r.get("degraded") for r in live)
    ok = bool(records) and len(live) == len(records) and all(agreement.values())
    return {
        "status_dir": str(directory),
        "ok": ok and not degraded,
        "agreement": {**agreement, "all": all(agreement.values())},
        "degraded": degraded,
        "requested": request,
        "pending": pending,
        "schedulers": records,
    }
