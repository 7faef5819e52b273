"""Builds generated C into shared libraries with the machine's C compiler, content-addressed:
the cache key is the source, the compiler (path and version) and every flag, so a second compile
of the same model does no C compilation."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path

from kiln.errors import KilnError

DEBUG_FLAGS = (
    "-O1",
    "-g",
    "-fno-omit-frame-pointer",
    "-fsanitize=address,undefined",
    "-fno-sanitize-recover=undefined",
)
FLAGS = (
    "-O3",
    "-march=native",
    "-fopenmp",
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


def debug() -> bool:
    """``KILN_DEBUG=1``: generated code checks every index against its buffer and is built with
    AddressSanitizer and UBSan (load it in a process started with LD_PRELOAD=libasan.so)."""
    return os.environ.get("KILN_DEBUG", "0") not in ("0", "", "false", "no")


def flags() -> tuple[str, ...]:
    if not debug():
        return FLAGS
    return tuple(f for f in FLAGS if f != "-O3") + DEBUG_FLAGS


DAMAGED = {"libraries": 0}  # damaged cache entries found (and rebuilt) by this process


class CompilerError(KilnError):
    """The C compiler rejected generated code (a kiln bug) or is missing."""


@lru_cache(maxsize=1)
def find_compiler() -> tuple[str, str]:
    """(path, version line) of the C compiler: $KILN_CC, $CC, or cc/gcc/clang on PATH."""
    for candidate in (os.environ.get("KILN_CC"), os.environ.get("CC"), "cc", "gcc", "clang"):
        if candidate and (path := shutil.which(candidate)):
            version = subprocess.run([path, "--version"], capture_output=True, text=True).stdout.splitlines()
            return path, version[0] if version else "unknown"
    raise CompilerError("no C compiler found: install gcc or clang, or point KILN_CC at one")


def cache_dir() -> Path:
    root = os.environ.get("KILN_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "kiln")
    path = Path(root) / "lib"
    path.mkdir(parents=True, exist_ok=True)
    return path


def build(source: str) -> Path:
    """Path of the shared library built from ``source`` (reused from the cache when present)."""
    from kiln.codegen.target import Target

    compiler, version = find_compiler()
    # -march=native code is only valid on this kind of CPU: the target is part of the key
    key = hashlib.sha256("\n".join([source, compiler, version, repr(Target.host()), *flags()]).encode()).hexdigest()[
        :24
    ]
    library = cache_dir() / f"{key}.so"
    if library.exists():
        with open(library, "rb") as handle:
            if handle.read(4) == b"\x7fELF":
                return library
        DAMAGED["libraries"] += 1  # truncated or foreign: rebuilt below, never loaded
        library.unlink(missing_ok=True)
    # Concurrent builds of one key (conformance workers, two processes compiling a model) must not
    # share a file being written: each compiles its own copy of the source, then both results are
    # renamed into place atomically (the last rename wins; either is whole).
    source_path = cache_dir() / f"{key}.c"
    handle, own_source = tempfile.mkstemp(suffix=".c", dir=cache_dir())
    with os.fdopen(handle, "w") as out:
        out.write(source)
    handle, partial = tempfile.mkstemp(suffix=".so", dir=cache_dir())
    os.close(handle)
    result = subprocess.run([compiler, *flags(), own_source, "-o", partial, "-lm"], capture_output=True, text=True)
    os.replace(own_source, source_path)  # kept beside the library for reading (kiln explain)
    if result.returncode != 0:
        os.unlink(partial)
        raise CompilerError(f"{compiler} failed on generated code {source_path} (a kiln bug):\n{result.stderr[-4000:]}")
    os.replace(partial, library)  # atomic: concurrent builds of the same key both end with a whole file
    return library
