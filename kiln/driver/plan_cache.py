"""The plan cache: a second compile of the same model does no passes, no lowering, no code
generation and no C compilation.

An entry is keyed by what determines a plan: the source graph's structural digest (names never
matter), the -O level, the bound dims, kiln's version and a hash of its source code, the host
target and the C compiler with its flags. It holds the pickled ``Plan`` (kernels, memory plan,
buffer table) with every large array (weights, packed weights) in a blob file named by the seal of
its bytes, shared by all the entry's variants (every batch size of a model stores its weights
once) and memory-mapped read-only on load, once per process however many variants use it, then
verified there by its seal. Mapping, not reading: a 548 MB VGG plan read into fresh memory took
1.2-2.4 s on these VMs (the first touch of each page), mapped it is the page cache's own pages.
Safe against kiln's own writers: blobs are never changed in place (a new blob is renamed over,
a new inode; eviction unlinks), so a mapping keeps the bytes that were verified; a process of
the same user rewriting a blob in place could change them, as it could rewrite the mapped
native library. The native library is copied into the entry.

``kiln.compile(path)`` also remembers which entry a file's bytes led to (``files/<sha256>``), and
the source graph itself is stored once per entry with its signature (inputs, outputs, defaults),
so compiling the same .onnx file again skips the import as well, and reads the graph's weights
only when a new binding must compile.

Entries are written to a temporary folder and renamed into place (atomic: a concurrent compile of
the same model either finds a whole entry or none). Every file of an entry (pickle, arrays,
library) and every index file is sealed with this user's key and checked before use, and pickles
are read by ``kiln.integrity.SafeUnpickler`` (kiln's own dataclasses only): a damaged, truncated,
planted or foreign entry is counted (``STATS``), removed and rebuilt, never used, never fatal.
A cache folder that cannot be written turns the cache off with one warning. The cache keeps to ``KILN_PLAN_CACHE_GB`` (default 8),
removing the least recently used entries. ``KILN_PLAN_CACHE=0`` turns the cache off.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import mmap
import os
import pickle
import shutil
import stat
import tempfile
import threading
import weakref
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from kiln import integrity
from kiln.backends import backend
from kiln.driver import tuning_db
from kiln.driver.options import CompileOptions
from kiln.lower.target import Target
from kiln.memory import drop_mapped_pages
from kiln.version import __version__

FORMAT = 5  # bump when Plan/Graph/Kernel change shape: older entries then miss
SMALL = 4096  # bytes: arrays below this stay inside the pickle
STATS = {"hits": 0, "misses": 0, "stores": 0, "damaged": 0, "evicted": 0}


_pending: list[threading.Thread] = []


def in_background(work: Any, *args: Any) -> None:
    """Run a store beside the caller (writing a big model's entry takes seconds): a variant
    compiled at run time (a new size) is served before its entry is written. ``kiln.compile``
    waits for its own stores before it returns (``wait()``), so no store runs behind a user's
    timed or served calls; the interpreter waits for any left at exit (not a daemon)."""
    thread = threading.Thread(target=_quietly, args=(work, *args), name="kiln-plan-cache")
    _pending.append(thread)
    thread.start()


def _quietly(work: Any, *args: Any) -> None:
    integrity.run_as_background()  # at the lowest priority: the model it stores is serving meanwhile
    try:
        work(*args)
    except Exception as err:  # a full disk or a read-only cache costs a recompile later, nothing more
        STATS["failed_stores"] = STATS.get("failed_stores", 0) + 1
        integrity.warn_once("plan-cache-store", f"kiln: a plan could not be cached ({type(err).__name__}: {err})")


def wait() -> None:
    while _pending:
        _pending.pop().join()


def budget_bytes() -> int:
    """The cache's size limit: ``KILN_PLAN_CACHE_GB`` (default 8). Past it, the least recently used
    entries are removed (a big model's entry is about twice its weights)."""
    try:
        return int(float(os.environ.get("KILN_PLAN_CACHE_GB", "8")) * (1 << 30))
    except ValueError:
        return 8 << 30


def _size(path: Path) -> int:
    total = 0
    for item in path.rglob("*"):  # rglob does not descend into linked folders
        try:
            info = item.lstat()
            if stat.S_ISREG(info.st_mode):
                total += info.st_size
        except OSError:
            pass
    return total


def is_entry(path: Path) -> bool:
    """A folder kiln made as an entry: named by a 32-digit key, a real folder (not a link)."""
    if len(path.name) != 32 or any(c not in "0123456789abcdef" for c in path.name):
        return False
    try:
        return stat.S_ISDIR(path.lstat().st_mode)
    except OSError:
        return False


def evict(keep: Path | None = None) -> int:
    """Remove least-recently-used entries until the cache fits its budget; returns bytes freed.
    An entry's last use is its folder's mtime (touched on every hit). Only folders kiln made as
    entries are candidates (anything else in the folder is not kiln's to delete)."""
    base = root()
    entries = []
    for entry in base.iterdir():
        if is_entry(entry):
            try:
                entries.append((entry.lstat().st_mtime, entry, _size(entry)))
            except OSError:
                continue
    total = sum(size for _, _, size in entries)
    freed = 0
    for _, entry, size in sorted(entries, key=lambda item: item[0]):
        if total - freed <= budget_bytes():
            break
        if keep is not None and entry == keep:
            continue
        shutil.rmtree(entry, ignore_errors=True)  # rmtree never follows a link inside
        freed += size
        STATS["evicted"] = STATS.get("evicted", 0) + 1
    return freed


def enabled() -> bool:
    """The cache is usable: a cache folder kiln cannot trust or write, or a key it cannot trust,
    turns it off with one warning (caching is optional; see ``integrity.cache_folder``). Whether a
    compile uses it at all is its ``CompileOptions.plan_cache`` (``KILN_PLAN_CACHE=0``)."""
    try:
        integrity.cache_folder("plans")
        return True
    except integrity.CacheUnavailable as err:
        integrity.cache_off(err)
        return False


def root() -> Path:
    """The plans folder, checked again on every use (a level replaced by a link since is refused:
    raises CacheUnavailable, which callers treat as a miss or a skipped store)."""
    return integrity.cache_folder("plans")


def _write_text(path: Path, text: str) -> None:
    """A small index file, sealed (its last line), written atomically."""
    integrity.write_atomically(path, f"{text}\n{integrity.seal_buffer(text.encode())}".encode())


def _read_text(path: Path) -> str | None:
    """A small index file's text if its seal matches, else None."""
    try:
        text, _, seal = path.read_text().rpartition("\n")
        if hmac.compare_digest(integrity.seal_buffer(text.encode()), seal.strip()):
            return text
    except (OSError, ValueError, UnicodeDecodeError, integrity.UntrustedKey):
        pass
    return None


@lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """A hash of kiln's own source (Python and C): a plan made by other code is another entry,
    even when the version number did not change."""
    package = Path(__file__).resolve().parent.parent
    hasher = hashlib.sha256()
    for path in sorted(package.rglob("*")):
        if path.suffix in (".py", ".c") and "__pycache__" not in path.parts:
            hasher.update(str(path.relative_to(package)).encode())
            hasher.update(path.read_bytes())
    return hasher.hexdigest()


def tuning_fingerprint(target: Target, options: CompileOptions) -> str:
    return tuning_db.fingerprint(repr(target)) if options.tuned else "off"


def entry_key(graph_digest: str, options: CompileOptions, target: Target) -> str:
    """The entry for a source graph compiled with ``options`` (on this kiln, for ``target``, with
    what its backend builds with: compiler and flags for cpu)."""
    parts = [
        str(FORMAT),
        graph_digest,
        options.key(),  # -O level, passes and algorithms turned off, debug, precision
        __version__,
        code_fingerprint(),
        tuning_fingerprint(target, options),  # tuned schedules change the plan
        repr(target),
        *backend(target.backend).identity(target, options.debug),
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]


def variant_name(dims: dict[str, int]) -> str:
    return hashlib.sha256(repr(sorted(dims.items())).encode()).hexdigest()[:16]


def file_digest(path: str | os.PathLike) -> str:
    """SHA-256 of a file's bytes, remembered per (device, inode, size, mtime in ns) the way git's
    index does, so an unchanged 500 MB model is not read again on every compile."""
    try:
        info = os.stat(path)
    except OSError:
        return _hash_file(path)
    if not enabled():
        return _hash_file(path)
    identity = f"{os.path.abspath(path)}\0{info.st_dev}\0{info.st_ino}\0{info.st_size}\0{info.st_mtime_ns}"
    try:
        memo = root() / "files" / f"stat-{hashlib.sha256(identity.encode()).hexdigest()[:32]}"
        digest = (_read_text(memo) or "").strip()
    except OSError:  # the cache went away (another process cleaning it) or became untrusted
        memo, digest = None, ""
    if len(digest) == 64:
        return digest
    digest = _hash_file(path)
    if memo is not None:
        try:
            _write_text(memo, digest)
        except OSError:  # remembering is optional: a folder deleted meanwhile costs a hash next time
            pass
    return digest


def _hash_file(path: str | os.PathLike) -> str:
    """SHA-256 of a regular file's bytes (a FIFO or device is refused: IrregularFile, never a
    hang or an endless read)."""
    hasher = hashlib.sha256()
    with integrity.open_regular(path) as handle:
        while chunk := handle.read(1 << 24):
            hasher.update(chunk)
    return hasher.hexdigest()


# -- writing and reading one object with its arrays beside it --------------------------------------


BLOB_NAME = 48  # hex digits of a blob's name: its content's seal


class _Pickler(pickle.Pickler):
    """Pickles with every large array written as a blob of the entry: a file named by the seal
    of its bytes, so the variants of one model (and its source graph) share one copy of each
    weight on disk, and a blob is verified by hashing it again."""

    def __init__(self, file: Any, blobs: Path) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.blobs = blobs
        self.seen: dict[int, tuple[Any, ...]] = {}
        self.keep: list[np.ndarray] = []  # ids stay valid while pickling

    def persistent_id(self, obj: Any) -> Any:
        if type(obj) is not np.ndarray or obj.dtype.hasobject or obj.nbytes < SMALL:
            return None
        found = self.seen.get(id(obj))
        if found is None:
            data = np.ascontiguousarray(obj)
            raw = memoryview(data.reshape(-1).view(np.uint8))
            name = integrity.seal_buffer(raw)[:BLOB_NAME]
            path = self.blobs / name
            if not path.exists():
                integrity.write_atomically(path, raw, prefix=".blob-")
            found = ("blob", name, obj.dtype.str, obj.shape)
            self.seen[id(obj)] = found
            self.keep.append(obj)
        return found


_blob_cache: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # (path, identity) -> array
_blob_lock = threading.Lock()


class _BlobReader:
    """Maps the blobs one pickle refers to (read-only; see the module's note on why mapping is
    safe) while the hashing threads verify the ones mapped before; ``verify`` waits for every
    check before the object is used. A blob this process already verified, still held by a
    variant, is shared."""

    def __init__(self, blobs: Path, resident: bool = True) -> None:
        self.blobs = blobs
        self.resident = resident  # False: each blob checked as it is read, its pages then let go of
        self.pending: list[tuple[tuple, np.ndarray, str, Callable[[], str]]] = []

    def persistent_load(self, pid: Any) -> Any:
        kind, name, dtype, shape = pid
        if kind != "blob" or not isinstance(name, str) or len(name) != BLOB_NAME or not name.isalnum():
            raise pickle.UnpicklingError(f"unknown persistent id {kind!r}")
        dtype = np.dtype(dtype)
        count = int(np.prod(shape)) if shape else 1
        data = self._read(name)
        if dtype.hasobject or count * dtype.itemsize != data.size:
            raise pickle.UnpicklingError("a blob's size does not match its array")
        return data.view(dtype).reshape(shape)

    def _read(self, name: str) -> np.ndarray:
        path = self.blobs / name
        info = path.stat()
        identity = (str(path), info.st_ino, info.st_size, info.st_mtime_ns)
        with _blob_lock:
            array = _blob_cache.get(identity)
        if array is not None:
            return array
        for pending_identity, pending, _, _ in self.pending:  # the same blob twice in one pickle
            if pending_identity == identity:
                return pending
        if info.st_size == 0:
            array = np.empty(0, dtype=np.uint8)
        else:  # page-aligned: the engine's aligned loads want 64-byte weights
            with open(path, "rb") as handle:
                mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
            array = np.frombuffer(mapped, dtype=np.uint8)
            if array.size != info.st_size:
                raise DamagedEntry(f"blob {name} changed size while mapped")
        array.flags.writeable = False
        if not self.resident:  # checked now and its pages let go of at once, not all held until the end
            self._check(name, integrity.seal_later(array)())
            drop_mapped_pages(array)
            with _blob_lock:
                _blob_cache[identity] = array
            return array
        self.pending.append((identity, array, name, integrity.seal_later(array)))
        return array

    def _check(self, name: str, seal: str) -> None:
        if not hmac.compare_digest(seal[:BLOB_NAME], name):
            (self.blobs / name).unlink(missing_ok=True)  # written again by the rebuild's store
            raise DamagedEntry(f"blob {name} does not match its seal")

    def verify(self) -> None:
        for _, _, name, seal in self.pending:
            self._check(name, seal())
        with _blob_lock:
            for identity, array, _, _ in self.pending:
                _blob_cache[identity] = array
        self.pending.clear()


SEALS = "seals.json"  # each file of an entry folder with its HMAC (see kiln.integrity)


def _seal(folder: Path) -> None:
    """Seal every file of an entry folder: written last, so an entry with no seals is unfinished."""
    seals = {
        item.name: integrity.seal_file(item)
        for item in sorted(folder.iterdir())
        if item.is_file() and item.name != SEALS
    }
    (folder / SEALS).write_text(json.dumps(seals))


def _check_seals(folder: Path, required: tuple[str, ...]) -> None:
    """Raises DamagedEntry unless every file of the folder is sealed and matches its seal."""
    try:
        seals = json.loads((folder / SEALS).read_text())
    except (OSError, ValueError) as err:
        raise DamagedEntry(f"{folder.name}: no readable seals ({err})") from None
    present = {item.name for item in folder.iterdir() if item.is_file()} - {SEALS}
    if not isinstance(seals, dict) or set(seals) != present or not set(required) <= present:
        raise DamagedEntry(f"{folder.name}: files and seals differ")
    for name, expected in seals.items():
        if not isinstance(expected, str) or not integrity.sealed(folder / name, expected):
            raise DamagedEntry(f"{folder.name}/{name}: does not match its seal")


class DamagedEntry(Exception):
    """An entry that is not exactly what this user's kiln wrote."""


def _write(folder: Path, stem: str, obj: Any) -> None:
    """``obj`` pickled into ``folder`` (its large arrays as blobs of the entry), then sealed."""
    buffer = io.BytesIO()
    _Pickler(buffer, _blobs_of(folder)).dump(obj)
    (folder / f"{stem}.pkl").write_bytes(buffer.getvalue())
    _seal(folder)


def _read(folder: Path, stem: str, resident: bool = True) -> Any:
    """The object pickled in ``folder``; ``resident=False``: its arrays' pages are let go of once
    checked (a source graph, read back to be saved or recompiled, not to run)."""
    _check_seals(folder, (f"{stem}.pkl",))
    reader = _BlobReader(_blobs_of(folder), resident)
    loaded = integrity.safe_loads((folder / f"{stem}.pkl").read_bytes(), reader.persistent_load)
    reader.verify()
    return loaded


def _blobs_of(folder: Path) -> Path:
    """The entry's blob folder (``<key>/blobs``) for a folder inside it (``<key>/source``,
    ``<key>/variants/<name>``, or one being written beside them)."""
    entry = folder.parent if folder.parent.name != "variants" else folder.parent.parent
    return entry / "blobs"


def _publish(partial: Path, final: Path) -> None:
    try:
        os.replace(partial, final)
    except OSError:  # another process published the same entry first: theirs is as good
        shutil.rmtree(partial, ignore_errors=True)


def _discard(path: Path) -> None:
    STATS["damaged"] += 1
    if not path.is_symlink():  # a link is not kiln's to follow (rmtree refuses one anyway)
        shutil.rmtree(path, ignore_errors=True)


# -- the entry's parts -------------------------------------------------------------------------------


def store_plan(key: str, dims: dict[str, int], plan: Any) -> None:
    """Store one compiled variant (its library copied in)."""
    import copy

    if not enabled():
        return
    folder = root() / key / "variants"
    folder.mkdir(parents=True, exist_ok=True)
    name = variant_name(dims)
    if (folder / name).exists():
        return
    partial = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=folder))
    try:
        plan = copy.copy(plan)
        names = []
        for number, product in enumerate(plan.products):  # relative to the entry; made absolute on load
            names.append(Path(f"product{number}{Path(product).suffix}"))
            shutil.copyfile(product, partial / names[-1])
        plan.products = tuple(names)  # (the plan's graph holds only the weights it reads unpacked)
        _write(partial, "plan", plan)
        _publish(partial, folder / name)
        STATS["stores"] += 1
        os.utime(root() / key)
        evict(keep=root() / key)
    except Exception:
        shutil.rmtree(partial, ignore_errors=True)
        raise


def has_plan(key: str, dims: dict[str, int]) -> bool:
    """Whether entry ``key`` holds a plan for ``dims`` (reading it may still find it damaged)."""
    if not enabled():
        return False
    try:
        folder = root() / key / "variants" / variant_name(dims)
        return folder.is_dir() and not folder.is_symlink()
    except OSError:  # the cache went away or became untrusted since: a miss
        return False


def load_plan(key: str, dims: dict[str, int]) -> Any | None:
    if not has_plan(key, dims):
        STATS["misses"] += 1
        return None
    folder = root() / key / "variants" / variant_name(dims)
    try:
        plan = _read(folder, "plan")
        plan.products = tuple(folder / Path(name).name for name in plan.products)
        for product in plan.products:
            if not product.is_file() or product.is_symlink():
                raise FileNotFoundError(product)
        STATS["hits"] += 1
        try:
            os.utime(root() / key)  # most recently used: evicted last
        except OSError:
            pass
        return plan
    except Exception:  # damaged, truncated or from another kiln: rebuild
        _discard(folder)
        return None


def store_graph(key: str, graph: Any) -> None:
    if not enabled():
        return
    final = root() / key / "source"
    if final.exists():
        return
    final.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=".source-", dir=final.parent))
    try:
        _write(partial, "graph", graph)
        # what a compiled model needs before it needs the weights: inputs, outputs, defaults
        _write(partial, "signature", graph.signature())
        _publish(partial, final)
    except Exception:
        shutil.rmtree(partial, ignore_errors=True)
        raise


def has_graph(key: str) -> bool:
    """Whether entry ``key`` holds its source graph (stored, not only being written)."""
    try:
        folder = root() / key / "source"
        return enabled() and folder.is_dir() and not folder.is_symlink()
    except OSError:
        return False


def load_signature(key: str) -> Any | None:
    """The stored source graph's inputs, outputs and defaults (no nodes, no weights: cheap)."""
    if not enabled():
        return None
    try:
        folder = root() / key / "source"
        if not (folder / "signature.pkl").exists():
            return None
    except OSError:
        return None
    try:
        return _read(folder, "signature")
    except Exception:
        _discard(folder)
        return None


def load_graph(key: str) -> Any | None:
    if not enabled():
        return None
    try:
        folder = root() / key / "source"
        if not folder.exists():
            return None
    except OSError:
        return None
    try:
        return _read(folder, "graph", resident=False)
    except Exception:
        _discard(folder)
        return None


def _file_index(digest: str, options: CompileOptions, target: Target) -> Path:
    return root() / "files" / f"{digest}-{entry_key('file', options, target)[:16]}"


def remember_file(path: str | os.PathLike, digest: str, key: str, options: CompileOptions, target: Target) -> None:
    """Note that the ONNX file at ``path``, whose bytes had SHA-256 ``digest`` when it was imported
    (taken then: the file may have changed since), imports to the source graph of entry ``key``;
    its external data files are hashed too."""
    if not enabled():
        return
    from kiln.frontend.onnx import external_files

    path = Path(path)
    lines = [key] + [f"{name}\t{file_digest(path.parent / name)}" for name in external_files(path)]
    _write_text(_file_index(digest, options, target), "\n".join(lines))


def file_entry(
    path: str | os.PathLike, options: CompileOptions, target: Target, digest: str | None = None
) -> str | None:
    """The entry the file at ``path`` led to before, if its bytes (``digest``, hashed here if not
    given) and its external data are the same."""
    if not enabled():
        return None
    path = Path(path)
    try:
        lines = (_read_text(_file_index(digest or file_digest(path), options, target)) or "").splitlines()
        for line in lines[1:]:
            name, expected = line.split("\t")
            if file_digest(path.parent / name) != expected:
                return None
    except (OSError, ValueError):
        return None
    key = lines[0].strip() if lines else ""
    return key if len(key) == 32 and all(c in "0123456789abcdef" for c in key) else None
