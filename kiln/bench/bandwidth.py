"""The machine's memory bandwidth as a decode step uses it, for the generation table's bound
(``kiln.bench.generation``): read bandwidth measured by a C streaming kernel built for this CPU
(``read_bandwidth.c``; NumPy's sum where no C compiler is found), once (``read_bandwidth``) or
between a decode loop's tokens (``TokenClock``: a shared machine's bandwidth moves within a row,
so a row's bound is read while it runs, the probes' time left out of its stamps)."""

from __future__ import annotations

import functools
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def bandwidth_gb_s(megabytes: int = 1024, rounds: int = 5, threads: int = 1) -> float:
    """The machine's memory bandwidth as a decode step uses it: bytes read per second (see
    ``read_bandwidth``)."""
    return read_bandwidth(megabytes, rounds, threads)[0]


def read_bandwidth(megabytes: int = 1024, rounds: int = 5, threads: int = 1) -> tuple[float, str]:
    """(GB/s, how it was measured): ``threads`` threads each reading its share of a buffer far
    larger than the caches, the best of ``rounds`` — a C streaming kernel (``read_bandwidth.c``,
    built for this CPU; each round reads as one stream a thread and as four side by side, as
    kiln's one-row products read their panels) where a C compiler is found, else NumPy's sum
    (slower than the memory on some machines: its loop is the limit). A read-only stream is what
    a token's weights are."""
    import ctypes

    probe = _read_probe()
    if probe is not None:
        found = probe.kiln_read_bandwidth(megabytes, max(1, threads), rounds, ctypes.byref(ctypes.c_float()))
        if found > 0:
            return found / 1e9, f"C streaming reads of {megabytes} MB, 1 and 4 streams a thread"
    return _numpy_read(None, megabytes, rounds, threads), f"NumPy sums of {megabytes} MB (no C compiler)"


class TokenClock:
    """A decode loop's stamps (``stamp()`` where it had called ``time.perf_counter()``), with the
    memory's read bandwidth measured after every ``every``-th token, its time left out of every
    later stamp: a row's bound from the bandwidth the machine had while the row ran (``lap()``),
    not from minutes around it. The reads run in a process of their own over a buffer of
    ``megabytes`` it keeps (the engine's peak memory stays its own), after a pause that lets the
    engine's threads stop spinning; the C kernel's two reads, one stream and four a thread, the
    faster. A context manager (the process ends with it)."""

    def __init__(self, threads: int, every: int = 16, megabytes: int = 256, pause: float = 0.01) -> None:
        self.every, self.pause = every, pause
        self.offset, self.count = 0.0, 0
        self.readings: list[float] = []
        command = [sys.executable, "-m", "kiln.bench.bandwidth", "--serve", str(megabytes), str(max(1, threads))]
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        if self.process.stdout is None or self.process.stdout.readline().strip() != "ready":
            self.close()
            raise RuntimeError("the bandwidth probe's process did not start")

    def __enter__(self) -> TokenClock:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def stamp(self) -> float:
        now = time.perf_counter() - self.offset
        self.count += 1
        if self.every > 0 and self.count % self.every == 0:
            began = time.perf_counter()
            time.sleep(self.pause)
            self.readings.append(self.read())
            self.offset += time.perf_counter() - began
        return now

    def read(self) -> float:
        """GB/s, read once by the probe's process."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write("read\n")
        self.process.stdin.flush()
        return float(self.process.stdout.readline())

    def lap(self) -> dict[str, Any]:
        """The readings since the last lap as a row's fields (their median, and each), then none:
        empty when none was taken. The median, not the harmonic mean a mean time a token would
        pair with: single reads fall far below what the engine's own tokens show (run G: a read of
        17 GB/s among 30-35 beside tokens that kept to 27 GB/s), and one such read moves a harmonic
        mean by a fifth."""
        import numpy as np

        found, self.readings, self.count = self.readings, [], 0
        if not found:
            return {}
        return {"bandwidth_gb_s": float(np.median(found)), "bandwidth_readings_gb_s": found}

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


def stamper(clock: TokenClock | None) -> Any:
    """What a decode loop stamps its tokens with: ``clock``'s ``stamp`` (reading the bandwidth
    between tokens) or, without one, the plain clock."""
    return clock.stamp if clock is not None else time.perf_counter


def _serve(megabytes: int, threads: int) -> None:
    """The probe's process: a buffer of ``megabytes`` faulted in once, then one read (GB/s on a
    line of its own) for each line read from stdin."""
    import ctypes

    import numpy as np

    buffer = np.ones(megabytes << 18, np.float32)
    probe = _read_probe()
    print("ready", flush=True)
    for _ in sys.stdin:
        found = 0.0
        if probe is not None:
            pointer = ctypes.c_void_p(buffer.ctypes.data)
            found = (
                probe.kiln_read_bandwidth_in(pointer, buffer.nbytes, threads, 1, ctypes.byref(ctypes.c_float())) / 1e9
            )
        print(found if found > 0 else _numpy_read(buffer, megabytes, 1, threads), flush=True)


@functools.cache
def _read_probe() -> Any:
    """``read_bandwidth.c`` built for this CPU and loaded, once a process (None: no C compiler, or
    it did not build)."""
    import ctypes
    import shutil
    import tempfile

    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None
    with tempfile.TemporaryDirectory(prefix="kiln-bandwidth-") as folder:  # (loaded: the file may go)
        library = Path(folder) / "libread.so"
        source = Path(__file__).with_name("read_bandwidth.c")
        flags = ["-O2", "-march=native", "-pthread", "-shared", "-fPIC"]
        if subprocess.run([compiler, *flags, str(source), "-o", str(library)], capture_output=True).returncode != 0:
            return None
        probe = ctypes.CDLL(str(library))
    probe.kiln_read_bandwidth.restype = ctypes.c_double
    probe.kiln_read_bandwidth.argtypes = [ctypes.c_int64, ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_float)]
    probe.kiln_read_bandwidth_in.restype = ctypes.c_double
    probe.kiln_read_bandwidth_in.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_float)]  # fmt: skip
    return probe


def _numpy_read(source: Any, megabytes: int, rounds: int, threads: int) -> float:
    """GB/s of NumPy sums over ``source`` (a buffer of ``megabytes`` made here when None)."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    if source is None:
        source = np.ones(megabytes << 18, np.float32)  # (megabytes * 2**20 / 4 floats)
    shares = np.array_split(source, max(1, threads))
    best = float("inf")
    with ThreadPoolExecutor(max(1, threads)) as pool:
        for _ in range(rounds):
            started = time.perf_counter()
            list(pool.map(np.sum, shares))
            best = min(best, time.perf_counter() - started)
    return source.nbytes / best / 1e9


if __name__ == "__main__" and sys.argv[1:2] == ["--serve"]:
    _serve(int(sys.argv[2]), int(sys.argv[3]))
