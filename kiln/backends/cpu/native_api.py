"""kiln's C API (``capi.c``, in every plan's library) as the Python runtime calls it: the weights it
holds bound to the plan (``kiln_model_bind``), one context per concurrent request over an arena it
owns (``kiln_context_bind``), the context's buffer table (the runtime writes each call's input and
output addresses into it) and ``kiln_context_run``: the same contexts, tables, arena layouts and
entry call a C program's ``kiln_infer`` runs through."""

from __future__ import annotations

import ctypes
from typing import Any

from kiln.backends.registry import HOST_CALLBACK
from kiln.errors import KilnError

OK = 0


class NativeApi:
    """One plan library's C API (``library``: its ``ctypes.CDLL``)."""

    def __init__(self, library: Any, path: Any) -> None:
        self.library, self.path = library, path
        pointer, size, status = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
        out = ctypes.POINTER(ctypes.c_void_p)
        signatures = {
            "kiln_model_bind": ([pointer, ctypes.c_int64, out], status),
            "kiln_model_free": ([pointer], None),
            "kiln_model_workspace_size_at": ([pointer, ctypes.c_int64], size),
            "kiln_model_workspace_size": ([pointer], size),
            "kiln_context_bind": ([pointer, pointer, size, out], status),
            "kiln_context_free": ([pointer], None),
            "kiln_context_table": ([pointer], pointer),
            "kiln_context_offsets": ([pointer], pointer),
            "kiln_context_run": ([pointer, ctypes.c_int64, HOST_CALLBACK], status),
            "kiln_context_set_threads": ([pointer, ctypes.c_int], status),
            "kiln_last_error": ([], ctypes.c_char_p),
        }
        for name, (arguments, result) in signatures.items():
            function = getattr(library, name)
            function.argtypes, function.restype = arguments, result
        self.run = library.kiln_context_run  # (context, length, host) -> status: the per-call path, bare

    def error(self, what: str) -> KilnError:
        return KilnError(f"{what} ({self.path}): {self.last_error()} (kiln bug)")

    def bind(self, addresses: list[int | None]) -> int:
        """The model over the weights at ``addresses`` (one per slot, None elsewhere)."""
        table = (ctypes.c_void_p * max(len(addresses), 1))(*addresses)
        handle = ctypes.c_void_p()
        if self.library.kiln_model_bind(table, len(addresses), ctypes.byref(handle)) != OK:
            raise self.error("binding the weights to the plan failed")
        return int(handle.value)  # type: ignore[arg-type]

    def workspace(self, model: int, length: int | None = None) -> int:
        """Bytes of arena a run needs (at ``length`` of a run-time length; None: the whole)."""
        if length is None:
            return int(self.library.kiln_model_workspace_size(model))
        return int(self.library.kiln_model_workspace_size_at(model, length))

    def context(self, model: int, arena: int, size: int, threads: int) -> int:
        """A context over ``arena`` whose runs take ``threads`` participants (0: every CPU),
        whatever another model sharing this library asked for."""
        handle = ctypes.c_void_p()
        if self.library.kiln_context_bind(model, arena, size, ctypes.byref(handle)) != OK:
            raise self.error("a context over the arena failed")
        self.library.kiln_context_set_threads(handle, threads if threads > 0 else -1)
        return int(handle.value)  # type: ignore[arg-type]

    def table(self, context: int) -> int:
        return int(self.library.kiln_context_table(context))

    def offsets(self, context: int) -> int:
        return int(self.library.kiln_context_offsets(context))

    def last_error(self) -> str:
        return (self.library.kiln_last_error() or b"").decode("utf-8", "replace")

    def free_context(self, context: int, *keep: Any) -> None:
        """``keep``: what must outlive the context until now (its model)."""
        self.library.kiln_context_free(context)

    def free_model(self, model: int) -> None:
        self.library.kiln_model_free(model)
