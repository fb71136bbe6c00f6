"""Writing an output file: checked before the work, written whole or not at all, never over an input.

Every output a command writes (``analyze -o/--html``, ``report``, ``export``, ``baseline``,
``check --junit/--markdown``, ``$GITHUB_STEP_SUMMARY``) goes through :class:`OutputTarget`:

- built before the (possibly long) analysis, it fails fast, with one line, on a path that
  cannot be written (a folder, a parent that is a file) or that is one of the protected
  files (the run's own files), compared by resolved path and by (device, inode), so a
  symlink or a hard link to an input is refused too;
- :meth:`OutputTarget.write` replaces a regular file atomically (a temporary file beside
  the target, fsync, rename; an existing file keeps its mode), follows a symlink and
  replaces its target (the link stays a link), and writes straight through a device, a
  FIFO or a descriptor of this process (``/dev/stdout``), which a rename would replace;
- any failure (full disk, file too large, read-only file system, ...) is a
  :class:`TracekitError` naming the file, and leaves no partial or temporary file.

Only the standard library and :mod:`tracekit.errors`: every layer may write through it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
import sys
import tempfile
from collections.abc import Mapping
from typing import Any, TextIO
from pathlib import Path

from tracekit.errors import TracekitError
from tracekit.text import for_terminal

# What to do about a failed write, by errno; anything else: write it elsewhere.
_ADVICE: dict[int | None, str] = {
    errno.ENOSPC: "free some space or write it elsewhere",
    errno.EDQUOT: "free some space or write it elsewhere",
    errno.EFBIG: "the file size limit (ulimit -f) or the file system's stops it; write it elsewhere",
    errno.EROFS: "the file system is read-only; write it elsewhere",
    errno.EACCES: "check the permissions or write it elsewhere",
    errno.EPERM: "check the permissions or write it elsewhere",
    errno.ENOTDIR: "a part of the path is a file, not a folder; choose another path",
    errno.EISDIR: "it is a folder; give a file name",
    errno.EPIPE: "the reader went away before the end; keep it reading",
}
_DEFAULT_ADVICE = "choose another output path"


def standard_output_failure(err: OSError) -> str:
    """The line for output that could not be written to standard output (``> /dev/full``,
    a full disk, a closed descriptor)."""
    reason = err.strerror or type(err).__name__
    return f"standard output cannot be written ({reason}): {_ADVICE.get(err.errno or 0, 'redirect it elsewhere')}"


class StandardOutputError(TracekitError):
    """What the command printed could not be written to standard output."""


class GuardedStream:
    """Standard output as the command writes it: a failed write or flush (``> /dev/full``)
    is a :class:`StandardOutputError`, one line and exit status 2, not an internal error.
    A reader that went away (EPIPE, ``| head``) is left as it is. Everything else is the
    wrapped stream's."""

    failed = False  # a write failed: the exit path need not say so again
    reader_gone = False  # a write met EPIPE (``| head``): the exit status says so, 141

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError as err:
            raise self._failure(err) from None

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as err:
            raise self._failure(err) from None

    @staticmethod
    def _failure(err: OSError) -> OSError | StandardOutputError:
        if err.errno == errno.EPIPE:
            GuardedStream.reader_gone = True
            return err
        GuardedStream.failed = True
        return StandardOutputError(standard_output_failure(err))


# A descriptor of this process named as a file: written through that descriptor.
_DESCRIPTOR_PATH = re.compile(r"/(?:dev/fd|proc/self/fd|proc/thread-self/fd|proc/(\d+)/fd)/(\d+)")
_STANDARD_STREAMS = {"/dev/stdin": 0, "/dev/stdout": 1, "/dev/stderr": 2}


class OutputTarget:
    """An output file, checked now and written later with :meth:`write` or :meth:`append`.

    ``option`` is how the user named it (``-o``, ``--junit``, ``$GITHUB_STEP_SUMMARY``),
    for the error line. ``protect`` maps files that must never be written (the run's traces,
    its manifest, the baseline a check reads) to what each is, for the error line.
    """

    def __init__(
        self, path: str | os.PathLike[str], option: str = "-o", protect: Mapping[Path, str] | None = None
    ) -> None:
        self.path = Path(path)
        self.option = option
        text = os.fspath(path)
        if not text:
            raise TracekitError(f"{option}: an empty file name; give the file to write")
        self.descriptor = _descriptor_of(text)
        if self.descriptor is not None:
            # whatever the descriptor is open on (a terminal, a pipe, a file the shell opened)
            self.kind = "stream"
            self.resolved = self.path
            self._refuse_protected(self._descriptor_stat(), protect or {})
            return
        if text.endswith(os.sep):
            raise TracekitError(f"{option} {path}: names a folder; give a file name")
        self.resolved = Path(os.path.realpath(text))
        existing = self._stat()
        if existing is None:
            self._check_parent()
            self.kind = "file"
        elif stat.S_ISDIR(existing.st_mode):
            raise TracekitError(f"{option} {path}: is a folder; give a file name")
        elif stat.S_ISREG(existing.st_mode):
            self.kind = "file"
        elif stat.S_ISCHR(existing.st_mode) or stat.S_ISBLK(existing.st_mode) or stat.S_ISFIFO(existing.st_mode):
            self.kind = "stream"
            # written where the user pointed; a device's or FIFO's real path need not be openable
            self.resolved = self.path
        else:
            raise TracekitError(f"{option} {path}: is a socket or other special file; give a file name")
        self._refuse_protected(existing, protect or {})

    def write(self, data: bytes) -> None:
        """Write ``data`` as the whole file; on failure raise a one-line TracekitError."""
        try:
            if self.descriptor is not None:
                _flush_standard_streams()
                _write_all(self.descriptor, data)
            elif self.kind == "stream":
                # Open as found, no rename and no truncation of what is not a regular file.
                fd = os.open(self.path, os.O_WRONLY)
                try:
                    _write_all(fd, data)
                finally:
                    os.close(fd)
            else:
                self._replace(data)
        except OSError as err:
            raise self._failure(err) from None

    def append(self, data: bytes) -> None:
        """Add ``data`` at the end of the file (made when absent); a failed append is undone."""
        if self.kind != "file":
            self.write(data)
            return
        try:
            self.resolved.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.resolved, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
            try:
                size_before = os.fstat(fd).st_size
                try:
                    _write_all(fd, data)
                    os.fsync(fd)
                except OSError:
                    os.ftruncate(fd, size_before)  # what was there stays, and nothing half-written
                    raise
            finally:
                os.close(fd)
        except OSError as err:
            raise self._failure(err) from None

    def wrote(self, detail: str = "") -> str:
        """The line a command prints once the file is written (never before)."""
        return for_terminal(f"wrote {self.path}" + (f": {detail}" if detail else ""))

    def same_file(self, other: OutputTarget) -> bool:
        return self.kind == "file" and other.kind == "file" and self.resolved == other.resolved

    # ------------------------------------------------------------------ checks

    def _stat(self) -> os.stat_result | None:
        try:
            return os.stat(self.path)
        except FileNotFoundError:
            return None  # a new file, or a symlink to one: made at the link's target
        except OSError as err:
            raise self._failure(err) from None

    def _check_parent(self) -> None:
        """The nearest existing folder above the target must be a folder (made folders: later)."""
        parent = self.resolved.parent
        while not parent.exists() and parent != parent.parent:
            parent = parent.parent
        if not parent.is_dir():
            raise self._failure(OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR)))

    def _descriptor_stat(self) -> os.stat_result:
        assert self.descriptor is not None  # asked only of a descriptor
        try:
            return os.fstat(self.descriptor)
        except OSError:
            raise TracekitError(
                f"{self.option} {self.path}: descriptor {self.descriptor} is not open in this process; give a file name"
            ) from None

    def _refuse_protected(self, existing: os.stat_result | None, protect: Mapping[Path, str]) -> None:
        for path, what in protect.items():
            try:
                other = os.stat(path)
            except OSError:
                other = None
            same_inode = (
                existing is not None
                and other is not None
                and (existing.st_dev, existing.st_ino) == (other.st_dev, other.st_ino)
            )
            if same_inode or Path(os.path.realpath(path)) == self.resolved:
                raise TracekitError(
                    f"{self.option} {self.path}: is {what}; refusing to write over it (choose another output file)"
                )

    # ------------------------------------------------------------------ writing

    def _replace(self, data: bytes) -> None:
        target = self.resolved
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            mode = stat.S_IMODE(os.stat(target).st_mode)
        except FileNotFoundError:
            mode = 0o666 & ~_umask()  # mkstemp's file is private (0600); give it open()'s mode
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        try:
            try:
                _write_all(fd, data)
                os.fsync(fd)
                os.fchmod(fd, mode)
            finally:
                os.close(fd)
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        _sync_folder(target.parent)

    def _failure(self, err: OSError) -> TracekitError:
        reason = err.strerror or str(err)
        advice = _ADVICE.get(err.errno, _DEFAULT_ADVICE)
        return TracekitError(f"cannot write {self.path} ({self.option}): {reason}; {advice}")


def _descriptor_of(text: str) -> int | None:
    """The descriptor a path like /dev/stdout or /proc/self/fd/3 names, when it is one of ours."""
    path = os.path.abspath(text)
    if path in _STANDARD_STREAMS:
        return _STANDARD_STREAMS[path]
    match = _DESCRIPTOR_PATH.fullmatch(path)
    if match is None or (match.group(1) is not None and int(match.group(1)) != os.getpid()):
        return None
    return int(match.group(2))


def _write_all(fd: int, data: bytes) -> None:
    """os.write until every byte is out (a pipe or a signal may take it in parts)."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _flush_standard_streams() -> None:
    """What the command printed so far comes before the file's bytes on a shared descriptor."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            stream.flush()


def _sync_folder(folder: Path) -> None:
    """Make the rename itself durable; some file systems cannot fsync a folder, which is harmless."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
