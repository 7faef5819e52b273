"""Results in SQLite: one row per run, one per record; ``compare`` diffs two runs."""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kiln.errors import KilnError
from kiln.output_files import check_output_file

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (run_id TEXT PRIMARY KEY, created TEXT, machine TEXT, config TEXT);
CREATE TABLE IF NOT EXISTS records (
    run_id TEXT REFERENCES runs(run_id), backend TEXT, model TEXT, batch INTEGER, scenario TEXT,
    threads INTEGER, status TEXT, data TEXT
);
"""


class CorruptDatabase(KilnError):
    """The results database cannot be read; it is left untouched."""


class DatabaseLocked(KilnError):
    """Another process holds the results database's write lock longer than kiln waits."""


WAIT_SECONDS = 60.0  # how long a writer waits for another process's transaction (a bench beside a study)


def open_db(path: Path, wait: float = WAIT_SECONDS) -> sqlite3.Connection:
    """The results database at ``path`` (made if missing). A link, FIFO or folder there, or at
    SQLite's journal names beside it, is refused (OutputPathError), never followed; a database
    another process keeps locked past ``wait`` seconds is a DatabaseLocked; an unreadable one a
    CorruptDatabase (left untouched)."""
    for name in (path, Path(f"{path}-journal"), Path(f"{path}-wal"), Path(f"{path}-shm")):
        check_output_file(name, "results database")
    try:
        connection = sqlite3.connect(path, timeout=wait)
    except sqlite3.DatabaseError as err:
        raise _named(err, path, wait) from None
    try:
        connection.executescript(SCHEMA)
        connection.execute("SELECT count(*) FROM runs").fetchone()
        return connection
    except sqlite3.DatabaseError as err:
        connection.close()
        raise _named(err, path, wait) from None


def _named(err: sqlite3.DatabaseError, path: Path, wait: float) -> KilnError:
    if isinstance(err, sqlite3.OperationalError) and ("locked" in str(err) or "busy" in str(err)):
        return DatabaseLocked(
            f"results database {path} is locked by another process (a kiln bench or kiln study writing to it?); "
            f"waited {wait:g} s: run again when it has finished, or give another --db"
        )
    return CorruptDatabase(f"results database {path} is unreadable ({err}); it was not modified")


@contextlib.contextmanager
def _database(path: Path) -> Iterator[sqlite3.Connection]:
    """An open database for one transaction (committed at the end), closed however it ends; SQLite's
    errors on the way are named (locked, unreadable)."""
    connection = open_db(path)
    try:
        with connection:
            yield connection
    except sqlite3.DatabaseError as err:
        raise _named(err, path, WAIT_SECONDS) from None
    finally:
        connection.close()


def save_run(path: Path, run: dict[str, Any]) -> None:
    start_run(path, run)
    add_records(path, run["run_id"], run["records"])


def start_run(path: Path, run: dict[str, Any]) -> None:
    """The run's row (its records follow with ``add_records``, as they arrive: a fleet streams them)."""
    with _database(path) as connection:
        connection.execute(
            "INSERT OR REPLACE INTO runs VALUES (?, ?, ?, ?)",
            (run["run_id"], run["created"], json.dumps(run["machine"]), json.dumps(run["config"])),
        )


def add_records(path: Path, run_id: str, records: list[dict[str, Any]]) -> None:
    with _database(path) as connection:
        connection.executemany(
            "INSERT INTO records VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (run_id, r["backend"], r["model"], r["batch"], r["scenario"], r["threads"], r["status"], json.dumps(r))
                for r in records
            ],
        )


def list_runs(path: Path) -> list[tuple[str, str, int]]:
    with _database(path) as connection:
        return connection.execute(
            "SELECT runs.run_id, created, count(records.run_id) FROM runs LEFT JOIN records USING (run_id) GROUP BY runs.run_id ORDER BY created"
        ).fetchall()


def load_records(path: Path, run_id: str) -> list[dict[str, Any]]:
    with _database(path) as connection:
        rows = connection.execute("SELECT data FROM records WHERE run_id = ?", (run_id,)).fetchall()
        known = connection.execute("SELECT 1 FROM runs WHERE run_id = ?", (run_id,)).fetchone()
    if not known:
        raise KilnError(f"no run {run_id!r} in {path}; list them with `kiln bench runs`")
    return [json.loads(r[0]) for r in rows]


def headline(record: dict[str, Any]) -> tuple[str, float, float] | None:
    """(metric name, value, relative noise) of a record: p50 latency, or throughput for offline."""
    if record.get("status") != "ok":
        return None
    if record["scenario"] == "offline":
        stats = record.get("latency_ms", {})
        return ("throughput/s", record["throughput"], stats.get("cv", 0.0))
    stats = record.get("latency_ms", {})
    return ("p50 ms", stats["p50"], stats.get("cv", 0.0))


def compare(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per matching (backend, model, batch, scenario, threads): the change and whether it is beyond
    the noise band (twice the larger coefficient of variation, at least 5%)."""
    key = lambda r: (r["backend"], r["model"], r["batch"], r["scenario"], r["threads"])  # noqa: E731
    earlier = {key(r): r for r in before}
    rows = []
    for record in after:
        old = earlier.get(key(record))
        if old is None:
            continue
        a, b = headline(old), headline(record)
        if a is None or b is None:
            continue
        change = (b[1] - a[1]) / a[1] if a[1] else 0.0
        band = max(2 * a[2], 2 * b[2], 0.05)
        better = change < 0 if a[0] == "p50 ms" else change > 0
        rows.append(
            {
                "backend": record["backend"],
                "model": record["model"],
                "batch": record["batch"],
                "scenario": record["scenario"],
                "metric": a[0],
                "before": a[1],
                "after": b[1],
                "change": change,
                "noise_band": band,
                "verdict": ("faster" if better else "slower") if abs(change) > band else "within noise",
            }
        )
    return rows
