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
"""

from __future__ import annotations

import errno
import json
import logging
import math
import multiprocessing
import os
import re
import secrets
import stat
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle_gate.config import ConfigError

logger = logging.getLogger("eagle_gate")

__all__ = [
    "ENV_LAUNCH",
    "LAUNCH_FILE",
    "LaunchInfo",
    "StatusDir",
    "StatusDirError",
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
#: no file the gate reads back is anywhere near this large.
MAX_FILE_BYTES = 1 << 20
_PRIVATE_MODE = 0o700


class StatusDirError(ConfigError):
    """The status directory is unsafe or unusable; the message says why."""


# -- strict JSON -----------------------------------------------------------------
def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed in JSON here")


def strict_loads(text: str | bytes) -> Any:
    """``json.loads`` that refuses NaN and Infinity (Python's accepts them)."""
    return json.loads(text, parse_constant=_reject_constant)


def finite(value: Any) -> Any:
    """``value`` with every NaN or infinite float replaced by None (recursively),
    so a record always serialises as standard JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


# -- the directory ------------------------------------------------------------------
def _check_private(st: os.stat_result, path: str | os.PathLike[str]) -> None:
    if stat.S_ISLNK(st.st_mode):
        raise StatusDirError(
            f"status directory {str(path)!r} is a symbolic link; give a real "
            "directory (or none: the gate then makes a private one)"
        )
    if not stat.S_ISDIR(st.st_mode):
        raise StatusDirError(f"status directory {str(path)!r} is not a directory")
    if st.st_uid != os.geteuid():
        raise StatusDirError(
            f"status directory {str(path)!r} belongs to uid {st.st_uid}, not to "
            f"this user (uid {os.geteuid()}); use a directory of your own"
        )
    if st.st_mode & 0o077:
        raise StatusDirError(
            f"status directory {str(path)!r} has mode "
            f"{stat.S_IMODE(st.st_mode):o}; it must be private to its owner "
            f"(chmod 700 {str(path)!r})"
        )


def ensure_private_dir(path: str | os.PathLike[str]) -> Path:
    """Create ``path`` with mode 0700 (parents too, 0700), or check that the
    existing one is a private directory of this user (lstat: no symlink)."""
    p = Path(os.path.abspath(path))
    try:
        p.parent.mkdir(mode=_PRIVATE_MODE, parents=True, exist_ok=True)
        os.mkdir(p, _PRIVATE_MODE)
    except FileExistsError:
        pass
    except OSError as exc:
        raise StatusDirError(
            f"status directory {str(p)!r} cannot be created: {exc}"
        ) from None
    try:
        st = os.lstat(p)
    except OSError as exc:
        raise StatusDirError(f"status directory {str(p)!r}: {exc}") from None
    _check_private(st, p)
    return p


class StatusDir:
    """A verified descriptor of a status directory, and file access through it.

    The directory is opened (``O_DIRECTORY | O_NOFOLLOW``) and checked on first
    use, and every file is reached through that descriptor, so replacing the
    directory or a parent of it afterwards changes nothing. A listing or write
    that fails drops the descriptor so the next one reopens and checks again:
    give each thread its own instance. Nothing here creates the directory.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._fd: int | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"StatusDir({str(self.path)!r})"

    def __str__(self) -> str:
        return str(self.path)

    def fileno(self) -> int:
        fd = self._fd
        if fd is not None:
            return fd
        with self._lock:
            if self._fd is None:
                flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
                try:
                    fd = os.open(self.path, flags)
                except OSError as exc:
                    if os.path.islink(self.path):
                        _check_private(os.lstat(self.path), self.path)
                    raise StatusDirError(
                        f"status directory {str(self.path)!r}: {exc}"
                    ) from None
                try:
                    _check_private(os.fstat(fd), self.path)
                except BaseException:
                    os.close(fd)
                    raise
                self._fd = fd
            return self._fd

    def close(self) -> None:
        with self._lock:
            fd, self._fd = self._fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass

    def __del__(self) -> None:
        fd = getattr(self, "_fd", None)
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass

    def _dropping_on_error(self, fn, *args):
        try:
            return fn(*args)
        except OSError:
            self.close()
            raise

    # -- reading ---------------------------------------------------------------
    def stat(self, name: str) -> os.stat_result:
        """``lstat`` of ``name`` in the directory (one system call when open)."""
        return os.stat(name, dir_fd=self.fileno(), follow_symlinks=False)

    def names(self) -> list[str]:
        return self._dropping_on_error(os.listdir, self.fileno())

    def read_bytes(self, name: str, max_bytes: int = MAX_FILE_BYTES) -> bytes | None:
        """The content of ``name``, None if it does not exist.

        Raises ValueError for anything but a small regular file of this user
        (a symlink, a FIFO, another owner, too large).
        """
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(name, flags, dir_fd=self.fileno())
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EMLINK):
                raise ValueError(f"{name} is a symbolic link") from None
            raise
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise ValueError(f"{name} is not a regular file")
            if st.st_uid != os.geteuid():
                raise ValueError(f"{name} belongs to uid {st.st_uid}, not to this user")
            if st.st_size > max_bytes:
                raise ValueError(f"{name} is larger than {max_bytes} bytes")
            chunks = []
            left = max_bytes + 1
            while left > 0:
                chunk = os.read(fd, min(left, 65536))
                if not chunk:
                    break
                chunks.append(chunk)
                left -= len(chunk)
            data = b"".join(chunks)
            if len(data) > max_bytes:
                raise ValueError(f"{name} is larger than {max_bytes} bytes")
            return data
        finally:
            os.close(fd)

    def read_json(self, name: str) -> Any:
        """Strict JSON of ``name`` (None if missing); ValueError if invalid."""
        data = self.read_bytes(name)
        if data is None:
            return None
        return strict_loads(data.decode("utf-8"))

    # -- writing -----------------------------------------------------------------
    def write_text(self, name: str, text: str) -> Path:
        """Atomically replace ``name``: an ``O_EXCL`` temporary file, mode
        0600, renamed over it (a symlink there is replaced, never followed)."""
        dfd = self.fileno()
        tmp = f".{name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(tmp, flags, 0o600, dir_fd=dfd)
        except OSError:
            self.close()
            raise
        try:
            try:
                data = text.encode("utf-8")
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
            finally:
                os.close(fd)
            os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=dfd)
            except OSError:
                pass
            raise
        return self.path / name

    def write_json(self, name: str, value: Any) -> Path:
        """Write ``value`` as standard JSON (ValueError on NaN or Infinity)."""
        return self.write_text(name, json.dumps(value, sort_keys=True, allow_nan=False))

    def remove(self, name: str) -> bool:
        try:
            os.unlink(name, dir_fd=self.fileno())
        except FileNotFoundError:
            return False
        return True


def as_status_dir(directory: StatusDir | str | os.PathLike[str]) -> StatusDir:
    return directory if isinstance(directory, StatusDir) else StatusDir(directory)


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
