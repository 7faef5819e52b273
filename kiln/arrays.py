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
