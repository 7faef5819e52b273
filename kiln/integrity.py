"""What kiln reads back from its caches is what kiln wrote: keyed checksums and a restricted unpickler.

Caches live on disk where other people and other programs can reach them (a shared
``KILN_CACHE_DIR``, a cache copied from another machine, a full disk that truncated a write, a
flipped bit). Two rules:

* **Sealed files.** Every cached file is stored with an HMAC-SHA256 under a per-user secret
  (``~/.config/kiln/cache.key``, mode 0600, made on first use; ``KILN_KEY_FILE`` moves it). A file
  whose seal does not match (damaged, truncated, or written by anyone without the key) is never
  used: the caller rebuilds it. Large files are hashed in 4 MB chunks on two threads (hashlib
  releases the GIL), then the chunk digests are sealed together.
* **No arbitrary pickle.** Sealed pickles are read by ``SafeUnpickler``, which only builds kiln's
  own IR and plan dataclasses, their enums and a few plain types (no callables beyond those
  constructors), so even a sealed entry cannot run code.
"""

from __future__ import annotations

import atexit
import dataclasses
import enum
import hashlib
import hmac
import io
import os
import pickle
import shutil
import stat
import sys
import tempfile
import threading
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kiln.output_files import describe

CHUNK = 4 << 20  # bytes hashed per task: big blobs spread over both threads
_key_lock = threading.Lock()
_key: bytes | None = None
_warned: set[str] = set()


class UntrustedKey(Exception):
    """The key file exists but others could have read or replaced it."""


def warn_once(topic: str, message: str) -> None:
    """One warning per topic per process (a cache that cannot be written says so once)."""
    if topic not in _warned:
        _warned.add(topic)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def key_file() -> Path:
    configured = os.environ.get("KILN_KEY_FILE")
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "kiln" / "cache.key"


def user_key() -> bytes:
    """The per-user secret that seals cache files (made on first use). Raises OSError when it can
    be neither read nor made, UntrustedKey when its permissions let others in."""
    global _key
    with _key_lock:
        if _key is None:
            _key = _load_or_make_key(key_file())
        return _key


KEY_BYTES = 32


def _load_or_make_key(path: Path) -> bytes:
    """The key at ``path`` (made there when missing, in a folder only this user can reach).
    Only a regular file, not a link, owned by this user, readable by no one else, of a key's
    size is a key: anything else (a FIFO, /dev/zero, a folder, an empty file) is UntrustedKey,
    never a hang, a huge read or a crash."""
    problem = _untrusted(path.parent, folder=True)
    if problem:
        raise UntrustedKey(f"the key's folder {problem}")
    if not os.path.lexists(path):
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        handle, partial = tempfile.mkstemp(dir=path.parent, prefix=".key-")
        try:
            os.fchmod(handle, 0o600)
            os.write(handle, os.urandom(KEY_BYTES))
        finally:
            os.close(handle)
        try:
            os.link(partial, path)  # never replaces a key another process made meanwhile
        except FileExistsError:
            pass
        finally:
            os.unlink(partial)
    try:
        # O_NONBLOCK: a FIFO planted as the key opens at once (and is refused), never blocks
        handle = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as err:
        raise UntrustedKey(f"{path} cannot be opened as a key ({err.strerror or err}): remove it") from None
    try:
        info = os.fstat(handle)
        problem = _untrusted_stat(info, folder=False)
        if problem:
            fix = "chmod 600 it" if stat.S_ISREG(info.st_mode) else "point KILN_KEY_FILE at a regular file"
            raise UntrustedKey(f"{path} {problem}: {fix}, or remove it and kiln makes a new one")
        if not 16 <= info.st_size <= 4096:
            raise UntrustedKey(f"{path} holds {info.st_size} bytes, not a key: remove it and kiln makes a new one")
        data = os.read(handle, 4096)
    finally:
        os.close(handle)
    if len(data) < 16:
        raise UntrustedKey(f"{path} is too short to be a key: remove it and kiln makes a new one")
    return data


def _untrusted_stat(info: os.stat_result, folder: bool) -> str | None:
    """Why a file or folder with this (lstat) status is not kiln's to trust, or None."""
    if stat.S_ISLNK(info.st_mode):
        return "is a symbolic link (kiln follows none in its own folders)"
    if folder and not stat.S_ISDIR(info.st_mode):
        return "is not a folder"
    if not folder and not stat.S_ISREG(info.st_mode):
        return "is not a regular file"
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        return f"belongs to another user (uid {info.st_uid})"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return "is writable by other users"
    if not folder and info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        return "is readable or writable by others"
    return None


def _untrusted(path: Path, folder: bool) -> str | None:
    """Why ``path`` (if it exists) is not kiln's to trust, or None (also when it does not exist)."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as err:
        return f"{path} cannot be checked ({err.strerror or err})"
    problem = _untrusted_stat(info, folder)
    return f"{path} {problem}" if problem else None


class CacheUnavailable(OSError):
    """A cache folder kiln cannot trust or make (the message says why); callers work without it."""


def cache_folder(*parts: str) -> Path:
    """kiln's cache folder ``cache_root()/parts...``, made where missing (mode 0700 for new levels).
    Every level from the cache root down must be a real folder (never a symbolic link: kiln never
    writes or deletes through one), owned by this user and writable by no one else, and this
    user's key must be usable: a cache others can change cannot be trusted with native code or
    with deleting. Raises CacheUnavailable naming the first level that fails."""
    path = cache_root()
    levels = [path]
    for part in parts:
        path = path / part
        levels.append(path)
    try:
        levels[0].parent.mkdir(parents=True, exist_ok=True)  # above the cache root: the user's folders
    except OSError as err:
        raise CacheUnavailable(f"{levels[0].parent} cannot be made ({err.strerror or err})") from None
    for level in levels:
        problem = _untrusted(level, folder=True)
        if problem:
            raise CacheUnavailable(problem)
        try:
            os.mkdir(level, 0o700)
        except FileExistsError:
            problem = _untrusted(level, folder=True)  # made meanwhile, or a file where a folder belongs
            if problem:
                raise CacheUnavailable(problem) from None
        except OSError as err:
            raise CacheUnavailable(f"{level} cannot be made ({err.strerror or err})") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise CacheUnavailable(f"{path} is not writable")
    try:
        user_key()
    except (OSError, UntrustedKey) as err:
        raise CacheUnavailable(f"the cache key cannot be used: {err}") from None
    return path


_private_folders: dict[str, Path] = {}


def cache_folder_or_private(name: str, keep: bool = False, root: bool = False) -> Path:
    """``cache_folder(name)`` (the cache root itself with ``root``), or where kiln cannot trust it
    (one warning), a private temporary folder of this process named after ``name``: removed at
    exit unless ``keep`` (a reproducer the user will read)."""
    try:
        return cache_folder() if root else cache_folder(name)
    except CacheUnavailable as err:
        cache_off(err)
    with _key_lock:
        folder = _private_folders.get(name)
        if folder is None or not folder.is_dir():
            folder = Path(tempfile.mkdtemp(prefix=f"kiln-{name}-"))
            _private_folders[name] = folder
            if not keep:
                atexit.register(shutil.rmtree, folder, True)
    return folder


def cache_off(problem: object) -> None:
    """The one warning (per cache root and process) that kiln works without its caches there."""
    warn_once(
        f"caches:{cache_root()}",
        f"kiln: cache off ({problem}); every compile starts from scratch, built code goes to a private "
        "temporary folder (point KILN_CACHE_DIR at a folder of your own to cache)",
    )


class IrregularFile(OSError):
    """A path that is not a regular file (a FIFO, a device, a folder) where kiln reads a file."""


def open_regular(path: str | os.PathLike, what: str = "file") -> io.BufferedReader:
    """``path`` opened for reading if it is a regular file: checked on the opened descriptor (no
    race with a swap), opened without blocking (a FIFO opens at once and is refused). Raises
    IrregularFile naming what it is, or OSError (FileNotFoundError...)."""
    handle = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(handle)
        if not stat.S_ISREG(info.st_mode):
            raise IrregularFile(f"{path}: the {what} is {describe(info.st_mode)}, not a regular file")
        os.set_blocking(handle, True)
        return os.fdopen(handle, "rb")
    except BaseException:
        os.close(handle)
        raise


def file_identity(info: os.stat_result) -> tuple[int, ...]:
    """What tells a file from another or from itself changed: device, inode, size, times."""
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


def check_regular(path: str | os.PathLike, what: str = "file") -> None:
    """Raises IrregularFile unless ``path`` is a regular file (following links: a user's link to a
    model is theirs to make) or does not exist (the caller's open reports that)."""
    try:
        info = os.stat(path)
    except OSError:
        return
    if not stat.S_ISREG(info.st_mode):
        raise IrregularFile(f"{path}: the {what} is {describe(info.st_mode)}, not a regular file")


def write_atomically(path: Path, data: bytes | memoryview, prefix: str = ".partial-") -> None:
    """``path`` holds ``data`` or what it held before, never a part (a temporary file beside it,
    renamed into place; removed if anything fails)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, partial = tempfile.mkstemp(dir=path.parent, prefix=prefix)
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
        os.replace(partial, path)
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise


def seal_file(path: str | os.PathLike) -> str:
    """The seal of a file's bytes (equal to ``seal_buffer`` of them)."""
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size <= CHUNK:
            return seal_buffer(handle.read())
        descriptor = handle.fileno()
        return _seal_chunks(size, lambda offset: os.pread(descriptor, CHUNK, offset))()


def seal_buffer(data: bytes | memoryview) -> str:
    """The seal of bytes in memory (see ``seal_later``)."""
    return seal_later(data)()


def seal_later(data: bytes | memoryview) -> Callable[[], str]:
    """Start sealing bytes in memory on kiln's two hashing threads (hashlib releases the GIL);
    returns a function that waits for the seal. Small buffers are one HMAC; large ones are hashed
    in CHUNK pieces in parallel and their digests sealed together. ``data`` must not change
    until the seal is taken."""
    view = memoryview(data).cast("B")
    size = view.nbytes
    if size > CHUNK:
        return _seal_chunks(size, lambda offset: view[offset : offset + CHUNK])
    key = user_key()

    def whole() -> str:
        mac = hmac.new(key, size.to_bytes(8, "little"), hashlib.sha256)
        mac.update(view)
        return mac.hexdigest()

    return _submit(whole)


def _seal_chunks(size: int, chunk: Any) -> Callable[[], str]:
    key = user_key()
    pending = [
        _submit(lambda offset=offset: hashlib.sha256(chunk(offset)).digest()) for offset in range(0, size, CHUNK)
    ]

    def combine() -> str:
        digests = b"".join(wait() for wait in pending)
        return hmac.new(key, size.to_bytes(8, "little") + digests, hashlib.sha256).hexdigest()

    return combine


def content_digest(header: bytes, data: memoryview) -> str:
    """An unkeyed SHA-256 digest naming ``header`` + ``data`` (what the compiler's caches key on:
    a weight's bytes). Large data is hashed in CHUNK pieces on both hashing threads and the pieces'
    digests hashed together: a 400 MB weight in half the time of one sequential hash."""
    view = data.cast("B") if data.format != "B" or data.ndim != 1 else data
    size = view.nbytes
    if size <= 4 * CHUNK:
        hasher = hashlib.sha256(header)
        hasher.update(view)
        return hasher.hexdigest()
    pending = [
        _submit(lambda offset=offset: hashlib.sha256(view[offset : offset + CHUNK]).digest())
        for offset in range(0, size, CHUNK)
    ]
    return hashlib.sha256(header + b"chunked" + b"".join(wait() for wait in pending)).hexdigest()


_pool: ThreadPoolExecutor | None = None
_background = threading.local()  # .on: this thread works in the background (see ``run_as_background``)


def run_as_background() -> None:
    """Mark the calling thread as background work (a plan-cache store after a compile or load
    returned): it runs at the lowest CPU priority the system gives a thread (Linux niceness is per
    thread), and its hashing runs in it, not on the shared hashing threads, so the model's first
    calls never wait behind it."""
    _background.on = True
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except (AttributeError, OSError):  # not Linux, or not allowed: it only runs at normal priority
        pass


def _submit(work: Callable[[], Any]) -> Callable[[], Any]:
    """Run ``work`` on the hashing threads; returns the function that waits for its result (run
    right here when no thread can start: at interpreter exit, a background store finishing, or in
    a background thread)."""
    global _pool
    if getattr(_background, "on", False):
        result = work()
        return lambda: result
    try:
        with _key_lock:
            if _pool is None:
                _pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="kiln-seal")
        return _pool.submit(work).result
    except RuntimeError:
        result = work()
        return lambda: result


def sealed(path: str | os.PathLike, expected: str) -> bool:
    """True when the file exists and its seal is ``expected``."""
    try:
        return hmac.compare_digest(seal_file(path), expected)
    except (OSError, ValueError):
        return False


# -- pickles that can only build kiln's own data -----------------------------------------------------

_MODULES = (
    "kiln.runtime.plan",
    "kiln.ir.graph",
    "kiln.ir.types",
    "kiln.lower.kir",
    "kiln.lower.kir_expr",
    "kiln.driver.extents",  # a run-time length's sizes (RunTimeSize) in engine calls
    "kiln.driver.spatial",  # run-time dims' sizes (DimSize) in engine calls
    "kiln.driver.sized_terms",  # run-time dims' sizes read from the lowering (ExprSize)
    "kiln.ir.dims",  # the expressions those and sizes hold
    "kiln.lower.memory",
    "kiln.lower.target",
    "kiln.backends.cpu.target",
    "kiln.backends.gpu.target",
)
_PLAIN = {
    ("builtins", "set"),
    ("builtins", "frozenset"),
    ("builtins", "complex"),
    ("builtins", "slice"),
    ("pathlib", "PosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "Path"),
    ("numpy", "dtype"),
    ("numpy", "ndarray"),
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.numeric", "_frombuffer"),
    ("numpy._core.numeric", "_frombuffer"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("numpy.dtypes", None),  # numpy's dtype classes (Float32DType...)
    ("ml_dtypes", None),  # bfloat16 and the float8 types' scalar classes
    ("kiln.ir.sized", "SizedInt"),  # an int that keeps the expression of the dims it was computed from
}


class SafeUnpickler(pickle.Unpickler):
    """Builds only kiln's dataclasses and enums from ``_MODULES``, and the plain types above."""

    def find_class(self, module: str, name: str) -> Any:
        if module in _MODULES:
            owner = sys.modules.get(module) or __import__(module, fromlist=[name])
            found = getattr(owner, name, None)
            if isinstance(found, type) and (dataclasses.is_dataclass(found) or issubclass(found, enum.Enum)):
                return found
        elif (module, name) in _PLAIN or (module, None) in _PLAIN:
            found = super().find_class(module, name)
            if (module, None) not in _PLAIN or isinstance(found, type):
                return found
        elif module in sys.modules:  # a registered backend's own kind of target (already imported)
            found = getattr(sys.modules[module], name, None)
            if isinstance(found, type) and dataclasses.is_dataclass(found) and _is_target(found):
                return found
        raise pickle.UnpicklingError(f"a cache entry asks for {module}.{name}, which kiln never stores")


def _is_target(kind: type) -> bool:
    """Whether ``kind`` is a kind of ``kiln.lower.target.Target`` (by name: this layer imports none)."""
    return any(base.__module__ == "kiln.lower.target" and base.__name__ == "Target" for base in kind.__mro__)


def safe_loads(data: bytes, persistent_load: Any = None) -> Any:
    unpickler = SafeUnpickler(io.BytesIO(data))
    if persistent_load is not None:
        unpickler.persistent_load = persistent_load  # type: ignore[method-assign]
    return unpickler.load()


def cache_root() -> Path:
    """kiln's cache folder: ``$KILN_CACHE_DIR``, else ``~/.cache/kiln``."""
    return Path(os.environ.get("KILN_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "kiln"))
