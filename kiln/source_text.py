"""Text from outside kiln (a model's value and node names, a user's target string) as it may appear in
a generated source: one function per language and place, and no other way in.

Names are data. Identifiers in generated code are always kiln's own (``b3``, ``w0``, ``k12``); a
model's names appear only in comments, for a reader, and only through ``comment`` (or, inside a
string literal a testbench prints, ``c_string``). Each function keeps a small safe alphabet and
turns every other character into ``_``, so no language's syntax survives it:

- C and C++ (the cpu target, HLS C++, the testbench): no newline (a ``//`` comment would end), no
  ``*/`` (a ``/* */`` comment would end), no backslash (a line continuation swallows the next line),
  no ``?`` (the trigraph ``??/`` is a backslash under ``-std=c++14``), no quote, no ``#``.
- Python (the gpu target's Triton modules): no newline, quote or backslash.
- Tcl (the HLS project's script): no newline, ``;``, ``[``, ``$``, brace or backslash.
- Makefiles and shells: no ``$``, backtick, ``;`` or newline.

The alphabet below is safe in all of them at once, so one rule serves every renderer; the names per
language say where each is used (and are what ``grep`` finds in the renderers).
"""

from __future__ import annotations

import re

# letters, digits and a little punctuation no language above gives a meaning inside a comment
_UNSAFE = re.compile(r"[^A-Za-z0-9_+ .,:=-]")
LIMIT = 80  # a comment names a tensor for a reader: a very long name is cut (with its length said)


def safe_text(text: object, limit: int = LIMIT) -> str:
    """``text`` with every character outside the safe alphabet replaced by ``_``, cut to ``limit``."""
    cleaned = _UNSAFE.sub("_", str(text))
    if len(cleaned) > limit:
        cleaned = f"{cleaned[:limit]}... {len(cleaned)} chars"
    return cleaned


def c_comment(text: object, limit: int = LIMIT) -> str:
    """Text safe inside a C/C++ comment of either kind (``// ...`` or ``/* ... */``)."""
    return safe_text(text, limit)


def c_string(text: object, limit: int = LIMIT) -> str:
    """Text safe between the double quotes of a C string literal, also as a printf format
    (no ``%``, no quote, no backslash, no ``??`` trigraph)."""
    return safe_text(text, limit)


def python_comment(text: object, limit: int = LIMIT) -> str:
    """Text safe after ``#`` in a generated Python (Triton) module."""
    return safe_text(text, limit)


def tcl_comment(text: object, limit: int = LIMIT) -> str:
    """Text safe after ``#`` in a generated Tcl script (no newline, no ``;``, brackets or ``$``)."""
    return safe_text(text, limit)
