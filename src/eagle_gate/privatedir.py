"""A private directory, and strict file I/O through a verified descriptor.

Why this module exists: the status directory (:mod:`eagle_gate.statusdir`)
carries runtime control into every scheduler process, so whoever can write
there can change a running server's policy, and a symlink there could make the
server overwrite any file it can write. This module is the part that does not
know about launches: it checks that a directory is a real directory of this
user closed to everyone else (:func:`check_private`), reaches every file
through a descriptor opened with ``O_NOFOLLOW`` (:class:`StatusDir`), reads
only small regular files of this user as strict JSON (no NaN or Infinity), and
writes ``O_EXCL`` temporary files renamed into place.
"""

from __future__ import annotations

import errno
import json
import math
import os
import secrets
import stat
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from eagle_gate.options import ConfigError

__all__ = [
    "MAX_FILE_BYTES",
    "StatusDir",
    "StatusDirError",
    "as_status_dir",
    "check_private",
    "ensure_private_dir",
    "finite",
    "strict_loads",
]

#: no file the gate reads back is anywhere near this large.
MAX_FILE_BYTES = 1 << 20
_PRIVATE_MODE = 0o700


class StatusDirError(ConfigError):
    """The status directory is unsafe or unusable; the message says why."""

    def __init__(self, message: str) -> None:
        super().__init__(message, field="status_dir")


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
def check_private(st: os.stat_result, path: str | os.PathLike[str]) -> None:
    """Raise StatusDirError unless ``st`` (an ``lstat`` or ``fstat`` of
    ``path``) is a real directory of this user that nobody else may enter.
    ``eagle-gate doctor`` judges a directory by this same rule."""
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
    check_private(st, p)
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
                        check_private(os.lstat(self.path), self.path)
                    raise StatusDirError(
                        f"status directory {str(self.path)!r}: {exc}"
                    ) from None
                try:
                    check_private(os.fstat(fd), self.path)
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
    """``directory`` as a :class:`StatusDir` (itself when it is one)."""
    return directory if isinstance(directory, StatusDir) else StatusDir(directory)
