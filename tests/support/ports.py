"""Server ports that concurrent test sessions never hand out twice.

``scripts/test.sh`` runs several pytest sessions side by side (two per SGLang
version), each starting real servers. Asking the kernel for a free port
(``bind(("127.0.0.1", 0))``) is not enough there: that port comes from the
ephemeral range, where every outgoing connection, SGLang's own NCCL/gloo port
(0.5.9's ``get_free_port``) and the other session's next ``bind(0)`` also
land, and the port is only *free now*: another session can take it before the
server binds it. A CI run failed that way (a 0.5.23 baseline exited with
uvicorn's startup failure, 3, after its warmup talked to another session's
server on the same port).

So ports come from a range below both the kernel's ephemeral range (32768+)
and the range SGLang 0.5.23 picks its own ports from (22000-29999,
``get_free_port_below_ephemeral``), in slots ``SLOT`` apart so the ports
SGLang derives from the server port (DP attention: port + 233 .. port + 240)
stay inside the slot. A file under the temp directory, locked with ``flock``,
records when each slot was handed out; the least recently handed-out slot
whose ports bind right now is the next one, so two sessions never get the same
slot while the other's server may still run.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import tempfile
import time
from pathlib import Path

__all__ = ["reserve_port", "FIRST", "LAST", "SLOT"]

#: first and last slot start; ``LAST + SLOT`` stays below 22000.
FIRST = 10_000
LAST = 21_500
#: ports per slot: covers SGLang's derived ports (port + 233 .. + 240).
SLOT = 250
#: ports within a slot that must bind for the slot to be handed out
_PROBED = (0, 233, 234, 235, 236, 237, 238, 239, 240)

_STATE = Path(tempfile.gettempdir()) / "eagle-gate-test-ports.json"


def _binds(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def reserve_port(state: Path = _STATE, slots: range | None = None) -> int:
    """A server port no concurrent session has been handed recently (see
    module doc); ``slots``: the slot starts to pick from (default: all)."""
    slots = range(FIRST, LAST + 1, SLOT) if slots is None else slots
    fd = os.open(state.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            handed = json.loads(state.read_text())
        except (OSError, ValueError):
            handed = {}
        for port in sorted(slots, key=lambda p: handed.get(str(p), 0.0)):
            if all(_binds(port + d) for d in _PROBED):
                handed[str(port)] = time.time()
                tmp = state.with_suffix(f".{os.getpid()}.tmp")
                tmp.write_text(json.dumps(handed))
                os.replace(tmp, state)
                return port
    finally:
        os.close(fd)
    raise RuntimeError(
        f"no free server port slot in {FIRST}..{LAST + SLOT - 1} "
        f"(every slot has a bound port); is something else listening there?"
    )
