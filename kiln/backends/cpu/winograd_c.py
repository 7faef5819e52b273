"""The Winograd transforms (``kiln.lower.winograd.TRANSFORMS``) written out as C over 8 tiles at
a time (GCC vector extensions), for every tile size, plus the gather/scatter drivers
(``winograd.c``)."""

from __future__ import annotations

from pathlib import Path

from kiln.lower.winograd import TRANSFORMS


def _c_combine(coefficients: list[float], terms: list[str]) -> str:
    parts = []
    for coefficient, term in zip(coefficients, terms):
        if coefficient == 0:
            continue
        magnitude = abs(coefficient)
        value = term if magnitude == 1 else f"{float(magnitude)!r}f * {term}"
        parts.append(("- " if coefficient < 0 else "+ ") + value)
    if not parts:
        return "zero"
    text = " ".join(parts)
    return text[2:] if text.startswith("+ ") else "zero " + text


def _c_two_sided(name: str, source: str, result: str, matrix, size: int) -> list[str]:  # type: ignore[no-untyped-def]
    """C for ``result = T src T^T`` on a ``size`` x ``size`` tile of vectors, T = ``matrix``
    (rows x size): first over the tile's rows into ``tmp``, then over its columns."""
    rows = len(matrix)
    lines = [f"static inline void {name}(const kiln_v8 *{source}, kiln_v8 *{result}) {{", "  const kiln_v8 zero = {0};"]
    lines.append(f"  kiln_v8 tmp[{rows * size}];")
    for i in range(rows):
        for j in range(size):
            terms = [f"{source}[{x * size + j}]" for x in range(size)]
            lines.append(f"  tmp[{i * size + j}] = {_c_combine(matrix[i], terms)};")
    for i in range(rows):
        for j in range(rows):
            terms = [f"tmp[{i * size + x}]" for x in range(size)]
            lines.append(f"  {result}[{i * rows + j}] = {_c_combine(matrix[j], terms)};")
    lines.append("}")
    return lines


def c_source() -> str:
    """The transforms as C over 8 tiles at a time (GCC vector extensions), for every tile size,
    plus the gather/scatter drivers (``kiln/backends/cpu/winograd.c``)."""
    lines = []
    for m, t in TRANSFORMS.items():
        a = m + 2
        # input: v = B^T d B over a*a points; output: y = A^T M A over m*m pixels
        lines.extend(_c_two_sided(f"kiln_wino{m}_in", "d", "v", t["BT"], a))
        lines.extend(_c_two_sided(f"kiln_wino{m}_out", "p", "y", t["AT"], a))
    driver = (Path(__file__).resolve().parent / "winograd.c").read_text()
    return driver.replace("/* TRANSFORMS */", "\n".join(lines))
