"""The status directory: private, one launch at a time, read back strictly.

Why this module exists: the status directory carries runtime control
(``control.json``) into every scheduler process. Whoever can write there can
change the policy of a running server, or (with a symlink) make the server
overwrite any file it can write; a file left by a previous run would silently
override the launch configuration. So:

* the launcher creates the directory with mode 0700 (by default a fresh
  ``mkdtemp`` directory, whose name nobody can predict), and every process
  checks, on a descriptor opened with ``O_NOFOLLOW``, that it is a directory
  owned by this user that nobody else may enter (:class:`StatusDir`);
* files are opened relative to that descriptor with ``O_NOFOLLOW``, must be
  regular files owned by this user and small, and are parsed as strict JSON
  (no NaN or Infinity); they are written to ``O_EXCL`` temporary files that
  are renamed into place;
* each launch has an id (:class:`LaunchInfo`). The launcher clears the
  previous run's control and status files, writes ``launch.json`` and exports
  the launch to every SGLang process in ``EAGLE_GATE_LAUNCH``. Control requests
  and status records carry the id; readers ignore those of another launch.
  The environment variable is also how processes find the directory:
  schedulers under SGLang's data-parallel controller are grandchildren of the
  server, so their parent's pid does not name it.

The first two points, which know nothing of launches, are
:mod:`eagle_gate.privatedir`; this module is the launch's life (start, inherit
through the process ancestry in ``/proc``, find) on top of it. Every name of
both is importable from here.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import re
import secrets
import tempfile
import time
from collections.abc import Iterable, Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# the secure directory I/O lives in its own module; its names stay importable
# from here, where every caller has always found them
from eagle_gate.privatedir import (
    MAX_FILE_BYTES,
    StatusDir,
    StatusDirError,
    as_status_dir,
    check_private,
    ensure_private_dir,
    finite,
    strict_loads,
)

logger = logging.getLogger("eagle_gate")

__all__ = [
    "ENV_LAUNCH",
    "LAUNCH_FILE",
    "MAX_FILE_BYTES",
    "LaunchInfo",
    "StatusDir",
    "StatusDirError",
    "alive",
    "ancestors",
    "as_status_dir",
    "check_private",
    "ensure_launch",
    "ensure_private_dir",
    "find_status_dir",
    "finite",
    "inherited_launch",
    "launch_from_environment",
    "read_launch_file",
    "start_launch",
    "strict_loads",
]

ENV_LAUNCH = "EAGLE_GATE_LAUNCH"
LAUNCH_FILE = "launch.json"
#: files of a previous run that the launcher clears (and nothing else).
_RUN_FILES = re.compile(
    r"^(control\.json|launch\.json|scheduler-\d+\.json|scheduler-\d+\.json\.tmp|"
    r"\.(control|launch|scheduler-\d+)\.json\.[0-9a-f.]+\.tmp)$"
)
_LAUNCH_ID = re.compile(r"^[0-9a-f]{16}$")


# -- the launch ------------------------------------------------------------------------
@dataclass(frozen=True)
class LaunchInfo:
    """One server launch: its id, the launcher's pid and its status directory."""

    launch_id: str
    server_pid: int
    status_dir: str

    def to_json(self) -> str:
        return json.dumps(
            {
                "launch_id": self.launch_id,
                "server_pid": self.server_pid,
                "status_dir": self.status_dir,
            },
            sort_keys=True,
        )

    @classmethod
    def from_mapping(cls, data: Any) -> LaunchInfo:
        """Validate a launch record (raises ValueError naming the problem)."""
        if not isinstance(data, Mapping):
            raise ValueError("a launch record must be a JSON object")
        launch_id = data.get("launch_id")
        if not isinstance(launch_id, str) or not _LAUNCH_ID.match(launch_id):
            raise ValueError(f"launch_id {launch_id!r} is not 16 hex digits")
        pid = data.get("server_pid")
        if isinstance(pid, bool) or not isinstance(pid, int) or not 0 < pid < 2**31:
            raise ValueError(f"server_pid {pid!r} is not a process id")
        directory = data.get("status_dir")
        if not isinstance(directory, str) or not os.path.isabs(directory):
            raise ValueError(f"status_dir {directory!r} is not an absolute path")
        return cls(launch_id, pid, directory)


def _parent_of(pid: int) -> int | None:
    if pid == os.getpid():
        return os.getppid()
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode("utf-8", "replace")
        return int(text[text.rindex(")") + 2 :].split()[1])
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil

        return psutil.Process(pid).ppid()
    except Exception:
        return None


def ancestors(limit: int = 64) -> list[int]:
    """Pids of this process's parent, grandparent, ... (nearest first)."""
    out: list[int] = []
    pid = os.getpid()
    for _ in range(limit):
        parent = _parent_of(pid)
        if not parent or parent in out:
            break
        out.append(parent)
        pid = parent
    return out


def launch_from_environment(
    environ: Mapping[str, str] | None = None,
) -> LaunchInfo | None:
    """``EAGLE_GATE_LAUNCH`` of ``environ``, validated; None if absent or invalid.

    A scheduler trusts it as it is: its launcher (the gate's, or SGLang's with
    the plugin) always sets it before spawning anything, and the same value
    reaches every rank, so every rank makes the same choices from it.
    """
    env = os.environ if environ is None else environ
    text = env.get(ENV_LAUNCH)
    if not text:
        return None
    try:
        return LaunchInfo.from_mapping(strict_loads(text))
    except ValueError as exc:
        logger.warning("eagle_gate: ignoring %s: %s", ENV_LAUNCH, exc)
        return None


def inherited_launch(
    environ: Mapping[str, str] | None = None,
) -> LaunchInfo | None:
    """The launch this process belongs to, from ``EAGLE_GATE_LAUNCH``: one this
    process started, or one of its ancestors' (SGLang's HTTP workers, DP
    controller, schedulers). None if absent, invalid or foreign (a value
    inherited from some unrelated process)."""
    info = launch_from_environment(environ)
    if info is None:
        return None
    if info.server_pid == os.getpid() or info.server_pid in ancestors():
        return info
    return None


def read_launch_file(directory: StatusDir) -> dict[str, Any] | None:
    """``launch.json`` of ``directory`` (validated), or None."""
    try:
        data = directory.read_json(LAUNCH_FILE)
        if data is None:
            return None
        info = LaunchInfo.from_mapping(
            {**data, "status_dir": os.path.abspath(directory.path)}
        )
    except (OSError, ValueError):
        return None
    return {"launch_id": info.launch_id, "server_pid": info.server_pid, **data}


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists (one we may not signal counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def start_launch(
    status_dir: str | os.PathLike[str] | None,
    environ: MutableMapping[str, str] | None = None,
) -> LaunchInfo:
    """Begin a launch in this (the launcher) process.

    Makes the status directory (``status_dir``, created 0700 or checked; None:
    a fresh private ``$TMPDIR/eagle_gate-<pid>-XXXXXXXX``), removes the previous
    run's control request and status records from it, writes ``launch.json``
    and exports the launch in ``environ[EAGLE_GATE_LAUNCH]`` for every process
    SGLang starts from here. Raises StatusDirError.
    """
    env = os.environ if environ is None else environ
    pid = os.getpid()
    if status_dir:
        path = ensure_private_dir(status_dir)
    else:
        path = Path(tempfile.mkdtemp(prefix=f"eagle_gate-{pid}-"))
    directory = StatusDir(path)
    cleared: list[str] = []
    try:
        directory.fileno()
        previous = read_launch_file(directory)
        if previous and previous["server_pid"] != pid and alive(previous["server_pid"]):
            logger.warning(
                "eagle_gate: status directory %s was in use by server pid %d, which "
                "still runs; this launch takes it over (give each server its own "
                "status directory)",
                path,
                previous["server_pid"],
            )
        cleared = [n for n in directory.names() if _RUN_FILES.match(n)]
        for name in cleared:
            directory.remove(name)
        info = LaunchInfo(secrets.token_hex(8), pid, str(path))
        directory.write_json(
            LAUNCH_FILE,
            {
                "v": 1,
                "launch_id": info.launch_id,
                "server_pid": pid,
                "started_at": time.time(),
            },
        )
    except OSError as exc:
        raise StatusDirError(f"status directory {str(path)!r}: {exc}") from None
    finally:
        directory.close()
    if cleared:
        logger.info(
            "eagle_gate: cleared %d file(s) of a previous run from %s",
            len(cleared),
            path,
        )
    env[ENV_LAUNCH] = info.to_json()
    return info


def ensure_launch(
    status_dir: str | os.PathLike[str] | None,
    environ: MutableMapping[str, str] | None = None,
) -> tuple[LaunchInfo, bool]:
    """The launch of this process: inherited, or started here. Returns
    ``(launch, started)``.

    A process SGLang spawned (multiprocessing, so it has a parent process
    object) inherits its launcher's launch. A process that is no such child (a
    launcher: ``sglang.launch_server``, an ``Engine`` in a script) starts a new
    launch even if its environment carries an older one.
    """
    launch = inherited_launch(environ)
    if launch is not None and (
        launch.server_pid == os.getpid() or multiprocessing.parent_process() is not None
    ):
        return launch, False
    return start_launch(status_dir, environ), True


def find_status_dir(
    server_pid: int, candidates: Iterable[Path] | None = None
) -> Path | None:
    """The status directory of the server ``server_pid`` on this machine: a
    private directory of this user under ``$TMPDIR`` whose ``launch.json``
    names that pid (the default location; ``--status-dir`` for others)."""
    if candidates is None:
        candidates = Path(tempfile.gettempdir()).glob(f"eagle_gate-{server_pid}-*")
    best: tuple[float, Path] | None = None
    for path in candidates:
        directory = StatusDir(path)
        try:
            directory.fileno()
            launch = read_launch_file(directory)
        except (OSError, ValueError):
            continue
        finally:
            directory.close()
        if launch and launch["server_pid"] == server_pid:
            started = launch.get("started_at")
            started = started if isinstance(started, int | float) else 0.0
            if best is None or started > best[0]:
                best = (started, path)
    return None if best is None else best[1]
