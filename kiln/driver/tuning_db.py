"""The tuning database: SQLite, one row per (kernel key, target, kiln version) with the best
candidate found, its time and the default schedule's time. A second compile reads it and does
no tuning; a corrupt database is moved aside and rebuilt, never fatal."""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from pathlib import Path
from typing import Any

from kiln.backends import parse
from kiln.integrity import cache_folder_or_private, cache_root
from kiln.version import __version__

SCHEMA = """
CREATE TABLE IF NOT EXISTS results (
    kernel TEXT NOT NULL,
    target TEXT NOT NULL,
    version TEXT NOT NULL,
    choice TEXT NOT NULL,         -- JSON: the winning candidate ({} = the default schedule)
    seconds REAL NOT NULL,        -- its median time
    default_seconds REAL NOT NULL,
    candidates INTEGER NOT NULL,  -- how many were measured
    failures INTEGER NOT NULL,    -- candidates that crashed, timed out or were wrong
    description TEXT NOT NULL,
    PRIMARY KEY (kernel, target, version)
)
"""
_lock = threading.Lock()
TUNED_HERE: set[str] = set()  # kernel keys this process tuned (their schedules show as "tuned")


def path() -> Path:
    """``$KILN_CACHE_DIR/tune.db`` (in a private temporary folder where kiln cannot trust the cache
    folder: the results then last as long as this process)."""
    return cache_folder_or_private("tuning", root=True) / "tune.db"


def _scope(target: str | None = None) -> tuple[str, str]:
    """(target, kiln version) results are kept under; ``target`` (a ``repr(Target)``) defaults to
    this machine's ``cpu``."""
    return target or repr(parse("cpu")), __version__


def _connect() -> sqlite3.Connection:
    file = path()
    try:
        connection = sqlite3.connect(file, timeout=30)
        connection.execute(SCHEMA)
        return connection
    except sqlite3.DatabaseError:
        os.replace(file, file.with_suffix(".corrupt"))  # keep it for inspection; start afresh
        connection = sqlite3.connect(file, timeout=30)
        connection.execute(SCHEMA)
        return connection


def _readable() -> bool:
    """The database exists and can be read (an unusable cache folder means no tuning results)."""
    try:
        return path().exists()
    except OSError:
        return False


# the database's choices per scope, read once while its file is unchanged (a compile asks for
# hundreds of kernels: one query and one folder check each cost more than its lowering)
_known_paths: dict[str, Path] = {}  # cache root -> the database's path (its folder checked once)
_snapshots: dict[tuple[str, str, str], tuple[tuple, dict[str, str]]] = {}


def best(kernel: str, target: str | None = None) -> dict[str, Any] | None:
    """The stored choice for ``kernel`` on this target and kiln version (None: never tuned)."""
    choice = _choices(target).get(kernel)
    return json.loads(choice) if choice is not None else None


def _choices(target: str | None) -> dict[str, str]:
    """Every stored choice (kernel -> JSON) on this target and kiln version, from the snapshot
    read when the database last changed (empty: no database)."""
    target, version = _scope(target)
    root = str(cache_root())
    file = _known_paths.get(root)
    try:
        if file is None:
            file = _known_paths[root] = path()
        info = os.stat(file)
    except OSError:  # no database (yet), or a folder that went away: checked again next time
        _known_paths.pop(root, None)
        return {}
    stamp = (info.st_ino, info.st_size, info.st_mtime_ns)
    key = (str(file), target, version)
    with _lock:
        found = _snapshots.get(key)
        if found is None or found[0] != stamp:
            connection = _connect()
            try:
                rows = connection.execute(
                    "SELECT kernel, choice FROM results WHERE target = ? AND version = ?", (target, version)
                ).fetchall()
            finally:
                connection.close()
            found = _snapshots[key] = (stamp, dict(rows))
    return found[1]


def record(
    kernel: str,
    choice: dict[str, Any],
    seconds: float,
    default_seconds: float,
    candidates: int,
    failures: int,
    description: str,
    target: str | None = None,
) -> None:
    target, version = _scope(target)
    with _lock:
        connection = _connect()
        try:
            with connection:
                connection.execute(
                    "INSERT OR REPLACE INTO results VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        kernel,
                        target,
                        version,
                        json.dumps(choice, sort_keys=True),
                        seconds,
                        default_seconds,
                        candidates,
                        failures,
                        description,
                    ),
                )
        finally:
            connection.close()
        _snapshots.clear()  # read again on the next lookup, whatever the file's stamp says


def fingerprint(target: str | None = None) -> str:
    """Changes whenever a result is added or replaced (part of the plan-cache key)."""
    if not _readable():
        return "empty"
    rows = sorted(_choices(target).items())
    import hashlib

    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:16]
