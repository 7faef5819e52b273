""".npy and .npz files read as data, with every claim checked before anything is allocated.

An .npy header states a dtype and a shape; NumPy allocates what the header claims and then reads.
A header claiming 2**40 elements in a 1 KB file is a MemoryError (or a machine swapping) before
the short read is noticed. Here the claimed size must equal the bytes the file actually holds,
object dtypes are refused (no pickle), and only regular files are opened (a FIFO or a device is
refused, never read until memory runs out).
"""

from __future__ import annotations

import io
import math
import os
import zipfile
import zlib
from typing import IO, Any

import numpy as np

from kiln import integrity
from kiln.errors import KilnError

MAX_HEADER = 1 << 16  # bytes of .npy header NumPy itself would accept by default (10,000) and a margin
MAX_MEMBERS = 1 << 16


class ArrayFileError(KilnError):
    """A file that is not an .npy/.npz kiln can read as plain arrays (the message says why)."""


def _header(handle: IO[bytes], available: int, what: str) -> tuple[tuple[int, ...], bool, np.dtype]:
    """(shape, Fortran order, dtype) of the .npy at ``handle`` (positioned at its magic; left at
    its data), whose file holds ``available`` bytes from there: the checks ``read_npy`` states."""
    start = handle.tell()
    try:
        version = np.lib.format.read_magic(handle)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(handle, max_header_size=MAX_HEADER)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(handle, max_header_size=MAX_HEADER)
        else:
            raise ArrayFileError(f"{what}: .npy format version {version} (kiln reads 1.0 and 2.0)")
    except ArrayFileError:
        raise
    except (ValueError, OSError, EOFError, SyntaxError, TypeError) as err:
        raise ArrayFileError(f"{what}: not an .npy array ({err})") from None
    if dtype.hasobject:
        raise ArrayFileError(f"{what}: holds Python objects (kiln reads only plain arrays, never pickles)")
    if not all(isinstance(d, int) and d >= 0 for d in shape):
        raise ArrayFileError(f"{what}: header shape {shape} is not a shape")
    claimed = math.prod(shape) * dtype.itemsize
    present = available - (handle.tell() - start)
    if claimed != present:
        raise ArrayFileError(
            f"{what}: the header claims {dtype} {list(shape)} ({claimed} bytes) but the file holds {present}"
        )
    return shape, fortran, dtype


def read_npy(handle: IO[bytes], available: int, what: str) -> np.ndarray:
    """The array in ``handle`` (positioned at an .npy's magic), whose file holds ``available``
    bytes from there. Raises ArrayFileError when the header is not one, asks for objects, or
    claims a size other than the bytes present."""
    start = handle.tell()
    _header(handle, available, what)
    handle.seek(start)
    try:
        return np.lib.format.read_array(handle, allow_pickle=False)
    except (ValueError, OSError, EOFError) as err:
        raise ArrayFileError(f"{what}: not an .npy array ({err})") from None


class _Reader(io.RawIOBase):
    """A read-only file over bytes in memory (io.BytesIO would copy them first)."""

    def __init__(self, data: bytes | bytearray | memoryview) -> None:
        self.data, self.at = memoryview(data), 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.at

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.at, io.SEEK_END: len(self.data)}[whence]
        self.at = max(0, base + offset)
        return self.at

    def readinto(self, buffer: Any) -> int:
        piece = self.data[self.at : self.at + len(buffer)]
        memoryview(buffer).cast("B")[: len(piece)] = piece
        self.at += len(piece)
        return len(piece)


def read_npy_view(data: memoryview, what: str) -> np.ndarray:
    """The array of the .npy bytes ``data`` as a view of them (checked as ``read_npy`` checks)."""
    handle = _Reader(data)
    shape, fortran, dtype = _header(handle, len(data), what)  # type: ignore[arg-type]
    flat = np.frombuffer(data, dtype=dtype, count=math.prod(shape), offset=handle.tell())
    return flat.reshape(shape[::-1]).transpose() if fortran else flat.reshape(shape)


def _stored_view(source: bytearray, info: zipfile.ZipInfo) -> memoryview | None:
    """The bytes of an uncompressed member inside ``source`` (None when it is compressed, or its
    local header or CRC disagree: the caller then reads it through zipfile, which says why)."""
    if info.compress_type != zipfile.ZIP_STORED or info.flag_bits & 0x1:  # (encrypted)
        return None
    at = info.header_offset
    header = bytes(source[at : at + 30])
    if len(header) != 30 or header[:4] != b"PK\x03\x04":
        return None
    start = at + 30 + int.from_bytes(header[26:28], "little") + int.from_bytes(header[28:30], "little")
    end = start + info.file_size
    if end > len(source):
        return None
    view = memoryview(source)[start:end]
    return view if zlib.crc32(view) == info.CRC else None


def load_npy(path: str | os.PathLike) -> np.ndarray:
    """The array of an .npy file (a regular file only). Raises ArrayFileError, or OSError when it
    cannot be opened."""
    try:
        handle = integrity.open_regular(path, ".npy file")
    except integrity.IrregularFile as err:
        raise ArrayFileError(str(err)) from None
    with handle:
        return read_npy(handle, os.fstat(handle.fileno()).st_size, str(path))


def load_npz(source: str | os.PathLike | bytes | bytearray) -> dict[str, np.ndarray]:
    """Every array of an .npz (a path to a regular file, or its bytes), by member name without
    ``.npy``. Given a bytearray, the arrays of members stored uncompressed (as np.savez writes
    them) are views of it (their CRC checked): the weights are in memory once, not twice. Raises
    ArrayFileError."""
    what = "the .npz data" if isinstance(source, (bytes, bytearray)) else str(source)
    try:
        handle: IO[bytes] = (
            _Reader(source) if isinstance(source, (bytes, bytearray)) else integrity.open_regular(source, ".npz file")
        )
    except integrity.IrregularFile as err:
        raise ArrayFileError(str(err)) from None
    arrays: dict[str, np.ndarray] = {}
    try:
        with handle, zipfile.ZipFile(handle) as archive:
            infos = archive.infolist()
            if len(infos) > MAX_MEMBERS:
                raise ArrayFileError(f"{what}: {len(infos)} members")
            for info in infos:
                if info.compress_type != zipfile.ZIP_STORED and info.file_size > (1 << 20) + 1000 * info.compress_size:
                    raise ArrayFileError(f"{what}: {info.filename} claims to inflate to {info.file_size} bytes")
                name = info.filename.removesuffix(".npy")
                stored = _stored_view(source, info) if isinstance(source, bytearray) else None
                if stored is not None:  # its bytes where they are: no copy
                    arrays[name] = read_npy_view(stored, f"{what}: {info.filename}")
                    continue
                with archive.open(info) as member:
                    data = member.read(info.file_size + 1)
                if len(data) != info.file_size:
                    raise ArrayFileError(f"{what}: {info.filename} is not the size its entry claims")
                arrays[name] = read_npy(io.BytesIO(data), len(data), f"{what}: {info.filename}")
    except ArrayFileError:
        raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError, NotImplementedError) as err:
        raise ArrayFileError(f"{what}: not an .npz archive ({err})") from None
    return arrays


class NotSequential(Exception):
    """An .npz that is not laid out as ``np.savez`` writes it (stored members, each with its sizes
    and CRC in its local header): read it whole instead (``load_npz``)."""


class _Stream(io.RawIOBase):
    """Reads at most ``size`` bytes of ``source`` in order, hashing every byte read."""

    def __init__(self, source: IO[bytes], size: int, hasher: Any) -> None:
        self.source, self.left, self.hasher, self.at = source, size, hasher, 0

    def readable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.at

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")[: self.left]
        done = 0
        while done < len(view):
            got = self.source.readinto(view[done:])  # type: ignore[attr-defined]
            if not got:
                break
            done += got
        self.hasher.update(view[:done])
        self.left -= done
        self.at += done
        return done

    def exactly(self, count: int, what: str) -> bytes:
        data = bytearray(count)
        if self.readinto(data) != count:
            raise ArrayFileError(f"{what}: ends inside a member")
        return bytes(data)


CHUNK = 1 << 22


def stream_npz(source: IO[bytes], size: int, hasher: Any, allocate: Any, what: str) -> dict[str, np.ndarray]:
    """Every array of the .npz of ``size`` bytes read in order from ``source`` (as ``np.savez``
    writes one: stored members, sizes and CRC in each local header), each straight into memory
    from ``allocate(nbytes)`` (a uint8 array), its CRC checked; every byte, the central directory's
    included, goes through ``hasher`` (the caller compares its digest before using the arrays).
    Never more than one array's bytes beyond the arrays themselves. Raises ArrayFileError, or
    NotSequential for an .npz laid out otherwise."""
    stream = _Stream(source, size, hasher)
    arrays: dict[str, np.ndarray] = {}
    while True:
        if stream.left < 4:
            raise NotSequential("no central directory")
        signature = stream.exactly(4, what)
        if signature != b"PK\x03\x04":  # the central directory: the members are done
            if signature != b"PK\x01\x02" or not arrays:
                raise NotSequential("not a local header")
            break
        if len(arrays) >= MAX_MEMBERS:
            raise ArrayFileError(f"{what}: more than {MAX_MEMBERS} members")
        header = stream.exactly(26, what)
        flags, method = int.from_bytes(header[2:4], "little"), int.from_bytes(header[4:6], "little")
        crc = int.from_bytes(header[10:14], "little")
        stored, plain = int.from_bytes(header[14:18], "little"), int.from_bytes(header[18:22], "little")
        name_length, extra_length = int.from_bytes(header[22:24], "little"), int.from_bytes(header[24:26], "little")
        if method != zipfile.ZIP_STORED or flags & 0x9:  # compressed, encrypted or sizes after the data
            raise NotSequential("a member is not stored with its sizes")
        name = stream.exactly(name_length, what).decode("utf-8", "replace")
        extra = stream.exactly(extra_length, what)
        if stored == plain == 0xFFFFFFFF:  # ZIP64: the sizes are in the extra field
            stored, plain = _zip64_sizes(extra, what)
        if stored != plain or stored > stream.left:
            raise ArrayFileError(f"{what}: {name} claims {plain} bytes stored in {stored} of {stream.left} left")
        arrays[name.removesuffix(".npy")] = _stream_npy(stream, stored, crc, allocate, f"{what}: {name}")
    while stream.left:  # the central directory: hashed, not needed
        if not stream.readinto(bytearray(min(CHUNK, stream.left))):
            raise ArrayFileError(f"{what}: shorter than its size")
    return arrays


def _zip64_sizes(extra: bytes, what: str) -> tuple[int, int]:
    at = 0
    while at + 4 <= len(extra):
        kind, length = int.from_bytes(extra[at : at + 2], "little"), int.from_bytes(extra[at + 2 : at + 4], "little")
        if kind == 1 and length >= 16:
            body = extra[at + 4 : at + 20]
            return int.from_bytes(body[8:16], "little"), int.from_bytes(body[0:8], "little")
        at += 4 + length
    raise ArrayFileError(f"{what}: a ZIP64 member without its sizes")


def _stream_npy(stream: _Stream, size: int, crc: int, allocate: Any, what: str) -> np.ndarray:
    head = _Bounded(stream, size)
    shape, fortran, dtype = _header(head, size, what)  # type: ignore[arg-type]
    check = zlib.crc32(head.taken)  # the CRC covers the header too
    nbytes = size - len(head.taken)
    flat = allocate(nbytes)
    view, at = memoryview(flat).cast("B"), 0
    while at < nbytes:
        got = stream.readinto(view[at : at + min(CHUNK, nbytes - at)])
        if not got:
            raise ArrayFileError(f"{what}: ends inside its data")
        check = zlib.crc32(view[at : at + got], check)
        at += got
    if check != crc:
        raise ArrayFileError(f"{what}: does not match its CRC")
    array = flat.view(dtype)
    return array.reshape(shape[::-1]).transpose() if fortran else array.reshape(shape)


class _Bounded(io.RawIOBase):
    """The first bytes of a member for its .npy header, kept (the CRC covers them)."""

    def __init__(self, stream: _Stream, size: int) -> None:
        self.stream, self.left, self.taken = stream, size, bytearray()

    def readable(self) -> bool:
        return True

    def tell(self) -> int:
        return len(self.taken)

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")[: self.left]
        got = self.stream.readinto(view)
        self.taken += view[:got]
        self.left -= got
        return got
