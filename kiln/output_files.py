"""Writing where a user pointed kiln: output projects, reports, traces, study folders, artifacts.

kiln never follows a link it did not make and never writes into something that is not a regular
file. Every folder kiln writes into is opened once with ``O_DIRECTORY | O_NOFOLLOW`` and used by its
descriptor from then on (``dir_fd``), so each level is checked when it is entered and a link swapped
in afterwards is never followed either; every file is written under a fresh name of kiln's own
(``O_CREAT | O_EXCL | O_NOFOLLOW``) and renamed over its final name only if that name is absent or
already a regular file. A link, FIFO, device or folder where kiln would write is an
``OutputPathError`` naming the path (exit 2 on the CLI: it is the user's to move).

The folder a user names (``-o DIR``) must itself not be a link; the folders above it are the user's
own business (``/tmp`` is a link on some systems) and are followed as the system does.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from kiln.errors import KilnError

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)


class OutputPathError(KilnError):
    """A path kiln was to write is a link, a FIFO, a device or a folder, or not writable as asked."""


def describe(mode: int) -> str:
    for test, name in (
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISREG, "a regular file"),
    ):
        if test(mode):
            return name
    return "not a file"


def check_output_file(path: str | os.PathLike, what: str = "output file") -> Path:
    """``path`` if kiln may write it: absent, or a regular file that is not a link (checked with
    lstat). Raises OutputPathError naming what is there."""
    path = Path(path)
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return path
    except NotADirectoryError:
        raise OutputPathError(f"{path}: the {what}'s folder is not a folder") from None
    if not stat.S_ISREG(info.st_mode):
        raise OutputPathError(f"{path}: the {what} is {describe(info.st_mode)}; kiln writes only regular files")
    return path


class OutputFolder:
    """A folder kiln writes into, held open by descriptor (see the module's docstring). Use as a
    context manager or call ``close``."""

    def __init__(self, path: str | os.PathLike, what: str = "output folder", create: bool = True, *, _fd: int = -1):
        self.path = Path(path)
        self.what = what
        if _fd >= 0:
            self.fd = _fd
            return
        if create:
            try:
                info = os.lstat(self.path)
            except FileNotFoundError:
                self.path.mkdir(parents=True, exist_ok=True)
            else:
                if not stat.S_ISDIR(info.st_mode):
                    raise OutputPathError(
                        f"{self.path}: the {what} is {describe(info.st_mode)}; kiln writes into a real folder"
                    )
        self.fd = _open_folder(self.path, None, what)

    def __enter__(self) -> OutputFolder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def folder(self, name: str, what: str | None = None) -> OutputFolder:
        """The sub-folder ``name`` (one level), made if missing; a link or non-folder there is refused."""
        _one_level(name)
        try:
            os.mkdir(name, 0o755, dir_fd=self.fd)
        except FileExistsError:
            pass
        return OutputFolder(self.path / name, what or self.what, _fd=_open_folder(self.path / name, self, what))

    def write(self, name: str, data: bytes | str, mode: int = 0o644) -> Path:
        """``name`` in this folder holds ``data`` (whole, or what it held before: written under a
        fresh name and renamed over). Raises OutputPathError if ``name`` is not a regular file."""
        _one_level(name)
        self.check(name)
        payload = data.encode() if isinstance(data, str) else data
        partial = f".{name}.partial-{os.getpid()}-{os.urandom(4).hex()}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC
        handle = os.open(partial, flags, mode, dir_fd=self.fd)
        try:
            with os.fdopen(handle, "wb") as out:
                out.write(payload)
            os.replace(partial, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except BaseException:
            try:
                os.unlink(partial, dir_fd=self.fd)
            except OSError:
                pass
            raise
        return self.path / name

    def check(self, name: str) -> Path:
        """``self.path / name`` if absent or a regular file here (never a link); else OutputPathError."""
        try:
            info = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return self.path / name
        if not stat.S_ISREG(info.st_mode):
            raise OutputPathError(
                f"{self.path / name}: {describe(info.st_mode)} where kiln writes its {name}; kiln writes only "
                "regular files and never follows a link it did not make (move it away)"
            )
        return self.path / name


def _one_level(name: str) -> None:
    if not name or "/" in name or name in (".", "..") or "\0" in name:
        raise ValueError(f"kiln bug: {name!r} is not one path level")


def _open_folder(path: Path, parent: OutputFolder | None, what: str | None) -> int:
    flags = os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC
    try:
        if parent is None:
            return os.open(path, flags)
        return os.open(path.name, flags, dir_fd=parent.fd)
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
            try:
                kind = describe(os.lstat(path).st_mode)
            except OSError:
                kind = "not a folder"
            raise OutputPathError(
                f"{path}: the {what or 'output folder'} is {kind}; kiln writes into real folders and never "
                "follows a link it did not make"
            ) from None
        raise


def write_output_file(path: str | os.PathLike, data: bytes | str, what: str = "output file") -> Path:
    """A single file a user named (``--trace FILE``, ``-o report.json``): its folder is the user's
    (made if missing, followed as the system does); the file itself must be absent or a regular
    file, and is replaced whole (see ``OutputFolder.write``)."""
    path = Path(path)
    if not path.name or path.name in (".", ".."):
        raise OutputPathError(f"{path}: the {what} names a folder, not a file")
    check_output_file(path, what)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = os.open(path.parent, os.O_RDONLY | _DIRECTORY | _CLOEXEC)
    folder = OutputFolder(path.parent, what, _fd=handle)
    with folder:
        return folder.write(path.name, data)


def ensure_folder(path: str | os.PathLike, what: str = "folder", parents: bool = False) -> Path:
    """``path`` as a real folder kiln writes into by path (made if missing; with ``parents``, the
    missing levels above it too, which are then kiln's and checked the same way). A link or a
    non-folder there is an OutputPathError naming it, never followed."""
    path = Path(path)
    levels = [path]
    if parents:
        for parent in path.parents:
            if os.path.lexists(parent):
                break
            levels.append(parent)
    for level in reversed(levels):
        try:
            os.mkdir(level, 0o755)
        except FileExistsError:
            pass
        info = os.lstat(level)
        if not stat.S_ISDIR(info.st_mode):
            raise OutputPathError(
                f"{level}: the {what} is {describe(info.st_mode)}; kiln writes into real folders and never "
                "follows a link it did not make"
            )
    return path
