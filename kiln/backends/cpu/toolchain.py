"""Builds generated C into shared libraries with the machine's C compiler, content-addressed:
the cache key is the source, the compiler (path and version) and every flag, so a second compile
of the same model does no C compilation."""

from __future__ import annotations

import atexit
import errno
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from functools import lru_cache
from pathlib import Path

from kiln import integrity
from kiln.errors import CompilerError, ResourceError
from kiln.lower.target import Target

ISAS = {  # name -> (vector bytes, the compiler's -march for code that must run on any such CPU)
    "avx512": (64, "x86-64-v4"),
    "avx2": (32, "x86-64-v3"),
    "neon": (16, "armv8-a"),
    "generic": (16, ""),
}


def compiler_flags(target: Target) -> tuple[str, ...]:
    """-march=native for the host's own target; otherwise the ISA's baseline (so cpu:avx2 code on
    an AVX-512 machine really is AVX2 code), tuned for this machine."""
    # GCC vectorizes with 256-bit registers on AVX-512 CPUs unless told otherwise; kiln's loops
    # (epilogues with exp, depthwise convolutions, normalizations) are throughput-bound, so the
    # avx512 target uses the whole register
    wide = ("-mprefer-vector-width=512",) if target.isa == "avx512" else ()
    if target.native:
        return ("-march=native", *wide)
    march = ISAS[target.isa][1]
    return (f"-march={march}", "-mtune=native", *wide) if march else ()


DEBUG_FLAGS = (
    "-O1",
    "-g",
    "-fno-omit-frame-pointer",
    "-fsanitize=address,undefined",
    "-fno-sanitize-recover=undefined",
)
FLAGS = (  # then the target's own (-march=...: compiler_flags)
    "-O3",
    "-fopenmp-simd",  # the simd pragmas only: parallel loops run on kiln's own pool (pool.c)
    "-pthread",
    "-fPIC",
    "-shared",
    "-std=c11",
    "-fno-math-errno",
    # kiln never reads the floating-point exception flags; without this GCC will not if-convert
    # the branch-free exp/tanh/erf (a select of two float results "might trap"), so loops calling
    # them stay scalar. Values are unchanged (no reassociation, NaN and inf kept).
    "-fno-trapping-math",
    "-ffp-contract=fast",
    "-Wno-unused-variable",
)


def sanitizer_loaded() -> bool:
    """Whether this process has the AddressSanitizer runtime mapped (preloaded: a debug library
    can then be loaded; without it, loading one ends the process)."""
    try:
        with open("/proc/self/maps") as maps:
            return any("libasan" in line for line in maps)
    except OSError:  # not Linux: let the loader say
        return True


def flags(target: Target, debug: bool = False) -> tuple[str, ...]:
    """Every flag generated C for ``target`` is built with; ``debug`` (CompileOptions.debug,
    KILN_DEBUG=1) builds with AddressSanitizer and UBSan (load such a library in a process started
    with LD_PRELOAD=libasan.so)."""
    own = compiler_flags(target)
    if not debug:
        return FLAGS + own
    return tuple(f for f in FLAGS if f != "-O3") + own + DEBUG_FLAGS


DAMAGED = {"libraries": 0}  # damaged cache entries found (and rebuilt) by this process


@lru_cache(maxsize=1)
def find_compiler() -> tuple[str, str]:
    """(path, version line) of the C compiler: $KILN_CC, $CC, or cc/gcc/clang on PATH."""
    for candidate in (os.environ.get("KILN_CC"), os.environ.get("CC"), "cc", "gcc", "clang"):
        if candidate and (path := shutil.which(candidate)):
            version = subprocess.run([path, "--version"], capture_output=True, text=True).stdout.splitlines()
            return path, version[0] if version else "unknown"
    raise CompilerError("no C compiler found: install gcc or clang, or point KILN_CC at one")


def cache_dir() -> Path:
    """Where built libraries are kept: ``$KILN_CACHE_DIR/lib``; when kiln cannot trust or write it
    (see ``integrity.cache_folder``), a private temporary folder for this process, with one
    warning."""
    try:
        return integrity.cache_folder("lib")
    except integrity.CacheUnavailable as err:
        integrity.cache_off(err)
    return _private_dir()


_fallback_dir: Path | None = None


def _private(folder: Path) -> bool:
    """The process's own temporary folder (nothing in it outlives the process: no seals)."""
    return _fallback_dir is not None and folder == _fallback_dir


def _cached(library: Path) -> bool:
    """A cached library is used only when its seal (written by this user's kiln) matches: a
    truncated, bit-flipped or planted library is rebuilt, never loaded."""
    seal = library.with_suffix(".seal")
    if _private(library.parent):
        return library.is_file()
    if not library.exists():
        return False
    try:
        if integrity.sealed(library, seal.read_text().strip()):
            return True
    except (OSError, integrity.UntrustedKey):
        pass
    # not unlinked: the rebuild renames a whole library over it, while a process that just
    # checked another build's bytes may be loading this path (concurrent builds of one key
    # write the seal and the library in two steps: a mismatch is not always damage)
    DAMAGED["libraries"] += 1
    return False


def build(source: str, target: Target, debug: bool = False, engine: str | None = None) -> Path:
    """Path of the shared library built from ``source`` for ``target`` (default: this machine),
    reused from the cache when present; ``engine``: the source of an object the library links
    (the engines, c_unit.engine_source), itself built once and cached the same way. Raises
    CompilerError when the compiler fails, ResourceError when the disk is full. A cache folder
    deleted by another process meanwhile is made again (once), never an error."""
    try:
        return _build_linked(source, target, debug, engine, cache_dir())
    except FileNotFoundError:  # the cache folder went away under us (another process cleaning it)
        return _build_linked(source, target, debug, engine, _private_dir())


def object_file(source: str, target: Target) -> Path:
    """``source`` compiled to a position-independent object (cached as the libraries are): what a
    static library of a plan is made of (``kiln.driver.emit_c``)."""
    try:
        return _build(source, target, False, cache_dir(), ".o")
    except FileNotFoundError:  # the cache folder went away under us
        return _build(source, target, False, _private_dir(), ".o")


def _build_linked(source: str, target: Target, debug: bool, engine: str | None, folder: Path) -> Path:
    if engine is None:
        return _build(source, target, debug, folder)
    obj = _build(engine, target, debug, folder, ".o")
    return _build(source, target, debug, folder, ".so", obj)


def _private_dir() -> Path:
    global _fallback_dir
    if _fallback_dir is None:
        _fallback_dir = Path(tempfile.mkdtemp(prefix="kiln-lib-"))
        atexit.register(shutil.rmtree, _fallback_dir, True)
    return _fallback_dir


def _build(
    source: str, target: Target, debug: bool, folder: Path, suffix: str = ".so", obj: Path | None = None
) -> Path:
    """``source`` compiled to ``folder/<key><suffix>``: a shared library (linking ``obj``, whose
    name is its own content key, so it is part of this key), or an object (``.o``: compiled only)."""
    compiler, version = find_compiler()
    # -march=native code is only valid on this kind of CPU: the target is part of the key
    linked = [obj.name] if obj is not None else []
    key = hashlib.sha256(
        "\n".join([source, compiler, version, repr(target), *flags(target, debug), *linked]).encode()
    ).hexdigest()[:24]

    def command(own_source: str, partial: str) -> list[str]:
        if suffix == ".o":  # compiled only (position-independent): linked into libraries
            return [compiler, *(f for f in flags(target, debug) if f != "-shared"), "-c", own_source, "-o", partial]
        return [compiler, *flags(target, debug), own_source, *([str(obj)] if obj else []), "-o", partial, "-lm"]

    return cached_build(source, key, folder, command, suffix, ".c", compiler)


def build_program(
    source: str, key_parts: Sequence[str], command: Callable[[str, str], list[str]], language: str
) -> Path:
    """A shared library built from ``source`` by ``command(source path, output path)`` (another
    target's compiler: the fpga target's g++ with the HLS headers), cached, sealed and written
    atomically as kiln's C libraries are; ``language`` is the source's suffix (".cpp")."""
    key = hashlib.sha256("\n".join([source, *key_parts]).encode()).hexdigest()[:24]
    try:
        return cached_build(source, key, cache_dir(), command, ".so", language, key_parts[0] if key_parts else "")
    except FileNotFoundError:  # the cache folder went away under us
        return cached_build(source, key, _private_dir(), command, ".so", language, key_parts[0] if key_parts else "")


def cached_build(
    source: str,
    key: str,
    folder: Path,
    command: Callable[[str, str], list[str]],
    suffix: str,
    language: str,
    compiler: str,
) -> Path:
    """``folder/<key><suffix>`` built by ``command`` unless a sealed copy is there already."""
    library = folder / f"{key}{suffix}"
    if _cached(library):
        return library
    # Concurrent builds of one key (conformance workers, two processes compiling a model) must not
    # share a file being written: each compiles its own copy of the source, then both results are
    # renamed into place atomically (the last rename wins; either is whole).
    source_path = folder / f"{key}{language}"
    own_source = partial = None
    try:
        handle, own_source = tempfile.mkstemp(suffix=language, dir=folder)
        with os.fdopen(handle, "w") as out:
            out.write(source)
        handle, partial = tempfile.mkstemp(suffix=suffix, dir=folder)
        os.close(handle)
        result = subprocess.run(command(own_source, partial), capture_output=True, text=True)
        if result.returncode != 0:
            if _out_of_space(result.stderr):
                raise OSError(errno.ENOSPC, "the C compiler ran out of disk space", str(folder))
            if not Path(own_source).exists():  # the folder was emptied under the compiler
                raise FileNotFoundError(own_source)
            os.replace(own_source, source_path)  # kept for the bug report
            own_source = None
            raise CompilerError(
                f"{compiler} failed on generated code {source_path} (a kiln bug):\n{result.stderr[-4000:]}"
            )
        if not _private(folder):
            seal = integrity.seal_file(partial)
            integrity.write_atomically(library.with_suffix(".seal"), seal.encode())
        os.replace(own_source, source_path)  # kept beside the library for reading (kiln explain)
        own_source = None
        os.replace(partial, library)  # atomic: concurrent builds of the same key both end with a whole file
        partial = None
    except OSError as err:
        if err.errno in (errno.ENOSPC, errno.EDQUOT):
            raise ResourceError(
                f"no space left on the disk holding {folder} while building generated code; "
                "free some space or point KILN_CACHE_DIR elsewhere"
            ) from None
        raise
    finally:
        for leftover in (own_source, partial):
            if leftover is not None:
                Path(leftover).unlink(missing_ok=True)
    return library


def _out_of_space(stderr: str) -> bool:
    return "No space left on device" in stderr or "Disk quota exceeded" in stderr
