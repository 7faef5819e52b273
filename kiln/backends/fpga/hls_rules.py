"""A static check of the HLS rules a synthesizable design keeps (what Vitis refuses or cannot
bound): no dynamic memory (malloc, new, free, delete, STL containers), no recursion, no loop
without a constant trip count (``while``, ``for`` with a bound that is not a literal), no
pointer arithmetic on ports. Run on every generated project in the tests; ``check`` returns the
violations, each with its line."""

from __future__ import annotations

import re

DYNAMIC = re.compile(r"\b(malloc|calloc|realloc|free|new|delete)\b|std::(vector|list|map|string)")
FOR = re.compile(r"\bfor\s*\(\s*int\s+(\w+)\s*=\s*(-?\d+)\s*;\s*\1\s*<\s*([^;]+);\s*\+\+\1\s*\)")
CALL = re.compile(r"\b(\w+)\s*\(")


def synthesized(source: str) -> str:
    """The part of ``source`` a vendor tool synthesizes (the C-simulation entry is excluded)."""
    return re.sub(r"#ifndef __SYNTHESIS__.*?#endif", "", source, flags=re.S)


def check(source: str) -> list[str]:
    text = synthesized(source)
    problems = []
    for number, line in enumerate(text.splitlines(), 1):
        code = line.split("//")[0]
        if DYNAMIC.search(code):
            problems.append(f"line {number}: dynamic memory: {line.strip()[:100]}")
        if re.search(r"\bwhile\s*\(|\bgoto\b", code):
            problems.append(f"line {number}: a loop without a static trip count: {line.strip()[:100]}")
        if re.search(r"\bfor\s*\(", code):
            match = FOR.search(code)
            if match is None or not match.group(3).strip().isdigit():
                problems.append(f"line {number}: a for loop whose bound is not a constant: {line.strip()[:100]}")
    problems += _recursion(text)
    return problems


def _functions(text: str) -> dict[str, str]:
    """Each function defined at the top level: its name and body (kiln's sources put a
    definition's head at column 0 and its closing brace alone at column 0, or all on one line)."""
    bodies: dict[str, str] = {}
    name, lines = "", []
    for line in text.splitlines():
        if not name and line[:1].strip() and "(" in line and line.rstrip().endswith("{"):
            found = re.findall(r"(\w+)\s*\(", line.split("{")[0])
            name, lines = (found[0] if found else ""), []
            if name in ("if", "for", "while", "switch"):
                name = ""
            continue
        if name and line.startswith("}"):
            bodies[name] = "\n".join(lines)
            name = ""
        elif name:
            lines.append(line)
        elif line[:1].strip() and "(" in line and line.rstrip().endswith("}"):  # one-line function
            head, _, body = line.partition("{")
            found = re.findall(r"(\w+)\s*\(", head)
            if found:
                bodies[found[-1]] = body
    return bodies


def _recursion(text: str) -> list[str]:
    """Functions that call themselves, directly or through others."""
    bodies = _functions(text)
    calls = {name: {c for c in CALL.findall(body) if c in bodies} for name, body in bodies.items()}
    found = []
    for name in calls:
        seen, stack = set(), list(calls[name])
        while stack:
            callee = stack.pop()
            if callee == name:
                found.append(f"function {name} is recursive")
                break
            if callee not in seen:
                seen.add(callee)
                stack.extend(calls.get(callee, ()))
    return found
