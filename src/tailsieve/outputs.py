"""Output files and folders: one writer each, regular files only, replaced atomically, appended recoverably.

- `OutputLock`: an exclusive `fcntl.flock` on a lock file, `.tailsieve.lock` inside an output folder or `.NAME.lock`
  beside an output file, held while the command writes. A second writer is refused in one line naming the holder
  (command, pid, host, start time: what the holder wrote into the lock file). The kernel drops an flock when its
  holder's process ends, however it ends (exit, error, signal, `kill -9`), so a lock file left by a dead run never
  blocks the next one; the file itself stays (removing it would race with a writer that has just opened it).
- `check_target`: an existing output that is a symbolic link, FIFO, device or socket is refused (a file output must
  be a regular file, a folder output a folder); nothing is ever written through a link or into a device.
- `write_atomic`: temp file beside the target, fsync, rename over it (a regular file or nothing). A write error
  (ENOSPC, EFBIG, EROFS, EACCES, …) is one line naming the file and saying what was kept.
- `append_line`: one line appended and fsynced; a failed append is truncated back to the file's size before it, so
  the file keeps ending with its last complete line.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import io
import json
import os
import socket
import stat
from pathlib import Path
from types import TracebackType
from typing import Any

from tailsieve.errors import TailSieveError
from tailsieve.redact import clip

LOCK_NAME = ".tailsieve.lock"
_HOLDER_BYTES = 4096
_KINDS = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a named pipe (FIFO)"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


class OutputError(TailSieveError):
    """An output that cannot be written (wrong kind of file, another writer, a write error): one line."""


def _kind(mode: int) -> str | None:
    """What a non-regular, non-folder file is (None for a regular file or folder)."""
    return next((name for test, name in _KINDS if test(mode)), None)


def check_target(path: Path, what: str, *, folder: bool = False) -> None:
    """An output path that may be written: missing, or a regular file (`folder`: a folder); a one-line OutputError
    otherwise (a symlink, FIFO, device or socket; a folder where a file goes or the reverse)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise OutputError(f"{what} {path}: {exc.strerror or exc}") from None
    kind = _kind(mode)
    if kind is not None:
        raise OutputError(f"{what} {path} is {kind}; give a path to a new or regular "
                          f"{'folder' if folder else 'file'} (outputs are never written through links or into "
                          "devices)")
    if folder and not stat.S_ISDIR(mode):
        raise OutputError(f"{what} {path} is a file, not a folder")
    if not folder and stat.S_ISDIR(mode):
        raise OutputError(f"{what} {path} is a folder; give a file name")


def _failure(what: str, path: Path, exc: OSError, kept: str) -> OutputError:
    return OutputError(f"cannot write {what} {path}: {exc.strerror or exc}; {kept}")


def write_atomic(path: Path, data: bytes | str, what: str = "output file") -> None:
    """Write `data` to a temp file beside `path`, fsync it, rename it over `path` (`check_target` first); a write
    error is a one-line OutputError naming the file and what was kept (the previous file, or nothing)."""
    path = Path(path)
    check_target(path, what)
    existed = path.exists()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    raw = data.encode("utf-8") if isinstance(data, str) else data
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)  # a leftover of a killed run of the same pid (never followed: O_EXCL below)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise _failure(what, path, exc, f"the previous {path.name} is unchanged" if existed
                       else "nothing was written") from None
    _sync_folder(path.parent)


def write_json_atomic(path: Path, obj: Any, what: str = "output file") -> None:
    """`write_atomic` of `obj` as indented JSON."""
    write_atomic(path, json.dumps(obj, indent=1), what)


def _sync_folder(folder: Path) -> None:
    """fsync a folder so that a rename into it survives a crash (best effort: not every file system allows it)."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def append_line(path: Path, line: str, what: str = "log") -> None:
    """Append `line` + newline to `path` (created when missing) and fsync. A file whose last line lacks its newline
    gets one first. A failed append is truncated back to the file's size before it and reported in one line naming
    the file."""
    path = Path(path)
    check_target(path, what)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    except OSError as exc:
        raise _failure(what, path, exc, "the file is unchanged") from None
    try:
        size = os.fstat(fd).st_size
        head = b"" if size == 0 or _last_byte(path, size) == b"\n" else b"\n"
        view = memoryview(head + line.encode("utf-8") + b"\n")
        try:
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        except OSError as exc:
            try:
                os.ftruncate(fd, size)
                kept = "the file is kept as it was, ending with its last complete line"
            except OSError:
                kept = "its last line may be unfinished (rollout --resume moves it aside)"
            raise _failure(what, path, exc, kept) from None
    finally:
        os.close(fd)


def _last_byte(path: Path, size: int) -> bytes:
    with path.open("rb") as fh:
        fh.seek(size - 1)
        return fh.read(1)


def lock_path(target: Path, *, folder: bool) -> Path:
    """The lock file of an output folder (inside it) or output file (beside it)."""
    return target / LOCK_NAME if folder else target.with_name(f".{target.name}.lock")


class OutputLock:
    """An exclusive lock on an output folder or file for one writer (module docstring); a context manager, or
    `acquire()` / `release()`. `check()` only tests whether another writer holds it (creates nothing)."""

    def __init__(self, target: Path, command: str, *, folder: bool, flag: str = "--out") -> None:
        self.target, self.command, self.folder, self.flag = Path(target), command, folder, flag
        self.path = lock_path(self.target, folder=folder)
        self._fd: int | None = None

    def _busy(self, fd: int) -> OutputError:
        try:
            doc = json.loads(os.pread(fd, _HOLDER_BYTES, 0).decode("utf-8"))
            pid = doc["pid"]
            if isinstance(pid, bool) or not isinstance(pid, int) or not 0 < pid < 1 << 31:
                raise TypeError("pid")
            holder = (f"tailsieve {clip(str(doc['command']), 32)}, pid {pid} on host {clip(str(doc['host']), 48)} "
                      f"since {clip(str(doc['since']), 32)}")
        except (OSError, ValueError, KeyError, TypeError):
            holder = "a process that has not yet said who it is"
        return OutputError(f"{self.target} is being written by another run ({holder}); wait for it to end or "
                           f"choose another {self.flag}"[:400])

    def check(self) -> None:
        """Refuse (one line naming the holder) when another writer holds the lock; touches nothing."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError:
            return  # no lock file: nobody holds it (a holder creates it first); a strange one: acquire() says so
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise self._busy(fd) from None
        except OSError:
            pass
        finally:
            os.close(fd)

    def acquire(self) -> OutputLock:
        """Take the lock and write the holder's name into it; a one-line OutputError when another writer holds
        it or the lock file cannot be made."""
        if self._fd is not None:
            return self
        check_target(self.path, "lock file")
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
        except OSError as exc:
            raise OutputError(f"cannot lock {self.target}: {self.path}: {exc.strerror or exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            err = self._busy(fd)
            os.close(fd)
            raise err from None
        except OSError as exc:
            os.close(fd)
            raise OutputError(f"cannot lock {self.target}: {exc.strerror or exc}") from None
        since = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
        doc = {"command": self.command, "pid": os.getpid(), "host": socket.gethostname(), "since": since}
        with contextlib.suppress(OSError):  # the name is a courtesy to the next writer; the flock is the lock
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(doc) + "\n").encode("utf-8"), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        """Drop the lock (idempotent); the lock file stays."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    @property
    def held(self) -> bool:
        """Whether this object holds the lock."""
        return self._fd is not None

    def __del__(self) -> None:  # an object dropped while holding: its fd closes, the lock goes with it
        with contextlib.suppress(Exception):
            self.release()

    def __enter__(self) -> OutputLock:
        return self.acquire()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.release()


def write_figure(fig: Any, path: Path, **kwargs: Any) -> None:
    """A matplotlib figure rendered in memory (format from the suffix) and written by `write_atomic`."""
    buf = io.BytesIO()
    fig.savefig(buf, format=Path(path).suffix.lstrip(".").lower(), **kwargs)
    write_atomic(Path(path), buf.getvalue(), "--plot")
